"""V2 model runner: stable state indices, staged block tables, gather.

Our own take on ``vllm/v1/worker/gpu/model_runner.py``: a request keeps its
state index (row of the staged tables) from add to remove; a step's batch is
the scheduled requests in scheduling order, ``idx_mapping`` maps batch rows
to state indices, and the input block tables are gathered every step.  A
dummy run uses ``get_dummy_block_tables`` / ``get_dummy_slot_mappings`` and
leaves the live requests alone.  Shared machinery: :mod:`gpu_impl.runner_base`.
"""

from __future__ import annotations

import numpy as np
import torch

from .block_table import CpuGpuBuffer
from .block_table_v2 import BlockTables
from .runner_base import GPUModelRunnerBase


class GPUModelRunnerV2(GPUModelRunnerBase):
    """The implementation under test for runner ``v2``.

    req_index: {req: state index}; num_computed_tokens / num_prompt_tokens: int32
    (max_num_reqs,) by state index; dummy_tables: the views the last dummy run got.
    """

    def _init_tables(self) -> None:
        cfg = self.config
        groups = cfg.groups
        max_blocks = [1 if s.kind == "mamba" else cfg.max_num_blocks_per_req for s in groups]
        self.block_tables = BlockTables([s.block_size for s in groups],
                                        [s.kernel_block_size for s in groups], max_blocks,
                                        cfg.max_num_reqs, self.device, self.faults,
                                        [self.dcp(g) for g in range(len(groups))])
        self.req_index: dict[int, int] = {}
        self.num_computed_tokens = np.zeros(cfg.max_num_reqs, np.int32)
        self.num_prompt_tokens = np.zeros(cfg.max_num_reqs, np.int32)
        self.idx_mapping = CpuGpuBuffer((cfg.max_num_reqs,), torch.int32, self.device)
        self.dummy_tables: list[torch.Tensor] | None = None

    def kernel_table(self, group: int) -> torch.Tensor:
        return self.block_tables.input_block_tables[group]

    def kernel_block_size(self, group: int) -> int:
        return self.block_tables.kernel_block_sizes[group]

    def _compute_slot_mapping(self, group: int, tokens_padded: int) -> None:
        self.block_tables.compute_slot_mappings(group, self.req_indices.gpu, self.positions.gpu,
                                                self.slot_mappings[group], tokens_padded)

    # -- hooks -------------------------------------------------------------------
    def free_index(self) -> int:
        """The state index the next added request gets: the lowest free one."""
        used = set(self.req_index.values())
        return next(i for i in range(self.config.max_num_reqs) if i not in used)

    def _rows_add(self, req, state) -> None:
        index = self.free_index()
        self.req_index[req] = index
        self.block_tables.append_block_ids(index, state.block_ids, overwrite=True)
        self.num_computed_tokens[index] = 0
        self.num_prompt_tokens[index] = state.prompt_len

    def _rows_append(self, req, block_ids) -> None:
        self.block_tables.append_block_ids(self.req_index[req], block_ids, overwrite=False)

    def _rows_remove(self, req) -> None:
        index = self.req_index.pop(req)
        self.block_tables.clear(index)
        self.num_computed_tokens[index] = 0
        self.num_prompt_tokens[index] = 0

    def _set_num_computed(self, req, num_tokens) -> None:
        self.num_computed_tokens[self.req_index[req]] = num_tokens

    def _batch(self, scheduled):
        return [(req, n, int(self.num_computed_tokens[self.req_index[req]]))
                for req, n in scheduled]

    def _stage_tables(self, batch, reqs_padded) -> None:
        indices = [self.req_index[req] for req, _, _ in batch]
        self.idx_mapping.np[:len(indices)] = indices
        self.idx_mapping.copy_to_gpu()
        self.block_tables.apply_staged_writes()
        self.block_tables.gather_block_tables(self.idx_mapping.gpu, len(indices), reqs_padded)

    def _advance(self, batch) -> None:
        for req, n, start in batch:
            self.num_computed_tokens[self.req_index[req]] = start + n

    def _prepare_dummy(self, reqs_padded, warmup) -> None:
        self.dummy_tables = self.block_tables.get_dummy_block_tables(reqs_padded)

    def _fill_dummy_slots(self, num_tokens, tokens_padded, warmup) -> None:
        if warmup:  # start-up capture stages its own metadata; faults are runtime bugs
            for g in self.attn_groups:
                self.slot_mappings[g].fill_(-1)
            return
        self.block_tables.get_dummy_slot_mappings(
            [self.slot_mappings[g] for g in self.attn_groups], num_tokens)

    def state_rows(self) -> np.ndarray:
        """Request id per state index, -1 for a free one (int64)."""
        rows = np.full(self.config.max_num_reqs, -1, np.int64)
        for req, index in self.req_index.items():
            rows[index] = req
        return rows
