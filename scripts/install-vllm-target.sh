#!/usr/bin/env bash
# Install a vLLM release for `blockfuzz --target vllm` into the active Python
# environment, CPU only:
#   scripts/install-vllm-target.sh RELEASE      (e.g. 0.26.0, 0.30.0, 0.33.0)
# 1. the CPU torch first (a later dependency must not pull a multi-GB CUDA build);
# 2. vLLM itself with --no-deps (it pins a CUDA torch; only a warning then);
# 3. the packages the import chain of vLLM's block-table modules needs.
# Exit 2 on bad usage; pip's own exit status otherwise.
set -euo pipefail
if [ "$#" -ne 1 ] || ! [[ "$1" =~ ^[0-9]+\.[0-9]+\.[0-9]+([a-z0-9.+-]*)$ ]]; then
  echo "usage: $0 RELEASE   (a vLLM version, e.g. 0.26.0)" >&2
  exit 2
fi
RELEASE="$1"
PY="${PYTHON:-python}"
"$PY" -m pip install --quiet "torch==2.13.0" triton numpy
"$PY" -m pip install --quiet --no-deps "vllm==$RELEASE"
# Import chain of vllm.v1.worker.block_table and vllm.v1.worker.gpu.block_table,
# pinned (scripts/vllm-target-requirements.txt). pip then lists vLLM's own pins
# it did not follow ("vllm X requires ..."): expected with --no-deps.
"$PY" -m pip install --quiet -r "$(dirname "$0")/vllm-target-requirements.txt"
# The model runner's import chain beyond that (runner mode: vLLM's own
# GPUModelRunner): einops, loguru, and compressed-tensors without its pins.
"$PY" -m pip install --quiet einops==0.8.2 loguru==0.7.3
"$PY" -m pip install --quiet --no-deps compressed-tensors==0.17.0
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
