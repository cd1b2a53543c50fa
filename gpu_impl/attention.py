"""Paged KV cache: the KV write (skips ``PAD_SLOT_ID``) and a paged-attention read.

The write mirrors ``reshape_and_cache`` / ``concat_and_cache_mla``: token ``t``
stores its payload at ``kv_cache[slot_mapping[t]]`` unless the slot is -1.
The read stands in for a paged-attention kernel that loads whole blocks through
the block table and *weights* masked positions by 0 instead of skipping their
loads: ``out[row] = sum_j (j < seq_len[row]) * kv[block_table[row, j // bs], j % bs]``.
Padding entries point at the null block, so a NaN there turns into NaN in a
real request's output (``0 * NaN = NaN``) — the user-visible failure of seed 001.

With a quantized cache (``kv_cache_dtype`` ``int8``) the cache is a uint8 payload
plus a float32 parameter buffer (scale, zero point) per token slot: the write
quantizes each token as :mod:`reference.quant` specifies and the read
dequantizes (``q * scale + zero``); :func:`quantize_rows` is the same for the
runner's host-side writes (a P/D load, a freed block's poison).

Both kernels are single programs over the whole batch (the interpreter runs one
program at a time, ~1 ms each), launched through :func:`cuda_graph.launch`.
"""

from __future__ import annotations

import torch
from ._triton import tl, triton

from .cuda_graph import launch


