"""Every corpora trace replayed: passes on the fixed gpu_impl, and reproduces its
``expect`` (invariant and op index) with ``meta.faults`` switched on.

Seed traces tell the upstream bugs' stories (see each trace's ``meta.story``).
"""

import dataclasses
from pathlib import Path

import pytest

from harness.core.session import replay
from harness.core.trace import load
from harness.core.invariants import structural_ids

CORPORA = Path(__file__).resolve().parents[2] / "corpora"
from tests.conftest import corpus_traces  # noqa: E402
TRACES = corpus_traces()
IDS = [str(p.relative_to(CORPORA)) for p in TRACES]


def test_corpora_exist():
    assert any(p.parent.name == "seeds" for p in TRACES)
    assert (CORPORA / "canary" / "null-block-nan.json") in TRACES


@pytest.mark.parametrize("path", TRACES, ids=IDS)
def test_trace_passes_on_fixed_implementation(path):
    verdict = replay(load(path))
    assert verdict.violation is None, verdict.violation.line()


@pytest.mark.parametrize("path", [p for p in TRACES if load(p).faults], ids=[
    i for i, p in zip(IDS, TRACES) if load(p).faults])
def test_trace_reproduces_expect_with_its_faults(path):
    trace = load(path)
    verdict = replay(trace, trace.faults)
    assert verdict.violation is not None, "fault did not reproduce"
    assert verdict.matches(trace.expect), (verdict.violation.line(), trace.expect)


def test_canary_must_fail():
    """If this passes silently, the pipeline (kernels, invariants, replay) is blind."""
    trace = load(CORPORA / "canary" / "null-block-nan.json")
    assert replay(trace, trace.faults).violation.invariant == "NULL_BLOCK_FINITE"


def test_seed000_consequence_is_caught_downstream():
    """Seed 000's real damage, not only its structural cause: with VACATED_ROWS_ZERO
    and MATCHES_REFERENCE ignored, the stale row still shows up as the dummy run's
    NaN Mamba state written into the loading request's block (NO_STALE_WRITE), and
    without that check as the loaded state destroyed (LOADED_BLOCKS_INTACT)."""
    trace = load(CORPORA / "seeds" / "seed000-stale-row-mamba-into-loading-request.json")
    skip = set(structural_ids()) | {"MATCHES_REFERENCE"}
    v = replay(trace, trace.faults, skip=skip).violation
    assert (v.invariant, trace.ops[v.op_index]["op"], v.group) == ("NO_STALE_WRITE", "dummy_run", 1)
    v = replay(trace, trace.faults, skip=skip | {"NO_STALE_WRITE"}).violation
    assert v.invariant == "LOADED_BLOCKS_INTACT" and "req 2" in v.detail


def test_seed001_consequence_reaches_a_real_request():
    """Seed 001's user-visible failure: the null block's NaN leaks into the next real
    request's attention output (0 * NaN = NaN at masked positions)."""
    trace = load(CORPORA / "seeds" / "seed001-idle-rank-dummy-nan-into-null-block.json")
    v = replay(trace, trace.faults,
               skip={"NULL_BLOCK_FINITE", "NO_STALE_WRITE", "MATCHES_REFERENCE"}).violation
    assert v.invariant == "ATTENTION_FINITE" and trace.ops[v.op_index]["op"] == "step"


def test_seed000_v2_consequence_is_caught_downstream():
    """V2 half of seed 000: without DUMMY_TABLES_ZERO (and the catch-all), the stale
    input rows show up as NaN Mamba state written into request 2's loaded block."""
    trace = load(CORPORA / "seeds" / "seed000-v2-dummy-tables-stale.json")
    v = replay(trace, trace.faults, skip={"DUMMY_TABLES_ZERO", "MATCHES_REFERENCE"}).violation
    assert (v.invariant, trace.ops[v.op_index]["op"]) == ("NO_STALE_WRITE", "dummy_run")
    assert "owned by req 2" in v.detail


def test_late_accepted_counts_consequence_is_the_state_column_read():
    """The accepted-count race's damage, not only the row buffer: without the
    structural checks, request 1's next spec step starts from the state column
    of its rejected tokens (the state index its kernel read differs)."""
    trace = load(CORPORA / "seeds" / "accepted-counts-land-after-condense.json")
    v = replay(trace, trace.faults, skip=set(structural_ids())).violation
    assert (v.invariant, v.op_index) == ("MATCHES_REFERENCE", 5), v.line()
    assert "state_indices[1]" in v.detail


