"""Trace-level shrinking: make a failing trace shorter while it keeps failing the
same invariant.

Hypothesis shrinks the draws of its state machine; this works on traces, so it
also serves traces from elsewhere.  Passes (:data:`PASSES`), in rounds until
no pass helps (bounded).  Each pass yields ``(position, ops)`` candidates in
increasing position; after a candidate is kept, the pass goes on from that
position on the new trace rather than from its start (the candidates before
it failed a moment ago; the next round tries them again, so the result is
still a fixpoint of every pass):

1. drop chunks of ops, delta-debugging style (halves, quarters, ... pairs) —
   a long Hypothesis trace loses most of its ops in a few replays; the last
   (failing) op is never dropped;
2. drop one request with every op that mentions it;
3. drop single ops, last first, then sliding pairs;
4. fold a request's work onto another (the op's ``fold``: a step keeps its
   token count), take an admit's shared prefix from another earlier request
   (so a request that only lent its prompt can go), merge a request's
   allocations (``allocator: engine``: its next ``allocate`` into its
   ``admit``), then merge adjacent ops (two steps of the same requests
   become one), then narrow each op (its registry entry: drop scheduled
   requests, a simpler cudagraph mode, ...), then lower each op's integers
   (its registry entry's ``sizes``: token counts) by bisection, the
   smallest value first;
5. renumber requests and blocks to small ids in order of first use;
6. simplify the geometry (one DCP rank, no drafter, no kernel-block split),
   then lower each config limit (pool size, batch limits) by bisection —
   the smallest value that keeps the trace legal first, then halving the
   gap to the value known to fail — and drop capture sizes one at a time;
   when the config changed, steps 1-5 run once more.

Each candidate is repaired before it is replayed: ops that became illegal
(a step of a request no longer added, a block no longer free) are dropped, by
a dry run through the reference.  Deterministic: candidates are tried in a
fixed order.
"""

from __future__ import annotations

import contextlib
import copy

from reference import ConfigError, OpError, RunnerConfig, reference_runner

from harness.core.ops import apply_op, requests_of, spec_of
from harness.core.session import replay
from harness.core.trace import Trace

MAX_PASSES = 200  # accepted config improvements
MAX_REPLAYS = 400
# Resume replays from snapshots of shared prefixes, and let an interpreted kernel
# launch on memory an earlier launch saw take that launch's result
# (gpu_impl.cuda_graph.memoized_launches). The bench sets False to compare.
USE_CACHE = True


def _without_req(ops: list[dict], req: int) -> list[dict]:
    """``ops`` with request ``req`` dropped (each op's registry entry decides how).

    A prompt that shared ``req``'s prefix, where ``req``'s own prompt began
    with an earlier request's, shares that earlier request's instead (as far
    as the two coincide): the same tokens, so a prefix hit or a host-tier hit
    through the dropped request survives."""
    from harness.core.ops.scheduler import without_recorded

    source = next((op.get("prefix") for op in ops
                   if op["op"] == "admit" and op["req"] == req), None)
    if source:
        ops = [dict(without_recorded(op), prefix=[source[0], min(op["prefix"][1], source[1])])
               if op["op"] == "admit" and op.get("prefix") and op["prefix"][0] == req
               else op for op in ops]  # its recorded hit and blocks were another prompt's
    out = []
    for op in ops:
        kept = spec_of(op).drop_request(op, req)
        if kept is not None:
            out.append(kept)
    return out


def renumber(ops: list[dict]) -> list[dict]:
    """Requests renumbered 0, 1, ... and blocks 1, 2, ... per group, by first use.

    A consistent relabelling keeps every ownership relation, so legality and
    the failure are preserved; only the ids become small and readable.
    """
    reqs: dict[int, int] = {}
    blocks: dict[int, dict[int, int]] = {}

    def req(r):
        return reqs.setdefault(r, len(reqs))

    def blk(g, b):
        table = blocks.setdefault(g, {})
        return table.setdefault(b, len(table) + 1)

    return [spec_of(op).rename(op, req, blk) for op in ops]


