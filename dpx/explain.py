"""Human-readable rendering of a plan: layout, slots, buffer picture, mode costs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dpx.cost import CostModel

if TYPE_CHECKING:
    from dpx.plan import DpPlan

_BAR = 48


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} GiB"


def buffer_picture(plan: "DpPlan") -> list[str]:
    """One line per slot: ``#`` real rows, ``.`` pad rows, scaled to a fixed width."""
    scale = max(plan.global_rows, 1)
    lines = []
    for d, (n, rows, off) in enumerate(zip(plan.num_tokens, plan.slot_rows, plan.offsets)):
        real = round(_BAR * n / scale)
        pad = round(_BAR * rows / scale) - real
        if plan.dynamic_offsets:
            where = "offset on device"
        else:
            where = f"rows [{off}, {off + rows})"
        lines.append(f"  slot {d:>2} {where:<22} |{'#' * real}{'.' * max(pad, 0)}| "
                     f"{n} real, {rows - n} pad")
    return lines


def explain_plan(plan: "DpPlan", *, hidden: int, itemsize: int, cost_model: CostModel) -> str:
    from dpx.plan import ALL_MODES, estimate_mode

    lay = plan.layout
    row_bytes = hidden * itemsize
    out = [
        f"layout : {lay.describe()}",
        f"counts : {list(plan.num_tokens)} (aligned to attn_tp={lay.attn_tp_size}: "
        f"{list(plan.aligned_tokens)})" + ("  [extend]" if plan.is_extend else ""),
        f"mode   : {plan.mode.name}  ({plan.reason})",
        f"global : {plan.global_rows} rows x {hidden} x {itemsize} B = "
        f"{_fmt_bytes(plan.global_rows * row_bytes)}"
        + (f"  [static capacity {plan.capacity}]" if plan.is_static else ""),
        "buffer :",
        *buffer_picture(plan),
        f"modes  (gather + reduce_scatter of one step, hidden={hidden}, {itemsize} B/elem):",
    ]
    for m in ALL_MODES:
        est = estimate_mode(m, plan.aligned_tokens, lay, row_bytes=row_bytes,
                            cost_model=cost_model)
        mark = "*" if m is plan.mode else " "
        out.append(f"  {mark} {m.name:<8} global {est.global_rows:>7} rows  sends "
                   f"{_fmt_bytes(est.moved):>12}  est {est.seconds * 1e6:9.1f} us")
    out.append("  (* = chosen)")
    return "\n".join(out)
