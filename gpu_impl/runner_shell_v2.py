"""V2 runner shell: stable state indices around any engine's V2 block tables.

Our own take on ``vllm/v1/worker/gpu/model_runner.py``, fault-free: a request
keeps its state index (row of the staged tables) from add to remove — the
lowest free one when it arrives; a step's batch is the scheduled requests in
scheduling order, ``idx_mapping`` maps batch rows to state indices, and the
input block tables are gathered every step.  A dummy run uses
``get_dummy_block_tables`` / ``get_dummy_slot_mappings`` and leaves the live
requests alone.  The block tables are the subclass's (``_make_block_tables``):
gpu_impl's :class:`gpu_impl.block_table_v2.BlockTables` or another engine's
class with ``append_block_ids``, ``apply_staged_writes``,
``get_dummy_block_tables`` and ``input_block_tables``.
"""

from __future__ import annotations

import abc

import numpy as np
import torch

from .block_table import CpuGpuBuffer
from .runner_shell import CachedRequestState, RunnerShell


class RunnerShellV2(RunnerShell):
    """V2 runner. req_index: {req: state index}; num_computed_tokens /
    num_prompt_tokens: int32 (max_num_reqs,) by state index; idx_mapping: int32
    (max_num_reqs,) state index per batch row."""

    @abc.abstractmethod
    def _make_block_tables(self):
        """The engine's V2 block tables for this config."""

    @abc.abstractmethod
    def _clear_staged_row(self, index: int) -> None:
        """A finished request's state index is released (clear it, or leave it to be
        overwritten on reuse, as the engine does)."""

    @abc.abstractmethod
    def _gather(self, num_reqs: int, reqs_padded: int) -> None:
        """Gather the batch's staged rows (``idx_mapping``) into the input block tables."""

    def _init_tables(self) -> None:
        cfg = self.config
        self.req_index: dict[int, int] = {}
        self.num_computed_tokens = np.zeros(cfg.max_num_reqs, np.int32)
        self.num_prompt_tokens = np.zeros(cfg.max_num_reqs, np.int32)
        self.accepted_by_index = np.ones(cfg.max_num_reqs, np.int32)  # by state index
        self.idx_mapping = CpuGpuBuffer((cfg.max_num_reqs,), torch.int32, self.device)
        self.block_tables = self._make_block_tables()

    def kernel_table(self, group: int) -> torch.Tensor:
        return self.block_tables.input_block_tables[group]

    def free_index(self) -> int:
        """The state index the next added request gets: the lowest free one."""
        used = set(self.req_index.values())
        return next(i for i in range(self.config.max_num_reqs) if i not in used)

    def _assign_index(self, req: int, state: CachedRequestState) -> int:
        """Give an arriving request its state index (ours: :meth:`free_index`)."""
        index = self.free_index()
        self.req_index[req] = index
        return index

    def _release_index(self, req: int) -> int:
        """A finished request gives its state index back; returns it."""
        return self.req_index.pop(req)

    # -- hooks -------------------------------------------------------------------
    def _rows_add(self, req, state) -> None:
        index = self._assign_index(req, state)
        self.block_tables.append_block_ids(index, state.block_ids, overwrite=True)
        self.num_computed_tokens[index] = state.num_computed_tokens
        self.num_prompt_tokens[index] = state.prompt_len
        self.accepted_by_index[index] = 1
        if self.align:
            # V2's hybrid model state seeds the running Mamba column from the
            # computed (prefix-hit) tokens, in Mamba blocks (vLLM's
            # MambaHybridModelState.add_request).
            self.mamba_state_idx[req] = (state.num_computed_tokens - 1) \
                // self._mamba_seed_block_size()

    def _rows_append(self, req, block_ids) -> None:
        self.block_tables.append_block_ids(self.req_index[req], block_ids, overwrite=False)

    def _rows_remove(self, req) -> None:
        index = self._release_index(req)
        self._clear_staged_row(index)
        self.num_computed_tokens[index] = 0
        self.num_prompt_tokens[index] = 0

    def _set_num_computed(self, req, num_tokens) -> None:
        self.num_computed_tokens[self.req_index[req]] = num_tokens

    def _batch(self, scheduled):
        """Scheduling order; with a drafter, vLLM V2's ``sort_batch_req_ids``:
        requests with draft tokens, then uniform ``1 + k`` decodes, then by
        token count (a stable sort)."""
        k = self.config.num_speculative_tokens
        if k:
            def key(item):
                state, n = self.requests[item[0]], item[1]
                drafts = state.num_computed_tokens >= state.prompt_len and n > 1
                return (not drafts, n != 1 + k, n)
            scheduled = sorted(scheduled, key=key)
        return [(req, n, int(self.num_computed_tokens[self.req_index[req]]))
                for req, n in scheduled]

    def _stage_tables(self, batch, reqs_padded) -> None:
        indices = [self.req_index[req] for req, _, _ in batch]
        self._batch_size = len(indices)
        self.idx_mapping.np[:len(indices)] = indices
        self.idx_mapping.copy_to_gpu()
        self.block_tables.apply_staged_writes()
        self._gather(len(indices), reqs_padded)

    def _row_counters(self, reqs_padded: int) -> tuple[np.ndarray, np.ndarray]:
        """By batch row through ``idx_mapping``; padded rows have no state index (0, 0)."""
        computed, prompt = np.zeros(reqs_padded, np.int32), np.zeros(reqs_padded, np.int32)
        n = min(self._batch_size, reqs_padded)
        idx = self.idx_mapping.np[:n]
        computed[:n], prompt[:n] = self.num_computed_tokens[idx], self.num_prompt_tokens[idx]
        return computed, prompt

    def _row_accepted(self, num_reqs: int) -> np.ndarray:
        return self.accepted_by_index[self.idx_mapping.np[:num_reqs]].copy()

    def _set_accepted(self, req: int, a: int) -> None:
        self.accepted_by_index[self.req_index[req]] = a
        self.requests[req].num_accepted = a

    def _store_accepted(self, batch, kept) -> None:
        for (req, _, _), a in zip(batch, kept):
            self.accepted_by_index[self.req_index[req]] = a
            self.requests[req].num_accepted = a

    def _advance(self, batch) -> None:
        for req, n, start in batch:
            self.num_computed_tokens[self.req_index[req]] = start + n

    def _prepare_dummy(self, reqs_padded, warmup) -> list[torch.Tensor]:
        return list(self.block_tables.get_dummy_block_tables(reqs_padded))

    def state_rows(self) -> np.ndarray:
        """Request id per state index, -1 for a free one (int64)."""
        rows = np.full(self.config.max_num_reqs, -1, np.int64)
        for req, index in self.req_index.items():
            rows[index] = req
        return rows

    def _staged_rows(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """(staged rows, block counts) per group, by state index."""
        bt = self.block_tables
        return [t.np.copy() for t in bt.block_tables], [n.np.copy() for n in bt.num_blocks]

    def _host_rows(self) -> dict:
        tables, counts = self._staged_rows()
        return dict(host_block_table=tables, host_num_blocks_per_row=counts,
                    host_req_ids=self.state_rows(),
                    num_computed_tokens=self.num_computed_tokens.copy(),
                    num_prompt_tokens=self.num_prompt_tokens.copy())
