"""harness/invariants.py on hand-built observations: each check sees its bug and
stays quiet on the fixed state (positive and negative space)."""

import dataclasses

import numpy as np
import pytest

from harness.core import invariants as inv
from harness.targets import ReferenceTarget
from reference import RunnerConfig


@pytest.fixture
def ref():
    r = ReferenceTarget(RunnerConfig())
    r.add(0, [[1, 2], [3]], 5)
    r.add(1, [[4], [5]], 2)
    return r


def test_vacated_rows_zero(ref):
    obs = ref.observe()
    assert inv.check_vacated_rows_zero(obs, 0, "x", ref.config) == []
    obs.host_req_ids[1] = -1  # row 1 vacated but still holds ids
    (v,) = inv.check_vacated_rows_zero(obs, 3, "condense", ref.config)[:1]
    assert (v.invariant, v.row, v.block, v.op_index) == ("VACATED_ROWS_ZERO", 1, 4, 3)


def test_null_block_finite(ref):
    obs = ref.observe()
    assert inv.check_null_block_finite(obs, 0, "x") == []
    obs.kv_cache[0][0, 2, 1] = np.nan
    (v,) = inv.check_null_block_finite(obs, 0, "dummy_run")
    assert v.block == 0 and "offsets [2]" in v.detail


def test_no_stale_write_uses_the_ledger_not_the_kernel(ref):
    op = {"op": "step", "scheduled": [[0, 2]], "cudagraph_mode": "NONE"}
    permit = inv.permit_for(ref.config, ref.ledger, op)
    before = ref.observe()
    after = ref.observe()
    after.kv_cache[0][1, 1] = 9.0  # req 0, position 1: allowed
    assert inv.check_no_stale_write(before, after, permit, 0, "step") == []
    after.kv_cache[0][1, 3] = 9.0  # req 0's block but position 3 is not being written
    (v,) = inv.check_no_stale_write(before, after, permit, 0, "step")
    assert v.block == 1 and "offsets [0, 2)" in v.detail
    after = ref.observe()
    after.mamba_state[1][5] = np.nan  # req 1's state: req 1 is not scheduled
    (v,) = inv.check_no_stale_write(before, after, permit, 0, "step")
    assert (v.group, v.block) == (1, 5) and "owned by req 1" in v.detail
    after = ref.observe()
    after.mamba_state[1][0] = np.nan  # the mamba null block is scratch
    assert inv.check_no_stale_write(before, after, permit, 0, "step") == []


def test_loaded_blocks_intact(ref):
    ref.kv_load(0)
    obs = ref.observe()
    assert inv.check_loaded_blocks(ref.config, ref.ledger, obs, 0, "x") == []
    obs.mamba_state[1][3] = np.nan
    (v,) = inv.check_loaded_blocks(ref.config, ref.ledger, obs, 0, "dummy_run")
    assert v.invariant == "LOADED_BLOCKS_INTACT" and v.block == 3


def test_reads_foreign_and_nonfinite(ref):
    ref.step([[0, 5], [1, 2]], "NONE")
    obs = ref.observe()
    assert inv.check_reads(ref.config, ref.ledger, obs, 2, "step") == []
    obs.device_block_table[0][1, 0] = 1  # row 1 (req 1) reads req 0's block
    obs.attn_out[0][1] += 1
    found = inv.check_reads(ref.config, ref.ledger, obs, 2, "step")
    assert found[0].invariant == "NO_FOREIGN_READ" and "owned by req 0" in found[0].detail
    obs.attn_out[0][0] = np.nan
    assert any(v.invariant == "ATTENTION_FINITE" and v.row == 0
               for v in inv.check_reads(ref.config, ref.ledger, obs, 2, "step"))


