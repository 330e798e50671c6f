"""Jobs of tests/test_trust.py: the promises of the full path kept by every call form
(implicit, ``prepare_*``, the sglang drop-in, ``*_async``), on gloo worlds."""

from __future__ import annotations

from types import SimpleNamespace

import torch

import dpx
from harness import raised


def _one(fn) -> dict:
    """What ``fn()`` raised on this rank: its class's kinds and message."""
    try:
        fn()
    except dpx.DpxError as exc:
        return dict(cls=type(exc).__name__, mismatch=isinstance(exc, dpx.DpxMismatchError),
                    value=isinstance(exc, ValueError), type=isinstance(exc, TypeError),
                    msg=str(exc))
    return dict(cls=None, msg="no error")


def validate_forms(ctx) -> dict:
    """Ranks that disagree after prepared calls, under ``validate=True``, in every call
    form: each scenario's outcome on this rank (every rank must raise the same error; a
    rank that skipped the exchange would leave its peers hanging, which the harness turns
    into a failure). Ends with consistent calls, which must pass."""
    import dpx_torch.sglang as sg

    layout = dpx.DpLayout(4, 2)
    comm = ctx.comm(layout, validate=True)
    r, d = ctx.rank, layout.coords(ctx.rank).attn_dp_rank
    plan = dpx.plan_step([3, 2], layout)
    other = dpx.plan_step([3, 3], layout)
    x = torch.arange(4 * 6, dtype=torch.float32).reshape(4, 6)
    g = torch.ones(plan.global_rows, 6)
    sl = torch.zeros(plan.slot_rows[d], 6)
    res = {}
    # implicit calls after the same call was prepared (run twice: kept as a prepared op)
    for _ in range(2):
        comm.gather(x, plan, partial=True)
    res["implicit"] = _one(lambda: comm.gather(x, other if r == 3 else plan, partial=True))
    # an explicit prepared op whose guards admit the call on three ranks, not on rank 2
    op = comm.prepare_gather(x, plan, partial=True)
    for _ in range(2):
        op(x)
    res["explicit"] = _one(lambda: op(x.double() if r == 2 else x))
    res["explicit_rows"] = _one(lambda: op(x[:1] if r == 2 else x))
    # scatter takes part: one rank scatters while the others reduce-scatter
    res["scatter_vs_rs"] = _one(lambda: comm.scatter(g, plan) if r == 0 else
                                comm.reduce_scatter(g, plan))
    ps, prs = comm.prepare_scatter(g, plan, out=sl), comm.prepare_reduce_scatter(g, plan)
    ps(g, out=sl), prs(g)
    res["prepared_scatter_vs_rs"] = _one(lambda: ps(g, out=sl) if r == 1 else prs(g))
    pc = comm.prepare_scatter_columns(g[:, :2].contiguous(), plan)
    res["prepared_columns"] = _one(lambda: pc(g[:, :3].contiguous() if r == 3 else
                                              g[:, :2].contiguous()))
    res["async"] = _one(lambda: comm.gather_async(x, other if r == 1 else plan, partial=True))
    g_other = torch.ones(other.global_rows, 6)
    res["async_rs"] = _one(lambda: comm.reduce_scatter_async(g_other if r == 1 else g,
                                                             other if r == 1 else plan))
    # a rank's own count of another dtype; an async input inside the call's pooled output
    # (rows of the key's last result, not this rank's slot); an in-place gather from its
    # slot of an out of another dtype: rejected on one rank
    n = torch.tensor([2], dtype=torch.int64 if r == 1 else torch.int32)
    res["exchange"] = _one(lambda: comm.exchange_counts(n))
    pooled, _ = comm.gather_async(x, plan, partial=True, key="alias")
    res["async_pooled"] = _one(lambda: comm.gather_async(
        pooled[1:4] if r == 3 else x, plan, partial=True, key="alias"))
    o16 = torch.zeros(plan.global_rows, 6, dtype=torch.float16 if r == 0 else torch.float32)
    slot = comm.local_slot(o16, plan)
    res["in_place_dtype"] = _one(lambda: comm.gather(
        slot.view(torch.bfloat16).view(-1, 6) if r == 0 else slot, plan, partial=True,
        out=o16))
    # the drop-in: ranks disagreeing on is_dp_max_padding() scatter and reduce-scatter
    att = sg.setup(comm, hidden_size=6, dtype=torch.float32, device="cpu")
    batch = SimpleNamespace(global_num_tokens_cpu=[3, 2], global_num_tokens_gpu=None,
                            dp_padding_mode=sg.DpPaddingMode.SUM_LEN,
                            dp_local_start_pos=None, dp_local_num_tokens=None)
    sp = dpx.plan_step([3, 2], layout, mode="sum_len")
    att.set_dp_buffer_len(sp.global_rows, 3, [3, 2])
    glob, loc = torch.zeros(sp.global_rows, 6), torch.zeros(sp.slot_rows[d], 6)
    sg.dp_gather_partial(glob, x[:[3, 2][d]], batch)
    res["dropin"] = _one(lambda: sg.dp_scatter(loc, glob, batch) if r == 0 else
                         sg.dp_reduce_scatter_tensor(loc, glob))
    short = torch.zeros(sp.global_rows - 1, 6)
    res["dropin_rows"] = _one(lambda: sg.dp_gather_partial(short if r == 2 else glob,
                                                           x[:[3, 2][d]], batch))
    sg.teardown()
    # several tensors on one rank, one tensor on the others
    res["batch_vs_one"] = _one(lambda: comm.gather((x, x) if r == 0 else x, plan,
                                                   partial=True))
    # validate switched on after ops were prepared without it
    plain = ctx.comm(layout)
    pop = plain.prepare_gather(x, plan, partial=True)
    pop(x)
    plain.validate = True
    res["switched_on"] = _one(lambda: pop(x, out=None) if r != 0 else
                              plain.gather(x, other, partial=True))
    plain.validate = False
    # the world is still usable, and consistent calls pass validation
    got = op(x)
    res["ok"] = bool(torch.equal(got, comm.gather(x, plan, partial=True))
                     and torch.equal(ps(g, out=sl), comm.scatter(g, plan))
                     and torch.equal(prs(g), comm.reduce_scatter(g, plan)))
    return res


