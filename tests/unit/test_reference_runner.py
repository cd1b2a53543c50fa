"""reference/runner.py: slot mapping with PAD tail, padding, dummy runs — by hand."""

import numpy as np
import pytest

from reference import (NULL_BLOCK_ID, PAD_SLOT_ID, SENTINEL, OpError, ReferenceV1Runner,
                       RunnerConfig, dispatch, payload, payload_sum)


@pytest.fixture
def runner():
    r = ReferenceV1Runner(RunnerConfig())
    r.add(0, [[1, 2], [3]], 5)
    r.add(1, [[4], [5]], 2)
    return r


def test_dispatch_pads_to_capture_sizes():
    cfg = RunnerConfig()
    assert dispatch(cfg, 3, 3, True, "FULL") == ("FULL", 4, 4)
    assert dispatch(cfg, 2, 3, False, "FULL") == ("PIECEWISE", 4, 2)
    assert dispatch(cfg, 4, 5, False, "PIECEWISE") == ("PIECEWISE", 8, 4)
    assert dispatch(cfg, 4, 9, False, "FULL") == ("NONE", 9, 4)  # beyond capture sizes
    assert dispatch(cfg, 1, 1, True, "NONE") == ("NONE", 1, 1)


def test_dispatch_with_a_drafter_takes_uniform_batches_of_1_plus_k_tokens():
    """vLLM's uniform_decode_query_len: with k drafts a uniform batch runs 1 + k
    tokens per row, replays the FULL graph of a size that is a multiple of 1 + k
    (rows size // (1 + k)); one-token decodes are not uniform there; the
    drafter's single-token passes dispatch with a query length of 1."""
    cfg = RunnerConfig(num_speculative_tokens=1, reorder_batch_threshold=2)
    assert cfg.full_capture_sizes == (2, 4, 8) and cfg.full_graph_rows(8) == 4
    assert dispatch(cfg, 2, 4, True, "FULL") == ("FULL", 4, 2)
    assert dispatch(cfg, 3, 6, True, "FULL") == ("FULL", 8, 4)
    assert dispatch(cfg, 2, 3, False, "FULL") == ("PIECEWISE", 4, 2)
    assert dispatch(cfg, 3, 3, True, "FULL", query_len=1) == ("FULL", 4, 4)  # the drafter
    k2 = RunnerConfig(num_speculative_tokens=2, reorder_batch_threshold=3)
    assert k2.full_capture_sizes == () and dispatch(k2, 2, 6, True, "FULL")[0] == "PIECEWISE"
    r = ReferenceV1Runner(cfg)
    r.add(0, [[1, 2], [1, 2]], 1)
    r.add(1, [[3, 4], [3, 4]], 1)
    r.step([[0, 1], [1, 1]], "FULL", accepted=[1, 1])  # prefills: no prior state
    assert r.last_forward.cudagraph_mode == "PIECEWISE"
    r.step([[0, 1], [1, 1]], "FULL", accepted=[1, 1])  # one-token decodes: not uniform
    assert r.last_forward.cudagraph_mode == "PIECEWISE"
    r.step([[0, 2], [1, 2]], "FULL", accepted=[2, 1], placeholders=[0, 1])
    f = r.last_forward
    assert (f.cudagraph_mode, f.num_reqs_padded, f.num_tokens_padded) == ("FULL", 2, 4)
    assert r.ledger.requests[1].num_computed_tokens == 3  # the placeholder not kept


@pytest.mark.parametrize("item, field", [
    ([0, 2, 2, 1], "scheduled[0][2]"),  # a placeholder accepted
    ([0, 1, 1, 1], "scheduled[0][3]"),  # a decode of 1 token, not 1 + k
    ([0, 2, 1, 2], "scheduled[0][3]"),  # no real token
    ([0, 2, 1, -1], "scheduled[0][3]"),
])
def test_placeholder_drafts_are_refused_with_the_field_named(item, field):
    cfg = RunnerConfig(num_speculative_tokens=1, reorder_batch_threshold=2)
    r = ReferenceV1Runner(cfg)
    r.add(0, [[1, 2], [1, 2]], 1)
    r.step([[0, 1]], "NONE", accepted=[1])
    with pytest.raises(OpError) as e:
        r.step([item[:2]], "FULL", accepted=[item[2]], placeholders=[item[3]])
    assert e.value.field == field, str(e.value)
    r2 = ReferenceV1Runner(cfg)
    r2.add(0, [[1, 2], [1, 2]], 4)
    with pytest.raises(OpError, match="prefills"):  # a prompt chunk has no placeholders
        r2.step([[0, 2]], "FULL", accepted=[0], placeholders=[1])


