"""CUDA graphs, real or emulated on the CPU with the same contract.

Every kernel launch of gpu_impl goes through :func:`launch`.  On CUDA a
:class:`Graph` is a ``torch.cuda.CUDAGraph``: capture records the launches made
inside :meth:`Graph.capture` (without running them) and ``replay`` re-runs them
on the captured tensors.  Without CUDA the :class:`Graph` records each launch
as (kernel, grid, captured arguments); ``replay`` re-launches them with the
captured tensors (same storage) and the captured scalar arguments, so only the
*contents* of buffers can change between replays — the property that makes
stale persistent buffers dangerous, and the one this emulation keeps.

A graph also remembers the ``data_ptr`` of every tensor it captured, so the
``GRAPH_ADDRESSES_STABLE`` invariant can compare them with the runner's live
buffers.
"""

from __future__ import annotations

import contextlib

import torch

_recording: list | None = None  # launches of the CPU graph being captured


def launch(kernel, grid, *args, **kwargs) -> None:
    """Launch a Triton kernel, or record it when a CPU graph is capturing."""
    if _recording is not None:
        _recording.append((kernel, grid, args, kwargs))
        return
    kernel[grid](*args, **kwargs)


class Graph:
    """One captured forward. ``device``: torch.device of the runner."""

    def __init__(self, device: torch.device):
        self.device = device
        self._cuda_graph = torch.cuda.CUDAGraph() if device.type == "cuda" else None
        self._launches: list = []
        self.captured_ptrs: dict[str, int] = {}

    @contextlib.contextmanager
    def capture(self, buffers: dict[str, torch.Tensor]):
        """Capture launches made in the ``with`` body; ``buffers`` names the
        persistent tensors whose addresses the graph now depends on."""
        global _recording
        self.captured_ptrs = {name: t.data_ptr() for name, t in sorted(buffers.items())}
        if self._cuda_graph is not None:
            with torch.cuda.graph(self._cuda_graph):
                yield self
            return
        assert _recording is None, "nested graph capture"
        _recording = self._launches
        try:
            yield self
        finally:
            _recording = None

    def replay(self) -> None:
        if self._cuda_graph is not None:
            self._cuda_graph.replay()
            return
        for kernel, grid, args, kwargs in self._launches:
            kernel[grid](*args, **kwargs)

    @property
    def num_launches(self) -> int:
        return len(self._launches)
