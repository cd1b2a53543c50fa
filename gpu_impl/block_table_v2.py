"""V2 block tables: staged per-request rows, and a gather into the input tables.

Our own take on ``vllm/v1/worker/gpu/block_table.py`` (``BlockTables``): a
request's blocks live in the row of its stable state index; writes are staged
on the host and applied to the device copy; each step a Triton kernel gathers
the scheduled rows, in batch order through ``idx_mapping``, into the
persistent *input block tables* that kernels and CUDA graphs read — copying
each row's ``num_blocks`` entries only (what lies past them is what an earlier
batch left) and zeroing rows padded for a FULL graph.  Dummy runs get zeroed
views of the input tables (same storage) and a PAD-filled slot-mapping buffer.

Faults consulted here: ``dummy-tables-not-zeroed``, ``dummy-slots-partial-fill``,
``kernel-blocks-count-unscaled``, ``kernel-block-size-ignored``.
"""

from __future__ import annotations

import numpy as np
import torch
from ._triton import tl, triton

from .block_table import PAD_SLOT_ID, CpuGpuBuffer, compute_slot_mapping
from .cuda_graph import launch
from .faults import FaultSet


class BlockTables:
    """All KV-cache groups' staged tables and persistent input tables.

    block_tables[g]: int32 (max_num_reqs, width_g) host+device, row = state index;
    num_blocks[g]: int32 (max_num_reqs,) host+device, in kernel blocks;
    input_block_tables[g]: int32 (max_num_reqs, width_g) device, row = batch index.
    width_g = max allocation blocks * (block_size // kernel_block_size).
    """

    def __init__(self, block_sizes: list[int], kernel_block_sizes: list[int],
                 max_blocks: list[int], max_num_reqs: int, device: torch.device,
                 faults: FaultSet, dcps: list[tuple[int, int, int]],
                 empties: list[int] | None = None):
        self.block_sizes = block_sizes
        # An empty entry per group: the null block, or PAD_SLOT_ID (no null block).
        self.empties = empties or [0] * len(block_sizes)
        self.dcps = dcps
        self.kernel_block_sizes = kernel_block_sizes
        self.ks = [bs // kbs for bs, kbs in zip(block_sizes, kernel_block_sizes)]
        self.faults = faults
        self.block_tables = [CpuGpuBuffer((max_num_reqs, w * k), torch.int32, device)
                             for w, k in zip(max_blocks, self.ks)]
        self.num_blocks = [CpuGpuBuffer((max_num_reqs,), torch.int32, device)
                           for _ in block_sizes]
        self.input_block_tables = [torch.full((max_num_reqs, w * k), e, dtype=torch.int32,
                                              device=device)
                                   for w, k, e in zip(max_blocks, self.ks, self.empties)]
        for buf, e in zip(self.block_tables, self.empties):
            buf.np[:] = e
            buf.copy_to_gpu()

    def append_block_ids(self, req_index: int, new_block_ids: list[list[int]],
                         overwrite: bool) -> None:
        """Stage ``new_block_ids`` (allocation ids, per group) for ``req_index``."""
        for g, ids in enumerate(new_block_ids):
            k = self.ks[g]
            kernel_ids = (np.asarray(ids, np.int64)[:, None] * k + np.arange(k)).reshape(-1)
            start = 0 if overwrite else int(self.num_blocks[g].np[req_index])
            self.block_tables[g].np[req_index, start:start + len(kernel_ids)] = kernel_ids
            grow = len(ids) if "kernel-blocks-count-unscaled" in self.faults else len(kernel_ids)
            self.num_blocks[g].np[req_index] = start + grow

    def clear(self, req_index: int) -> None:
        for g in range(len(self.block_tables)):
            self.block_tables[g].np[req_index] = self.empties[g]
            self.num_blocks[g].np[req_index] = 0

    def apply_staged_writes(self) -> None:
        for buf in (*self.block_tables, *self.num_blocks):
            buf.copy_to_gpu()

    def gather_block_tables(self, idx_mapping: torch.Tensor, num_reqs: int,
                            num_reqs_padded: int) -> None:
        """input[b] = staged[idx_mapping[b]] (num_blocks entries) for b < num_reqs;
        rows [num_reqs, num_reqs_padded) set to the group's empty entry (padding
        routes to the null block, or to ``PAD_SLOT_ID`` where there is none)."""
        for g, inputs in enumerate(self.input_block_tables):
            width = inputs.shape[1]
            launch(_gather_block_tables_kernel, (1,), idx_mapping, self.num_blocks[g].gpu,
                   self.block_tables[g].gpu, inputs, num_reqs, num_reqs_padded, WIDTH=width,
                   BLOCK_R=triton.next_power_of_2(inputs.shape[0]),
                   BLOCK_W=triton.next_power_of_2(width), EMPTY=self.empties[g])

    def get_dummy_block_tables(self, num_reqs: int) -> list[torch.Tensor]:
        """Views of the input tables' first ``num_reqs`` rows (same storage), reset
        to each group's empty entry (zero: the null block)."""
        if "dummy-tables-not-zeroed" not in self.faults:
            for inputs, empty in zip(self.input_block_tables, self.empties):
                inputs[:num_reqs].fill_(empty)
        return [inputs[:num_reqs] for inputs in self.input_block_tables]

    def get_dummy_slot_mappings(self, slot_mappings: list[torch.Tensor],
                                num_tokens: int) -> None:
        """PAD-fill the whole persistent slot-mapping buffers."""
        for sm in slot_mappings:
            if "dummy-slots-partial-fill" in self.faults:
                sm[:num_tokens].fill_(PAD_SLOT_ID)  # padded tail keeps old slots
            else:
                sm.fill_(PAD_SLOT_ID)

    def compute_slot_mappings(self, group: int, req_indices: torch.Tensor,
                              positions: torch.Tensor, slot_mapping: torch.Tensor,
                              num_tokens_padded: int) -> None:
        """Slot mapping of the batch's tokens through the input tables (batch rows)."""
        compute_slot_mapping(self.input_block_tables[group], self.block_sizes[group],
                             self.kernel_block_sizes[group], self.dcps[group], req_indices,
                             positions, slot_mapping, num_tokens_padded,
                             ignore_kernel_blocks="kernel-block-size-ignored" in self.faults,
                             row_unguarded="slot-mapping-row-unguarded" in self.faults)


@triton.jit
def _gather_block_tables_kernel(
    idx_mapping_ptr,  # int32 [max_num_reqs]: state index of each batch row
    num_blocks_ptr,  # int32 [max_num_reqs]: entries to copy, per state index
    block_tables_ptr,  # int32 [max_num_reqs, WIDTH]: staged rows, by state index
    input_block_tables_ptr,  # int32 [max_num_reqs, WIDTH]: persistent output, by batch row
    num_reqs,  # batch rows to gather
    num_reqs_padded,  # rows [num_reqs, num_reqs_padded) get EMPTY
    WIDTH: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_W: tl.constexpr,
    EMPTY: tl.constexpr,  # an empty entry: 0 (the null block) or PAD_SLOT_ID
):
    b = tl.arange(0, BLOCK_R)
    c = tl.arange(0, BLOCK_W)
    real = b < num_reqs
    pad = (b >= num_reqs) & (b < num_reqs_padded)
    row = tl.load(idx_mapping_ptr + b, mask=real, other=0)
    n = tl.load(num_blocks_ptr + row, mask=real, other=0)
    copy = real[:, None] & (c[None, :] < n[:, None]) & (c[None, :] < WIDTH)
    vals = tl.load(block_tables_ptr + row[:, None] * WIDTH + c[None, :], mask=copy, other=0)
    out = input_block_tables_ptr + b[:, None] * WIDTH + c[None, :]
    tl.store(out, vals, mask=copy)
    tl.store(out, tl.full([BLOCK_R, BLOCK_W], EMPTY, dtype=tl.int32),
             mask=pad[:, None] & (c[None, :] < WIDTH))