def test_step_slot_mapping_and_pad_tail(runner):
    runner.step([[0, 5], [1, 2]], "PIECEWISE")  # 7 tokens -> padded to 8
    sm = runner.slot_mapping[0]
    assert sm[:7].tolist() == [4, 5, 6, 7, 8, 16, 17]  # block 1 -> 4.., block 2 -> 8, block 4 -> 16
    assert sm[7] == PAD_SLOT_ID
    kv = runner.kv_cache[0]
    assert np.array_equal(kv[1], payload(0, np.arange(4), 4))
    assert np.array_equal(kv[2, 0], payload(0, np.array([4]), 4)[0])
    assert (kv[2, 1:] == SENTINEL).all()  # untouched cells keep the free-block pattern
    assert np.array_equal(runner.mamba_state[1][3], payload_sum(0, 0, 5, 4))
    assert np.array_equal(runner.attn_out[0][1], payload_sum(1, 0, 2, 4))


def test_full_decode_pads_rows_to_null_block_state(runner):
    """Rows padded for a FULL graph write their state to the null block (scratch)."""
    runner.step([[0, 5], [1, 2]], "NONE")
    runner.add(2, [[6], [7]], 1)
    runner.step([[0, 1], [1, 1], [2, 1]], "FULL")  # 2's first token: a prefill, no decode
    assert runner.last_forward.cudagraph_mode == "PIECEWISE"
    assert runner.is_prefilling[:3].tolist() == [False, False, True]
    runner.step([[0, 1], [1, 1], [2, 1]], "FULL")  # 3 decodes -> FULL size 4
    lf = runner.last_forward
    assert (lf.cudagraph_mode, lf.num_reqs_padded, lf.num_tokens_padded) == ("FULL", 4, 4)
    assert runner.state_indices[1].tolist() == [3, 5, 7, NULL_BLOCK_ID]
    assert runner.slot_mapping[0][3] == PAD_SLOT_ID
    assert runner.seq_lens[:4].tolist() == [7, 4, 2, 0]
    assert runner.is_prefilling[:4].tolist() == [False] * 4


def test_dummy_run_pads_everything_and_touches_only_scratch(runner):
    runner.step([[0, 5], [1, 2]], "NONE")
    kv_before = runner.kv_cache[0].copy()
    state_before = runner.mamba_state[1].copy()
    runner.dummy_run(3, 3, "FULL")  # padded to 4 rows/tokens
    assert (runner.slot_mapping[0][:4] == PAD_SLOT_ID).all()
    assert np.array_equal(runner.kv_cache[0], kv_before, equal_nan=True)
    # All requests left the batch, rows are zero, so state went to the null block.
    assert (runner.state_indices[1][:4] == NULL_BLOCK_ID).all()
    assert np.array_equal(runner.mamba_state[1][1:], state_before[1:], equal_nan=True)
    # The null block is scratch: the dummy rows' NaN and the padded row's empty
    # query (written last here) both land there.
    assert runner.query_start_loc[3] == runner.query_start_loc[4] == 3
    assert (runner.rows.req_ids == -1).all()


def test_unscheduled_requests_leave_the_batch_but_keep_state(runner):
    runner.step([[0, 5], [1, 2]], "NONE")
    runner.step([[1, 1]], "NONE")  # request 0 not scheduled
    assert runner.rows.req_ids.tolist() == [1, -1, -1, -1]
    runner.step([[0, 1]], "NONE")  # comes back with its counters
    assert runner.rows.row_of(0) is not None
    assert runner.ledger.requests[0].num_computed_tokens == 6


