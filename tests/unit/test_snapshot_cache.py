"""The shrinker's replay snapshots (harness.core.session.SnapshotCache): a
replay resumed from a copied session must be the replay from the start — same
verdict, same recorded choices — on every corpus trace, at every prefix; the
copies keep the aliasing the runners rely on (a CpuGpuBuffer's NumPy view,
kv_sharing's Mamba state over attention pages, a graph's captured buffers);
and a shrink with the cache gives the shrink without it."""

import copy
from pathlib import Path

import numpy as np
import pytest

import harness.search.shrink as shrink_mod
from harness.core.session import Session, SnapshotCache, replay
from gpu_impl.block_table import CpuGpuBuffer
from harness.core.trace import Trace, load

ROOT = Path(__file__).resolve().parents[2]
from tests.conftest import corpus_traces  # noqa: E402 (block-table traces: gpu_impl replays them)
CORPUS = [p for p in corpus_traces() if p.parent.name in ("seeds", "canary")]


def _outcome(v):
    return (v.violation and (v.violation.invariant, v.violation.op_index), v.ops_run,
            v.ops[:v.ops_run])


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.stem)
def test_a_replay_resumed_from_any_prefix_is_the_replay_from_the_start(path):
    trace = load(path)
    full = replay(trace, trace.faults, record=True)
    for k in range(full.ops_run):
        cache = SnapshotCache()
        replay(Trace(trace.config, trace.ops[:k + 1], trace.expect, trace.meta),
               trace.faults, record=True, cache=cache)
        resumed = replay(trace, trace.faults, record=True, cache=cache)
        assert cache.hits == 1, k
        assert _outcome(resumed) == _outcome(full), f"resumed after {k} ops"


def test_copies_keep_the_views_the_runners_rely_on():
    trace = load(ROOT / "corpora" / "seeds" / "mamba-writes-shared-null-block.json")
    assert trace.config.kv_sharing
    session = Session(trace.config, (), record=True)
    for op in copy.deepcopy(trace.ops[:-1]):
        session.apply(op)
    twin = copy.deepcopy(session)
    ref, ref2 = session.reference, twin.reference
    for a, m in trace.config.shared_pages().items():  # the oracle's Mamba state over pages
        assert np.shares_memory(ref2.mamba_state[m], ref2.kv_cache[a])
        assert not np.shares_memory(ref2.mamba_state[m], ref.kv_cache[a])
    impl, impl2 = session.target.runner, twin.target.runner
    buffers = [b for b in vars(impl2).values() if isinstance(b, CpuGpuBuffer)]
    assert buffers
    for b in buffers:  # a CpuGpuBuffer's host view is of its own host tensor
        b.cpu.view(-1)[0] = 123
        assert b.np.reshape(-1)[0] == 123
    # A graph's captured launches read the copied runner's buffers, not the original's.
    ptrs = {t.data_ptr() for g in impl2.graphs.values() for launch in g.launches
            for _, t in launch.tensors()}
    old = {t.data_ptr() for g in impl.graphs.values() for launch in g.launches
           for _, t in launch.tensors()}
    assert ptrs and not ptrs & old


def test_only_targets_that_say_so_are_snapshotted():
    from harness.targets import target_spec

    assert SnapshotCache.for_target("gpu_impl", "cpu") is not None
    assert SnapshotCache.for_target("reference", None) is not None
    # The vllm target's spec refuses snapshots on every device kind; asked
    # through the spec so the answer needs no vLLM installed (for_target
    # would first select a device, which needs one).
    spec = target_spec("vllm")
    assert not any(spec.snapshots(kind) for kind in ("cpu", "cuda"))


def test_a_shrink_with_snapshots_is_the_shrink_without(monkeypatch):
    # An unshrunk trace: the corpus seed with a dozen passing ops before it.
    trace = load(ROOT / "corpora" / "seeds" / "vacated-row-not-cleared.json")
    invariant = trace.expect["invariant"]
    results = []
    for use in (False, True):
        monkeypatch.setattr(shrink_mod, "USE_CACHE", use)
        small, replays = shrink_mod.shrink(trace, invariant, tuple(trace.faults))
        results.append((small.config, small.ops, replays))
    assert results[0] == results[1]
