"""Invariants of a token-slot engine (SGLang's shape; ``runner`` ``sglang``).

Each is a pure function of the target's :class:`TokenSlotObservation` before
and after an op and the oracle (:class:`reference.token_slots.TokenSlotReference`:
the live requests' tokens and committed KV lengths, the last forward's
requests and positions).  The engine chooses rows and slots; these judge the
choice's effects:

- ``SGL_RESERVED_UNREAD``: no live request sits on row 0 or reads KV slot 0
  (SGLang's padding index, which padded rows really write);
- ``SGL_PADDING_RESERVED``: a padded graph batch points its padded rows at row
  0 and slot 0 only;
- ``SGL_NO_STALE_WRITE``: an op's forward writes only the slots of the
  positions it computed for the requests it ran, slots that were free, and
  slot 0 — never a slot another request or the tree held;
- ``SGL_KV_MATCHES``: every live request's committed positions hold the KV
  of its token prefix (a prefix hit reads what its first owner wrote);
- ``SGL_TREE_CONTENT``: every radix-tree node's slots hold the KV of its path;
- ``SGL_DECODE_READS_OWN_KV``: each real row of a decode reads, through the
  row and length the forward ran with (a graph replay's captured buffers),
  exactly its request's KV: its committed length, each position the KV of its
  token prefix;
- ``SGL_SLOTS_ACCOUNTED``: every page is exactly one of free or in use (a live
  row's or the tree's), never both, none lost; rows likewise.

A hybrid model's Mamba pool (``mamba_slots`` > 0; each check is empty for an
attention-only config):

- ``SGL_STATE_RESERVED``: no live request and no radix-tree node holds Mamba
  slot 0 (the padding slot a graph capture's dummy rows write), and a padded
  replay's padded rows get ``PAD_SLOT_ID`` or slot 0 as their state index;
- ``SGL_STATE_NO_STALE_WRITE``: an op writes only the state slots of the
  requests it ran, slot 0, and slots no live request held before it (free
  ones, or the tree's unlocked states, which an allocation may evict);
- ``SGL_STATE_MATCHES``: every live request's state slot holds the state after
  its committed tokens (a prefix hit's state copied, a fresh slot cleared);
- ``SGL_STATE_TREE_CONTENT``: every radix-tree node's Mamba state is the state
  after its path;
- ``SGL_STATE_ACCOUNTED``: every state slot is exactly one of free, a live
  request's or a tree node's; slot 0 never free, none lost.
"""

from __future__ import annotations

import numpy as np

from reference.token_slots import RESERVED_ROW, RESERVED_SLOT, payload, state_after

from harness.core.invariants import CheckContext, Invariant, Violation, register

RUNNERS = ("sglang",)


def _token_slot_op(spec) -> bool:
    return "sglang" in spec.runners


def _forward_op(spec) -> bool:
    return "sglang" in spec.runners and spec.forward is not None


def _live_slots(obs, req: int) -> np.ndarray:
    return obs.req_to_token[obs.rows[req], :obs.kv_len[req]].astype(np.int64)


def check_reserved_unread(ctx: CheckContext) -> list[Violation]:
    out = []
    for req, row in sorted(ctx.after.rows.items()):
        if row == RESERVED_ROW:
            out.append(ctx.violation("SGL_RESERVED_UNREAD", f"request {req} was given row 0, "
                                     "the padding row padded batches write", row=row))
            continue
        at = np.flatnonzero(_live_slots(ctx.after, req) == RESERVED_SLOT)
        if at.size:
            out.append(ctx.violation(
                "SGL_RESERVED_UNREAD", f"request {req} reads KV slot 0 (the padding slot) at "
                f"position {int(at[0])} of its {ctx.after.kv_len[req]}", row=row))
    return out


