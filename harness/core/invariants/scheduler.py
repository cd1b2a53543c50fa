"""Scheduler invariants: what a KV-cache manager may hand out (``config.allocator
== "engine"``).

The target chooses blocks for ``admit`` / ``allocate``; the reference mirrors
the choice in its ledger (reference counts, prefix-cache registrations) and
these checks judge it, independent of the target's policy (which free block,
which eviction order):

A replay whose target chooses differently from what the trace recorded is
not a violation — which free block a manager takes is its policy — but the
replay reports it (:attr:`harness.core.session.Verdict.diverged`).
- ``POOL_ACCOUNTING``: the choice is well formed (ids in the pool, never the
  null block, as many as the request needs); a refusal only when the pool is
  short; the target's own view of its pool (free count, reference count of
  every block, the null block's included) equals the ledger's.
- ``ONE_OWNER_PER_BLOCK``: no block is handed out while someone holds it; a
  block held by two live requests is a registered full block of the prefix
  they share.
- ``PREFIX_CONTENT``: an admitted request's hit is the one the reference's
  prefix cache holds, and its hit blocks hold exactly that prefix's KV (the
  target's layers: a P/D KV load fills no drafter's layer).
- ``CACHED_BLOCKS_IMMUTABLE``: a block registered in the prefix cache keeps its
  content in every layer until it is evicted.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from reference import NULL_BLOCK_ID
from reference.config import ENGINE, MAMBA
from reference.payload import mamba_state_of, token_payload

from harness.core.invariants import CheckContext, Invariant, register

POOL_ACCOUNTING = "POOL_ACCOUNTING"
ONE_OWNER_PER_BLOCK = "ONE_OWNER_PER_BLOCK"
PREFIX_CONTENT = "PREFIX_CONTENT"
CACHED_BLOCKS_IMMUTABLE = "CACHED_BLOCKS_IMMUTABLE"


@dataclass(frozen=True)
class ChoiceFacts:
    """What the ledger said before a target's choice was mirrored.

    recorded: the trace's recorded choice, when it had one; chosen: the
    target's choice; expected_hit: the reference's prefix hit
    (``admit``; None for ``allocate``); tokens: the admitted prompt's token ids;
    needed: new blocks per group the request needs for the chosen hit; fits:
    whether the pool could hand out what the reference's hit needs."""

    recorded: dict | None
    chosen: dict
    expected_hit: int | None
    tokens: np.ndarray | None
    needed: list
    fits: bool
    window_blocks: list | None = None  # allocate: blocks its sliding windows left, per group


def facts_before(config, ledger, op: dict, recorded_choice) -> ChoiceFacts:
    """:class:`ChoiceFacts` of ``op`` (its choice already in it), from the ledger
    before the choice is mirrored; recorded_choice: what the trace had, or None."""
    compare = recorded_choice
    chosen = {k: op.get(k) for k in ("blocks", "num_cached_tokens", "freed") if k in op}
    groups = range(len(config.groups))
    if op["op"] == "admit":
        tokens = ledger.prompt_tokens(op["req"], op["prompt_len"], op["prefix"])
        hit, hit_blocks = ledger.expected_hit(tokens)
        want = [ledger.blocks_needed(g, len(hit_blocks[g]), hit + op["num_new_tokens"], True)
                for g in groups]
        fits = ledger.fits(want, hit_blocks)
        h = op.get("num_cached_tokens")
        h = h if isinstance(h, int) and not isinstance(h, bool) else hit
        needed = [ledger.blocks_needed(g, config.hit_columns(g, h), h + op["num_new_tokens"],
                                       True) for g in groups]
        return ChoiceFacts(compare, chosen, hit, tokens, needed, fits)
    r = ledger.requests[op["req"]]
    needed = [ledger.blocks_needed(g, len(r.blocks[g]),
                                   r.num_computed_tokens + op["num_new_tokens"]) for g in groups]
    window = [[r.blocks[g][i] for i in cols] for g, cols in enumerate(ledger.skipped_blocks(
        op["req"]))]
    # What the pool holds once the window's blocks are back (a refusal is judged after).
    free_after = [sum(1 for b in window[g] if ledger.ref_count[g][b] == 1) for g in groups]
    fits = ledger.fits(needed, [[] for _ in groups], free_after)
    return ChoiceFacts(compare, chosen, None, None, needed, fits, window)


