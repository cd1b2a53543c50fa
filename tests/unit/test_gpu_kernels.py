"""Each Triton kernel of gpu_impl against a NumPy computation, on random inputs.

Runs under the Triton interpreter without CUDA (compiled on a GPU).  Inputs are
drawn by Hypothesis (``ci`` profile: derandomized) and kept small: every launch
costs milliseconds in the interpreter.
"""

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import gpu_impl.device  # noqa: F401  (kernel modules select the device before triton)
from gpu_impl.attention import paged_attention_read, reshape_and_cache
from gpu_impl.block_table import PAD_SLOT_ID, BlockTable
from gpu_impl.faults import FaultSet
from gpu_impl.mamba import mamba_state_update

KERNEL_EXAMPLES = settings(max_examples=12)


def _t(array, device):
    return torch.tensor(np.ascontiguousarray(array), device=device)  # a copy, never a view


@KERNEL_EXAMPLES
@given(seed=st.integers(0, 2**32 - 1), num_tokens=st.integers(0, 16),
       block_size=st.sampled_from([1, 2, 4, 8]))
def test_slot_mapping_kernel(device, seed, num_tokens, block_size):
    rng = np.random.default_rng(seed)
    rows, width, tokens = 4, 4, 16
    table = BlockTable(block_size, block_size, rows, width, device, FaultSet())
    table.block_table.np[:] = rng.integers(0, 12, (rows, width))
    table.commit(rows)
    padded = int(rng.integers(num_tokens, tokens + 1))
    req = np.full(tokens, 7, np.int32)  # beyond padded: must stay untouched
    req[:num_tokens] = rng.integers(0, rows, num_tokens)
    req[num_tokens:padded] = -1
    pos = rng.integers(0, width * block_size, tokens).astype(np.int64)
    out = torch.full((tokens,), 12345, dtype=torch.int64, device=device)
    table.compute_slot_mapping(_t(req, device), _t(pos, device), out, padded)
    want = np.full(tokens, 12345, np.int64)
    real = np.arange(num_tokens)
    blocks = table.block_table.np[req[real], pos[real] // block_size].astype(np.int64)
    want[real] = blocks * block_size + pos[real] % block_size
    want[num_tokens:padded] = PAD_SLOT_ID
    assert out.cpu().numpy().tolist() == want.tolist()


@KERNEL_EXAMPLES
@given(seed=st.integers(0, 2**32 - 1), num_tokens=st.integers(0, 16))
def test_kv_write_skips_pad_slots(device, seed, num_tokens):
    rng = np.random.default_rng(seed)
    blocks, bs, head = 6, 4, 4
    kv = rng.integers(-50, 50, (blocks, bs, head)).astype(np.float32)
    hidden = rng.integers(1, 100, (16, head)).astype(np.float32)
    hidden[rng.random(16) < 0.2] = np.nan
    slots = rng.permutation(blocks * bs)[:16].astype(np.int64)
    slots[rng.random(16) < 0.3] = PAD_SLOT_ID
    kv_t = _t(kv, device)
    reshape_and_cache(_t(hidden, device), _t(slots, device), kv_t, num_tokens)
    want = kv.reshape(-1, head).copy()
    for t in range(num_tokens):
        if slots[t] != PAD_SLOT_ID:
            want[slots[t]] = hidden[t]
    assert np.array_equal(kv_t.cpu().numpy().reshape(-1, head), want, equal_nan=True)


@KERNEL_EXAMPLES
@given(seed=st.integers(0, 2**32 - 1), num_rows=st.integers(0, 4))
def test_mamba_update_in_place_at_state_index(device, seed, num_rows):
    rng = np.random.default_rng(seed)
    rows, tokens, head, blocks = 4, 16, 4, 8
    lens = rng.integers(0, 4, rows)
    qsl = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    idx = rng.permutation(np.arange(1, blocks))[:rows].astype(np.int32)  # distinct slots
    idx[rng.random(rows) < 0.25] = PAD_SLOT_ID
    init = rng.integers(0, 2, rows).astype(np.int32)
    hidden = rng.integers(1, 100, (tokens, head)).astype(np.float32)
    state = rng.integers(-9, 9, (blocks, head)).astype(np.float32)
    state[rng.integers(0, blocks)] = np.nan
    st_t = _t(state, device)
    mamba_state_update(_t(hidden, device), _t(qsl, device), _t(idx, device), _t(init, device),
                       st_t, num_rows)
    want = state.copy()
    for r in range(num_rows):
        if idx[r] == PAD_SLOT_ID:
            continue
        old = state[idx[r]] if init[r] else 0.0
        want[idx[r]] = old + hidden[qsl[r]:qsl[r + 1]].sum(axis=0)
    assert np.array_equal(st_t.cpu().numpy(), want, equal_nan=True)


@KERNEL_EXAMPLES
@given(seed=st.integers(0, 2**32 - 1), num_rows=st.integers(1, 4), nan_in_null=st.booleans())
def test_attention_read_weights_masked_positions_by_zero(device, seed, num_rows, nan_in_null):
    rng = np.random.default_rng(seed)
    rows, width, bs, head, blocks = 4, 4, 4, 4, 8
    table = rng.integers(0, blocks, (rows, width)).astype(np.int32)
    seq = rng.integers(0, width * bs + 1, rows).astype(np.int32)
    kv = rng.integers(-20, 20, (blocks, bs, head)).astype(np.float32)
    if nan_in_null:
        kv[0, 0] = np.nan
    out = torch.zeros((rows, head), dtype=torch.float32, device=device)
    paged_attention_read(_t(table, device), _t(seq, device), _t(kv, device), out, num_rows)
    got = out.cpu().numpy()
    for r in range(rows):
        if r >= num_rows:
            assert not got[r].any()
            continue
        j = np.arange(width * bs)
        vals = kv[table[r, j // bs], j % bs]
        want = ((j < seq[r]).astype(np.float32)[:, None] * vals).sum(axis=0)
        assert np.array_equal(got[r], want, equal_nan=True)
        if nan_in_null and (table[r] == 0).any():
            assert np.isnan(got[r]).all()  # masked NaN still poisons the output


@KERNEL_EXAMPLES
@given(seed=st.integers(0, 2**32 - 1), num_tokens=st.integers(0, 16),
       block_size=st.sampled_from([2, 4, 8]), split=st.sampled_from([1, 2, 4]),
       world=st.sampled_from([1, 2, 4]), data=st.data())
def test_slot_mapping_kernel_split_blocks_and_dcp(device, seed, num_tokens, block_size, split,
                                                  world, data):
    """Kernel blocks (allocation block b -> kernel blocks b*k..b*k+k-1) and decode
    context parallelism: the slot of each position on this rank, as reference.dcp
    lays it out, PAD for positions other ranks keep."""
    from reference.dcp import local_slots

    kbs = max(1, block_size // split)
    k = block_size // kbs
    rank = data.draw(st.integers(0, world - 1))
    interleave = data.draw(st.sampled_from([i for i in (1, 2, 4) if block_size % i == 0]))
    rng = np.random.default_rng(seed)
    rows, width, tokens = 4, 3, 16
    table = BlockTable(block_size, kbs, rows, width, device, FaultSet(),
                       (world, rank, interleave))
    table.block_table.np[:] = rng.integers(0, 40, (rows, width * k))
    table.commit(rows)
    padded = int(rng.integers(num_tokens, tokens + 1))
    req = np.full(tokens, 7, np.int32)  # beyond padded: must stay untouched
    req[:num_tokens] = rng.integers(0, rows, num_tokens)
    req[num_tokens:padded] = -1
    pos = rng.integers(0, width * block_size * world, tokens).astype(np.int64)
    out = torch.full((tokens,), 12345, dtype=torch.int64, device=device)
    table.compute_slot_mapping(_t(req, device), _t(pos, device), out, padded)
    want = np.full(tokens, 12345, np.int64)
    real = np.arange(num_tokens)
    local, column, offset = local_slots(pos[real], block_size, world, rank, interleave)
    blocks = table.block_table.np[req[real], column * k + offset // kbs].astype(np.int64)
    want[real] = np.where(local, blocks * kbs + offset % kbs, PAD_SLOT_ID)
    want[num_tokens:padded] = PAD_SLOT_ID
    assert out.cpu().numpy().tolist() == want.tolist()


@KERNEL_EXAMPLES
@given(seed=st.integers(0, 2**32 - 1), num_reqs=st.integers(0, 4), data=st.data())
def test_gather_block_tables_kernel(device, seed, num_reqs, data):
    """V2 gather: input row b gets the first num_blocks[idx_mapping[b]] entries of
    staged row idx_mapping[b] (the rest of the row keeps what it held), rows padded
    for a FULL graph are zeroed, rows past the padding are untouched — as the
    reference's V2 staging (reference/runner_v2.py) defines it."""
    from gpu_impl.block_table_v2 import BlockTables

    padded = data.draw(st.integers(num_reqs, 4))
    rng = np.random.default_rng(seed)
    rows, sizes, kernel, widths = 4, [4, 16], [2, 16], [3, 1]
    tables = BlockTables(sizes, kernel, widths, rows, device, FaultSet(), [(1, 0, 1)] * 2)
    for g, staged in enumerate(tables.block_tables):
        staged.np[:] = rng.integers(1, 50, staged.np.shape)
        tables.num_blocks[g].np[:] = rng.integers(0, staged.np.shape[1] + 1, rows)
        tables.input_block_tables[g].fill_(99)
    tables.apply_staged_writes()
    idx = rng.permutation(rows).astype(np.int32)
    tables.gather_block_tables(_t(idx, device), num_reqs, padded)
    for g, staged in enumerate(tables.block_tables):
        want = np.full(staged.np.shape, 99, np.int32)
        for b in range(num_reqs):
            n = int(tables.num_blocks[g].np[idx[b]])
            want[b, :n] = staged.np[idx[b], :n]
        want[num_reqs:padded] = 0
        assert tables.input_block_tables[g].cpu().numpy().tolist() == want.tolist()


@KERNEL_EXAMPLES
@given(seed=st.integers(0, 2**32 - 1), num_rows=st.integers(1, 4))
def test_mamba_update_through_a_shared_page_view(device, seed, num_rows):
    """kv_sharing: the state view is a strided view of the attention pages (the
    page size as its block stride, the state at the page's start); the kernel
    writes through that stride — token 0 of the page — drops a write into the
    null block and leaves the rest of every page alone."""
    rng = np.random.default_rng(seed)
    rows, tokens, head, bs, blocks = 4, 8, 4, 4, 8
    lens = rng.integers(1, 3, rows)
    qsl = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    idx = rng.permutation(np.arange(0, blocks))[:rows].astype(np.int32)  # block 0 may come up
    init = rng.integers(0, 2, rows).astype(np.int32)
    hidden = rng.integers(1, 100, (tokens, head)).astype(np.float32)
    pages = rng.integers(-9, 9, (blocks, bs, head)).astype(np.float32)
    kv_t = _t(pages, device)
    flat = kv_t.view(blocks, -1)
    view = torch.as_strided(flat, (blocks, head), (flat.stride(0), 1))
    mamba_state_update(_t(hidden, device), _t(qsl, device), _t(idx, device), _t(init, device),
                       view, num_rows, skip_null=True)
    want = pages.copy()
    for r in range(num_rows):
        if idx[r] == 0:
            continue  # the null page is never written
        old = pages[idx[r], 0] if init[r] else 0.0
        want[idx[r], 0] = old + hidden[qsl[r]:qsl[r + 1]].sum(axis=0)
    assert np.array_equal(kv_t.cpu().numpy(), want)


@KERNEL_EXAMPLES
@given(seed=st.integers(0, 2**32 - 1), num_tokens=st.integers(0, 16),
       unguarded=st.booleans())
def test_quantized_kv_write_matches_the_oracle_arithmetic(device, seed, num_tokens,
                                                          unguarded):
    """kv_cache_dtype int8: the write kernel's payload and parameters are
    reference.quant's for every stored token, bit for bit (payload-sized values,
    wide ranges, NaN rows); PAD_SLOT_ID writes nothing — unless the parameter
    store is unguarded (a fault's path), which writes the pad token's
    parameters into the last slot and leaves its payload alone."""
    from gpu_impl.attention import quantize_rows
    from reference.quant import quantize

    rng = np.random.default_rng(seed)
    blocks, bs, head = 6, 4, 4
    hidden = rng.integers(-70000, 70000, (16, head)).astype(np.float32)
    small = rng.random(16) < 0.5
    hidden[small] = rng.integers(1, 70000, (int(small.sum()), 1)) + np.arange(head)
    hidden[rng.random(16) < 0.2] = np.nan
    slots = rng.permutation(blocks * bs - 1)[:16].astype(np.int64)  # the last slot: free
    slots[rng.random(16) < 0.3] = PAD_SLOT_ID
    q0, p0 = quantize(np.full((blocks * bs, head), -7.0, np.float32))
    kv_t, params_t = _t(q0.reshape(blocks, bs, head), device), _t(p0.reshape(blocks, bs, 2), device)
    reshape_and_cache(_t(hidden, device), _t(slots, device), kv_t, num_tokens,
                      kv_params=params_t, params_unguarded=unguarded)
    want_q, want_p = q0.copy(), p0.copy()
    q, p = quantize(hidden)
    for t in range(num_tokens):
        if slots[t] != PAD_SLOT_ID:
            want_q[slots[t]], want_p[slots[t]] = q[t], p[t]
        elif unguarded:
            want_p[-1] = p[t]
    assert np.array_equal(kv_t.cpu().numpy().reshape(-1, head), want_q)
    assert np.array_equal(params_t.cpu().numpy().reshape(-1, 2), want_p, equal_nan=True)
    hq, hp = quantize_rows(_t(hidden, device))  # the runner's host-side writes agree
    assert np.array_equal(hq.cpu().numpy(), q)
    assert np.array_equal(hp.cpu().numpy(), p, equal_nan=True)


@KERNEL_EXAMPLES
@given(seed=st.integers(0, 2**32 - 1), num_rows=st.integers(0, 4))
def test_quantized_attention_read_dequantizes(device, seed, num_rows):
    """The read of a quantized cache sums ``q * scale + zero`` with the same
    weights; a NaN scale in the null block poisons every row that holds it."""
    from reference.quant import dequantize, quantize

    rng = np.random.default_rng(seed)
    rows, width, bs, head, blocks = 4, 4, 4, 4, 8
    table = rng.integers(0, blocks, (rows, width)).astype(np.int32)
    seq = rng.integers(0, width * bs + 1, rows).astype(np.int32)
    kv = (rng.integers(0, 64000, (blocks, bs, 1)) + np.arange(head)).astype(np.float32)
    kv[0, 0] = np.nan
    q, p = quantize(kv.reshape(-1, head))
    out = torch.zeros((rows, head), dtype=torch.float32, device=device)
    paged_attention_read(_t(table, device), _t(seq, device),
                         _t(q.reshape(blocks, bs, head), device), out, num_rows,
                         kv_params=_t(p.reshape(blocks, bs, 2), device))
    deq = dequantize(q, p).reshape(blocks, bs, head)
    got = out.cpu().numpy()
    for r in range(num_rows):
        j = np.arange(width * bs)
        want = ((j < seq[r]).astype(np.float32)[:, None] * deq[table[r, j // bs], j % bs]).sum(0)
        assert np.array_equal(got[r], want, equal_nan=True)
        if (table[r] == 0).any():
            assert np.isnan(got[r]).all()


@KERNEL_EXAMPLES
@given(seed=st.integers(0, 2**32 - 1), pad_target=st.sampled_from([None, 0, 7]))
def test_mamba_update_skips_or_remaps_pad_slot_rows(device, seed, pad_target):
    """PAD_SLOT_ID rows are skipped; with ``pad_target`` (a fault's path) they
    read and write that block instead."""
    rng = np.random.default_rng(seed)
    rows, tokens, head, blocks = 4, 8, 4, 8
    lens = rng.integers(0, 3, rows)
    qsl = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    idx = rng.permutation(np.arange(1, blocks - 1))[:rows].astype(np.int32)
    idx[rng.integers(0, rows)] = PAD_SLOT_ID  # one: two remapped rows would race
    init = rng.integers(0, 2, rows).astype(np.int32)
    hidden = rng.integers(1, 100, (tokens, head)).astype(np.float32)
    state = rng.integers(-9, 9, (blocks, head)).astype(np.float32)
    state_t = _t(state, device)
    mamba_state_update(_t(hidden, device), _t(qsl, device), _t(idx, device), _t(init, device),
                       state_t, rows, pad_target=pad_target)
    want = state.copy()
    for r in range(rows):
        dst = idx[r] if idx[r] != PAD_SLOT_ID else pad_target
        if dst is None:
            continue
        old = state[dst] if init[r] else 0.0
        want[dst] = old + hidden[qsl[r]:qsl[r + 1]].sum(axis=0)
    assert np.array_equal(state_t.cpu().numpy(), want)


@KERNEL_EXAMPLES
@given(seed=st.integers(0, 2**32 - 1), conv=st.integers(0, 3), spec=st.booleans())
def test_mamba_update_shifts_the_conv_state(device, seed, conv, spec):
    """A Mamba state with a conv part (conv_size tokens, then the SSM sum): each
    written state holds the last conv_size payloads of [old conv, the row's
    tokens] — per token for a spec-decode row, read before any column is written
    — and the SSM sum after them, as reference.payload.mamba_state_of builds it."""
    from reference.payload import mamba_state_of

    rng = np.random.default_rng(seed)
    rows, tokens, head, blocks, ncol = 4, 12, 4, 16, 3
    lens = rng.integers(0, 4, rows)
    qsl = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    cols = rng.permutation(np.arange(1, blocks))[:rows * ncol].reshape(rows, ncol).astype(np.int32)
    # The running column (num_accepted 1: column 0) is also written: read first.
    init = rng.integers(0, 2, rows).astype(np.int32)
    hidden = rng.integers(1, 100, (tokens, head)).astype(np.float32)
    width = (conv + 1) * head
    state = rng.integers(-9, 9, (blocks, width)).astype(np.float32)
    spec_rows = (np.full(rows, int(spec)) & (lens > 0)).astype(np.int32)
    state_t = _t(state, device)
    mamba_state_update(_t(hidden, device), _t(qsl, device), _t(cols, device), _t(init, device),
                       state_t, rows, num_accepted=_t(np.ones(rows, np.int32), device),
                       spec_rows=_t(spec_rows, device), conv_size=conv)
    want = state.copy()
    for r in range(rows):
        lo, hi = qsl[r], qsl[r + 1]
        old = state[cols[r, 0]] if init[r] else np.zeros(width, np.float32)
        prefix = old[:conv * head].reshape(conv, head)
        ends = range(lo + 1, hi + 1) if spec_rows[r] else [hi]
        for c, end in enumerate(ends):
            if c >= ncol:
                break
            got = mamba_state_of(np.concatenate([prefix, hidden[lo:end]]), conv)
            got[conv * head:] = old[conv * head:] + hidden[lo:end].sum(axis=0)
            want[cols[r, c]] = got
    assert np.array_equal(state_t.cpu().numpy(), want)


@KERNEL_EXAMPLES
@given(seed=st.integers(0, 2**32 - 1), chunk_grid=st.booleans())
def test_mamba_all_mode_writes_each_crossed_boundary_and_the_end(device, seed, chunk_grid):
    """All mode (vLLM's mamba_cache_mode="all"): a row of n tokens after s computed
    reads the state at column cdiv(s, bs) - 1 and writes, to each column c from
    s // bs to (s + n - 1) // bs, the state after min((c + 1) * bs, s + n) tokens.
    The fault's path (``chunk_grid``) counts boundaries from the chunk's start."""
    rng = np.random.default_rng(seed)
    rows, width, bs, head, conv = 3, 6, 4, 4, 3
    s = rng.integers(0, 3 * bs, rows)
    n = rng.integers(1, 2 * bs + 1, rows)
    n = np.minimum(n, width * bs - s)
    qsl = np.concatenate([[0], np.cumsum(n)]).astype(np.int32)
    table = (1 + np.arange(rows * width)).reshape(rows, width).astype(np.int32)
    blocks = rows * width + 1
    seq = s + n
    last = (seq - 1) // bs
    meta = np.stack([s, np.maximum(-(-s // bs) - 1, 0), s // bs, last, np.ones(rows)],
                    axis=1).astype(np.int32)
    hidden = rng.integers(1, 50, (int(qsl[-1]), head)).astype(np.float32)
    state = rng.integers(-9, 9, (blocks, (conv + 1) * head)).astype(np.float32)
    st_t = _t(state, device)
    mamba_state_update(_t(hidden, device), _t(qsl, device), _t(table, device),
                       _t((s > 0).astype(np.int32), device), st_t, rows, conv_size=conv,
                       prefix_meta=_t(meta, device), all_mode=True, block_size=bs,
                       chunk_grid=chunk_grid)
    want = state.copy()
    for r in range(rows):
        read = table[r, meta[r, 1]]
        old = state[read] if s[r] else np.zeros_like(state[0])
        rows_in = hidden[qsl[r]:qsl[r + 1]]

        def after(k):
            seqn = np.concatenate([old[:conv * head].reshape(conv, head), rows_in[:k]])
            return np.concatenate([seqn[len(seqn) - conv:].reshape(-1),
                                   old[conv * head:] + rows_in[:k].sum(axis=0)])

        for c in range(s[r] // bs, last[r] + 1):
            if chunk_grid:
                i, chunks = c - s[r] // bs, -(-n[r] // bs)
                if c == last[r]:
                    want[table[r, c]] = after(n[r])
                elif i < chunks - 1:
                    want[table[r, c]] = after((i + 1) * bs)
            else:
                want[table[r, c]] = after(min((c + 1) * bs - s[r], n[r]))
    assert np.array_equal(st_t.cpu().numpy(), want)
