"""The Triton interpreter's fixed cost per launch, paid once per process.

Under ``TRITON_INTERPRET=1`` every launch first swaps each
``triton.language`` builtin (``tl.load``, ``tl.arange``, the tensor methods,
``tl.math``: some two hundred attributes) for an interpreted stand-in, runs
the kernel, and swaps them all back (``triton/runtime/interpreter.py``:
``_patch_lang`` and its scope's ``restore``).  The swap is the same on every
launch, and it was about 80% of an empty kernel's launch and one launch in
five of the fuzz loop's gpu_impl time (``bench/profile_fuzz.py``).

:func:`hold_language_patch` applies the swap once, for ``triton.language``
and ``triton.language.core`` together, and makes every later launch's swap
and restore a no-op.  Kernels compute exactly what they did (the stand-ins
are the interpreter's own); what changes is that ``triton.language``
builtins stay the interpreted ones between launches, where calling them
outside a kernel is an error either way.  Only under the interpreter, and
only where the interpreter has the functions this relies on; otherwise it
does nothing.
"""

from __future__ import annotations

import os

_held = False


def hold_language_patch() -> bool:
    """Keep the interpreter's language patch applied from now on (idempotent).

    Returns True when the patch is held (interpreter mode, and a Triton whose
    interpreter patches per launch through ``_patch_lang``), False otherwise.
    """
    global _held
    if _held:
        return True
    if os.environ.get("TRITON_INTERPRET") != "1":
        return False
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    patch = getattr(interpreter, "_patch_lang", None)
    if patch is None or not hasattr(interpreter, "_LangPatchScope"):
        return False

    scope = patch(_WithLanguages(tl))  # applied now, never restored

    class _Held:
        """The scope a launch restores when it ends: the patch stays."""

        def restore(self) -> None:
            pass

    interpreter._patch_lang = lambda fn: _Held()
    interpreter._blockfuzz_held_scope = scope  # the applied patch, kept alive
    _held = True
    return True


class _WithLanguages:
    """A stand-in for a jitted function whose globals hold ``triton.language``
    and ``triton.language.core`` (``_patch_lang`` patches the modules it finds
    there)."""

    def __init__(self, tl):
        self.__globals__ = {"tl": tl, "core": tl.core}
