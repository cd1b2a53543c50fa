"""The token-slot oracle and invariants (SGLang's shape), without SGLang:
config and op legality, the payload's prefix property, the corpus traces'
dry run, and each token-slot invariant firing on a hand-built observation."""

from __future__ import annotations

import json

import numpy as np
import pytest

from harness.core import invariants as inv
from harness.core.observation import TokenSlotObservation
from harness.core.trace import TraceError, load, parse
from reference import ConfigError, OpError, config_from_json
from reference.token_slots import TokenSlotConfig, TokenSlotReference, payload, state_after
from tests.conftest import CORPORA


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="num_slots"):
        TokenSlotConfig(num_slots=10, page_size=4)
    with pytest.raises(ConfigError, match="capture_bs"):
        TokenSlotConfig(capture_bs=(4, 2))
    with pytest.raises(ConfigError, match="page_tokens"):
        config_from_json({"runner": "sglang", "page_tokens": 4})
    assert config_from_json({"runner": "sglang", "page_size": 4}).page_size == 4


def test_padded_bs_is_the_smallest_captured_size_that_fits():
    c = TokenSlotConfig(capture_bs=(1, 2, 4))
    assert [c.padded_bs(n) for n in (1, 2, 3, 4, 5)] == [1, 2, 4, 4, None]


def test_payload_is_a_function_of_the_prefix():
    a, b = payload([5, 6, 7, 8]), payload([5, 6, 9])
    assert np.array_equal(a[:2], b[:2]) and a[2] != b[2]


def test_oracle_legality():
    ref = TokenSlotReference(TokenSlotConfig(num_slots=13, max_num_reqs=2, max_context_len=8))
    ref.sgl_admit(0, 5)
    with pytest.raises(OpError, match="admitted before"):
        ref.sgl_admit(0, 3)
    with pytest.raises(OpError, match="prompt_len"):
        ref.sgl_admit(1, 8)
    with pytest.raises(OpError, match="no room"):
        ref.sgl_admit(1, 7)  # request 0 holds 6, 7 + a page over-asked: 14 > 13 slots
    ref.sgl_admit(1, 2, [0, 2])
    assert ref.requests[1].tokens[:2] == ref.requests[0].tokens[:2]
    with pytest.raises(OpError, match="max_num_reqs"):
        ref.sgl_admit(2, 1)
    ref.sgl_decode()
    assert [ref.requests[r].kv_len for r in (0, 1)] == [6, 3]
    with pytest.raises(OpError, match="captured"):
        ref.sgl_idle(3)
    ref.sgl_finish(0)
    with pytest.raises(OpError, match="not live"):
        ref.sgl_finish(0)


@pytest.mark.parametrize("path", sorted((CORPORA / "sglang").glob("*.json")),
                         ids=lambda p: p.stem)
def test_corpus_traces_are_legal(path):
    trace = load(path)
    assert trace.config.runner == "sglang" and trace.ops


def test_block_table_ops_are_refused_in_a_token_slot_trace():
    obj = {"format": "blockfuzz-trace", "version": 1,
           "config": {"runner": "sglang"}, "ops": [{"op": "condense"}]}
    with pytest.raises(TraceError, match=r"ops\[0\]"):
        parse(obj)


# -- the invariants on hand-built observations ------------------------------------------
CFG = TokenSlotConfig(num_slots=8, max_num_reqs=2, max_context_len=8, capture_bs=(2,))


def _obs(rows, slots, kv=None, free=None, tree=(), padding=None, written=None):
    r2t = np.zeros((CFG.max_num_reqs + 1, CFG.max_context_len), np.int32)
    kv_len = {}
    for req, row in rows.items():
        r2t[row, :len(slots[req])] = slots[req]
        kv_len[req] = len(slots[req])
    used = {s for v in slots.values() for s in v} | {s for _, v, _ in tree for s in v}
    return TokenSlotObservation(
        rows=dict(rows), kv_len=kv_len, req_to_token=r2t,
        kv=np.zeros(CFG.num_slots + 1, np.float32) if kv is None else kv,
        free_pages=np.array(sorted(set(range(1, 9)) - used) if free is None else free,
                            np.int64),
        tree=list(tree), padding=padding, written=written)


def _ref():
    ref = TokenSlotReference(CFG)
    ref.sgl_admit(0, 3)
    return ref


