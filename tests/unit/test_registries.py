"""harness/core/ops and harness/core/invariants: the registries every consumer iterates.

The last tests register a new op *only* in the op registry (plus the
implementations' method, here a stand-in) and watch the trace loader, the
replay, the shrinker, ``explain`` and the state machine pick it up — the
"Adding an op" contract in docs/traces.md.
"""

import json

import pytest

from harness.core import invariants as inv
from harness.core import ops
from harness.core.ops import OpSpec
from harness.core.trace import Trace, TraceError, parse
from harness.search.shrink import _candidates, _drop_requests, renumber
from reference import RunnerConfig
from tests.conftest import CORPORA


def test_every_op_is_complete_and_its_example_loads():
    assert list(ops.REGISTRY) == ["add", "append", "remove", "condense", "swap", "kv_load",
                                  "kv_load_begin", "kv_load_complete", "kv_load_fail",
                                  "kv_store_begin", "kv_store_complete",
                                  "offload_begin", "offload_complete", "onboard_begin",
                                  "onboard_complete", "step", "dummy_run", "spec_step", "rollback", "admit",
                                  "allocate", "step_dispatch", "step_complete", "preempt",
                                  "resume", "sgl_admit", "sgl_decode", "sgl_idle",
                                  "sgl_finish", "sgl_evict"]
    for name, spec in ops.REGISTRY.items():
        assert spec.name == name and spec.summary and spec.draw is not None
        assert set(spec.fields) - set(spec.optional) <= set(spec.example) - {"op"} \
            <= set(spec.fields), name
        assert set(spec.records) <= set(spec.fields) and (spec.check is None) == (
            not spec.records), name
        assert spec.forward in (None, "real", "dummy")
        desc = spec.to_json()
        assert desc["runners"] and desc["targets"] and desc["example"]["op"] == name
    assert [s.name for s in ops.REGISTRY.values() if s.forward] == [
        "step", "dummy_run", "spec_step", "step_dispatch", "sgl_admit", "sgl_decode", "sgl_idle"]


def test_unknown_op_names_the_registry():
    obj = json.loads(Trace(RunnerConfig(), []).dumps())
    obj["ops"] = [{"op": "teleport"}]
    with pytest.raises(TraceError) as e:
        parse(obj, "t.json")
    assert "ops[0].op" in str(e.value) and "known for runner v1: add, append, remove" in str(e.value)
    assert "sgl_admit" not in str(e.value)  # the ops of the trace's model only


def test_rename_and_drop_request_come_from_each_op():
    add = {"op": "add", "req": 7, "blocks": [[5, 9], [11]], "prompt_len": 3}
    step = {"op": "step", "scheduled": [[7, 2], [8, 1]], "cudagraph_mode": "NONE"}
    assert renumber([add, step]) == [
        {"op": "add", "req": 0, "blocks": [[1, 2], [1]], "prompt_len": 3},
        {"op": "step", "scheduled": [[0, 2], [1, 1]], "cudagraph_mode": "NONE"}]
    assert ops.REGISTRY["step"].drop_request(step, 7)["scheduled"] == [[8, 1]]
    assert ops.REGISTRY["step"].drop_request({**step, "scheduled": [[7, 1]]}, 7) is None
    assert ops.REGISTRY["add"].drop_request(add, 7) is None
    assert ops.REGISTRY["condense"].drop_request({"op": "condense"}, 7) == {"op": "condense"}


def desc_after(invariant_id: str) -> list:
    return {d["id"]: d for d in inv.describe()}[invariant_id]["after"]


def test_invariant_registry_order_flags_and_startup():
    assert inv.ids() == ("VACATED_ROWS_ZERO", "DUMMY_TABLES_ZERO", "PADDED_ROWS_NEUTRAL",
                         "ROW_RESULTS_FOLLOW_REQUESTS", "GRAPH_ADDRESSES_STABLE",
                         "NO_FREE_WHILE_PENDING", "STORE_PROVENANCE", "NULL_BLOCK_FINITE",
                         "NO_STALE_WRITE",
                         "LOADED_BLOCKS_INTACT", "NO_FOREIGN_READ", "ATTENTION_FINITE",
                         "MATCHES_REFERENCE", "POOL_ACCOUNTING", "PREFIX_CONTENT",
                         "ONE_OWNER_PER_BLOCK", "CACHED_BLOCKS_IMMUTABLE",
                         "SGL_RESERVED_UNREAD", "SGL_PADDING_RESERVED", "SGL_NO_STALE_WRITE",
                         "SGL_KV_MATCHES", "SGL_TREE_CONTENT", "SGL_DECODE_READS_OWN_KV",
                         "SGL_SLOTS_ACCOUNTED", "SGL_STATE_RESERVED", "SGL_STATE_NO_STALE_WRITE", "SGL_STATE_MATCHES",
                         "SGL_STATE_TREE_CONTENT", "SGL_STATE_ACCOUNTED")
    assert inv.structural_ids() == ("VACATED_ROWS_ZERO", "DUMMY_TABLES_ZERO",
                                    "PADDED_ROWS_NEUTRAL", "ROW_RESULTS_FOLLOW_REQUESTS",
                                    "SGL_RESERVED_UNREAD", "SGL_PADDING_RESERVED",
                                    "SGL_SLOTS_ACCOUNTED", "SGL_STATE_RESERVED",
                                    "SGL_STATE_ACCOUNTED")
    assert desc_after("PADDED_ROWS_NEUTRAL") == ["step", "dummy_run", "spec_step",
                                                 "step_dispatch"]
    desc = {d["id"]: d for d in inv.describe()}
    assert desc["DUMMY_TABLES_ZERO"]["after"] == ["dummy_run"]
    assert desc["NO_FOREIGN_READ"]["after"] == ["step", "spec_step", "step_dispatch"]
    assert desc["MATCHES_REFERENCE"]["after"][0] == "start"
    assert "start" not in desc["NO_STALE_WRITE"]["after"]
    assert desc["PREFIX_CONTENT"]["after"] == ["admit", "allocate"]  # applies_text: admit
    assert "step" in desc["CACHED_BLOCKS_IMMUTABLE"]["after"]


