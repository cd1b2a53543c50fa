"""Mamba-style recurrent state update, written in place at the state index.

Stands in for the Mamba / GDN / KDA kernels of hybrid models: each batch row
sums the payload of its tokens and adds it to its state slot
``state[state_indices[row]]`` (from zero when the request has no initial
state).  The state index comes from the metadata builder — ``block_table[row,
0]`` of the mamba group for real rows, the null block for rows padded to a
FULL capture size — which is why a stale block-table row, or a state-index
buffer not re-staged before a FULL replay, writes state into a block the row
does not own (seed 000).  ``PAD_SLOT_ID`` (-1) rows are skipped.
"""

from __future__ import annotations

import torch
from ._triton import tl, triton

from .cuda_graph import launch


def mamba_state_update(hidden: torch.Tensor, query_start_loc: torch.Tensor,
                       state_indices: torch.Tensor, has_initial_state: torch.Tensor,
                       state: torch.Tensor, num_rows: int) -> None:
    """In-place update of rows [0, num_rows).

    hidden: float32 (max_num_batched_tokens, head_size); query_start_loc: int32
    (max_num_reqs + 1,); state_indices / has_initial_state: int32
    (max_num_reqs,); state: float32 (num_blocks, head_size).  An index past
    the pool (an engine's garbage) is dropped: a GPU would fault, the
    interpreter would corrupt host memory; ``MATCHES_REFERENCE`` reports it.
    """
    launch(_mamba_state_update_kernel, (1,), hidden, query_start_loc, state_indices,
           has_initial_state, state, num_rows, HEAD=hidden.shape[1],
           BLOCK_R=triton.next_power_of_2(state_indices.shape[0]),
           BLOCK_T=triton.next_power_of_2(hidden.shape[0]), NUM_TOKENS=hidden.shape[0],
           NUM_SLOTS=state.shape[0])


@triton.jit
def _mamba_state_update_kernel(
    hidden_ptr,  # float32 [NUM_TOKENS, HEAD]: payload of each token
    query_start_loc_ptr,  # int32 [max_num_reqs + 1]: row r owns tokens [qsl[r], qsl[r+1])
    state_indices_ptr,  # int32 [max_num_reqs]: state slot (block id) per row, -1 = skip
    has_initial_state_ptr,  # int32 [max_num_reqs]: 1 = add to the old state, 0 = start at 0
    state_ptr,  # float32 [num_blocks, HEAD]: recurrent state, updated in place
    num_rows,
    HEAD: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_T: tl.constexpr,
    NUM_TOKENS: tl.constexpr,
    NUM_SLOTS: tl.constexpr,  # num_blocks: an index past it is dropped (a GPU would fault)
):
    r = tl.arange(0, BLOCK_R)
    t = tl.arange(0, BLOCK_T)
    d = tl.arange(0, HEAD)
    row_ok = r < num_rows
    lo = tl.load(query_start_loc_ptr + r, mask=row_ok, other=0)
    hi = tl.load(query_start_loc_ptr + r + 1, mask=row_ok, other=0)
    idx = tl.load(state_indices_ptr + r, mask=row_ok, other=-1)
    init = tl.load(has_initial_state_ptr + r, mask=row_ok, other=0)
    tok_ok = t < NUM_TOKENS
    x = tl.load(hidden_ptr + t[:, None] * HEAD + d[None, :],
                mask=tok_ok[:, None] & (d[None, :] < HEAD), other=0.0)
    member = (t[None, :] >= lo[:, None]) & (t[None, :] < hi[:, None]) & tok_ok[None, :]
    contrib = tl.where(member[:, :, None], x[None, :, :], 0.0)
    xs = tl.sum(contrib, axis=1)
    keep = row_ok & (idx >= 0) & (idx < NUM_SLOTS)
    mask = keep[:, None] & (d[None, :] < HEAD)
    old = tl.load(state_ptr + idx[:, None] * HEAD + d[None, :], mask=mask, other=0.0)
    old = tl.where(init[:, None] != 0, old, 0.0)
    tl.store(state_ptr + idx[:, None] * HEAD + d[None, :], old + xs, mask=mask)