def _kv_for(ref, slots):
    kv = np.zeros(CFG.num_slots + 1, np.float32)
    kv[slots] = ref.expected_kv(0)
    return kv


def _check(after, ref, op=None, before=None):
    ctx = inv.CheckContext(CFG, ref, after, ref, 0, op or {"op": "sgl_admit", "req": 0,
                                                           "prompt_len": 3}, before, None)
    return [v.invariant for v in inv.check(ctx)]


def test_a_correct_observation_passes():
    ref = _ref()
    before = _obs({}, {})
    after = _obs({0: 1}, {0: [3, 4, 5]}, kv=_kv_for(ref, [3, 4, 5]),
                 written=np.array([3, 4, 5]))
    assert _check(after, ref, before=before) == []


@pytest.mark.parametrize("case, invariant", [
    ("row 0", "SGL_RESERVED_UNREAD"),
    ("slot 0", "SGL_RESERVED_UNREAD"),
    ("stale write", "SGL_NO_STALE_WRITE"),
    ("wrong kv", "SGL_KV_MATCHES"),
    ("free and held", "SGL_SLOTS_ACCOUNTED"),
    ("lost", "SGL_SLOTS_ACCOUNTED"),
    ("tree content", "SGL_TREE_CONTENT"),
])
def test_each_invariant_fires(case, invariant):
    ref = _ref()
    slots = [3, 4, 5]
    row, kv, free, written, tree = 1, _kv_for(ref, slots), None, np.array(slots), ()
    if case == "row 0":
        row = 0
    elif case == "slot 0":
        slots = [3, 0, 5]
        kv = _kv_for(ref, slots)
    elif case == "stale write":
        written = np.array([3, 4, 5, 7])
    elif case == "wrong kv":
        kv[4] += 1
    elif case == "free and held":
        free = [1, 2, 4, 6, 7, 8]
    elif case == "lost":
        free = [1, 2, 6, 7]
    elif case == "tree content":
        tree = [((9, 9), (6, 7), 0)]
    after = _obs({0: row}, {0: slots}, kv=kv, free=free, tree=tree, written=written)
    # Before the op slot 7 was a live row's (a request that left in between, as far
    # as this op's checks go): a write there is another request's, not a new slot.
    before = _obs({1: 2}, {1: [7]}) if case == "stale write" else _obs({}, {})
    assert invariant in _check(after, ref, before=before)


def test_padding_pointing_past_the_reserved_index_is_caught():
    ref = _ref()
    ref.sgl_decode()
    slots = [3, 4, 5, 6]
    kv = np.zeros(CFG.num_slots + 1, np.float32)
    kv[slots] = ref.expected_kv(0)
    pad = {"req_pool_indices": np.array([1, 1]), "out_cache_loc": np.array([6, 6]),
           "seq_lens": np.array([4, 4]), "raw_bs": 1, "padded_bs": 2}
    after = _obs({0: 1}, {0: slots}, kv=kv, padding=pad, written=np.array([6, 6]))
    found = _check(after, ref, op={"op": "sgl_decode"}, before=_obs({0: 1}, {0: slots[:3]}))
    assert "SGL_PADDING_RESERVED" in found


def test_block_table_invariants_do_not_judge_token_slot_ops():
    sglang = {e.id for e in inv.REGISTRY.values() if "sglang" in e.runners}
    assert sglang and all(i.startswith("SGL_") for i in sglang)
    assert not any("sglang" in e.runners for e in inv.REGISTRY.values()
                   if not e.id.startswith("SGL_"))


# -- scenarios: one story, every engine's model ------------------------------------------
SCENARIOS = sorted((CORPORA / "scenarios").glob("*.json"))


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_scenarios_run_on_gpu_impl_as_recorded(path, runner):
    """Each scenario as a block-table trace (the engine's KV-cache manager) on
    gpu_impl, with the verdict its meta records; and as a token-slot trace the
    oracle takes (what --target sglang replays)."""
    from harness.core.scenario import load as load_scenario
    from harness.core.session import replay

    scenario = load_scenario(path)
    trace = scenario.trace_for("gpu_impl", runner)
    assert trace.config.runner == runner and trace.config.allocator == "engine"
    want = scenario.meta["verdicts"][f"gpu_impl {runner}"]
    assert replay(trace).verdict == want["verdict"]
    slots = scenario.trace_for("sglang")  # the oracle's dry run accepted every op
    assert slots.config.runner == "sglang" and len(slots.ops) == len(scenario.steps)