def validate_kinds(ctx) -> dict:
    """A rank's rejected input under validate=True: every rank raises one class, a
    DpxMismatchError that is also the rejected error's kind."""
    layout = dpx.DpLayout(4, 2)
    comm = ctx.comm(layout, validate=True)
    r = ctx.rank
    plan = dpx.plan_step([3, 2], layout)
    x = torch.zeros(4, 6)
    return dict(
        type=_one(lambda: comm.gather(x.double() if r == 1 else x, plan, partial=True)),
        value=_one(lambda: comm.gather(x[:1] if r == 2 else x, plan, partial=True)),
        both=_one(lambda: comm.gather(x.double() if r == 1 else x[:1] if r == 2 else x,
                                      plan, partial=True)),
        disagree=_one(lambda: comm.gather(x, plan, partial=r != 0)),
        scalar=raised(lambda: comm.gather(torch.tensor(1.0), plan, partial=False)),
    )


def destroy_drops_the_groups(ctx) -> dict:
    """The drop-in, an autograd graph and a held prepared op do not keep a destroyed
    communicator's groups: after ``destroy()`` no reference to its own subgroup is left,
    and a backward through a dpx call refuses to run."""
    import gc
    import weakref

    import dpx_torch.sglang as sg
    from dpx_torch import DpComm

    layout = dpx.DpLayout(4, 2)                       # attn-tp 2: a subgroup it owns
    comm = DpComm(layout)
    owned = [weakref.ref(g) for g in comm.groups.owned]
    sg.setup(comm, hidden_size=4, dtype=torch.float32, device="cpu")
    plan = dpx.plan_step([3, 2], layout)
    x = torch.ones(3, 4, requires_grad=True)
    y = comm.gather(x, plan, partial=True)            # a graph through dpx
    op = comm.prepare_gather(x.detach(), plan, partial=True)
    op(x.detach())
    comm.destroy()
    gc.collect()
    res = dict(owned=len(owned), alive=sum(w() is not None for w in owned),
               prep=op.prep is None, backward=raised(lambda: y.sum().backward()))
    sg.teardown()
    return res
