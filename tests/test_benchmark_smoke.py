"""The multi-GPU collectives benchmark runs end to end on gloo (tiny sizes), so it is ready
for a machine with several GPUs, and the figures it prints are the ones its CSV holds."""

from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.multiproc


def test_collectives_benchmark_smoke(tmp_path):
    bench = Path(__file__).resolve().parent.parent / "benchmarks"
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node", "2", "collectives.py", "--backend", "gloo",
                          "--quick"], cwd=bench, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "OUT": str(tmp_path)})
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    rows = list(csv.DictReader((tmp_path / "collectives.csv").open()))
    # 2 scales x 4 count patterns x 3 modes, every time measured and every ratio the
    # ratio of the times in the same row
    assert len(rows) == 2 * 4 * 3
    assert {r["mode"] for r in rows} == {"max_len", "sum_len", "gatherv"}
    for r in rows:
        t = {k: float(r[k]) for k in ("gather_us", "rs_us", "plain_ag_us", "plain_rs_us")}
        assert all(0 < v < 60e6 for v in t.values()), r
        assert float(r["gather_vs_plain"]) == pytest.approx(t["plain_ag_us"] / t["gather_us"])
        assert float(r["rs_vs_plain"]) == pytest.approx(t["plain_rs_us"] / t["rs_us"])
    # the planner score: one point per (scale, pattern), and no more hits than points
    m = re.search(r"planner within 5% of the fastest mode at (\d+)/(\d+) points", res.stdout)
    assert m, res.stdout[-2000:]
    within, points = int(m.group(1)), int(m.group(2))
    assert points == 2 * 4 and 0 <= within <= points
    # the fitted model is the least-squares line t = latency + moved / bandwidth through the
    # plain all-gathers the CSV holds (slope and latency floored as the script documents)
    fit = re.search(r"fitted CostModel: bus_bandwidth=(\S+) GB/s, latency=(\S+) us", res.stdout)
    assert fit, res.stdout[-2000:]
    xs = [float(r["plain_bytes"]) / 2 for r in rows]  # moved = bytes * (n - 1) / n, n = 2
    ys = [float(r["plain_ag_us"]) * 1e-6 for r in rows]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    slope = max(slope, 1e-15)
    assert float(fit.group(1)) == pytest.approx(1e-9 / slope, rel=1e-3)
    assert float(fit.group(2)) == pytest.approx(max(my - slope * mx, 0.0) * 1e6, rel=1e-3,
                                                abs=1e-3)
    # nothing is written beside the scripts when $OUT is set
    assert not (bench / "benchmarks").exists()


def _serving_csv(tmp_path, name: str) -> list[dict]:
    """``benchmarks/serving.py`` run without a GPU (its bytes tables): the rows of CSV
    ``name``."""
    bench = Path(__file__).resolve().parent.parent / "benchmarks"
    res = subprocess.run([sys.executable, "serving.py"], cwd=bench, capture_output=True,
                         text=True, timeout=300, env={**os.environ, "OUT": str(tmp_path)})
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    return list(csv.DictReader((tmp_path / name).open()))


def test_serving_wire_bytes_table(tmp_path):
    """The bytes-on-the-wire table of ``benchmarks/serving.py`` (no GPU): with attn-tp 1
    every byte sent is a wire row, so wire/bf16 is exactly the row-size ratio (fp8, nvfp4,
    mxfp4); with attn-tp 2 the bf16 reduce-scatter stays, so the ratio lies between that
    and 1; MAX_LEN sends as much with idle replicas as without, GATHERV half as much with
    half of them."""
    from dpx.modes import Wire
    from dpx.wire import wire_row_bytes

    rows = _serving_csv(tmp_path, "serving_wire.csv")
    assert len(rows) == 2 * 3 * 2 * 2
    sent = {}
    for r in rows:
        bf16 = float(r["bf16_MiB"])
        for w in (Wire.FP8, Wire.NVFP4, Wire.MXFP4):
            row_ratio = wire_row_bytes(7168, w) / (2 * 7168)
            mib, ratio = float(r[f"{w.value}_MiB"]), float(r[f"{w.value}_vs_bf16"])
            assert bf16 > 0 and ratio == pytest.approx(mib / bf16)
            if "attn_tp=1" in r["layout"]:
                assert ratio == pytest.approx(row_ratio, rel=1e-12)
            else:
                assert row_ratio < ratio < 1
        sent[r["layout"], r["size"], r["pattern"], r["mode"]] = bf16
    for (lay, size, pattern, mode), bf16 in sent.items():
        if pattern == "busy":
            idle = sent[lay, size, "half idle", mode]
            assert idle == pytest.approx(bf16) if mode == "max_len" else idle < bf16
            if mode == "gatherv" and "attn_tp=1" in lay:
                assert idle == pytest.approx(bf16 / 2)


