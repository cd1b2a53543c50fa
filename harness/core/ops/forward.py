"""Forward ops: ``step`` (a real batch) and ``dummy_run`` (an idle rank's padded
fake batch).

Modelled on ``execute_model`` and ``_dummy_run`` of vLLM's model runners
(``vllm/v1/worker/gpu_model_runner.py``, ``vllm/v1/worker/gpu/model_runner.py``):
a step schedules any subset of the live requests (prefill chunks and decodes
mixed, or one token each so FULL graphs apply) and is padded to a capture
size by the runner; a dummy run carries a garbage (NaN) payload over
``num_reqs`` rows and ``num_tokens`` tokens, as an idle data-parallel rank
does to stay in lockstep.
"""

from __future__ import annotations

import copy

import numpy as np
from reference.payload import POSITION_MAX

from harness.core.ops import CUDAGRAPH_MODE, INT, OpSpec, Size, register

MODES = ("FULL", "PIECEWISE", "NONE")  # draw order: FULL first, shrinking prefers it


def _room(m, req: int) -> int:
    """Tokens ``req`` may run in one step: its blocks' room; with speculative
    decoding a decode runs at most 1 + k, a prefill chunk stops at the prompt."""
    r = m.ledger.requests[req]
    room = min(r.capacity_tokens(m.cfg), POSITION_MAX + 1) - r.num_computed_tokens
    k = m.cfg.num_speculative_tokens
    if k:  # and blocks for the drafter's k lookahead tokens (up to max_model_len)
        if r.capacity_tokens(m.cfg) < m.cfg.max_model_len:
            room = min(room, r.capacity_tokens(m.cfg) - r.num_computed_tokens - k)
        room = min(room, 1 + k if r.is_decode() else r.prompt_len - r.num_computed_tokens)
    return room


def _fitting(m, req: int, most: int):
    """Token counts 1..``most`` that ``req`` may run in one step, lazily (align
    mode allows only chunks ending on Mamba block boundaries, in a column
    holding a state block: :meth:`reference.Ledger.align_problem`)."""
    r = m.ledger.requests[req]
    problem = m.ledger.align_problem
    return (n for n in range(1, most + 1)
            if problem(r, r.num_computed_tokens, n, step=True) is None)


def _sizes(m, req: int, most: int) -> list[int]:
    """Every token count :func:`_fitting` allows (a step's draw picks one)."""
    return list(_fitting(m, req, most))


def _fits(m, req: int, most: int) -> bool:
    """Does some token count fit (a precondition: stops at the first; outside
    align and all modes, 1 always does)?"""
    return next(_fitting(m, req, most), None) is not None


def _hit_not_run(m, req: int) -> bool:
    """``req`` was admitted with a prefix-cache hit and has not run a step since."""
    r = m.ledger.requests[req]
    return r.num_cached_tokens > 0 and not r.stepped


def _onboards_first(m, req: int) -> bool:
    """Does the draw leave ``req`` to an onboard before its first step?  An
    engine whose connector finds a new request's prompt blocks in the host tier
    loads them before scheduling it (vLLM's scheduler asks the connector for
    external tokens at admission); a trace may still step it."""
    if not m.cfg.host_blocks or not m.swarm.weight("onboard_begin"):
        return False
    from harness.core.ops.transfer import _onboardable

    return not m.ledger.requests[req].landed and req in _onboardable(m)


def _steppable(m) -> list[int]:
    """Live requests that can run a step now (once per machine state where the
    machine keeps one: ``step``'s and ``spec_step``'s preconditions and draws)."""
    def now():
        busy = ({r for reqs in m.ledger.steps_in_flight for r in reqs}
                if m.cfg.num_speculative_tokens else ())  # waits for its accepted count
        budget = m.cfg.max_num_batched_tokens
        return [r for r in m.ledger.live() if not m.ledger.loads_in_flight(m.ledger.requests[r])
                and r not in busy and (room := _room(m, r)) > 0 and not _onboards_first(m, r)
                and _fits(m, r, min(room, budget))]

    per_state = getattr(m, "per_state", None)
    return per_state("steppable", now) if per_state is not None else now()


