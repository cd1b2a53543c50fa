"""The target protocol: one interface that the reference, gpu_impl (and another
engine's block-table classes) implement, and the observable state they expose.

A target takes ops through the op methods (``add``, ``append``, ``remove``,
``condense``, ``swap``, ``kv_load``, ``kv_load_begin`` / ``_complete`` / ``_fail``,
``offload_begin`` / ``_complete``, ``onboard_begin`` / ``_complete``,
``step``, ``dummy_run`` — the names of
:func:`harness.trace.apply_op`) and reports its state as an
:class:`Observation` of NumPy copies, so invariants are pure functions of
observations.  Targets are registered in :data:`REGISTRY` (one
:class:`~harness.targets.registry.TargetSpec` each: factory, device policy,
refusal, geometry limits, version); everything else looks them up with
:func:`target_spec` / :func:`make_target`.  To target another engine, see
docs/writing-a-target.md.
"""

from __future__ import annotations

import io
import os
import pickle

import numpy as np
from typing import Protocol

from reference import ReferenceV1Runner, ReferenceV2Runner, RunnerConfig, TokenSlotReference
from reference.quant import quantize

from harness.core.observation import Observation, read_rows_only, rows_indexed_by
from harness.targets import sglang, vllm
from harness.targets.registry import (TargetRefused, TargetSpec, TargetUnavailable,
                                      registry_of)
from harness.targets.runner_target import RunnerTarget

__all__ = ["REGISTRY", "TARGETS", "GpuImplTarget", "Observation", "ReferenceTarget",
           "RunnerTarget", "Target", "TargetRefused", "TargetSpec", "TargetUnavailable",
           "make_target", "target_spec"]


class Target(Protocol):
    """What the harness drives. Op methods raise ``reference.OpError`` only if the
    target validates; the harness validates every op on the reference first."""

    name: str
    config: RunnerConfig

    def add(self, req: int, blocks: list[list[int]], prompt_len: int) -> None: ...
    def append(self, req: int, blocks: list[list[int]]) -> None: ...
    def remove(self, req: int) -> None: ...
    def condense(self) -> None: ...
    def swap(self, i: int, j: int) -> None: ...
    def kv_load(self, req: int) -> None: ...
    def kv_load_begin(self, req: int, handle: int, blocks: list[list[int]]) -> None: ...
    def kv_load_complete(self, req: int, handle: int) -> None: ...
    def kv_load_fail(self, req: int, handle: int) -> None: ...
    def offload_begin(self, req: int, handle: int, blocks: list[list[int]]) -> None: ...
    def offload_complete(self, req: int, handle: int) -> None: ...
    def onboard_begin(self, req: int, handle: int, blocks: list[list[int]]) -> None: ...
    def onboard_complete(self, req: int, handle: int) -> None: ...
    def step(self, scheduled: list, cudagraph_mode: str, accepted: list | None = None,
             in_flight: bool = False, placeholders: list | None = None) -> None: ...
    def step_complete(self) -> None: ...
    def preempt(self, req: int) -> None: ...
    def resume(self, req: int, blocks: list[list[int]]) -> None: ...
    def dummy_run(self, num_reqs: int, num_tokens: int, cudagraph_mode: str) -> None: ...
    def rollback(self, req: int, num_tokens: int) -> None: ...
    def observe(self) -> Observation: ...


class _ObserveReference:
    """Observation of a reference runner (mixed into the V1 / V2 oracles)."""

    name = "reference"

    def observe(self, copy: bool = True) -> Observation:
        """The oracle's state as an :class:`Observation`.  copy False: its
        arrays are the oracle's own, valid until its next op (a session's
        oracle observation, read only by that op's checks: no copies)."""
        # copy False: the oracle's own containers too (read-only, until its next op)
        c = np.ndarray.copy if copy else _same
        lst = (lambda xs: [x.copy() for x in xs]) if copy else _same
        dct = (lambda d: {g: v.copy() for g, v in d.items()}) if copy else _same
        return Observation(
            runner=self.config.runner,
            rows_indexed_by=rows_indexed_by(self.config.runner),
            host_block_table=lst(self.rows.block_table),
            host_num_blocks_per_row=lst(self.rows.num_blocks_per_row),
            host_req_ids=c(self.rows.req_ids),
            num_computed_tokens=c(self.rows.num_computed_tokens),
            num_prompt_tokens=c(self.rows.num_prompt_tokens),
            device_block_table=lst(self.device_block_table),
            kv_cache=dct(self.kv_cache),
            kv_params=({g: quantize(v.reshape(-1, v.shape[-1]))[1].reshape(*v.shape[:-1], 2)
                        for g, v in self.kv_cache.items()} if self.config.quantized else None),
            draft_kv_cache=dct(self.draft_kv_cache),
            draft_slot_mapping=c(self.draft_slot_mapping),
            draft_rows=self.draft_rows,
            mamba_state=dct(self.mamba_state),
            kv_store={k: dct(v) for k, v in self.kv_store.items()} if copy else self.kv_store,
            host_tier=({k: (c(self.host_kv[k]) if k in self.host_kv else None)
                        for k in self.ledger.host.blocks} if self.config.host_blocks else None),
            row_accepted=(np.array([self.num_accepted_of.get(r, 0)
                                    for r in self.rows.req_ids.tolist()], np.int32)
                          if self.config.runner == "v1" else None),
            slot_mapping={g: c(self.write_slots(g)) for g in self.slot_mapping},
            state_indices={g: read_rows_only(v, self.last_forward)
                           for g, v in self.state_indices.items()},
            attn_out=dct(self.attn_out),
            last_forward=self.last_forward,
            device_row_counts=getattr(self, "device_row_counts", None),
            pool=None if self.config.allocator != "engine" else {
                g: {"ref_count": c(self.ledger.ref_count[g]),
                    "num_free": self.ledger.num_free(g)} for g in range(len(self.config.groups))},
            metadata={"query_start_loc": c(self.query_start_loc),
                      "seq_lens": c(self.seq_lens),
                      "has_initial_state": c(self.has_initial_state),
                      "is_prefilling": c(self.is_prefilling)},
        )


