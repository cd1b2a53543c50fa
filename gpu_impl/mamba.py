"""Mamba-style recurrent state update, written in place at the state index.

Stands in for the Mamba / GDN / KDA kernels of hybrid models: each batch row
sums the payload of its tokens and adds it to its state slot (from zero when
the request has no initial state) — the SSM part of the state; a group with a
convolution state (``conv_size`` tokens, laid before the SSM part as vLLM's
``MambaSpec`` shapes are) also shifts its row's tokens into it, keeping the
last ``conv_size`` payloads (``causal_conv1d_update``'s state).  The state indices come from the metadata
builder — the Mamba group's block-table columns for real rows, the null block
for rows padded to a FULL capture size — which is why a stale block-table row,
or a state-index buffer not re-staged before a FULL replay, writes state into
a block the row does not own (seed 000).  ``PAD_SLOT_ID`` (-1) rows are
skipped.

With speculative decoding a request holds ``1 + k`` state columns (vLLM's
spec-decode ``ssm_state_indices``, GDN's ``fused_recurrent_gated_delta_rule``):
a row starts from the column its last accepted count names
(``num_accepted_tokens - 1``, bounded below by 0), and a spec-decode row
writes the state after each of its tokens to columns 0, 1, ...; any other row
writes its final state to column 0.  Without speculation (one column) this is
the plain update.

Mamba prefix caching in all mode (vLLM's ``mamba_cache_mode="all"``: the
mixers' prefix-caching path with ``block_idx_last_computed_token``,
``block_idx_first_scheduled_token`` and ``block_idx_last_scheduled_token``):
the state indices are the whole block-table row; a row reads its initial
state through the column of its last computed token, and writes the state at
each block boundary its chunk crosses into that block's column and its final
state into the column of its last token.
"""

from __future__ import annotations

import torch
from ._triton import tl, triton

from .cuda_graph import launch


