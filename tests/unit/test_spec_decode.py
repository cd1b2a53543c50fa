"""Speculative decoding (issue #14): ``spec_step``, multi-column Mamba rows, the drafter.

Each test can fail: the oracle's running column and rejected-token semantics
are checked by value, legality errors by the field they name, and gpu_impl
against the oracle through a replay whose ops reject, re-enter and pad.
"""

import json

import numpy as np
import pytest

from harness.core.ops import REGISTRY
from harness.core.session import replay
from harness.core.trace import Trace, parse
from harness.search.coverage import Tracker
from reference import GroupSpec, OpError, ReferenceV1Runner, RunnerConfig, payload_sum

HYBRID = RunnerConfig(groups=(GroupSpec("attention", 8, 8), GroupSpec("mamba", 16, 16)),
                      num_blocks=12, max_num_reqs=4, max_num_blocks_per_req=2,
                      max_num_batched_tokens=16, reorder_batch_threshold=3,
                      num_speculative_tokens=2)


def _runner() -> ReferenceV1Runner:
    ref = ReferenceV1Runner(HYBRID)
    ref.add(0, [[1, 2], [1, 2, 3]], 1)
    ref.step([[0, 1]], "NONE")
    return ref


def test_a_decode_advances_by_its_accepted_tokens_and_starts_from_their_column():
    ref = _runner()
    ref.step([[0, 3]], "NONE", accepted=[2])  # positions 1, 2, 3; keeps 1 and 2
    r = ref.ledger.requests[0]
    assert r.num_computed_tokens == 3 and r.last_seq_len == 4
    # Column t holds the state after token t of the step: column 1 = positions 0..2.
    state = ref.mamba_state[1]
    assert (state[2] == payload_sum(0, 0, 3, HYBRID.head_size)).all()
    ref.step([[0, 1]], "NONE")  # position 3 again: starts from column 1 (block 2)
    assert int(ref.state_indices[1][0]) == 2
    assert (state[1] == payload_sum(0, 0, 4, HYBRID.head_size)).all()


def test_the_drafter_writes_its_own_layer_at_lookahead_positions():
    ref = _runner()
    draft = ref.draft_kv_cache[0]
    # After the prompt's step (position 0 kept), pass 1 wrote position 1: block 1, offset 1.
    assert (draft[1, 1] == ref.kv_cache[0][1, 0] + 4 + 0.5).all()  # payload(0, 1) + 0.5
    assert (ref.kv_cache[0][1, 1] == -7.0).all()  # the target layer never wrote it


@pytest.mark.parametrize("scheduled, accepted, field", [
    ([[0, 2]], [0], "scheduled[0][2]"),  # a decode keeps at least one token
    ([[0, 2]], [3], "scheduled[0][2]"),  # and at most what it ran
    ([[0, 4]], None, "scheduled[0][1]"),  # 1 + k = 3 tokens at most
    ([[0, 14]], None, "scheduled[0][1]"),  # no room for the lookahead tokens
])
def test_illegal_spec_steps_name_the_field(scheduled, accepted, field):
    ref = _runner()
    with pytest.raises(OpError) as e:
        ref.step(scheduled, "NONE", accepted=accepted)
    assert e.value.field == field


def test_spec_step_needs_a_drafter():
    ref = ReferenceV1Runner(RunnerConfig())
    ref.add(0, [[1], [2]], 1)
    with pytest.raises(OpError) as e:
        ref.step([[0, 1]], "NONE", accepted=[1])
    assert "num_speculative_tokens" in str(e.value)


OPS = [
    {"op": "add", "req": 0, "blocks": [[1, 2], [1, 2, 3]], "prompt_len": 2},
    {"op": "add", "req": 1, "blocks": [[3, 4], [4, 5, 6]], "prompt_len": 5},
    {"op": "step", "scheduled": [[0, 2], [1, 3]], "cudagraph_mode": "NONE"},
    {"op": "spec_step", "scheduled": [[0, 3, 1], [1, 2, 1]], "cudagraph_mode": "PIECEWISE"},
    {"op": "spec_step", "scheduled": [[1, 3, 2]], "cudagraph_mode": "NONE"},  # 0 leaves
    {"op": "spec_step", "scheduled": [[0, 3, 3], [1, 1, 1]], "cudagraph_mode": "NONE"},
    {"op": "dummy_run", "num_reqs": 2, "num_tokens": 2, "cudagraph_mode": "FULL"},
    {"op": "step", "scheduled": [[0, 1], [1, 1]], "cudagraph_mode": "FULL"},
    {"op": "remove", "req": 0},
    {"op": "step", "scheduled": [[1, 1]], "cudagraph_mode": "FULL"},
]


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_gpu_impl_agrees_with_the_oracle_through_rejections_reentry_and_padding(runner):
    config = RunnerConfig.from_json(dict(HYBRID.to_json(), runner=runner,
                                         reorder_batch_threshold=3 if runner == "v1" else 0))
    trace = parse(json.loads(Trace(config, OPS).dumps()), "spec.json")
    verdict = replay(trace)
    assert verdict.violation is None and verdict.ops_run == len(OPS), verdict.violation


def test_spec_step_is_a_forward_the_coverage_tracker_sees():
    assert REGISTRY["spec_step"].forward == "real"
    ref = _runner()
    tracker = Tracker(HYBRID)
    op = {"op": "spec_step", "scheduled": [[0, 3, 1]], "cudagraph_mode": "NONE"}
    tracker.before(op, ref.ledger, ref)
    ref.step([[0, 3]], "NONE", accepted=[1])
    hits = tracker.after(op, ref)
    assert "spec-tokens-rejected" in hits and "forward:NONE:v1:mamba" in hits
    assert np.all(ref.state_columns[:1] == 0)


def test_a_row_whose_last_occupant_kept_another_count_is_a_coverage_feature():
    """``spec-row-count-foreign``: the hand-written trace of PR #45100's race (a
    count copied by batch row lands on the request that moved there) hits it at
    its last spec step, where request 1 runs in row 0 after request 0 kept 3
    tokens there; the same steps without the remove (nobody moves) do not."""
    from pathlib import Path

    from harness.core.session import Session
    from harness.core.trace import load

    trace = load(Path(__file__).parents[2] / "corpora" / "seeds"
                 / "accepted-counts-land-after-condense.json")

    def hits(ops):
        session, tracker, out = Session(trace.config), Tracker(trace.config), []
        for op in ops:
            tracker.before(op, session.ledger, session.reference)
            assert session.apply(op) == []
            out.append("spec-row-count-foreign" in tracker.after(op, session.reference))
        return out

    assert hits(trace.ops) == [False] * (len(trace.ops) - 1) + [True]
    # A new request's count is 1 before it runs: one added into the row another
    # request left with 3 is in the same situation (a late copy would land on it).
    new = trace.ops[:3] + [
        {"op": "spec_step", "scheduled": [[0, 3, 1], [1, 3, 3]], "cudagraph_mode": "NONE"},
        {"op": "remove", "req": 1},
        {"op": "add", "req": 2, "blocks": [[5, 7], [8, 9, 10]], "prompt_len": 5},
        {"op": "step", "scheduled": [[0, 1], [2, 5]], "cudagraph_mode": "NONE"}]
    assert hits(new)[-1]
    stay = [op for op in trace.ops if op["op"] != "remove"][:-1] + [
        {"op": "spec_step", "scheduled": [[0, 1, 1], [1, 1, 1]], "cudagraph_mode": "NONE"}]
    assert not any(hits(stay))
