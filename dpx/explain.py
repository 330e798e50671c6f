"""Human-readable rendering of a plan: layout, slots, mode estimates, per-rank schedules.

Everything printed here comes from the schedules (:mod:`dpx.schedule`) and their prices
(:mod:`dpx.cost`): the steps listed for a rank are the steps the frontends run.
"""

from __future__ import annotations

from typing import Sequence

from dpx.cost import compare_modes, estimate_op, op_estimate, peer_bytes
from dpx.cost_model import CostModel
from dpx.extents import op_rows
from dpx.errors import DpxValueError, check_int
from dpx.modes import Op, Transport, Wire
from dpx.plan import DpPlan, check_plan
from dpx.schedule import build_schedule
from dpx.transport import TransportChoice
from dpx.wire import wire_row_bytes
from dpx.workspace import PeerLayout, peer_phase_bytes

__all__ = ["buffer_picture", "explain", "fmt_bytes", "lm_head_line", "peer_lines", "schedule_lines"]

_BAR = 48


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} GiB"


def buffer_picture(plan: DpPlan) -> list[str]:
    """One line per slot: ``#`` real rows, ``.`` pad rows, scaled to a fixed width."""
    scale = max(plan.global_rows, 1)
    lines = []
    for d, (n, rows, off) in enumerate(zip(plan.num_tokens, plan.slot_rows, plan.offsets)):
        real = round(_BAR * n / scale)
        pad = round(_BAR * rows / scale) - real
        where = "offset on device" if plan.dynamic_offsets else f"rows [{off}, {off + rows})"
        lines.append(f"  slot {d:>2} {where:<22} |{'#' * real}{'.' * max(pad, 0)}| "
                     f"{n} real, {rows - n} pad")
    return lines


def schedule_lines(plan: DpPlan, rank: int, *, row_bytes: int, cost_model: CostModel,
                   transport: Transport, device_counts: bool, hidden: int,
                   wire: Wire = Wire.NATIVE) -> list[str]:
    """Rank ``rank``'s priced steps for a partial gather, a replicated gather and a
    reduce_scatter, each on ``wire`` (inputs as large as the plan needs)."""
    out = []
    wrb = None if wire is Wire.NATIVE else wire_row_bytes(hidden, wire)
    cases = ((Op.GATHER, True, "gather(partial=True)"), (Op.GATHER, False,
             "gather(partial=False)"), (Op.REDUCE_SCATTER, True, "reduce_scatter"))
    for op, partial, title in cases:
        in_rows = op_rows(plan, op, rank, device_counts=device_counts).need
        if wire is not Wire.NATIVE:
            title = (title.replace(")", f", wire='{wire.value}')") if "(" in title
                     else f"{title}(wire='{wire.value}')")
        try:
            sched = build_schedule(plan, op, rank=rank, partial=partial, transport=transport,
                                   device_counts=device_counts, in_rows=in_rows, wire=wire)
        except DpxValueError as exc:
            out.append(f"  rank {rank} {title}: {exc}")
            continue
        est = op_estimate(sched, row_bytes=row_bytes, cost_model=cost_model, wire_row_bytes=wrb)
        out.append(f"  rank {rank} {title}: {len(sched.steps)} steps, est "
                   f"{est.seconds * 1e6:.1f} us")
        for step, cost in zip(sched.steps, est.steps):
            moved = f"sends {fmt_bytes(cost.moved)}" if cost.moved else (
                "sends nothing" if cost.collective else "local")
            out.append(f"    {str(step):<78} {moved:>18} {cost.seconds * 1e6:8.1f} us")
        out += [f"    note: {note}" for note in sched.notes]
    return out


