#!/usr/bin/env bash
# GPU validation and benchmarks in one go (for a GPU machine with no network):
#   bash benchmarks/run_gpu.sh [STAGE ...]      (default: every stage)
# Stages: peer (the peer transport's GPU tests -- worlds of 2-4 processes on the one GPU,
# run under MPS, which this stage starts and stops; about 3 minutes on an H100),
# peer_bench (benchmarks/peer.py), peer_variants (benchmarks/peer_sum_variants.py),
# peer_tiles (benchmarks/peer_tiles.py: the peer row kernels' tiles), tests
# (the other GPU-marked tests), sweep (launch sweep), sweep_bytes (the same on byte rows),
# wire (the wire kernels against the copy ceiling), wire_sweep (their launch shapes),
# probe (the slot place against its write ceiling), kernels, jax_kernels,
# torch_step, serving, soak, rss (process memory per kind of call), lm_head (the LM-head
# scatter against all-gather + scatter),
# example (examples/torch_serving.py with CUDA graphs).
# Installs dpx without build isolation and jax-triton from wheels in .whl/ if present.
# Output files go to $RESULTS (default benchmarks/out); with ARCHIVE=path, they are also
# packed into that one .tar.gz (a device that returns few files takes that one).
set -uo pipefail
export OUT="${RESULTS:-benchmarks/out}" XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
mkdir -p "$OUT"
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(peer peer_bench tests kernels wire jax_kernels torch_step serving wire_sweep soak lm_head example)
want() { local s; for s in "${stages[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
python3 -m pip install -q --no-build-isolation --no-deps -e . 2>&1 | tail -n 2
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, triton, jax; print('torch', torch.__version__, 'triton', triton.__version__, 'jax', jax.__version__, jax.default_backend())"
if want peer; then
  # MPS: the processes sharing the GPU run side by side instead of time-sliced (a spinning
  # barrier then costs microseconds, not a time slice)
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/dpx_mps_pipe CUDA_MPS_LOG_DIRECTORY=/tmp/dpx_mps_log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d && echo "MPS daemon started"
  python3 -m pytest -q -m gpu tests/test_peer_gpu.py -p no:cacheprovider 2>&1 \
    | tee "$OUT/peer_gpu_tests.log" | tail -n 30
  echo quit | nvidia-cuda-mps-control
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
fi
if want peer_bench; then
  (cd benchmarks && python3 peer.py 2>&1 | tee "$OUT/peer.log")
fi
if want peer_variants; then
  (cd benchmarks && python3 peer_sum_variants.py 2>&1 | tee "$OUT/peer_sum_variants.log")
fi
if want peer_tiles; then
  (cd benchmarks && python3 peer_tiles.py 2>&1 | tee "$OUT/peer_tiles.log")
fi
if want tests; then
  python3 -m pytest -q -m gpu tests --ignore=tests/test_peer_gpu.py -p no:cacheprovider 2>&1 \
    | tee "$OUT/gpu_tests.log" | tail -n 30
fi
cd benchmarks
want sweep && python3 launch_sweep.py 2>&1 | tee "$OUT/launch_sweep.log"
want sweep_bytes && python3 launch_sweep.py --byte-rows 2>&1 | tee "$OUT/launch_sweep_bytes.log"
want wire && python3 wire_kernels.py 2>&1 | tee "$OUT/wire_kernels.log"
want wire_sweep && python3 wire_sweep.py 2>&1 | tee "$OUT/wire_sweep.log"
want probe && python3 place_probe.py 2>&1 | tee "$OUT/place_probe.log"
want kernels && python3 kernels.py 2>&1 | tee "$OUT/kernels.log"
want jax_kernels && python3 jax_kernels.py 2>&1 | tee "$OUT/jax_kernels.log"
want torch_step && python3 torch_step.py 2>&1 | tee "$OUT/torch_step.log"
want serving && python3 serving.py --gpu 2>&1 | tee "$OUT/serving.log"
want soak && python3 soak.py --steps 20000 --control 40000 2>&1 | tee "$OUT/soak.log"
want rss && python3 rss_probe.py 20000 2>&1 | tee "$OUT/rss_probe.log"
want lm_head && python3 lm_head.py --gpu 2>&1 | tee "$OUT/lm_head.log"
cd ..
if want example; then
  python3 -m torch.distributed.run --standalone --nproc-per-node 1 examples/torch_serving.py \
    --attn-tp 1 --time 2>&1 | tee "$OUT/torch_serving.log"
fi
if [ -n "${ARCHIVE:-}" ]; then tar czf "$ARCHIVE" -C "$OUT" .; fi
