"""The LM-head scatter (``scatter_columns``) against an all-gather of the columns and a
scatter: bytes each rank receives, and on a GPU the time of both paths.

    python benchmarks/lm_head.py [--gpu]

Bytes (from the plans, any machine): worlds 8 to 64, dp = world and dp = world / 8, a
decode step (``--decode`` rows a replica) and a prefill step (``--prefill``), logits of
``--vocab`` columns in bf16, every mode the sglang rule and the cost policy pick. The
all-gather path receives ``(world - 1) * global_rows`` rows of ``vocab / world`` columns;
``scatter_columns`` receives ``(world - 1) * B`` such rows in its all-to-all plus ``(k - 1)
* B`` full rows in the all-gather of the ``k`` ranks sharing the rows, or, where every rank's
rows are its own and tile the input (SUM_LEN and GATHERV, dp = world, host counts), the
cost model's price of its variable all-to-all of the real rows (``(world - 1) / world`` of
them: each rank's average share, where the rank with the most rows receives ``(world - 1)
* max n``; docs/semantics.md, "The LM-head scatter").

``--gpu``: NCCL world 1 on the one GPU (the only world NCCL runs there): device time under
CUDA graphs of ``scatter_columns`` against ``all_gather_into_tensor`` of the columns then
``scatter``, and against a device-to-device copy of the output's bytes, at the decode and
prefill sizes. At world 1 the collectives are copies: the figures are the local passes'.
Writes ``lm_head_bytes.csv`` (and ``lm_head_gpu.csv``) and ``lm_head.png`` to ``$OUT``.
"""

from __future__ import annotations

import argparse

import dpx
from common import out_dir, print_table, world_plot, write_csv
from dpx.modes import Op

ITEMSIZE = 2  # bf16


def received(plan: dpx.DpPlan, op: Op, row_bytes: int) -> int:
    """Bytes the cost model prices ``op``'s collectives at (the rank with the most local
    work's; what every rank receives where the blocks are equal, each rank's average share
    for a variable all-to-all)."""
    return dpx.cost.estimate_op(plan, op, row_bytes=row_bytes,
                                cost_model=dpx.CostModel()).moved


def bytes_rows(vocab: int, decode: int, prefill: int) -> list[dict]:
    rows = []
    for world in (8, 16, 32, 64):
        for dp in (world, world // 8):
            lay = dpx.DpLayout(world, dp)
            C = vocab // world
            for step, per in (("decode", decode), ("prefill", prefill)):
                counts = [per if d % 4 else per // 2 for d in range(dp)]  # uneven
                for policy in ("sglang", "cost"):
                    plan = dpx.plan_step(counts, lay, policy=policy, is_extend=step == "prefill")
                    ag = (world - 1) * plan.global_rows * C * ITEMSIZE
                    sc = received(plan, Op.SCATTER_COLUMNS, C * ITEMSIZE)
                    rows.append(dict(world=world, dp=dp, step=step, policy=policy,
                                     mode=plan.mode.value, global_rows=plan.global_rows,
                                     slot_rows=plan.max_slot_rows,
                                     all_gather_MiB=round(ag / 2**20, 3),
                                     scatter_columns_MiB=round(sc / 2**20, 3),
                                     ratio=round(sc / ag, 4), one_over_dp=round(1 / dp, 4)))
    return rows


def gpu_rows(vocab: int, decode: int, prefill: int) -> list[dict]:
    import tempfile

    import torch
    import torch.distributed as dist

    from common import copy_us, cuda_time_us
    from dpx_torch import DpComm
    from dpx_torch.collectives import all_gather_single

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"file://{tempfile.mkdtemp()}/rdv", rank=0,
                            world_size=1)
    comm = DpComm(dpx.DpLayout(1, 1))
    rows, ceil = [], {}
    for step, n in (("decode", decode), ("prefill", prefill)):
        for mode in ("max_len", "sum_len", "gatherv"):
            plan = dpx.plan_step([n], comm.layout, mode=mode)
            shard = torch.randn(plan.global_rows, vocab, device="cuda").to(torch.bfloat16)
            full = torch.empty_like(shard)
            out = torch.empty(plan.slot_rows[0], vocab, dtype=shard.dtype, device="cuda")
            assert torch.equal(comm.scatter_columns(shard, plan), comm.scatter(shard, plan))
            ours = cuda_time_us(lambda: comm.scatter_columns(shard, plan, out=out))

            def two_pass():
                all_gather_single(full, shard)
                comm.scatter(full, plan, out=out)
            theirs = cuda_time_us(two_pass)
            copy = copy_us(2 * out.numel() * out.element_size(), ceil)
            rows.append(dict(step=step, mode=mode, rows=plan.global_rows, vocab=vocab,
                             scatter_columns_us=round(ours, 2),
                             all_gather_scatter_us=round(theirs, 2),
                             ratio=round(ours / theirs, 3), copy_us=round(copy, 2),
                             vs_copy=round(ours / copy, 3)))
    comm.destroy()
    dist.destroy_process_group()
    return rows


def _plot(rows: list[dict], path) -> None:
    lines = []
    for step, style in (("decode", "o-"), ("prefill", "s--")):
        for eq_world, alpha in ((True, 1.0), (False, 0.5)):
            pts = [r for r in rows if r["step"] == step and r["policy"] == "sglang"
                   and (r["dp"] == r["world"]) == eq_world]
            lines.append((f"{step}, {'dp = world' if eq_world else 'dp = world/8'}", style,
                          alpha, [r["world"] for r in pts], [r["ratio"] for r in pts]))
    world_plot(lines, path, ylabel="bytes received: scatter_columns / all-gather path",
               title="LM-head scatter, sglang policy's plans")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=129280 // 64 * 64)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--prefill", type=int, default=2048)
    ap.add_argument("--gpu", action="store_true", help="also time both paths on the GPU")
    args = ap.parse_args()
    rows = bytes_rows(args.vocab, args.decode, args.prefill)
    print("bytes each rank receives (bf16 logits):")
    print_table(rows, list(rows[0]))
    out = out_dir()
    write_csv(out / "lm_head_bytes.csv", rows)
    _plot(rows, out / "lm_head.png")
    if args.gpu:
        g = gpu_rows(args.vocab, args.decode, args.prefill)
        print("device µs per call under CUDA graphs (NCCL world 1):")
        print_table(g, list(g[0]))
        write_csv(out / "lm_head_gpu.csv", g)


if __name__ == "__main__":
    main()