def test_startup_trace_with_op_index_minus_one_loads():
    obj = json.loads(Trace(RunnerConfig(), []).dumps())
    obj["expect"] = {"verdict": "fail", "invariant": "GRAPH_ADDRESSES_STABLE", "op_index": -1}
    assert parse(obj).expect["op_index"] == -1
    obj["expect"]["op_index"] = -2
    with pytest.raises(TraceError, match="expect.op_index"):
        parse(obj)


# -- adding an op touches the registry entry and the implementations only -----------
def _touch(target, op):
    """A stand-in for the implementations' op method: a no-op on every target."""
    getattr(target, "touch", lambda req: None)(op["req"])


TOUCH = OpSpec(
    name="touch", summary="test-only: mention a request, change nothing",
    fields={"req": ops.INT}, example={"op": "touch", "req": 0}, apply=_touch,
    draw=lambda m, data: {"op": "touch", "req": m.ledger.live()[0]},
    enabled=lambda m: bool(m.ledger.requests), requests=lambda op: [op["req"]],
    rename=lambda op, req, block: dict(op, req=req(op["req"])))


@pytest.fixture
def touch_op(monkeypatch):
    monkeypatch.setitem(ops.REGISTRY, "touch", TOUCH)
    return TOUCH


def test_a_registered_op_flows_through_loader_replay_shrink_and_explain(touch_op):
    from harness.core.session import replay
    from harness.tools.explain import explain

    seed = json.loads((CORPORA / "seeds" / "vacated-row-not-cleared.json").read_text())
    seed["ops"].insert(1, {"op": "touch", "req": 0})
    trace = parse(seed, "touch.json")  # schema from the registry, dry run on the reference
    expect = dict(trace.expect, op_index=trace.expect["op_index"] + 1)
    verdict = replay(trace, trace.faults)
    assert verdict.matches(expect), verdict.violation
    assert {"op": "touch", "req": 0} not in next(_drop_requests(trace.ops))[1]  # drop req 0
    records = explain(trace, trace.faults)
    assert records[1]["op"] == {"op": "touch", "req": 0} and records[1]["writes"] == []


def test_a_registered_op_becomes_a_state_machine_rule(touch_op):
    from hypothesis import Phase, seed, settings
    from hypothesis.stateful import run_state_machine_as_test

    from harness.search import profiles
    from harness.search.machine import BlockFuzzMachine, make_machine

    drawn = []

    class Recording(BlockFuzzMachine):
        def teardown(self):
            drawn.extend(op["op"] for op in self.ops)

    machine = make_machine(RunnerConfig(), target="reference", base=Recording)
    seed(0)(machine)
    run_state_machine_as_test(machine, settings=settings(
        profiles.get("ci"), max_examples=10, phases=[Phase.generate]))
    assert "touch" in drawn and "add" in drawn


def test_cli_lists_ops_invariants_and_fault_families(capsys):
    from harness.cli import main

    assert main(["ops", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [o["op"] for o in listed] == list(ops.REGISTRY)
    assert listed[0]["fields"]["req"] == {"type": "integer"}
    assert main(["invariants", "--json"]) == 0
    assert [i["id"] for i in json.loads(capsys.readouterr().out)] == list(inv.ids())
    assert main(["faults", "--json"]) == 0
    families = {f["id"]: f["family"] for f in json.loads(capsys.readouterr().out)}
    assert families["vacated-row-not-cleared"] == "core"
    assert families["padded-rows-classified-as-prefill"] == "metadata"


def test_shrinker_merges_adjacent_steps_of_the_same_requests():
    add = {"op": "add", "req": 0, "blocks": [[1, 2], [3]], "prompt_len": 2}
    steps = [{"op": "step", "scheduled": [[0, 1]], "cudagraph_mode": "NONE"},
             {"op": "step", "scheduled": [[0, 3]], "cudagraph_mode": "FULL"}]
    merged = {"op": "step", "scheduled": [[0, 4]], "cudagraph_mode": "FULL"}
    assert [add, merged] in list(_candidates([add, *steps]))
    other = dict(steps[1], scheduled=[[1, 3]])
    assert ops.REGISTRY["step"].merge(steps[0], other) is None


def test_every_fault_names_the_upstream_files_it_lived_in():
    """``sites`` decides whether a target that runs the engine's own code gives a
    real verdict for a fault's trace (harness.targets.vllm.unexercised)."""
    from gpu_impl.faults import CATALOGUE, FAMILIES

    for fault in CATALOGUE.values():
        engine = "sglang/" if fault.runners == ("sglang",) else "vllm/"
        assert fault.sites and all(s.startswith(engine) and s.endswith(".py")
                                   for s in fault.sites), fault.id
        assert fault.family in FAMILIES, fault.id