def mamba_state_update(hidden: torch.Tensor, query_start_loc: torch.Tensor,
                       state_indices: torch.Tensor, has_initial_state: torch.Tensor,
                       state: torch.Tensor, num_rows: int,
                       num_accepted: torch.Tensor | None = None,
                       spec_rows: torch.Tensor | None = None,
                       read_out: torch.Tensor | None = None,
                       column_unbounded: bool = False, skip_null: bool = False,
                       pad_target: int | None = None, conv_size: int = 0,
                       prefix_meta: torch.Tensor | None = None, all_mode: bool = False,
                       block_size: int = 0,
                       chunk_grid: bool = False, conv_to_source: bool = False) -> None:
    """In-place update of rows [0, num_rows).

    hidden: float32 (max_num_batched_tokens, head_size); query_start_loc: int32
    (max_num_reqs + 1,); state_indices: int32 (max_num_reqs,) or (max_num_reqs,
    num_columns), contiguous rows; has_initial_state: int32 (max_num_reqs,);
    state: float32 (num_blocks, (conv_size + 1) * head_size) — conv part, then
    SSM part —, rows at any stride (a view over shared pages: ``kv_sharing``).  ``skip_null``: a write into block 0 (the
    null block) is dropped, as PAD_SLOT_ID is (its page is shared).
    ``pad_target``: None skips a negative index (``PAD_SLOT_ID``); a block id
    reads and writes it instead (a fault's path: the sentinel remapped).  num_accepted / spec_rows: int32
    (max_num_reqs,) — the running column is ``max(num_accepted - 1, 0)``
    (``column_unbounded``: ``num_accepted - 1``, a fault's path: 0 reads the
    previous row's last column) and spec rows write every token's state;
    None = column 0, no spec rows.  read_out: int32 (max_num_reqs,), receives
    the index each row read its initial state through.  prefix_meta: int32
    (max_num_reqs, 5), read in all mode (``all_mode``) only — per row its
    computed tokens, ``block_idx_last_computed_token``,
    ``block_idx_first_scheduled_token``, ``block_idx_last_scheduled_token``
    (columns of ``state_indices``, the whole block-table row) and whether the
    builder made it a prefill; ``block_size``: the Mamba block size in
    tokens.  ``chunk_grid`` (a fault's path): boundary states every
    ``block_size`` tokens from the chunk's start, into the columns from the
    first scheduled one on.  ``conv_to_source`` (a fault's path): a prefill
    chunk shorter than the conv state stores its conv state through the block
    it read.  An index past the
    pool (an engine's garbage) is dropped: a GPU would fault, the interpreter
    would corrupt host memory; ``MATCHES_REFERENCE`` reports it.
    """
    ncol = 1 if state_indices.dim() == 1 else state_indices.shape[1]
    rows = state_indices.shape[0]
    if num_accepted is None:
        num_accepted = torch.ones(rows, dtype=torch.int32, device=hidden.device)
    if spec_rows is None:
        spec_rows = torch.zeros(rows, dtype=torch.int32, device=hidden.device)
    if read_out is None:
        read_out = torch.zeros(rows, dtype=torch.int32, device=hidden.device)
    if prefix_meta is None:
        prefix_meta = torch.zeros((rows, 5), dtype=torch.int32, device=hidden.device)
    launch(_mamba_state_update_kernel, (1,), hidden, query_start_loc, state_indices,
           has_initial_state, state, num_accepted, spec_rows, read_out, num_rows,
           HEAD=hidden.shape[1], NCOL=ncol,
           BLOCK_R=triton.next_power_of_2(rows),
           BLOCK_T=triton.next_power_of_2(hidden.shape[0]), NUM_TOKENS=hidden.shape[0],
           NUM_SLOTS=state.shape[0], COLUMN_UNBOUNDED=column_unbounded,
           STATE_STRIDE=state.stride(0), SKIP_NULL=skip_null,
           PAD_TO=-1 if pad_target is None else pad_target, CONV=conv_size,
           BLOCK_C=triton.next_power_of_2(max(conv_size, 1)),
           BLOCK_NC=triton.next_power_of_2(ncol), prefix_meta_ptr=prefix_meta,
           ALL_MODE=all_mode, MAMBA_BS=max(block_size, 1), CHUNK_GRID=chunk_grid,
           CONV_TO_SOURCE=conv_to_source)


