"""The scheduler side under test (issue #16): ``allocator: engine`` with the
target's KV-cache manager choosing blocks, prefix caching, and the scheduler
invariants that judge its choices.

Every test can fail: choices, hits and content are checked by value, each
invariant is shown to fire on a manager made to misbehave (monkeypatched at
the line a bug would live), and legality errors name their field.
"""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from gpu_impl.kv_cache_manager import BlockPool, KVCacheManager
from harness.core.session import Session, replay
from harness.core.trace import Trace, TraceError, parse
from reference import SENTINEL, ConfigError, GroupSpec, OpError, RunnerConfig
from reference.payload import token_payload

CORPORA = Path(__file__).resolve().parents[2] / "corpora"

CFG = RunnerConfig(groups=(GroupSpec("attention", 4, 4),), num_blocks=12, max_num_reqs=4,
                   max_num_blocks_per_req=4, max_num_batched_tokens=16,
                   allocator="engine", enable_prefix_caching=True)
TWO = RunnerConfig(groups=(GroupSpec("attention", 2, 2), GroupSpec("attention", 4, 4)),
                   num_blocks=12, max_num_reqs=4, max_num_blocks_per_req=4,
                   max_num_batched_tokens=16, allocator="engine", enable_prefix_caching=True)


def admit(req, n, new, prefix=()):
    return {"op": "admit", "req": req, "prompt_len": n, "prefix": list(prefix),
            "num_new_tokens": new}


def step(*sched, mode="NONE"):
    return {"op": "step", "scheduled": [list(s) for s in sched], "cudagraph_mode": mode}


SHARED = [admit(0, 9, 9), step((0, 9)), admit(1, 10, 2, (0, 9))]


@pytest.mark.parametrize("target", ["reference", "gpu_impl"])
def test_a_prefix_hit_shares_the_registered_blocks_and_is_capped_below_the_prompt(target):
    session = Session(CFG, (), target)
    ops = [dict(op) for op in SHARED]
    for op in ops:
        assert session.apply(op) == []
    # Request 0's full blocks (positions 0-3, 4-7) are registered once computed;
    # request 1 shares them: 8 tokens, the ninth (shared) token is computed again.
    assert ops[2]["num_cached_tokens"] == 8
    assert ops[2]["blocks"][0][:2] == ops[0]["blocks"][0][:2]
    obs = session.target.observe()
    assert obs.pool[0]["ref_count"][ops[0]["blocks"][0][0]] == 2
    # Request 1 starts at its hit; its first step computes positions 8 and 9 only.
    assert session.apply(step((1, 2), mode="FULL")) == []
    tokens = session.ledger.token_ids(1, np.arange(10))
    assert (tokens[:9] == np.arange(9)).all() and tokens[9] == 1 * 256 + 9


def test_a_hit_is_a_multiple_of_every_group_block_size():
    session = Session(TWO, (), "gpu_impl")
    ops = [admit(0, 7, 7), step((0, 7)), admit(1, 8, 2, (0, 7))]
    for op in ops:
        assert session.apply(op) == []
    # 2-token and 4-token blocks: a 6-token prefix is three blocks of one group
    # but only one and a half of the other; the hit is 4 tokens.
    assert ops[2]["num_cached_tokens"] == 4
    assert [len(b) for b in ops[2]["blocks"]] == [3, 2]  # 4 + 2 tokens


def test_freeing_keeps_registered_content_and_poisons_the_rest():
    session = Session(CFG, (), "gpu_impl")
    ops = [admit(0, 6, 6), step((0, 6)), {"op": "remove", "req": 0}]
    for op in ops:
        assert session.apply(op) == []
    full, partial = ops[0]["blocks"][0]
    kv = session.target.observe().kv_cache[0]
    assert (kv[full] == token_payload(np.arange(4), CFG.head_size)).all()
    assert (kv[partial] == SENTINEL).all()
    # A later request with that prefix hits the kept block.
    op = admit(1, 5, 1, (0, 5))
    assert session.apply(op) == [] and op["num_cached_tokens"] == 4
    assert op["blocks"][0][0] == full


