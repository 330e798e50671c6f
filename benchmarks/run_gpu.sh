#!/usr/bin/env bash
# GPU validation and benchmarks in one go (for a GPU machine with no network):
# installs dpx without build isolation, jax-triton from wheels in .whl/ if present, then
# runs the GPU-marked tests and the kernel benchmarks. Output files go to $OUT.
set -uo pipefail
export OUT="${OUT:-benchmarks/out}" XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
mkdir -p "$OUT"
python3 -m pip install -q --no-build-isolation --no-deps -e . 2>&1 | tail -n 2
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, triton, jax; print('torch', torch.__version__, 'triton', triton.__version__, 'jax', jax.__version__, jax.default_backend())"
python3 -m pytest -q -m gpu tests 2>&1 | tee "$OUT/gpu_tests.log" | tail -n 25
cd benchmarks
python3 kernels.py "$@" 2>&1 | tee "$OUT/kernels.log"
python3 jax_kernels.py 2>&1 | tee "$OUT/jax_kernels.log"
python3 torch_step.py 2>&1 | tee "$OUT/torch_step.log"
python3 serving.py --gpu 2>&1 | tee "$OUT/serving.log"
cd ..
python3 -m torch.distributed.run --standalone --nproc-per-node 1 examples/torch_serving.py \
  --attn-tp 1 --time 2>&1 | tee "$OUT/torch_serving.log"
