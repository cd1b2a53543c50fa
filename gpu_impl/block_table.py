"""V1 block tables: host NumPy rows mirrored into a device int32 tensor.

Our own implementation of the concepts of ``vllm/v1/worker/block_table.py``:
``BlockTable`` keeps the rows on the host (``block_table.np``) and a device
tensor (``block_table.gpu``) that kernels read; ``commit`` copies the first
rows of a forward to the device.  ``MultiGroupBlockTable`` holds one table per
KV-cache group.  Slot mappings are computed on the device by a Triton kernel
(one program, one lane per token), PAD-filling the padded tail.

Faults consulted here: ``vacated-row-not-cleared`` (``move_row``), ``swap-rows-aliased``
(``swap_row``),
``kernel-blocks-count-unscaled`` (``append_row``), ``kernel-block-size-ignored``
(``compute_slot_mapping``).
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from ._triton import tl, triton

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

    def __deepcopy__(self, memo):
        # ``np`` is a view of ``cpu``: the copy's view must be of the copy's
        # tensor (copy.deepcopy alone would give two unrelated arrays).
        new = CpuGpuBuffer.__new__(CpuGpuBuffer)
        memo[id(self)] = new
        new.cpu = copy.deepcopy(self.cpu, memo)
        new.np = new.cpu.numpy()
        new.gpu = copy.deepcopy(self.gpu, memo)
        return new

    def copy_to_gpu(self, n: int | None = None) -> torch.Tensor:
        """Copy the first ``n`` rows (all when None) host -> device."""
        if n is None:
            self.gpu.copy_(self.cpu, non_blocking=True)
            return self.gpu
        self.gpu[:n].copy_(self.cpu[:n], non_blocking=True)
        return self.gpu[:n]


class BlockTable:
    """Block table of one KV-cache group, in kernel blocks.

    When the attention kernel's block size divides the allocation block size,
    allocation block ``b`` is stored as kernel blocks ``b*k .. b*k + k - 1``
    (k = block_size // kernel_block_size), as vLLM's hybrid allocator does.
    block_table: int32 (max_num_reqs, max_num_blocks_per_req * k) host + device;
    num_blocks_per_row: int32 (max_num_reqs,) host only, in kernel blocks.
    """

    def __init__(self, block_size: int, kernel_block_size: int, max_num_reqs: int,
                 max_num_blocks_per_req: int, device: torch.device, faults: FaultSet,
                 dcp: tuple[int, int, int] = (1, 0, 1), empty: int = 0):
        self.block_size = block_size
        self.empty = empty  # an empty entry: the null block, or PAD_SLOT_ID (no null block)
        self.dcp = dcp  # (world size, rank, interleave) for attention groups
        self.kernel_block_size = kernel_block_size
        self.blocks_per_kv_block = block_size // kernel_block_size
        self.faults = faults
        width = max_num_blocks_per_req * self.blocks_per_kv_block
        self.block_table = CpuGpuBuffer((max_num_reqs, width), torch.int32, device)
        self.block_table.np[:] = empty
        self.block_table.copy_to_gpu()
        self.num_blocks_per_row = np.zeros(max_num_reqs, dtype=np.int32)

    def map_to_kernel_blocks(self, block_ids: list[int]) -> np.ndarray:
        """Allocation block ids -> kernel block ids, int64 (len * k,)."""
        k = self.blocks_per_kv_block
        ids = np.asarray(block_ids, dtype=np.int64)
        return (ids[:, None] * k + np.arange(k)[None, :]).reshape(-1)

    def append_row(self, block_ids: list[int], row_idx: int) -> None:
        if not block_ids:
            return
        kernel_ids = self.map_to_kernel_blocks(block_ids)
        start = int(self.num_blocks_per_row[row_idx])
        self.block_table.np[row_idx, start:start + len(kernel_ids)] = kernel_ids
        if "kernel-blocks-count-unscaled" in self.faults:
            self.num_blocks_per_row[row_idx] += len(block_ids)  # counts allocation blocks
        else:
            self.num_blocks_per_row[row_idx] += len(kernel_ids)

    def add_row(self, block_ids: list[int], row_idx: int) -> None:
        self.num_blocks_per_row[row_idx] = 0
        self.append_row(block_ids, row_idx)

    def clear_row(self, row_idx: int) -> None:
        """Point the row at the null block (its empty entry): ids to it, count to zero."""
        self.block_table.np[row_idx] = self.empty
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
        rows = self.block_table.np
        if "swap-rows-aliased" in self.faults:
            # The historical idiom: a tuple of row *views*; the first assignment
            # overwrites what the second then reads, so both rows end up as tgt's.
            rows[src], rows[tgt] = rows[tgt], rows[src]
            return
        rows[[src, tgt]] = rows[[tgt, src]]

    def commit(self, num_rows: int) -> None:
        """Copy rows [0, num_rows) host -> device before a forward."""
        self.block_table.copy_to_gpu(num_rows)

    def compute_slot_mapping(self, req_indices: torch.Tensor, positions: torch.Tensor,
                             slot_mapping: torch.Tensor, num_tokens_padded: int) -> None:
        """Slot mapping of this table's rows (see :func:`compute_slot_mapping`)."""
        compute_slot_mapping(self.block_table.gpu, self.block_size, self.kernel_block_size,
                             self.dcp, req_indices, positions, slot_mapping, num_tokens_padded,
                             ignore_kernel_blocks="kernel-block-size-ignored" in self.faults,
                             row_unguarded="slot-mapping-row-unguarded" in self.faults)


def compute_slot_mapping(block_table: torch.Tensor, block_size: int, kernel_block_size: int,
                         dcp: tuple[int, int, int], req_indices: torch.Tensor,
                         positions: torch.Tensor, slot_mapping: torch.Tensor,
                         num_tokens_padded: int, ignore_kernel_blocks: bool = False,
                         row_unguarded: bool = False) -> None:
    """Slot of each token on this rank, through a table of kernel blocks.

    block_table: int32 (max_num_reqs, width) device, kernel block ids; block_size /
    kernel_block_size: allocation and kernel block sizes; dcp: (world size, rank,
    interleave) — a virtual block of ``block_size * world`` positions is dealt
    to ranks in runs of ``interleave``, this rank keeps its runs packed, others
    get ``PAD_SLOT_ID`` (world 1: every position is local); req_indices: int32
    (max_num_batched_tokens,) batch row per token, -1 for padding tokens
    (``PAD_SLOT_ID``); positions: int64; slot_mapping: int64 persistent output,
    entries [0, num_tokens_padded) written, the rest untouched.  A position
    whose kernel column lies past the row (a narrow group's row, narrower than
    the request) gets ``PAD_SLOT_ID``: the block-table load is bounded by the
    row's width (vLLM PR #54296).
    row_unguarded: only to re-introduce the ``slot-mapping-row-unguarded``
    fault (the load bounded by token validity and DCP ownership alone: a
    column past the row reads the next row's entries, and past the table's
    end whatever lies there, modelled as zeros).
    ignore_kernel_blocks: only to re-introduce the ``kernel-block-size-ignored``
    fault (the allocation column used as the kernel column).
    """
    world, rank, interleave = dcp
    block = triton.next_power_of_2(slot_mapping.shape[0])
    launch(_compute_slot_mapping_kernel, (1,), req_indices, positions, block_table,
           block_table.stride(0), block_table.shape[0] * block_table.stride(0), slot_mapping,
           num_tokens_padded, ALLOC_BLOCK_SIZE=block_size,
           BLOCK_SIZE=kernel_block_size, WORLD=world, RANK=rank, INTERLEAVE=interleave,
           IGNORE_KERNEL_BLOCKS=ignore_kernel_blocks, ROW_UNGUARDED=row_unguarded,
           PAD=PAD_SLOT_ID, BLOCK=block)


class MultiGroupBlockTable:
    """One :class:`BlockTable` per KV-cache group; row ops apply to all.

    widths: allocation blocks per row, per group; block_ids arguments are per
    group, in group order.
    """

    def __init__(self, widths: list[int], block_sizes: list[int], kernel_block_sizes: list[int],
                 max_num_reqs: int, device: torch.device, faults: FaultSet,
                 dcps: list[tuple[int, int, int]] | None = None,
                 empties: list[int] | None = None):
        dcps = dcps or [(1, 0, 1)] * len(widths)
        empties = empties or [0] * len(widths)
        self.block_tables = [BlockTable(bs, kbs, max_num_reqs, w, device, faults, dcp, e)
                             for w, bs, kbs, dcp, e in zip(widths, block_sizes,
                                                           kernel_block_sizes, dcps, empties)]

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
    block_table_ptr,  # int32 [max_num_reqs, width]: device block table, kernel block ids
    block_table_stride,  # row stride of block_table, in elements (the row's width)
    block_table_numel,  # elements of block_table (the fault's reads stop there)
    slot_mapping_ptr,  # int64 [max_num_batched_tokens]: output, PAD for padding tokens
    num_tokens_padded,  # entries [0, num_tokens_padded) are written
    ALLOC_BLOCK_SIZE: tl.constexpr,  # allocation block size (DCP ownership unit)
    BLOCK_SIZE: tl.constexpr,  # kernel block size (the table's ids are in it)
    WORLD: tl.constexpr,  # decode context parallel world size
    RANK: tl.constexpr,  # this rank
    INTERLEAVE: tl.constexpr,  # positions dealt to a rank in one run
    IGNORE_KERNEL_BLOCKS: tl.constexpr,  # fault switch (kernel-block-size-ignored)
    ROW_UNGUARDED: tl.constexpr,  # fault switch (slot-mapping-row-unguarded)
    PAD: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offs = tl.arange(0, BLOCK)
    in_range = offs < num_tokens_padded
    row = tl.load(req_indices_ptr + offs, mask=in_range, other=-1)
    pos = tl.load(positions_ptr + offs, mask=in_range, other=0)
    # Branches on constexprs are what a compiler folds; the interpreter pays per
    # operation, so the plain cases (one DCP rank, kernel block = allocation
    # block) skip arithmetic that is the identity there.
    if WORLD == 1 and RANK == 0:  # every position is this rank's; offset = virtual
        column = pos // ALLOC_BLOCK_SIZE
        offset = pos % ALLOC_BLOCK_SIZE
        real = in_range & (row >= 0)
    else:
        virtual = pos % (ALLOC_BLOCK_SIZE * WORLD)
        column = pos // (ALLOC_BLOCK_SIZE * WORLD)
        local = (virtual // INTERLEAVE) % WORLD == RANK
        offset = (virtual // (WORLD * INTERLEAVE)) * INTERLEAVE + virtual % INTERLEAVE
        real = in_range & (row >= 0) & local
    if IGNORE_KERNEL_BLOCKS or ALLOC_BLOCK_SIZE == BLOCK_SIZE:
        # offset < ALLOC_BLOCK_SIZE, so offset // BLOCK_SIZE is 0 when the sizes are
        # equal (RunnerConfig requires INTERLEAVE to divide the block size).
        kernel_column = column
    else:
        kernel_column = column * (ALLOC_BLOCK_SIZE // BLOCK_SIZE) + offset // BLOCK_SIZE
    index = row * block_table_stride + kernel_column
    if ROW_UNGUARDED:  # memory past the table modelled as zeros (block 0's slots)
        block_id = tl.load(block_table_ptr + index, mask=real & (index < block_table_numel),
                           other=0)
    else:  # a column past the row has no slot
        real = real & (kernel_column < block_table_stride)
        block_id = tl.load(block_table_ptr + index, mask=real, other=0)
    if ALLOC_BLOCK_SIZE == BLOCK_SIZE:
        slot = block_id.to(tl.int64) * BLOCK_SIZE + offset
    else:
        slot = block_id.to(tl.int64) * BLOCK_SIZE + offset % BLOCK_SIZE
    slot = tl.where(real, slot, PAD)
    tl.store(slot_mapping_ptr + offs, slot, mask=in_range)