def test_matches_reference_names_field_and_index(ref):
    ref.step([[0, 5]], "NONE")  # a forward of 5 tokens: slot mapping [0, 5) is compared
    cfg = ref.config
    a, b = ref.observe(), ref.observe()
    assert inv.check_matches_reference(a, b, 0, "x", cfg) == []
    a.slot_mapping[0][7] = 77  # past the forward's tokens: the engine's business
    assert inv.check_matches_reference(a, b, 0, "x", cfg) == []
    a.slot_mapping[0][3] = 77
    (v,) = inv.check_matches_reference(a, b, 0, "step", cfg)
    assert v.detail.startswith("slot_mapping[0][3]")
    a, b = ref.observe(), ref.observe()
    a.mamba_state[1][0] = 5.0  # null block excluded (scratch)
    assert inv.check_matches_reference(a, b, 0, "x", cfg) == []
    # ... unless block 0 is an ordinary state block (mamba_padding pad_slot_no_null)
    no_null = dataclasses.replace(cfg, mamba_padding="pad_slot_no_null")
    (v,) = inv.check_matches_reference(a, b, 0, "x", no_null)
    assert v.detail.startswith("mamba_state[1]") and "block 0" in v.detail, v.detail


def test_matches_reference_names_a_forward_or_draft_rows_that_differ(ref):
    """The last forward and the drafter's rows are compared as tuples first; a
    difference is still named field by field."""
    ref.step([[0, 5]], "NONE")
    cfg = ref.config
    a, b = ref.observe(), ref.observe()
    a.last_forward = dataclasses.replace(a.last_forward,
                                         num_tokens_padded=a.last_forward.num_tokens_padded + 1)
    (v,) = inv.check_matches_reference(a, b, 0, "step", cfg)
    assert v.detail.startswith("last_forward[5]"), v.detail
    a, b = ref.observe(), ref.observe()
    a.last_forward = None
    (v,) = inv.check_matches_reference(a, b, 0, "step", cfg)
    assert v.detail.startswith("last_forward: shape (0,)"), v.detail
    a, b = ref.observe(), ref.observe()
    a.draft_rows, b.draft_rows = (1, 2), (1, 3)
    (v,) = inv.check_matches_reference(a, b, 0, "step", cfg)
    assert v.detail.startswith("draft_rows[1] is 2, reference has 3"), v.detail


def test_graph_addresses(ref):
    obs = ref.observe()
    obs.graph_ptrs = {2: {"state_indices[1]": (0x1000, 0x1000)}}
    assert inv.check_graph_addresses(obs, 0, "x") == []
    obs.graph_ptrs = {2: {"state_indices[1]": (0x1000, 0x2000)}}
    (v,) = inv.check_graph_addresses(obs, 0, "x")
    assert v.invariant == "GRAPH_ADDRESSES_STABLE"


def test_matches_reference_v2_compares_defined_entries_only():
    """V2: a free state index's staged row and device entries past a row's
    num_blocks are undefined by the contract; entries inside are compared."""
    r = ReferenceTarget(RunnerConfig(runner="v2"))
    r.add(0, [[1, 2], [3]], 5)
    r.add(1, [[4], [5]], 2)
    r.step([[1, 1], [0, 1]], "NONE")  # batch row 0 = req 1 (one block), row 1 = req 0
    r.remove(1)
    cfg = r.config
    a, b = r.observe(), r.observe()
    assert inv.check_matches_reference(a, b, 0, "x", cfg) == []
    a.host_block_table[0][1, :] = 9  # req 1's freed state index: overwritten on reuse
    a.host_block_table[0][0, 3] = 9  # past req 0's two blocks
    a.device_block_table[0][0, 1] = 9  # batch row 0 holds req 1's one block only
    assert inv.check_matches_reference(a, b, 0, "x", cfg) == []
    a.device_block_table[0][1, 1] = 9  # req 0's second block: defined
    (v,) = inv.check_matches_reference(a, b, 0, "step", cfg)
    assert v.detail.startswith("device_block_table[0][1, 1]")
    a, b = r.observe(), r.observe()
    a.host_block_table[0][0, 1] = 9  # a live row's block: defined
    (v,) = inv.check_matches_reference(a, b, 0, "step", cfg)
    assert v.detail.startswith("block_table[0][0, 1]")