def test_serving_combine_bytes_table(tmp_path):
    """The combine's bytes table of ``benchmarks/serving.py`` (``serving_combine_bytes.csv``,
    no GPU): with attn-tp 1 MAX_LEN and GATHERV send as many wire rows as the bf16
    reduce-scatter sends rows, busy or with idle replicas (GATHERV's chunks travel as they
    lie), SUM_LEN half as many (its native all-reduce sends twice); with attn-tp 2 the bf16
    all-gather of the summed chunks stays; every wire always sends less."""
    from dpx.modes import Wire
    from dpx.wire import wire_row_bytes

    rows = _serving_csv(tmp_path, "serving_combine_bytes.csv")
    assert len(rows) == 2 * 3 * 2 * 3
    for r in rows:
        bf16 = float(r["bf16_MiB"])
        for w in (Wire.FP8, Wire.NVFP4, Wire.MXFP4):
            row_ratio = wire_row_bytes(7168, w) / (2 * 7168)
            ratio = float(r[f"{w.value}_vs_bf16"])
            assert bf16 > 0 and ratio == pytest.approx(float(r[f"{w.value}_MiB"]) / bf16)
            assert ratio < 1
            if "attn_tp=1" in r["layout"]:
                want = row_ratio / 2 if r["mode"] == "sum_len" else row_ratio
                assert ratio == pytest.approx(want, rel=1e-12)
            elif r["mode"] != "sum_len":
                assert row_ratio < ratio < 1


def test_lm_head_bytes_table(tmp_path):
    """benchmarks/lm_head.py's bytes table: every row's ratio is the ratio of its two byte
    counts, 1 / dp in MAX_LEN, and never above 1."""
    bench = Path(__file__).resolve().parent.parent / "benchmarks"
    res = subprocess.run([sys.executable, "lm_head.py", "--vocab", "1024", "--decode", "4",
                          "--prefill", "64"], cwd=bench, capture_output=True, text=True,
                         timeout=600, env={**os.environ, "OUT": str(tmp_path)})
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    rows = list(csv.DictReader((tmp_path / "lm_head_bytes.csv").open()))
    assert len(rows) == 4 * 2 * 2 * 2
    for r in rows:
        ag, sc = float(r["all_gather_MiB"]), float(r["scatter_columns_MiB"])
        assert sc <= ag * (1 + 1e-6), r
        if r["mode"] == "max_len":
            assert float(r["ratio"]) == pytest.approx(1 / int(r["dp"]), abs=1e-4), r


def test_peer_sum_variants_run_and_match_bit_for_bit():
    """``benchmarks/peer_sum_variants.py --interpret``: every variant of the peer wire
    pull-sum (a select of masked rows, int64 index math, no alignment told, other launch
    shapes) and the combine's summing pass give the library kernel's bits on every wire,
    in Triton's interpreter; the script says so and exits 0 only then."""
    pytest.importorskip("triton")
    bench = Path(__file__).resolve().parent.parent / "benchmarks"
    res = subprocess.run([sys.executable, "peer_sum_variants.py", "--interpret"], cwd=bench,
                         capture_output=True, text=True, timeout=600,
                         env={**os.environ, "TRITON_INTERPRET": "1"})
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
    assert len(lines) == 3 and all("DIFF" not in ln for ln in lines), res.stdout[-2000:]
    assert res.stdout.rstrip().endswith("every variant equal to dpx bit for bit")
