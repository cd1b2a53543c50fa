"""Constants and the exact payload both implementations write.

Payloads are small integer-valued float32 numbers, so sums over a request's
tokens are exact whatever the summation order (kernel tree reduction or NumPy
pairwise): every value and every partial sum stays below 2**24.

- Every token has an id: ``token_id(req, pos) = req * 256 + pos`` unless the
  request's prompt shares a prefix with an earlier request's (prefix caching:
  then those positions carry the earlier request's token ids).  The model's
  activations / KV are a function of the token id, as a real model's are of
  its input: ``token_payload(t)[d] = t * 4 + d + 1`` — so ``payload(req,
  pos)[d] = req * 1024 + pos * 4 + d + 1`` (req < 64, pos < 256, d < 8):
  positive, distinct per (token, d).
- ``SENTINEL = -7.0``: what a free block holds (the allocator "poisons" a block
  when it is freed).  Finite, so a masked read multiplies it by 0 to 0, and
  negative, so no payload equals it.
- Dummy runs carry NaN payloads (their activations are garbage).
- ``draft_payload(x) = x + 0.5``: what the drafter's layer writes for a token
  whose target payload is ``x`` (exact in float32, never equal to a payload).
"""

from __future__ import annotations

import numpy as np

NULL_BLOCK_ID = 0
PAD_SLOT_ID = -1
SENTINEL = -7.0
REQ_ID_MAX = 63
POSITION_MAX = 255


TOKENS_PER_REQ = POSITION_MAX + 1


def default_token_ids(req: int, positions) -> np.ndarray:
    """Token ids of ``req``'s own tokens at ``positions``: int64 (N,), ``req * 256 + pos``."""
    return req * TOKENS_PER_REQ + np.asarray(positions, dtype=np.int64)


def token_payload(token_ids, head_size: int) -> np.ndarray:
    """KV / activation payload of tokens: float32 (N, head_size), ``t * 4 + d + 1``."""
    t = np.asarray(token_ids, dtype=np.int64)
    d = np.arange(head_size, dtype=np.int64)
    return (t[:, None] * 4 + d[None, :] + 1).astype(np.float32)


def mamba_state_of(rows: np.ndarray, conv_size: int) -> np.ndarray:
    """The Mamba state after tokens whose payloads are ``rows`` (float32 (N,
    head_size), oldest first): the last ``conv_size`` rows (zeros before the
    first), then their sum — float32 ((conv_size + 1) * head_size,)."""
    rows = np.asarray(rows, np.float32).reshape(-1, np.shape(rows)[-1])
    head = rows.shape[1]
    conv = np.zeros((conv_size, head), np.float32)
    take = rows[max(len(rows) - conv_size, 0):]
    if conv_size and len(take):
        conv[conv_size - len(take):] = take
    return np.concatenate([conv.reshape(-1), rows.sum(axis=0, dtype=np.float32)])


def payload(req: int, positions: np.ndarray, head_size: int) -> np.ndarray:
    """KV / activation payload of ``req`` at ``positions``.

    Args: req in [0, 63]; positions int array (N,) in [0, 255]; head_size <= 8.
    Returns float32 (N, head_size).
    """
    assert 0 <= req <= REQ_ID_MAX, req
    pos = np.asarray(positions, dtype=np.int64)
    assert pos.size == 0 or (pos.min() >= 0 and pos.max() <= POSITION_MAX)
    d = np.arange(head_size, dtype=np.int64)
    return (req * 1024 + pos[:, None] * 4 + d[None, :] + 1).astype(np.float32)


def payload_sum(req: int, start: int, stop: int, head_size: int) -> np.ndarray:
    """Sum of ``payload(req, p)`` for p in [start, stop): float32 (head_size,)."""
    return payload(req, np.arange(start, stop), head_size).sum(axis=0, dtype=np.float32)


def draft_payload(target: np.ndarray) -> np.ndarray:
    """The draft layer's KV for tokens whose target payload is ``target`` (float32, same shape)."""
    return (np.asarray(target, np.float32) + np.float32(0.5)).astype(np.float32)