LIMITS = ("num_blocks", "max_num_reqs", "max_num_blocks_per_req", "max_num_batched_tokens")
LEAST = {"num_blocks": 2}  # the null block and one more; every other limit: 1


def _simpler_configs(config):
    """Simpler geometry (one DCP rank, no kernel-block split, default cache
    layouts, no row narrower than a request), then each capture size dropped (validity checked by the
    caller); the numeric limits are :func:`_lower_limit`'s."""
    fields = config.to_json()
    if fields.get("dcp_world_size", 1) > 1:
        yield dict(fields, dcp_world_size=1, dcp_rank=0, cp_kv_cache_interleave_size=1)
    if fields.get("cp_kv_cache_interleave_size", 1) > 1:
        yield dict(fields, cp_kv_cache_interleave_size=1)
    if fields.get("num_speculative_tokens"):  # no drafter (a trace without spec ops)
        yield {k: v for k, v in fields.items() if k != "num_speculative_tokens"}
    for g, spec in enumerate(fields["groups"]):
        if spec.get("kernel_block_size", spec["block_size"]) != spec["block_size"]:
            groups = copy.deepcopy(fields["groups"])
            groups[g]["kernel_block_size"] = spec["block_size"]
            yield dict(fields, groups=groups)
    if "max_model_len" in fields:  # one width for every attention group (the widest)
        yield {k: v for k, v in fields.items() if k != "max_model_len"}
    # The cache layouts back to their defaults: float32 KV, null-block padding,
    # no conv state (the block sizes a conv state made a shared page need stay).
    for name in ("kv_cache_dtype", "mamba_padding", "kv_sharing_map"):
        if name in fields:
            yield {k: v for k, v in fields.items() if k != name}
    for g, spec in enumerate(fields["groups"]):
        if spec.get("conv_size"):
            groups = copy.deepcopy(fields["groups"])
            del groups[g]["conv_size"]
            yield dict(fields, groups=groups)
    for g, spec in enumerate(fields["groups"]):  # a row as wide as every other
        if spec.get("max_num_blocks"):
            groups = copy.deepcopy(fields["groups"])
            del groups[g]["max_num_blocks"]
            yield dict(fields, groups=groups)
    sizes = fields["cudagraph_capture_sizes"]
    for k in range(len(sizes)):
        yield dict(fields, cudagraph_capture_sizes=sizes[:k] + sizes[k + 1:])


def _folded(ops: list[dict], req: int, into: int) -> list[dict] | None:
    """``req`` dropped, its work moved onto ``into`` where an op can fold it (a
    step keeps its token count); None when no op folds anything."""
    out, folded = [], False
    for op in ops:
        spec = spec_of(op)
        moved = spec.fold(op, req, into) if spec.fold is not None else None
        if moved is not None:
            out.append(moved)
            folded = True
            continue
        kept = spec.drop_request(op, req)
        if kept is not None:
            out.append(kept)
    return out if folded else None


def _added(ops: list[dict]) -> list[int]:
    """Every request the ops name (``add`` or ``admit``; a request named only
    as a prefix source drops or folds to nothing and is skipped as a repeat)."""
    return sorted({r for op in ops for r in requests_of(op)})


def _drop_requests(ops: list[dict]):
    """Each request dropped with every op that mentions it (position: its id)."""
    for req in _added(ops):
        yield req, _without_req(ops, req)


def _fold_requests(ops: list[dict]):
    """Each request dropped with its work folded onto another request (three
    one-token requests of a four-token batch become one request of four)."""
    reqs = _added(ops)
    for req in reqs:
        for into in reqs:
            if into != req:
                folded = _folded(ops, req, into)
                if folded is not None:
                    yield (req, into), folded


