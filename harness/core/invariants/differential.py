"""``MATCHES_REFERENCE``: the differential check against the NumPy oracle.

Compares what the last forward used — host rows (V2: their live part), the
device block-table rows it read, slot mappings (incl. the PAD tail), live rows' counters,
state indices, caches (the Mamba null block is scratch) and attention outputs
— with the reference's observation after the same op.  Buffer regions no
forward reads are the engine's own business.
"""

from __future__ import annotations

import numpy as np

from harness.core.invariants import Invariant, Violation, register
from harness.core.observation import (ROWS_BY_ENGINE, ROWS_BY_STATE_INDEX, Observation,
                                      same_bits)
from reference import RunnerConfig


def _item(value):
    return np.asarray(value).tolist()


def _live_part(obs: Observation) -> tuple[list, list]:
    """V2 staged rows as the contract defines them: a live state index's first
    ``num_blocks`` entries (a free index is overwritten on reuse, and nothing
    reads past a row's count), zero elsewhere.  V1 rows are returned whole:
    a vacated V1 row must be zero everywhere."""
    if obs.rows_indexed_by != ROWS_BY_STATE_INDEX:
        return obs.host_block_table, obs.host_num_blocks_per_row
    live = obs.host_req_ids != -1
    cut = [_cut(t, n, live) for t, n in zip(obs.host_block_table, obs.host_num_blocks_per_row)]
    return [t for t, _ in cut], [n for _, n in cut]


def _cut(table: np.ndarray, n: np.ndarray, live: np.ndarray) -> tuple:
    """(table, counts) of one KV-cache group cut to the live rows' first
    ``num_blocks`` entries (:func:`_live_part`)."""
    n = np.where(live, n, 0).astype(n.dtype)
    cols = np.arange(table.shape[1])[None, :]
    return np.where(cols < n[:, None], table, 0).astype(table.dtype), n


def _live_parts_where_differ(impl: Observation, ref: Observation) -> tuple:
    """(impl rows, impl counts, ref rows, ref counts) as :func:`_live_part` gives
    them, for two observations with the same request ids: a group whose raw
    rows and counts are bit for bit equal is returned raw on both sides (its
    live parts are equal too), the others are cut."""
    if impl.rows_indexed_by != ROWS_BY_STATE_INDEX \
            or len(impl.host_block_table) != len(ref.host_block_table):
        return (*_live_part(impl), *_live_part(ref))
    live = ref.host_req_ids != -1  # (the same ids on both sides)
    out = ([], [], [], [])
    for a, na, b, nb in zip(impl.host_block_table, impl.host_num_blocks_per_row,
                            ref.host_block_table, ref.host_num_blocks_per_row):
        if not (same_bits(a, b) and same_bits(na, nb)):
            (a, na), (b, nb) = _cut(a, na, live), _cut(b, nb, live)
        for lst, v in zip(out, (a, na, b, nb)):
            lst.append(v)
    return out


def _state_index_order(impl: Observation, ref: Observation) -> np.ndarray | None:
    """Row order that lines the implementation's host rows up with the reference's
    (None: the rows as they are).

    V1 rows are compared as they are (which request sits in which persistent-
    batch row is the contract).  V2 rows are by state index, and which free
    index a new request gets is the engine's choice (vLLM's ``RequestState``
    pops the last free one; the reference takes the lowest): each request's
    row is compared with its row in the reference, the implementation's other
    rows fill the reference's empty ones in order (a request only one side
    has shows in ``req_ids``).
    """
    n = len(ref.host_req_ids)
    if impl.rows_indexed_by != ROWS_BY_STATE_INDEX or len(impl.host_req_ids) != n:
        return None  # rows as they are
    where = {int(r): i for i, r in enumerate(impl.host_req_ids) if r != -1}
    order = np.full(n, -1, np.int64)
    for i, r in enumerate(ref.host_req_ids):
        if r != -1 and int(r) in where:
            order[i] = where.pop(int(r))
    used = set(order[order >= 0].tolist())
    order[order == -1] = [i for i in range(n) if i not in used]
    return order


