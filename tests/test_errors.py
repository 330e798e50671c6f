"""The bad-input catalogue (docs/errors.md): one check per entry, each raising a dpx error
subclass whose message names the value and the rule, before any collective starts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import dpx
from dpx import (DpxCapacityError, DpxError, DpxMismatchError, DpxTypeError,  # noqa: F401
                 DpxValueError)

DOC = Path(__file__).resolve().parent.parent / "docs" / "errors.md"


@pytest.fixture()
def comm(comm1):
    return comm1


L1 = dpx.DpLayout(1, 1)
P5 = dpx.plan_step([5], L1)


def _x(rows=6, width=4, dtype=torch.float32):
    return torch.zeros(rows, width, dtype=dtype)


def _jax():
    return pytest.importorskip("dpx_jax")


def _jax_in_shard_map(fn, layout=None):
    import jax
    import jax.numpy as jnp

    from jax_harness import SPEC, mesh_for, shard

    lay = layout or dpx.DpLayout(2, 2)
    mesh = mesh_for(lay)
    x = shard(mesh, [jnp.zeros((2, 3))] * 2, jnp.float32)
    return jax.shard_map(lambda l: fn(l, lay), mesh=mesh, in_specs=SPEC, out_specs=SPEC)(x)


def _torch_rows():
    import dpx_torch

    return dpx_torch


def _destroyed(comm):
    """A second communicator on the world-1 group, destroyed (it owns no group)."""
    from dpx_torch import DpComm

    other = DpComm(comm.layout)
    other.destroy()
    return other


def _destroyed_op(comm):
    """A prepared gather of a communicator destroyed after it was prepared."""
    from dpx_torch import DpComm

    other = DpComm(comm.layout)
    op = other.prepare_gather(_x(), P5, partial=True)
    other.destroy()
    return op


def _strict(comm):
    """A ``validate=True`` communicator on the world-1 group."""
    from dpx_torch import DpComm

    return DpComm(comm.layout, validate=True)


def _peer(comm, **options):
    """A peer-transport communicator on the world-1 group (host memory), destroyed once it
    has raised."""
    from dpx_torch import DpComm, PeerOptions

    return DpComm(comm.layout, transport="peer", peer=PeerOptions(device="cpu", **options))


def _peer_call(comm, fn, **options):
    other = _peer(comm, **options)
    try:
        return fn(other)
    finally:
        other.destroy()


def _sglang(comm):
    """``dpx_torch.sglang`` set up on ``comm`` (torn down when ``comm`` is None)."""
    import dpx_torch.sglang as sg

    if comm is None:
        sg.teardown()
    else:
        sg.setup(comm, hidden_size=4, dtype=torch.float32, device="cpu")
    return sg


P5_SUM = dpx.plan_step([5], L1, mode="sum_len")
P5_MAX = dpx.plan_step([5], L1, mode="max_len")


def _mask(t, plan=P5, **kw):
    import dpx_torch

    return dpx_torch.mask_pad_rows(t, plan, **kw)


# id -> (callable(comm), error type, message regex)
_RIDE_SUM = dpx.plan_step([0], L1, mode="sum_len", capacity=8)
_RIDE_MAX = dpx.plan_step([0], L1, mode="max_len", capacity=8)

CASES = {
    "peer-transport": (lambda c: __import__("dpx_torch").DpComm(c.layout, transport="ragged"),
                       DpxValueError, r"transport='ragged': a torch communicator runs on "
                                      r"'per_root' or 'peer'"),
    "peer-options": (lambda c: __import__("dpx_torch").PeerOptions(phase_bytes=-1),
                     DpxValueError, r"PeerOptions\(phase_bytes\)=-1 must be >= 0"),
    "peer-phase": (lambda c: _peer_call(c, lambda p: p.gather(_x(), P5, partial=True),
                                        phase_bytes=64),
                   DpxCapacityError, r"peer transport: all_gather_v moves a 5 x 16-byte "
                                     r"buffer \(80 bytes a phase\); this communicator's "
                                     r"workspace holds 64"),
    "explain-plan": (lambda c: dpx.explain("x"), DpxTypeError,
                     r"plan must be a dpx.DpPlan, got str"),
    "wire-sum-len": (lambda c: c.gather(_x(6, 128), P5_SUM, partial=True, wire="fp8"),
                     DpxValueError, r"wire='fp8' needs a copy mode \(max_len or gatherv\)"),
    "wire-dequantize": (lambda c: c.gather(_x(6, 128), P5_MAX, partial=True, wire="fp8",
                                           dequantize="no"),
                        DpxTypeError, r"dequantize='no' must be a bool"),
    "wire-width": (lambda c: c.gather(_x(6, 100), P5_MAX, partial=True, wire="fp8"),
                   DpxValueError, r"H=100 must be a positive multiple of 128"),
    "wire-dtype": (lambda c: c.gather(_x(6, 128, torch.int32), P5_MAX, partial=True,
                                      wire="fp8"),
                   DpxTypeError, r"wire='fp8' quantizes float32, bfloat16, float16; local has "
                                 r"dtype int32"),
    "wire-name": (lambda c: c.gather(_x(6, 128), P5_MAX, partial=True, wire="fp4"),
                  DpxValueError, r"unknown Wire 'fp4': expected one of 'native', 'fp8', "
                                 r"'nvfp4', 'mxfp4'"),
    "wire-fp4-sum-len": (lambda c: c.gather(_x(6, 64), P5_SUM, partial=True, wire="mxfp4"),
                         DpxValueError, r"wire='mxfp4' needs a copy mode \(max_len or "
                                        r"gatherv\)"),
    "wire-fp4-width": (lambda c: c.gather(_x(6, 40), P5_MAX, partial=True, wire="nvfp4",
                                          wire_scale=1.0),
                       DpxValueError, r"wire='nvfp4' quantizes blocks of 16 elements: H=40 "
                                      r"must be a positive multiple of 16"),
    "wire-scale-missing": (lambda c: c.gather(_x(6, 64), P5_MAX, partial=True, wire="nvfp4"),
                           DpxValueError, r"wire='nvfp4' needs wire_scale=: the global "
                                          r"scale g"),
    "wire-scale-range": (lambda c: c.gather(_x(6, 64), P5_MAX, partial=True, wire="nvfp4",
                                            wire_scale=-2.0),
                         DpxValueError, r"wire_scale=-2.0: nvfp4's global scale must be a "
                                        r"positive float in \[2\*\*-64, 2\*\*64\]"),
    "wire-scale-type": (lambda c: c.gather(_x(6, 64), P5_MAX, partial=True, wire="nvfp4",
                                           wire_scale=torch.tensor(1.0)),
                        DpxTypeError, r"wire_scale must be a Python float, got Tensor"),
    "wire-scale-unused": (lambda c: c.gather(_x(6, 64), P5_MAX, partial=True, wire="mxfp4",
                                             wire_scale=1.0),
                          DpxValueError, r"wire_scale applies to wire='nvfp4', not "
                                         r"wire='mxfp4'"),
    "combine-op": (lambda c: dpx.build_schedule(P5, "scatter", rank=0, wire="fp8"),
                   DpxValueError, r"wire='fp8' applies to gather and reduce_scatter, not "
                                  r"scatter"),
    "combine-width": (lambda c: c.reduce_scatter(_x(5, 100), P5, wire="fp8"),
                      DpxValueError, r"wire='fp8' quantizes blocks of 128 elements: H=100 "
                                     r"must be a positive multiple of 128"),
    "combine-dtype": (lambda c: c.reduce_scatter(_x(5, 64, torch.int32), P5, wire="mxfp4"),
                      DpxTypeError, r"wire='mxfp4' quantizes float32, bfloat16, float16; "
                                    r"global_ has dtype int32"),
    "combine-shape": (lambda c: c.reduce_scatter(torch.zeros(5, 2, 128), P5, wire="fp8"),
                      DpxValueError, r"wire='fp8' needs global_ of shape \[rows, H\]; got "
                                     r"\(5, 2, 128\)"),
    "ride-mode": (lambda c: c.gather_with_counts(_x(8), _RIDE_SUM, partial=True,
                                                 n_local=torch.tensor([1], dtype=torch.int32)),
                  DpxValueError, r"counts ride a gather in max_len or gatherv: sum_len "
                                 r"places every replica's rows"),
    "ride-plan": (lambda c: c.gather_with_counts(_x(6), P5, partial=True,
                                                 n_local=torch.tensor([1], dtype=torch.int32)),
                  DpxValueError, r"counts ride the gather of a capacity plan"),
    "ride-shards": (lambda c: c.gather_with_counts(
        _x(8), _RIDE_MAX, partial=True, n_local=torch.tensor([1], dtype=torch.int32),
        shards=True), DpxValueError,
        r"gather_with_counts\(shards=True\) with a plan whose cp_shards is None"),
    "wire-grad": (lambda c: c.gather(_x(6, 128).requires_grad_(), P5_MAX, partial=True,
                                     wire="fp8"),
                  DpxValueError, r"gather\(wire='fp8'\) records no autograd graph"),
    "many-flags": (lambda c: c.gather((_x(), _x()), P5, partial=(True,)), DpxValueError,
                   r"partial has 1 entries for 2 tensors"),
    "mask-rows": (lambda c: _mask(_x(4)), DpxValueError,
                  r"t must be a tensor of plan.global_rows=5 rows, got shape \(4, 4\)"),
    "mask-type": (lambda c: _mask([[0.0]] * 5), DpxTypeError,
                  r"t must be a torch.Tensor, got list"),
    "mask-fill": (lambda c: _mask(torch.zeros(5, 2, dtype=torch.uint8), fill=-1),
                  DpxValueError, r"fill=-1 is not a value of uint8: an integer in \[0, 255\]"),
    "mask-counts": (lambda c: _mask(_x(5), counts=torch.tensor([5], dtype=torch.int32)),
                    DpxValueError, r"counts= needs a capacity plan"),
    "exchange-dtype": (lambda c: c.exchange_counts(torch.tensor([5])), DpxTypeError,
                       r"n_local must be an int32 tensor of shape \(1,\), got torch.int64"),
    "layout-divisible": (lambda c: dpx.DpLayout(6, 4), DpxValueError,
                         r"world_size=6 must be divisible by dp_size\*cp_size=4\*1=4"),
    "layout-positive": (lambda c: dpx.DpLayout(0, 1), DpxValueError, r"world_size=0 must be >= 1"),
    "layout-int": (lambda c: dpx.DpLayout(4, 2.0), DpxTypeError, r"dp_size=2.0 must be an int"),
    "layout-rank": (lambda c: dpx.DpLayout(8, 4).coords(8), DpxValueError,
                    r"rank=8 must be < world_size=8"),
    "counts-length": (lambda c: dpx.plan_step([1, 2, 3], dpx.DpLayout(4, 2)), DpxValueError,
                      r"num_tokens has 3 entries.*dp_size=2"),
    "counts-negative": (lambda c: dpx.plan_step([1, -1], dpx.DpLayout(2, 2)), DpxValueError,
                        r"num_tokens\[1\]=-1 must be >= 0"),
    "counts-int": (lambda c: dpx.plan_step([1, 2.5], dpx.DpLayout(2, 2)), DpxTypeError,
                   r"num_tokens\[1\]=2.5 must be an int"),
    "counts-bool": (lambda c: dpx.plan_step([True, 1], dpx.DpLayout(2, 2)), DpxTypeError,
                    r"num_tokens\[0\]=True must be an int"),
    "mode-string": (lambda c: dpx.plan_step([1], L1, mode="maxlen"), DpxValueError,
                    r"unknown PaddingMode 'maxlen': expected one of 'max_len', 'sum_len', 'gatherv'"),
    "policy-string": (lambda c: dpx.plan_step([1], L1, policy="fast"), DpxValueError,
                      r"unknown Policy 'fast'"),
    "capacity-max-len": (lambda c: dpx.plan_step([9, 1], dpx.DpLayout(2, 2), capacity=8),
                         DpxCapacityError, r"num_tokens\[0\]=9 exceeds capacity=8"),
    "capacity-sum-len": (lambda c: dpx.plan_step([5, 5], dpx.DpLayout(2, 2), capacity=9,
                                                 mode="sum_len"),
                         DpxCapacityError, r"= 10 exceeds capacity=9"),
    "capacity-negative": (lambda c: dpx.plan_step([1], L1, capacity=-1), DpxValueError,
                          r"capacity=-1 must be >= 0"),
    "with-counts": (lambda c: P5.with_counts([1]), DpxValueError, r"needs a capacity plan"),
    "shards-sum": (lambda c: dpx.plan_step([5, 3], dpx.DpLayout(4, 2, 2),
                                           cp_shards=[(2, 2), (3, 0)]), DpxValueError,
                   r"cp_shards\[0\]=\(2, 2\) sums to 4; it must sum to num_tokens\[0\]=5"),
    "shards-shape": (lambda c: dpx.plan_step([5, 3], dpx.DpLayout(4, 2, 2),
                                             cp_shards=[(5,), (3, 0)]), DpxValueError,
                     r"cp_shards\[0\]=\(5,\) must hold cp_size=2 counts"),
    "shards-negative": (lambda c: dpx.plan_step([1, 3], dpx.DpLayout(4, 2, 2),
                                                cp_shards=[(2, -1), (3, 0)]), DpxValueError,
                        r"cp_shards\[0\]\[1\]=-1 must be >= 0"),
    "policy-idle": (lambda c: dpx.plan_step([1, 0], dpx.DpLayout(2, 2), is_extend=True,
                                            policy="cost", max_len_with_idle=True),
                    DpxValueError, r"max_len_with_idle=True is an option of policy='sglang'"),
    "policy-allreduce": (lambda c: dpx.plan_step([1, 1], dpx.DpLayout(2, 2), policy="cost",
                                                 sum_len_allreduce_bytes=1 << 20),
                         DpxValueError, r"sum_len_allreduce_bytes is an option of "
                                        r"policy='sglang'"),
    "explain-vocab": (lambda c: dpx.explain(dpx.plan_step([1, 1], dpx.DpLayout(2, 2)),
                                            vocab=3),
                      DpxValueError, r"vocab=3 must be a multiple of world_size=2"),
    "columns-shape": (lambda c: c.scatter_columns(torch.zeros(5, 2, 2), P5), DpxValueError,
                      r"shard has shape \(5, 2, 2\); scatter_columns takes \[global_rows, C\]"),
    "columns-rows": (lambda c: c.scatter_columns(_x(7), P5), DpxValueError,
                     r"shard has 7 rows; the plan needs exactly 5"),
    "columns-out": (lambda c: c.scatter_columns(_x(5), P5, out=_x(5, 3)), DpxValueError,
                    r"out has shape \(5, 3\) torch.float32 on cpu; it must be \(5, 4\)"),
    "jax-columns-shape": (lambda c: _jax_in_shard_map(lambda l, lay: _jax().scatter_columns(
        l[:, :, None], dpx.plan_step([1, 1], lay, mode="max_len"))), DpxValueError,
        r"shard has shape \(2, 3, 1\); scatter_columns takes \[global_rows, C\]"),
    "schedule-op": (lambda c: dpx.build_schedule(P5, "allgather", rank=0), DpxValueError,
                    r"unknown Op 'allgather': expected one of 'gather', 'scatter'"),
    "cost-model": (lambda c: dpx.CostModel(bus_bandwidth=0), DpxValueError,
                   r"CostModel.bus_bandwidth=0 must be > 0"),
    "rows-place-range": (lambda c: _torch_rows().place_rows(_x(4), 2, 3, 4), DpxValueError,
                         r"start=2, count=3 must satisfy .* start \+ count <= rows \(4\)"),
    "rows-take-range": (lambda c: _torch_rows().take_rows(_x(4), 3, 2, 8), DpxValueError,
                        r"start \+ count <= src rows \(4\)"),
    "rows-contiguous": (lambda c: _torch_rows().take_rows(_x(3, 4).t(), 0, 1, 2), DpxValueError,
                        r"src of shape \(4, 3\) must be contiguous"),
    "rows-zero-out": (lambda c: _torch_rows().zero_rows_(_x(4, 4)[:, :2], 0, 1), DpxValueError,
                      r"zero_rows_: out of shape \(4, 2\) must be a contiguous tensor"),
    "rows-out-shape": (lambda c: _torch_rows().take_rows(_x(4, 3), 0, 1, 2, out=_x(3, 3)),
                       DpxValueError, r"out has shape \(3, 3\).*must be \(2, 3\)"),
    "rows-alias": (lambda c: (lambda x: _torch_rows().take_rows(x, 0, 1, 2, out=x[2:]))(_x(4, 3)),
                   DpxValueError, r"out and src share memory"),
    "rows-index-dtype": (lambda c: _torch_rows().take_rows(_x(4), 0, torch.tensor([1]), 2),
                         DpxTypeError, r"count must be a one-element int32 tensor, got dtype=torch.int64"),
    "rows-device": (lambda c: _torch_rows().take_rows(torch.zeros(4, 3, device="meta"), 0, 1, 2),
                    DpxValueError, r"device meta is not supported"),
    "comm-group-size": (lambda c: __import__("dpx_torch").DpComm(dpx.DpLayout(2, 2)),
                        DpxValueError, r"process group has 1 ranks but layout.world_size=2"),
    "comm-validate": (lambda c: __import__("dpx_torch").DpComm(dpx.DpLayout(2, 2),
                                                               validate=1),
                      DpxTypeError, r"validate=1 must be a bool"),
    "comm-plan-layout": (lambda c: c.gather(_x(), dpx.plan_step([5, 1], dpx.DpLayout(2, 2)),
                                            partial=True),
                         DpxValueError, r"plan was made for layout world=2 dp=2"),
    "comm-local-rows": (lambda c: c.gather(_x(2), P5, partial=True), DpxValueError,
                        r"local has 2 rows; replica 0 needs at least 5"),
    "comm-dtype": (lambda c: c.gather(_x(dtype=torch.float64), P5, partial=True), DpxTypeError,
                   r"local has dtype torch.float64; supported"),
    "comm-contiguous": (lambda c: c.gather(torch.zeros(4, 6).t(), P5, partial=True),
                        DpxValueError, r"local of shape \(6, 4\) must be contiguous"),
    "comm-device": (lambda c: c.gather(torch.zeros(6, 4, device="meta"), P5, partial=True),
                    DpxValueError, r"local is on meta; the process groups' backend gloo "
                                   r"\(carries cpu, cuda\) cannot carry it"),
    "comm-out-size": (lambda c: c.gather(_x(), P5, partial=True, out=_x(4)), DpxValueError,
                      r"out has shape \(4, 4\) torch.float32 on cpu; it must be \(5, 4\)"),
    "comm-out-dtype": (lambda c: c.gather(_x(), P5, partial=True,
                                          out=_x(5, dtype=torch.bfloat16)), DpxTypeError,
                       r"out has dtype torch.bfloat16; it must be torch.float32 \(the "
                       r"input's\)"),
    "columns-out-dtype": (lambda c: c.scatter_columns(_x(5), P5,
                                                      out=_x(5, dtype=torch.float64)),
                          DpxTypeError, r"out has dtype torch.float64; it must be "
                                        r"torch.float32 \(the input's\)"),
    "comm-out-alias": (lambda c: (lambda x: c.gather(x, P5, partial=True, out=x[1:]))(_x(6)),
                       DpxValueError, r"local overlaps out but is not this rank's slot of it \(rows \[0, 5\)"),
    "comm-global-rows": (lambda c: c.reduce_scatter(_x(7), P5), DpxValueError,
                         r"global_ has 7 rows; the plan needs exactly 5"),
    "comm-partial": (lambda c: c.gather(_x(), P5, partial=1), DpxTypeError,
                     r"partial=1 must be a bool"),
    "comm-counts-plan": (lambda c: c.gather(_x(), P5, partial=True,
                                            counts=torch.tensor([1], dtype=torch.int32)),
                         DpxValueError, r"counts= needs a capacity plan"),
    "comm-counts-dtype": (lambda c: c.gather(_x(8), dpx.plan_step([1], L1, capacity=8),
                                             partial=True, counts=torch.tensor([1])),
                          DpxTypeError, r"counts must be a contiguous int32 tensor of shape "
                                        r"\(1,\)"),
    "comm-async-grad": (lambda c: c.gather_async(_x().requires_grad_(), P5, partial=True),
                        DpxValueError, r"gather_async: local requires grad; gather_async "
                                       r"records no autograd graph"),
    "comm-grad-out": (lambda c: c.gather(_x().requires_grad_(), P5, partial=True, out=_x(5)),
                      DpxValueError, r"out= cannot be used when local requires grad"),
    "comm-prepare-grad": (lambda c: c.prepare_gather(_x().requires_grad_(), P5, partial=True),
                          DpxValueError, r"prepare_gather: local requires grad; "
                                         r"prepare_gather records no autograd graph"),
    "comm-sync-counts": (lambda c: c.sync_counts(-3), DpxMismatchError,
                         r"sync_counts: rank 0 passed num_tokens=-3 \(it must be an int >= 0\)"),
    "comm-destroyed": (lambda c: _destroyed(c).gather(_x(), P5, partial=True), DpxValueError,
                       r"this DpComm was destroyed \(DpComm.destroy\(\)\)"),
    "comm-destroyed-prepared": (lambda c: _destroyed_op(c)(_x()), DpxValueError,
                                r"this DpComm was destroyed \(DpComm.destroy\(\)\)"),
    "nvfp4-scale-amax": (lambda c: dpx.nvfp4_scale(0.0), DpxValueError,
                         r"nvfp4_scale\(amax=0.0\): amax must be a positive finite float"),
    "comm-local-slot": (lambda c: c.local_slot_for(_x(8), dpx.plan_step([0], L1, mode="sum_len",
                                                                        capacity=8),
                                                   counts=torch.tensor([3], dtype=torch.int32)),
                        DpxValueError, r"lie at a place the device counts decide"),
    "validate-capacity": (lambda c: _strict(c).gather(
        _x(8), dpx.plan_step([0], L1, capacity=4), partial=True,
        counts=torch.tensor([6], dtype=torch.int32)),
        DpxCapacityError, r"validate: device counts \[6\] do not fit the plan: replica 0 has "
                          r"count 6 > capacity 4"),
    "exchange-capacity": (lambda c: _strict(c).exchange_counts(
        torch.tensor([-2], dtype=torch.int32), plan=dpx.plan_step([0], L1, capacity=4)),
        DpxMismatchError, r"exchange_counts: rank 0 reported -2 < 0"),
    "exchange-plan": (lambda c: c.exchange_counts(torch.tensor([1], dtype=torch.int32),
                                                  plan=P5),
                      DpxValueError, r"exchange_counts\(plan=...\) checks the counts of a "
                                     r"capacity plan; this plan has none"),
    "sglang-setup": (lambda c: _sglang(None).get_attention_dp_rank(), DpxValueError,
                     r"dpx_torch.sglang is not set up: call dpx_torch.sglang.setup"),
    "sglang-buffer": (lambda c: _sglang(c).dp_gather_partial(
        _x(4), _x(), __import__("sglang_layer").ForwardBatch([5], torch.tensor([5]),
                                                             _sglang(c).DpPaddingMode.MAX_LEN)),
        DpxValueError, r"global_tokens has shape \(4, 4\); this step's plan needs 5 rows"),
    "jax-impl": (lambda c: _jax().place_rows(__import__("jax.numpy").numpy.zeros((4, 3)), 0, 1,
                                            4, impl="cuda"),
                 DpxValueError, r"impl='cuda' must be one of 'auto', 'triton', 'xla'"),
    "jax-local-rows": (lambda c: _jax_in_shard_map(
        lambda l, lay: _jax().gather(l, dpx.plan_step([3, 1], lay), partial=True)),
        DpxValueError, r"local has 2 rows per device; the plan needs at least 3"),
    "jax-counts-plan": (lambda c: _jax_in_shard_map(
        lambda l, lay: _jax().scatter(l, dpx.plan_step([1, 1], lay),
                                      counts=__import__("jax.numpy").numpy.zeros(2, "int32"))),
        DpxValueError, r"counts= needs a capacity plan"),
    "jax-bool-sum": (lambda c: _jax().reduce_scatter(__import__("jax.numpy").numpy.zeros(
        (5, 2), bool), dpx.plan_step([5], L1)), DpxTypeError,
        r"reduce_scatter sums its ranks' values, and a bool array has no sum"),
    "jax-mesh-devices": (lambda c: _jax().make_mesh(dpx.DpLayout(64, 8)), DpxValueError,
                         r"layout.world_size=64 needs that many devices; 8 given"),
    "jax-counts-dtype": (lambda c: _jax_in_shard_map(
        lambda l, lay: _jax().scatter(l, dpx.plan_step([1, 1], lay, capacity=4),
                                      counts=__import__("jax.numpy").numpy.zeros(2, "float32"))),
        DpxTypeError, r"counts must be an integer array \(counts of this step\), got dtype "
                      r"float32"),
    "jax-counts-shards": (lambda c: _jax_in_shard_map(
        lambda l, lay: _jax().scatter(l, dpx.plan_step([0], dpx.DpLayout(2, 1, 2), capacity=8,
                                                       cp_shards=[(0, 0)]),
                                      counts=__import__("jax.numpy").numpy.zeros(1, "int32")),
        layout=dpx.DpLayout(2, 1, 2)),
        DpxTypeError, r"counts must be an integer array of shape \(1, 2\) \(shard counts"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_error(comm, name):
    fn, kind, pattern = CASES[name]
    with pytest.raises(kind, match=pattern) as info:
        fn(comm)
    assert isinstance(info.value, DpxError)


def test_catalogue_and_tests_match():
    documented = set(re.findall(r"^\| `([a-z0-9-]+)` \|", DOC.read_text(), re.M))
    assert documented == set(CASES), (f"documented only: {sorted(documented - set(CASES))}; "
                                      f"tested only: {sorted(set(CASES) - documented)}")


#: The catalogue's DpComm call errors, and a valid call of the same op and plan that runs
#: (and is kept prepared) before each.
_PRIMES = {
    "comm-local-rows": lambda c: c.gather(_x(6), P5, partial=True),
    "comm-dtype": lambda c: c.gather(_x(6), P5, partial=True),
    "comm-contiguous": lambda c: c.gather(_x(6, 4), P5, partial=True),
    "comm-device": lambda c: c.gather(_x(6, 4), P5, partial=True),
    "comm-out-size": lambda c: c.gather(_x(), P5, partial=True, out=_x(5)),
    "comm-out-dtype": lambda c: c.gather(_x(), P5, partial=True, out=_x(5)),
    "columns-out-dtype": lambda c: c.scatter_columns(_x(5), P5, out=_x(5)),
    "comm-out-alias": lambda c: c.gather(_x(6), P5, partial=True, out=_x(5)),
    "comm-global-rows": lambda c: c.reduce_scatter(_x(5), P5),
    "combine-width": lambda c: c.reduce_scatter(_x(5, 128), P5, wire="fp8"),
    "combine-dtype": lambda c: c.reduce_scatter(_x(5, 64), P5, wire="mxfp4"),
    "comm-partial": lambda c: c.gather(_x(), P5, partial=True),
    "comm-counts-dtype": lambda c: c.gather(_x(8), _CAP8, partial=True,
                                            counts=torch.tensor([1], dtype=torch.int32)),
    "comm-grad-out": lambda c: c.gather(_x(), P5, partial=True, out=_x(5)),
    "comm-counts-plan": lambda c: c.gather(_x(), P5, partial=True),
    "comm-async-grad": lambda c: c.gather_async(_x(), P5, partial=True)[1].wait(),
    "comm-prepare-grad": lambda c: c.prepare_gather(_x(), P5, partial=True)(_x()),
    "comm-sync-counts": lambda c: c.sync_counts(3),
}
_CAP8 = dpx.plan_step([1], L1, capacity=8)


def test_every_call_entry_has_a_prime():
    """docs/errors.md says each ``comm-*`` call entry is tested after a prepared call of
    the same op and plan: all but the communicator's construction, the destroyed ones
    (tested on their own), a plan of another layout and ``local_slot_for`` (no valid call
    of the same op and plan precedes them)."""
    calls = {k for k in CASES if k.startswith("comm-")} - {
        "comm-group-size", "comm-validate", "comm-destroyed", "comm-destroyed-prepared", "comm-plan-layout",
        "comm-local-slot"}
    assert calls <= set(_PRIMES), sorted(calls - set(_PRIMES))


@pytest.mark.parametrize("name", sorted(_PRIMES))
def test_errors_fire_after_a_prepared_call(comm, name):
    """Each call error fires when the call comes after a valid call of the same op and plan
    (kept as a prepared op): the prepared path admits only what it was checked for."""
    prime = _PRIMES[name]
    for _ in range(2):
        prime(comm)
    fn, kind, pattern = CASES[name]
    if name == "comm-counts-dtype":   # the same plan object as the prime
        fn = lambda c: c.gather(_x(8), _CAP8, partial=True,  # noqa: E731
                                counts=torch.tensor([1]))
    with pytest.raises(kind, match=pattern):
        fn(comm)


def test_explicit_prepared_calls_raise_what_the_call_raises(comm):
    """A prepared op (comm.prepare_*) given tensors it was not prepared for takes the full
    call, which raises the catalogue's errors."""
    op = comm.prepare_gather(_x(), P5, partial=True, out=_x(5))
    assert torch.equal(op(_x(), out=_x(5)), torch.zeros(5, 4))
    with pytest.raises(DpxTypeError, match=r"local has dtype torch.float64"):
        op(_x(dtype=torch.float64), out=_x(5))
    with pytest.raises(DpxValueError, match=r"local has 2 rows; replica 0 needs at least 5"):
        op(_x(2), out=_x(5))
    with pytest.raises(DpxValueError, match=r"out has shape \(4, 4\)"):
        op(_x(), out=_x(4))
    with pytest.raises(DpxValueError, match=r"must be contiguous"):
        op(torch.zeros(4, 6).t(), out=_x(5))
    x = _x(6)
    with pytest.raises(DpxValueError, match=r"local overlaps out"):
        op(x, out=x[1:])
    rs = comm.prepare_reduce_scatter(_x(5), P5)
    with pytest.raises(DpxValueError, match=r"global_ has 7 rows; the plan needs exactly 5"):
        rs(_x(7))
    cap = comm.prepare_gather(_x(8), _CAP8, partial=True,
                              counts=torch.tensor([1], dtype=torch.int32))
    with pytest.raises(DpxTypeError, match=r"counts must be a contiguous int32 tensor"):
        cap(_x(8), counts=torch.tensor([1]))
