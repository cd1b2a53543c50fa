#!/usr/bin/env bash
# Install an SGLang release for `blockfuzz --target sglang` into the active
# Python environment, CPU only:
#   scripts/install-sglang-target.sh RELEASE      (e.g. 0.5.23)
# 1. the CPU torch first (a later dependency must not pull a multi-GB CUDA build);
# 2. SGLang itself with --no-deps (it pins a newer torch; only a warning then);
# 3. the packages the import chain of SGLang's memory pools needs, pinned
#    (scripts/sglang-target-requirements.txt), and compressed-tensors without
#    its pins. torchvision is not installed: blockfuzz stubs it at import.
# Exit 2 on bad usage, 1 when pip fails (the end of its log is shown).
set -euo pipefail
if [ "$#" -ne 1 ] || ! [[ "$1" =~ ^[0-9]+\.[0-9]+\.[0-9]+([a-z0-9.+-]*)$ ]]; then
  echo "usage: $0 RELEASE   (an SGLang version, e.g. 0.5.23)" >&2
  exit 2
fi
RELEASE="$1"
PY="${PYTHON:-python}"
LOG="$(mktemp "${TMPDIR:-/tmp}/install-sglang-target.XXXXXX.log")"
quiet_pip() {
  if ! "$PY" -m pip install --quiet "$@" >>"$LOG" 2>&1; then
    echo "install-sglang-target: pip install $* failed; the end of its log ($LOG):" >&2
    tail -n 25 "$LOG" >&2
    exit 1
  fi
}
echo "installing SGLang $RELEASE for --target sglang (CPU torch kept; pip's log: $LOG)"
quiet_pip "torch==2.13.0" triton numpy
quiet_pip --no-deps "sglang==$RELEASE"
quiet_pip -r "$(dirname "$0")/sglang-target-requirements.txt"
quiet_pip --no-deps compressed-tensors==0.18.0
"$PY" - <<'PY'
import torch
assert not torch.version.cuda, "a CUDA torch was installed; reinstall torch==2.13.0"
try:
    from harness.targets.sglang_release import load
except ImportError:
    raise SystemExit("sglang installed; now install blockfuzz here too: pip install -e .")
s = load()
print(f"sglang {s.version} ready for --target sglang: page sizes {s.page_sizes}, "
      f"radix cache {s.radix_cache_name}, graph padding {s.padding_source}")
PY