def malformed(config, ledger, op: dict) -> tuple[str, str] | None:
    """(invariant, why) when the target's choice in ``op`` cannot even be
    mirrored — a hit outside the prompt (``PREFIX_CONTENT``), blocks the pool
    does not have or not as many as needed (``POOL_ACCOUNTING``) — else None."""
    problem = _malformed_blocks(config, ledger, op)
    if problem:
        return problem if isinstance(problem, tuple) else (POOL_ACCOUNTING, problem)
    return None


def _malformed_blocks(config, ledger, op: dict):
    blocks = op.get("blocks")
    hit = 0
    if op["op"] == "admit":
        hit = op.get("num_cached_tokens")
        if isinstance(hit, bool) or not isinstance(hit, int) or not 0 <= hit <= op["prompt_len"] \
                or (hit == op["prompt_len"] and blocks is not None):
            return PREFIX_CONTENT, (f"the KV-cache manager reported a prefix hit of {hit!r} "
                                    f"tokens for a {op['prompt_len']}-token prompt (at most "
                                    "prompt_len - 1: the last prompt token is always computed)")
    facts = facts_before(config, ledger, op, None)
    freed = op.get("freed") or [[] for _ in config.groups]
    if op["op"] == "allocate":
        if not isinstance(freed, list) or len(freed) != len(config.groups):
            return f"the KV-cache manager's freed blocks {freed!r} are not one list per group"
        for g, ids in enumerate(freed):
            held = ledger.requests[op["req"]].blocks[g]
            for b in ids:
                if b not in held or b == NULL_BLOCK_ID:
                    return (f"group {g}: the KV-cache manager freed block {b!r} from request "
                            f"{op['req']}'s window, which it does not hold")
    if blocks is None:
        return None
    if not isinstance(blocks, list) or len(blocks) != len(config.groups) \
            or not all(isinstance(ids, list) for ids in blocks):
        return f"the KV-cache manager's blocks {blocks!r} are not one list per group"
    for g, ids in enumerate(blocks):
        before = [] if op["op"] == "admit" else ledger.requests[op["req"]].blocks[g]
        null = config.null_block(g)  # None under pad_slot_no_null
        held = [b for b in before if b != null and b not in freed[g]]
        n_hit = config.hit_columns(g, hit)
        start = hit if op["op"] == "admit" else ledger.requests[op["req"]].num_computed_tokens
        # Align mode: a Mamba list is null blocks up to the state block at the
        # hit's end, then null pads up to the new state block.
        admit = op["op"] == "admit"
        pads = ledger.null_pads(g, len(before) + n_hit, start + op["num_new_tokens"], admit) \
            if facts.needed[g] else 0
        # Align mode with a drafter: speculative blocks that move to the end.
        moves = [] if admit else [before[c] for c in ledger.spec_moves(
            g, len(before), start + op["num_new_tokens"])]
        # A sliding-window hit: null blocks before the window of its first new token.
        window_nulls = ledger.hit_first_block(g, hit) if op["op"] == "admit" else 0
        for k, b in enumerate(ids):
            if isinstance(b, bool) or not isinstance(b, int) or not 0 <= b < config.num_blocks:
                return f"group {g}: block id {b!r} is not in the pool [0, {config.num_blocks})"
            # Mamba prefix caching: a hit's columns before its state block are
            # null; align mode also pads the columns up to a new state block.
            if 0 <= k - n_hit - pads < len(moves):
                if b != moves[k - n_hit - pads]:
                    return (f"group {g}: request {op['req']}'s block list {ids} holds block "
                            f"{b} as entry {k}, where its speculative state block "
                            f"{moves[k - n_hit - pads]} moves to (align mode with a drafter)")
                continue
            pad = (config.caches_state(g) and k < n_hit - 1) \
                or (config.pads_with_null(g) and n_hit <= k < n_hit + pads)
            if (b == null) != pad and not (b == null and k < window_nulls):
                if b == null:
                    return f"group {g}: the null block was handed out to request {op['req']}"
                return (f"group {g}: request {op['req']}'s block list {ids} holds block {b} "
                        f"as entry {k}, a column Mamba prefix caching leaves to the null "
                        "block")
        real = [b for b in ids if b != null]
        if len(set(real)) != len(real) or (set(real) - set(moves)) & set(held):
            return f"group {g}: request {op['req']} was handed block(s) {ids} twice"
        new = len(ids) - n_hit - pads - len(moves)
        if new != facts.needed[g]:
            return (f"group {g}: request {op['req']} was handed {max(new, 0)} new block(s) "
                    f"({ids}, {n_hit} of them its prefix hit); it needs {facts.needed[g]}")
        columns = 0 if op["op"] == "admit" else len(ledger.requests[op["req"]].blocks[g])
        if columns + len(ids) > config.blocks_per_req_max(g):
            return (f"group {g}: request {op['req']} would hold {columns + len(ids)} blocks, "
                    f"its block-table row has {config.blocks_per_req_max(g)} columns")
    return None


