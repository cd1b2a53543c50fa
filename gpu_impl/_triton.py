"""Triton, imported only after the device is chosen (``TRITON_INTERPRET`` must be
set before the first ``import triton``). Kernel modules import it from here."""

from .device import current_device

current_device()

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

__all__ = ["triton", "tl"]
