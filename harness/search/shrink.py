"""Trace-level shrinking: make a failing trace shorter while it keeps failing the
same invariant.

Hypothesis shrinks the draws of its state machine; this works on traces, so it
also serves traces from elsewhere.  Passes (:data:`PASSES`), each repeated on
its own candidates while it helps, in rounds until no pass helps (bounded):

1. drop chunks of ops, delta-debugging style (halves, quarters, ... pairs) —
   a long Hypothesis trace loses most of its ops in a few replays; the last
   (failing) op is never dropped;
2. drop one request with every op that mentions it;
3. drop single ops, last first, then sliding pairs;
4. fold a request's work onto another (the op's ``fold``: a step keeps its
   token count), take an admit's shared prefix from another earlier request
   (so a request that only lent its prompt can go), merge a request's allocations (``allocator: engine``: its
   next ``allocate`` into its ``admit``), then merge adjacent ops (two steps
   of the same requests become one), then narrow each op (its registry entry: drop scheduled
   requests, lower token counts, a simpler cudagraph mode, ...);
5. renumber requests and blocks to small ids in order of first use;
6. simplify the geometry (one DCP rank, no drafter, no kernel-block split),
   then lower config limits (pool size, batch limits, capture sizes) one at
   a time; when the config changed, steps 1-5 run once more.

Each candidate is repaired before it is replayed: ops that became illegal
(a step of a request no longer added, a block no longer free) are dropped, by
a dry run through the reference.  Deterministic: candidates are tried in a
fixed order.
"""

from __future__ import annotations

import copy

from reference import ConfigError, OpError, RunnerConfig, reference_runner

from harness.core.ops import apply_op, requests_of, spec_of
from harness.core.session import replay
from harness.core.trace import Trace

MAX_PASSES = 200  # accepted config improvements
MAX_REPLAYS = 400
USE_CACHE = True  # resume replays from snapshots of shared prefixes (bench: False to compare)


def _without_req(ops: list[dict], req: int) -> list[dict]:
    """``ops`` with request ``req`` dropped (each op's registry entry decides how)."""
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


def _smaller_configs(config):
    """Simpler geometry first (one DCP rank, no kernel-block split), then configs
    with one limit lowered (validity checked by the caller)."""
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
    yield dict(fields, num_blocks=2)  # the smallest pool first, then one at a time
    for name in ("num_blocks", "max_num_reqs", "max_num_blocks_per_req",
                 "max_num_batched_tokens"):
        if fields[name] > 1:
            yield dict(fields, **{name: fields[name] - 1})
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
    """Each request dropped with every op that mentions it."""
    for req in _added(ops):
        yield _without_req(ops, req)


def _fold_requests(ops: list[dict]):
    """Each request dropped with its work folded onto another request (three
    one-token requests of a four-token batch become one request of four)."""
    reqs = _added(ops)
    for req in reqs:
        for into in reqs:
            if into != req:
                folded = _folded(ops, req, into)
                if folded is not None:
                    yield folded


def _drop_chunks(ops: list[dict]):
    """Delta debugging's complements: aligned chunks of half the trace, then a
    quarter, ... down to pairs, last chunk first.  The last op (the one that
    fails: a shrunk candidate is cut there) is never dropped — without it the
    trace passes, and the replay would only prove it."""
    body, last = ops[:-1], ops[-1:]
    size = len(body) // 2
    while size >= 2:
        for start in range((len(body) - 1) // size * size, -1, -size):
            yield body[:start] + body[start + size:] + last
        size //= 2


def _drop_singles(ops: list[dict]):
    """Single ops, last first (but the failing last op); then sliding pairs (two
    swaps only cancel out together)."""
    body, last = ops[:-1], ops[-1:]
    for i in reversed(range(len(body))):
        yield body[:i] + body[i + 1:] + last
    for start in range(len(body) - 2, -1, -1):
        yield body[:start] + body[start + 2:] + last


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
                yield ops[:i] + [dict(without_recorded(op),
                                      prefix=[r, min(n, order[r])])] + ops[i + 1:]
        order[op["req"]] = op["prompt_len"]


def _merge_adjacent(ops: list[dict]):
    """Adjacent ops merged into one (their registry entry: two steps become one)."""
    for i in range(len(ops) - 1):
        merge = spec_of(ops[i]).merge
        merged = merge(ops[i], ops[i + 1]) if merge is not None else None
        if merged is not None:
            yield ops[:i] + [merged] + ops[i + 2:]


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
            yield ops[:i] + [dict(without_recorded(op), num_new_tokens=n)] + rest


def _narrow_ops(ops: list[dict]):
    """Each op's simpler variants (its registry entry)."""
    for i, op in enumerate(ops):
        for simpler in spec_of(op).narrow(op):
            yield ops[:i] + [simpler] + ops[i + 1:]


# Cheap, large cuts first: chunks (a replay stops at the failure, and a chunk cut
# early leaves a short trace), then requests, single ops, folds, merges, narrowing.
PASSES = (_drop_chunks, _drop_requests, _drop_singles, _fold_requests, _resource_prefixes,
          _merge_allocations, _merge_adjacent, _narrow_ops)


def _candidates(ops: list[dict]):
    """Every candidate of every pass, in pass order (what one round tries)."""
    for make in PASSES:
        yield from make(ops)


def legalize(config, ops: list[dict]) -> list[dict]:
    """``ops`` minus every op the reference refuses in sequence."""
    from harness.core.ops.scheduler import without_recorded

    runner = reference_runner(config)
    kept = []
    for op in ops:
        try:
            apply_op(runner, without_recorded(op))
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
    if cfg.allocator != "engine":
        return None
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

    try:
        _CACHE[0] = SnapshotCache.for_target(target, device) if USE_CACHE else None
    except (TargetUnavailable, ValueError):  # the first replay reports it
        _CACHE[0] = None
    try:
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
            while True:  # a pass restarts on its own candidates after each improvement
                if replays >= MAX_REPLAYS:
                    return best, replays
                found = None
                for ops in make(best.ops):
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
                        break
                if found is None:
                    break
                best, improved_any = found, True
                plain = as_trace_allocator(best)  # the manager out, when it did nothing
                if plain is not None and replays < MAX_REPLAYS:
                    replays += 1
                    if _fails(plain, invariant, faults, target, device) is not None:
                        best = plain
    ops = renumber(best.ops)
    if ops != best.ops and legalize(best.config, ops) == ops:
        replays += 1
        cand = Trace(best.config, ops, best.expect, best.meta)
        if _fails(cand, invariant, faults, target, device) is not None:
            best = cand
    return best, replays


def _shrink_config(best, invariant, faults, target, device, replays):
    """Simpler geometry and lower limits, the ops unchanged; returns (best, replays)."""
    for _ in range(MAX_PASSES):  # smaller configs: the trace must stay legal unchanged
        for fields in _smaller_configs(best.config):
            if replays >= MAX_REPLAYS:
                return best, replays
            try:
                config = RunnerConfig.from_json(fields)
            except ConfigError:
                continue
            if config == best.config:
                continue
            if legalize(config, best.ops) != best.ops:
                continue
            replays += 1
            cand = Trace(config, best.ops, best.expect, best.meta)
            if _fails(cand, invariant, faults, target, device) is not None:
                best = cand
                break
        else:
            break
    return best, replays
