"""Invariants of work in flight between its begin and its end (asynchronous KV loads).

- ``NO_FREE_WHILE_PENDING``: no block a transfer in flight loads into is free
  in the target's KV-cache pool, or handed to a request as a new block, before
  that transfer has ended.  The reference's rule (``reference/ledger.py``,
  ``kv_load_begin``): a request that leaves — removed (an abort) or failed by a
  transfer — keeps its blocks until its last transfer has completed or failed,
  as vLLM's scheduler delays the free of a request whose remote KV is still
  arriving.  Judged on the target's pool (allocator ``engine``: its reference
  counts) and on each choice it makes; with allocator ``trace`` the trace
  names the blocks and the reference refuses a pending one, so an early free
  shows as the poisoned content ``MATCHES_REFERENCE`` compares.
"""

from __future__ import annotations

from harness.core.invariants import CheckContext, Invariant, register

NO_FREE_WHILE_PENDING = "NO_FREE_WHILE_PENDING"


def check_no_free_while_pending(ctx: CheckContext) -> list:
    ledger = ctx.ledger
    if not ledger.transfers:
        return []
    out = []
    pool = ctx.after.pool
    if pool is not None:
        for h, t in sorted(ledger.transfers.items()):
            left = "" if t.req in ledger.requests else f" (request {t.req} has left)"
            for g, ids in enumerate(t.blocks):
                free = [b for b in ids if int(pool[g]["ref_count"][b]) == 0]
                if free:
                    out.append(ctx.violation(
                        NO_FREE_WHILE_PENDING, f"block {free[0]} is free in the target's "
                        f"pool while transfer {h} still loads request {t.req}'s prompt into "
                        f"it{left}", group=g, block=free[0]))
                    break
    if ctx.choice is not None:
        pending = [ledger.pending_blocks(g) for g in range(len(ctx.config.groups))]
        for g, b, _ in ledger.last_taken_busy:
            h = pending[g].get(b)
            if h is not None:
                t = ledger.transfers[h]
                out.append(ctx.violation(
                    NO_FREE_WHILE_PENDING, f"block {b} was handed to request {ctx.op['req']} "
                    f"as a new block while transfer {h} still loads request {t.req}'s prompt "
                    "into it", group=g, block=b))
    return out


register(Invariant(NO_FREE_WHILE_PENDING, "no block a KV transfer in flight loads into is free "
                   "in the target's pool or handed out anew before the transfer ends",
                   check_no_free_while_pending))
