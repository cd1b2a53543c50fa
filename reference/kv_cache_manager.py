"""The reference's own choices when it is the target (``--target reference``)
with ``config.allocator == "engine"``: which blocks a KV-cache manager hands out.

The policy is deliberately plain — the prefix hit :meth:`Ledger.expected_hit`
finds, then the lowest free ids, unregistered blocks before registered
(evictable) ones — because choices are not what the reference judges: in a
session the target chooses and the reference mirrors and judges the choice
(``ONE_OWNER_PER_BLOCK``, ``PREFIX_CONTENT``, ``POOL_ACCOUNTING``).  vLLM's
policy (a free queue, LRU eviction) is gpu_impl's and vLLM's own.
"""

from __future__ import annotations

import numpy as np

from .ledger import Ledger
from .payload import NULL_BLOCK_ID


def _pick(ledger: Ledger, group: int, count: int, exclude=()) -> list[int]:
    free = [int(b) for b in np.flatnonzero(ledger.ref_count[group] == 0)
            if b != ledger.config.null_block(group) and int(b) not in exclude]
    free.sort(key=lambda b: (b in ledger.registered[group], b))
    return free[:count]


def choose_admit(ledger: Ledger, tokens: np.ndarray, num_new_tokens: int):
    """(blocks per group, hit blocks first — or None when the pool is short —,
    prefix hit in tokens) for a new request with prompt ``tokens``."""
    hit, hit_blocks = ledger.expected_hit(tokens)
    cfg = ledger.config
    needed = [ledger.blocks_needed(g, len(hit_blocks[g]), hit + num_new_tokens, True)
              for g in range(len(cfg.groups))]
    if not ledger.fits(needed, hit_blocks):
        return None, hit
    taken = set()  # kv_sharing: the groups draw from one pool, none twice
    out = []
    for g in range(len(cfg.groups)):
        new = _pick(ledger, g, needed[g], set(hit_blocks[g]) | taken)
        taken |= set(new) if cfg.kv_sharing else set()
        out.append(hit_blocks[g] + [NULL_BLOCK_ID] * ledger.null_pads(
            g, len(hit_blocks[g]), hit + num_new_tokens, True) + new)
    return out, hit


def choose_skipped(ledger: Ledger, req: int) -> list[list[int]]:
    """Blocks ``req``'s sliding windows left, per group (freed before allocating)."""
    r = ledger.requests[req]
    return [[r.blocks[g][i] for i in cols] for g, cols in enumerate(ledger.skipped_blocks(req))]


def choose_allocate(ledger: Ledger, req: int, num_new_tokens: int):
    """New blocks per group for ``req`` to cover ``num_new_tokens`` more tokens,
    or None when the pool is short (after its window's blocks were freed)."""
    r = ledger.requests[req]
    cfg = ledger.config
    needed = [ledger.blocks_needed(g, len(r.blocks[g]), r.num_computed_tokens + num_new_tokens)
              for g in range(len(cfg.groups))]
    if not ledger.fits(needed, [[] for _ in cfg.groups]):
        return None
    total = r.num_computed_tokens + num_new_tokens
    taken, out = set(), []
    for g in range(len(cfg.groups)):
        new = _pick(ledger, g, needed[g], taken)
        taken |= set(new) if cfg.kv_sharing else set()
        have = len(r.blocks[g])
        moved = [r.blocks[g][c] for c in ledger.spec_moves(g, have, total)]
        out.append([NULL_BLOCK_ID] * (ledger.null_pads(g, have, total) if needed[g] else 0)
                   + moved + new)
    return out
