"""V1 persistent batch rows: block tables of every KV-cache group, in NumPy.

Models ``vllm/v1/worker/block_table.py`` (``BlockTable`` / ``MultiGroupBlockTable``)
and the row bookkeeping of ``vllm/v1/worker/gpu_input_batch.py`` (``InputBatch``:
``add_request`` at the lowest free row, ``remove_request``, ``condense``,
``swap_states``), with the fixed semantics:

- removing a request zeroes its row and its ``num_blocks_per_row``;
- ``move_row(src, tgt)`` copies the first ``num_blocks`` ids, then zeroes the
  vacated source row (the stale-row fix);
- ``condense`` moves the last live row into the lowest hole until the live rows
  are contiguous.

Rows hold *kernel* block ids: when the attention kernel's block size divides the
allocation block size, allocation block ``b`` becomes kernel blocks ``b*k ..
b*k + k - 1`` (vLLM's ``map_to_kernel_blocks``), and ``num_blocks_per_row``
counts kernel blocks.  Besides block ids a row carries the request id and its token counters
(``num_computed_tokens``, ``num_prompt_tokens``); they move with the row.
"""

from __future__ import annotations

import numpy as np

from .config import RunnerConfig

EMPTY_ROW = -1


class PersistentBatchRows:
    """Host rows of a V1 persistent batch.

    block_table[g]: int32 (max_num_reqs, width_g); num_blocks_per_row[g]: int32
    (max_num_reqs,); req_ids: int64 (max_num_reqs,), ``EMPTY_ROW`` when free;
    num_computed_tokens / num_prompt_tokens: int32 (max_num_reqs,).
    """

    def __init__(self, config: RunnerConfig):
        self.config = config
        rows = config.max_num_reqs
        # Rows hold kernel blocks: allocation block b -> b*k .. b*k + k - 1.
        self.ks = [g.block_size // g.kernel_block_size for g in config.groups]
        # Empty entries: the null block, or PAD_SLOT_ID where block 0 is an
        # ordinary block (config.empty_entry).
        self.empty = [config.empty_entry(g) for g in range(len(config.groups))]
        self.block_table = [np.full((rows, config.blocks_per_req_max(g) * self.ks[g]),
                                    self.empty[g], np.int32)
                            for g in range(len(config.groups))]
        self.num_blocks_per_row = [np.zeros(rows, np.int32) for _ in config.groups]
        self.req_ids = np.full(rows, EMPTY_ROW, np.int64)
        self.num_computed_tokens = np.zeros(rows, np.int32)
        self.num_prompt_tokens = np.zeros(rows, np.int32)

    # -- queries -----------------------------------------------------------
    def row_of(self, req: int) -> int | None:
        hits = (self.req_ids == req).nonzero()[0]  # (1-D: flatnonzero's wrapper costs more)
        assert hits.size <= 1, (req, self.req_ids)
        return int(hits[0]) if hits.size else None

    def lowest_free_row(self) -> int | None:
        free = (self.req_ids == EMPTY_ROW).nonzero()[0]
        return int(free[0]) if free.size else None

    def num_live_rows(self) -> int:
        return int((self.req_ids != EMPTY_ROW).sum())

    # -- row ops -----------------------------------------------------------
    def add_row(self, row: int, req: int, blocks: list[list[int]],
                num_computed_tokens: int, num_prompt_tokens: int) -> None:
        assert self.req_ids[row] == EMPTY_ROW
        self.req_ids[row] = req
        self.num_computed_tokens[row] = num_computed_tokens
        self.num_prompt_tokens[row] = num_prompt_tokens
        for g, ids in enumerate(blocks):
            self.num_blocks_per_row[g][row] = 0
            self.append_row(row, g, ids)

    def append_row(self, row: int, group: int, ids: list[int]) -> None:
        """Append allocation blocks ``ids`` as kernel blocks; counts are in kernel blocks."""
        k = self.ks[group]
        kernel_ids = (np.asarray(ids, np.int64)[:, None] * k + np.arange(k)).reshape(-1)
        start = int(self.num_blocks_per_row[group][row])
        end = start + len(kernel_ids)
        assert end <= self.block_table[group].shape[1]
        self.block_table[group][row, start:end] = kernel_ids
        self.num_blocks_per_row[group][row] = end

    def clear_row(self, row: int) -> None:
        """Remove the request at ``row``: ids to the empty entry (null block), counts to zero."""
        self.req_ids[row] = EMPTY_ROW
        self.num_computed_tokens[row] = 0
        self.num_prompt_tokens[row] = 0
        for g in range(len(self.block_table)):
            self.block_table[g][row] = self.empty[g]
            self.num_blocks_per_row[g][row] = 0

    def move_row(self, src: int, tgt: int) -> None:
        """Move row ``src`` into the hole ``tgt`` and zero the vacated ``src``."""
        assert self.req_ids[tgt] == EMPTY_ROW and self.req_ids[src] != EMPTY_ROW
        for g in range(len(self.block_table)):
            n = int(self.num_blocks_per_row[g][src])
            self.block_table[g][tgt, :n] = self.block_table[g][src, :n]
            self.num_blocks_per_row[g][tgt] = n
        self.req_ids[tgt] = self.req_ids[src]
        self.num_computed_tokens[tgt] = self.num_computed_tokens[src]
        self.num_prompt_tokens[tgt] = self.num_prompt_tokens[src]
        self.clear_row(src)

    def swap_row(self, i: int, j: int) -> None:
        """Swap two whole rows (``InputBatch.swap_states``)."""
        for arr in [*self.block_table, *self.num_blocks_per_row, self.req_ids,
                    self.num_computed_tokens, self.num_prompt_tokens]:
            arr[[i, j]] = arr[[j, i]]

    def permute(self, order: list[int]) -> None:
        """Rows ``[0, len(order))`` become rows ``order`` (row i <- old row order[i])."""
        n = len(order)
        for arr in [*self.block_table, *self.num_blocks_per_row, self.req_ids,
                    self.num_computed_tokens, self.num_prompt_tokens]:
            arr[:n] = arr[order].copy()

    def condense(self) -> None:
        """Move the last live row into the lowest hole until live rows are contiguous."""
        for _ in range(len(self.req_ids)):
            empty = self.req_ids == EMPTY_ROW
            live, holes = (~empty).nonzero()[0], empty.nonzero()[0]
            if live.size == 0 or holes.size == 0 or holes[0] > live[-1]:
                return
            self.move_row(int(live[-1]), int(holes[0]))
        raise AssertionError("condense did not converge")