def _same(a):
    return a


class _ReferenceV1Target(_ObserveReference, ReferenceV1Runner):
    pass


class _ReferenceV2Target(_ObserveReference, ReferenceV2Runner):
    pass


def ReferenceTarget(config: RunnerConfig):  # noqa: N802 (a factory used like a class)
    """The NumPy oracle for ``config.runner`` as a target (``sglang``: the
    token-slot oracle, :class:`reference.token_slots.TokenSlotReference`).

    A V1 / V2 oracle's start-up (its buffers, then graph capture's dummy runs)
    is a function of the config.  The second time a config object starts an
    oracle, the state its start-up left is kept (pickled); from the third on,
    oracles of it are copies of that state (unpickled: about a sixth of the
    start-up's time), holding the caller's config object itself.  A config
    met once (most drawn geometries) costs nothing more.  An oracle whose
    arrays include a view of another (shared pages: a Mamba state is a view
    of an attention page) starts up every time: a pickle copies a view apart
    from what it views."""
    if config.runner == "sglang":
        return TokenSlotReference(config)
    kept = _STARTED.get(id(config))
    if kept is not None and kept[0] is config and kept[1] is not None:
        if kept[1] is _VIEWS:
            return _start(config)
        return _ConfigFromReference(io.BytesIO(kept[1]), config).load()
    oracle = _start(config)
    state = None
    if kept is not None and kept[0] is config:  # its second start-up: keep it
        state = _VIEWS
        if not _holds_views(oracle, set()):
            buf = io.BytesIO()
            _ConfigByReference(buf, config).dump(oracle)
            state = buf.getvalue()
    elif len(_STARTED) >= 64:
        _STARTED.clear()
    _STARTED[id(config)] = (config, state)  # the entry keeps config alive (its id unique)
    return oracle


def _start(config: RunnerConfig):
    return (_ReferenceV2Target if config.runner == "v2" else _ReferenceV1Target)(config)


# id(config) -> (config, None (started once) | _VIEWS | pickled oracle right after
# its start-up): ReferenceTarget
_STARTED: dict = {}
_VIEWS = object()  # the config's oracle holds views: it starts up every time


class _ConfigByReference(pickle.Pickler):
    """Pickles an oracle with its config as a reference, not a copy."""

    def __init__(self, file, config: RunnerConfig) -> None:
        super().__init__(file, pickle.HIGHEST_PROTOCOL)
        self._config = config

    def persistent_id(self, obj):
        return "config" if obj is self._config else None


class _ConfigFromReference(pickle.Unpickler):
    """Unpickles what :class:`_ConfigByReference` pickled, with ``config`` for its config."""

    def __init__(self, file, config: RunnerConfig) -> None:
        super().__init__(file)
        self._config = config

    def persistent_load(self, pid):
        assert pid == "config", pid
        return self._config


def _holds_views(obj, seen: set) -> bool:
    """Does ``obj`` (an oracle: its attributes, and the lists, dicts and
    blockfuzz objects they hold) hold an array that is a view of another?"""
    if id(obj) in seen:
        return False
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        return obj.base is not None
    if isinstance(obj, dict):
        return any(_holds_views(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple, set)):
        return any(_holds_views(v, seen) for v in obj)
    if type(obj).__module__.split(".")[0] in ("reference", "harness") \
            and hasattr(obj, "__dict__") and not isinstance(obj, type):
        return any(_holds_views(v, seen) for v in vars(obj).values())
    return False


