"""Asynchronous KV loads (kv_load_begin / kv_load_complete / kv_load_fail): the
reference's rule — a request that leaves keeps its blocks until its last
transfer has ended — and what the target's early free does to another request.
Each fault test also runs with the fault off and expects nothing."""

import dataclasses
from pathlib import Path

import pytest

from harness.core.session import Session
from harness.core.trace import load
from reference import OpError

SEEDS = Path(__file__).resolve().parents[2] / "corpora" / "seeds"
POOL_CHECKS = {"NO_FREE_WHILE_PENDING", "POOL_ACCOUNTING", "ONE_OWNER_PER_BLOCK"}



def _run(session, ops):
    """Apply ``ops`` (callables get the session, for blocks the target chose);
    returns the first violation's (invariant, op index), or None."""
    for op in ops:
        op = op(session) if callable(op) else op
        found = session.apply(op)
        if found:
            return found[0].invariant, found[0].op_index, found[0].detail
    return None


def _admit(req):
    return {"op": "admit", "req": req, "prompt_len": 16, "prefix": [], "num_new_tokens": 16}


def _load_all(req, handle):
    return lambda s: {"op": "kv_load_begin", "req": req, "handle": handle,
                      "blocks": [list(s.ledger.requests[req].blocks[0])]}


def _leave(kind):
    """Request 0, loading into blocks 1-4, leaves with a transfer in flight:
    ``failed`` (two handles, the first fails) or ``abort`` (removed)."""
    if kind == "failed":
        return [{"op": "kv_load_begin", "req": 0, "handle": 0, "blocks": [[1, 2]]},
                {"op": "kv_load_begin", "req": 0, "handle": 1, "blocks": [[3, 4]]},
                {"op": "kv_load_fail", "req": 0, "handle": 0}]
    return [{"op": "kv_load_begin", "req": 0, "handle": 1, "blocks": [[1, 2, 3, 4]]},
            {"op": "remove", "req": 0}]


CASES = [("failed", "failed-load-frees-before-siblings"),
         ("abort", "abort-frees-blocks-mid-load")]


@pytest.mark.parametrize("kind,fault", CASES)
def test_late_transfer_lands_on_the_next_owner(kind, fault):
    """Request 1 is admitted after request 0 left, loads its own prompt, and
    request 0's late transfer then completes.  Fixed engine: request 1 got other
    blocks, nothing fires.  With the fault, the early free is flagged where it
    happens; with the pool checks skipped, the damage itself is: request 0's KV
    over request 1's loaded prompt."""
    ops = [_admit(0), *_leave(kind), _admit(1), _load_all(1, 2),
           {"op": "kv_load_complete", "req": 1, "handle": 2},
           {"op": "kv_load_complete", "req": 0, "handle": 1}]
    cfg = load(SEEDS / f"{fault}.json").config
    assert _run(Session(cfg), ops) is None
    first = _run(Session(cfg, faults=(fault,)), ops)
    assert first[:2] == ("NO_FREE_WHILE_PENDING", len(_leave(kind)))
    damage = _run(Session(cfg, faults=(fault,), skip=POOL_CHECKS), ops)
    assert damage[:2] == ("LOADED_BLOCKS_INTACT", len(ops) - 1), damage
    assert "req 1" in damage[2]


def test_trace_allocator_refuses_a_block_a_transfer_still_loads():
    """The trace names the blocks: the reference refuses one held for a transfer
    in flight, naming the field, the holder and the transfer."""
    cfg = load(SEEDS / "failed-load-frees-before-siblings.json").config
    cfg = dataclasses.replace(cfg, allocator="trace")
    s = Session(cfg)
    _run(s, [{"op": "add", "req": 0, "blocks": [[4, 5, 6, 7]], "prompt_len": 16},
             {"op": "kv_load_begin", "req": 0, "handle": 0, "blocks": [[4, 5]]},
             {"op": "kv_load_begin", "req": 0, "handle": 1, "blocks": [[6, 7]]},
             {"op": "kv_load_fail", "req": 0, "handle": 0}])
    with pytest.raises(OpError, match=r"blocks\[0\]\[0\]: block 6 is not free: request 0 "
                                      r"holds it and transfer 1 is loading into it"):
        s.apply({"op": "add", "req": 1, "blocks": [[6, 7]], "prompt_len": 5})
    assert _run(s, [{"op": "kv_load_complete", "req": 0, "handle": 1},
                    {"op": "add", "req": 1, "blocks": [[6, 7]], "prompt_len": 5}]) is None
    assert s.ledger.finishing == {} and 0 not in s.ledger.requests