@triton.jit
def _mamba_state_update_kernel(
    hidden_ptr,  # float32 [NUM_TOKENS, HEAD]: payload of each token
    query_start_loc_ptr,  # int32 [max_num_reqs + 1]: row r owns tokens [qsl[r], qsl[r+1])
    state_indices_ptr,  # int32 [max_num_reqs, NCOL]: state slot (block id) per column, -1 = skip
    has_initial_state_ptr,  # int32 [max_num_reqs]: 1 = add to the old state, 0 = start at 0
    state_ptr,  # float32 [num_blocks, HEAD]: recurrent state, updated in place
    num_accepted_ptr,  # int32 [max_num_reqs]: last accepted count (running column + 1)
    spec_rows_ptr,  # int32 [max_num_reqs]: 1 = spec decode (a state per token)
    read_out_ptr,  # int32 [max_num_reqs]: output, the index each row read through
    num_rows,
    HEAD: tl.constexpr,
    NCOL: tl.constexpr,  # state columns per row (1 + num_speculative_tokens)
    BLOCK_R: tl.constexpr,
    BLOCK_T: tl.constexpr,
    NUM_TOKENS: tl.constexpr,
    NUM_SLOTS: tl.constexpr,  # num_blocks: an index past it is dropped (a GPU would fault)
    COLUMN_UNBOUNDED: tl.constexpr,  # fault switch (accepted-column-unbounded)
    STATE_STRIDE: tl.constexpr,  # elements between two blocks' states (the page size when shared)
    SKIP_NULL: tl.constexpr,  # shared pages: never write the null block
    PAD_TO: tl.constexpr,  # -1: skip PAD_SLOT_ID rows; a block id: remap them there (fault)
    CONV: tl.constexpr,  # tokens of conv state before the SSM part (0: none)
    BLOCK_C: tl.constexpr,  # next_power_of_2(max(CONV, 1))
    BLOCK_NC: tl.constexpr,  # next_power_of_2(NCOL)
    prefix_meta_ptr,  # int32 [max_num_reqs, 5]: all mode's per-row block indices
    ALL_MODE: tl.constexpr,  # Mamba prefix caching in all mode
    MAMBA_BS: tl.constexpr,  # all mode: tokens per state block
    CHUNK_GRID: tl.constexpr,  # fault switch (mamba-all-boundary-on-chunk-grid)
    CONV_TO_SOURCE: tl.constexpr,  # fault switch (mamba-short-chunk-conv-to-source)
):
    r = tl.arange(0, BLOCK_R)
    t = tl.arange(0, BLOCK_T)
    d = tl.arange(0, HEAD)
    row_ok = r < num_rows
    lo = tl.load(query_start_loc_ptr + r, mask=row_ok, other=0)
    hi = tl.load(query_start_loc_ptr + r + 1, mask=row_ok, other=0)
    init = tl.load(has_initial_state_ptr + r, mask=row_ok, other=0)
    spec = tl.load(spec_rows_ptr + r, mask=row_ok, other=0)
    column = tl.load(num_accepted_ptr + r, mask=row_ok, other=1) - 1
    if not COLUMN_UNBOUNDED:
        column = tl.maximum(column, 0)
    if ALL_MODE:
        # [computed, last computed, first scheduled, last scheduled, prefill] per row
        # (loaded in all mode only: the interpreter's cost is per operation).
        computed = tl.load(prefix_meta_ptr + r * 5, mask=row_ok, other=0)
        column = tl.load(prefix_meta_ptr + r * 5 + 1, mask=row_ok, other=0)
        first = tl.load(prefix_meta_ptr + r * 5 + 2, mask=row_ok, other=0)
        last = tl.load(prefix_meta_ptr + r * 5 + 3, mask=row_ok, other=0)
        prefill = tl.load(prefix_meta_ptr + r * 5 + 4, mask=row_ok, other=0)
    flat = r * NCOL + column  # -1 past row 0's start: a GPU reads what lies before
    src = tl.load(state_indices_ptr + flat, mask=row_ok & (flat >= 0), other=0)
    if PAD_TO >= 0:
        src = tl.where(src < 0, PAD_TO, src)
    tl.store(read_out_ptr + r, src, mask=row_ok)
    src_ok = row_ok & (src >= 0) & (src < NUM_SLOTS)
    # d spans exactly HEAD (a power of 2, as tl.arange needs): no mask on it.
    loaded = src_ok & (init != 0)
    old = tl.load(state_ptr + src[:, None] * STATE_STRIDE + CONV * HEAD + d[None, :],
                  mask=loaded[:, None], other=0.0)
    if CONV > 0:
        # The old conv part, loaded before any column writes (a column may be the source).
        k = tl.arange(0, BLOCK_C)
        old_conv = tl.load(state_ptr + src[:, None, None] * STATE_STRIDE
                           + k[None, :, None] * HEAD + d[None, None, :],
                           mask=(loaded[:, None] & (k < CONV)[None, :])[:, :, None], other=0.0)
    tok_ok = t < NUM_TOKENS
    x = tl.load(hidden_ptr + t[:, None] * HEAD + d[None, :], mask=tok_ok[:, None], other=0.0)
    # Every column at once: the interpreter's cost is per operation, so no loop
    # over columns or conv entries. Columns lie on axis 0 and rows on axis 1, so
    # under the interpreter (which stores element by element in C order) two
    # writes to one address land as a loop over columns stored them, the later
    # column last. On a GPU one store's duplicate addresses have no defined
    # winner; they occur only where two rows or columns share a block, which
    # a fault is already reported for. Spec rows: the state after token c goes
    # to column c; other rows: the final state to column 0.
    c = tl.arange(0, BLOCK_NC)
    row_col_ok = row_ok[None, :]
    if BLOCK_NC > NCOL:
        row_col_ok = row_col_ok & (c < NCOL)[:, None]
    end = tl.where(spec[None, :] != 0, lo[None, :] + c[:, None] + 1, hi[None, :])  # [C, R]
    n = hi - lo
    if ALL_MODE:
        # Column c holds the state after position min((c + 1) * block_size,
        # computed + n) - 1: each boundary crossed, then the chunk's end.
        taken = tl.minimum((c[:, None] + 1) * MAMBA_BS - computed[None, :], n[None, :])
        in_chunk = (c[:, None] >= first[None, :]) & (c[:, None] <= last[None, :])
        if CHUNK_GRID:
            # The historical kernel: its own chunks of block_size tokens from the
            # chunk's start, the i-th into column first + i, the last into the last
            # scheduled column — off the block grid when the chunk starts mid-block.
            i = c[:, None] - first[None, :]
            chunks = (n + MAMBA_BS - 1) // MAMBA_BS
            at_last = c[:, None] == last[None, :]
            taken = tl.where(at_last, n[None, :], (i + 1) * MAMBA_BS)
            in_chunk = at_last | ((i >= 0) & (i < chunks[None, :] - 1))
        end = lo[None, :] + taken
        row_col_ok = row_col_ok & in_chunk
    member = ((t[None, None, :] >= lo[None, :, None]) & (t[None, None, :] < end[:, :, None])
              & tok_ok[None, None, :])  # [C, R, T]
    xs = tl.sum(tl.where(member[:, :, :, None], x[None, None, :, :], 0.0), axis=2)  # [C, R, D]
    dst = tl.load(state_indices_ptr + r[None, :] * NCOL + c[:, None], mask=row_col_ok, other=-1)
    if PAD_TO >= 0:
        dst = tl.where(dst < 0, PAD_TO, dst)
    write = row_col_ok & (dst >= 0) & (dst < NUM_SLOTS) & (src[None, :] >= 0)
    if NCOL > 1 and not ALL_MODE:
        # Columns past 0: spec rows only, and only as far as the row has tokens.
        write = write & ((c[:, None] == 0)
                         | ((spec[None, :] != 0) & (lo[None, :] + c[:, None] < hi[None, :])))
    if SKIP_NULL:
        write = write & (dst != 0)
    tl.store(state_ptr + dst[:, :, None] * STATE_STRIDE + CONV * HEAD + d[None, None, :],
             old[None, :, :] + xs, mask=write[:, :, None])
    if CONV > 0:
        # Conv part: entry kk of a column is entry n + kk of [old conv, tokens
        # lo..end), n = end - lo: an old entry while n + kk < CONV.
        at = (end - lo[None, :])[:, :, None] + k[None, None, :]  # [C, R, K]
        from_old = at < CONV
        prev = tl.sum(tl.where((k[None, None, None, :, None] == at[:, :, :, None, None])
                               & (k[None, None, None, :, None] < CONV),
                               old_conv[None, :, None, :, :], 0.0), axis=3)  # [C, R, K, D]
        tok = lo[None, :, None] + at - CONV
        xk = tl.load(hidden_ptr + tok[:, :, :, None] * HEAD + d[None, None, None, :],
                     mask=(row_ok[None, :, None] & ~from_old & (tok < NUM_TOKENS))[:, :, :, None],
                     other=0.0)
        conv_dst = dst
        if CONV_TO_SOURCE and ALL_MODE:
            # The historical short-chunk branch: a prefill chunk shorter than the
            # conv state stores it through the pointer it read the old one from.
            short = (prefill[None, :] != 0) & (n[None, :] < CONV) & (c[:, None] == last[None, :])
            conv_dst = tl.where(short, src[None, :], dst)
        tl.store(state_ptr + conv_dst[:, :, None, None] * STATE_STRIDE
                 + k[None, None, :, None] * HEAD + d[None, None, None, :],
                 tl.where(from_old[:, :, :, None], prev, xk),
                 mask=(write[:, :, None] & (k < CONV)[None, None, :])[:, :, :, None])
