"""The host tier (offload_begin / _complete, onboard_begin / _complete): the
reference's LRU rules after vLLM's CPU offloading manager, what the target's
copies must leave in host and device blocks, and the two host-tier faults,
each replayed with the fault off (nothing found) and on."""

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from harness.core.session import Session, replay
from harness.core.trace import load
from reference import OpError
from reference.host_tier import HostTier

SEEDS = Path(__file__).resolve().parents[2] / "corpora" / "seeds"
PINNED = SEEDS / "onboard-leaves-host-blocks-evictable.json"
OWN = SEEDS / "host-store-evicts-its-own-blocks.json"
TIER_CHECKS = {"NO_FREE_WHILE_PENDING", "STORE_PROVENANCE"}


def _run(session, ops):
    for op in ops:
        found = session.apply(op)
        if found:
            return found[0].invariant, found[0].op_index, found[0].detail
    return None


def _key(g, n):
    return (g, tuple(range(n)))


def test_lru_evicts_the_least_recently_evictable_block():
    """A block becomes most recent when it becomes evictable (store or last load
    completes) or is touched while evictable; a pinned or pending block is not
    evicted; the hashes being stored are protected; without room nothing is
    stored; one tier for every group."""
    tier = HostTier(2)
    a, b, c, d = (_key(0, n) for n in (4, 8, 12, 16))
    assert tier.prepare_store([a, b]) == [a, b]
    assert tier.prepare_store([c]) is None  # both pending: nothing evictable
    tier.complete_store([b])
    tier.complete_store([a])  # a became evictable last: b is the LRU
    tier.touch([b])  # ... until touched
    assert tier.prepare_store([c]) == [c] and tier.last_evicted == [a]
    tier.complete_store([c])
    tier.prepare_load([b])  # pinned: c is the only candidate
    assert tier.prepare_store([d, c]) is None and tier.last_evicted == []  # c protected
    assert tier.prepare_store([a, b]) == [a] and tier.last_evicted == [c]  # b held: skipped
    assert tier.prepare_store([_key(1, 4)]) is None  # group 1 shares the two blocks
    tier.complete_load([b])
    assert list(tier.evictable) == [b]
    assert tier.prepare_store([c, b]) is None  # b protected, a not ready: no room for c


def test_onboard_lands_the_host_blocks_kv():
    """The seed trace without its fault: the onboarded block holds request 0's
    first block (the shared prefix), and the tier kept it while it was read."""
    trace = load(PINNED)
    s = Session(trace.config)
    assert _run(s, trace.ops) is None
    kv = s.target.runner.kv_caches[0]
    assert np.array_equal(kv[3].numpy(), kv[1].numpy())
    assert list(s.target.host_view()) == [(0, tuple(int(t) for t in range(4)))]


def test_evicting_a_pinned_host_block_corrupts_the_onboard():
    """With the fault the offload evicts the block the onboard reads; with the
    tier checks skipped, the effect: request 2's KV lands in request 1's block."""
    trace = load(PINNED)
    fault = ("onboard-leaves-host-blocks-evictable",)
    assert replay(trace).violation is None
    found = replay(trace, faults=fault).violation
    assert (found.invariant, found.op_index) == ("NO_FREE_WHILE_PENDING", 8)
    damage = replay(trace, faults=fault, skip=TIER_CHECKS).violation
    assert damage.op_index == len(trace.ops) - 1, damage
    assert damage.invariant in ("MATCHES_REFERENCE", "LOADED_BLOCKS_INTACT"), damage


def test_a_store_never_evicts_a_hash_it_names():
    trace = load(OWN)
    assert replay(trace).violation is None
    found = replay(trace, faults=("host-store-evicts-its-own-blocks",)).violation
    assert (found.invariant, found.op_index) == ("STORE_PROVENANCE", 6)
    assert "dropped the block of group 0's 4-token prefix" in found.detail


def test_a_left_request_keeps_blocks_an_offload_reads():
    """Removed with an offload in flight: its blocks stay reserved until the
    offload ends, and the host block still gets its own KV."""
    trace = load(OWN)
    ops = trace.ops[:3] + [{"op": "remove", "req": 0},
                           {"op": "offload_complete", "req": 0, "handle": 0}]
    s = Session(trace.config)
    assert _run(s, ops[:4]) is None
    assert s.ledger.ref_count[0][1] == 1  # kept for the offload
    assert _run(s, ops[4:]) is None
    assert s.ledger.ref_count[0][1] == 0


@pytest.mark.parametrize("op,match", [
    ({"op": "offload_begin", "req": 1, "handle": 5, "blocks": [[3]]},
     r"blocks\[0\]\[0\]: block 3 is not a full computed block of request 1"),
    ({"op": "onboard_begin", "req": 1, "handle": 5, "blocks": [[9]]},
     r"blocks\[0\]\[0\]: block 9 is not one of request 1's blocks"),
    # the offload of that hash is still in flight: not ready
    ({"op": "onboard_begin", "req": 1, "handle": 5, "blocks": [[3]]},
     r"blocks\[0\]\[0\]: block 3 is not a full prompt block whose hash the host tier holds "
     "ready"),
    ({"op": "offload_begin", "req": 0, "handle": 0, "blocks": [[2]]},
     r"handle: handle 0 was used already"),
    ({"op": "kv_load_complete", "req": 1, "handle": 0},
     r"handle: transfer 0 is a store, not a load"),
])
def test_bad_host_ops_name_their_field(op, match):
    trace = load(PINNED)
    s = Session(trace.config)
    _run(s, trace.ops[:2] + [{"op": "offload_begin", "req": 0, "handle": 0, "blocks": [[1]]},
                             trace.ops[4]])
    with pytest.raises(OpError, match=match):
        s.apply(op)


