"""Paged KV cache: the KV write (skips ``PAD_SLOT_ID``) and a paged-attention read.

The write mirrors ``reshape_and_cache`` / ``concat_and_cache_mla``: token ``t``
stores its payload at ``kv_cache[slot_mapping[t]]`` unless the slot is -1.
The read stands in for a paged-attention kernel that loads whole blocks through
the block table and *weights* masked positions by 0 instead of skipping their
loads: ``out[row] = sum_j (j < seq_len[row]) * kv[block_table[row, j // bs], j % bs]``.
Padding entries point at the null block, so a NaN there turns into NaN in a
real request's output (``0 * NaN = NaN``) — the user-visible failure of seed 001.

Both kernels are single programs over the whole batch (the interpreter runs one
program at a time, ~1 ms each), launched through :func:`cuda_graph.launch`.
"""

from __future__ import annotations

import torch
from ._triton import tl, triton

from .cuda_graph import launch


def reshape_and_cache(hidden: torch.Tensor, slot_mapping: torch.Tensor, kv_cache: torch.Tensor,
                      num_tokens: int, wrap_negative: bool = False) -> None:
    """Write tokens [0, num_tokens) of ``hidden`` into ``kv_cache`` at their slots.

    hidden: float32 (max_num_batched_tokens, head_size); slot_mapping: int64
    (max_num_batched_tokens,), -1 = skip; kv_cache: float32 (num_blocks,
    block_size, head_size), written in place.  ``wrap_negative`` (a fault's
    path): a negative slot indexes from the end, as a Python/torch index would
    (``PAD_SLOT_ID`` -> the last slot) instead of being skipped.
    """
    head = hidden.shape[1]
    launch(_reshape_and_cache_kernel, (1,), hidden, slot_mapping, kv_cache, num_tokens,
           HEAD=head, BLOCK_T=triton.next_power_of_2(hidden.shape[0]),
           NUM_SLOTS=kv_cache.shape[0] * kv_cache.shape[1], WRAP_NEGATIVE=wrap_negative)


def paged_attention_read(block_table: torch.Tensor, seq_lens: torch.Tensor,
                         kv_cache: torch.Tensor, out: torch.Tensor, num_rows: int,
                         alloc_block_size: int | None = None,
                         dcp: tuple[int, int, int] = (1, 0, 1), window: int = 0) -> None:
    """Masked sum over every block-table column of rows [0, num_rows).

    block_table: int32 (max_num_reqs, width) kernel block ids; seq_lens: int32
    (max_num_reqs,); kv_cache: float32 (num_kernel_blocks, kernel_block_size,
    head_size); out: float32 (max_num_reqs, head_size), rows [0, num_rows)
    written.  A cell's weight is 1 when the position it holds on this rank
    (decode context parallelism ``dcp`` = (world, rank, interleave), dealt in
    allocation blocks of ``alloc_block_size``) is below the row's seq_len (and,
    with a sliding ``window`` > 0, at least ``seq_len - window``).
    """
    width = block_table.shape[1]
    block_size, head = kv_cache.shape[1], kv_cache.shape[2]
    world, rank, interleave = dcp
    launch(_paged_attention_read_kernel, (1,), block_table, seq_lens, kv_cache, out, num_rows,
           WIDTH=width, BLOCK_SIZE=block_size, HEAD=head,
           ALLOC_BLOCK_SIZE=alloc_block_size or block_size, WORLD=world, RANK=rank,
           INTERLEAVE=interleave, NUM_BLOCKS=kv_cache.shape[0], WINDOW=window,
           BLOCK_R=triton.next_power_of_2(block_table.shape[0]),
           BLOCK_J=triton.next_power_of_2(width * block_size))


