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
- ``STORE_PROVENANCE``: when a store to the external KV store completes, what
  the target's store holds for that prefix is exactly the reference's — the
  prefix's KV, read from blocks its request still held (kept for it, had it
  left meanwhile).
"""

from __future__ import annotations

import numpy as np

from harness.core.invariants import CheckContext, Invariant, register
from harness.core.invariants.writes import fmt_values

NO_FREE_WHILE_PENDING = "NO_FREE_WHILE_PENDING"
STORE_PROVENANCE = "STORE_PROVENANCE"


def check_no_free_while_pending(ctx: CheckContext) -> list:
    ledger = ctx.ledger
    if not ledger.transfers:
        return []
    out = []
    pool = ctx.after.pool
    if pool is not None:
        for h, t in sorted(ledger.transfers.items()):
            left = (f" (request {t.req} has left)" if ledger.finishing.get(t.req) is t.owner
                    else "")
            does = (f"loads request {t.req}'s prompt into" if t.kind == "load"
                    else f"reads request {t.req}'s KV from")
            for g, ids in enumerate(t.blocks):
                free = [b for b in ids if int(pool[g]["ref_count"][b]) == 0]
                if free:
                    out.append(ctx.violation(
                        NO_FREE_WHILE_PENDING, f"block {free[0]} is free in the target's "
                        f"pool while transfer {h} still {does} it{left}", group=g,
                        block=free[0]))
                    break
    if ctx.choice is not None:
        pending = [ledger.pending_blocks(g) for g in range(len(ctx.config.groups))]
        for g, b, _ in ledger.last_taken_busy:
            h = pending[g].get(b)
            if h is not None:
                t = ledger.transfers[h]
                does = (f"loads request {t.req}'s prompt into" if t.kind == "load"
                        else f"reads request {t.req}'s KV from")
                out.append(ctx.violation(
                    NO_FREE_WHILE_PENDING, f"block {b} was handed to request {ctx.op['req']} "
                    f"as a new block while transfer {h} still {does} it", group=g, block=b))
    return out


register(Invariant(NO_FREE_WHILE_PENDING, "no block a KV transfer in flight writes (a load) or "
                   "reads (a store) is free in the target's pool or handed out anew before the "
                   "transfer ends",
                   check_no_free_while_pending))


def check_store_provenance(ctx: CheckContext) -> list:
    """What the target's external store holds for a prefix key is that prefix's
    KV (the reference's entry), as read from blocks its request still held."""
    got, want = ctx.after.kv_store, ctx.reference.kv_store
    if got is None or want is None:
        return []
    key = None
    if ctx.op is not None and ctx.op["op"] == "kv_store_complete":
        t_key = [k for k in got if k not in want or any(
            not np.array_equal(got[k][g], want[k][g]) for g in want[k])]
        key = t_key[0] if t_key else None
    if key is None:
        return []
    if key not in want:
        return [ctx.violation(STORE_PROVENANCE, f"the store holds a prefix of {len(key)} "
                              "tokens the reference never saved")]
    for g, values in sorted(want[key].items()):
        bad = np.flatnonzero(~(got[key][g] == values).all(axis=1))
        if bad.size:
            p = int(bad[0])
            return [ctx.violation(STORE_PROVENANCE, f"request {ctx.op['req']}'s store of its "
                                  f"first {len(key)} tokens saved {fmt_values(got[key][g][p])} "
                                  f"for its position-{p} KV (of this rank), not "
                                  f"{fmt_values(values[p])}: the blocks it read were not its "
                                  "own any more", group=g)]
    return []


register(Invariant(STORE_PROVENANCE, "what an external KV store holds for a prefix is that "
                   "prefix's KV, read from blocks its request still held",
                   check_store_provenance,
                   applies=lambda spec: spec.name == "kv_store_complete",
                   applies_text="kv_store_complete"))
