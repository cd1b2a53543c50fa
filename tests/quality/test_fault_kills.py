"""Kill rate: every fault in the catalogue, on every runner it applies to, is found
from seed 0 within 200 examples with the geometry drawn per example, named by
an invariant the catalogue expects, and shrunk to at most one op more than its
hand-written trace in corpora/seeds/.

These are the harness's reason to exist: if one of them fails, the fuzzer has
lost the ability to see a bug it was built for.

The seeds' own bugs run in every suite (``SEED_BUGS``: a few seconds each);
the whole catalogue is nightly-sized (up to 200 examples through the Triton
interpreter per fault and runner) and runs with ``pytest -m slow`` (the
nightly workflow; docs/testing.md).  Kill *power* stays in every suite: each
fault's hand-written trace in ``corpora/seeds`` fails the regression suite
when the fault is switched on (``BLOCKFUZZ_FAULTS=ID pytest tests/regression``).
"""

from pathlib import Path

import pytest

from gpu_impl.faults import CATALOGUE
from harness.core.session import replay
from harness.core.trace import load
from harness.search.fuzz import fuzz
from reference import RunnerConfig
from tests.conftest import installed_engine

SEEDS = Path(__file__).resolve().parents[2] / "corpora" / "seeds"
EXAMPLES = 200


def _hand_written(fault_id):
    paths = sorted(SEEDS.glob("*.json")) + sorted((SEEDS.parent / "sglang").glob("*.json"))
    lengths = [len(t.ops) for t in map(load, paths) if t.faults == [fault_id]]
    assert lengths, f"no hand-written trace for {fault_id} in corpora/seeds (or corpora/sglang)"
    return min(lengths)


# The two upstream bugs this project exists for, found within seconds from seed 0.
SEED_BUGS = {("vacated-row-not-cleared", "v1"), ("dummy-tables-not-zeroed", "v2"),
             ("dummy-slots-not-padded", "v1")}
# Known misses (measured 2026-11-30 after the scheduler side's draws settled: engine
# configs one in two, Mamba prefix caching, sliding windows with prefix caching and a
# drafter): none. Seed 0 is one draw of a lottery #15 is about: each change of the draws
# moved one or two marginal finds. An entry is strict: the test fails once found.
# Measured again 2026-11-30 when runs went in chunks with steering (issue #15): every
# draw moved, and two pinned-runner finds from seed 0 were lost (found on other seeds:
# docs/search-power.md, find-rate tables).
# Measured 2026-12-01 with rows that can hold a hit, config-pair steering and keys per
# group kind: 55 of 55 found from seed 0 (the two misses listed before were both found).
# Measured 2026-12-02 after the host tier's copies were drawn as a connector does them
# (OpSpec.eager) and a new prompt shares any host-tier block: the onboard fault, a
# known miss until then, found from seed 0 on both runners.
# Measured 2026-12-03 after rows narrower than a request and the drafter's uniform
# 1 + k batches were drawn: 74 of 74 found from seed 0. The three 2026-12-03 entries
# in LONGER_SHRINKS describe an earlier draw of that day; narrow rows drawn mostly
# one block wide may shrink shorter now, and the entries stay as bounds.
# Measured 2026-12-03 after Mamba prefix caching's all mode was drawn (half the align
# configs became all-mode ones, and steering followed): 77 of 78 found from seed 0; one
# miss, below, and two longer shrinks (LONGER_SHRINKS).
# Measured 2026-12-03 after align mode with a drafter was drawn, its decodes allocated
# and uniformly scheduled for all 1 + k tokens, and its coverage features narrowed to
# the copies that read past the running column: 80 of 82 found from seed 0 (the three
# misses listed before were found). The two misses are one run: V2 seed 0 drew the
# same 200 examples for both faults (11105 steps each).
# Measured 2026-12-03 after an example's ops were drawn from a generator seeded by one
# Hypothesis choice (every op draw moved): only the two known misses were run
# (`-k`); `failed-load-frees-before-siblings` on v2 is now found from seed 0 and left
# the list, `mamba-align-spec-accepted-not-reset` on v2 is still missed. The rest of
# the catalogue was not run on these draws yet (the find-rate table in
# docs/benchmarks.md covers seeds 0..9 with the runner drawn).
# Measured 2026-12-03, the whole kill test on those draws (`-m slow -n 2`, 27 min):
# 78 of 82 found from seed 0; the four misses below. No shrink exceeded its bound.
# The two Mamba align-mode faults with a drafter are the catalogue's weakest finds
# (5 and 7 of seeds 0..9 with the runner drawn, docs/benchmarks.md).
# Measured 2026-12-04 after a frontier example kept the swarm of the example that
# reached its prefix (only the 17 cases whose seed-0 search runs past the first
# 25 examples, where steering starts, and that were near the edge: `-k`): the
# accepted-count fault on v2 is now found from seed 0 and left the list; the
# postprocess-bias fault on v2 and the all-mode chunk-grid fault on v1 are now
# missed from seed 0 (8 and 10 of seeds 0..9 with the runner drawn).
KNOWN_MISSES: dict = {
    ("mamba-align-spec-accepted-not-reset", "v1"): (
        "missed from seed 0 once an example's ops came from a seeded generator "
        "(2026-12-03); found on 8 of seeds 0..9 with the runner drawn (2026-12-04)"),
    ("mamba-align-spec-postprocess-bias-dropped", "v1"): (
        "missed from seed 0 once an example's ops came from a seeded generator "
        "(2026-12-03); found on 8 of seeds 0..9 with the runner drawn (2026-12-04)"),
    ("mamba-align-spec-postprocess-bias-dropped", "v2"): (
        "missed from seed 0 once a frontier example kept its prefix's swarm "
        "(2026-12-04); found on 8 of seeds 0..9 with the runner drawn"),
    ("mamba-all-boundary-on-chunk-grid", "v1"): (
        "missed from seed 0 once a frontier example kept its prefix's swarm "
        "(2026-12-04); found on 10 of seeds 0..9 with the runner drawn (median 36 "
        "examples), and v2 finds it from seed 0"),
    ("onboard-leaves-host-blocks-evictable", "v2"): (
        "missed from seed 0 once an example's ops came from a seeded generator "
        "(2026-12-03); found on 8 of seeds 0..9 with the runner drawn (2026-12-04, "
        "median 90.5 examples), and v1 finds it from seed 0"),
}
# Findings whose shortest form in the geometry seed 0 drew is longer than the hand-written
# trace's (+1): {(fault, runner): (ops allowed beyond the hand-written length, why)}.
LONGER_SHRINKS = {
    ("kernel-block-size-ignored", "v1"): (2, "found (since the draws took the async ops, "
                                             "2026-12-02) through a KV-loaded prefix hit in an "
                                             "engine-allocator config: the two-op form needs a "
                                             "trace-allocator one, which shrinking never "
                                             "switches to"),
    ("kernel-block-size-ignored", "v2"): (2, "found through a prefix hit in a config whose "
                                             "batch budget is one token: the two-op form "
                                             "needs a larger budget, which shrinking never "
                                             "raises"),
    ("slot-mapping-row-unguarded", "v1"): (2, "the shrinker lowers the token budget to 4, "
                                             "below the narrow row's 8 tokens, so the "
                                             "request crosses the row in three steps "
                                             "(measured 2026-12-03)"),
    ("slot-mapping-row-unguarded", "v2"): (2, "likewise: a budget of 2 tokens against a "
                                             "4-token narrow row, three steps"),
    ("onboard-leaves-host-blocks-evictable", "v1"): (5, "found (since the drafter's uniform "
                                                        "batches moved the draws, 2026-12-03) "
                                                        "in a trace-allocator config: the "
                                                        "request onboards its own prefix after "
                                                        "a preempt / resume, beside a second "
                                                        "request's offload (16 ops); the "
                                                        "engine-allocator form needs a config "
                                                        "shrinking never switches to"),
    ("host-store-evicts-its-own-blocks", "v2"): (2, "found (since all mode's draws moved the "
                                                    "search, 2026-12-03) where the second "
                                                    "offload needs the request's second block "
                                                    "full: one-token decodes fill it, which "
                                                    "shrinking does not merge (13 ops)"),
    ("spec-decodes-split-as-prefills", "v2"): (2, "found (since all mode was drawn, "
                                                  "2026-12-03) through a KV-loaded request's "
                                                  "first verification step, after a second "
                                                  "request's decodes staged the decode "
                                                  "buffer: the load's begin and complete "
                                                  "take two ops more than steps (8 ops)"),
    ("decode-slots-sliced-prefill-first", "v2"): (3, "an align-mode config: its chunk rules "
                                                     "split the prefilling request's prompt "
                                                     "into two allocations, and the decode "
                                                     "row is a prefix hit's request (7 ops)"),
}
# SGLang's faults run on the installed SGLang (the sglang target); a search finds
# them in about a second, so they are not slow — and skip without SGLang.
KILLS = [pytest.param(f, r, id=f"{f}-{r}",
                      marks=(() if (f, r) in SEED_BUGS or r == "sglang"
                             else (pytest.mark.slow,)) + (
                          (pytest.mark.xfail(strict=True, reason=KNOWN_MISSES[(f, r)]),)
                          if (f, r) in KNOWN_MISSES else ()))
         for f in sorted(CATALOGUE) for r in CATALOGUE[f].runners]


