"""CUDA only: compiled kernels and real torch.cuda.CUDAGraph capture/replay give
the same observable state as the reference on the corpora (skipped without CUDA)."""

from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

CORPORA = Path(__file__).resolve().parents[2] / "corpora"
from tests.conftest import corpus_traces  # noqa: E402


@pytest.mark.parametrize("path", corpus_traces(), ids=lambda p: p.name)
def test_corpora_on_cuda(path):
    from harness.core.session import replay
    from harness.core.trace import load

    trace = load(path)
    assert replay(trace, (), device="cuda").violation is None
    if trace.faults:
        assert_faulted_verdict(replay(trace, trace.faults, device="cuda"), trace)


def assert_faulted_verdict(verdict, trace):
    """A faulted trace fails as recorded (with the CPU emulation), or earlier:
    at start-up, where CUDA's warm-up forwards (which the emulation skips: they
    only compile kernels) already run the faulty kernel — what a real engine's
    capture would do.  tests/unit/test_cuda_graph.py checks the same rule under
    the interpreter with the warm-up switched on."""
    if verdict.matches(trace.expect):
        return
    v = verdict.violation
    assert v is not None and v.op == "start", (v, trace.expect)


def test_full_graphs_are_real_cuda_graphs():
    from gpu_impl import FaultSet, GPUModelRunnerV1
    from reference import RunnerConfig

    runner = GPUModelRunnerV1(RunnerConfig(), FaultSet(), torch.device("cuda"))
    assert runner.graphs and all(g._cuda_graph is not None for g in runner.graphs.values())