def test_an_evicted_block_is_poisoned_and_leaves_the_cache():
    cfg = RunnerConfig(groups=(GroupSpec("attention", 4, 4),), num_blocks=4, max_num_reqs=2,
                       max_num_blocks_per_req=3, max_num_batched_tokens=16,
                       allocator="engine", enable_prefix_caching=True)
    session = Session(cfg, (), "gpu_impl")
    ops = [admit(0, 4, 4), step((0, 4)), {"op": "remove", "req": 0}, admit(1, 12, 12),
           admit(2, 5, 5, (0, 4))]
    for op in ops:
        assert session.apply(op) == []
    # Request 1 needs the whole pool: the registered block is evicted and poisoned,
    # so request 2 (request 0's prompt) misses.
    assert sorted(ops[3]["blocks"][0]) == [1, 2, 3]
    assert ops[4]["blocks"] is None and ops[4]["num_cached_tokens"] == 0
    assert 2 not in session.ledger.requests


def test_a_refused_admit_leaves_the_request_out_and_its_steps_illegal():
    cfg = RunnerConfig(groups=(GroupSpec("attention", 4, 4),), num_blocks=3, max_num_reqs=2,
                       max_num_blocks_per_req=2, max_num_batched_tokens=16,
                       allocator="engine")
    session = Session(cfg, (), "gpu_impl")
    assert session.apply(admit(0, 8, 8)) == []
    op = admit(1, 4, 4)
    assert session.apply(op) == [] and op["blocks"] is None
    with pytest.raises(OpError, match="request 1 is not live"):
        session.apply(step((1, 1)))


def _patched(monkeypatch, name, fn):
    monkeypatch.setattr(KVCacheManager, name, fn)


def test_pool_accounting_flags_a_refusal_with_room(monkeypatch):
    _patched(monkeypatch, "admit", lambda self, req, tokens, n: (None, 0))
    v = Session(CFG, (), "gpu_impl").apply(admit(0, 4, 4))
    assert [x.invariant for x in v] == ["POOL_ACCOUNTING"] and "refused" in v[0].detail


def test_pool_accounting_flags_the_null_block_handed_out(monkeypatch):
    real = KVCacheManager.admit
    _patched(monkeypatch, "admit", lambda self, req, tokens, n: (
        [[0] + real(self, req, tokens, n)[0][0][1:]], 0))
    v = Session(CFG, (), "gpu_impl").apply(admit(0, 8, 8))
    assert v[0].invariant == "POOL_ACCOUNTING" and "null block" in v[0].detail


def test_one_owner_flags_a_block_handed_out_while_held(monkeypatch):
    session = Session(CFG, (), "gpu_impl")
    first = admit(0, 4, 4)
    assert session.apply(first) == []
    held = first["blocks"][0][0]
    real = BlockPool.get_new_blocks

    def take_held(self, n):
        out = real(self, n)
        return [held] + out[1:] if out else out
    monkeypatch.setattr(BlockPool, "get_new_blocks", take_held)
    v = session.apply(admit(1, 4, 4))
    assert v and v[0].invariant in ("POOL_ACCOUNTING", "ONE_OWNER_PER_BLOCK")
    v = Session(CFG, (), "gpu_impl", skip={"POOL_ACCOUNTING"})
    monkeypatch.setattr(BlockPool, "get_new_blocks", real)
    assert v.apply(admit(0, 4, 4)) == []
    monkeypatch.setattr(BlockPool, "get_new_blocks", take_held)
    found = v.apply(admit(1, 4, 4))
    assert found[0].invariant == "ONE_OWNER_PER_BLOCK" and f"block {held}" in found[0].detail


def test_prefix_content_flags_a_hit_block_that_lost_its_content():
    # MATCHES_REFERENCE sees the cell too (the reference kept the prefix); off here.
    session = Session(CFG, (), "gpu_impl", skip={"MATCHES_REFERENCE"})
    for op in SHARED[:2]:
        assert session.apply(dict(op)) == []
    block = session.ledger.requests[0].blocks[0][1]
    session.target.runner.kv_caches[0][block, 2] = 5.0  # not what the prefix computed
    session._before = session.target.observe()
    v = session.apply(dict(SHARED[2]))
    assert [x.invariant for x in v] == ["PREFIX_CONTENT"]
    assert f"block {block}" in v[0].detail and "positions 4..7" in v[0].detail