def _drop_chunks(ops: list[dict]):
    """Delta debugging's complements: aligned chunks of half the trace, then a
    quarter, ... down to pairs, first chunk first (what a failure needs
    usually sits near its failing op, so the front is the likelier cut: on
    the shrink bench this took the worst shrink from 11.1 to 8.5 s).  The
    last op (the one that fails: a shrunk candidate is cut there) is never
    dropped — without it the trace passes, and the replay would only prove
    it.  Position: (-size, start), so after a cut the pass goes on at the
    same chunk size, further towards the end (ddmin keeping its
    granularity)."""
    body, last = ops[:-1], ops[-1:]
    size = len(body) // 2
    while size >= 2:
        for start in range(0, len(body), size):
            yield (-size, start), body[:start] + body[start + size:] + last
        size //= 2


def _drop_singles(ops: list[dict]):
    """Single ops, last first (but the failing last op); then adjacent pairs of
    the same op (two swaps only cancel out together; an op and the ops that
    need it go together anyway: the candidate is legalized)."""
    body, last = ops[:-1], ops[-1:]
    for i in reversed(range(len(body))):
        yield (0, -i), body[:i] + body[i + 1:] + last
    for start in range(len(body) - 2, -1, -1):
        if body[start]["op"] == body[start + 1]["op"]:
            yield (1, -start), body[:start] + body[start + 2:] + last


def _resource_prefixes(ops: list[dict]):
    """Each ``admit``'s shared prefix taken from another request admitted
    before it (``allocator: engine``): a prompt that shares an earlier prompt's
    tokens through a request the failure does not need then shares them
    through one it does, and the drop pass can take the first away.  The
    replay decides whether the hit is the same."""
    from harness.core.ops.scheduler import without_recorded

    order: dict[int, int] = {}  # request -> its prompt length, in admit order
    for i, op in enumerate(ops):
        if op["op"] != "admit":
            continue
        src, n = op["prefix"] if op["prefix"] else (None, 0)
        if src in order:  # only later lenders than the current one: no cycle
            for r in list(order)[list(order).index(src) + 1:]:
                yield i, ops[:i] + [dict(without_recorded(op),
                                         prefix=[r, min(n, order[r])])] + ops[i + 1:]
        order[op["req"]] = op["prompt_len"]


def _merge_adjacent(ops: list[dict]):
    """Adjacent ops merged into one (their registry entry: two steps become one)."""
    for i in range(len(ops) - 1):
        merge = spec_of(ops[i]).merge
        merged = merge(ops[i], ops[i + 1]) if merge is not None else None
        if merged is not None:
            yield i, ops[:i] + [merged] + ops[i + 2:]


def _merge_allocations(ops: list[dict]):
    """A request's next ``allocate`` merged into its previous ``admit`` /
    ``allocate`` (tokens summed; for an ``admit`` also the whole prompt at
    once): a chunked prefill asked for in one piece, after which its steps
    can merge too (``allocator: engine``)."""
    from harness.core.ops.scheduler import without_recorded

    for i, op in enumerate(ops):
        if op["op"] not in ("admit", "allocate"):
            continue
        j = next((k for k in range(i + 1, len(ops)) if ops[k]["op"] == "allocate"
                  and ops[k]["req"] == op["req"]), None)
        if j is None:
            continue
        rest = ops[i + 1:j] + ops[j + 1:]
        total = op["num_new_tokens"] + ops[j]["num_new_tokens"]
        sizes = [total]
        hit = op.get("num_cached_tokens")
        if op["op"] == "admit" and isinstance(hit, int) and op["prompt_len"] - hit != total:
            sizes.append(op["prompt_len"] - hit)
        for n in sizes:
            if op["op"] == "admit" and n > op["prompt_len"] - (hit or 0):
                continue
            yield i, ops[:i] + [dict(without_recorded(op), num_new_tokens=n)] + rest


def _narrow_ops(ops: list[dict]):
    """Each op's simpler variants (its registry entry)."""
    for i, op in enumerate(ops):
        for simpler in spec_of(op).narrow(op):
            yield i, ops[:i] + [simpler] + ops[i + 1:]


# Cheap, large cuts first: chunks (a replay stops at the failure, and a chunk cut
# early leaves a short trace), then requests, single ops, folds, merges, narrowing.
PASSES = (_drop_chunks, _drop_requests, _drop_singles, _fold_requests, _resource_prefixes,
          _merge_allocations, _merge_adjacent, _narrow_ops)