def _draw_step(m, data) -> dict:
    cands = _steppable(m)
    most = min(len(cands), m.cfg.max_num_batched_tokens)
    if m.swarm.whole_batch(data):  # every steppable request (in a drawn order)
        reqs = data.permutation(cands)[:most]
    elif m.swarm.boundary_eighths:  # a batch size at a padding boundary, when one fits
        k = m.swarm.size(data, 1, most, m.cfg, m.session.reference.last_forward, "num_reqs")
        reqs = data.permutation(cands)[:k]
    else:
        reqs = data.unique_sample(cands, 1, most)
    # A request admitted with a prefix hit runs in the next step, as in vLLM's
    # scheduler, which admits a waiting request as part of the step it first
    # runs in: what its hit left (cached KV, a restored Mamba state) is read
    # then.  Not always (a draw of 0 in 0..3, which Hypothesis favours): other
    # interleavings stay, a hit request preempted or removed before it runs.
    # Only hit requests: leading every new request broke up the uniform decode
    # batches padding bugs need (tried as the branch s10-pending-first; docs/search-power.md).
    hits = [r for r in cands if _hit_not_run(m, r) and r not in reqs]
    if hits and data.integer(0, 3) > 0:
        reqs = (hits + reqs)[:most]
    budget = m.cfg.max_num_batched_tokens - len(reqs)
    decode_only = m.swarm.decode(data)  # 1 + k tokens each: FULL graphs apply
    if decode_only and m.cfg.num_speculative_tokens and data.boolean():
        # With a drafter, half the decode batches are not uniform: a decode's 1
        # to 1 + k tokens, any token count for a request still in its prompt.
        decode_only = False
    q = m.cfg.uniform_query_len  # vLLM's uniform decode query length: 1 + k
    scheduled = []
    chunk_rules = m.cfg.mamba_cache_mode != "none"
    for req in reqs:
        if chunk_rules:  # only chunks Mamba prefix caching schedules (align: 1 only sometimes)
            sizes = _sizes(m, req, 1 + min(_room(m, req) - 1, budget))
            if not sizes:
                continue
            # A uniform decode batch: 1 + k tokens where the request may run them
            # (a decode verifies its drafts), else its shortest legal chunk.
            n = max((s for s in sizes if s <= q), default=sizes[0]) if decode_only \
                else data.choice(sizes)
        else:
            most = 1 + min(_room(m, req) - 1, budget)
            n = min(q, most) if decode_only else data.integer(1, most)
        budget -= n - 1
        scheduled.append([req, n])
    if not scheduled:  # align mode: no legal chunk within the budget; the first alone
        req = reqs[0]
        scheduled.append([req, data.choice(_sizes(
            m, req, min(_room(m, req), m.cfg.max_num_batched_tokens)))])
    mode = data.choice(m.swarm.modes)
    return {"op": "step", "scheduled": scheduled, "cudagraph_mode": mode}


def _step_without(op: dict, req: int) -> dict | None:
    sched = [s for s in op["scheduled"] if s[0] != req]
    return dict(op, scheduled=sched) if sched else None


def _step_rename(op: dict, req, block) -> dict:
    return dict(op, scheduled=[[req(r), n] for r, n in op["scheduled"]])


def _narrow_step(op: dict):
    sched = op["scheduled"]
    for k in range(len(sched)):
        if len(sched) > 1:
            yield dict(op, scheduled=sched[:k] + sched[k + 1:])
    if op["cudagraph_mode"] != "NONE":
        yield dict(op, cudagraph_mode="NONE")


def _step_sizes(op: dict) -> list[Size]:
    """Each scheduled request's token count (keyed by the request)."""
    def make(k):
        def at(n):
            sched = copy.deepcopy(op["scheduled"])
            sched[k][1] = n
            return dict(op, scheduled=sched)
        return at
    return [Size(f"req {r}", n, 1, make(k)) for k, (r, n) in enumerate(op["scheduled"])]


def _merge_steps(op: dict, nxt: dict) -> dict | None:
    """Two adjacent steps of the same requests as one (tokens summed per request,
    the second step's mode): a chunked prefill shrunk to a single chunk."""
    if nxt["op"] != "step" or [r for r, _ in op["scheduled"]] != [r for r, _ in nxt["scheduled"]]:
        return None
    summed = [[r, a + b] for (r, a), (_, b) in zip(op["scheduled"], nxt["scheduled"])]
    return dict(nxt, scheduled=summed)


def _fold_step(op: dict, req: int, into: int) -> dict | None:
    """``req``'s tokens scheduled for ``into`` instead (the batch keeps its token
    count, so its padding stays what it was), when both are in this step."""
    sched = {r: n for r, n in op["scheduled"]}
    if req not in sched or into not in sched:
        return None
    return dict(op, scheduled=[[r, n + sched[req] if r == into else n]
                               for r, n in op["scheduled"] if r != req])


def _position_cells(config, r, g: int, pos: np.ndarray) -> dict:
    """{block: (first offset, end offset)} of ``pos`` (this rank's DCP share) in
    ``r``'s blocks of attention group ``g``."""
    local, col, off = config.kept_slots(g, pos)
    cells = {}
    for c in sorted(set(col[local].tolist())):
        offs = off[local & (col == c)]
        cells[r.blocks[g][c]] = (int(offs.min()), int(offs.max()) + 1)
    return cells


