"""The fuzz driver: Hypothesis search from a seed, then trace shrinking.

``fuzz()`` is a pure function of (seed, config, target, faults, examples): the
machine is seeded with ``hypothesis.seed``, there is no example database and no
deadline, so the same call finds the same minimal trace and the same bytes.
A run goes in chunks, each a Hypothesis run of its own with a seed derived
from the base seed (:func:`chunk_seed`): ``examples`` in chunks of
:data:`STEER_CHUNK`, between which the steering pool
(:mod:`harness.search.steer`) is updated; with a time budget, chunks of
:data:`CHUNK_EXAMPLES` until the budget is spent (each chunk is deterministic;
how many chunks fit is what the budget decides, and the report says which ran).
The budget is checked between chunks: a run stops after the chunk in flight,
so it may overrun S by up to one chunk of :data:`CHUNK_EXAMPLES` examples.

``examples`` in a :class:`FuzzResult` counts examples that ran to completion;
``coverage`` counts the behaviour-coverage features (:mod:`harness.search.coverage`)
the search hit (shrinking excluded);
examples Hypothesis started and discarded (it ran out of its choice buffer)
are counted apart in ``discarded``.  Ctrl-C raises :class:`FuzzInterrupted`
carrying what was done: the chunk seeds run, and the unshrunk trace when a
violation was found before shrinking finished.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import dataclass, field

from hypothesis import seed as hypothesis_seed

from reference import RunnerConfig

from harness.search import profiles
from harness.core.invariants import Violation
from harness.search import steer
from harness.search.machine import BlockFuzzMachine, InvariantViolationError, make_machine, run
from harness.core.session import replay
from harness.search.shrink import renumber, shrink
from harness.core.trace import Trace

CHUNK_EXAMPLES = 25  # examples per chunk of a time-budgeted run
STEER_CHUNK = 25  # examples per Hypothesis run of an --examples run (steering updates between)


@dataclass
class FuzzResult:
    """What a fuzz run saw. ``trace`` is the shrunk failing trace, or None."""

    seed: int
    examples: int
    steps: int
    seconds: float
    violation: Violation | None = None
    trace: Trace | None = None
    hypothesis_ops: int = 0
    shrink_replays: int = 0
    shrink_seconds: float = 0.0
    chunk_seeds: list = field(default_factory=list)
    discarded: int = 0
    search_seconds: float = 0.0
    coverage: dict = field(default_factory=dict)  # feature -> ops that hit it
    coverage_examples: dict = field(default_factory=dict)  # feature -> examples that hit it
    prefixes: dict = field(default_factory=dict)  # feature -> (config, shortest ops prefix)

    @property
    def steps_per_s(self) -> float:
        """Search throughput: steps per second of search (shrinking excluded)."""
        return self.steps / self.search_seconds if self.search_seconds else 0.0


class FuzzInterrupted(KeyboardInterrupt):
    """Ctrl-C during :func:`fuzz`; ``result`` is what was done by then.

    ``result.chunk_seeds`` lists the chunks started (the last one was cut
    short); ``shrinking`` is True when a violation had been found, and then
    ``result.trace`` is the unshrunk failing trace with its ``expect`` set.
    """

    def __init__(self, result: FuzzResult, shrinking: bool):
        super().__init__("interrupted")
        self.result, self.shrinking = result, shrinking


class _CountEndings:
    """Mixin: teardown (run from Hypothesis's ``finally``) also counts how the
    example ended — ``completed``, ``failed`` (a violation) or ``discarded``
    (Hypothesis stopped it: its choice buffer ran out) — in ``stats``."""

    def teardown(self) -> None:
        ended = sys.exc_info()[0]
        super().teardown()
        if ended is None:
            key = "completed"
        elif issubclass(ended, InvariantViolationError):
            key = "failed"
        else:
            key = "discarded"
        self.stats[key] = self.stats.get(key, 0) + 1


def chunk_seed(seed: int, k: int) -> int:
    """Seed of the k-th chunk of a run (k=0 is the seed itself)."""
    if k == 0:
        return seed
    return int.from_bytes(hashlib.sha256(f"{seed}:{k}".encode()).digest()[:4], "big")


def _search(config, seed, examples, faults, target, device, profile, stats, runner,
            seed_corpus=(), base=BlockFuzzMachine, steering=True):
    # The steering pool is frozen for one Hypothesis run: its data tree needs
    # the same choices to draw the same way within a run (harness.search.steer).
    stats["steer_pool"] = steer.rarest(stats)
    stats["steer_configs_pool"] = steer.rarest_configs(stats)
    stats["steer_frontier_pool"] = steer.frontier(stats)
    bound = make_machine(config, faults, target, device, stats, runner,
                         seed_corpus=seed_corpus, base=base, steering=steering, salt=seed)
    machine = type("BlockFuzzMachine_counted", (_CountEndings, bound), {})
    hypothesis_seed(seed)(machine)
    try:
        run(machine, profiles.search_settings(profile, examples))
    except InvariantViolationError as e:
        return e
    return None


def _run_chunks(config, seed, examples, faults, target, device, time_budget_s, profile,
                stats, runner, chunks: list, seed_corpus=(), base=BlockFuzzMachine,
                steering=True):
    """The search: ``examples`` in chunks of :data:`STEER_CHUNK` (the steering
    pool is updated between them), or budgeted chunks of :data:`CHUNK_EXAMPLES`;
    appends each chunk's seed to ``chunks`` as it starts (chunk k's seed is
    :func:`chunk_seed`). Returns the first violation error or None."""
    start = time.perf_counter()
    left = examples
    for k in range(1_000_000):
        if time_budget_s is None and left <= 0 or \
                time_budget_s is not None and time.perf_counter() - start >= time_budget_s:
            break
        n = min(STEER_CHUNK, left) if time_budget_s is None else CHUNK_EXAMPLES
        chunks.append(chunk_seed(seed, k))
        error = _search(config, chunks[-1], n, faults, target, device, profile,
                        stats, runner, seed_corpus, base, steering)
        if error is not None:
            return error
        if time_budget_s is None:
            left -= n
    return None


def _found_trace(error, seed, faults, target, device, found_by) -> tuple[Trace, object]:
    """The unshrunk failing trace (``expect`` set) and its replayed verdict."""
    meta = {"seed": seed, "faults": sorted(faults), "found_by": found_by, "target": target}
    if target == "vllm":
        from harness.targets.vllm import installed_version

        meta["vllm_version"] = installed_version()
    elif target == "sglang":
        from harness.targets.sglang_release import installed_version as sglang_version

        meta["sglang_version"] = sglang_version()
    trace = Trace(error.config, error.ops, meta=meta)
    verdict = replay(trace, faults, target, device, record=True)
    trace.ops = verdict.ops  # the target's choices as this replay made them
    assert verdict.violation is not None, "a found violation must replay"
    _set_expect(trace, verdict)
    return trace, verdict


def _set_expect(trace: Trace, verdict) -> None:
    trace.expect = {"verdict": "fail", "invariant": verdict.violation.invariant,
                    "op_index": verdict.violation.op_index}
    if trace.meta.get("target") == "vllm":  # what `replay --check-expect --target vllm` checks
        from harness.targets.vllm import target_mode

        trace.meta["expect_by_release"] = {trace.meta["vllm_version"]: dict(
            trace.expect, mode=target_mode(trace.config)[0])}
    elif trace.meta.get("target") == "sglang":
        trace.meta["expect_by_release"] = {trace.meta["sglang_version"]: dict(trace.expect)}


def fuzz(config: RunnerConfig | None, seed: int = 0, examples: int | None = 200,
         faults=(), target: str = "gpu_impl", device: str | None = None,
         time_budget_s: float | None = None, profile: str = "dev",
         shrink_trace: bool = True, found_by: str = "blockfuzz fuzz",
         runner: str | None = None, seed_corpus=(), stats: dict | None = None) -> FuzzResult:
    """Search for a violation; returns a :class:`FuzzResult` (never raises on one).

    config None draws the geometry per example (``runner`` pins the runner);
    the failing trace records the config it ran on.  seed_corpus: traces an
    example may start from (:mod:`harness.search.corpus`; those this run
    cannot express are left out).  Raises
    :class:`FuzzInterrupted` on Ctrl-C, carrying what was done.  stats: a dict the
    search counts into as it goes (``completed`` examples, ``steps``), for a
    progress display to read from another thread; None: a private one.
    """
    from harness.search.corpus import usable

    seed_corpus = usable(seed_corpus, config, runner, target)
    stats = {} if stats is None else stats
    start = time.perf_counter()
    chunks: list = []
    result = FuzzResult(seed, 0, 0, 0.0, chunk_seeds=chunks)

    def settle():
        result.examples = stats.get("completed", 0) + (result.violation is not None)
        result.discarded = stats.get("discarded", 0)
        result.steps = stats.get("steps", 0)
        result.coverage = dict(stats.get("coverage", {}))
        result.coverage_examples = dict(stats.get("coverage_examples", {}))
        result.prefixes = dict(stats.get("prefixes", {}))
        result.seconds = time.perf_counter() - start

    try:
        error = _run_chunks(config, seed, examples, faults, target, device, time_budget_s,
                            profile, stats, runner, chunks, seed_corpus)
    except KeyboardInterrupt:
        settle()
        result.search_seconds = result.seconds
        raise FuzzInterrupted(result, False) from None
    result.search_seconds = time.perf_counter() - start
    if error is None:
        settle()
        return result
    trace, verdict = _found_trace(error, seed, faults, target, device, found_by)
    result.violation, result.trace = verdict.violation, trace
    result.hypothesis_ops = len(error.ops)
    settle()
    if shrink_trace:
        shrink_start = time.perf_counter()
        try:
            small, result.shrink_replays = shrink(trace, verdict.violation.invariant, faults,
                                                  target, device)
        except KeyboardInterrupt:
            settle()
            raise FuzzInterrupted(result, True) from None
        verdict = replay(small, faults, target, device, record=True)
        small.ops = verdict.ops
        _set_expect(small, verdict)
        result.violation, result.trace = verdict.violation, small
        result.shrink_seconds = time.perf_counter() - shrink_start
    settle()
    return result


def signature(trace: Trace) -> str:
    """Dedup key of a finding: ``INVARIANT-op-Nops-digest``.

    The digest covers the runner config (geometry), the faults, the target and
    every op with requests and blocks renumbered by first use — so a finding
    found again from another seed, whose shrunk trace is the same up to ids,
    gets the same name, and two findings that share a name have the same
    shrunk trace (two different bugs are never merged).
    """
    e = trace.expect
    op = trace.ops[e["op_index"]]["op"] if e.get("op_index", -1) >= 0 else "start"
    shape = json.dumps({"config": trace.config.to_json(), "faults": sorted(trace.faults),
                        "target": trace.meta.get("target", "gpu_impl"),
                        "ops": renumber(trace.ops)}, sort_keys=True)
    digest = hashlib.sha256(shape.encode()).hexdigest()[:8]
    return f"{e.get('invariant', 'pass')}-{op}-{len(trace.ops)}ops-{digest}"