def test_cached_blocks_immutable_flags_a_write_into_a_registered_block(monkeypatch):
    session = Session(CFG, (), "gpu_impl", skip={"NO_STALE_WRITE", "MATCHES_REFERENCE"})
    ops = [admit(0, 4, 4), step((0, 4)), {"op": "remove", "req": 0}, admit(1, 4, 4)]
    for op in ops[:3]:
        assert session.apply(op) == []
    block = ops[0]["blocks"][0][0]
    real = session.target.runner.poison_blocks

    def poison_also_cached(g, ids):
        real(g, list(ids) + [block])
    monkeypatch.setattr(session.target.runner, "poison_blocks", poison_also_cached)
    v = session.apply(ops[3])
    assert [x.invariant for x in v] == ["CACHED_BLOCKS_IMMUTABLE"] and v[0].block == block


def test_a_replay_reports_a_different_choice_without_failing(tmp_path):
    trace = Trace(CFG, [admit(0, 4, 4)])
    first = replay(trace, record=True)
    assert first.ops[0]["blocks"] == [[1]] and not first.diverged
    edited = Trace(CFG, [dict(first.ops[0], blocks=[[7]])])
    again = replay(edited)
    assert again.violation is None and "recorded {'blocks': [[7]]" in again.diverged[0]


HOST = RunnerConfig(groups=(GroupSpec("attention", 4, 4),), num_blocks=12, max_num_reqs=4,
                    max_num_blocks_per_req=4, max_num_batched_tokens=16,
                    allocator="engine", host_blocks=2)


def _onboarding(first_blocks):
    """Request 0 computes and offloads its first block; request 1, recorded with
    ``first_blocks`` (group 0), shares that prefix and onboards it."""
    return [dict(admit(0, 8, 8), blocks=[[1, 2]], num_cached_tokens=0), step((0, 8)),
            {"op": "offload_begin", "req": 0, "handle": 0, "blocks": [[1]]},
            {"op": "offload_complete", "req": 0, "handle": 0},
            dict(admit(1, 8, 8, (0, 4)), blocks=[first_blocks], num_cached_tokens=0),
            {"op": "onboard_begin", "req": 1, "handle": 1, "blocks": [first_blocks[:1]]},
            {"op": "onboard_complete", "req": 1, "handle": 1}]


def test_a_trace_loads_with_choices_other_than_the_references_own():
    """The reference alone would give request 1 blocks 3 and 4 (its plain
    policy); a trace recording the engine's [9, 5] still loads — the dry run
    mirrors the recorded choice, as a replay mirrors the target's — and the
    shrinker keeps the onboard that names block 9."""
    from harness.search.shrink import legalize

    ops = _onboarding([9, 5])
    trace = parse(json.loads(Trace(HOST, ops).dumps()))  # the dry run accepts it
    assert legalize(HOST, ops) == ops
    found = replay(trace)
    assert found.violation is None and "recorded {'blocks': [[9, 5]]" in found.diverged[0]


def test_a_recording_replay_follows_the_targets_choices_into_later_ops():
    """A search or shrink candidate whose recorded choices went stale: the ops
    that name the request's blocks get the blocks the target chose instead."""
    stale = replay(Trace(HOST, _onboarding([9, 5])), record=True)
    assert stale.violation is None
    chosen = stale.ops[4]["blocks"][0]
    assert chosen != [9, 5] and stale.ops[5]["blocks"] == [chosen[:1]]


def test_recorded_fields_are_optional_and_checked_only_by_replay():
    obj = json.loads(Trace(CFG, SHARED).dumps())
    assert "blocks" not in obj["ops"][0]
    trace = parse(obj)
    assert replay(trace).violation is None


