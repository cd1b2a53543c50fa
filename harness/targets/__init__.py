"""The target protocol: one interface that the reference, gpu_impl (and another
engine's block-table classes) implement, and the observable state they expose.

A target takes ops through the op methods (``add``, ``append``, ``remove``,
``condense``, ``swap``, ``kv_load``, ``step``, ``dummy_run`` — the names of
:func:`harness.trace.apply_op`) and reports its state as an
:class:`Observation` of NumPy copies, so invariants are pure functions of
observations.  To target another engine, write a class with these methods
that drives the engine's own block tables and runner calls, and returns the
same observation fields (``None`` where the engine has no such buffer).
"""

from __future__ import annotations

import os
from typing import Protocol

from reference import ReferenceV1Runner, ReferenceV2Runner, RunnerConfig

from harness.core.observation import Observation, rows_indexed_by


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
    def step(self, scheduled: list, cudagraph_mode: str) -> None: ...
    def dummy_run(self, num_reqs: int, num_tokens: int, cudagraph_mode: str) -> None: ...
    def observe(self) -> Observation: ...


class _ObserveReference:
    """Observation of a reference runner (mixed into the V1 / V2 oracles)."""

    name = "reference"

    def observe(self) -> Observation:
        return Observation(
            runner=self.config.runner,
            rows_indexed_by=rows_indexed_by(self.config.runner),
            host_block_table=[t.copy() for t in self.rows.block_table],
            host_num_blocks_per_row=[n.copy() for n in self.rows.num_blocks_per_row],
            host_req_ids=self.rows.req_ids.copy(),
            num_computed_tokens=self.rows.num_computed_tokens.copy(),
            num_prompt_tokens=self.rows.num_prompt_tokens.copy(),
            device_block_table=[t.copy() for t in self.device_block_table],
            kv_cache={g: v.copy() for g, v in self.kv_cache.items()},
            mamba_state={g: v.copy() for g, v in self.mamba_state.items()},
            slot_mapping={g: v.copy() for g, v in self.slot_mapping.items()},
            state_indices={g: v.copy() for g, v in self.state_indices.items()},
            attn_out={g: v.copy() for g, v in self.attn_out.items()},
            last_forward=self.last_forward,
            device_row_counts=getattr(self, "device_row_counts", None),
        )


class _ReferenceV1Target(_ObserveReference, ReferenceV1Runner):
    pass


class _ReferenceV2Target(_ObserveReference, ReferenceV2Runner):
    pass


def ReferenceTarget(config: RunnerConfig):  # noqa: N802 (a factory used like a class)
    """The NumPy oracle for ``config.runner`` as a target."""
    return (_ReferenceV2Target if config.runner == "v2" else _ReferenceV1Target)(config)


class GpuImplTarget:
    """gpu_impl's V1 model runner as a target (Triton kernels, graphs, faults)."""

    name = "gpu_impl"

    def __init__(self, config: RunnerConfig, faults=(), device: str | None = None):
        from gpu_impl.device import select_device

        dev = select_device(device)
        from gpu_impl import FaultSet, GPUModelRunnerV1, GPUModelRunnerV2

        self.config = config
        cls = GPUModelRunnerV2 if config.runner == "v2" else GPUModelRunnerV1
        self.runner = cls(config, FaultSet(faults), dev)

    def add(self, req, blocks, prompt_len):
        self.runner.add_request(req, blocks, prompt_len)

    def append(self, req, blocks):
        self.runner.append_blocks(req, blocks)

    def remove(self, req):
        self.runner.finish_request(req)

    def condense(self):
        self.runner.condense()

    def swap(self, i, j):
        self.runner.swap_states(i, j)

    def kv_load(self, req):
        self.runner.kv_load(req)

    def step(self, scheduled, cudagraph_mode):
        self.runner.execute_model(scheduled, cudagraph_mode)

    def dummy_run(self, num_reqs, num_tokens, cudagraph_mode):
        self.runner.dummy_run(num_reqs, num_tokens, cudagraph_mode)

    def observe(self) -> Observation:
        return Observation(runner=self.config.runner,
                           rows_indexed_by=rows_indexed_by(self.config.runner),
                           **self.runner.snapshot())


class VllmTarget(GpuImplTarget):
    """The installed vLLM's block-table classes as a target (:mod:`harness.targets.vllm`),
    driven by gpu_impl's fault-free runner shells (:mod:`harness.targets.vllm_runners`).
    Raises ``TargetUnavailable`` / ``TargetRefused`` (both exit 2 in the CLI).
    """

    name = "vllm"

    def __init__(self, config: RunnerConfig, device: str | None = None):
        from harness.targets.vllm import make_vllm_runner

        self.config = config
        self.runner = make_vllm_runner(config, device)


TARGETS = ("gpu_impl", "reference", "vllm")


def make_target(kind: str, config: RunnerConfig, faults=(), device: str | None = None):
    """``kind``: ``gpu_impl``, ``reference`` or ``vllm``. Raises ValueError for others
    (and the vllm target's ``TargetUnavailable`` / ``TargetRefused``).

    ``$BLOCKFUZZ_FAULTS`` (comma-separated ids) adds faults to every gpu_impl
    target of the process: the way to watch a regression test fail with its
    fault on (``BLOCKFUZZ_FAULTS=vacated-row-not-cleared pytest tests/regression``).
    """
    extra = [f for f in os.environ.get("BLOCKFUZZ_FAULTS", "").split(",") if f]
    if kind == "gpu_impl":
        faults = tuple(sorted(set(faults) | set(extra)))
        return GpuImplTarget(config, faults, device)
    if kind == "reference":
        if faults:
            raise ValueError("the reference has no faults; use --target gpu_impl")
        return ReferenceTarget(config)
    if kind == "vllm":
        if faults:
            raise ValueError("faults live in gpu_impl; the vllm target runs the installed "
                             "release as it is")
        return VllmTarget(config, device)
    raise ValueError(f"unknown target {kind!r}; known: {', '.join(TARGETS)}")
