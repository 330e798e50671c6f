"""A rank killed while the peer transport opens its workspaces, run by tests/test_peer.py:

    peer_kill_init.py WORLD

spawns ``WORLD`` gloo ranks on CPU (host shared memory); the last one kills itself
(SIGKILL) right after its peers' workspaces are mapped, before any file is removed. Every
other rank's ``DpComm`` raises and the rank exits 0, printing ``raised <rank> <error
type>``; the dying rank prints ``token <the opening's token>`` first, and the parent each
rank's exit code (``exit <rank> <code>``).
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile

import torch.distributed as dist
import torch.multiprocessing as mp


def _rank(rank: int, world: int, init: str) -> None:
    import dpx
    import dpx_torch.peer as peer
    from dpx_torch import DpComm, PeerOptions

    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    if rank == world - 1:
        opened = peer.open_memory

        def open_then_die(kind, layout, rank, device, exchange, token):
            out = opened(kind, layout, rank, device, exchange, token)
            print(f"token {token}", flush=True)   # what the files are named by
            os.kill(os.getpid(), signal.SIGKILL)
            return out
        peer.open_memory = open_then_die
    try:
        DpComm(dpx.DpLayout(world, world), transport="peer",
               peer=PeerOptions(phase_bytes=1 << 16, timeout=5.0, device="cpu"))
    except Exception as exc:  # noqa: BLE001 - what the test checks
        print(f"raised {rank} {type(exc).__name__}", flush=True)
        os._exit(0)
    print(f"built {rank}", flush=True)
    os._exit(1)


if __name__ == "__main__":
    world = int(sys.argv[1])
    init = os.path.join(tempfile.mkdtemp(), "rdv")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank, args=(r, world, init)) for r in range(world)]
    for p in procs:
        p.start()
    for r, p in enumerate(procs):
        p.join(120)
        if p.exitcode is None:
            p.kill()
            p.join()
        print(f"exit {r} {p.exitcode}", flush=True)