def test_allocator_ops_are_refused_in_the_other_mode_with_the_field_named():
    obj = json.loads(Trace(RunnerConfig(), []).dumps())
    obj["ops"] = [admit(0, 4, 4)]
    with pytest.raises(TraceError, match=r"ops\[0\] \(admit\)\.op.*allocator 'engine'"):
        parse(obj)
    obj = json.loads(Trace(CFG, []).dumps())
    obj["ops"] = [{"op": "add", "req": 0, "blocks": [[1]], "prompt_len": 1}]
    with pytest.raises(TraceError, match="use admit / allocate"):
        parse(obj)
    obj["ops"] = [admit(0, 4, 4, (3, 2))]
    with pytest.raises(TraceError, match=r"prefix\[0\]"):
        parse(obj)
    obj["ops"] = SHARED[:2] + [admit(1, 10, 3, (0, 9))]
    with pytest.raises(TraceError, match=r"num_new_tokens.*8-token prefix hit"):
        parse(obj)


def test_prefix_caching_config_limits_are_one_line_errors():
    with pytest.raises(ConfigError, match="enable_prefix_caching.*allocator 'engine'"):
        RunnerConfig(enable_prefix_caching=True)
    assert RunnerConfig(allocator="engine", enable_prefix_caching=True).mamba_cache_mode == "align"
    assert RunnerConfig(allocator="engine").mamba_cache_mode == "none"
    # Align mode with a drafter is modelled; a Mamba block shorter than one
    # verification (1 + k tokens) is refused in one line.
    assert RunnerConfig(allocator="engine", enable_prefix_caching=True,
                        num_speculative_tokens=1).mamba_cache_mode == "align"
    with pytest.raises(ConfigError, match=r"groups\[1\].block_size.*1 \+ num_speculative_tokens"):
        RunnerConfig(allocator="engine", enable_prefix_caching=True, num_speculative_tokens=2,
                     groups=(GroupSpec("attention", 4, 4), GroupSpec("mamba", 2, 2)))
    with pytest.raises(ConfigError, match=r"groups\[1\].block_size.*max_num_batched_tokens"):
        RunnerConfig(allocator="engine", enable_prefix_caching=True, max_num_batched_tokens=8,
                     cudagraph_capture_sizes=(1, 2))
    with pytest.raises(ConfigError, match="allocator"):
        RunnerConfig(allocator="scheduler")
    assert "allocator" not in RunnerConfig().to_json()


def test_a_kv_loaded_prefix_is_a_hit_without_the_drafter_layer():
    """Found by the first clean search (seed 1): a KV load fills the target's KV
    only, so a drafter's layer over a loaded prefix is empty — not a bad hit."""
    cfg = RunnerConfig(groups=(GroupSpec("attention", 4, 4),), num_blocks=8, max_num_reqs=4,
                       max_num_blocks_per_req=4, max_num_batched_tokens=1,
                       cudagraph_capture_sizes=(), num_speculative_tokens=2,
                       allocator="engine", enable_prefix_caching=True)
    ops = [admit(0, 9, 1), admit(1, 9, 1, (0, 9)), admit(2, 8, 8, (0, 8)),
           {"op": "kv_load", "req": 2}, admit(3, 9, 1, (1, 9))]
    verdict = replay(Trace(cfg, ops), record=True)
    assert verdict.violation is None
    # Two registered blocks of the loaded prefix; with a drafter the last is
    # computed again (vLLM's drop_eagle_block): a 4-token hit on block one.
    assert verdict.ops[4]["num_cached_tokens"] == 4
    assert verdict.ops[4]["blocks"][0][0] == verdict.ops[2]["blocks"][0][0]


SWA = RunnerConfig(groups=(GroupSpec("attention", 4, 4, sliding_window=5),), num_blocks=8,
                   max_num_reqs=2, max_num_blocks_per_req=4, max_num_batched_tokens=8,
                   allocator="engine")


@pytest.mark.parametrize("target", ["reference", "gpu_impl"])
def test_a_sliding_window_frees_blocks_it_left_and_reads_stay_inside(target):
    session = Session(SWA, (), target)
    ops = [admit(0, 8, 8), step((0, 8)), {"op": "allocate", "req": 0, "num_new_tokens": 1},
           step((0, 1), mode="FULL"), admit(1, 4, 4), step((0, 1), (1, 4))]
    for op in ops:
        assert session.apply(op) == [], op
    first = ops[0]["blocks"][0][0]
    # Position 8 attends to 4..8: block `first` (positions 0-3) left the window.
    assert ops[2]["freed"] == [[first]]
    assert session.ledger.requests[0].blocks[0][0] == 0  # the scheduler's entry: null
    # The runner's row keeps the old id, which request 1 may now hold.
    obs = session.target.observe()
    assert first in obs.host_block_table[0][obs.host_req_ids.tolist().index(0)]