def test_illegal_op_changes_nothing(runner):
    before = runner.rows.block_table[0].copy()
    with pytest.raises(OpError):
        runner.step([[0, 1], [7, 1]], "FULL")
    with pytest.raises(OpError) as e:
        runner.dummy_run(3, 2, "FULL")
    assert e.value.field == "num_tokens"
    with pytest.raises(OpError) as e:
        runner.step([[0, 1]], "EAGER")
    assert e.value.field == "cudagraph_mode"
    assert np.array_equal(before, runner.rows.block_table[0])


def test_v1_dummy_run_builds_metadata_only_for_full(runner):
    """vLLM's V1 _dummy_run: without FULL no attention metadata, so the Mamba
    mixers and attention layers skip; the KV writes (slot mappings) still run."""
    runner.step([[0, 5], [1, 2]], "NONE")
    seq_lens, state = runner.seq_lens.copy(), runner.mamba_state[1].copy()
    runner.dummy_run(3, 3, "PIECEWISE")
    assert runner.last_forward.metadata is False
    assert (runner.slot_mapping[0][:4] == PAD_SLOT_ID).all()  # PAD-filled all the same
    assert np.array_equal(runner.seq_lens, seq_lens)  # not re-staged: nothing reads it
    assert np.array_equal(runner.mamba_state[1], state, equal_nan=True)
    runner.dummy_run(3, 3, "FULL")
    assert runner.last_forward.metadata is True and runner.seq_lens[:4].tolist() == [1, 1, 1, 0]


def _regions_cases():
    import itertools

    # (scheduled, computed, prompt) per row covering the four regions and their mixes
    kinds = {"decode": (1, 3, 2), "short": (1, 1, 4), "long": (3, 2, 8), "first": (2, 0, 2)}
    for n in range(1, 5):
        for combo in itertools.product(kinds, repeat=n):
            yield [kinds[k] for k in combo]


def test_decode_first_reorder_shell_agrees_with_the_reference():
    """gpu_impl's swap-cycle reorder and the reference's permutation (two
    implementations of vLLM's reorder_batch_to_split_decodes_and_prefills) leave
    the same order for every mix of regions up to four rows."""
    from types import SimpleNamespace

    from gpu_impl.runner_shell_v1 import RunnerShellV1
    from reference.runner import reorder_decode_first

    for rows in _regions_cases():
        sched, comp, prompt = (list(x) for x in zip(*rows))
        want = reorder_decode_first(sched, comp, prompt, 1)
        batch = SimpleNamespace(req_ids=np.arange(len(rows)), num_computed_tokens=np.array(comp),
                                num_prompt_tokens=np.array(prompt))

        def swap(i, j, b=batch):
            for arr in (b.req_ids, b.num_computed_tokens, b.num_prompt_tokens):
                arr[[i, j]] = arr[[j, i]]
        batch.swap_states = swap
        shell = SimpleNamespace(input_batch=batch)
        RunnerShellV1._reorder(shell, dict(enumerate(sched)), 1)
        assert batch.req_ids.tolist() == want, (rows, want)
        regions = [0 if (c > 0 and s <= 1 and c >= p) else 1 if (c > 0 and s <= 1) else
                   2 if c > 0 else 3 for s, c, p in (rows[i] for i in want)]
        assert regions == sorted(regions)  # decodes first, first chunks last


def test_v1_reorder_puts_decodes_first():
    cfg = RunnerConfig(reorder_batch_threshold=1)
    r = ReferenceV1Runner(cfg)
    r.add(0, [[1], [2]], 4)
    r.add(1, [[3], [4]], 1)
    r.step([[0, 2], [1, 1]], "NONE")  # both first chunks: order kept
    assert r.rows.req_ids[:2].tolist() == [0, 1]
    r.step([[0, 2], [1, 1]], "NONE")  # 0 extends its prompt, 1 decodes: 1 moves first
    assert r.rows.req_ids[:2].tolist() == [1, 0]
    assert RunnerConfig.from_json(cfg.to_json()) == cfg
    assert "reorder_batch_threshold" not in RunnerConfig().to_json()  # old traces' bytes
