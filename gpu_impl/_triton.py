"""Triton, imported only after the device is chosen (``TRITON_INTERPRET`` must be
set before the first ``import triton``). Kernel modules import it from here.

Under the interpreter, integer overflow sanitising is switched off: a compiled
kernel emits those checks only in debug builds, and the interpreter evaluating
them for every int32 operation cost about a quarter of all kernel time
(``bench/revisions.py``; README, "Benchmarks").  ``BLOCKFUZZ_SANITIZE_OVERFLOW=1``
keeps them.
"""

import dataclasses
import os

from .device import current_device

current_device()

import triton  # noqa: E402
import triton.language as tl  # noqa: E402


def _interpreter_without_overflow_checks() -> None:
    if os.environ.get("TRITON_INTERPRET") != "1" or \
            os.environ.get("BLOCKFUZZ_SANITIZE_OVERFLOW") == "1":
        return
    try:
        from triton.runtime import interpreter
    except ImportError:  # a Triton without the interpreter module: nothing to switch
        return
    builder = getattr(interpreter, "interpreter_builder", None)  # one per process
    options = getattr(builder, "options", None)
    if dataclasses.is_dataclass(options) and hasattr(options, "sanitize_overflow"):
        builder.options = dataclasses.replace(options, sanitize_overflow=False)


_interpreter_without_overflow_checks()

__all__ = ["triton", "tl"]