def test_a_window_freeing_a_block_still_read_is_flagged(monkeypatch):
    real = KVCacheManager.remove_skipped_blocks

    def one_early(self, req):
        self.num_computed[req] += 1
        try:
            return real(self, req)
        finally:
            self.num_computed[req] -= 1
    monkeypatch.setattr(KVCacheManager, "remove_skipped_blocks", one_early)
    session = Session(SWA, (), "gpu_impl")
    for op in (admit(0, 7, 7), step((0, 7))):
        assert session.apply(op) == []
    v = session.apply({"op": "allocate", "req": 0, "num_new_tokens": 1})
    assert [x.invariant for x in v] == ["POOL_ACCOUNTING"] and "still attends" in v[0].detail


def test_sliding_window_config_limits():
    with pytest.raises(ConfigError, match=r"groups\[0\]\.sliding_window.*allocator 'engine'"):
        RunnerConfig(groups=(GroupSpec("attention", 4, 4, sliding_window=5),))
    with pytest.raises(ConfigError, match="only an attention group"):
        RunnerConfig(groups=(GroupSpec("attention", 4, 4), GroupSpec("mamba", 16, 16, False, 4)),
                     allocator="engine")
    assert SWA.to_json()["groups"][0]["sliding_window"] == 5
    assert "sliding_window" not in RunnerConfig().to_json()["groups"][0]


def test_a_key_registered_twice_hits_the_block_registered_first():
    """Found by an attacker (review of #16): two requests compute one prefix, so its
    key names two blocks; the hit (and the refusal judged from it) uses the one
    registered first, as vLLM's get_cached_block does — not the lowest id."""
    cfg = RunnerConfig(groups=(GroupSpec("attention", 4, 4),), num_blocks=8,
                       allocator="engine", enable_prefix_caching=True)
    ops = [admit(0, 5, 5), admit(1, 5, 5, (0, 5)), step((1, 5)), step((0, 5)),
           {"op": "remove", "req": 1}, admit(3, 16, 16), admit(2, 5, 1, (0, 5))]
    for target in ("gpu_impl", "reference"):
        verdict = replay(Trace(cfg, ops), target=target, record=True)
        assert verdict.violation is None, (target, verdict.violation)
        # Block 3 (request 1's, registered first) is free and evictable: touching it
        # leaves no room for request 2's new block, so the refusal is right.
        assert verdict.ops[6]["blocks"] is None and verdict.ops[6]["num_cached_tokens"] == 4


def test_rollback_is_refused_with_a_sliding_window():
    obj = json.loads(Trace(SWA, [admit(0, 4, 4), step((0, 4)),
                                 {"op": "allocate", "req": 0, "num_new_tokens": 8},
                                 step((0, 8))]).dumps())
    obj["ops"].append({"op": "rollback", "req": 0, "num_tokens": 7})
    with pytest.raises(TraceError, match="without sliding windows"):
        parse(obj)


def test_the_shrinker_takes_a_manager_out_when_it_chose_nothing_a_trace_could_not():
    from harness.search.shrink import as_trace_allocator

    trace = Trace(CFG, [admit(0, 4, 4), step((0, 4)), {"op": "allocate", "req": 0,
                                                     "num_new_tokens": 4}, step((0, 4))])
    recorded = Trace(CFG, replay(trace, record=True).ops)
    plain = as_trace_allocator(recorded)
    assert plain.config.allocator == "trace" and [op["op"] for op in plain.ops] == [
        "add", "step", "append", "step"]
    assert plain.ops[0]["blocks"] == recorded.ops[0]["blocks"]
    hit = Trace(CFG, replay(Trace(CFG, SHARED), record=True).ops)
    assert as_trace_allocator(hit) is None  # a prefix hit: the manager's own doing


