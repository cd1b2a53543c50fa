"""reference/ledger.py: ownership and op legality (OpError names the field)."""

import pytest

from reference import FREE, RESERVED, Ledger, OpError, RunnerConfig


@pytest.fixture
def ledger():
    return Ledger(RunnerConfig())


def test_null_block_is_reserved_and_never_free(ledger):
    assert ledger.owner[0][0] == RESERVED
    assert 0 not in ledger.free_blocks(0)


def test_add_remove_frees_blocks_for_reuse(ledger):
    ledger.add(0, [[1, 2], [3]], 5)
    assert ledger.owner[0][[1, 2]].tolist() == [0, 0]
    assert ledger.remove(0) == [[1, 2], [3]]
    assert ledger.owner[0][1] == FREE
    ledger.add(1, [[2, 1], [3]], 1)  # freed blocks go to a new request
    assert ledger.owner[1][3] == 1


@pytest.mark.parametrize("blocks, prompt_len, field", [
    ([[0], [1]], 1, "blocks[0][0]"),        # null block
    ([[1, 1], [2]], 1, "blocks[0][1]"),     # twice
    ([[1], [2, 3]], 1, "blocks[1]"),        # mamba takes one block
    ([[1], [2]], 5, "prompt_len"),          # more than 1 block of 4 holds
    ([[12], [2]], 1, "blocks[0][0]"),       # out of range
    ([[1]], 1, "blocks"),                   # wrong group count
])
def test_add_rejects_with_field(ledger, blocks, prompt_len, field):
    with pytest.raises(OpError) as e:
        ledger.add(0, blocks, prompt_len)
    assert e.value.field == field
    assert not ledger.requests  # nothing changed


def test_block_owned_twice_is_rejected(ledger):
    ledger.add(0, [[1], [2]], 1)
    with pytest.raises(OpError) as e:
        ledger.add(1, [[1], [3]], 1)
    assert e.value.field == "blocks[0][0]" and "not free" in str(e.value)


def test_step_checks_capacity_budget_and_liveness(ledger):
    ledger.add(0, [[1], [2]], 4)
    with pytest.raises(OpError, match="room for 4"):
        ledger.check_step([[0, 5]])
    with pytest.raises(OpError, match="not live"):
        ledger.check_step([[9, 1]])
    with pytest.raises(OpError, match="twice"):
        ledger.check_step([[0, 1], [0, 1]])
    ledger.step([[0, 4]])
    assert ledger.requests[0].num_computed_tokens == 4 and ledger.requests[0].stepped


def test_kv_load_only_before_first_step(ledger):
    ledger.add(0, [[1, 2], [3]], 6)
    ledger.kv_load(0)
    assert ledger.requests[0].loaded and ledger.requests[0].num_computed_tokens == 6
    with pytest.raises(OpError):
        ledger.kv_load(0)


def test_request_ids_are_not_reused(ledger):
    ledger.add(0, [[1], [2]], 1)
    ledger.remove(0)
    with pytest.raises(OpError, match="already used"):
        ledger.add(0, [[1], [2]], 1)


def test_kv_sharing_is_one_pool_for_every_group():
    """kv_sharing: a block id is held by one (request, group) at a time; an id
    taken in one group is taken in all, and freeing gives it back to all."""
    from reference import GroupSpec

    cfg = RunnerConfig(kv_sharing=True, groups=(GroupSpec("attention", 4, 4),
                                                GroupSpec("mamba", 16, 16)))
    ledger = Ledger(cfg)
    with pytest.raises(OpError) as e:  # one id in two groups of one request
        ledger.add(0, [[1], [1]], 3)
    assert e.value.field == "blocks[1][0]" and "one pool" in str(e.value)
    ledger.add(0, [[1], [2]], 3)
    with pytest.raises(OpError):  # another request's Mamba block as attention
        ledger.add(1, [[2], [3]], 3)
    assert ledger.num_free(0) == ledger.num_free(1) == cfg.num_blocks - 3
    ledger.remove(0)
    ledger.add(1, [[2], [1]], 3)  # the freed Mamba block now holds attention KV
    assert ledger.owner[0][2] == ledger.owner[1][2] == 1


