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

Under the Triton interpreter a launch costs milliseconds, and a trace
shrinker's replays repeat many launches on identical memory (a third to
three quarters of them on the shrink bench's findings).  Inside
:func:`memoized_launches` an interpreted launch whose kernel, grid, scalar
arguments and the full bytes of every storage its tensors view are those of
an earlier launch does not run again: the storages are set to what that
launch left (:class:`LaunchMemo`).  An interpreted kernel is a deterministic
function of exactly that (it reaches memory only through its tensor
arguments), so the result is the launch's own.  Off by default; never on a
GPU.
"""

from __future__ import annotations

import contextlib
import copy
import gc
from typing import NamedTuple

import torch

from gpu_impl.interpret import hold_language_patch

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
    _run(kernel, grid, args, kwargs)


def _run(kernel, grid, args, kwargs) -> None:
    hold_language_patch()  # once per process under the interpreter (gpu_impl/interpret.py)
    if _memo is not None:
        _memo.run(kernel, grid, args, kwargs)
    else:
        kernel[grid](*args, **kwargs)


class LaunchMemo:
    """What interpreted launches left in memory, keyed by everything they could read.

    Key: the kernel, the grid, each argument in order — a tensor as (which of
    the launch's distinct storages it views, dtype, shape, strides, offset),
    anything else by type and ``repr`` — and the bytes of each distinct
    storage (so two views of one buffer stay one buffer).  Value: the new
    bytes of each storage the launch changed.  A launch that raises stores
    nothing.  ``max_bytes``: stored bytes kept (least recently used dropped
    first).  ``hits`` / ``misses`` count launches spared / run.
    """

    def __init__(self, max_bytes: int = 256 << 20):
        from collections import OrderedDict

        self.max_bytes = max_bytes
        self._entries: OrderedDict = OrderedDict()
        self._bytes = 0
        self.hits = 0
        self.misses = 0

    @staticmethod
    def _storages(args, kwargs):
        """(distinct storages as flat uint8 tensors, key parts of every argument)."""
        storages: dict[int, torch.Tensor] = {}
        parts = []
        for name, a in [(None, a) for a in args] + sorted(kwargs.items()):
            if isinstance(a, torch.Tensor):
                st = a.untyped_storage()
                ptr = st.data_ptr()
                if ptr not in storages:
                    storages[ptr] = torch.empty(0, dtype=torch.uint8).set_(
                        st, 0, (st.nbytes(),), (1,))
                parts.append((name, list(storages).index(ptr), str(a.dtype), tuple(a.shape),
                              a.stride(), a.storage_offset()))
            else:
                parts.append((name, type(a).__name__, repr(a)))
        return list(storages.values()), parts

    def run(self, kernel, grid, args, kwargs) -> None:
        import hashlib

        flat, parts = self._storages(args, kwargs)
        if any(t.device.type != "cpu" for t in flat):
            kernel[grid](*args, **kwargs)
            return
        h = hashlib.blake2b(repr((parts, [t.numel() for t in flat])).encode(), digest_size=20)
        for t in flat:
            h.update(t.numpy().data)
        key = (id(kernel), repr(grid), h.digest())
        hit = self._entries.get(key)
        if hit is not None:
            self._entries.move_to_end(key)
            self.hits += 1
            for t, after in zip(flat, hit[0]):
                if after is not None:
                    t.copy_(after)
            return
        before = [t.clone() for t in flat]
        kernel[grid](*args, **kwargs)
        self.misses += 1
        changed = [None if torch.equal(b, t) else t.clone() for b, t in zip(before, flat)]
        size = sum(c.numel() for c in changed if c is not None) + 64
        self._entries[key] = (changed, size)
        self._bytes += size
        while self._bytes > self.max_bytes and self._entries:
            _, (_, dropped) = self._entries.popitem(last=False)
            self._bytes -= dropped


_memo: LaunchMemo | None = None


@contextlib.contextmanager
def memoized_launches(max_bytes: int = 256 << 20):
    """Context manager: interpreted launches in its body go through a fresh
    :class:`LaunchMemo` (yielded); nothing changes on a GPU or when the
    interpreter is off (a compiled launch is microseconds and asynchronous)."""
    import os

    global _memo
    if os.environ.get("TRITON_INTERPRET") != "1" or _memo is not None:
        yield _memo
        return
    _memo = LaunchMemo(max_bytes)
    try:
        yield _memo
    finally:
        _memo = None


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
            _run(kernel, grid, args, kwargs)

    @property
    def launches(self) -> tuple[Launch, ...]:
        """The recorded launches, in capture order (their tensors are what replays read)."""
        return tuple(self._launches)

    @property
    def num_launches(self) -> int:
        return len(self._launches)