def _engine_cfg(groups, runner="v1", **kw):
    from reference import GroupSpec

    return RunnerConfig(runner=runner, groups=tuple(GroupSpec(*g) for g in groups),
                        num_blocks=16, max_num_reqs=4, max_num_blocks_per_req=8,
                        max_num_batched_tokens=16, cudagraph_capture_sizes=(1, 2, 4, 8),
                        allocator="engine", enable_prefix_caching=True, **kw)


def test_sliding_window_hit_needs_only_the_window():
    """vLLM's SlidingWindowManager: a hit needs the blocks inside the window of
    its first new token; the ones before are the null block."""
    cfg = _engine_cfg([("attention", 4, 4, False, 5)])
    ops = [admit(0, 16, 16), {"op": "step", "scheduled": [[0, 16]], "cudagraph_mode": "NONE"},
           admit(1, 20, 4, (0, 16)), {"op": "step", "scheduled": [[1, 4]], "cudagraph_mode": "NONE"}]
    verdict = replay(Trace(cfg, ops), record=True)
    assert verdict.violation is None, verdict.violation.line()
    assert verdict.ops[2]["num_cached_tokens"] == 16
    assert verdict.ops[2]["blocks"][0][:3] == [0, 0, 0] and verdict.ops[2]["blocks"][0][3] != 0
    # A manager that hands the null block inside the window is caught.
    from harness.core.invariants.scheduler import malformed

    session = Session(cfg, (), "reference", "cpu", record=True)
    for op in ops[:2]:
        session.apply(op)
    bad = dict(verdict.ops[2], blocks=[[0, 0, 0, 0] + verdict.ops[2]["blocks"][0][4:]])
    assert malformed(cfg, session.ledger, bad)[0] == "POOL_ACCOUNTING"
    assert malformed(cfg, session.ledger, verdict.ops[2]) is None


def test_align_mode_restores_the_hit_state_and_refuses_unaligned_chunks():
    cfg = _engine_cfg([("attention", 4, 4), ("mamba", 8, 8)], runner="v2")
    ops = [admit(0, 16, 16), {"op": "step", "scheduled": [[0, 16]], "cudagraph_mode": "NONE"},
           {"op": "remove", "req": 0}, admit(1, 20, 4, (0, 16)),
           {"op": "step", "scheduled": [[1, 4]], "cudagraph_mode": "NONE"}]
    verdict = replay(Trace(cfg, ops), record=True)
    assert verdict.violation is None, verdict.violation.line()
    # The hit: the null block, then the state block registered at 16 tokens; then the new one.
    mamba = verdict.ops[3]["blocks"][1]
    assert mamba[0] == 0 and mamba[1] == verdict.ops[0]["blocks"][1][1] and len(mamba) == 3
    assert replay(Trace(cfg, ops), ["mamba-align-seed-attention-block-size"]).violation \
        .invariant == "MATCHES_REFERENCE"
    # A prefill chunk that ends inside a state block before the prompt's last boundary.
    with pytest.raises(TraceError, match=r"num_new_tokens.*Mamba block boundary"):
        parse({"format": "blockfuzz-trace", "version": 1, "config": cfg.to_json(),
               "ops": [admit(0, 20, 6)]})
    # A decode of two tokens.
    with pytest.raises(TraceError, match=r"scheduled\[0\]\[1\].*one token"):
        parse({"format": "blockfuzz-trace", "version": 1, "config": cfg.to_json(),
               "ops": [admit(0, 4, 4), {"op": "step", "scheduled": [[0, 4]],
                                        "cudagraph_mode": "NONE"},
                       {"op": "allocate", "req": 0, "num_new_tokens": 1},
                       {"op": "step", "scheduled": [[0, 2]], "cudagraph_mode": "NONE"}]})