@triton.jit
def _reshape_and_cache_kernel(
    hidden_ptr,  # float32 [max_num_batched_tokens, HEAD]: payload of each token
    slot_mapping_ptr,  # int64 [max_num_batched_tokens]: destination slot, -1 = skip
    kv_cache_ptr,  # float32 [num_blocks * block_size, HEAD]: paged KV cache, in place
    num_tokens,  # tokens [0, num_tokens) are considered
    HEAD: tl.constexpr,
    BLOCK_T: tl.constexpr,
    NUM_SLOTS: tl.constexpr,  # num_blocks * block_size
    WRAP_NEGATIVE: tl.constexpr,  # False: skip slot < 0 (PAD_SLOT_ID); True: index from the end
):
    t = tl.arange(0, BLOCK_T)
    d = tl.arange(0, HEAD)
    slot = tl.load(slot_mapping_ptr + t, mask=t < num_tokens, other=-1)
    if WRAP_NEGATIVE:
        keep = t < num_tokens
        slot = tl.where(slot < 0, slot + NUM_SLOTS, slot)
    else:
        keep = (t < num_tokens) & (slot >= 0)
    # A slot past the cache (an engine's wrong slot mapping) is dropped: on a GPU
    # it would fault or corrupt other memory; here MATCHES_REFERENCE reports it.
    keep = keep & (slot < NUM_SLOTS)
    mask = keep[:, None] & (d[None, :] < HEAD)
    x = tl.load(hidden_ptr + t[:, None] * HEAD + d[None, :], mask=mask, other=0.0)
    tl.store(kv_cache_ptr + slot[:, None] * HEAD + d[None, :], x, mask=mask)


@triton.jit
def _paged_attention_read_kernel(
    block_table_ptr,  # int32 [max_num_reqs, WIDTH]: block ids per row, null block = 0
    seq_lens_ptr,  # int32 [max_num_reqs]: tokens of context per row (0 for padded rows)
    kv_cache_ptr,  # float32 [num_blocks * BLOCK_SIZE, HEAD]
    out_ptr,  # float32 [max_num_reqs, HEAD]: masked sums, rows [0, num_rows) written
    num_rows,
    WIDTH: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,  # kernel block size
    HEAD: tl.constexpr,
    ALLOC_BLOCK_SIZE: tl.constexpr,  # allocation block size (DCP ownership unit)
    WORLD: tl.constexpr,  # decode context parallel world size
    RANK: tl.constexpr,
    INTERLEAVE: tl.constexpr,
    NUM_BLOCKS: tl.constexpr,  # kernel blocks in the cache: ids past it read 0
    WINDOW: tl.constexpr,  # sliding window in tokens (0: full attention)
    BLOCK_R: tl.constexpr,
    BLOCK_J: tl.constexpr,
):
    r = tl.arange(0, BLOCK_R)
    j = tl.arange(0, BLOCK_J)
    d = tl.arange(0, HEAD)
    row_ok = r < num_rows
    col_ok = j < WIDTH * BLOCK_SIZE
    cell_ok = row_ok[:, None] & col_ok[None, :]
    block_id = tl.load(block_table_ptr + r[:, None] * WIDTH + j[None, :] // BLOCK_SIZE,
                       mask=cell_ok, other=0)
    seq_len = tl.load(seq_lens_ptr + r, mask=row_ok, other=0)
    slot = block_id * BLOCK_SIZE + j[None, :] % BLOCK_SIZE
    in_pool = cell_ok & (block_id >= 0) & (block_id < NUM_BLOCKS)  # garbage ids: no load
    vals = tl.load(kv_cache_ptr + slot[:, :, None] * HEAD + d[None, None, :],
                   mask=in_pool[:, :, None], other=0.0)
    # The position each cell holds on this rank: kernel column -> allocation column and
    # offset, then the DCP dealing (world 1: the plain j).
    kernels_per_block = ALLOC_BLOCK_SIZE // BLOCK_SIZE
    alloc_column = (j // BLOCK_SIZE) // kernels_per_block
    local = ((j // BLOCK_SIZE) % kernels_per_block) * BLOCK_SIZE + j % BLOCK_SIZE
    held = (alloc_column * ALLOC_BLOCK_SIZE * WORLD + (local // INTERLEAVE) * WORLD * INTERLEAVE
            + RANK * INTERLEAVE + local % INTERLEAVE)
    # Masked positions are loaded and weighted by 0, not skipped (whole-block reads).
    inside = held[None, :] < seq_len[:, None]
    if WINDOW > 0:  # sliding window: positions before it are never read
        inside = inside & (held[None, :] >= seq_len[:, None] - WINDOW)
    weight = inside.to(tl.float32)
    out = tl.sum(weight[:, :, None] * vals, axis=1)
    tl.store(out_ptr + r[:, None] * HEAD + d[None, :], out, mask=row_ok[:, None])
