"""V1 persistent batch on gpu_impl's block tables, with its fault.

Our own take on ``vllm/v1/worker/gpu_input_batch.py``'s ``InputBatch``: the
row bookkeeping is the fault-free :class:`gpu_impl.runner_shell_v1.PersistentBatch`;
this class builds gpu_impl's :class:`~gpu_impl.block_table.MultiGroupBlockTable`
and re-introduces the fault of ``remove_request``.

Faults consulted here: ``removed-row-not-cleared`` (``remove_request``).
"""

from __future__ import annotations

import torch

from .block_table import MultiGroupBlockTable
from .faults import FaultSet
from .runner_shell_v1 import EMPTY_ROW, PersistentBatch

__all__ = ["EMPTY_ROW", "InputBatch"]


class InputBatch(PersistentBatch):
    """Rows of the persistent batch over one gpu_impl table per KV-cache group
    (see :class:`PersistentBatch` for the arrays)."""

    def __init__(self, max_num_reqs: int, widths: list[int], block_sizes: list[int],
                 kernel_block_sizes: list[int], device: torch.device, faults: FaultSet,
                 dcps: list[tuple[int, int, int]] | None = None,
                 empties: list[int] | None = None):
        self.faults = faults
        super().__init__(max_num_reqs, MultiGroupBlockTable(
            widths, block_sizes, kernel_block_sizes, max_num_reqs, device, faults, dcps,
            empties))

    def _clear_removed_row(self, row: int) -> None:
        if "removed-row-not-cleared" not in self.faults:
            super()._clear_removed_row(row)  # the historical bug skipped this