def test_a_recorded_choice_no_manager_could_make_is_not_mirrored_at_load():
    """A recorded prefix hit the reference does not expect (nothing is cached
    yet) is not taken for the target's policy: the reference's own choice
    stands, and an op that relied on the impossible hit is refused at load."""
    ops = [dict(admit(0, 8, 4), blocks=[[7, 8]], num_cached_tokens=4), step((0, 4)),
           {"op": "kv_store_begin", "req": 0, "handle": 0, "num_tokens": 8}]
    with pytest.raises(TraceError, match=r"ops\[2\] \(kv_store_begin\)"):
        parse(json.loads(Trace(CFG, ops).dumps()))


def test_a_later_request_sharing_a_moved_hit_block_follows_it():
    """Request 1 gets request 0's blocks as its prefix hit: an offload naming
    the recorded id of a shared block names the block the target chose."""
    cfg = dataclasses.replace(HOST, enable_prefix_caching=True)
    ops = [dict(admit(0, 8, 8), blocks=[[9, 5]], num_cached_tokens=0), step((0, 8)),
           admit(1, 12, 4, (0, 8)), step((1, 4)),
           {"op": "offload_begin", "req": 1, "handle": 0, "blocks": [[9]]},
           {"op": "offload_complete", "req": 1, "handle": 0}]
    found = replay(parse(json.loads(Trace(cfg, ops).dumps())))
    assert found.violation is None
    assert found.ops[4]["blocks"] == [found.ops[0]["blocks"][0][:1]]


def test_all_mode_config_is_accepted_and_refused_in_one_line():
    cfg = _engine_cfg([("attention", 4, 4), ("mamba", 8, 8)], runner="v1")
    cfg = dataclasses.replace(cfg, mamba_prefix_mode="all")
    assert cfg.mamba_cache_mode == "all" and cfg.to_json()["mamba_cache_mode"] == "all"
    assert RunnerConfig.from_json(cfg.to_json()) == cfg
    assert "mamba_cache_mode" not in dataclasses.replace(cfg, mamba_prefix_mode="align").to_json()
    with pytest.raises(ConfigError, match="mamba_cache_mode.*'none'.*not one of"):
        dataclasses.replace(cfg, mamba_prefix_mode="none")
    with pytest.raises(ConfigError, match="mamba_cache_mode.*needs enable_prefix_caching"):
        dataclasses.replace(cfg, enable_prefix_caching=False)
    with pytest.raises(ConfigError, match="mamba_cache_mode.*'all' needs num_speculative"):
        dataclasses.replace(cfg, num_speculative_tokens=1)
    # All mode: no Mamba block boundary for chunks (align mode's rule is refused above).
    with pytest.raises(ConfigError, match=r"groups\[1\].block_size.*max_num_batched_tokens"):
        dataclasses.replace(cfg, mamba_prefix_mode="align", max_num_batched_tokens=4,
                            cudagraph_capture_sizes=(1, 2))
    dataclasses.replace(cfg, max_num_batched_tokens=4, cudagraph_capture_sizes=(1, 2))


def test_all_mode_allocates_every_column_and_chunks_end_anywhere():
    """vLLM's all mode: a state block per column (as attention), chunks that end
    inside a state block, the hit's columns before its state block null."""
    cfg = dataclasses.replace(_engine_cfg([("attention", 4, 4), ("mamba", 8, 8)], runner="v1"),
                              mamba_prefix_mode="all")
    ops = [admit(0, 16, 5), {"op": "step", "scheduled": [[0, 5]], "cudagraph_mode": "NONE"},
           {"op": "allocate", "req": 0, "num_new_tokens": 11},
           {"op": "step", "scheduled": [[0, 11]], "cudagraph_mode": "NONE"},
           admit(1, 20, 4, (0, 16)), {"op": "step", "scheduled": [[1, 4]], "cudagraph_mode": "NONE"}]
    verdict = replay(Trace(cfg, ops), record=True)
    assert verdict.violation is None, verdict.violation.line()
    assert len(verdict.ops[0]["blocks"][1]) == 1 and len(verdict.ops[2]["blocks"][1]) == 1
    mamba = verdict.ops[4]["blocks"][1]  # the null block, the hit's state block, a new one
    assert mamba[0] == 0 and mamba[1] == verdict.ops[2]["blocks"][1][0] and len(mamba) == 3
    for fault in ("mamba-all-boundary-on-chunk-grid",):
        assert replay(Trace(cfg, ops), [fault]).violation.invariant == "MATCHES_REFERENCE"
    # A decode of two tokens is refused as in align mode.
    with pytest.raises(TraceError, match=r"scheduled\[0\]\[1\].*one token per step in all mode"):
        parse({"format": "blockfuzz-trace", "version": 1, "config": cfg.to_json(),
               "ops": [admit(0, 4, 4), {"op": "step", "scheduled": [[0, 4]],
                                        "cudagraph_mode": "NONE"},
                       {"op": "allocate", "req": 0, "num_new_tokens": 1},
                       {"op": "step", "scheduled": [[0, 2]], "cudagraph_mode": "NONE"}]})