def test_trace_allocator_early_free_shows_as_content():
    """With the trace naming blocks, the target's early free is its poison: the
    landed KV the reference keeps until the last transfer ends differs."""
    cfg = load(SEEDS / "failed-load-frees-before-siblings.json").config
    cfg = dataclasses.replace(cfg, allocator="trace")
    ops = [{"op": "add", "req": 0, "blocks": [[4, 5, 6, 7]], "prompt_len": 16},
           {"op": "kv_load_begin", "req": 0, "handle": 0, "blocks": [[4, 5]]},
           {"op": "kv_load_begin", "req": 0, "handle": 1, "blocks": [[6, 7]]},
           {"op": "kv_load_fail", "req": 0, "handle": 0},
           {"op": "kv_load_complete", "req": 0, "handle": 1}]
    assert _run(Session(cfg), ops) is None
    found = _run(Session(cfg, faults=("failed-load-frees-before-siblings",)), ops)
    assert found[:2] == ("MATCHES_REFERENCE", 4)


def test_a_request_is_loaded_when_its_last_transfer_lands():
    """Two transfers: the request waits (no step) until both have landed, then
    decodes from its prompt; its loaded KV is guarded."""
    cfg = load(SEEDS / "failed-load-frees-before-siblings.json").config
    s = Session(cfg)
    _run(s, [{"op": "admit", "req": 0, "prompt_len": 15, "prefix": [], "num_new_tokens": 15},
             {"op": "kv_load_begin", "req": 0, "handle": 0, "blocks": [[1, 2]]},
             {"op": "kv_load_begin", "req": 0, "handle": 1, "blocks": [[3, 4]]},
             {"op": "kv_load_complete", "req": 0, "handle": 1}])
    step = {"op": "step", "scheduled": [[0, 1]], "cudagraph_mode": "NONE"}
    with pytest.raises(OpError, match=r"scheduled\[0\]\[0\]: request 0 waits for its KV"):
        s.apply(step)
    assert not s.ledger.requests[0].loaded
    assert _run(s, [{"op": "kv_load_complete", "req": 0, "handle": 0}, step]) is None
    assert s.ledger.requests[0].num_computed_tokens == 16


@pytest.mark.parametrize("op,match", [
    ({"op": "kv_load_begin", "req": 0, "handle": 0, "blocks": [[1, 2]]},
     r"handle: handle 0 was used already"),
    ({"op": "kv_load_begin", "req": 0, "handle": 1, "blocks": [[1]]},
     r"blocks\[0\]\[0\]: block 1 is loaded already or by a transfer in flight"),
    ({"op": "kv_load_begin", "req": 0, "handle": 1, "blocks": [[9]]},
     r"blocks\[0\]\[0\]: block 9 is not one of request 0's blocks"),
    ({"op": "kv_load_begin", "req": 0, "handle": 1, "blocks": [[]]},
     r"blocks: a transfer loads at least one block"),
    ({"op": "kv_load_complete", "req": 1, "handle": 0}, r"req: transfer 0 is request 0's, not 1's"),
    ({"op": "kv_load_fail", "req": 0, "handle": 5}, r"handle: no transfer 5 in flight"),
])
def test_bad_transfer_ops_name_their_field(op, match):
    cfg = load(SEEDS / "failed-load-frees-before-siblings.json").config
    s = Session(cfg)
    _run(s, [_admit(0), {"op": "kv_load_begin", "req": 0, "handle": 0, "blocks": [[1, 2]]}])
    with pytest.raises(OpError, match=match):
        s.apply(op)


