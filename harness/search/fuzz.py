"""The fuzz driver: Hypothesis search from a seed, then trace shrinking.

``fuzz()`` is a pure function of (seed, config, target, faults, examples): the
machine is seeded with ``hypothesis.seed``, there is no example database and no
deadline, so the same call finds the same minimal trace and the same bytes.
With a time budget it runs fixed-size chunks of examples with seeds derived
from the base seed until the budget is spent (each chunk is deterministic; how
many chunks fit is what the budget decides, and the report says which ran).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field

from hypothesis import Phase, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.stateful import run_state_machine_as_test

from reference import RunnerConfig

from harness.search import profiles
from harness.core.invariants import Violation
from harness.search.machine import InvariantViolationError, make_machine
from harness.core.session import replay
from harness.search.shrink import shrink
from harness.core.trace import Trace

CHUNK_EXAMPLES = 25


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

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.seconds if self.seconds else 0.0


def chunk_seed(seed: int, k: int) -> int:
    """Seed of the k-th chunk of a time-budgeted run (k=0 is the seed itself)."""
    if k == 0:
        return seed
    return int.from_bytes(hashlib.sha256(f"{seed}:{k}".encode()).digest()[:4], "big")


def _search(config, seed, examples, faults, target, device, profile, stats, runner):
    machine = make_machine(config, faults, target, device, stats, runner)
    hypothesis_seed(seed)(machine)
    # Hypothesis's own shrinker re-runs hundreds of examples through the Triton
    # interpreter; our trace shrinker (harness/shrink.py) needs tens of replays.
    run_settings = settings(profiles.get(profile), max_examples=examples, derandomize=False,
                            phases=[Phase.explicit, Phase.generate])
    try:
        run_state_machine_as_test(machine, settings=run_settings)
    except InvariantViolationError as e:
        return e
    return None


def fuzz(config: RunnerConfig | None, seed: int = 0, examples: int | None = 200,
         faults=(), target: str = "gpu_impl", device: str | None = None,
         time_budget_s: float | None = None, profile: str = "dev",
         shrink_trace: bool = True, found_by: str = "blockfuzz fuzz",
         runner: str | None = None) -> FuzzResult:
    """Search for a violation; returns a :class:`FuzzResult` (never raises on one).

    config None draws the geometry per example (``runner`` pins the runner);
    the failing trace records the config it ran on.
    """
    stats: dict = {}
    start = time.perf_counter()
    error, chunks = None, []
    if time_budget_s is None:
        chunks.append(seed)
        error = _search(config, seed, examples, faults, target, device, profile, stats, runner)
    else:
        for k in range(1_000_000):
            if time.perf_counter() - start >= time_budget_s:
                break
            s = chunk_seed(seed, k)
            chunks.append(s)
            error = _search(config, s, CHUNK_EXAMPLES, faults, target, device, profile, stats,
                            runner)
            if error is not None:
                break
    result = FuzzResult(seed, stats.get("examples", 0), stats.get("steps", 0),
                        time.perf_counter() - start, chunk_seeds=chunks)
    if error is None:
        return result
    meta = {"seed": seed, "faults": sorted(faults), "found_by": found_by,
            "target": target}
    if target == "vllm":
        from harness.targets.vllm import installed_version

        meta["vllm_version"] = installed_version()
    trace = Trace(error.config, error.ops, meta=meta)
    replays = 0
    verdict = replay(trace, faults, target, device)
    assert verdict.violation is not None, "a found violation must replay"
    if shrink_trace:
        shrink_start = time.perf_counter()
        trace, replays = shrink(trace, verdict.violation.invariant, faults, target, device)
        verdict = replay(trace, faults, target, device)
        result.shrink_seconds = time.perf_counter() - shrink_start
    trace.expect = {"verdict": "fail", "invariant": verdict.violation.invariant,
                    "op_index": verdict.violation.op_index}
    if target == "vllm":  # what `replay --check-expect --target vllm` checks
        trace.meta["expect_by_release"] = {trace.meta["vllm_version"]: dict(trace.expect)}
    result.violation, result.trace = verdict.violation, trace
    result.hypothesis_ops, result.shrink_replays = len(error.ops), replays
    result.seconds = time.perf_counter() - start
    return result


def signature(trace: Trace) -> str:
    """Dedup key of a finding: invariant, offending op, length, and a digest of the
    trace's *shape* — runner config (geometry), faults and the sequence of op
    kinds — so the same bug found with other block ids or from another seed gets
    the same name, and different bugs (other faults or geometry) never share one."""
    e = trace.expect
    op = trace.ops[e["op_index"]]["op"] if e.get("op_index", -1) >= 0 else "start"
    shape = json.dumps({"config": trace.config.to_json(), "faults": sorted(trace.faults),
                        "ops": [o["op"] for o in trace.ops]}, sort_keys=True)
    digest = hashlib.sha256(shape.encode()).hexdigest()[:8]
    return f"{e.get('invariant', 'pass')}-{op}-{len(trace.ops)}ops-{digest}"