def _gpu_impl_device(requested: str | None) -> str:
    """gpu_impl runs where Triton does: CUDA, or the CPU under the interpreter."""
    from gpu_impl.device import DeviceError, select_device

    try:
        return select_device(requested).type
    except DeviceError as e:
        raise TargetUnavailable(str(e)) from None


class GpuImplTarget(RunnerTarget):
    """gpu_impl's V1 / V2 model runner as a target (Triton kernels, graphs, faults).
    faults: fault ids (``gpu_impl.faults.CATALOGUE``); device: auto/cpu/cuda/None."""

    def __init__(self, config: RunnerConfig, faults=(), device: str | None = None):
        from gpu_impl.device import select_device

        dev = select_device(device)
        from gpu_impl import FaultSet, GPUModelRunnerV1, GPUModelRunnerV2

        cls = GPUModelRunnerV2 if config.runner == "v2" else GPUModelRunnerV1
        manager = None
        if config.allocator == "engine":
            from gpu_impl.kv_cache_manager import KVCacheManager

            manager = KVCacheManager(config, FaultSet(faults))
        from gpu_impl.kv_transfer import KVTransferTracker

        super().__init__("gpu_impl", cls(config, FaultSet(faults), dev), manager,
                         KVTransferTracker(FaultSet(faults)))


def _gpu_impl_target(config: RunnerConfig, faults=(), device: str | None = None):
    problem = _block_tables_only("gpu_impl")(config)
    if problem is not None:
        raise problem
    return GpuImplTarget(config, faults, device)  # looked up per call (bench times a subclass)


def _reference_refusal(config) -> TargetRefused | None:
    if config.runner == "sglang":
        return TargetRefused("runner", "the token-slot oracle chooses no rows or slots, so it "
                             "cannot stand in for an engine; replay with --target sglang")
    return None


def _reference_target(config: RunnerConfig, faults=(), device: str | None = None):
    problem = _reference_refusal(config)
    if problem is not None:
        raise problem
    return ReferenceTarget(config)


REFERENCE = TargetSpec(name="reference", description="the NumPy oracle against itself",
                       factory=_reference_target, select_device=lambda requested: "cpu",
                       refusal=_reference_refusal,
                       snapshots=lambda device_kind: True)
def _block_tables_only(name: str):
    def refusal(config) -> TargetRefused | None:
        if config.runner == "sglang":
            return TargetRefused("runner", f"the {name} target runs block-table configs (v1 "
                                 "/ v2); a token-slot trace (runner sglang) runs on --target "
                                 "sglang")
        return None
    return refusal


GPU_IMPL = TargetSpec(name="gpu_impl", description="gpu_impl (Triton kernels, CUDA graphs, "
                      "switchable faults)", factory=_gpu_impl_target,
                      refusal=_block_tables_only("gpu_impl"),
                      select_device=_gpu_impl_device, takes_faults=True,
                      # Its tensors deep-copy with their aliasing (views share the
                      # copied storage) and an emulated graph's launches follow
                      # them; a real CUDA graph cannot be copied.
                      snapshots=lambda device_kind: device_kind == "cpu")

# The registered targets, in --target order: add a new engine's spec here.
REGISTRY: dict[str, TargetSpec] = registry_of(GPU_IMPL, REFERENCE, vllm.SPEC, sglang.SPEC)
TARGETS = tuple(REGISTRY)


def target_spec(name: str) -> TargetSpec:
    """The registered target ``name``; ``ValueError`` naming the known ones otherwise."""
    if name not in REGISTRY:
        raise ValueError(f"unknown target {name!r}; known: {', '.join(TARGETS)}")
    return REGISTRY[name]


def make_target(kind: str, config: RunnerConfig, faults=(), device: str | None = None):
    """The registered target ``kind`` for ``config``.  Raises ValueError for an unknown
    name or faults on a target without them, and the target's ``TargetUnavailable`` /
    ``TargetRefused``.

    ``$BLOCKFUZZ_FAULTS`` (comma-separated ids) adds faults to every target that
    takes them (gpu_impl) in the process: the way to watch a regression test fail
    with its fault on (``BLOCKFUZZ_FAULTS=vacated-row-not-cleared pytest tests/regression``).
    """
    spec = target_spec(kind)
    if spec.takes_faults:
        extra = [f for f in os.environ.get("BLOCKFUZZ_FAULTS", "").split(",") if f]
        faults = tuple(sorted(set(faults) | set(extra)))
    elif faults:
        raise ValueError(f"faults live in gpu_impl; the {kind} target has none "
                         "(use --target gpu_impl)")
    return spec.factory(config, tuple(faults), device)