def _where(live: np.ndarray, counters: np.ndarray) -> np.ndarray:
    """Per-row counters on live rows, 0 on empty ones (vLLM's ``InputBatch``
    leaves a removed request's counters in its row)."""
    return np.where(live, counters, 0).astype(counters.dtype) if counters.shape == live.shape \
        else counters


def _defined(impl_table: np.ndarray, ref_table: np.ndarray, rows: int, counts, g: int):
    """Device rows [0, rows), each cut to the entries the last gather defined (V2: a
    real row's ``num_blocks``; past it vLLM 0.33 zeroes what 0.26 leaves stale)."""
    a, b = impl_table[:rows], ref_table[:rows]
    # (equal rows: an equal cut too)
    if counts is not None and a.shape == b.shape and not same_bits(a, b):
        a, b = a.copy(), b.copy()
        past = np.arange(a.shape[1])[None, :] >= counts[g][:rows, None]
        a[past] = b[past] = 0
    return a, b


def check_matches_reference(impl: Observation, ref: Observation, op_index: int,
                            op: str, config: RunnerConfig) -> list[Violation]:
    """Compare what the last forward used: host rows (V2: their live part), the
    device block-table rows it read ([0, num_reqs_padded)), slot mappings
    ([0, num_tokens_padded)), counters, caches, outputs.  Buffer regions no
    forward reads are the engine's business (vLLM PAD-fills slot mappings to the
    end of the buffer; 0.33 zeroes device rows left by a larger batch).  An
    engine's own runner (:data:`ROWS_BY_ENGINE`) is compared by request:
    :func:`_engine_pairs`."""
    if impl.rows_indexed_by == ROWS_BY_ENGINE:
        return _first_difference(_engine_pairs(impl, ref, config), op_index, op)
    lf = ref.last_forward
    rows_used, tokens_used = (lf.num_reqs_padded, lf.num_tokens_padded) if lf else (0, 0)
    same_ids = same_bits(impl.host_req_ids, ref.host_req_ids)
    # Equal request ids: the rows line up as they are (the order would be the
    # identity), and a group whose raw rows and counts are equal has equal live
    # parts — most ops; only the groups that differ are cut to their live part.
    order = None if same_ids else _state_index_order(impl, ref)
    impl_ids, impl_computed, impl_prompt = \
        impl.host_req_ids, impl.num_computed_tokens, impl.num_prompt_tokens
    if same_ids:
        impl_rows, impl_counts, ref_rows, ref_counts = _live_parts_where_differ(impl, ref)
    else:
        impl_rows, impl_counts = _live_part(impl)
        ref_rows, ref_counts = _live_part(ref)
    if order is not None:
        impl_ids, impl_computed, impl_prompt = \
            impl_ids[order], impl_computed[order], impl_prompt[order]
        impl_rows, impl_counts = [t[order] for t in impl_rows], [n[order] for n in impl_counts]
    live = None  # the live rows: an empty row's counters (nothing reads them) are masked
    pairs = [("req_ids", impl_ids, ref.host_req_ids)]
    for name, a, b in (("num_computed_tokens", impl_computed, ref.num_computed_tokens),
                       ("num_prompt_tokens", impl_prompt, ref.num_prompt_tokens)):
        if same_bits(a, b):
            continue  # equal everywhere: equal on live rows too
        if live is None:
            live = ref.host_req_ids != -1
        if a.shape != b.shape or np.count_nonzero((a != b) & live):
            pairs.append((name, _where(live, a), _where(live, b)))
    if _forward_key(impl.last_forward) != _forward_key(ref.last_forward):
        pairs.append(("last_forward", _forward_fields(impl.last_forward),
                      _forward_fields(ref.last_forward)))
    for g in range(len(impl.host_block_table)):
        pairs += [(("block_table", g), impl_rows[g], ref_rows[g]),
                  (("num_blocks_per_row", g), impl_counts[g], ref_counts[g]),
                  (("device_block_table", g), *_defined(impl.device_block_table[g],
                                                         ref.device_block_table[g], rows_used,
                                                         ref.device_row_counts, g))]
    for g, v in ref.slot_mapping.items():
        pairs.append((("slot_mapping", g), impl.slot_mapping[g][:tokens_used], v[:tokens_used]))
    if impl.metadata is not None and ref.metadata is not None:
        for name, v in ref.metadata.items():  # rows the last forward staged
            n = rows_used + 1 if name == "query_start_loc" else rows_used
            pairs.append((f"metadata.{name}", impl.metadata[name][:n], v[:n]))
    for g, v in ref.state_indices.items():
        a, b = impl.state_indices[g], v
        if same_bits(a, b):
            continue
        if config.has_null_block(g):  # PAD_SLOT_ID and the null block: both neutral
            a, b = np.maximum(a, 0), np.maximum(b, 0)
        pairs.append((("state_indices", g), a, b))
    if tuple(impl.draft_rows or ()) != tuple(ref.draft_rows or ()):
        pairs.append(("draft_rows", np.array(impl.draft_rows or (), object),
                      np.array(ref.draft_rows or (), object)))
    if ref.draft_rows and impl.draft_slot_mapping is not None:
        n = ref.draft_rows[1]
        pairs.append(("draft_slot_mapping", impl.draft_slot_mapping[:n],
                      ref.draft_slot_mapping[:n]))
    return _first_difference(pairs + _effect_pairs(impl, ref, config), op_index, op)


