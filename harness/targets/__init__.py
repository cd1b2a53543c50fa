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

    def _rows(self) -> dict:
        """Host rows: V1 persistent batch, V2 staged tables by state index."""
        r = self.runner
        if self.config.runner == "v2":
            bt = r.block_tables
            return dict(host_block_table=[t.np.copy() for t in bt.block_tables],
                        host_num_blocks_per_row=[n.np.copy() for n in bt.num_blocks],
                        host_req_ids=r.state_rows(),
                        num_computed_tokens=r.num_computed_tokens.copy(),
                        num_prompt_tokens=r.num_prompt_tokens.copy())
        batch = r.input_batch
        tables = batch.block_table.block_tables
        return dict(host_block_table=[t.block_table.np.copy() for t in tables],
                    host_num_blocks_per_row=[t.num_blocks_per_row.copy() for t in tables],
                    host_req_ids=batch.req_ids.copy(),
                    num_computed_tokens=batch.num_computed_tokens.copy(),
                    num_prompt_tokens=batch.num_prompt_tokens.copy())

    def _width(self, group: int) -> int | None:
        """Block-table columns to report (None: all the runner has)."""
        return None

    def observe(self) -> Observation:
        r = self.runner

        def host(t):
            return t.detach().cpu().numpy().copy()

        rows = self._rows()
        dummy = None
        if self.config.runner == "v2" and r.last_forward is not None and r.last_forward.dummy \
                and r.dummy_tables is not None:
            dummy = [(not bool(v.any()), v.data_ptr() == t.data_ptr())
                     for v, t in zip(r.dummy_tables, r.block_tables.input_block_tables)]
        groups = range(len(self.config.groups))
        rows["host_block_table"] = [t[:, :self._width(g)]
                                    for g, t in zip(groups, rows["host_block_table"])]
        current = r.buffers()
        return Observation(
            runner=self.config.runner,
            rows_indexed_by=rows_indexed_by(self.config.runner),
            **rows,
            device_block_table=[host(r.kernel_table(g))[:, :self._width(g)] for g in groups],
            kv_cache={g: host(v) for g, v in r.kv_caches.items()},
            mamba_state={g: host(v) for g, v in r.mamba_states.items()},
            slot_mapping={g: host(v) for g, v in r.slot_mappings.items()},
            state_indices={g: host(v) for g, v in r.state_indices.items()},
            attn_out={g: host(v) for g, v in r.attn_out.items()},
            last_forward=r.last_forward,
            graph_ptrs={size: {name: (ptr, current[name].data_ptr())
                               for name, ptr in g.captured_ptrs.items()}
                        for size, g in sorted(r.graphs.items())},
            dummy_tables=dummy,
        )


class VllmTarget(GpuImplTarget):
    """The installed vLLM's block-table classes as a target (:mod:`harness.vllm_target`).

    Observations report the columns the reference has: vLLM V1 pads each row
    to an alignment its attention backends need (columns nothing writes).
    Raises ``TargetUnavailable`` / ``TargetRefused`` (both exit 2 in the CLI).
    """

    name = "vllm"

    def __init__(self, config: RunnerConfig, device: str | None = None):
        from harness.targets.vllm import make_vllm_runner

        self.config = config
        self.runner = make_vllm_runner(config, device)

    def _width(self, group: int) -> int:
        cfg = self.config
        spec = cfg.groups[group]
        return cfg.blocks_per_req_max(group) * (spec.block_size // self.runner.kernel_block_size(
            group) if spec.kind == "attention" else 1)

    def _rows(self) -> dict:
        if self.config.runner == "v1":
            return super()._rows()
        from harness.targets.vllm import staged_rows

        r = self.runner
        tables, counts = staged_rows(r.block_tables, self.config.max_num_reqs)
        return dict(host_block_table=tables, host_num_blocks_per_row=counts,
                    host_req_ids=r.state_rows(),
                    num_computed_tokens=r.num_computed_tokens.copy(),
                    num_prompt_tokens=r.num_prompt_tokens.copy())


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