# Passes that remove what sat at a position: after a cut there, what now sits
# at it was tried a moment ago, so the pass goes on strictly after it.  (A pass
# that rewrites the op at a position tries it again: it has new variants.)
DROPS = (_drop_chunks, _drop_requests, _drop_singles, _fold_requests)


def _candidates(ops: list[dict]):
    """Every candidate of every pass, in pass order (what one round tries)."""
    for make in PASSES:
        yield from (cand for _, cand in make(ops))


def legalize(config, ops: list[dict]) -> list[dict]:
    """``ops`` minus every op the reference refuses in sequence (choices
    mirrored as recorded: :func:`harness.core.trace.apply_as_recorded`)."""
    from harness.core.trace import apply_as_recorded

    runner = reference_runner(config)
    kept = []
    for op in ops:
        try:
            apply_as_recorded(runner, config, op)
        except OpError:
            continue
        kept.append(op)
    return kept


def as_trace_allocator(trace: Trace) -> Trace | None:
    """``trace`` with the target's KV-cache manager taken out, when its choices
    did nothing a trace could not name: every ``admit`` an ``add`` of the
    blocks it got (no prefix hit; a refused one dropped; a shared prompt
    prefix becomes the request's own tokens), every ``allocate`` an
    ``append`` (nothing freed from a sliding window; the window itself is
    dropped).  None when that is not
    so — the bug may then be the manager's.  (The shrinker tries it: a bug
    that is not the manager's then shrinks to the vocabulary of every other
    trace.)"""
    cfg = trace.config
    if cfg.runner == "sglang" or cfg.allocator != "engine":
        return None  # (a token-slot engine always chooses: there is no trace allocator)
    ops = []
    for op in trace.ops:
        if op["op"] == "admit":
            if op.get("num_cached_tokens"):
                return None
            if op.get("blocks") is not None:  # refused: the request never entered
                ops.append({"op": "add", "req": op["req"], "blocks": op["blocks"],
                            "prompt_len": op["prompt_len"]})
        elif op["op"] == "allocate":
            if any(op.get("freed") or []):
                return None
            if op.get("blocks") is not None and any(op["blocks"]):
                ops.append({"op": "append", "req": op["req"], "blocks": op["blocks"]})
        else:
            ops.append(op)
    fields = {k: v for k, v in cfg.to_json().items()
              if k not in ("allocator", "enable_prefix_caching")}
    # Full attention instead of a window no allocate moved (the replay decides
    # whether the bug still shows).
    fields["groups"] = [{k: v for k, v in g.items() if k != "sliding_window"}
                        for g in fields["groups"]]
    try:
        config = RunnerConfig.from_json(fields)
    except ConfigError:
        return None
    if legalize(config, ops) != ops:
        return None
    return Trace(config, ops, trace.expect, trace.meta)


def _fails(trace: Trace, invariant: str, faults, target, device) -> int | None:
    """ops run until the violation when ``trace`` fails ``invariant``, else None
    (also when ``target`` cannot express the candidate's config).  Resumes from
    the shrink's :data:`_CACHE` where an earlier candidate ran the same prefix."""
    from harness.core.session import IllegalOp
    from harness.targets import TargetRefused

    try:
        verdict = replay(trace, faults, target, device, record=True, cache=_CACHE[0])
    except (TargetRefused, IllegalOp):
        return None
    if verdict.violation is not None and verdict.violation.invariant == invariant:
        _LAST_OPS[:] = verdict.ops[:verdict.ops_run]  # as replayed: choices re-recorded
        return verdict.ops_run
    return None


_LAST_OPS: list = []  # the ops of the last failing replay, as the target chose
_CACHE: list = [None]  # the running shrink's SnapshotCache (None: every replay from the start)