@pytest.mark.parametrize("fault_id, runner", KILLS)
def test_fault_killed_from_seed_0(fault_id, runner):
    fault = CATALOGUE[fault_id]
    target = "sglang" if runner == "sglang" else "gpu_impl"
    if target == "sglang":
        installed_engine("sglang")
    result = fuzz(None, seed=0, examples=EXAMPLES, faults=[fault_id], runner=runner,
                  target=target, profile="ci", found_by="tests/quality")
    assert result.violation is not None, f"{fault_id} survived {EXAMPLES} examples"
    assert result.examples <= EXAMPLES
    assert fault.caught_by(result.violation.invariant), result.violation.line()
    extra = LONGER_SHRINKS.get((fault_id, runner), (1, ""))[0]
    assert len(result.trace.ops) <= _hand_written(fault_id) + extra, result.trace.dumps()
    # The shrunk trace is a real reproducer: fails with the fault, passes without.
    assert replay(result.trace, [fault_id], target).matches(result.trace.expect)
    assert replay(result.trace, [], target).violation is None


@pytest.mark.slow  # the stateful suite runs the fixed runners in every suite
@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_fixed_implementation_survives_seed_0(runner):
    result = fuzz(None, seed=0, examples=60, profile="ci", runner=runner)
    assert result.violation is None, result.violation.line()
    assert result.steps > 60 * 5  # the machine really ran op sequences


@pytest.mark.slow
def test_default_hybrid_config_kills_v1_seed_faults():
    """The pinned default config (as `--config` would pin it) still kills the seeds' bugs."""
    for fault_id in ("vacated-row-not-cleared", "full-replay-not-restaged",
                     "dummy-slots-not-padded"):
        result = fuzz(RunnerConfig(), seed=0, examples=EXAMPLES, faults=[fault_id],
                      profile="ci")
        assert result.violation is not None and CATALOGUE[fault_id].caught_by(
            result.violation.invariant), fault_id
