"""Faults of SGLang's history, re-created in the installed SGLang's own code.

Each fault of the catalogue (``gpu_impl/faults.py``) with runner ``sglang`` is
one function here that changes the behaviour of the SGLang object the sglang
target owns, at the place the bug lived, back to what it was before the fix.
The change is made on the target's own instances (their bound methods or
fields), never on SGLang's classes, so a session without the fault, in the
same process, runs the released code.  With no fault on, nothing here runs.
"""

from __future__ import annotations


def _padding_keeps_stale_cache_loc(target) -> None:
    """Before sgl-project/sglang PR #24743: the padded rows of the graph's
    out_cache_loc buffer were not zeroed on pad; they kept the last replay's."""
    registry = target.registry
    fill = registry.fill_from
    buf = registry.get_slot("out_cache_loc").buffer
    last = buf.new_zeros(buf.shape)  # what the last replay left (capture: zeros)

    def fill_from(fb, *, raw_bs, padded_bs, **kw):
        fill(fb, raw_bs=raw_bs, padded_bs=padded_bs, **kw)
        buf[raw_bs:padded_bs] = last[raw_bs:padded_bs]
        last.copy_(buf)

    registry.fill_from = fill_from


def _request_row_0_handed_out(target) -> None:
    """Before sgl-project/sglang PR #24243: the request pool's free rows started at 0
    (its rows were 0..size-1; the padding row was not reserved)."""
    pool = target.req_to_token_pool
    pool.free_slots = list(range(0, pool.size))


def _checkpoint_row_not_remapped(target) -> None:
    """mini-sglang PR #142: after the insert freed the request's duplicate slots, the
    request's row was not pointed at the tree's slots (the remap was missing)."""
    tree, pool = target.tree, target.req_to_token_pool
    # The remap's place: RadixCache.checkpoint (0.5.23), cache_unfinished_req before.
    name = "checkpoint" if hasattr(tree, "checkpoint") else "cache_unfinished_req"
    publish = getattr(tree, name)

    def no_remap(req, *args, **kw):
        row = req.kv.req_pool_idx
        kept = pool.req_to_token[row].clone()
        publish(req, *args, **kw)
        pool.req_to_token[row] = kept  # the row as it was: its own (now freed) slots

    setattr(tree, name, no_remap)


def _lock_skips_matched_node(target) -> None:
    """mini-sglang PR #52: the lock walk moved to the parent before locking, so the
    matched node itself was never locked (nor unlocked)."""
    tree = target.tree
    inc, dec = tree.inc_lock_ref, tree.dec_lock_ref
    resolve = getattr(tree, "resolve_node_handle", lambda handle: handle)

    def parent(handle):
        """The parent of a node, or of a NodeId (the unified tree's handles)."""
        node = resolve(handle)
        if node is resolve(tree.root_node) or node.parent is None:
            return handle
        return node.parent.id if isinstance(handle, int) else node.parent

    tree.inc_lock_ref = lambda node, *a, **kw: inc(parent(node), *a, **kw)
    tree.dec_lock_ref = lambda node, *a, **kw: dec(parent(node), *a, **kw)


def _mamba_slot_0_handed_out(target) -> None:
    """Before sgl-project/sglang PR #17404: the Mamba pool's free slots started at 0
    (the slot graph capture's dummy rows write was not reserved)."""
    pool = getattr(target.req_to_token_pool, "mamba_allocator", None)
    if pool is None:
        return  # an attention-only config: no Mamba pool to change
    import torch

    pool.free_slots = torch.cat([torch.zeros(1, dtype=pool.free_slots.dtype),
                                 pool.free_slots])


def _mamba_padding_keeps_stale_state_index(target) -> None:
    """The Mamba backend's replay metadata refreshes the real rows' state indices
    only (the padded rows' zeroing and PAD_SLOT_ID step left out), as xLLM's graph
    padding did before its PR #1904: padded rows keep what the captured buffer
    held."""
    backend = target.mamba_backend
    if backend is None:
        return
    replay = backend._replay_metadata

    def replay_real_rows(bs, req_pool_indices, *args, num_padding=None, in_capture=False,
                         **kw):
        if in_capture or not num_padding:
            return replay(bs, req_pool_indices, *args, num_padding=num_padding,
                          in_capture=in_capture, **kw)
        buf = backend.state_indices_list[bs - 1]
        kept = buf[bs - num_padding:].clone()
        out = replay(bs, req_pool_indices, *args, num_padding=num_padding,
                     in_capture=in_capture, **kw)
        buf[bs - num_padding:] = kept
        return out

    backend._replay_metadata = replay_real_rows


PATCHES = {
    "sgl-padding-keeps-stale-cache-loc": _padding_keeps_stale_cache_loc,
    "sgl-request-row-0-handed-out": _request_row_0_handed_out,
    "sgl-checkpoint-row-not-remapped": _checkpoint_row_not_remapped,
    "sgl-lock-skips-matched-node": _lock_skips_matched_node,
    "sgl-mamba-slot-0-handed-out": _mamba_slot_0_handed_out,
    "sgl-mamba-padding-keeps-stale-state-index": _mamba_padding_keeps_stale_state_index,
}


def apply(target, faults) -> None:
    """Switch ``faults`` (ids of runner ``sglang``) on in ``target``'s SGLang objects.
    Raises ``ValueError`` for an id that is not an SGLang fault."""
    for fid in faults:
        if fid not in PATCHES:
            raise ValueError(f"fault {fid!r} is not an SGLang fault; the sglang target "
                             f"takes {', '.join(sorted(PATCHES))}")
        PATCHES[fid](target)
