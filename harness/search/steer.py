"""Steering within a run: examples that start where the run's rarest situations began.

A seed corpus (:mod:`harness.search.corpus`) carries what earlier campaigns
learned into a run; this does the same *inside* one run, as coverage-guided
fuzzers keep every input that reached something rare and spend more of the
search on it.  After each example the machine records, per behaviour-coverage
feature *and runner* (``spec-row-moved@v1``: a situation on V1 is not the same
situation on V2 — a V1-only bug needs it there), how many examples hit it
and the shortest op prefix (with its config) that first hit it.  An example
then draws (from the seed, like every other choice) whether to start from one
of the prefixes of the :data:`RAREST` least-hit keys, in
:data:`SHARE_EIGHTHS` of examples: it takes that config, applies the prefix as
its first ops and draws on from there.  Each re-use hits the key again, so
its count grows and the energy moves on to the next rarest — a situation hit
once gets a few continuations, not the whole run.

Determinism: the records are a function of the examples before, which are a
function of the seed, so a run stays a pure function of (seed, corpus).  A
failing example records the prefix as its first ops; the trace shrinker drops
what the failure does not need.
"""

from __future__ import annotations

from harness.core.trace import Trace

SHARE_EIGHTHS = 2  # of examples start from a rare prefix (once there is one)
RAREST = 6  # keys whose prefixes an example may start from
MAX_PREFIX_OPS = 40  # longer prefixes are not kept (an example's own ops come after)


def key(feature: str, runner: str) -> str:
    """The steering key of a feature hit on ``runner``."""
    return f"{feature}@{runner}"


def learn(stats: dict, config, ops: list[dict], first: dict) -> None:
    """Record one finished example: ``first`` is {feature: op index of its first
    hit}; ``stats["steer"]`` maps key -> [examples that hit it, config, shortest
    prefix ops]."""
    table = stats.setdefault("steer", {})
    for f, i in first.items():
        k = key(f, config.runner)
        entry = table.get(k)
        if entry is None:
            entry = table[k] = [0, None, None]
        entry[0] += 1
        if i + 1 <= MAX_PREFIX_OPS and (entry[2] is None or len(entry[2]) > i + 1):
            entry[1], entry[2] = config, [dict(op) for op in ops[:i + 1]]


def rarest(stats: dict) -> list[Trace]:
    """Prefixes of the :data:`RAREST` least-hit keys (ties by key), as traces."""
    table = stats.get("steer", {})
    keys = sorted((k for k, e in table.items() if e[2] is not None),
                  key=lambda k: (table[k][0], k))[:RAREST]
    return [Trace(table[k][1], table[k][2], {"verdict": "pass"}, {"steer_key": k})
            for k in keys]