def _engine_pairs(impl: Observation, ref: Observation, config: RunnerConfig) -> list:
    """The comparison with an engine's own model runner (the vllm target's runner
    mode).  Its rows, padding, counters and graph dispatch are the engine's
    decisions from scheduler outputs — it takes an unscheduled request out of
    its batch, condenses after every output's removals, advances counters when
    the next output arrives, picks the runtime mode from the batch — so they
    are not the reference's op by op, and are not compared.  What is: the last
    forward's kind (dummy or not), real tokens and requests, each request's
    attention output (by request, whatever row it ran in), and the caches —
    everything a kernel left (:func:`_effect_pairs`) — but the drafter's KV
    cache: the engine's runner drives a drafter of blockfuzz's that proposes
    the trace's drafts and writes no KV (``draft_kv_cache`` None), so the
    reference's draft-layer writes have nothing to compare with."""
    pairs = []
    a, b = impl.last_forward, ref.last_forward
    if b is not None:
        got = () if a is None else (a.dummy, a.num_tokens, tuple(sorted(a.req_ids)))
        pairs.append(("last_forward (dummy, tokens, requests)", np.array(got, object),
                      np.array((b.dummy, b.num_tokens, tuple(sorted(b.req_ids))), object)))
    if a is not None and b is not None and not b.dummy and sorted(a.req_ids) == \
            sorted(b.req_ids):
        row_of = {r: i for i, r in enumerate(a.req_ids)}
        for g, v in ref.attn_out.items():
            order = [row_of[r] for r in b.req_ids]
            pairs.append((f"attn_out[{g}] (rows by request {list(b.req_ids)})",
                          impl.attn_out[g][order], v[:len(order)], ("row", "element")))
    return pairs + _effect_pairs(impl, ref, config, outputs=False,
                                 drafts=impl.draft_kv_cache is not None)


def _effect_pairs(impl: Observation, ref: Observation, config: RunnerConfig,
                  outputs: bool = True, drafts: bool = True) -> list:
    """What the kernels left: caches (a Mamba null block is scratch; under
    ``mamba_padding`` ``pad_slot_no_null`` block 0 is a state like any other)
    and outputs."""
    kv = ("block", "offset", "element")
    # A quantized cache: its parameter buffer first (a wrong scale names itself).
    pairs = [(("kv_params", g), (impl.kv_params or {}).get(g, np.zeros(0)), v,
              ("block", "offset", "scale/zero"))
             for g, v in (ref.kv_params or {}).items()]
    pairs += [(("kv_cache", g), impl.kv_cache[g], v, kv) for g, v in ref.kv_cache.items()]
    pairs += [(("draft_kv_cache", g), (impl.draft_kv_cache or {}).get(g, np.zeros(0)), v, kv)
              for g, v in (ref.draft_kv_cache or {}).items() if drafts]
    pairs += [(("attn_out", g), impl.attn_out[g], v, ("row", "element"))
              for g, v in ref.attn_out.items() if outputs]
    for g, v in ref.mamba_state.items():
        a, b = impl.mamba_state[g], v
        if config.has_null_block(g):  # the null block is scratch; index = block id
            if a.shape == b.shape and same_bits(a[1:], b[1:]):  # (whole shapes too)
                continue  # equal past it (most ops): no copies to make
            a, b = a.copy(), b.copy()
            a[0] = b[0] = 0.0
        pairs.append((("mamba_state", g), a, b, ("block", "element")))
    return pairs