def test_completed_counts_consequence_is_the_state_column_read():
    """Steps in flight: a completed step's counts landing by dispatch-time row are
    flagged at the completion, and their damage at the next spec step: request 2
    starts from the state column of tokens it rejected."""
    trace = load(CORPORA / "seeds" / "completed-counts-land-by-row.json")
    assert replay(trace).violation is None
    v = replay(trace, trace.faults, skip=set(structural_ids())).violation
    assert (v.invariant, trace.ops[v.op_index]["op"]) == ("MATCHES_REFERENCE", "spec_step")
    assert "state_indices[1][0]" in v.detail


def test_narrow_row_overrun_consequence_is_another_requests_kv():
    """A slot-mapping load unbounded by a narrow row's width: request 0's
    positions past its one-block row land on request 1's positions 0-1 (the
    next row's entry), which request 1 reads in the same step; bounded, the
    same trace passes every invariant."""
    trace = load(CORPORA / "vllm" / "v1-narrow-row-slot-mapping-overrun.json")
    for runner in ("v1", "v2"):
        t = dataclasses.replace(trace, config=dataclasses.replace(trace.config, runner=runner))
        assert replay(t, []).violation is None
        v = replay(t, ["slot-mapping-row-unguarded"]).violation
        assert (v.invariant, v.op_index, v.group, v.block) == ("NO_STALE_WRITE", 3, 1, 4), v.line()
        assert "owned by req 1" in v.detail
        v = replay(t, ["slot-mapping-row-unguarded"], skip={"NO_STALE_WRITE"}).violation
        assert v.invariant == "MATCHES_REFERENCE", v.line()


def test_resumed_blocks_consequence_is_a_write_into_the_next_owner():
    """Preemption: a resumed request whose new block ids were appended to its old
    ones recomputes into the blocks it gave back — request 1's now."""
    trace = load(CORPORA / "seeds" / "resumed-blocks-appended.json")
    v = replay(trace, trace.faults, skip={"MATCHES_REFERENCE"}).violation
    assert (v.invariant, trace.ops[v.op_index]["op"]) == ("NO_STALE_WRITE", "step"), v.line()
    assert "owned by req 1" in v.detail


def test_all_mode_boundary_state_is_judged_where_it_is_restored():
    """All mode's boundary state written off the block grid: the block's state is
    what the invariants judge, not only the differential check — a later request's
    hit restores it (PREFIX_CONTENT); the fixed kernel writes the block's end state."""
    trace = load(CORPORA / "seeds" / "mamba-all-boundary-on-chunk-grid.json")
    assert replay(trace).violation is None
    v = replay(trace, trace.faults, skip={"MATCHES_REFERENCE"}).violation
    assert (v.invariant, trace.ops[v.op_index]["op"], v.group) == ("PREFIX_CONTENT", "admit", 1)


def test_all_mode_short_chunk_conv_state_is_judged_on_the_shared_block():
    """A short prefill chunk's conv state stored through the block it read: the
    shared cached block changes (CACHED_BLOCKS_IMMUTABLE), and the next hit on it
    restores the wrong state (PREFIX_CONTENT)."""
    trace = load(CORPORA / "seeds" / "mamba-short-chunk-conv-to-source.json")
    assert replay(trace).violation is None
    v = replay(trace, trace.faults, skip={"MATCHES_REFERENCE"}).violation
    assert (v.invariant, trace.ops[v.op_index]["op"], v.block) == ("CACHED_BLOCKS_IMMUTABLE",
                                                                   "step", 1)
    v = replay(trace, trace.faults, skip={"MATCHES_REFERENCE", "CACHED_BLOCKS_IMMUTABLE"}).violation
    assert (v.invariant, trace.ops[v.op_index]["op"]) == ("PREFIX_CONTENT", "admit")


def test_align_spec_stale_accepted_count_reads_an_unwritten_column():
    """The migration before the forward without the accepted count's reset: the
    kernel reads its initial state from a speculative column past the moved
    state (the rows it reads differ from the reference's); the fixed runner
    reads the moved state at offset 0."""
    trace = load(CORPORA / "seeds" / "mamba-align-spec-accepted-not-reset.json")
    assert replay(trace).violation is None
    v = replay(trace, trace.faults).violation
    assert (v.invariant, trace.ops[v.op_index]["op"]) == ("MATCHES_REFERENCE", "spec_step")
    assert v.detail.startswith("state_indices[1]"), v.line()


def test_align_spec_completed_block_keeps_the_state_at_its_end():
    """The copy after the forward without the accepted-token bias: the block the
    accepted tokens complete keeps the state after the step's first token —
    the state kept in the pool differs, not only metadata."""
    trace = load(CORPORA / "seeds" / "mamba-align-spec-postprocess-bias-dropped.json")
    assert replay(trace).violation is None
    v = replay(trace, trace.faults).violation
    assert (v.invariant, trace.ops[v.op_index]["op"]) == ("MATCHES_REFERENCE", "spec_step")
    assert v.detail.startswith("mamba_state[1] block"), v.line()
