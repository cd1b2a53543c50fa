"""Trace-level shrinking: make a failing trace shorter while it keeps failing the
same invariant.

Hypothesis shrinks the draws of its state machine; this works on traces, so it
also serves traces from elsewhere.  Passes, repeated until none helps (bounded):

1. drop one request with every op that mentions it;
2. drop single ops, last first;
3. narrow each step: drop scheduled requests, lower token counts.

Each candidate is repaired before it is replayed: ops that became illegal
(a step of a request no longer added, a block no longer free) are dropped, by
a dry run through the reference.  Deterministic: candidates are tried in a
fixed order.
"""

from __future__ import annotations

import copy

from reference import OpError, ReferenceV1Runner

from .session import replay
from .trace import Trace, apply_op

MAX_PASSES = 200  # accepted improvements; each restarts the candidate list
MAX_REPLAYS = 400


def _mentions(op: dict, req: int) -> bool:
    if op["op"] == "step":
        return any(r == req for r, _ in op["scheduled"])
    return op.get("req") == req


def _without_req(ops: list[dict], req: int) -> list[dict]:
    out = []
    for op in ops:
        if op["op"] == "step":
            sched = [s for s in op["scheduled"] if s[0] != req]
            if sched:
                out.append(dict(op, scheduled=sched))
        elif not _mentions(op, req):
            out.append(op)
    return out


def _candidates(ops: list[dict]):
    reqs = sorted({op["req"] for op in ops if op["op"] == "add"})
    for req in reqs:
        yield _without_req(ops, req)
    for i in reversed(range(len(ops))):
        yield ops[:i] + ops[i + 1:]
    for i, op in enumerate(ops):
        if op["op"] == "step":
            sched = op["scheduled"]
            for k in range(len(sched)):
                if len(sched) > 1:
                    yield ops[:i] + [dict(op, scheduled=sched[:k] + sched[k + 1:])] + ops[i + 1:]
                if sched[k][1] > 1:
                    smaller = copy.deepcopy(sched)
                    smaller[k][1] = 1
                    yield ops[:i] + [dict(op, scheduled=smaller)] + ops[i + 1:]
        if op["op"] == "dummy_run" and op["num_tokens"] > op["num_reqs"]:
            yield ops[:i] + [dict(op, num_tokens=op["num_tokens"] - 1)] + ops[i + 1:]


def legalize(config, ops: list[dict]) -> list[dict]:
    """``ops`` minus every op the reference refuses in sequence."""
    runner = ReferenceV1Runner(config)
    kept = []
    for op in ops:
        try:
            apply_op(runner, op)
        except OpError:
            continue
        kept.append(op)
    return kept


def shrink(trace: Trace, invariant: str, faults=(), target: str = "gpu_impl",
           device: str | None = None) -> tuple[Trace, int]:
    """Shortest trace found that still fails ``invariant``; returns (trace, replays)."""
    best = trace
    replays = 0
    seen: set[str] = set()
    for _ in range(MAX_PASSES):
        improved = False
        for ops in _candidates(best.ops):
            if replays >= MAX_REPLAYS:
                return best, replays
            ops = legalize(best.config, ops)
            key = repr(ops)
            if ops == best.ops or key in seen:
                continue
            seen.add(key)
            cand = Trace(best.config, ops, best.expect, best.meta)
            replays += 1
            verdict = replay(cand, faults, target, device)
            if verdict.violation is not None and verdict.violation.invariant == invariant:
                best = Trace(best.config, ops[:verdict.ops_run], best.expect, best.meta)
                improved = True
                break
        if not improved:
            return best, replays
    return best, replays