@pytest.mark.parametrize("fields, field", [
    ({"kv_sharing": True, "groups": [{"kind": "attention", "block_size": 4}]}, "kv_sharing"),
    ({"kv_sharing": True, "num_speculative_tokens": 1}, "kv_sharing"),
    ({"kv_sharing": True, "num_blocks": 2}, "num_blocks"),
    ({"kv_sharing": "true"}, "kv_sharing"),
    ({"max_model_len": 16, "max_num_blocks_per_req": 8,
      "groups": [{"kind": "attention", "block_size": 8}, {"kind": "attention", "block_size": 4}]},
     "max_num_blocks_per_req"),
    ({"max_model_len": 0}, "max_model_len"),
    ({"mamba_padding": "sink"}, "mamba_padding"),
    ({"mamba_padding": "pad_slot", "groups": [{"kind": "attention", "block_size": 4}]},
     "mamba_padding"),
    ({"mamba_padding": "pad_slot_no_null", "allocator": "engine", "enable_prefix_caching": True},
     "mamba_padding"),
    ({"mamba_padding": "pad_slot_no_null", "kv_sharing": True}, "mamba_padding"),
    ({"kv_cache_dtype": "fp8"}, "kv_cache_dtype"),
    ({"kv_sharing_map": [[0, 1]]}, "kv_sharing_map"),
    ({"kv_sharing": True, "kv_sharing_map": [[1, 0]]}, "kv_sharing_map[0]"),
    ({"kv_sharing": True, "kv_sharing_map": [[0]]}, "kv_sharing_map"),
    ({"kv_sharing": True, "groups": [{"kind": "attention", "block_size": 2},
                                     {"kind": "mamba", "block_size": 16, "conv_size": 3}]},
     "groups[0].block_size"),
    ({"groups": [{"kind": "attention", "block_size": 4, "conv_size": 1}]}, "groups[0].conv_size"),
    ({"kv_cache_dtype": "int8", "kv_sharing": True}, "kv_cache_dtype"),
    # Rows narrower than a request: a later attention group only, narrower than
    # max_model_len, not with the mechanisms not modelled with it yet.
    ({"groups": [{"kind": "attention", "block_size": 4, "max_num_blocks": 2}]},
     "groups[0].max_num_blocks"),
    ({"groups": [{"kind": "attention", "block_size": 4},
                 {"kind": "mamba", "block_size": 16, "max_num_blocks": 1}]},
     "groups[1].max_num_blocks"),
    ({"groups": [{"kind": "attention", "block_size": 4},
                 {"kind": "attention", "block_size": 4, "max_num_blocks": 4}]},
     "groups[1].max_num_blocks"),
    ({"groups": [{"kind": "attention", "block_size": 4},
                 {"kind": "attention", "block_size": 4, "max_num_blocks": 0.5}]},
     "groups[1].max_num_blocks"),
    ({"host_blocks": 2, "groups": [{"kind": "attention", "block_size": 4},
                                   {"kind": "attention", "block_size": 4, "max_num_blocks": 1}]},
     "groups[1].max_num_blocks"),
])
def test_layout_config_errors_name_the_field(fields, field):
    from reference.config import ConfigError

    with pytest.raises(ConfigError) as e:
        RunnerConfig.from_json(fields)
    assert e.value.field == field, str(e.value)


def test_a_narrow_row_keeps_the_positions_it_spans_and_no_more():
    """GroupSpec.max_num_blocks: the group's row is narrower than a request; the
    request holds at most that many of its blocks, a full narrow row sets no
    bound on its length, and a position past the row has no slot."""
    from reference import PAD_SLOT_ID, ReferenceV1Runner

    cfg = RunnerConfig.from_json({"groups": [
        {"kind": "attention", "block_size": 4},
        {"kind": "attention", "block_size": 4, "max_num_blocks": 1}]})
    assert (cfg.max_model_len, cfg.row_tokens(1), cfg.narrow_groups) == (16, 4, [1])
    assert cfg.to_json()["groups"][1]["max_num_blocks"] == 1
    assert RunnerConfig.from_json(cfg.to_json()) == cfg
    ref = ReferenceV1Runner(cfg)
    with pytest.raises(OpError, match=r"blocks\[1\]"):
        ref.add(0, [[1, 2], [3, 4]], 6)  # two blocks in a one-block row
    ref.add(0, [[1, 2], [3]], 6)
    ref.step([[0, 6]], "NONE")
    assert ref.slot_mapping[1][:6].tolist() == [12, 13, 14, 15, PAD_SLOT_ID, PAD_SLOT_ID]
    assert ref.ledger.requests[0].capacity_tokens(cfg) == 8  # group 0's two blocks