def test_a_scenario_that_does_not_fit_names_its_step(tmp_path):
    from harness.core.scenario import ScenarioError, load as load_scenario

    p = tmp_path / "s.json"
    p.write_text('{"format": "blockfuzz-scenario", "version": 1, "geometry": '
                 '{"num_tokens": 8, "max_len": 16}, "steps": [{"op": "arrive", "req": 0, '
                 '"prompt_len": 12}]}')
    with pytest.raises(ScenarioError, match=r"steps\[0\] \(arrive\)"):
        load_scenario(p).trace_for("gpu_impl")
    p.write_text('{"format": "blockfuzz-scenario", "version": 1, "steps": '
                 '[{"op": "arrive", "req": 0, "prompt_len": 4, "prefix": [3, 1]}]}')
    with pytest.raises(ScenarioError, match=r"steps\[0\]\.prefix"):
        load_scenario(p)


@pytest.mark.parametrize("change, field", [
    ({"capture_bs": []}, "capture_bs"), ({"radix_cache": "no"}, "radix_cache"),
    ({"num_slots": True}, "num_slots"), ({"num_slots": 1 << 40}, "num_slots"),
    ({"max_context_len": 1}, "max_context_len"), ({"num_slots": 4, "page_size": 4}, "num_slots"),
])
def test_token_slot_config_bounds_name_the_field(change, field):
    """Geometry that cannot run (or would not fit in memory) is refused naming the
    field, before any engine builds pools for it."""
    with pytest.raises(ConfigError) as e:
        config_from_json(dict({"runner": "sglang"}, **change))
    assert e.value.field == field


def test_a_token_slot_trace_cannot_expect_a_block_table_invariant():
    obj = {"format": "blockfuzz-trace", "version": 1, "config": {"runner": "sglang"},
           "ops": [{"op": "sgl_admit", "req": 0, "prompt_len": 2}],
           "expect": {"verdict": "fail", "invariant": "VACATED_ROWS_ZERO", "op_index": 0}}
    with pytest.raises(TraceError, match="expect.invariant"):
        parse(obj)


@pytest.mark.parametrize("doc, where", [
    ({"meta": 3}, "meta"),
    ({"steps": [{"op": "arrive", "req": 0, "prompt_len": 2},
                {"op": "arrive", "req": 0, "prompt_len": 2}]}, r"steps\[1\]\.req"),
    ({"geometry": {"capture_sizes": [4, 1]}}, "capture_sizes"),
])
def test_bad_scenarios_name_the_field(tmp_path, doc, where):
    from harness.core.scenario import ScenarioError, load as load_scenario

    obj = dict({"format": "blockfuzz-scenario", "version": 1,
                "steps": [{"op": "arrive", "req": 0, "prompt_len": 2}]}, **doc)
    p = tmp_path / "s.json"
    p.write_text(json.dumps(obj))
    with pytest.raises(ScenarioError, match=where):
        load_scenario(p).trace_for("sglang")


# -- a hybrid model's Mamba pool ------------------------------------------------------
HCFG = TokenSlotConfig(num_slots=8, max_num_reqs=2, max_context_len=8, capture_bs=(2,),
                       mamba_slots=5)


@pytest.mark.parametrize("change", [{"mamba_slots": -1}, {"mamba_slots": True},
                                    {"mamba_slots": 2}, {"mamba_slots": 1 << 20},
                                    {"mamba_slots": "4"}])
def test_mamba_slots_bounds_name_the_field(change):
    with pytest.raises(ConfigError) as e:
        config_from_json(dict({"runner": "sglang"}, **change))
    assert e.value.field == "mamba_slots"


def test_mamba_slots_round_trip_and_stay_out_of_attention_only_configs():
    assert "mamba_slots" not in TokenSlotConfig().to_json()
    assert TokenSlotConfig.from_json(HCFG.to_json()) == HCFG
    # One request: its slot, the tree's copy after its prefill, its hit's state.
    assert HCFG.mamba_slots_for(1) == 3 and HCFG.mamba_slots_for(2) == 5
    assert TokenSlotConfig(radix_cache=False, mamba_slots=1).mamba_slots_for(1) == 1