def effects_differ(impl: Observation, ref: Observation, op_index: int,
                   op: str, config: RunnerConfig) -> list[Violation]:
    """``MATCHES_REFERENCE`` restricted to what the kernels left (caches, outputs):
    the consequence of a structural finding when no write lands where it may
    not — a write that went missing, or into scratch (not registered: the full
    differential check already covers it)."""
    if impl.rows_indexed_by == ROWS_BY_ENGINE:  # already compared by effect
        return _first_difference(_engine_pairs(impl, ref, config), op_index, op)
    return _first_difference(_effect_pairs(impl, ref, config), op_index, op)


def _first_difference(pairs: list, op_index: int, op: str) -> list[Violation]:
    """The first pair (name, implementation's, reference's[, axis names]) whose
    arrays differ, as a violation; a name is a str or (field, KV-cache group),
    which reads ``field[group]``."""
    for pair in pairs:
        a, b = pair[1], pair[2]
        if a.shape == b.shape and a.dtype == b.dtype and a.dtype != object \
                and a.tobytes() == b.tobytes():
            continue  # bit for bit equal (most pairs, most ops): no masks to build
        name, axes = pair[0], pair[3:]
        if not isinstance(name, str):
            name = f"{name[0]}[{name[1]}]"
        if a.shape != b.shape:
            what = ""
            if "block_table" in name and a.ndim == 2 and a.shape[0] == b.shape[0]:
                what = (f" — rows of {a.shape[1]} columns, the reference's have "
                        f"{b.shape[1]} (a group's row width: its blocks per max_model_len, "
                        "in kernel blocks)")
            return [Violation("MATCHES_REFERENCE", op_index, op,
                              f"{name}: shape {a.shape} vs reference {b.shape}{what}")]
        same = (a == b) if a.dtype == object else ((a == b) | (np.isnan(a) & np.isnan(b))
                                                   if a.dtype.kind == "f" else a == b)
        if not np.all(same):
            idx = tuple(int(i) for i in np.argwhere(~np.asarray(same, bool))[0])
            at = (" " + ", ".join(f"{ax} {i}" for ax, i in zip(axes[0], idx))
                  if axes and len(axes[0]) == len(idx) else f"{list(idx)}")
            return [Violation("MATCHES_REFERENCE", op_index, op,
                              f"{name}{at} is {_item(a[idx])}, reference has "
                              f"{_item(b[idx])}")]
    return []


def _forward_key(info) -> tuple:
    """The fields :func:`_forward_fields` compares, as a tuple (equal tuples:
    the pair is equal, and is not built)."""
    if info is None:
        return ()
    return (info.dummy, info.cudagraph_mode, info.num_reqs, info.num_reqs_padded,
            info.num_tokens, info.num_tokens_padded, tuple(info.req_ids))


def _forward_fields(info) -> np.ndarray:
    """A ForwardInfo as a comparable object array (empty before the first forward)."""
    if info is None:
        return np.array((), object)
    return np.array([info.dummy, info.cudagraph_mode, info.num_reqs, info.num_reqs_padded,
                     info.num_tokens, info.num_tokens_padded, tuple(info.req_ids)], object)


register(Invariant(
    "MATCHES_REFERENCE", "what the last forward used, the host rows, counters, caches and "
    "outputs equal the oracle's",
    lambda c: check_matches_reference(c.after, c.reference, c.op_index, c.kind, c.config),
    at_startup=True))
