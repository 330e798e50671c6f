"""Every private torch / Triton dependency falls back to the public API when it is missing
or fails on its first use (``dpx_torch.shims``), with the same results: each fallback
forced here -- a missing method, a changed signature, no ``triton.knobs`` -- on CPU."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import dpx
from dpx_torch.shims.first_use import FirstUse


# ---------------------------------------------------------------- the rule
def test_first_use_keeps_a_working_private_callable():
    calls = []
    fu = FirstUse(lambda x: calls.append(x) or x + 1, lambda x: -1)
    assert fu.fn(1) == 2 and fu.fn(2) == 3 and not fu.fell_back and calls == [1, 2]


def test_first_use_falls_back_for_good_when_the_first_call_fails():
    def changed(x, y):   # another signature
        return x + y
    fu = FirstUse(changed, lambda x: x * 10)
    assert fu.fn(3) == 30 and fu.fell_back and fu.fn(4) == 40
    assert FirstUse(None, abs).fn(-2) == 2 and FirstUse(None, abs).fell_back


def test_first_use_propagates_later_failures():
    state = {"n": 0}

    def flaky(x):
        state["n"] += 1
        if state["n"] > 1:
            raise TypeError("the call's own error")
        return x
    fu = FirstUse(flaky, lambda x: "public")
    assert fu.fn(1) == 1
    with pytest.raises(TypeError, match="the call's own error"):
        fu.fn(2)
    assert not fu.fell_back


# ---------------------------------------------------------------- the raw stream
def test_raw_stream_falls_back_without_the_private_function(monkeypatch):
    from dpx_torch.shims import triton_launch as stream

    monkeypatch.setattr(stream, "public_raw_stream", lambda index: 1000 + index)
    monkeypatch.delattr(torch._C, "_cuda_getCurrentRawStream", raising=False)
    s = stream.raw_stream()
    assert s.fell_back and s.fn(2) == 1002

    def changed(index, extra):
        return 7
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", changed, raising=False)
    s = stream.raw_stream()
    assert not s.fell_back and s.fn(3) == 1003 and s.fell_back


# ---------------------------------------------------------------- process-group methods
class _Hiding:
    """A process group whose private method ``name`` is missing (``changed``: present
    with another signature)."""

    def __init__(self, group, name: str, changed: bool) -> None:
        self._group, self._name, self._changed = group, name, changed

    def __getattr__(self, attr):
        if attr == self._name:
            if not self._changed:
                raise AttributeError(attr)
            return lambda *args: (_ for _ in ()).throw(TypeError("incompatible arguments"))
        return getattr(self._group, attr)


_CASES = (("_allgather_base", "AllgatherOptions", "all_gather_single", False, 2),
          ("_reduce_scatter_base", "ReduceScatterOptions", "reduce_scatter_single", True, 2),
          ("allreduce", "AllreduceOptions", "all_reduce", True, 1))


@pytest.mark.parametrize("broken", ["none", "missing", "signature", "options"])
def test_process_group_methods_fall_back_to_the_public_functions(world1, broken):
    """The bound collective through the group's private method, or -- the method missing,
    its signature changed, its options class missing -- through torch.distributed's
    public function: the same results."""
    from dpx_torch import collectives as C
    from dpx_torch.shims.pg_methods import method_call

    x = torch.arange(12.0).view(3, 4)
    for name, opts, public_name, reduce, arity in _CASES:
        public = getattr(C, public_name, None) or getattr(dist, public_name)
        want = torch.empty(3, 4) if arity == 2 else x.clone()
        public(*((want, x) if arity == 2 else (want,)), group=world1)
        group = world1 if broken in ("none", "options") else \
            _Hiding(world1, name, broken == "signature")
        call = method_call(group, name, "NoSuchOptions" if broken == "options" else opts,
                           lambda *t, group: public(*t, group=world1), reduce=reduce,
                           listed=arity == 1)
        got = torch.empty(3, 4) if arity == 2 else x.clone()
        for _ in range(2):
            work = call.fn(*((got, x) if arity == 2 else (got,)))
            if work is not None:    # the private method's work, waited on by the caller
                work.wait()
        assert torch.equal(got, want), name
        assert call.fell_back == (broken != "none"), (name, broken)


def test_a_communicator_on_the_public_functions_gives_the_same_rows(world1, monkeypatch):
    """A communicator whose collectives all fell back gathers and reduce-scatters the same
    rows."""
    from dpx_torch import DpComm
    from dpx_torch.shims import pg_methods

    lay = dpx.DpLayout(1, 1)
    x = torch.randn(5, 8)
    results = []
    for fallback in (False, True):
        if fallback:
            monkeypatch.setattr(pg_methods, "_options", lambda name, reduce: None)
        comm = DpComm(lay)
        for mode in ("sum_len", "max_len"):
            plan = dpx.plan_step([5], lay, mode=mode)
            g = comm.gather(x, plan, partial=True)
            results.append((g, comm.reduce_scatter(g, plan)))
        comm.destroy()
    assert all(torch.equal(a, b) for pair in zip(results[:2], results[2:])
               for a, b in zip(*pair))


# ---------------------------------------------------------------- coalescing, backends
def test_coalescing_falls_back_to_a_plain_sequence():
    from dpx_torch.shims.coalescing import Coalescing, coalescing_state

    entered = []

    class Manager:
        def __init__(self, pg, device):
            entered.append((pg, device))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            entered.append("exit")

    c = Coalescing(Manager)
    with c("pg", None):
        pass
    assert entered == [("pg", None), "exit"] and not c.fell_back

    def changed(pg):   # another signature: falls back on first use
        raise AssertionError("never called with two arguments")
    c = Coalescing(lambda pg, device, extra: None)
    ran = []
    with c("pg", None):
        ran.append(1)
    assert ran == [1] and c.fell_back
    assert isinstance(coalescing_state(), dict)


def test_backends_fall_back_to_the_backend_string(world1, monkeypatch):
    from dpx_torch.shims.backends import coalesces, device_types, spec_device_types

    assert "cpu" in device_types(world1)
    monkeypatch.setattr(type(world1), "_device_types", property(lambda self: 1 / 0),
                        raising=False)
    with pytest.raises(ZeroDivisionError):
        world1._device_types
    monkeypatch.setattr(type(world1), "_device_types", None, raising=False)
    assert device_types(world1) == spec_device_types(str(dist.get_backend(world1)))
    assert spec_device_types("nccl") == {"cuda"} and spec_device_types("gloo") == {"cpu", "cuda"}
    assert spec_device_types("cpu:gloo,cuda:nccl") == {"cpu", "cuda"}
    monkeypatch.delattr(type(world1), "_get_backend")
    assert coalesces(world1, "cuda") is False


# ---------------------------------------------------------------- Triton's handle API
class _Kernel:
    """A stand-in for a ``@triton.jit`` kernel: the ordinary launch and the compiled
    handle's launch each record their pointers' addresses."""

    def __init__(self, handle_run=None):
        self.jit, self.handle = [], []
        self.handle_run = handle_run

    def __getitem__(self, grid):
        def launch(*args, **consts):
            self.jit.append([a.data_ptr() if hasattr(a, "data_ptr") else a for a in args])
        return launch

    def run(self, *args, grid, warmup, num_warps, **consts):
        kernel = self

        class Compiled:
            function = packed_metadata = None

            @staticmethod
            def run(g0, g1, g2, stream, function, metadata, launch_meta, enter, exit_,
                    *rest):
                if kernel.handle_run is not None:
                    kernel.handle_run()
                kernel.handle.append(list(rest[:len(rest) - len(consts)]))
        return Compiled()


def _launcher(monkeypatch, *, knobs: bool = True):
    import triton

    from dpx_torch.shims.triton_launch import Launcher

    if not knobs:
        monkeypatch.delattr(triton, "knobs")

    class CpuLauncher(Launcher):   # the direct path on CPU tensors, stream 0
        direct = ("cpu",)

    launcher = CpuLauncher()
    launcher.stream = FirstUse(None, lambda index: 0)
    return launcher


def _launch_twice(launcher, kernel):
    x, out = torch.zeros(4), torch.zeros(4)
    for _ in range(2):
        launcher.launch(kernel, (1,), torch.device("cpu"), (x, 3, out), {"A": 1}, 4)
    return [x.data_ptr(), 3, out.data_ptr()]


def test_direct_launches_go_through_the_compiled_handle(monkeypatch):
    kernel = _Kernel()
    want = _launch_twice(_launcher(monkeypatch), kernel)
    assert kernel.handle == [want, want] and not kernel.jit


def test_a_launch_hook_sends_launches_the_ordinary_way_while_it_is_set(monkeypatch):
    """A profiler's hook (enter or exit) gets its metadata: while one is set every launch
    is the ordinary one; once removed, the handle again (an empty chain is no hook)."""
    import triton

    rt = triton.knobs.runtime
    kernel = _Kernel()
    launcher = _launcher(monkeypatch)
    x, out = torch.zeros(4), torch.zeros(4)
    want = [x.data_ptr(), 3, out.data_ptr()]

    def launch():
        launcher.launch(kernel, (1,), torch.device("cpu"), (x, 3, out), {"A": 1}, 4)

    launch()
    for chain in (rt.launch_enter_hook, rt.launch_exit_hook):
        def hook(*args, **kwargs):
            return None
        chain.add(hook)
        try:
            launch()
        finally:
            chain.remove(hook)
        launch()
    assert kernel.handle == [want] * 3 and kernel.jit == [want] * 2


def test_no_knobs_sends_every_launch_the_ordinary_way(monkeypatch):
    kernel = _Kernel()
    want = _launch_twice(_launcher(monkeypatch, knobs=False), kernel)
    assert kernel.jit == [want, want] and not kernel.handle


def test_a_handle_failing_on_first_use_falls_back_for_good(monkeypatch):
    def changed():
        raise TypeError("the launcher takes other arguments")
    kernel = _Kernel(handle_run=changed)
    launcher = _launcher(monkeypatch)
    want = _launch_twice(launcher, kernel)
    assert kernel.jit == [want, want] and not kernel.handle and launcher.fell_back


def test_a_kernel_without_a_handle_launches_the_ordinary_way(monkeypatch):
    kernel = _Kernel()
    kernel.run = lambda *a, **k: (_ for _ in ()).throw(AttributeError("no handle API"))
    want = _launch_twice(_launcher(monkeypatch), kernel)
    assert kernel.jit == [want, want]


# ---------------------------------------------------------------- the interpreter
def test_the_interpreter_restores_triton_and_says_when_it_cannot_run():
    import triton
    import triton.language as tl
    from triton.runtime.jit import JITFunction

    from dpx_torch.shims.interpreter import Interpreter

    saved = JITFunction.__call__
    it = Interpreter()

    @triton.jit
    def boom(x_ptr):   # shapes [4] and [8] do not broadcast: the interpreter raises
        tl.store(x_ptr + tl.arange(0, 4), tl.max(tl.load(x_ptr + tl.arange(0, 4)), 0)
                 + tl.arange(0, 8))

    x = torch.arange(4.0)
    with pytest.raises(Exception):
        it.kernel(boom)[(1,)](x)
    assert JITFunction.__call__ is saved            # restored after a failed launch too
    it._api = None                                  # a Triton without the private names
    with pytest.raises(dpx.DpxValueError, match="TRITON_INTERPRET=1"):
        it.kernel(boom)