def explain(plan: DpPlan, *, hidden: int = 7168, itemsize: int = 2,
            cost_model: CostModel | None = None, ranks: Sequence[int] | None = (0,),
            transport: Transport | str = Transport.PER_ROOT, device_counts: bool = False,
            wire: Wire | str = Wire.NATIVE, vocab: int | None = None,
            choice: TransportChoice | None = None) -> str:
    """A human-readable account of ``plan``: layout, slots, a picture, every mode's
    estimate, and the priced schedules (partial and replicated gather and
    reduce_scatter, on ``wire``) of ``ranks`` (``None``: all). Prices rows of ``hidden`` elements of
    ``itemsize`` bytes; ``vocab``: also the LM-head scatter of logits of ``vocab`` columns
    against an all-gather of the columns and a scatter. ``choice``: a communicator's
    transport and why (``DpComm.explain`` passes it; it sets ``transport``). On the peer
    transport it also states the workspace a phase needs and what each rank puts and
    pulls."""
    check_plan(plan)
    model = cost_model or CostModel()
    transport = Transport.parse(transport) if choice is None else choice.transport
    row_bytes = hidden * itemsize
    modes = compare_modes(plan.num_tokens, plan.layout, row_bytes=row_bytes, cost_model=model,
                          transport=transport, cp_shards=plan.cp_shards)
    lay = plan.layout
    out = [
        f"prices : rows of {hidden} elements x {itemsize} B = {row_bytes} B (set by "
        f"explain(hidden=, itemsize=); the CLI's --hidden, --dtype); {model}",
        f"layout : {lay.describe()}",
        f"counts : {list(plan.num_tokens)} (aligned to cp*attn_tp={lay.replica_size}: "
        f"{list(plan.aligned_tokens)})" + ("  [extend]" if plan.is_extend else ""),
        *([f"shards : {[list(s) for s in plan.cp_shards]} (each CP rank's rows, back to back "
           f"at its slot's start)"] if plan.sharded else
          ["cp     : every CP rank of a replica holds all its rows"] if lay.cp_size > 1
          else []),
        f"mode   : {plan.mode.name}  ({plan.reason})",
        f"global : {plan.global_rows} rows x {hidden} x {itemsize} B = "
        f"{fmt_bytes(plan.global_rows * row_bytes)}"
        + (f"  [static capacity {plan.capacity}]" if plan.is_static else ""),
        "buffer :",
        *buffer_picture(plan),
        f"modes  (gather(partial) + reduce_scatter, slowest rank each, hidden={hidden}, "
        f"{itemsize} B/elem, transport {transport.value}):",
    ]
    for est in modes:
        mark = "*" if est.mode is plan.mode else " "
        out.append(f"  {mark} {est.mode.name:<8} global {est.global_rows:>7} rows  sends "
                   f"{fmt_bytes(est.moved):>12}  est {est.seconds * 1e6:9.1f} us")
    out.append("  (* = chosen: this plan's mode; estimates price the schedules below, "
               "for non-capacity plans of the same counts)")
    if vocab is not None:
        out.append(lm_head_line(plan, vocab, itemsize, model, transport))
    if choice is not None:
        out.append(f"transport: {choice}")
    if transport is Transport.PEER:
        out.extend(peer_lines(plan, hidden, itemsize, Wire.parse(wire), ranks))
    counts = "device counts (priced at the plan's counts)" if device_counts else "host counts"
    out.append(f"schedules ({counts}; a collective 'sends' the cost model's bytes a rank, "
               f"a variable one's the ranks' mean):")
    for r in range(lay.world_size) if ranks is None else ranks:
        out.extend(schedule_lines(plan, r, row_bytes=row_bytes, cost_model=model,
                                  transport=transport, device_counts=device_counts,
                                  hidden=hidden, wire=Wire.parse(wire)))
    return "\n".join(out)


def peer_lines(plan: DpPlan, hidden: int, itemsize: int, wire: Wire,
               ranks: Sequence[int] | None) -> list[str]:
    """The peer transport's workspace for this plan (the bytes a phase needs: the gather's
    and the combine's ``global_rows`` rows) and each listed rank's puts and pulls (real
    rows only)."""
    rb = hidden * itemsize
    wrb = rb if wire is Wire.NATIVE else wire_row_bytes(hidden, wire)
    need = peer_phase_bytes(plan.global_rows, max(rb, wrb))
    lay = PeerLayout(plan.layout.world_size, need)
    out = [f"peer   : a phase of >= {fmt_bytes(need)} ({plan.global_rows} rows x "
           f"{max(rb, wrb)} B; PeerOptions(phase_bytes=)), {fmt_bytes(lay.total_bytes)} a "
           f"rank in all (two phases, flags)"]
    for r in range(plan.layout.world_size) if ranks is None else ranks:
        g, c = (peer_bytes(build_schedule(plan, op, rank=r, transport=Transport.PEER, wire=wire),
                           row_bytes=rb, wire_row_bytes=wrb)
                for op in (Op.GATHER, Op.REDUCE_SCATTER))
        out.append(f"  rank {r}: gather puts {fmt_bytes(g[0])}, reduce_scatter pulls "
                   f"{fmt_bytes(c[1])} (real rows only)")
    return out


def lm_head_line(plan: DpPlan, vocab: int, itemsize: int, model: CostModel,
                 transport: Transport) -> str:
    """The LM-head scatter of ``vocab``-column logits priced against the all-gather of the
    columns then a scatter (the cost model's figures for the rank with the most local work:
    bytes a rank sends, a variable all-to-all at each rank's average share)."""
    W = plan.layout.world_size
    check_int("vocab", vocab, minimum=W)
    if vocab % W:
        raise DpxValueError(f"vocab={vocab} must be a multiple of world_size={W} (each "
                            f"rank holds vocab / world_size columns)")
    rb = vocab // W * itemsize
    cols = estimate_op(plan, Op.SCATTER_COLUMNS, row_bytes=rb, cost_model=model,
                       transport=transport)
    moved, coll = model.collective_seconds(W * plan.global_rows * rb, W, (W - 1) / W)
    take = estimate_op(plan, Op.SCATTER, row_bytes=vocab * itemsize, cost_model=model,
                       transport=transport)
    return (f"lm head: vocab {vocab} ({vocab // W} columns a rank): scatter_columns sends "
            f"{fmt_bytes(cols.moved)}, est {cols.seconds * 1e6:.1f} us; all-gather of the "
            f"columns + scatter sends {fmt_bytes(moved)}, est "
            f"{(coll + take.seconds) * 1e6:.1f} us")