def _engine(ctx: CheckContext) -> bool:
    return ctx.config.allocator == ENGINE


def check_pool(ctx: CheckContext) -> list:
    if not _engine(ctx):
        return []
    out = []
    f = ctx.choice
    if f is not None and f.chosen.get("blocks") is None and f.fits:
        out.append(ctx.violation(POOL_ACCOUNTING, f"request {ctx.op['req']} was refused, but "
                                 f"the pool has the {f.needed} new block(s) per group it needs "
                                 f"(free: {[ctx.ledger.num_free(g) for g in range(len(ctx.config.groups))]} "
                                 "before the op" + ("; one pool shared by every group"
                                                    if ctx.config.kv_sharing else "") + ")"))
    if f is not None and f.window_blocks is not None:
        freed = f.chosen.get("freed") or []
        for g, ids in enumerate(freed):
            for b in ids:
                if b in f.window_blocks[g]:
                    continue
                r = ctx.ledger.requests[ctx.op["req"]]
                bs = ctx.config.tokens_per_block(g)
                spec = ctx.config.groups[g]
                what = (f"sliding window of {spec.sliding_window} tokens, but the next token "
                        f"(position {r.num_computed_tokens}) still attends to its positions"
                        if spec.sliding_window else
                        f"Mamba group, but it holds the running state (column "
                        f"{(r.num_computed_tokens - 1) // bs}, position "
                        f"{r.num_computed_tokens - 1}) the next step "
                        + ("copies from" if ctx.config.mamba_cache_mode == "align"
                           else "reads"))
                out.append(ctx.violation(
                    POOL_ACCOUNTING, f"block {b} was freed from request {ctx.op['req']}'s "
                    f"{what} (blocks of {bs} tokens)", group=g, block=b))
    if f is not None and f.window_blocks is not None:
        freed = f.chosen.get("freed") or [[] for _ in ctx.config.groups]
        for g, ids in enumerate(f.window_blocks):
            for b in ids:
                if b not in freed[g]:
                    r = ctx.ledger.requests[ctx.op["req"]]
                    out.append(ctx.violation(
                        POOL_ACCOUNTING, f"block {b} of request {ctx.op['req']} is no longer "
                        f"needed ({ctx.ledger.num_skipped_tokens(g, r.num_computed_tokens)} "
                        f"leading tokens skipped at {r.num_computed_tokens} computed) but was "
                        "not freed before allocating (vLLM's remove_skipped_blocks): held "
                        "out of the pool", group=g, block=b))
                    break
    pool = ctx.after.pool
    if pool is None:
        return out
    for g, seen in sorted(pool.items()):
        want = ctx.ledger.ref_count[g]
        got = np.asarray(seen["ref_count"])
        bad = np.flatnonzero(got != want)
        if bad.size:
            b = int(bad[0])
            what = "the null block's" if b == NULL_BLOCK_ID and ctx.config.has_null_block(g) \
                else f"block {b}'s"
            out.append(ctx.violation(POOL_ACCOUNTING, f"{what} reference count is {int(got[b])} "
                                     f"in the target's pool; {int(want[b])} request(s) hold it"
                                     + (" (live, or kept for a transfer in flight)"
                                        if ctx.ledger.finishing else ""), group=g, block=b))
            continue
        if int(seen["num_free"]) != ctx.ledger.num_free(g):
            out.append(ctx.violation(POOL_ACCOUNTING, f"the target's pool counts "
                                     f"{int(seen['num_free'])} free blocks, but only "
                                     f"{ctx.ledger.num_free(g)} (null block excluded) are held "
                                     "by no live request: free + used != total", group=g))
    return out


