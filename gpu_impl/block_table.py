"""V1 block tables: host NumPy rows mirrored into a device int32 tensor.

Our own implementation of the concepts of ``vllm/v1/worker/block_table.py``:
``BlockTable`` keeps the rows on the host (``block_table.np``) and a device
tensor (``block_table.gpu``) that kernels read; ``commit`` copies the first
rows of a forward to the device.  ``MultiGroupBlockTable`` holds one table per
KV-cache group.  Slot mappings are computed on the device by a Triton kernel
(one program, one lane per token), PAD-filling the padded tail.

Faults consulted here: ``vacated-row-not-cleared`` (``move_row``).
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from .cuda_graph import launch
from .faults import FaultSet

PAD_SLOT_ID = -1


class CpuGpuBuffer:
    """A persistent buffer with a host NumPy view (``np``) and a device tensor (``gpu``).

    The device tensor is allocated once; CUDA graphs capture its address.
    """

    def __init__(self, shape, dtype: torch.dtype, device: torch.device, fill=0):
        self.cpu = torch.full(shape, fill, dtype=dtype)
        self.np = self.cpu.numpy()
        self.gpu = torch.full(shape, fill, dtype=dtype, device=device)

    def copy_to_gpu(self, n: int | None = None) -> torch.Tensor:
        """Copy the first ``n`` rows (all when None) host -> device."""
        if n is None:
            self.gpu.copy_(self.cpu, non_blocking=True)
            return self.gpu
        self.gpu[:n].copy_(self.cpu[:n], non_blocking=True)
        return self.gpu[:n]


class BlockTable:
    """Block table of one KV-cache group.

    block_table: int32 (max_num_reqs, max_num_blocks_per_req) host + device;
    num_blocks_per_row: int32 (max_num_reqs,) host only.
    """

    def __init__(self, block_size: int, max_num_reqs: int, max_num_blocks_per_req: int,
                 device: torch.device, faults: FaultSet):
        self.block_size = block_size
        self.max_num_blocks_per_req = max_num_blocks_per_req
        self.faults = faults
        self.block_table = CpuGpuBuffer((max_num_reqs, max_num_blocks_per_req), torch.int32,
                                        device)
        self.num_blocks_per_row = np.zeros(max_num_reqs, dtype=np.int32)

    def append_row(self, block_ids: list[int], row_idx: int) -> None:
        if not block_ids:
            return
        start = int(self.num_blocks_per_row[row_idx])
        end = start + len(block_ids)
        self.block_table.np[row_idx, start:end] = block_ids
        self.num_blocks_per_row[row_idx] = end

    def add_row(self, block_ids: list[int], row_idx: int) -> None:
        self.num_blocks_per_row[row_idx] = 0
        self.append_row(block_ids, row_idx)

    def clear_row(self, row_idx: int) -> None:
        """Point the row at the null block: ids and count to zero."""
        self.block_table.np[row_idx] = 0
        self.num_blocks_per_row[row_idx] = 0

    def move_row(self, src: int, tgt: int) -> None:
        num_blocks = int(self.num_blocks_per_row[src])
        self.block_table.np[tgt, :num_blocks] = self.block_table.np[src, :num_blocks]
        self.num_blocks_per_row[tgt] = num_blocks
        if "vacated-row-not-cleared" in self.faults:
            return  # the historical bug: the source row keeps its ids
        # The vacated row must not keep ids: dummy runs read rows past the live
        # requests and would route writes to blocks that may since be reallocated.
        self.clear_row(src)

    def swap_row(self, src: int, tgt: int) -> None:
        self.num_blocks_per_row[[src, tgt]] = self.num_blocks_per_row[[tgt, src]]
        self.block_table.np[[src, tgt]] = self.block_table.np[[tgt, src]]

    def commit(self, num_rows: int) -> None:
        """Copy rows [0, num_rows) host -> device before a forward."""
        self.block_table.copy_to_gpu(num_rows)

    def compute_slot_mapping(self, req_indices: torch.Tensor, positions: torch.Tensor,
                             slot_mapping: torch.Tensor, num_tokens_padded: int) -> None:
        """slot = block_table[row, pos // block_size] * block_size + pos % block_size.

        req_indices: int32 (max_num_batched_tokens,) device, batch row per token,
        -1 for padding tokens (their slot becomes ``PAD_SLOT_ID``); positions:
        int64 (same shape); slot_mapping: int64 persistent output, entries
        [0, num_tokens_padded) written, the rest untouched.
        """
        block = triton.next_power_of_2(slot_mapping.shape[0])
        launch(_compute_slot_mapping_kernel, (1,), req_indices, positions,
               self.block_table.gpu, self.block_table.gpu.stride(0), slot_mapping,
               num_tokens_padded, BLOCK_SIZE=self.block_size, PAD=PAD_SLOT_ID, BLOCK=block)


class MultiGroupBlockTable:
    """One :class:`BlockTable` per KV-cache group; row ops apply to all.

    block_ids arguments are per group, in group order.
    """

    def __init__(self, widths: list[int], block_sizes: list[int], max_num_reqs: int,
                 device: torch.device, faults: FaultSet):
        self.block_tables = [BlockTable(bs, max_num_reqs, w, device, faults)
                             for w, bs in zip(widths, block_sizes)]

    def __getitem__(self, group: int) -> BlockTable:
        return self.block_tables[group]

    def add_row(self, block_ids: list[list[int]], row_idx: int) -> None:
        for table, ids in zip(self.block_tables, block_ids):
            table.add_row(ids, row_idx)

    def append_row(self, block_ids: list[list[int]], row_idx: int) -> None:
        for table, ids in zip(self.block_tables, block_ids):
            table.append_row(ids, row_idx)

    def clear_row(self, row_idx: int) -> None:
        for table in self.block_tables:
            table.clear_row(row_idx)

    def move_row(self, src: int, tgt: int) -> None:
        for table in self.block_tables:
            table.move_row(src, tgt)

    def swap_row(self, src: int, tgt: int) -> None:
        for table in self.block_tables:
            table.swap_row(src, tgt)

    def commit(self, num_rows: int) -> None:
        for table in self.block_tables:
            table.commit(num_rows)


@triton.jit
def _compute_slot_mapping_kernel(
    req_indices_ptr,  # int32 [max_num_batched_tokens]: batch row of each token, -1 = padding
    positions_ptr,  # int64 [max_num_batched_tokens]: token position in its request
    block_table_ptr,  # int32 [max_num_reqs, max_num_blocks_per_req]: device block table
    block_table_stride,  # row stride of block_table, in elements
    slot_mapping_ptr,  # int64 [max_num_batched_tokens]: output, PAD for padding tokens
    num_tokens_padded,  # entries [0, num_tokens_padded) are written
    BLOCK_SIZE: tl.constexpr,
    PAD: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offs = tl.arange(0, BLOCK)
    in_range = offs < num_tokens_padded
    row = tl.load(req_indices_ptr + offs, mask=in_range, other=-1)
    pos = tl.load(positions_ptr + offs, mask=in_range, other=0)
    real = in_range & (row >= 0)
    block_id = tl.load(block_table_ptr + row * block_table_stride + pos // BLOCK_SIZE,
                       mask=real, other=0)
    slot = block_id.to(tl.int64) * BLOCK_SIZE + pos % BLOCK_SIZE
    slot = tl.where(real, slot, PAD)
    tl.store(slot_mapping_ptr + offs, slot, mask=in_range)
