"""Device selection, done before Triton is first imported.

Without CUDA (or with ``BLOCKFUZZ_DEVICE=cpu``) kernels run under the Triton
interpreter, which must be switched on through ``TRITON_INTERPRET=1`` *before*
``triton`` is imported; tensors then live on the CPU and CUDA graphs are the CPU
emulation in :mod:`gpu_impl.cuda_graph`.  The choice is per process.
"""

from __future__ import annotations

import os
import sys

import torch

DEVICE_CHOICES = ("auto", "cpu", "cuda")


class DeviceError(RuntimeError):
    """The requested device cannot be used in this process."""


def _resolve(requested: str) -> str:
    if requested not in DEVICE_CHOICES:
        raise DeviceError(f"device {requested!r} not one of {list(DEVICE_CHOICES)}")
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise DeviceError("--device cuda asked for, but torch sees no CUDA device; "
                          "use --device cpu or auto")
    return requested


def select_device(requested: str | None = None) -> torch.device:
    """Pick the device for this process and set up Triton for it.

    ``requested`` defaults to ``$BLOCKFUZZ_DEVICE`` or ``auto``.  Raises
    :class:`DeviceError` when CUDA is requested but absent, or when Triton was
    already imported in the other mode.
    """
    if requested is None:
        requested = os.environ.get("BLOCKFUZZ_DEVICE") or "auto"
        if requested not in DEVICE_CHOICES:
            raise DeviceError(f"$BLOCKFUZZ_DEVICE={requested!r} not one of {list(DEVICE_CHOICES)}")
    kind = _resolve(requested)
    want_interp = kind == "cpu"
    if "triton" in sys.modules:
        have_interp = os.environ.get("TRITON_INTERPRET") == "1"
        if have_interp != want_interp:
            raise DeviceError(f"Triton already imported with TRITON_INTERPRET="
                              f"{os.environ.get('TRITON_INTERPRET')!r}; cannot switch to {kind} "
                              "in this process")
    elif want_interp:
        os.environ["TRITON_INTERPRET"] = "1"
    else:
        os.environ.pop("TRITON_INTERPRET", None)
    os.environ["BLOCKFUZZ_DEVICE"] = kind
    return torch.device(kind)


def current_device() -> torch.device:
    """The device chosen for this process (selecting ``auto`` on first use)."""
    return select_device(os.environ.get("BLOCKFUZZ_DEVICE"))