def shrink(trace: Trace, invariant: str, faults=(), target: str = "gpu_impl",
           device: str | None = None) -> tuple[Trace, int]:
    """Shortest trace found that still fails ``invariant``; returns (trace, replays).

    Op-level passes first (and, between rounds, the KV-cache manager taken out
    when its choices did nothing a trace could not name), then renumbering,
    then smaller config limits — and the op passes once more when the config
    got simpler (without a drafter, a request needs no lookahead blocks, so
    a fold that was illegal may now be legal).
    """
    from harness.core.session import SnapshotCache
    from harness.targets import TargetUnavailable

    from gpu_impl.cuda_graph import memoized_launches

    try:
        _CACHE[0] = SnapshotCache.for_target(target, device) if USE_CACHE else None
    except (TargetUnavailable, ValueError):  # the first replay reports it
        _CACHE[0] = None
    try:
        with memoized_launches() if USE_CACHE else contextlib.nullcontext():
            return _shrink(trace, invariant, faults, target, device)
    finally:
        _CACHE[0] = None


def _shrink(trace, invariant, faults, target, device):
    best = trace
    replays = 0
    plain = as_trace_allocator(best)  # first: the passes then work in the plain vocabulary
    if plain is not None:
        replays += 1
        if _fails(plain, invariant, faults, target, device) is not None:
            best = plain
    seen: set[str] = set()
    for _ in range(2):  # op passes, then the config; again when a simpler config opens cuts
        config = best.config
        best, replays = _shrink_ops(best, invariant, faults, target, device, replays, seen)
        best, replays = _shrink_config(best, invariant, faults, target, device, replays)
        if best.config == config or replays >= MAX_REPLAYS:
            break
    return best, replays


def _shrink_ops(best, invariant, faults, target, device, replays, seen):
    """The op passes in rounds until none improves, then renumbering; returns
    (best trace, replays so far)."""
    improved_any = True
    while improved_any:  # rounds of every pass until none improves
        improved_any = False
        for make in PASSES:
            resume = None  # the position of the pass's last kept candidate
            while True:  # after a kept candidate, the pass goes on from its position
                if replays >= MAX_REPLAYS:
                    return best, replays
                found = None
                for pos, ops in make(best.ops):
                    if resume is not None and (pos < resume or (pos == resume
                                                                and make in DROPS)):
                        continue  # tried in this sweep, on a trace that differed only after it
                    if replays >= MAX_REPLAYS:
                        return best, replays
                    ops = legalize(best.config, ops)
                    key = repr(ops)
                    seen.add(repr(best.ops))  # never back to a trace already left
                    if ops == best.ops or key in seen:
                        continue
                    seen.add(key)
                    replays += 1
                    ran = _fails(Trace(best.config, ops, best.expect, best.meta), invariant,
                                 faults, target, device)
                    if ran is not None:
                        found = Trace(best.config, list(_LAST_OPS), best.expect, best.meta)
                        resume = pos
                        break
                if found is None:
                    break
                best, improved_any = found, True
                plain = as_trace_allocator(best)  # the manager out, when it did nothing
                if plain is not None and replays < MAX_REPLAYS:
                    replays += 1
                    if _fails(plain, invariant, faults, target, device) is not None:
                        best = plain
        best, replays, lowered = _lower_sizes(best, invariant, faults, target, device,
                                              replays, seen)
        improved_any = improved_any or lowered
    ops = renumber(best.ops)
    if ops != best.ops and legalize(best.config, ops) == ops:
        replays += 1
        cand = Trace(best.config, ops, best.expect, best.meta)
        if _fails(cand, invariant, faults, target, device) is not None:
            best = cand
    return best, replays