def test_align_mode_chunk_ends_on_a_boundary_unless_it_ends_the_prompt():
    """vLLM >= 0.27's chunk rule (PR #51113): with a drafter, the EAGLE back-off
    once let a chunk end inside a block before the prompt's end; a later chunk
    then crossed that block's end and the block was cached holding a state
    short of it (a later hit restored it: PREFIX_CONTENT with no fault on, found
    by an attack on the first version of align mode with a drafter).  Such a
    chunk is refused in one line, at the allocation and at the step."""
    cfg = {"allocator": "engine", "enable_prefix_caching": True, "num_speculative_tokens": 1,
           "groups": [{"block_size": 2, "kind": "attention"}, {"block_size": 2, "kind": "mamba"}],
           "num_blocks": 15, "max_num_reqs": 3, "max_num_blocks_per_req": 7,
           "max_num_batched_tokens": 15, "cudagraph_capture_sizes": [], "runner": "v1"}
    head = [{"op": "admit", "req": 0, "prompt_len": 5, "prefix": [], "num_new_tokens": 2},
            {"op": "step", "scheduled": [[0, 2]], "cudagraph_mode": "NONE"}]
    mid = {"op": "allocate", "req": 0, "num_new_tokens": 1}
    with pytest.raises(TraceError, match=r"ops\[2\] \(allocate\).num_new_tokens: .*ends on a "
                                         r"Mamba block boundary .* unless it ends the prompt"):
        parse({"format": "blockfuzz-trace", "version": 1, "config": cfg, "ops": head + [mid]})
    # The step without the allocation is refused too: vLLM allocates for every step.
    step = {"op": "step", "scheduled": [[0, 2]], "cudagraph_mode": "NONE"}
    with pytest.raises(TraceError, match=r"ops\[2\] \(step\).*needs 3 .*allocate those tokens"):
        parse({"format": "blockfuzz-trace", "version": 1, "config": cfg, "ops": head + [step]})
    # Running to the prompt's end (crossing a boundary mid-chunk) is what the rule allows.
    ok = head + [{"op": "allocate", "req": 0, "num_new_tokens": 3},
                 {"op": "step", "scheduled": [[0, 3]], "cudagraph_mode": "NONE"}]
    trace = parse({"format": "blockfuzz-trace", "version": 1, "config": cfg, "ops": ok})
    assert replay(trace).violation is None


def test_align_mode_drafter_moved_block_handed_again_as_new_is_malformed():
    """A growing Mamba list moves its speculative block to the end; a manager that
    also hands that block as the new one hands it twice (POOL_ACCOUNTING), and
    the ledger never mirrors such a choice."""
    from harness.core.invariants.scheduler import malformed

    trace = parse(json.loads((CORPORA / "regressions" / "v1-align-spec-drafter-states.json")
                             .read_text()))
    session = Session(trace.config, (), "gpu_impl", None, (), True)
    for op in trace.ops[:2]:
        assert not session.apply(op)
    good = dict(trace.ops[2])
    assert good["blocks"][1] == [2, 4]  # the moved speculative block 2, then a new one
    assert malformed(trace.config, session.ledger, good) is None
    for bad, why in (([2, 2], "twice"), ([4, 2], "speculative state block 2 moves to")):
        v = malformed(trace.config, session.ledger, dict(good, blocks=[good["blocks"][0], bad]))
        assert v is not None and v[0] == "POOL_ACCOUNTING" and why in v[1], v