def check_padding_reserved(ctx: CheckContext) -> list[Violation]:
    pad, ref = ctx.after.padding, ctx.reference.last_forward
    if pad is None or ref is None or ref.get("padded_bs") is None:
        return []
    lo, hi = pad["raw_bs"], pad["padded_bs"]
    out = []
    for name, reserved in (("req_pool_indices", RESERVED_ROW), ("out_cache_loc", RESERVED_SLOT)):
        bad = np.flatnonzero(pad[name][lo:hi] != reserved)
        if bad.size:
            i = lo + int(bad[0])
            out.append(ctx.violation(
                "SGL_PADDING_RESERVED", f"padded row {i} of {hi} has {name} "
                f"{int(pad[name][i])}, not the reserved {reserved}", row=i))
    return out


def _allowed_writes(ctx: CheckContext) -> set[int]:
    """Slots the op may write: slot 0; the slots its computed positions hold
    after it; and slots no live request held before it — free ones, or the
    radix tree's that no live row reads (an allocation may evict them) — for a
    new allocation may be written and then freed in the same op (a request's
    duplicate of a slot the tree holds, when the tree keeps its own)."""
    allowed = {RESERVED_SLOT}
    ref = ctx.reference.last_forward or {}
    for req, (lo, hi) in ref.get("positions", {}).items():
        if req in ctx.after.rows:
            allowed.update(int(s) for s in
                           ctx.after.req_to_token[ctx.after.rows[req], lo:hi])
    if ctx.before is not None:
        ps, before = ctx.config.page_size, ctx.before
        allowed.update(p * ps + i for p in before.free_pages.tolist() for i in range(ps))
        live = {s for req in before.rows for s in _live_slots(before, req).tolist()}
        allowed.update(s for _, slots, _ in before.tree for s in slots if s not in live)
    return allowed


def _owner_text(ctx: CheckContext, slot: int) -> str:
    for req, row in sorted(ctx.after.rows.items()):
        pos = np.flatnonzero(_live_slots(ctx.after, req) == slot)
        if pos.size:
            return f"request {req}'s position {int(pos[0])}"
    for tokens, slots, lock in ctx.after.tree:
        if slot in slots:
            return f"the radix tree's node of {len(slots)} tokens (lock {lock})"
    page = slot // ctx.config.page_size
    if page in set(ctx.after.free_pages.tolist()):
        return "a free slot"
    return "no one"


def check_no_stale_write(ctx: CheckContext) -> list[Violation]:
    if ctx.before is None:
        return []
    before = ctx.before.kv.view(np.uint32)
    after = ctx.after.kv.view(np.uint32)
    changed = set(np.flatnonzero(before != after).tolist())
    if ctx.after.written is not None:
        changed.update(int(s) for s in ctx.after.written)
    bad = sorted(changed - _allowed_writes(ctx))
    return _stale(ctx, "SGL_NO_STALE_WRITE", bad, "KV slot {slot} was written, held by "
                  "{holder}; the op computed no position there",
                  lambda slot: _owner_text(ctx, slot))


def _stale(ctx, invariant: str, bad: list, text: str, holder) -> list[Violation]:
    """One violation for the first of the ``bad`` slots (``text`` formatted with
    ``slot`` and ``holder(slot)``), counting the rest; none when there are none."""
    if not bad:
        return []
    slot = bad[0]
    return [ctx.violation(invariant, text.format(slot=slot, holder=holder(slot))
                          + (f" ({len(bad)} slots in all)" if len(bad) > 1 else ""),
                          block=slot)]


def check_kv_matches(ctx: CheckContext) -> list[Violation]:
    ref, obs = ctx.reference, ctx.after
    out = []
    live = ref.live()
    if sorted(obs.rows) != sorted(live):
        return [ctx.violation("SGL_KV_MATCHES", f"live requests {sorted(obs.rows)}; the "
                              f"oracle has {sorted(live)}")]
    for req in live:
        want = ref.requests[req].kv_len
        if obs.kv_len[req] != want:
            out.append(ctx.violation("SGL_KV_MATCHES", f"request {req} has {obs.kv_len[req]} "
                                     f"committed positions; the oracle {want}", row=obs.rows[req]))
            continue
        got = obs.kv[_live_slots(obs, req)]
        diff = np.flatnonzero(got.view(np.uint32) != ref.expected_kv(req).view(np.uint32))
        if diff.size:
            p = int(diff[0])
            slot = int(obs.req_to_token[obs.rows[req], p])
            out.append(ctx.violation(
                "SGL_KV_MATCHES", f"request {req}'s position {p} (slot {slot}) holds "
                f"{float(got[p])}, not the KV of its token prefix", row=obs.rows[req],
                block=slot))
    return out


