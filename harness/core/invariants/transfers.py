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
  The host tier too: no host block an onboard in flight reads, or an
  offload in flight writes, is evicted before that copy ends (vLLM's CPU
  manager keeps a block a load reads out of its eviction list; SGLang's
  HiCache holds a host lock across a load-back).
- ``STORE_PROVENANCE``: when a store to the external KV store completes, what
  the target's store holds for that prefix is exactly the reference's — the
  prefix's KV, read from blocks its request still held (kept for it, had it
  left meanwhile).  The host tier too, after each op of it: it holds the
  block hashes the reference's holds (its eviction is vLLM's LRU:
  ``reference/host_tier.py``), and every ready host block holds its hash's
  KV.
"""

from __future__ import annotations

import numpy as np

from harness.core.invariants import CheckContext, Invariant, register
from harness.core.invariants.writes import fmt_values

NO_FREE_WHILE_PENDING = "NO_FREE_WHILE_PENDING"
STORE_PROVENANCE = "STORE_PROVENANCE"


def _host_pending(ctx: CheckContext) -> list:
    """Host blocks a copy in flight touches that the target's host tier lost."""
    held = ctx.after.host_tier
    if held is None:
        return []
    for h, t in sorted(ctx.ledger.transfers.items()):
        for key in t.host_keys:
            if key not in held or (t.kind == "load" and held[key] is None):
                does = (f"onboard {h} still reads it into request {t.req}'s blocks"
                        if t.kind == "load" else f"offload {h} still writes it")
                return [ctx.violation(
                    NO_FREE_WHILE_PENDING, f"the host block of group {key[0]}'s "
                    f"{len(key[1])}-token prefix was evicted from the target's host tier "
                    f"while {does}", group=key[0])]
    return []


def check_no_free_while_pending(ctx: CheckContext) -> list:
    ledger = ctx.ledger
    if not ledger.transfers:
        return []
    out = _host_pending(ctx)
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
                   "transfer ends; no host block a copy in flight reads or writes is evicted",
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
                                  f"{fmt_values(values[p])}: the copy read blocks that did not "
                                  "hold that prefix's KV when it read them (no longer the "
                                  "request's, or not yet written)", group=g)]
    return []


def check_host_provenance(ctx: CheckContext) -> list:
    """The target's host tier holds the reference's block hashes, and each ready
    host block its hash's KV."""
    got, want = ctx.after.host_tier, ctx.reference.host_tier
    if got is None or want is None:
        return []
    lost = [k for k in want if k not in got]
    if lost:
        k = lost[0]
        return [ctx.violation(STORE_PROVENANCE, f"the target's host tier dropped the block of "
                              f"group {k[0]}'s {len(k[1])}-token prefix, which the reference "
                              "keeps (LRU: it was not among the least recently used evictable "
                              "blocks, or it was being stored again)", group=k[0])]
    extra = [k for k in got if k not in want]
    if extra:
        k = extra[0]
        return [ctx.violation(STORE_PROVENANCE, f"the target's host tier holds a block of "
                              f"group {k[0]}'s {len(k[1])}-token prefix, which the reference "
                              "evicted or never stored", group=k[0])]
    for k, values in want.items():
        if values is None or got[k] is None:
            if (values is None) != (got[k] is None):
                return [ctx.violation(STORE_PROVENANCE, f"the host block of group {k[0]}'s "
                                      f"{len(k[1])}-token prefix is "
                                      + ("ready" if values is None else "not ready")
                                      + " in the target's host tier, not in the reference's",
                                      group=k[0])]
            continue
        bad = np.flatnonzero(~(got[k] == values).all(axis=1))
        if bad.size:
            p = int(bad[0])
            return [ctx.violation(STORE_PROVENANCE, f"the host block of group {k[0]}'s "
                                  f"{len(k[1])}-token prefix holds {fmt_values(got[k][p])} at "
                                  f"its offset {p}, not {fmt_values(values[p])}: it was "
                                  "copied from a block that did not hold that prefix's KV "
                                  "when the copy read it",
                                  group=k[0])]
    return []


def check_provenance(ctx: CheckContext) -> list:
    if ctx.op is not None and ctx.op["op"] == "kv_store_complete":
        return check_store_provenance(ctx)
    return check_host_provenance(ctx)


HOST_OPS = ("offload_begin", "offload_complete", "onboard_begin", "onboard_complete",
            "kv_load_fail")

register(Invariant(STORE_PROVENANCE, "what an external KV store or a host tier holds for a "
                   "prefix is that prefix's KV, read from blocks its request still held; the "
                   "host tier holds the block hashes its LRU keeps",
                   check_provenance,
                   applies=lambda spec: spec.name in ("kv_store_complete",) + HOST_OPS,
                   applies_text="kv_store_complete, " + ", ".join(HOST_OPS)))