def check_one_owner(ctx: CheckContext) -> list:
    if not _engine(ctx):
        return []
    out = []
    if ctx.choice is not None:
        for g, b, holders in ctx.ledger.last_taken_busy:
            out.append(ctx.violation(ONE_OWNER_PER_BLOCK, f"block {b} was handed to request "
                                     f"{ctx.op['req']} as a new block while request(s) "
                                     f"{list(holders)} hold it", group=g, block=b))
    cfg, ledger = ctx.config, ctx.ledger
    for g in range(len(cfg.groups)):
        where: dict[int, list] = {}
        for req, r in sorted(ledger.requests.items()):
            for i, b in enumerate(r.blocks[g]):
                where.setdefault(b, []).append((req, i))
        for b, at in sorted(where.items()):
            if len(at) < 2 or (b == NULL_BLOCK_ID and cfg.has_null_block(g)):  # a window's
                # freed entries
                continue
            key = ledger.registered[g].get(b)
            for req, i in at:
                if (cfg.groups[g].kind == MAMBA and not cfg.caches_state(g)) or key is None \
                        or ledger.block_key(g, ledger.token_ids(req, np.arange(len(key))), i) != key:
                    reqs = [r for r, _ in at]
                    out.append(ctx.violation(ONE_OWNER_PER_BLOCK, f"block {b} is held by "
                                             f"requests {reqs}, and it is not a registered full "
                                             f"block of a prefix they share (request {req} "
                                             f"holds it as its block {i})", group=g, block=b))
                    break
    if cfg.kv_sharing:  # one pool: a block id belongs to one group at a time
        groups_of: dict[int, list] = {}
        for req, r in sorted(ledger.requests.items()):
            for g, ids in enumerate(r.blocks):
                for b in ids:
                    if b != NULL_BLOCK_ID and (g, req) not in groups_of.get(b, []):
                        groups_of.setdefault(b, []).append((g, req))
        for b, at in sorted(groups_of.items()):
            if len({g for g, _ in at}) > 1:
                held = ", ".join(f"group {g} of request {req}" for g, req in at)
                out.append(ctx.violation(ONE_OWNER_PER_BLOCK, f"block {b} of the shared pool "
                                         f"(kv_sharing) is held by {held} at once",
                                         group=at[1][0], block=b))
                break
    return out[:1] if out else out


def _layers(obs, g: int):
    out = []
    if g in obs.mamba_state:
        out.append((f"mamba_state[{g}]", obs.mamba_state[g], False))
    if g in obs.kv_cache:
        out.append((f"kv_cache[{g}]", obs.kv_cache[g], False))
    if obs.draft_kv_cache and g in obs.draft_kv_cache:
        out.append((f"draft_kv_cache[{g}]", obs.draft_kv_cache[g], True))
    return out