def test_a_state_continues_from_where_it_stopped():
    toks = [5, 17, 3, 900, 41]
    assert state_after(toks) == payload(toks)[-1]
    assert state_after(toks[2:], state_after(toks[:2])) == state_after(toks)
    assert state_after(toks[1:]) != state_after(toks)  # a state not copied stays wrong
    assert np.isnan(state_after(toks, np.float32(np.nan)))


def test_the_oracle_refuses_a_request_without_a_state_slot():
    ref = TokenSlotReference(TokenSlotConfig(max_num_reqs=4, mamba_slots=5))
    ref.sgl_admit(0, 2)
    ref.sgl_admit(1, 2)  # two requests may need all five slots
    with pytest.raises(OpError, match="Mamba state slot"):
        ref.sgl_admit(2, 2)
    assert sorted(ref.live()) == [0, 1]


def _hobs(state_slots, state, free, tree=(), written=None, padding=None):
    obs = _obs({q: q + 1 for q in state_slots}, {q: [3 + q] for q in state_slots},
               padding=padding)
    obs.state_slots, obs.state = dict(state_slots), state
    obs.state_free, obs.state_tree = np.array(free, np.int64), list(tree)
    obs.state_written = written
    return obs


def _hcheck(after, ref, before=None, op=None):
    ctx = inv.CheckContext(HCFG, ref, after, ref, 0, op or {"op": "sgl_decode"}, before, None)
    return [v.invariant for v in inv.check(ctx) if v.invariant.startswith("SGL_STATE")]


@pytest.mark.parametrize("case, invariant", [
    (None, None),
    ("slot 0", "SGL_STATE_RESERVED"),
    ("padded row", "SGL_STATE_RESERVED"),
    ("wrong state", "SGL_STATE_MATCHES"),
    ("tree state", "SGL_STATE_TREE_CONTENT"),
    ("stale write", "SGL_STATE_NO_STALE_WRITE"),
    ("free and held", "SGL_STATE_ACCOUNTED"),
    ("lost", "SGL_STATE_ACCOUNTED"),
])
def test_each_state_invariant_fires(case, invariant):
    ref = TokenSlotReference(HCFG)
    ref.sgl_admit(0, 1)
    ref.sgl_decode()
    state = np.zeros(HCFG.mamba_slots + 1, np.float32)
    tree_toks = tuple(ref.requests[0].tokens[:1])
    slot, free, tree = 2, [3, 4, 5], [(tree_toks, 1, 1)]
    state[1] = state_after(tree_toks)
    written = np.array([2])
    pad = {"req_pool_indices": np.array([1, 0]), "out_cache_loc": np.array([4, 0]),
           "seq_lens": np.array([2, 1]), "raw_bs": 1, "padded_bs": 2,
           "state_indices": np.array([2, -1])}
    before_state = state.copy()
    if case == "slot 0":
        slot, free = 0, [2, 3, 4, 5]
    elif case == "padded row":
        pad["state_indices"] = np.array([2, 1])
    elif case == "tree state":
        state[1] += 1
    elif case == "stale write":
        written = np.array([2, 1])
    elif case == "free and held":
        free = [2, 3, 4, 5]
    elif case == "lost":
        free = [3, 4]
    state[slot] = ref.expected_state(0) if case != "wrong state" else 7.0
    if case == "stale write":
        state[1] = np.nan
    before = _hobs({0: slot}, before_state, free, tree)
    after = _hobs({0: slot}, state, free, tree, written, pad)
    found = _hcheck(after, ref, before)
    assert (found == []) if invariant is None else (invariant in found), found


@pytest.mark.parametrize("case", [None, "short", "foreign row", "wrong value"])
def test_the_decode_read_is_judged_per_row(case):
    ref = _ref()
    ref.sgl_decode()
    slots = [3, 4, 5, 6]
    kv = np.zeros(CFG.num_slots + 1, np.float32)
    kv[slots] = ref.expected_kv(0)
    read = (0, 1, 4, kv[slots].copy())
    if case == "short":
        read = (0, 1, 3, kv[slots[:3]].copy())
    elif case == "foreign row":
        read = (0, 2, 4, np.zeros(4, np.float32))
    elif case == "wrong value":
        read[3][2] = np.nan
    after = _obs({0: 1}, {0: slots}, kv=kv, written=np.array([6]))
    after.reads = [read]
    found = _check(after, ref, op={"op": "sgl_decode"}, before=_obs({0: 1}, {0: slots[:3]}))
    assert ("SGL_DECODE_READS_OWN_KV" in found) == (case is not None), found
