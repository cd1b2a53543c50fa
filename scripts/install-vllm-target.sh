#!/usr/bin/env bash
# Install a vLLM release for `blockfuzz --target vllm` into the active Python
# environment, CPU only:
#   scripts/install-vllm-target.sh RELEASE      (e.g. 0.26.0, 0.30.0, 0.33.0)
# 1. the CPU torch first (a later dependency must not pull a multi-GB CUDA build);
# 2. vLLM itself with --no-deps (it pins a CUDA torch; only a warning then);
# 3. the packages the import chain of vLLM's block-table modules needs.
# Exit 2 on bad usage, 1 when pip fails (the end of its log is shown).
set -euo pipefail
if [ "$#" -ne 1 ] || ! [[ "$1" =~ ^[0-9]+\.[0-9]+\.[0-9]+([a-z0-9.+-]*)$ ]]; then
  echo "usage: $0 RELEASE   (a vLLM version, e.g. 0.26.0)" >&2
  exit 2
fi
RELEASE="$1"
PY="${PYTHON:-python}"
# pip's own output (its notes on vLLM's pins it did not follow, expected with
# --no-deps) goes to a log; on failure its tail is shown, on success one line.
LOG="$(mktemp "${TMPDIR:-/tmp}/install-vllm-target.XXXXXX.log")"
quiet_pip() {
  if ! "$PY" -m pip install --quiet "$@" >>"$LOG" 2>&1; then
    echo "install-vllm-target: pip install $* failed; the end of its log ($LOG):" >&2
    tail -n 25 "$LOG" >&2
    exit 1
  fi
}
echo "installing vLLM $RELEASE for --target vllm (CPU torch kept; pip's log: $LOG)"
quiet_pip "torch==2.13.0" triton numpy
quiet_pip --no-deps "vllm==$RELEASE"
# Import chain of vllm.v1.worker.block_table and vllm.v1.worker.gpu.block_table,
# pinned (scripts/vllm-target-requirements.txt).
quiet_pip -r "$(dirname "$0")/vllm-target-requirements.txt"
# The model runner's import chain beyond that (runner mode: vLLM's own
# GPUModelRunner): einops, loguru, and compressed-tensors without its pins.
quiet_pip einops==0.8.2 loguru==0.7.3
quiet_pip --no-deps compressed-tensors==0.17.0
"$PY" - <<'PY'
import torch
assert not torch.version.cuda, "a CUDA torch was installed; reinstall torch==2.13.0"
try:
    from harness.targets.vllm import load
except ImportError:
    raise SystemExit("vllm installed; now install blockfuzz here too: pip install -e .")
v = load()
print(f"vllm {v.version} ready for --target vllm: V1 kernel blocks={v.v1_kernel_blocks}, "
      f"V2 kernel blocks={v.v2_kernel_blocks}")
PY