def test_max_model_len_sizes_each_attention_row_by_its_block_size():
    """vLLM's InputBatch: cdiv(max_model_len, block_size) columns per group; the
    widest row is max_num_blocks_per_req, filled in when a trace leaves it out."""
    cfg = RunnerConfig.from_json({"max_model_len": 16, "groups": [
        {"kind": "attention", "block_size": 8}, {"kind": "mamba", "block_size": 16},
        {"kind": "attention", "block_size": 4}]})
    assert [cfg.blocks_per_req_max(g) for g in (0, 2)] == [2, 4]
    assert cfg.max_num_blocks_per_req == 4 and cfg.max_model_len == 16
    assert RunnerConfig.from_json(cfg.to_json()) == cfg
    ledger = Ledger(cfg)
    with pytest.raises(OpError) as e:  # three 8-token blocks: past group 0's 2 columns
        ledger.add(0, [[1, 2, 3], [4], [5]], 3)
    assert e.value.field == "blocks[0]"


def test_pad_slot_no_null_makes_block_0_an_ordinary_mamba_block():
    """mamba_padding pad_slot_no_null: a Mamba group has no null block — block 0
    is allocatable there (not in the attention group) and an empty Mamba
    block-table entry is PAD_SLOT_ID; the other conventions keep block 0."""
    cfg = RunnerConfig(mamba_padding="pad_slot_no_null")
    assert (cfg.has_null_block(0), cfg.has_null_block(1)) == (True, False)
    assert (cfg.empty_entry(0), cfg.empty_entry(1), cfg.mamba_pad_index) == (0, -1, -1)
    ledger = Ledger(cfg)
    assert ledger.num_free(1) == cfg.num_blocks == ledger.num_free(0) + 1
    with pytest.raises(OpError, match="null block"):
        ledger.add(0, [[0], [1]], 3)
    ledger.add(0, [[1], [0]], 3)
    assert ledger.owner[1][0] == 0
    assert ledger.remove(0) == [[1], [0]]
    for padding, pad in (("null", 0), ("pad_slot", -1)):
        cfg = RunnerConfig(mamba_padding=padding)
        assert cfg.has_null_block(1) and cfg.mamba_pad_index == pad
        assert RunnerConfig.from_json(cfg.to_json()) == cfg
        with pytest.raises(OpError, match="null block"):
            Ledger(cfg).add(0, [[1], [0]], 3)


def test_sharing_map_pairs_the_named_groups():
    """kv_sharing_map: the named attention group's tensor is the Mamba group's
    (the page sized for the state); the other attention group keeps its own."""
    import torch

    from gpu_impl import FaultSet, GPUModelRunnerV1

    cfg = RunnerConfig.from_json({
        "kv_sharing": True, "kv_sharing_map": [[2, 1]], "num_blocks": 16,
        "groups": [{"kind": "attention", "block_size": 4}, {"kind": "mamba", "block_size": 16,
                                                            "conv_size": 1},
                   {"kind": "attention", "block_size": 8}]})
    assert cfg.shared_pages() == {2: 1} and cfg.page_partner(0) is None
    assert RunnerConfig.from_json(cfg.to_json()) == cfg
    runner = GPUModelRunnerV1(cfg, FaultSet(), torch.device("cpu"))
    state, kv = runner.mamba_states[1], runner.kv_caches[2]
    assert state.data_ptr() == kv.data_ptr() and state.stride(0) == 8 * 4
    assert state.shape == (16, 8)  # conv part (1 token) + SSM part
    assert runner.kv_caches[0].data_ptr() != kv.data_ptr()
