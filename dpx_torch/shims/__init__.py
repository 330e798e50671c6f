"""The private torch and Triton APIs dpx_torch uses, each in one small module that names the
versions it was checked on and falls back to the public API when the private one is
missing or fails on its first use (tests/test_shims.py forces every fallback):

========================  ==========================================  ===========================
module                    private                                     public fallback
========================  ==========================================  ===========================
:mod:`.first_use`         (the rule itself: a private callable,       --
                          replaced by its public one for good when
                          its first call fails)
:mod:`.pg_methods`        ``ProcessGroup._allgather_base`` /          ``all_gather_into_tensor``,
                          ``_reduce_scatter_base`` / ``allreduce``    ``reduce_scatter_tensor``,
                          with options made once                      ``all_reduce``
:mod:`.coalescing`        ``distributed_c10d._coalescing_manager``,   collectives issued one by
                          ``_world.pg_coalesce_state``                one
:mod:`.backends`          ``ProcessGroup._device_types``,             the backend string
                          ``_get_backend(...).supports_coalescing``   (``dist.get_backend``); no
                                                                      coalescing
:mod:`.triton_launch`     ``JITFunction.run(warmup=True)``'s          ``kernel[grid](...)``
                          compiled kernel's ``run`` / ``function`` /
                          ``packed_metadata``; ``knobs.runtime``'s
                          launch hooks; the raw stream:
                          ``torch._C._cuda_getCurrentRawStream``      ``torch.cuda.current_stream
                                                                      (i).cuda_stream``
:mod:`.interpreter`       ``triton.runtime.interpreter.               ``TRITON_INTERPRET=1`` set
                          InterpretedFunction`` and its rewrite, for  before Triton is imported
                          kernels that call other ``@triton.jit``     (then every kernel is
                          functions                                   interpreted)
:mod:`.ipc`               ``torch.multiprocessing.reductions``'       -- (the first choice is
                          CUDA tensor sharing, used only where the    public: the CUDA driver's
                          driver's IPC API cannot be                  IPC API through ctypes)
========================  ==========================================  ===========================

The versions dpx is tested on are pyproject's ranges: torch 2.11 (CUDA, H200) and 2.13
(CPU), Triton 3.6 (CUDA) and 3.9 (CPU).

Layer: shims. Imports dpx and the modules before it in its own row (docs/semantics.md,
"Where things live"). The package itself imports none of them: each user imports the one
module it needs.
"""

#: the submodules (``from dpx_torch.shims import *`` imports them; importing the package
#: alone imports none)
__all__ = ["backends", "coalescing", "first_use", "interpreter", "ipc", "pg_methods",
           "triton_launch"]
