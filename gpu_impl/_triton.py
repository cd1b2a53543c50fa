"""Triton, imported only after the device is chosen (``TRITON_INTERPRET`` must be
set before the first ``import triton``). Kernel modules import it from here.

Under the interpreter, integer overflow sanitising is switched off: a compiled
kernel emits those checks only in debug builds, and the interpreter evaluating
them for every int32 operation cost about a quarter of all kernel time
(``bench/revisions.py``; docs/benchmarks.md).  ``BLOCKFUZZ_SANITIZE_OVERFLOW=1``
keeps them.

Under the interpreter, ``triton.language`` is also patched once per process
rather than once per launch.  The interpreter swaps the language's builtins
for its NumPy versions at every launch and swaps them back after it (about
1.5 ms per launch, an eighth of a spec-decode step's kernel time).  In this
process every kernel is interpreted and host code calls no ``tl`` function,
so the swapped-in versions can stay: the launch then finds the language
patched and does nothing.  ``BLOCKFUZZ_PATCH_PER_LAUNCH=1`` keeps Triton's
per-launch patching (to compare: any bench run with it set and without).

Under the interpreter, the NumPy dtype of a Triton type is looked up in a
table kept per element type: Triton's lookup builds its table of every type
on each call, about 3% of a shrink's time (a cProfile of the shrink bench's
slowest finding, 2026-12-01).
"""

import dataclasses
import inspect
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


def _interpreter_patches_language_once() -> None:
    if os.environ.get("TRITON_INTERPRET") != "1" or \
            os.environ.get("BLOCKFUZZ_PATCH_PER_LAUNCH") == "1":
        return
    try:
        from triton.runtime import interpreter
    except ImportError:
        return
    per_launch = getattr(interpreter, "_patch_lang", None)
    scope_type = getattr(interpreter, "_LangPatchScope", None)
    if per_launch is None or scope_type is None:  # another Triton: leave it as it is
        return
    patched: set = set()  # ids of the language modules patched (and left patched)

    class _Kept(scope_type):
        """A scope whose ``restore`` keeps the patches (the launch's ``finally``)."""

        def restore(self) -> None:
            self._changes.clear()

    def patch_once(fn):
        langs = frozenset(id(v) for v in fn.__globals__.values()
                          if inspect.ismodule(v) and (v is tl or v is tl.core))
        if not langs or not langs <= patched:  # none visible: Triton's own assert says so
            per_launch(fn)  # its scope is dropped unrestored: the patches stay
            patched.update(langs)
        return _Kept()

    interpreter._patch_lang = patch_once


def _interpreter_dtype_lookup_cached() -> None:
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    try:
        from triton.runtime import interpreter
    except ImportError:
        return
    lookup = getattr(interpreter, "_get_np_dtype", None)
    if lookup is None or getattr(lookup, "cached", False):  # another Triton, or done
        return
    table: dict = {}

    def cached(tt_dtype):
        # A block's NumPy dtype is its element's; the table is built per call in
        # Triton, once per element type here.
        scalar = tt_dtype.element_ty if isinstance(tt_dtype, tl.block_type) else tt_dtype
        try:
            return table[scalar]
        except KeyError:
            table[scalar] = out = lookup(scalar)
            return out
        except TypeError:  # an unhashable type: Triton's own lookup
            return lookup(tt_dtype)

    cached.cached = True
    cached.__wrapped__ = lookup
    interpreter._get_np_dtype = cached


_interpreter_without_overflow_checks()
_interpreter_patches_language_once()
_interpreter_dtype_lookup_cached()

__all__ = ["triton", "tl"]
