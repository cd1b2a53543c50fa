#!/usr/bin/env bash
# GPU check for one machine with one GPU (an H200 here), < 8 minutes, nothing to
# install beyond the package. On a CPU-only machine it runs its CPU-safe parts:
#   1. kernel checks against the reference (tests/unit/test_gpu_kernels.py)
#   2. cross-check: corpora replayed through compiled kernels + real CUDA graphs
#      and through the CPU emulation must give the same verdicts (tests/gpu)
#   3. a short nightly campaign on the fixed implementation
#   4. steps/s per cudagraph_mode (NONE / PIECEWISE / FULL) and the FULL/eager ratio
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${GPU_CHECK_OUT:-gpu-check-out}"
mkdir -p "$OUT"
has_cuda=$(python -c "import torch; print(int(torch.cuda.is_available()))")
echo "gpu_check: cuda=$has_cuda out=$OUT"
rc=0
timeout 150 python -m pytest -q -p no:cacheprovider tests/unit/test_gpu_kernels.py tests/gpu || rc=1
timeout 120 blockfuzz nightly --time-budget 60 --workers 2 --out "$OUT/nightly" --corpus "" || rc=1
timeout 120 python bench/mode_steps.py || rc=1
exit $rc