def test_an_onboard_is_not_a_connector_load():
    trace = load(PINNED)
    s = Session(trace.config)
    assert _run(s, trace.ops[:6]) is None
    with pytest.raises(OpError, match=r"handle: transfer 1 is an onboard, not a connector load"):
        s.apply({"op": "kv_load_complete", "req": 1, "handle": 1})


def test_host_ops_need_a_host_tier():
    trace = load(PINNED)
    s = Session(dataclasses.replace(trace.config, host_blocks=0))
    _run(s, trace.ops[:2])
    with pytest.raises(OpError, match=r"op: offload_begin needs a config with a host tier"):
        s.apply(trace.ops[2])


def test_onboard_past_a_prefix_hit():
    """With prefix caching, a request's blocks past its GPU hit may be onboarded
    (vLLM asks the connector for the tokens after the locally computed ones):
    request 1 hits request 0's first block and onboards its second from the
    host tier; the faulty tier evicts it under the onboard."""
    cfg = dataclasses.replace(load(PINNED).config, enable_prefix_caching=True, host_blocks=2)
    ops = [{"op": "admit", "req": 0, "prompt_len": 8, "prefix": [], "num_new_tokens": 8},
           {"op": "step", "scheduled": [[0, 8]], "cudagraph_mode": "NONE"},
           {"op": "offload_begin", "req": 0, "handle": 0, "blocks": [[1, 2]]},
           {"op": "offload_complete", "req": 0, "handle": 0},
           {"op": "admit", "req": 1, "prompt_len": 8, "prefix": [0, 8], "num_new_tokens": 4},
           {"op": "onboard_begin", "req": 1, "handle": 1, "blocks": [[3]]},
           {"op": "admit", "req": 2, "prompt_len": 8, "prefix": [], "num_new_tokens": 8},
           {"op": "step", "scheduled": [[2, 8]], "cudagraph_mode": "NONE"},
           {"op": "offload_begin", "req": 2, "handle": 2, "blocks": [[4, 5]]},
           {"op": "offload_complete", "req": 2, "handle": 2},
           {"op": "onboard_complete", "req": 1, "handle": 1},
           {"op": "step", "scheduled": [[1, 4]], "cudagraph_mode": "NONE"}]
    s = Session(cfg)
    assert _run(s, ops[:5]) is None
    assert s.ledger.requests[1].blocks == [[1, 3]]  # block 1 hit, block 3 its own
    with pytest.raises(OpError, match=r"block 1 is not a full prompt block whose hash"):
        s.apply({"op": "onboard_begin", "req": 1, "handle": 1, "blocks": [[1]]})
    assert _run(s, ops[5:]) is None
    found = _run(Session(cfg, faults=("onboard-leaves-host-blocks-evictable",)), ops)
    assert found[:2] == ("NO_FREE_WHILE_PENDING", 8), found


UNRETIRED = SEEDS / "offload-copy-skips-compute-wait.json"


def test_a_copy_during_a_step_in_flight_stores_the_steps_kv():
    """An offload launched while the step writing its blocks is in flight: the
    fixed copy waits for the compute stream; with the fault it reads the blocks
    as they were before the step.  With the tier checks skipped, the effect:
    the request onboarding that prefix gets the stale KV."""
    trace = load(UNRETIRED)
    fault = ("offload-copy-skips-compute-wait",)
    assert replay(trace).violation is None
    found = replay(trace, faults=fault).violation
    assert (found.invariant, found.op_index) == ("STORE_PROVENANCE", 3)
    damage = replay(trace, faults=fault, skip=TIER_CHECKS).violation
    assert (damage.invariant, damage.op_index) == ("MATCHES_REFERENCE", 7), damage


def test_a_save_to_the_store_during_a_step_in_flight():
    """The same copy ordering for a save to the external store (kv_store_*), no
    host tier; a save launched with no step in flight is unaffected by the fault."""
    cfg = dataclasses.replace(load(UNRETIRED).config, host_blocks=0, allocator="trace")
    ops = [{"op": "add", "req": 0, "prompt_len": 8, "blocks": [[1, 2]]},
           {"op": "step_dispatch", "scheduled": [[0, 8]], "cudagraph_mode": "NONE"},
           {"op": "kv_store_begin", "req": 0, "handle": 0, "num_tokens": 8},
           {"op": "kv_store_complete", "req": 0, "handle": 0},
           {"op": "step_complete"},
           {"op": "kv_store_begin", "req": 0, "handle": 1, "num_tokens": 4},
           {"op": "kv_store_complete", "req": 0, "handle": 1}]
    fault = ("offload-copy-skips-compute-wait",)
    assert _run(Session(cfg), ops) is None
    assert _run(Session(cfg, faults=fault), ops)[:2] == ("STORE_PROVENANCE", 3)
    assert _run(Session(cfg, faults=fault), ops[:2] + ops[4:]) is None