def test_store_saves_the_next_owners_kv_under_the_prefix():
    """A store in flight when its request finishes: the fixed engine keeps the
    blocks until the store has sent, so the store holds the prefix's own KV;
    with the fault the blocks go to request 1, whose prefill the store then
    saves under request 0's prefix (STORE_PROVENANCE, with the early-free checks
    skipped)."""
    trace = load(SEEDS / "finished-request-frees-blocks-mid-store.json")
    ops = [op if op["op"] != "admit" else {k: v for k, v in op.items()
                                           if k not in ("blocks", "num_cached_tokens")}
           for op in trace.ops]
    cfg, fault = trace.config, "finished-request-frees-blocks-mid-store"
    assert _run(Session(cfg), ops) is None
    assert _run(Session(cfg, faults=(fault,)), ops)[:2] == ("NO_FREE_WHILE_PENDING", 3)
    damage = _run(Session(cfg, faults=(fault,), skip=POOL_CHECKS | {"MATCHES_REFERENCE"}), ops)
    assert damage[:2] == ("STORE_PROVENANCE", len(ops) - 1), damage
    assert "request 0's store of its first 8 tokens" in damage[2]


def test_preempted_request_keeps_blocks_a_store_still_reads():
    """Preemption with a store in flight: the blocks stay reserved (the trace
    cannot hand them out) until the store ends; the request resumes on new
    blocks meanwhile, and the store still saves its own prefix."""
    cfg = dataclasses.replace(load(SEEDS / "resumed-blocks-appended.json").config)
    s = Session(cfg)
    assert _run(s, [{"op": "add", "req": 0, "blocks": [[1, 2], [1]], "prompt_len": 5},
                    {"op": "step", "scheduled": [[0, 5]], "cudagraph_mode": "NONE"},
                    {"op": "kv_store_begin", "req": 0, "handle": 0, "num_tokens": 4},
                    {"op": "preempt", "req": 0}]) is None
    with pytest.raises(OpError, match=r"blocks\[0\]\[0\]: block 1 is not free: request 0 "
                                      r"holds it and transfer 0 is reading it \(a store\)"):
        s.apply({"op": "add", "req": 1, "blocks": [[1], [2]], "prompt_len": 1})
    assert _run(s, [{"op": "resume", "req": 0, "blocks": [[3, 4], [3]]},
                    {"op": "step", "scheduled": [[0, 5]], "cudagraph_mode": "NONE"},
                    {"op": "kv_store_complete", "req": 0, "handle": 0},
                    {"op": "add", "req": 1, "blocks": [[1], [2]], "prompt_len": 1}]) is None
    found = _run(Session(cfg, faults=("finished-request-frees-blocks-mid-store",)),
                 [{"op": "add", "req": 0, "blocks": [[1, 2], [1]], "prompt_len": 5},
                  {"op": "step", "scheduled": [[0, 5]], "cudagraph_mode": "NONE"},
                  {"op": "kv_store_begin", "req": 0, "handle": 0, "num_tokens": 4},
                  {"op": "preempt", "req": 0},
                  {"op": "kv_store_complete", "req": 0, "handle": 0}])
    assert found[0] in ("MATCHES_REFERENCE", "STORE_PROVENANCE"), found


def test_a_resumed_request_loads_from_scratch():
    """A request preempted after part of its prompt landed resumes on new blocks
    with nothing landed: its next transfers must cover the whole prompt again
    before it counts as loaded (found in review: the runner kept the old
    record, and counted the prompt computed after one new transfer)."""
    cfg = dataclasses.replace(load(SEEDS / "failed-load-frees-before-siblings.json").config,
                              allocator="trace")
    ops = [{"op": "add", "req": 0, "blocks": [[1, 2, 3, 4]], "prompt_len": 16},
           {"op": "kv_load_begin", "req": 0, "handle": 0, "blocks": [[1, 2]]},
           {"op": "kv_load_complete", "req": 0, "handle": 0},
           {"op": "preempt", "req": 0},
           {"op": "resume", "req": 0, "blocks": [[5, 6, 7, 8]]},
           {"op": "kv_load_begin", "req": 0, "handle": 1, "blocks": [[7, 8]]},
           {"op": "kv_load_complete", "req": 0, "handle": 1},
           {"op": "step", "scheduled": [[0, 1]], "cudagraph_mode": "NONE"}]
    for runner in ("v1", "v2"):
        s = Session(dataclasses.replace(cfg, runner=runner))
        assert _run(s, ops) is None
        assert s.ledger.requests[0].num_computed_tokens == 1