def check_prefix_content(ctx: CheckContext) -> list:
    f = ctx.choice
    if f is None or ctx.op["op"] != "admit":
        return []
    cfg, op = ctx.config, ctx.op
    hit = f.chosen["num_cached_tokens"]
    if hit != f.expected_hit:  # judged on a refused admit too
        return [ctx.violation(PREFIX_CONTENT, f"request {op['req']}'s prefix hit is {hit} "
                              f"tokens; the prefix cache holds {f.expected_hit} of its prompt")]
    if f.chosen.get("blocks") is None:
        return []
    before = ctx.permit.registered if ctx.permit is not None else ()
    for g in cfg.attention_groups:
        bs = cfg.tokens_per_block(g)
        for i, b in enumerate(f.chosen["blocks"][g][:hit // bs]):
            if b == NULL_BLOCK_ID:  # before a sliding window (the structure was checked)
                continue
            key = ctx.ledger.block_key(g, f.tokens, i)
            if before and before[g].get(b) != key:
                return [ctx.violation(PREFIX_CONTENT, f"request {op['req']}'s prefix hit "
                                      f"shares block {b} as its block {i}, which is not "
                                      "registered for those tokens", group=g, block=b)]
            want = token_payload(f.tokens[i * bs:(i + 1) * bs], cfg.head_size)
            # The target's layers; the drafter's layer is not judged here: a KV
            # load fills the target's KV only, so a loaded prefix has none there.
            for name, cache, draft in _layers(ctx.after, g):
                if draft:
                    continue
                if not np.array_equal(cache[b], want):
                    return [ctx.violation(PREFIX_CONTENT, f"request {op['req']}'s prefix hit "
                                          f"shares block {b} ({name}), which does not hold "
                                          f"positions {i * bs}..{(i + 1) * bs - 1} of its prompt",
                                          group=g, block=b)]
    for g in cfg.mamba_groups:
        n = cfg.hit_columns(g, hit)
        if not n:
            continue
        b = f.chosen["blocks"][g][n - 1]
        key = ctx.ledger.block_key(g, f.tokens, n - 1)
        if before and before[g].get(b) != key:
            return [ctx.violation(PREFIX_CONTENT, f"request {op['req']}'s prefix hit shares "
                                  f"Mamba state block {b} as its column {n - 1}, which is "
                                  f"not registered for its first {hit} tokens", group=g,
                                  block=b)]
        want = mamba_state_of(token_payload(f.tokens[:hit], cfg.head_size),
                              cfg.groups[g].conv_size)
        if not np.array_equal(ctx.after.mamba_state[g][b], want):
            return [ctx.violation(PREFIX_CONTENT, f"request {op['req']}'s prefix hit shares "
                                  f"Mamba state block {b} (mamba_state[{g}]), which does not "
                                  f"hold the state after positions 0..{hit - 1} of its prompt",
                                  group=g, block=b)]
    return []


def check_cached_immutable(ctx: CheckContext) -> list:
    if ctx.permit is None or not ctx.config.enable_prefix_caching or ctx.before is None:
        return []
    for g, blocks in enumerate(ctx.permit.registered):
        for b, key in sorted(blocks.items()):
            if ctx.ledger.registered[g].get(b) != key:
                continue  # evicted by this op: handed to a new owner
            for (name, was, _), (_, now, _) in zip(_layers(ctx.before, g), _layers(ctx.after, g)):
                w, v = np.atleast_2d(was[b]), np.atleast_2d(now[b])  # Mamba: one state
                same = (w == v) | (np.isnan(w) & np.isnan(v))
                if not same.all():
                    off = int(np.flatnonzero(~same.all(axis=-1))[0])
                    at = f"offset {off} of block {b}" if was.ndim > 2 else f"block {b}"
                    return [ctx.violation(CACHED_BLOCKS_IMMUTABLE, f"{name} {at}, registered "
                                          f"in the prefix cache, changed to {v[off][0]} (was "
                                          f"{w[off][0]})", group=g, block=b)]
    return []


def _chooses(spec) -> bool:
    return bool(spec.records)


register(Invariant(POOL_ACCOUNTING, "the KV-cache manager hands out blocks its pool has, as "
                   "many as a request needs, refuses only when short, and its reference counts "
                   "and free count match the requests holding blocks (null block untouched)",
                   check_pool))
register(Invariant(PREFIX_CONTENT, "a prefix hit is the reference's, and its blocks hold "
                   "exactly that prefix's KV", check_prefix_content, applies=_chooses,
                   applies_text="admit"))
register(Invariant(ONE_OWNER_PER_BLOCK, "no block is handed out while held; a block two live "
                   "requests hold is a registered full block of their shared prefix",
                   check_one_owner))
register(Invariant(CACHED_BLOCKS_IMMUTABLE, "a block registered in the prefix cache keeps its "
                   "content in every layer until evicted", check_cached_immutable))
