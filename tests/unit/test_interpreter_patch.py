"""The interpreter's language patching, once per process (gpu_impl/_triton.py)."""

import json
import os
import subprocess
import sys

import pytest

SCRIPT = r'''
import json
import torch
from gpu_impl._triton import tl, triton
from triton.runtime import interpreter

@triton.jit
def _helper(x):
    return x * 3 + 1

@triton.jit
def _kernel(x_ptr, out_ptr, n, B: tl.constexpr):
    o = tl.arange(0, B)
    m = o < n
    v = tl.load(x_ptr + o, mask=m, other=0)
    tl.store(out_ptr + o, _helper(v) - (v // 2), mask=m)

x = torch.arange(0, 16, dtype=torch.int32)
out = []
for n in (16, 7, 0, 16):  # the same kernel again after the patches stayed
    y = torch.full((16,), -99, dtype=torch.int32)
    _kernel[(1,)](x, y, n, B=16)
    out.append(y.tolist())
print(json.dumps({"out": out, "once": interpreter._patch_lang.__name__ == "patch_once"}))
'''


def _run(per_launch: bool) -> dict:
    env = dict(os.environ, TRITON_INTERPRET="1")
    env.pop("BLOCKFUZZ_PATCH_PER_LAUNCH", None)
    if per_launch:
        env["BLOCKFUZZ_PATCH_PER_LAUNCH"] = "1"
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(os.environ.get("BLOCKFUZZ_DEVICE") == "cuda", reason="interpreter only")
def test_language_patched_once_computes_what_per_launch_patching_does():
    once, per_launch = _run(False), _run(True)
    assert once["once"] and not per_launch["once"]  # each process took its path
    expected = [[(3 * v + 1) - (v // 2) if i < n else -99 for i, v in enumerate(range(16))]
                for n in (16, 7, 0, 16)]
    assert once["out"] == per_launch["out"] == expected


DTYPES = r'''
import json
from gpu_impl._triton import tl
from triton.runtime import interpreter

lookup = interpreter._get_np_dtype
assert getattr(lookup, "cached", False), "the cached lookup is not installed"
scalars = [tl.int1, tl.int8, tl.uint8, tl.int16, tl.int32, tl.uint32, tl.int64, tl.uint64,
           tl.float16, tl.bfloat16, tl.float32, tl.float64, tl.pointer_type(tl.float32)]
types = scalars + [tl.block_type(s, [4, 2]) for s in scalars]
rows = []
for _ in range(2):  # the second pass reads the table the first filled
    rows.append([str(lookup(t)) for t in types])
print(json.dumps({"cached": rows, "triton": [str(lookup.__wrapped__(t)) for t in types]}))
'''


@pytest.mark.skipif(os.environ.get("BLOCKFUZZ_DEVICE") == "cuda", reason="interpreter only")
def test_cached_dtype_lookup_answers_what_tritons_does():
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", DTYPES], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["cached"][0] == out["cached"][1] == out["triton"]
    assert out["triton"][-1] == "uint64" and out["triton"][10] == "float32"
