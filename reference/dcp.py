"""Decode context parallelism: which positions this rank stores, and where.

Models the DCP branch of vLLM's slot mapping (``vllm/v1/worker/block_table.py``
``compute_slot_mapping``; V2 ``vllm/v1/worker/gpu/block_table.py`` after #51031,
which computes ownership in allocation-block units).  With world size W, rank
r and interleave I, a *virtual block* holds ``block_size * W`` positions; in it,
runs of I positions go to ranks round-robin.  This rank keeps its runs, packed:

    off = pos % (block_size * W); column = pos // (block_size * W)
    local  iff (off // I) % W == r
    offset = (off // (W * I)) * I + off % I          # in [0, block_size)

With W = 1 this is the plain ``column = pos // block_size``,
``offset = pos % block_size``.  Attention groups only: Mamba state is replicated.
"""

from __future__ import annotations

import numpy as np


def local_slots(pos: np.ndarray, block_size: int, world: int, rank: int,
                interleave: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(is_local bool, allocation column int64, offset in block int64) per position."""
    pos = np.asarray(pos, dtype=np.int64)
    vbs = block_size * world
    off = pos % vbs
    is_local = (off // interleave) % world == rank
    offset = (off // (world * interleave)) * interleave + off % interleave
    return is_local, pos // vbs, offset


def global_position(column: np.ndarray, offset: np.ndarray, block_size: int, world: int,
                    rank: int, interleave: int) -> np.ndarray:
    """Inverse of :func:`local_slots` for this rank: the position a local cell holds."""
    column = np.asarray(column, dtype=np.int64)
    offset = np.asarray(offset, dtype=np.int64)
    return (column * block_size * world + (offset // interleave) * world * interleave
            + rank * interleave + offset % interleave)
