"""CUDA graphs, real or emulated on the CPU with the same contract.

Every kernel launch of gpu_impl goes through :func:`launch`.  On CUDA a
:class:`Graph` is a ``torch.cuda.CUDAGraph``: capture records the launches made
inside :meth:`Graph.capture` (without running them) and ``replay`` re-runs them
on the captured tensors.  Without CUDA the :class:`Graph` records each launch
as (kernel, grid, captured arguments); ``replay`` re-launches them with the
captured tensors (same storage) and the captured scalar arguments, so only the
*contents* of buffers can change between replays — the property that makes
stale persistent buffers dangerous, and the one this emulation keeps.

On both devices a graph keeps its recorded :class:`Launch` records, so the
``GRAPH_ADDRESSES_STABLE`` invariant can compare the ``data_ptr`` each recorded
launch reads with the tensor the runner would launch with now
(:func:`record_launches` records launches without running them).
"""

from __future__ import annotations

import contextlib
import copy
import gc
from typing import NamedTuple

import torch

_recording: list | None = None  # launches of the capture / recording in progress
_record_only = True  # False while a CUDA graph captures: launches also run (into the graph)


class Launch(NamedTuple):
    """One recorded kernel launch: the Triton kernel, its grid and arguments."""

    kernel: object
    grid: tuple
    args: tuple
    kwargs: dict

    def tensors(self) -> list[tuple[str, torch.Tensor]]:
        """(kernel parameter name, tensor) for every tensor argument, in order."""
        names = getattr(self.kernel, "arg_names", None) or []
        out = [(names[i] if i < len(names) else f"arg{i}", a)
               for i, a in enumerate(self.args) if isinstance(a, torch.Tensor)]
        return out + [(k, v) for k, v in self.kwargs.items() if isinstance(v, torch.Tensor)]

    @property
    def name(self) -> str:
        return getattr(self.kernel, "__name__", type(self.kernel).__name__)

    def __deepcopy__(self, memo):
        # The kernel is code, shared; the arguments are the captured buffers,
        # copied with the rest of the runner (``memo`` keeps them the same
        # tensors the copied runner holds).
        return Launch(self.kernel, self.grid, copy.deepcopy(self.args, memo),
                      copy.deepcopy(self.kwargs, memo))


def launch(kernel, grid, *args, **kwargs) -> None:
    """Launch a Triton kernel, or record it when a graph captures / launches are recorded."""
    if _recording is not None:
        _recording.append(Launch(kernel, grid, args, kwargs))
        if _record_only:
            return
    kernel[grid](*args, **kwargs)


@contextlib.contextmanager
def _recording_into(launches: list, execute: bool):
    global _recording, _record_only
    assert _recording is None, "nested graph capture or launch recording"
    _recording, _record_only = launches, not execute
    try:
        yield launches
    finally:
        _recording, _record_only = None, True


def record_launches():
    """Context manager yielding a list of the :class:`Launch` es made in its body,
    which are recorded and not run (on any device)."""
    return _recording_into([], execute=False)


class Graph:
    """One captured forward. ``device``: torch.device of the runner."""

    def __init__(self, device: torch.device):
        self.device = device
        self._cuda_graph = torch.cuda.CUDAGraph() if device.type == "cuda" else None
        self._launches: list[Launch] = []

    @contextlib.contextmanager
    def capture(self):
        """Capture launches made in the ``with`` body (recorded on every device)."""
        if self._cuda_graph is not None:
            # No garbage collection while capturing: a collection that frees an
            # earlier runner's graph mid-capture invalidates this one (seen on an
            # H200 in a nightly worker's later seeds: cudaErrorStreamCaptureInvalidated).
            # vLLM's capture freezes the collector the same way.
            enabled = gc.isenabled()
            gc.disable()
            try:
                with torch.cuda.graph(self._cuda_graph), _recording_into(self._launches, True):
                    yield self
            finally:
                if enabled:
                    gc.enable()
            return
        with _recording_into(self._launches, False):
            yield self

    def __deepcopy__(self, memo):
        if self._cuda_graph is not None:
            raise TypeError("a captured torch.cuda.CUDAGraph cannot be copied")
        new = Graph.__new__(Graph)
        memo[id(self)] = new
        new.device, new._cuda_graph = self.device, None
        new._launches = copy.deepcopy(self._launches, memo)
        return new

    def replay(self) -> None:
        if self._cuda_graph is not None:
            self._cuda_graph.replay()
            return
        for kernel, grid, args, kwargs in self._launches:
            kernel[grid](*args, **kwargs)

    @property
    def launches(self) -> tuple[Launch, ...]:
        """The recorded launches, in capture order (their tensors are what replays read)."""
        return tuple(self._launches)

    @property
    def num_launches(self) -> int:
        return len(self._launches)