def check_tree_content(ctx: CheckContext) -> list[Violation]:
    for tokens, slots, lock in ctx.after.tree:
        if RESERVED_SLOT in slots:
            return [ctx.violation("SGL_TREE_CONTENT", f"a radix-tree node of {len(tokens)} "
                                  "tokens holds KV slot 0", block=RESERVED_SLOT)]
        got = ctx.after.kv[np.asarray(slots, np.int64)]
        diff = np.flatnonzero(got.view(np.uint32) != payload(tokens).view(np.uint32))
        if diff.size:
            p = int(diff[0])
            return [ctx.violation("SGL_TREE_CONTENT", f"the radix tree's path of {len(tokens)} "
                                  f"tokens holds {float(got[p])} at position {p} (slot {slots[p]}), "
                                  "not the KV of its prefix", block=slots[p])]
    return []


def check_decode_reads_own_kv(ctx: CheckContext) -> list[Violation]:
    reads = getattr(ctx.after, "reads", None)
    if not reads:
        return []
    ref = ctx.reference
    for b, (req, row, n, got) in enumerate(reads):
        if req not in ref.requests:
            continue
        want = ref.expected_kv(req)
        if n != len(want):
            return [ctx.violation("SGL_DECODE_READS_OWN_KV", f"batch row {b} (request {req}) "
                                  f"reads {n} positions through row {row}; the request has "
                                  f"{len(want)}", row=row)]
        diff = np.flatnonzero(np.asarray(got, np.float32).view(np.uint32) != want.view(np.uint32))
        if diff.size:
            p = int(diff[0])
            return [ctx.violation(
                "SGL_DECODE_READS_OWN_KV", f"batch row {b} (request {req}) reads {float(got[p])} "
                f"at position {p} through row {row}, not the KV of its token prefix"
                + ("" if row == ctx.after.rows.get(req) else
                   f" (row {row} is not the request's row {ctx.after.rows.get(req)})"),
                row=row)]
    return []


