"""The quantized KV cache's arithmetic (``kv_cache_dtype`` ``int8``), in NumPy.

One token's KV row (``head_size`` floats) is stored as an 8-bit payload and
two float32 parameters, a scale and a zero point — per-token asymmetric
quantization, as LMDeploy's int8 KV cache (``quant_policy=8``) and KIVI-style
caches keep them beside the pages: ``z = 64 * floor(min(x) / 64)``, ``s`` the
least power of two ``>= 1`` with ``max(x) - z <= 255 * s`` (at most 256: a wider
row saturates), ``q =
clamp(floor((x - z) / s + 0.5), 0, 255)`` (uint8), read back as ``q * s + z``.
Power-of-two scales keep every dequantized value an integer, so the oracle's
sums stay exact whatever the summation order (see :mod:`reference.payload`).
A payload row spans at most ``head_size - 1``, so it round-trips exactly; the
zero point is rounded down to a multiple of 64 (a modelling choice: a real
cache takes ``min(x)``) so that the payload bytes keep a value's low bits and
the parameters its high ones — a write that lands one without the other
changes what the token reads.  A row holding NaN (a dummy run's garbage)
gets NaN parameters and a zero payload: the NaN lives in the parameter buffer,
and every read of the token is NaN.

gpu_impl's write kernel (:func:`gpu_impl.attention.reshape_and_cache`) and its
host writes compute the same; this module is the oracle's side.
"""

from __future__ import annotations

import numpy as np

QMAX = 255
SCALE_STEPS = 8  # s up to 2**8: spans up to 255 * 256; a payload row spans < 72 (wider saturates)
ZERO_STEP = np.float32(64)  # zero points are multiples of it


def token_params(x: np.ndarray) -> np.ndarray:
    """Per-row (scale, zero point) of ``x``: float32 (N, head_size) -> float32 (N, 2)."""
    x = np.asarray(x, np.float32)
    nan = np.isnan(x).any(axis=-1)
    clean = np.where(np.isnan(x), np.float32(0), x)
    zero = np.floor(clean.min(axis=-1, initial=np.inf) / ZERO_STEP) * ZERO_STEP
    span = clean.max(axis=-1, initial=-np.inf) - zero
    s = np.ones(span.shape, np.float32)
    lim, nxt = np.float32(QMAX), np.float32(2.0)
    for _ in range(SCALE_STEPS):
        s = np.where(span > lim, nxt, s)
        lim, nxt = lim * 2, nxt * 2
    out = np.stack([s, zero.astype(np.float32)], axis=-1).astype(np.float32)
    out[nan] = np.nan
    return out


def quantize(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(payload uint8 (N, head_size), params float32 (N, 2)) of float32 rows ``x``."""
    x = np.asarray(x, np.float32)
    p = token_params(x)
    with np.errstate(invalid="ignore"):
        q = np.floor((x - p[..., 1:2]) / p[..., 0:1] + np.float32(0.5))
    q = np.where(np.isnan(q), 0, np.clip(q, 0, QMAX))
    return q.astype(np.uint8), p


def dequantize(q: np.ndarray, params: np.ndarray) -> np.ndarray:
    """float32 ``q * scale + zero`` (payload (..., head_size), params (..., 2))."""
    p = np.asarray(params, np.float32)
    return (q.astype(np.float32) * p[..., 0:1] + p[..., 1:2]).astype(np.float32)


def roundtrip(x: np.ndarray) -> np.ndarray:
    """What a quantized cache reads back for rows ``x``: float32, same shape."""
    return dequantize(*quantize(x))
