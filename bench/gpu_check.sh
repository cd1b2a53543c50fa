#!/usr/bin/env bash
# GPU check for one machine with one GPU (an H200 here), < 8 minutes, nothing to
# install beyond the package's dependencies. On a CPU-only machine it runs its
# CPU-safe parts:
#   1. kernel checks against the reference (tests/unit/test_gpu_kernels.py)
#   2. cross-check: corpora replayed through compiled kernels + real CUDA graphs
#      must give the verdicts recorded with the CPU emulation (tests/gpu)
#   3. a short nightly campaign on the fixed implementation
#   4. steps/s per cudagraph_mode (NONE / PIECEWISE / FULL) and the FULL/eager
#      ratio, on the device and, for comparison, on the CPU emulation
# It needs no `blockfuzz` on PATH: it runs `python -m harness` from the
# repository root (PYTHONPATH=.), so a checkout with its dependencies is enough.
# $PYTHON picks the interpreter (default: python, else python3);
# $GPU_CHECK_OUT the output folder (default gpu-check-out).
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-$(command -v python || command -v python3)}"
OUT="${GPU_CHECK_OUT:-gpu-check-out}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
has_cuda=$("$PY" -c "import torch; print(int(torch.cuda.is_available()))")
echo "gpu_check: cuda=$has_cuda out=$OUT python=$PY"
"$PY" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__,
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU')"
rc=0
step() { local name=$1; shift; local t0=$SECONDS; echo "== $name"; "$@"; local r=$?
         echo "== $name: exit $r, $((SECONDS - t0)) s"; [ $r -eq 0 ] || rc=1; }
step kernels+corpora timeout 200 "$PY" -m pytest -q -p no:cacheprovider --maxfail=10 -n 4 \
    tests/unit/test_gpu_kernels.py tests/gpu --junitxml "$OUT/pytest-gpu.xml"
step nightly timeout 120 "$PY" -m harness nightly --time-budget 60 --workers 2 \
    --out "$OUT/nightly" --corpus ""
step mode-steps timeout 90 "$PY" bench/mode_steps.py
if [ "$has_cuda" = 1 ]; then
    step mode-steps-cpu-emulation timeout 90 "$PY" bench/mode_steps.py --device cpu --steps 60
fi
exit $rc
