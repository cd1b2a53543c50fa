"""gpu_impl/cuda_graph.py: the CPU emulation keeps the CUDA-graph contract."""

import pytest
import torch

import gpu_impl.device  # noqa: F401  (kernel modules select the device before triton)
from gpu_impl.attention import reshape_and_cache
from gpu_impl.cuda_graph import Graph


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