def permit_forward(config, ledger, scheduled: list, accepted: list | None = None):
    """Cells a real step may write: each scheduled request's new positions in its
    own attention blocks and its own Mamba state blocks (every state column);
    with a drafter, the draft layer's cells at those positions and at the
    lookahead positions its further passes write (within the request's blocks).
    scheduled: [[req, num_tokens]]; accepted: as ``Ledger.sampled``."""
    cells = {g: {} for g in range(len(config.groups))}
    kept = ledger.sampled(scheduled, accepted)
    draft = config.draft_group
    if draft is not None:
        cells[("draft", draft)] = {}
    for (req, n), a in zip(scheduled, kept):
        r = ledger.requests[req]
        pos = np.arange(r.num_computed_tokens, r.num_computed_tokens + n)
        for g in config.attention_groups:
            cells[g].update(_position_cells(config, r, g, pos))
        for g in config.mamba_groups:
            cells[g].update({b: None for b in r.blocks[g]})
        if draft is not None:
            last = r.num_computed_tokens + (a if r.is_decode() else n) - 1
            ahead = np.arange(last + 1, min(last + config.num_speculative_tokens,
                                            config.max_model_len))
            for b, span in _position_cells(config, r, draft, np.union1d(pos, ahead)).items():
                cells[("draft", draft)][b] = span
    return cells, frozenset(req for req, _ in scheduled)


def _permit_step(config, ledger, op):
    return permit_forward(config, ledger, op["scheduled"])


register(OpSpec(
    name="step", summary="one real forward over scheduled (req, num_tokens), padded by the runner",
    fields={"scheduled": {"type": "array", "minItems": 1,
                          "items": {"type": "array", "items": INT, "minItems": 2, "maxItems": 2}},
            "cudagraph_mode": CUDAGRAPH_MODE},
    example={"op": "step", "scheduled": [[0, 5], [1, 1]], "cudagraph_mode": "FULL"},
    apply=lambda t, op: t.step([list(x) for x in op["scheduled"]], op["cudagraph_mode"]),
    draw=_draw_step, enabled=lambda m: not m.ledger.steps_in_flight and bool(_steppable(m)),
    requests=lambda op: [r for r, _ in op["scheduled"]], without_request=_step_without,
    rename=_step_rename, narrow=_narrow_step, sizes=_step_sizes, merge=_merge_steps,
    fold=_fold_step, permit=_permit_step,
    forward="real"))


def _draw_dummy(m, data) -> dict:
    cfg, last = m.cfg, m.session.reference.last_forward
    num_reqs = m.swarm.size(data, 1, cfg.max_num_reqs, cfg, last, "num_reqs")
    uniform = m.swarm.decode(data)  # num_tokens == num_reqs * (1 + k): FULL applies
    q = cfg.uniform_query_len
    if uniform and q <= cfg.max_num_batched_tokens:
        num_reqs = min(num_reqs, cfg.max_num_batched_tokens // q)
    num_tokens = num_reqs * q if uniform and q <= cfg.max_num_batched_tokens else m.swarm.size(
        data, num_reqs, cfg.max_num_batched_tokens, cfg, last, "num_tokens")
    mode = data.choice(m.swarm.modes)
    return {"op": "dummy_run", "num_reqs": num_reqs, "num_tokens": num_tokens,
            "cudagraph_mode": mode}


def _narrow_dummy(op: dict):
    if op["cudagraph_mode"] != "NONE":
        yield dict(op, cudagraph_mode="NONE")


def _dummy_sizes(op: dict) -> list[Size]:
    """Rows (each dropped row takes one token with it), then tokens (at least one a row)."""
    reqs, tokens = op["num_reqs"], op["num_tokens"]
    return [Size("num_reqs", reqs, 1,
                 lambda n: dict(op, num_reqs=n, num_tokens=tokens - (reqs - n))),
            Size("num_tokens", tokens, reqs, lambda n: dict(op, num_tokens=n))]


register(OpSpec(
    name="dummy_run", summary="an idle DP rank's padded fake batch (NaN payload, no real rows)",
    fields={"num_reqs": INT, "num_tokens": INT, "cudagraph_mode": CUDAGRAPH_MODE},
    example={"op": "dummy_run", "num_reqs": 2, "num_tokens": 2, "cudagraph_mode": "FULL"},
    apply=lambda t, op: t.dummy_run(op["num_reqs"], op["num_tokens"], op["cudagraph_mode"]),
    draw=_draw_dummy, narrow=_narrow_dummy, sizes=_dummy_sizes, forward="dummy",
    keeps_ledger=True))  # (V1: every request leaves the batch's rows; no block changes hands)