def check_slots_accounted(ctx: CheckContext) -> list[Violation]:
    cfg, obs = ctx.config, ctx.after
    ps = cfg.page_size
    free = obs.free_pages.tolist()
    free_set = set(free)
    out = []
    if len(free_set) != len(free):
        dup = next(p for p in free if free.count(p) > 1)
        out.append(ctx.violation("SGL_SLOTS_ACCOUNTED", f"page {dup} is free twice",
                                 block=dup * ps))
    used: dict[int, str] = {}
    for req in sorted(obs.rows):
        for s in _live_slots(obs, req).tolist():
            used.setdefault(s // ps, f"request {req}")
    for tokens, slots, lock in obs.tree:
        for s in slots:
            used.setdefault(s // ps, "the radix tree")
    both = sorted(free_set & set(used))
    if both:
        p = both[0]
        out.append(ctx.violation("SGL_SLOTS_ACCOUNTED", f"page {p} is free while "
                                 f"{used[p]} holds it", block=p * ps))
    pages = set(range(1, cfg.num_pages + 1))
    if RESERVED_SLOT // ps in free_set:
        out.append(ctx.violation("SGL_SLOTS_ACCOUNTED", "the reserved page 0 is free",
                                 block=RESERVED_SLOT))
    lost = sorted(pages - free_set - set(used))
    if lost:
        out.append(ctx.violation("SGL_SLOTS_ACCOUNTED", f"page {lost[0]} is neither free nor "
                                 f"held ({len(lost)} pages lost)", block=lost[0] * ps))
    rows = list(obs.rows.values())
    if len(set(rows)) != len(rows):
        r = next(x for x in rows if rows.count(x) > 1)
        out.append(ctx.violation("SGL_SLOTS_ACCOUNTED", f"row {r} is held by two live "
                                 "requests", row=r))
    return out


register(Invariant("SGL_RESERVED_UNREAD", "no live request sits on row 0 or reads KV "
                   "slot 0 (SGLang's padding index)", check_reserved_unread, structural=True,
                   applies=_token_slot_op, applies_text="every token-slot op",
                   runners=RUNNERS))
register(Invariant("SGL_PADDING_RESERVED", "a padded decode-graph batch points its padded "
                   "rows at row 0 and KV slot 0 only", check_padding_reserved, structural=True,
                   applies=_forward_op, applies_text="token-slot forwards", runners=RUNNERS))
register(Invariant("SGL_NO_STALE_WRITE", "a forward writes only the slots of the positions "
                   "it computed, and slot 0", check_no_stale_write, applies=_forward_op,
                   applies_text="token-slot forwards", runners=RUNNERS))
register(Invariant("SGL_KV_MATCHES", "every live request's committed positions hold the KV "
                   "of its token prefix", check_kv_matches, applies=_token_slot_op,
                   applies_text="every token-slot op", runners=RUNNERS))
register(Invariant("SGL_TREE_CONTENT", "every radix-tree node's slots hold the KV of its "
                   "path", check_tree_content, applies=_token_slot_op,
                   applies_text="every token-slot op", runners=RUNNERS))
register(Invariant("SGL_DECODE_READS_OWN_KV", "each real row of a decode reads, through "
                   "the row and length the forward ran with, exactly its request's KV",
                   check_decode_reads_own_kv, applies=_forward_op,
                   applies_text="token-slot forwards", runners=RUNNERS))
register(Invariant("SGL_SLOTS_ACCOUNTED", "every page is free or held (by a live row or "
                   "the tree), never both, none lost; rows held once",
                   check_slots_accounted, structural=True, applies=_token_slot_op,
                   applies_text="every token-slot op", runners=RUNNERS))


# -- a hybrid model's Mamba pool ------------------------------------------------------
RESERVED_STATE = 0  # Mamba slot 0: the padding slot (SGLang's MambaSlotAllocator skips it)
PAD_SLOT_ID = -1  # a padded row's state index the Mamba kernels skip


def _hybrid(ctx: CheckContext) -> bool:
    return bool(getattr(ctx.config, "mamba_slots", 0)) and \
        getattr(ctx.after, "state", None) is not None  # (the oracle's own: no pool)


def _state_holder(obs, slot: int) -> str:
    for req, s in sorted(obs.state_slots.items()):
        if s == slot:
            return f"request {req}"
    for tokens, s, lock in obs.state_tree:
        if s == slot:
            return f"the radix tree's state after {len(tokens)} tokens (lock {lock})"
    if obs.state_free is not None and slot in set(obs.state_free.tolist()):
        return "a free slot"
    return "no one"


def _slot_differs(obs, slot: int, want) -> str | None:
    """How Mamba slot ``slot`` differs from the state ``want``: its SSM state,
    or a value of its conv window (None: it holds ``want`` in both)."""
    w = np.float32(want).view(np.uint32)
    if np.float32(obs.state[slot]).view(np.uint32) != w:
        return f"an SSM state of {float(obs.state[slot])}"
    conv = getattr(obs, "conv", None)
    if conv is not None:
        bad = np.flatnonzero(conv[slot].astype(np.float32).view(np.uint32) != w)
        if bad.size:
            return f"a conv window value of {float(conv[slot][bad[0]])}"
    return None


def _changed_slots(before, after) -> set[int]:
    """Mamba slots whose SSM state or conv window differ between two observations."""
    out = set(np.flatnonzero(before.state.view(np.uint32) != after.state.view(np.uint32)).tolist())
    bc, ac = getattr(before, "conv", None), getattr(after, "conv", None)
    if bc is not None and ac is not None:
        out.update(np.flatnonzero((bc.view(np.uint32) != ac.view(np.uint32)).any(axis=1)).tolist())
    return out


def check_state_reserved(ctx: CheckContext) -> list[Violation]:
    if not _hybrid(ctx):
        return []
    obs, out = ctx.after, []
    for req, slot in sorted(obs.state_slots.items()):
        if slot == RESERVED_STATE:
            out.append(ctx.violation("SGL_STATE_RESERVED", f"request {req} holds Mamba slot 0, "
                                     "the padding slot a graph capture's dummy rows write",
                                     row=obs.rows.get(req)))
    for tokens, slot, lock in obs.state_tree:
        if slot == RESERVED_STATE:
            out.append(ctx.violation("SGL_STATE_RESERVED", f"the radix tree keeps the state "
                                     f"after {len(tokens)} tokens in Mamba slot 0, the padding "
                                     "slot"))
    pad, ref = obs.padding, ctx.reference.last_forward
    if pad is not None and ref is not None and ref.get("padded_bs") is not None \
            and "state_indices" in pad:
        lo, hi = pad["raw_bs"], pad["padded_bs"]
        idx = pad["state_indices"][lo:hi]
        bad = np.flatnonzero((idx != PAD_SLOT_ID) & (idx != RESERVED_STATE))
        if bad.size:
            i = lo + int(bad[0])
            out.append(ctx.violation(
                "SGL_STATE_RESERVED", f"padded row {i} of {hi} has Mamba state index "
                f"{int(pad['state_indices'][i])} ({_state_holder(obs, int(pad['state_indices'][i]))}),"
                " not PAD_SLOT_ID or the reserved slot 0", row=i))
    return out


def check_state_no_stale_write(ctx: CheckContext) -> list[Violation]:
    if not _hybrid(ctx) or getattr(ctx.before, "state", None) is None:
        return []
    before, after = ctx.before, ctx.after
    bad = sorted(state_writes(before, after) - allowed_state_writes(ctx))
    return _stale(ctx, "SGL_STATE_NO_STALE_WRITE", bad, "Mamba slot {slot} was written, "
                  "held by {holder}; the op ran no request there",
                  lambda slot: _state_holder(before, slot))


def state_writes(before, after) -> set[int]:
    """The Mamba slots an op wrote: those whose SSM state or conv window changed,
    and those its update wrote (a write of the same value included)."""
    changed = _changed_slots(before, after)
    if after.state_written is not None:
        changed.update(int(s) for s in after.state_written)
    return changed


def allowed_state_writes(ctx: CheckContext) -> set[int]:
    """Mamba slots the op may write: slot 0; the slots of the requests it ran;
    and slots no live request held before it — free ones, or the tree's unlocked
    states, which an allocation may evict and hand out in the op."""
    before, after = ctx.before, ctx.after
    ran = (ctx.reference.last_forward or {}).get("positions", {})
    allowed = {RESERVED_STATE}
    allowed.update(after.state_slots[r] for r in ran if r in after.state_slots)
    allowed.update(int(s) for s in before.state_free.tolist())
    live = set(before.state_slots.values())
    allowed.update(s for _, s, lock in before.state_tree if s not in live and not lock)
    return allowed


def check_state_matches(ctx: CheckContext) -> list[Violation]:
    if not _hybrid(ctx):
        return []
    ref, obs, out = ctx.reference, ctx.after, []
    for req in ref.live():
        if req not in obs.state_slots:
            continue  # SGL_KV_MATCHES names a live request the engine lacks
        slot, want = obs.state_slots[req], ref.expected_state(req)
        got = _slot_differs(obs, slot, want)
        if got is not None:
            out.append(ctx.violation(
                "SGL_STATE_MATCHES", f"request {req}'s Mamba slot {slot} holds {got}, not the "
                f"state after its {ref.requests[req].kv_len} tokens ({float(want)})",
                row=obs.rows.get(req), block=slot))
    return out


def check_state_tree_content(ctx: CheckContext) -> list[Violation]:
    if not _hybrid(ctx):
        return []
    obs = ctx.after
    for tokens, slot, lock in obs.state_tree:
        want = state_after(tokens)
        got = _slot_differs(obs, slot, want)
        if got is not None:
            return [ctx.violation(
                "SGL_STATE_TREE_CONTENT", f"the radix tree's state after {len(tokens)} tokens "
                f"(Mamba slot {slot}, lock {lock}) holds {got}, not the state after its path "
                f"({float(want)})", block=slot)]
    return []


def check_state_accounted(ctx: CheckContext) -> list[Violation]:
    if not _hybrid(ctx):
        return []
    obs, out = ctx.after, []
    free = obs.state_free.tolist()
    holders: dict[int, list[str]] = {}
    for req, slot in sorted(obs.state_slots.items()):
        holders.setdefault(slot, []).append(f"request {req}")
    for tokens, slot, lock in obs.state_tree:
        holders.setdefault(slot, []).append(f"the tree's state after {len(tokens)} tokens")
    for slot in sorted(set(free)):
        if free.count(slot) > 1:
            out.append(ctx.violation("SGL_STATE_ACCOUNTED", f"Mamba slot {slot} is free twice",
                                     block=slot))
        if slot in holders:
            out.append(ctx.violation("SGL_STATE_ACCOUNTED", f"Mamba slot {slot} is free while "
                                     f"{holders[slot][0]} holds it", block=slot))
    for slot, who in sorted(holders.items()):
        if len(who) > 1:
            out.append(ctx.violation("SGL_STATE_ACCOUNTED", f"Mamba slot {slot} is held by "
                                     f"{who[0]} and {who[1]}", block=slot))
    if RESERVED_STATE in set(free):
        out.append(ctx.violation("SGL_STATE_ACCOUNTED", "the reserved Mamba slot 0 is free",
                                 block=RESERVED_STATE))
    n = ctx.config.mamba_slots
    outside = sorted(x for x in set(free) | set(holders) if not 0 <= x <= n)
    if outside:
        out.append(ctx.violation("SGL_STATE_ACCOUNTED", f"Mamba slot {outside[0]} is outside "
                                 f"the pool's slots 0..{n}", block=outside[0]))
    lost = sorted(set(range(1, n + 1)) - set(free) - set(holders))
    if lost:
        out.append(ctx.violation("SGL_STATE_ACCOUNTED", f"Mamba slot {lost[0]} is neither free "
                                 f"nor held ({len(lost)} slots lost)", block=lost[0]))
    return out


register(Invariant("SGL_STATE_RESERVED", "no live request or radix-tree node holds Mamba "
                   "slot 0, and padded rows get PAD_SLOT_ID or slot 0 as their state index",
                   check_state_reserved, structural=True, applies=_token_slot_op,
                   applies_text="every token-slot op (hybrid configs)", runners=RUNNERS))
register(Invariant("SGL_STATE_NO_STALE_WRITE", "an op writes only the Mamba state slots of "
                   "the requests it ran, slot 0, and slots no live request held",
                   check_state_no_stale_write, applies=_token_slot_op,
                   applies_text="every token-slot op (hybrid configs)", runners=RUNNERS))
register(Invariant("SGL_STATE_MATCHES", "every live request's Mamba slot holds the state "
                   "after its committed tokens", check_state_matches, applies=_token_slot_op,
                   applies_text="every token-slot op (hybrid configs)", runners=RUNNERS))
register(Invariant("SGL_STATE_TREE_CONTENT", "every radix-tree node's Mamba state is the "
                   "state after its path", check_state_tree_content, applies=_token_slot_op,
                   applies_text="every token-slot op (hybrid configs)", runners=RUNNERS))
register(Invariant("SGL_STATE_ACCOUNTED", "every Mamba state slot is free, a live request's "
                   "or a tree node's, exactly one; slot 0 never free, none lost",
                   check_state_accounted, structural=True, applies=_token_slot_op,
                   applies_text="every token-slot op (hybrid configs)", runners=RUNNERS))
