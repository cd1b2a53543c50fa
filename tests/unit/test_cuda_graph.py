"""gpu_impl/cuda_graph.py: the CPU emulation keeps the CUDA-graph contract."""

import pytest
import torch

import gpu_impl.device  # noqa: F401  (kernel modules select the device before triton)
from gpu_impl.attention import reshape_and_cache
from gpu_impl.cuda_graph import Graph, record_launches
from tests.conftest import CORPORA, corpus_traces


def test_capture_records_and_replay_reads_current_buffer_contents(device):
    if device.type == "cuda":
        pytest.skip("CPU emulation test")
    hidden = torch.zeros((4, 4), dtype=torch.float32)
    slots = torch.full((4,), -1, dtype=torch.int64)
    kv = torch.zeros((2, 4, 4), dtype=torch.float32)
    graph = Graph(device)
    with graph.capture():
        reshape_and_cache(hidden, slots, kv, 2)  # scalar num_tokens=2 is captured
    assert graph.num_launches == 1 and not kv.any()  # capture does not execute
    hidden.fill_(3.0)
    slots.copy_(torch.tensor([5, 6, 7, -1]))
    graph.replay()
    flat = kv.reshape(-1, 4)
    assert flat[5].tolist() == [3.0] * 4 and flat[6].tolist() == [3.0] * 4
    assert not flat[7].any()  # token 2 is beyond the captured scalar


def test_replay_keeps_captured_storage_even_if_runner_rebinds():
    """A rebound buffer is invisible to the graph: the GRAPH_ADDRESSES_STABLE hazard."""
    hidden = torch.ones((4, 4))
    slots = torch.tensor([0, -1, -1, -1])
    kv = torch.zeros((1, 4, 4))
    graph = Graph(torch.device("cpu"))
    with graph.capture():
        reshape_and_cache(hidden, slots, kv, 1)
    captured = dict(graph.launches[0].tensors())["kv_cache_ptr"].data_ptr()
    kv = torch.zeros((1, 4, 4))  # the runner reallocates
    graph.replay()
    assert not kv.any() and captured != kv.data_ptr()


def test_record_launches_records_without_running(device):
    hidden = torch.ones((4, 4), device=device)
    kv = torch.zeros((1, 4, 4), device=device)
    with record_launches() as launches:
        reshape_and_cache(hidden, torch.tensor([0, 1, -1, -1], device=device), kv, 2)
    assert len(launches) == 1 and not kv.any()
    names = [name for name, _ in launches[0].tensors()]
    # Unquantized, the parameter pointer is the cache itself (never dereferenced).
    assert names == ["hidden_ptr", "slot_mapping_ptr", "kv_cache_ptr", "params_ptr"]


def _runner(faults, device):
    from gpu_impl import FaultSet, GPUModelRunnerV1
    from reference import RunnerConfig

    return GPUModelRunnerV1(RunnerConfig(), FaultSet(faults), device)


def test_graph_addresses_come_from_recorded_launches(device):
    """graph_ptrs: what each captured graph's launches read against what the runner
    would launch with now; equal on the fixed runner, the rebound slot mapping shows
    (fault captured-buffer-rebound) although the runner's buffer list looks consistent."""
    fixed = _runner((), device).graph_addresses()
    assert fixed and all(a == b for ptrs in fixed.values() for a, b in ptrs.values())
    assert all("slot_mapping[0]" in ptrs and "block_table[0]" in ptrs
               for ptrs in fixed.values())
    broken = _runner(("captured-buffer-rebound",), device).graph_addresses()
    assert all(ptrs["slot_mapping[0]"][0] != ptrs["slot_mapping[0]"][1]
               for ptrs in broken.values())
    assert all(a == b for ptrs in broken.values() for name, (a, b) in ptrs.items()
               if name != "slot_mapping[0]")


def test_graph_addresses_are_recorded_again_when_a_buffer_is_rebound(device):
    """The observation is kept between ops (recording every graph's forward
    was most of an observation's cost) only while nothing it depends on was
    rebound: a buffer rebound after an observation shows in the next one."""
    runner = _runner((), device)
    first = runner.graph_addresses()
    assert runner.graph_addresses() is first  # nothing rebound: kept
    old = runner.slot_mappings[0]
    runner.slot_mappings[0] = old.clone()  # what captured-buffer-rebound does, later
    now = runner.graph_addresses()
    assert all(ptrs["slot_mapping[0]"][0] != ptrs["slot_mapping[0]"][1] for ptrs in now.values())
    runner.slot_mappings[0] = old
    assert all(a == b for ptrs in runner.graph_addresses().values() for a, b in ptrs.values())


@pytest.mark.parametrize("path", corpus_traces(), ids=lambda p: p.name)
def test_startup_warmup_forward_on_the_corpora(monkeypatch, path, device):
    """CUDA start-up runs each capture size's warm-up forward eagerly (to compile
    the kernels); a warm-up whose dummy run built no metadata must not write
    through a backend's own slot buffer, which holds no slots yet (zeros: the
    null block).  Found on an H200 by bench/gpu_check.sh (every corpus trace
    replays clean there too); replayed here with the warm-up forward switched on
    under the interpreter."""
    if device.type == "cuda":
        pytest.skip("tests/gpu replays the corpora with the real warm-up")
    import gpu_impl.runner_shell as shell
    from harness.core.session import replay
    from harness.core.trace import load

    from tests.gpu.test_cuda_graphs import assert_faulted_verdict

    monkeypatch.setattr(shell, "_WARMUP_FORWARD_ON_CPU", True)
    trace = load(path)
    verdict = replay(trace, (), device="cpu")
    assert verdict.violation is None, verdict.violation
    if trace.faults:
        assert_faulted_verdict(replay(trace, trace.faults, device="cpu"), trace)


def test_memoized_launches_reuse_only_a_launch_on_the_same_memory(device):
    """A repeated launch on identical storages is not run again and leaves what
    the launch left; different contents, or the same contents aliased
    differently, run the kernel (gpu_impl.cuda_graph.LaunchMemo)."""
    if device.type == "cuda":
        pytest.skip("the memo is the interpreter's")
    from gpu_impl.cuda_graph import memoized_launches

    def write(kv, hidden, slots, n):
        reshape_and_cache(hidden, slots, kv, n)
        return kv.clone()

    hidden = torch.arange(16, dtype=torch.float32).reshape(4, 4)
    slots = torch.tensor([5, 2, -1, 7])
    with memoized_launches() as memo:
        first = write(torch.zeros((2, 4, 4)), hidden, slots, 3)
        again = write(torch.zeros((2, 4, 4)), hidden.clone(), slots.clone(), 3)  # new tensors
        assert (memo.hits, memo.misses) == (1, 1) and torch.equal(first, again)
        write(torch.zeros((2, 4, 4)), hidden, slots, 2)  # another scalar: runs
        other = write(torch.ones((2, 4, 4)), hidden, slots, 3)  # other cache contents: runs
        assert memo.misses == 3 and torch.equal(other[first != 0], first[first != 0])
        # hidden and the cache as two views of one buffer: the same bytes, other aliasing
        buf = torch.zeros(16 + 32)
        buf[:16] = hidden.reshape(-1)
        write(buf[16:].view(2, 4, 4), buf[:16].view(4, 4), slots, 3)
        assert memo.misses == 4
    plain = write(torch.zeros((2, 4, 4)), hidden, slots, 3)  # outside: no memo, same result
    assert torch.equal(plain, first)
