"""V1 persistent batch: which request sits in which row, and its counters.

Our own take on ``vllm/v1/worker/gpu_input_batch.py``'s ``InputBatch``: a new
request takes the lowest free row; removing a request clears its block-table
row; ``condense`` moves the last live row into the lowest hole
(``BlockTable.move_row``) until live rows are contiguous; ``swap_states``
swaps two rows.  Token counters travel with the row.

Faults consulted here: ``removed-row-not-cleared`` (``remove_request``).
"""

from __future__ import annotations

import numpy as np
import torch

from .block_table import MultiGroupBlockTable
from .faults import FaultSet

EMPTY_ROW = -1


class InputBatch:
    """Rows of the persistent batch.

    req_ids: int64 (max_num_reqs,), -1 for a free row; num_computed_tokens /
    num_prompt_tokens: int32 (max_num_reqs,); block_table: one table per group.
    """

    def __init__(self, max_num_reqs: int, widths: list[int], block_sizes: list[int],
                 kernel_block_sizes: list[int], device: torch.device, faults: FaultSet,
                 dcps: list[tuple[int, int, int]] | None = None):
        self.faults = faults
        self.req_ids = np.full(max_num_reqs, EMPTY_ROW, np.int64)
        self.num_computed_tokens = np.zeros(max_num_reqs, np.int32)
        self.num_prompt_tokens = np.zeros(max_num_reqs, np.int32)
        self.block_table = MultiGroupBlockTable(widths, block_sizes, kernel_block_sizes,
                                                max_num_reqs, device, faults, dcps)

    @property
    def num_reqs(self) -> int:
        return int((self.req_ids != EMPTY_ROW).sum())

    def row_of(self, req: int) -> int | None:
        rows = np.flatnonzero(self.req_ids == req)
        return int(rows[0]) if rows.size else None

    def add_request(self, req: int, block_ids: list[list[int]], num_computed_tokens: int,
                    num_prompt_tokens: int) -> int:
        free = np.flatnonzero(self.req_ids == EMPTY_ROW)
        assert free.size, "persistent batch is full"
        row = int(free[0])
        self.req_ids[row] = req
        self.num_computed_tokens[row] = num_computed_tokens
        self.num_prompt_tokens[row] = num_prompt_tokens
        self.block_table.add_row(block_ids, row)
        return row

    def remove_request(self, req: int) -> int | None:
        row = self.row_of(req)
        if row is None:
            return None
        self.req_ids[row] = EMPTY_ROW
        self.num_computed_tokens[row] = 0
        self.num_prompt_tokens[row] = 0
        if "removed-row-not-cleared" not in self.faults:
            self.block_table.clear_row(row)
        return row

    def swap_states(self, i: int, j: int) -> None:
        for arr in (self.req_ids, self.num_computed_tokens, self.num_prompt_tokens):
            arr[[i, j]] = arr[[j, i]]
        self.block_table.swap_row(i, j)

    def condense(self) -> None:
        for _ in range(len(self.req_ids)):
            live = np.flatnonzero(self.req_ids != EMPTY_ROW)
            holes = np.flatnonzero(self.req_ids == EMPTY_ROW)
            if live.size == 0 or holes.size == 0 or holes[0] > live[-1]:
                return
            src, tgt = int(live[-1]), int(holes[0])
            self.req_ids[tgt] = self.req_ids[src]
            self.num_computed_tokens[tgt] = self.num_computed_tokens[src]
            self.num_prompt_tokens[tgt] = self.num_prompt_tokens[src]
            self.req_ids[src] = EMPTY_ROW
            self.num_computed_tokens[src] = 0
            self.num_prompt_tokens[src] = 0
            self.block_table.move_row(src, tgt)
        raise AssertionError("condense did not converge")