def _lower_sizes(best, invariant, faults, target, device, replays, seen):
    """Each op's integers (:class:`harness.core.ops.Size`) lowered by bisection;
    returns (best, replays, whether anything was lowered).

    Per integer, :func:`_bisect_down` from its least value, each try a replay.
    A candidate is legalized like every other (an op the reference then
    refuses is dropped); one already tried counts as passing.
    """
    lowered = False

    def lower(value):
        """Whether op ``i`` with integer ``key`` at ``value`` still fails (kept
        if so); None when out of replays or the op is gone (a replay cut the
        trace before it)."""
        nonlocal best, replays, lowered
        now = _size(best.ops, i, key)
        if replays >= MAX_REPLAYS or now is None:
            return None
        ops = legalize(best.config, best.ops[:i] + [now.make(value)] + best.ops[i + 1:])
        tried = repr(ops)
        if ops == best.ops or tried in seen:
            return False
        seen.add(tried)
        replays += 1
        if _fails(Trace(best.config, ops, best.expect, best.meta), invariant, faults, target,
                  device) is None:
            return False
        best = Trace(best.config, list(_LAST_OPS), best.expect, best.meta)
        seen.add(repr(best.ops))
        lowered = True
        return True

    i = 0
    while i < len(best.ops):
        for key in [z.key for z in spec_of(best.ops[i]).sizes(best.ops[i])]:
            now = _size(best.ops, i, key)
            if now is not None:
                _bisect_down(now.least, now.value, lower)
        i += 1
    return best, replays, lowered


def _size(ops: list[dict], i: int, key: str):
    """Op ``i``'s integer ``key`` as it is now, or None (no such op or integer)."""
    if i >= len(ops):
        return None
    return next((z for z in spec_of(ops[i]).sizes(ops[i]) if z.key == key), None)