ZERO_STEP = 64.0  # zero points are multiples of it (reference.quant)
SCALE_STEPS = 8  # as reference.quant
QMAX = 255.0


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(payload uint8 (N, head_size), params float32 (N, 2): scale, zero point)
    of float32 rows ``x`` (N, head_size), as the write kernel quantizes."""
    nan = torch.isnan(x).any(dim=-1)
    clean = torch.nan_to_num(x, nan=0.0)
    zero = torch.floor(clean.min(dim=-1).values * (1.0 / ZERO_STEP)) * ZERO_STEP
    span = clean.max(dim=-1).values - zero
    s = torch.ones_like(span)
    inv = torch.ones_like(span)
    lim, nxt = QMAX, 2.0
    for _ in range(SCALE_STEPS):
        s = torch.where(span > lim, torch.full_like(s, nxt), s)
        inv = torch.where(span > lim, torch.full_like(inv, 1.0 / nxt), inv)
        lim, nxt = lim * 2, nxt * 2
    q = torch.floor((clean - zero[:, None]) * inv[:, None] + 0.5).clamp(0.0, QMAX)
    q = torch.where(nan[:, None], torch.zeros_like(q), q)
    params = torch.stack([s, zero], dim=-1)
    params[nan] = float("nan")
    return q.to(torch.uint8), params


def reshape_and_cache(hidden: torch.Tensor, slot_mapping: torch.Tensor, kv_cache: torch.Tensor,
                      num_tokens: int, wrap_negative: bool = False,
                      kv_params: torch.Tensor | None = None,
                      params_unguarded: bool = False) -> None:
    """Write tokens [0, num_tokens) of ``hidden`` into ``kv_cache`` at their slots.

    hidden: float32 (max_num_batched_tokens, head_size); slot_mapping: int64
    (max_num_batched_tokens,), -1 = skip; kv_cache: float32 (num_blocks,
    block_size, head_size), written in place — or, quantized, uint8 with
    ``kv_params`` float32 (num_blocks, block_size, 2) (scale, zero point per
    slot).  ``wrap_negative`` (a fault's path): a negative slot indexes from
    the end, as a Python/torch index would (``PAD_SLOT_ID`` -> the last slot)
    instead of being skipped.  ``params_unguarded`` (a fault's path): the
    parameter store is masked by the token count only, its slot indexed as
    torch would (``PAD_SLOT_ID`` -> the last slot), while the payload store
    skips ``PAD_SLOT_ID``.
    """
    head = hidden.shape[1]
    quant = kv_params is not None
    launch(_reshape_and_cache_kernel, (1,), hidden, slot_mapping, kv_cache,
           kv_params if quant else kv_cache, num_tokens,
           HEAD=head, BLOCK_T=triton.next_power_of_2(hidden.shape[0]),
           NUM_SLOTS=kv_cache.shape[0] * kv_cache.shape[1], WRAP_NEGATIVE=wrap_negative,
           QUANT=quant, PARAMS_UNGUARDED=params_unguarded)


def paged_attention_read(block_table: torch.Tensor, seq_lens: torch.Tensor,
                         kv_cache: torch.Tensor, out: torch.Tensor, num_rows: int,
                         alloc_block_size: int | None = None,
                         dcp: tuple[int, int, int] = (1, 0, 1), window: int = 0,
                         kv_params: torch.Tensor | None = None) -> None:
    """Masked sum over every block-table column of rows [0, num_rows).

    block_table: int32 (max_num_reqs, width) kernel block ids; seq_lens: int32
    (max_num_reqs,); kv_cache: float32 (num_kernel_blocks, kernel_block_size,
    head_size); out: float32 (max_num_reqs, head_size), rows [0, num_rows)
    written.  A cell's weight is 1 when the position it holds on this rank
    (decode context parallelism ``dcp`` = (world, rank, interleave), dealt in
    allocation blocks of ``alloc_block_size``) is below the row's seq_len (and,
    with a sliding ``window`` > 0, at least ``seq_len - window``).  Quantized:
    ``kv_cache`` uint8 and ``kv_params`` float32 (num_kernel_blocks,
    kernel_block_size, 2); each cell reads ``q * scale + zero``.
    """
    width = block_table.shape[1]
    block_size, head = kv_cache.shape[1], kv_cache.shape[2]
    world, rank, interleave = dcp
    quant = kv_params is not None
    launch(_paged_attention_read_kernel, (1,), block_table, seq_lens, kv_cache,
           kv_params if quant else kv_cache, out, num_rows, QUANT=quant,
           WIDTH=width, BLOCK_SIZE=block_size, HEAD=head,
           ALLOC_BLOCK_SIZE=alloc_block_size or block_size, WORLD=world, RANK=rank,
           INTERLEAVE=interleave, NUM_BLOCKS=kv_cache.shape[0], WINDOW=window,
           BLOCK_R=triton.next_power_of_2(block_table.shape[0]),
           BLOCK_J=triton.next_power_of_2(width * block_size))


@triton.jit
def _reshape_and_cache_kernel(
    hidden_ptr,  # float32 [max_num_batched_tokens, HEAD]: payload of each token
    slot_mapping_ptr,  # int64 [max_num_batched_tokens]: destination slot, -1 = skip
    kv_cache_ptr,  # float32 [num_blocks * block_size, HEAD] (QUANT: uint8), in place
    params_ptr,  # QUANT: float32 [num_blocks * block_size, 2] scale, zero point per slot
    num_tokens,  # tokens [0, num_tokens) are considered
    HEAD: tl.constexpr,
    BLOCK_T: tl.constexpr,
    NUM_SLOTS: tl.constexpr,  # num_blocks * block_size
    WRAP_NEGATIVE: tl.constexpr,  # False: skip slot < 0 (PAD_SLOT_ID); True: index from the end
    QUANT: tl.constexpr,  # quantized cache (kv_cache_dtype int8)
    PARAMS_UNGUARDED: tl.constexpr,  # fault switch (kv-params-store-unguarded)
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
    mask = keep[:, None]  # d spans exactly HEAD (a power of 2, as tl.arange needs)
    if not QUANT:
        x = tl.load(hidden_ptr + t[:, None] * HEAD + d[None, :], mask=mask, other=0.0)
        tl.store(kv_cache_ptr + slot[:, None] * HEAD + d[None, :], x, mask=mask)
    else:
        # Per-token asymmetric quantization (reference.quant): every token of the
        # batch is quantized; the stores are what the guards let through.
        tok = t < num_tokens
        x = tl.load(hidden_ptr + t[:, None] * HEAD + d[None, :],
                    mask=tok[:, None] & (d[None, :] < HEAD), other=0.0)
        isnan = x != x
        nan_row = tl.sum(isnan.to(tl.int32), axis=1) > 0
        clean = tl.where(isnan, 0.0, x)
        zero = tl.floor(tl.min(clean, axis=1) * (1.0 / 64.0)) * 64.0
        span = tl.max(clean, axis=1) - zero
        s = tl.full([BLOCK_T], 1.0, tl.float32)
        inv = tl.full([BLOCK_T], 1.0, tl.float32)
        lim = 255.0
        nxt = 2.0
        for _ in tl.static_range(8):  # SCALE_STEPS
            s = tl.where(span > lim, nxt, s)
            inv = tl.where(span > lim, 1.0 / nxt, inv)
            lim = lim * 2.0
            nxt = nxt * 2.0
        q = tl.floor((clean - zero[:, None]) * inv[:, None] + 0.5)
        q = tl.minimum(tl.maximum(q, 0.0), 255.0)
        q = tl.where(nan_row[:, None], 0.0, q)
        nan = tl.full([BLOCK_T], float("nan"), tl.float32)
        s = tl.where(nan_row, nan, s)
        zero = tl.where(nan_row, nan, zero)
        tl.store(kv_cache_ptr + slot[:, None] * HEAD + d[None, :], q.to(tl.uint8), mask=mask)
        pslot = slot
        pkeep = keep
        if PARAMS_UNGUARDED:  # the parameters indexed as torch would: -1 is the last slot
            raw = tl.load(slot_mapping_ptr + t, mask=tok, other=-1)
            pslot = tl.where(raw < 0, raw + NUM_SLOTS, raw)
            pkeep = tok & (pslot >= 0) & (pslot < NUM_SLOTS)
        tl.store(params_ptr + pslot * 2, s, mask=pkeep)
        tl.store(params_ptr + pslot * 2 + 1, zero, mask=pkeep)


@triton.jit
def _paged_attention_read_kernel(
    block_table_ptr,  # int32 [max_num_reqs, WIDTH]: block ids per row, null block = 0
    seq_lens_ptr,  # int32 [max_num_reqs]: tokens of context per row (0 for padded rows)
    kv_cache_ptr,  # float32 [num_blocks * BLOCK_SIZE, HEAD] (QUANT: uint8)
    params_ptr,  # QUANT: float32 [num_blocks * BLOCK_SIZE, 2] scale, zero point per slot
    out_ptr,  # float32 [max_num_reqs, HEAD]: masked sums, rows [0, num_rows) written
    num_rows,
    QUANT: tl.constexpr,
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
    if QUANT:  # dequantize: q * scale + zero (an id past the pool reads 0)
        q = tl.load(kv_cache_ptr + slot[:, :, None] * HEAD + d[None, None, :],
                    mask=in_pool[:, :, None], other=0).to(tl.float32)
        scale = tl.load(params_ptr + slot * 2, mask=in_pool, other=0.0)
        zero = tl.load(params_ptr + slot * 2 + 1, mask=in_pool, other=0.0)
        vals = q * scale[:, :, None] + zero[:, :, None]
    else:
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
