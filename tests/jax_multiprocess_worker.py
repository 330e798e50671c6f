"""One of two JAX processes forming one 4-device CPU mesh (gloo collectives); run by
tests/test_jax_multiprocess.py as ``python jax_multiprocess_worker.py PORT PROCESS_ID``."""

from __future__ import annotations

import sys

import jax

jax.config.update("jax_num_cpu_devices", 2)
jax.config.update("jax_cpu_collectives_implementation", "gloo")
port, pid = int(sys.argv[1]), int(sys.argv[2])
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2,
                           process_id=pid, initialization_timeout=120)

import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import dpx  # noqa: E402
import dpx_jax  # noqa: E402
from reference import global_inputs, local_inputs, ref_gather, ref_reduce_scatter  # noqa: E402

layout = dpx.DpLayout(4, 2)
mesh = dpx_jax.make_mesh(layout)
spec = NamedSharding(mesh, P(dpx_jax.AXES))
assert jax.device_count() == 4 and jax.local_device_count() == 2
for mode in ("max_len", "sum_len", "gatherv"):
    for partial in (True, False):
        plan = dpx.plan_step([5, 0] if partial else [2, 7], layout, mode=mode)
        L = plan.max_slot_rows
        locs = local_inputs(3, plan, (4,), partial=partial, rows=L)
        globs = global_inputs(3, plan, (4,))
        full_l = np.concatenate(locs).astype(np.float32)
        full_g = np.concatenate(globs).astype(np.float32)
        x = jax.make_array_from_callback(full_l.shape, spec, lambda idx: full_l[idx])
        g = jax.make_array_from_callback(full_g.shape, spec, lambda idx: full_g[idx])

        def body(a, b):
            return dpx_jax.gather(a, plan, partial=partial), dpx_jax.reduce_scatter(b, plan)

        f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(dpx_jax.AXES),) * 2,
                                  out_specs=(P(dpx_jax.AXES),) * 2))
        out_g, out_rs = f(x, g)
        want = ref_gather(locs, plan, partial=partial)
        for shard in out_g.addressable_shards:
            np.testing.assert_array_equal(np.asarray(shard.data), want)
        for shard in out_rs.addressable_shards:
            r = shard.index[0].start // L
            d = layout.coords(r).attn_dp_rank
            rows = plan.slot_rows[d]
            np.testing.assert_array_equal(np.asarray(shard.data)[:rows],
                                          ref_reduce_scatter(globs, plan, d))
print(f"process {pid}: OK", flush=True)
jax.distributed.shutdown()
