"""A script of the peer transport's promises under torchrun, run by tests/test_peer.py (and
tests/test_peer_gpu.py on a GPU):

    peer_script.py DEVICE VARIANT

DEVICE: ``cpu`` or ``cuda`` (every rank on the one GPU). VARIANT:

- ``dead``: every rank gathers and combines; the last rank exits between two steps
  (``os._exit``); every live rank raises :class:`dpx.DpxPeerError` naming it within the
  timeout (on the CPU in the next step, whose barrier waits on the host; on a GPU in the
  step after the one whose barrier timed out, each step ending in a sync), and so does
  every later call of each form (implicit, prepared, scatter, async); ``destroy()`` works;
  exit 0. Prints ``dead <rank> <seconds> <ranks>`` and ``refused <rank> <n>``.
- ``skip``: the last rank skips one step; the others name it (their last barriers give
  up), and every rank's ``destroy()`` ends within the timeout. Prints ``skip <rank> <ranks
  named or None> <seconds destroy took>``.
- ``leave``: the last rank rejects its input in a step (without ``validate``: it raises
  before any row moves) and calls ``destroy()``; the others' step raises
  :class:`dpx.DpxPeerError` naming it at once, not after the timeout (30 s), instead of
  pairing with its leaving. Prints ``leave <rank> <ranks named or None> <seconds>``.
- ``phases``: 150 steps with new counts, the ranks delayed at random before their calls
  (one rank up to a step ahead of another), every result checked; then ``destroy()``.
  Prints ``phases <rank> <steps>``.
- ``destroy`` / ``no_destroy``: gathers, then ``comm.destroy()`` and
  ``dist.destroy_process_group()`` (or only the latter: the exit hook closes the peers'
  memory). Prints ``ok <rank>``.

Every variant prints ``transport <rank> <transport>`` first.
"""

from __future__ import annotations

import os
import random
import sys
import time

import torch
import torch.distributed as dist

import dpx
from dpx_torch import DpComm, PeerOptions


def say(line: str) -> None:
    """One line in one write: the ranks share the terminal."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


device, variant = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
if device == "cuda":
    torch.cuda.set_device(0)
dev = torch.device(device)
#: the barrier's timeout: short where a rank is meant to go missing, long where none is
#: (other processes may hold the cores for a while)
TIMEOUT = 1.0 if variant in ("dead", "skip") else 30.0
layout = dpx.DpLayout(world_size=world, dp_size=world)
comm = DpComm(layout, transport="peer",
              peer=PeerOptions(phase_bytes=1 << 20, timeout=TIMEOUT, device=dev))
say(f"transport {rank} {comm.transport.value}")
assert comm.transport is dpx.Transport.PEER, comm.transport_choice
H = 64


def rows_of(step: int, r: int, n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(step * 100 + r)
    return torch.randint(-8, 9, (n, H), generator=g).float().to(dev)


def want_gather(step: int, counts: list[int], plan) -> torch.Tensor:
    out = torch.zeros(plan.global_rows, H, device=dev)
    for r, n in enumerate(counts):
        out[plan.offsets[r]:plan.offsets[r] + n] = rows_of(step, r, n)
    return out


def one_step(step: int, counts: list[int], check: bool) -> None:
    plan = dpx.plan_step(counts, layout, mode="gatherv")
    x = rows_of(step, rank, counts[rank])
    got = comm.gather(x, plan, partial=True)
    if check:
        assert torch.equal(got, want_gather(step, counts, plan)), f"gather step {step}"
    rs = comm.reduce_scatter(got, plan)
    if check:   # every rank holds the same gathered rows: the sum is world times them
        assert torch.equal(rs[:counts[rank]], world * x), f"reduce_scatter step {step}"


if variant == "dead":
    steps = 0
    for step in range(4):
        one_step(step, [3 + r for r in range(world)], True)
        steps += 1
    if rank == world - 1:
        os._exit(0)   # dies between two steps: it never arrives at the next barrier
    t0 = time.monotonic()
    try:   # a GPU runs the steps after the call returns: the step after the barrier that
        # timed out raises (a server's steps end in a sync when it reads its results)
        for step in range(99, 104):
            one_step(step, [3 + r for r in range(world)], False)
            if dev.type == "cuda":
                torch.cuda.synchronize()
        raise AssertionError("calls with a dead peer returned")
    except dpx.DpxPeerError as exc:
        took = time.monotonic() - t0
        say(f"dead {rank} {took:.2f} {list(exc.ranks)}")
        assert f"rank {world - 1}" in str(exc), str(exc)
    plan = dpx.plan_step([2] * world, layout, mode="max_len")
    x = torch.ones(2, H, device=dev)
    refused = 0
    forms = [lambda: comm.gather(x, plan, partial=True),
             lambda: comm.scatter(torch.ones(plan.global_rows, H, device=dev), plan),
             lambda: comm.reduce_scatter(torch.ones(plan.global_rows, H, device=dev), plan),
             lambda: comm.prepare_gather(x, plan, partial=True)]
    if dev.type == "cuda":
        forms += [lambda: comm.gather_async(x, plan, partial=True),
                  lambda: comm.gather_async(x, plan, partial=True, wire="mxfp4")]
    for form in forms:
        try:
            form()
        except dpx.DpxPeerError:
            refused += 1
    say(f"refused {rank} {refused} of {len(forms)}")
    comm.destroy()
elif variant == "skip":
    # the last rank skips one step: its later barriers pair with the others' earlier ones
    # (a barrier counts arrivals), so the others' last barriers give up and they name it;
    # every rank's destroy() still ends (its barrier is bounded); the processes exit 0
    one_step(0, [2 + r for r in range(world)], True)
    failed = None
    for step in range(1, 4):
        if rank == world - 1 and step == 1:
            continue
        try:
            one_step(step, [2 + r for r in range(world)], False)
            if dev.type == "cuda":   # the barriers ran after the calls returned: a server
                torch.cuda.synchronize()   # checks after its sync (or its next call raises)
                comm.check_peers()
        except dpx.DpxPeerError as exc:
            failed = list(exc.ranks)
            break
    t0 = time.monotonic()
    comm.destroy()
    say(f"skip {rank} {failed} {time.monotonic() - t0:.2f}")
elif variant == "leave":
    one_step(0, [2 + r for r in range(world)], True)
    t0 = time.monotonic()
    named = None
    if rank == world - 1:
        try:   # too few rows: refused on this rank alone (no validate)
            comm.gather(rows_of(1, rank, 1), dpx.plan_step([2] * world, layout), partial=True)
        except dpx.DpxValueError:
            pass
    else:
        try:
            comm.gather(rows_of(1, rank, 2), dpx.plan_step([2] * world, layout),
                        partial=True)
            if dev.type == "cuda":
                torch.cuda.synchronize()
                comm.check_peers()
        except dpx.DpxPeerError as exc:
            named = list(exc.ranks)
    comm.destroy()
    say(f"leave {rank} {named} {time.monotonic() - t0:.2f}")
elif variant == "phases":
    rng = random.Random(rank)
    n_steps = 150
    for step in range(n_steps):
        counts = [random.Random(step * 7 + r).randint(0, 9) for r in range(world)]
        if rng.random() < 0.3:
            time.sleep(rng.random() * 0.002)
        one_step(step, counts, True)
    say(f"phases {rank} {n_steps}")
    comm.destroy()
else:
    one_step(0, [2 + r for r in range(world)], True)
    if variant == "destroy":
        comm.destroy()
    elif variant != "no_destroy":
        raise SystemExit(f"unknown variant {variant}")
    say(f"ok {rank}")
dist.destroy_process_group()