def _shrink_token_slot_config(best, invariant, faults, target, device, budget):
    """A token-slot config made plainer, each step kept where the trace still
    fails: its fields moved to their defaults one at a time, then its limits
    (request rows, slots, context length) lowered by halving.  The ops the
    plainer config refuses are dropped with it (a request that only filled a
    larger pool goes when the pool shrinks); a hybrid model's Mamba pool is
    lowered down to one request's slots.  Returns (best, replays)."""
    import dataclasses

    from reference.token_slots import TokenSlotConfig

    def attempt(**change):
        nonlocal best
        if budget[0] >= MAX_REPLAYS:
            return False
        try:
            config = dataclasses.replace(best.config, **change)
        except ValueError:  # ConfigError: not valid with the other fields
            return False
        ops = legalize(config, best.ops)
        if config == best.config or not ops:
            return False
        budget[0] += 1
        if _fails(Trace(config, ops, best.expect, best.meta), invariant, faults, target,
                  device) is None:
            return False
        best = Trace(config, list(_LAST_OPS), best.expect, best.meta)
        return True

    plain = TokenSlotConfig()
    for f in dataclasses.fields(TokenSlotConfig):
        if getattr(best.config, f.name) != getattr(plain, f.name):
            attempt(**{f.name: getattr(plain, f.name)})
    for name in ("max_num_reqs", "num_slots", "max_context_len", "mamba_slots"):
        lo = best.config.page_size if name == "num_slots" else 1
        if name == "mamba_slots":  # a hybrid model's Mamba pool: down to one request's
            lo = best.config.mamba_slots_for(1) if best.config.mamba_slots else 0
        while getattr(best.config, name) > lo:
            v = max(lo, getattr(best.config, name) // 2)
            if name == "num_slots":
                v -= v % best.config.page_size
            if not attempt(**{name: v}):
                break
    return best, budget[0]


def _shrink_config(best, invariant, faults, target, device, replays):
    """Simpler geometry and lower limits, the ops unchanged; returns (best, replays).

    First every simplification at once (:func:`_simplest_config`, one replay),
    then rounds until a round changes nothing: each simpler geometry / dropped
    capture size in turn (kept when the trace still fails), then each limit
    of :data:`LIMITS` lowered by :func:`_lower_limit`.
    """
    budget = [replays]
    from harness.targets import target_spec

    variant = target_spec(target).variant
    runs_on = variant(best.config)

    def fails(config) -> bool:
        """Whether the unchanged ops are legal under ``config``, run on the same
        implementation of the target (:attr:`TargetSpec.variant`), and still fail."""
        if config == best.config or legalize(config, best.ops) != best.ops \
                or variant(config) != runs_on:
            return False
        budget[0] += 1
        return _fails(Trace(config, best.ops, best.expect, best.meta), invariant, faults,
                      target, device) is not None

    if best.config.runner == "sglang":
        return _shrink_token_slot_config(best, invariant, faults, target, device, budget)
    simplest = _simplest_config(best.config, best.ops)
    if budget[0] < MAX_REPLAYS and fails(simplest):  # every simplification in one replay
        best = Trace(simplest, best.ops, best.expect, best.meta)
    for _ in range(MAX_PASSES):
        before = best.config
        simpler = True
        while simpler:  # candidates are built from the current config: restart after a kept one
            simpler = False
            for fields in _simpler_configs(best.config):
                if budget[0] >= MAX_REPLAYS:
                    return best, budget[0]
                config = _config_or_none(fields)
                if config is not None and fails(config):
                    best, simpler = Trace(config, best.ops, best.expect, best.meta), True
                    break
        for name in LIMITS:
            if budget[0] >= MAX_REPLAYS:
                return best, budget[0]
            config = _lower_limit(best, name, fails)
            if config is not None:
                best = Trace(config, best.ops, best.expect, best.meta)
        if best.config == before:
            break
    return best, budget[0]


def _simplest_config(config, ops: list[dict]):
    """``config`` with every simplification :func:`_shrink_config` tries one at a
    time applied together: each simpler geometry and dropped capture size of
    :func:`_simpler_configs` in turn (on the result of the ones before, where
    the result is valid and ``ops`` stay legal under it), then each limit of
    :data:`LIMITS` at the least value the ops stay legal under (dry runs, no
    replay).  The shrink replays it first: a finding that needs none of what
    they take away loses it all in one replay where one at a time took one
    replay each (8 to 18 on the shrink bench's findings)."""
    def legal(fields):
        c = _config_or_none(fields)
        return c if c is not None and c != config and legalize(c, ops) == ops else None

    changed = True
    while changed:  # each simplification strictly removes something: this ends
        changed = False
        for fields in _simpler_configs(config):
            c = legal(fields)
            if c is not None:
                config, changed = c, True
                break
    for name in LIMITS:
        fields = config.to_json()
        low, high = LEAST.get(name, 1), fields[name]
        while low < high:  # legality only grows with a limit: bisect the least legal value
            mid = (low + high) // 2
            if legal(dict(fields, **{name: mid})) is not None:
                high = mid
            else:
                low = mid + 1
        config = legal(dict(fields, **{name: high})) or config
    return config


def _config_or_none(fields: dict):
    try:
        return RunnerConfig.from_json(fields)
    except ConfigError:
        return None


def _bisect_down(least: int, value: int, fails) -> int:
    """The lowest value in [least, value] found to fail: ``least`` first (most
    often enough), then halving the gap between the highest value seen to
    pass and the lowest seen to fail (``value`` fails) — about log2(value -
    least) calls of ``fails(v)`` where lowering one at a time took one per
    unit.  ``fails`` may return None: stop, keeping what was found."""
    passes, fails_at, candidate = least - 1, value, least
    while passes < candidate < fails_at:
        verdict = fails(candidate)
        if verdict is None:
            break
        if verdict:
            fails_at = candidate
        else:
            passes = candidate
        candidate = (passes + fails_at + 1) // 2
    return fails_at


def _lower_limit(best: Trace, name: str, fails) -> RunnerConfig | None:
    """The config with limit ``name`` as low as bisection finds it still
    failing, or None when no lower value does.

    First the smallest value under which the ops stay legal (bisected with
    dry runs through the reference, no replay: legality only grows with a
    limit), then :func:`_bisect_down` from there, each try a replay
    (``fails(config)``).
    """
    fields = best.config.to_json()
    high = fields[name]  # fails (the current config)

    def at(value):
        config = _config_or_none(dict(fields, **{name: value}))
        legal = config is not None and legalize(config, best.ops) == best.ops
        return config if legal else None

    low = LEAST.get(name, 1)
    if high <= low:
        return None
    while low < high:  # the smallest legal value in [low, high]
        mid = (low + high) // 2
        if at(mid) is not None:
            high = mid
        else:
            low = mid + 1

    def still_fails(value):
        config = at(value)
        return config is not None and fails(config)
    fail_at = _bisect_down(low, fields[name], still_fails)
    return None if fail_at == fields[name] else at(fail_at)
