"""Invariants: pure functions of observations, the ledger and the op.

Ids and meaning are fixed (README.md, "Invariants"; the project design contract).  Every check returns a list
of :class:`Violation` naming the invariant, the op index, and where (group,
block, row).  ``NO_STALE_WRITE`` diffs the caches before and after the op
against the ownership ledger: it never asks a kernel what it wrote.

Checks run in :data:`ORDER`; the first violation of an op is its verdict.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from reference import NULL_BLOCK_ID, Ledger, RunnerConfig, payload, payload_sum
from reference.dcp import global_position, local_slots
from reference.ledger import FREE, RESERVED

from harness.core.observation import Observation

ORDER = ("VACATED_ROWS_ZERO", "DUMMY_TABLES_ZERO", "GRAPH_ADDRESSES_STABLE", "NULL_BLOCK_FINITE",
         "NO_STALE_WRITE", "LOADED_BLOCKS_INTACT", "NO_FOREIGN_READ", "ATTENTION_FINITE",
         "MATCHES_REFERENCE")
# Not an invariant: the implementation raised while applying a legal op.
IMPL_CRASH = "IMPL_CRASH"


@dataclass(frozen=True)
class Violation:
    """One broken invariant. group/block/row are None where they do not apply."""

    invariant: str
    op_index: int
    op: str
    detail: str
    group: int | None = None
    block: int | None = None
    row: int | None = None

    def line(self) -> str:
        where = ", ".join(f"{k} {v}" for k, v in (("group", self.group), ("block", self.block),
                                                   ("row", self.row)) if v is not None)
        return (f"{self.invariant} at op {self.op_index} ({self.op})"
                + (f" [{where}]" if where else "") + f": {self.detail}")

    def to_json(self) -> dict:
        return {"invariant": self.invariant, "op_index": self.op_index, "op": self.op,
                "detail": self.detail, "group": self.group, "block": self.block, "row": self.row}


@dataclass(frozen=True)
class WritePermit:
    """Which cache cells an op may change, decided from the ledger *before* the op.

    cells[g]: {block: (first_offset, end_offset)} for attention groups (offsets
    within the block), {block: None} (any cell) for mamba groups; mamba null
    blocks are always allowed (scratch).  owners[g]: the ledger's owner array
    before the op, for messages.
    """

    cells: dict
    owners: list
    runs: frozenset = frozenset()  # requests the op writes for (a step's scheduled ones)

    def describe(self, group: int, block: int) -> str:
        o = int(self.owners[group][block])
        return {FREE: "a free block", RESERVED: "the null block"}.get(o, f"owned by req {o}")


def owner_text(ledger: Ledger, group: int, block: int) -> str:
    return WritePermit({}, ledger.owner).describe(group, block)


def permit_for(config: RunnerConfig, ledger: Ledger, op: dict) -> WritePermit:
    """Cells ``op`` may write, from the ledger state before it runs."""
    cells = {g: {} for g in range(len(config.groups))}
    kind = op["op"]
    if kind == "step":
        for req, n in op["scheduled"]:
            r = ledger.requests[req]
            pos = np.arange(r.num_computed_tokens, r.num_computed_tokens + n)
            for g in config.attention_groups:
                local, col, off = local_slots(pos, config.groups[g].block_size,
                                              config.dcp_world_size, config.dcp_rank,
                                              config.cp_kv_cache_interleave_size)
                for c in sorted(set(col[local].tolist())):
                    offs = off[local & (col == c)]
                    cells[g][r.blocks[g][c]] = (int(offs.min()), int(offs.max()) + 1)
            for g in config.mamba_groups:
                cells[g][r.blocks[g][0]] = None
    elif kind in ("kv_load", "remove"):
        for g, ids in enumerate(ledger.requests[op["req"]].blocks):
            for b in ids:
                cells[g][b] = None
    runs = frozenset(req for req, _ in op["scheduled"]) if kind == "step" else frozenset(
        [op["req"]] if kind in ("kv_load", "remove") else [])
    return WritePermit(cells, [o.copy() for o in ledger.owner], runs)


def _changed(before: np.ndarray, after: np.ndarray) -> np.ndarray:
    """NaN-aware per-cell change mask over all but the last axis."""
    same = (before == after) | (np.isnan(before) & np.isnan(after))
    return ~same.all(axis=-1)


def _fmt(values: np.ndarray) -> str:
    if np.isnan(values).any():
        return "NaN"
    return "[" + ", ".join(f"{v:g}" for v in values.tolist()) + "]"


def _item(value):
    return np.asarray(value).tolist()


def check_vacated_rows_zero(obs: Observation, op_index: int, op: str) -> list[Violation]:
    """V1 only: V2 rows are by state index and a free index is overwritten on reuse."""
    out = []
    if obs.runner != "v1":
        return out
    for row in np.flatnonzero(obs.host_req_ids == -1):
        for g, table in enumerate(obs.host_block_table):
            if table[row].any() or obs.host_num_blocks_per_row[g][row]:
                ids = [int(x) for x in table[row] if x]
                out.append(Violation("VACATED_ROWS_ZERO", op_index, op,
                                     f"row {row} holds no request but keeps block ids {ids} "
                                     f"(num_blocks={int(obs.host_num_blocks_per_row[g][row])})",
                                     group=g, block=ids[0] if ids else None, row=int(row)))
    return out


def check_dummy_tables_zero(obs: Observation, op_index: int, op: str) -> list[Violation]:
    """V2: the tables a dummy run was handed are zero and views of the input tables."""
    out = []
    for g, (zero, same_ptr) in enumerate(obs.dummy_tables or []):
        if not zero:
            rows = obs.last_forward.num_reqs_padded
            ids = sorted({int(x) for x in obs.device_block_table[g][:rows].ravel() if x})
            out.append(Violation("DUMMY_TABLES_ZERO", op_index, op,
                                 f"dummy block table rows [0, {rows}) hold block ids {ids} "
                                 "left by the previous batch", group=g,
                                 block=ids[0] if ids else None))
        if not same_ptr:
            out.append(Violation("DUMMY_TABLES_ZERO", op_index, op,
                                 "dummy block tables are not views of the persistent input "
                                 "tables (a CUDA graph would read the old storage)", group=g))
    return out


def check_graph_addresses(obs: Observation, op_index: int, op: str) -> list[Violation]:
    out = []
    for size, ptrs in (obs.graph_ptrs or {}).items():
        for name, (captured, current) in ptrs.items():
            if captured != current:
                out.append(Violation("GRAPH_ADDRESSES_STABLE", op_index, op,
                                     f"graph {size} captured {name} at {captured:#x}, "
                                     f"the runner now uses {current:#x}"))
    return out


def check_null_block_finite(obs: Observation, op_index: int, op: str) -> list[Violation]:
    out = []
    for g, kv in obs.kv_cache.items():
        bad = ~np.isfinite(kv[NULL_BLOCK_ID])
        if bad.any():
            offs = sorted({int(o) for o in np.argwhere(bad)[:, 0]})
            out.append(Violation("NULL_BLOCK_FINITE", op_index, op,
                                 f"null block holds NaN/Inf at offsets {offs}",
                                 group=g, block=NULL_BLOCK_ID))
    return out


def check_no_stale_write(before: Observation, after: Observation, permit: WritePermit,
                         op_index: int, op: str) -> list[Violation]:
    out = []
    for g, (b_cache, a_cache) in sorted({**{g: (before.kv_cache[g], after.kv_cache[g])
                                            for g in after.kv_cache},
                                         **{g: (before.mamba_state[g], after.mamba_state[g])
                                            for g in after.mamba_state}}.items()):
        mamba = g in after.mamba_state
        changed = _changed(b_cache, a_cache)
        for cell in np.argwhere(changed):
            block = int(cell[0])
            if mamba and block == NULL_BLOCK_ID:
                continue
            allowed = permit.cells[g].get(block, False)
            if allowed is None:
                continue
            if allowed is not False and allowed[0] <= int(cell[1]) < allowed[1]:
                continue
            where = f"offset {int(cell[1])} " if not mamba else "state "
            value = _fmt(a_cache[tuple(cell)])
            owner = int(permit.owners[g][block])
            why = (f"the op writes offsets [{allowed[0]}, {allowed[1]}) of it only"
                   if allowed is not False else
                   f"req {owner} runs in this op but writes nothing there"
                   if owner >= 0 and owner in permit.runs else "no row of this op owns it")
            out.append(Violation("NO_STALE_WRITE", op_index, op,
                                 f"{where}of block {block} ({permit.describe(g, block)}) "
                                 f"changed to {value}; {why}", group=g, block=block))
            break
    return out


def check_loaded_blocks(config: RunnerConfig, ledger: Ledger, obs: Observation,
                        op_index: int, op: str) -> list[Violation]:
    out = []
    for req in ledger.live():
        r = ledger.requests[req]
        if not r.loaded:
            continue
        for g in config.attention_groups:
            local, col, off = local_slots(np.arange(r.prompt_len), config.groups[g].block_size,
                                          config.dcp_world_size, config.dcp_rank,
                                          config.cp_kv_cache_interleave_size)
            pos = np.flatnonzero(local)  # this rank's share of the prompt
            want = payload(req, pos, config.head_size)
            blocks = np.asarray(r.blocks[g])[col[local]]
            got = obs.kv_cache[g][blocks, off[local]]
            bad = np.flatnonzero(~(got == want).all(axis=1))
            if bad.size:
                p = int(bad[0])
                out.append(Violation("LOADED_BLOCKS_INTACT", op_index, op,
                                     f"req {req}'s loaded KV at position {int(pos[p])} is "
                                     f"{_fmt(got[p])}, loaded {_fmt(want[p])}",
                                     group=g, block=int(blocks[p])))
        for g in config.mamba_groups:
            b = r.blocks[g][0]
            want_state = payload_sum(req, 0, r.prompt_len, config.head_size)
            if not (obs.mamba_state[g][b] == want_state).all():
                out.append(Violation("LOADED_BLOCKS_INTACT", op_index, op,
                                     f"req {req}'s loaded state is "
                                     f"{_fmt(obs.mamba_state[g][b])}", group=g, block=b))
    return out


def oracle_read(config: RunnerConfig, blocks: list[int], seq_len: int, kv: np.ndarray,
                group: int) -> np.ndarray:
    """The read a request should see: its own blocks (this rank's DCP share of each),
    null block past them."""
    bs = config.groups[group].block_size
    row = np.zeros(config.max_num_blocks_per_req, np.int64)
    row[:len(blocks)] = blocks
    j = np.arange(row.size * bs)
    held = global_position(j // bs, j % bs, bs, config.dcp_world_size, config.dcp_rank,
                           config.cp_kv_cache_interleave_size)
    w = (held < seq_len).astype(np.float32)
    return (w[:, None] * kv[row[j // bs], j % bs]).sum(axis=0, dtype=np.float32)


def check_reads(config: RunnerConfig, ledger: Ledger, obs: Observation,
                op_index: int, op: str, batch_reqs: list[int] | None = None) -> list[Violation]:
    """NO_FOREIGN_READ then ATTENTION_FINITE over the real rows of the last step.

    batch_reqs: the request of each batch row (V2: the step's scheduling order);
    V1 batch rows are the persistent rows, read from the observation.
    """
    if obs.last_forward is None or obs.last_forward.dummy or op != "step":
        return []
    num_reqs = obs.last_forward.num_reqs
    if batch_reqs is None:
        batch_reqs = [int(obs.host_req_ids[row]) for row in range(num_reqs)]
    foreign, nonfinite = [], []
    for row in range(num_reqs):
        req = batch_reqs[row]
        r = ledger.requests.get(req)
        for g in config.attention_groups:
            got = obs.attn_out[g][row]
            if r is not None:
                want = oracle_read(config, r.blocks[g], r.num_computed_tokens,
                                   obs.kv_cache[g], g)
                if not np.array_equal(got, want, equal_nan=True):
                    table = obs.device_block_table[g][row]
                    k = config.groups[g].block_size // config.groups[g].kernel_block_size
                    own = [b * k + j for b in r.blocks[g] for j in range(k)]
                    own += [0] * (table.size - len(own))
                    cols = [c for c in range(table.size) if int(table[c]) != own[c]]
                    blk = int(table[cols[0]]) if cols else None
                    foreign.append(Violation(
                        "NO_FOREIGN_READ", op_index, op,
                        f"req {req}'s attention read {_fmt(got)}, its own blocks give "
                        f"{_fmt(want)}" + (f"; block-table column {cols[0]} points at kernel "
                                           f"block {blk} (allocation block {blk // k}, "
                                           f"{owner_text(ledger, g, blk // k)})"
                                           if cols else ""),
                        group=g, block=blk, row=row))
            if not np.isfinite(got).all():
                nonfinite.append(Violation("ATTENTION_FINITE", op_index, op,
                                           f"req {req}'s attention output is {_fmt(got)}",
                                           group=g, row=row))
    return foreign + nonfinite


def _live_part(obs: Observation) -> tuple[list, list]:
    """V2 staged rows as the contract defines them: a live state index's first
    ``num_blocks`` entries (a free index is overwritten on reuse, and nothing
    reads past a row's count), zero elsewhere.  V1 rows are returned whole:
    a vacated V1 row must be zero everywhere."""
    if obs.runner != "v2":
        return obs.host_block_table, obs.host_num_blocks_per_row
    live = obs.host_req_ids != -1
    tables, counts = [], []
    for table, n in zip(obs.host_block_table, obs.host_num_blocks_per_row):
        n = np.where(live, n, 0).astype(n.dtype)
        cols = np.arange(table.shape[1])[None, :]
        tables.append(np.where(cols < n[:, None], table, 0).astype(table.dtype))
        counts.append(n)
    return tables, counts


def _defined(impl_table: np.ndarray, ref_table: np.ndarray, rows: int, counts, g: int):
    """Device rows [0, rows), each cut to the entries the last gather defined (V2: a
    real row's ``num_blocks``; past it vLLM 0.33 zeroes what 0.26 leaves stale)."""
    a, b = impl_table[:rows].copy(), ref_table[:rows].copy()
    if counts is not None and a.shape == b.shape:
        past = np.arange(a.shape[1])[None, :] >= counts[g][:rows, None]
        a[past] = b[past] = 0
    return a, b


def check_matches_reference(impl: Observation, ref: Observation, op_index: int,
                            op: str) -> list[Violation]:
    """Compare what the last forward used: host rows (V2: their live part), the
    device block-table rows it read ([0, num_reqs_padded)), slot mappings
    ([0, num_tokens_padded)), counters, caches, outputs.  Buffer regions no
    forward reads are the engine's business (vLLM PAD-fills slot mappings to the
    end of the buffer; 0.33 zeroes device rows left by a larger batch)."""
    lf = ref.last_forward
    rows_used, tokens_used = (lf.num_reqs_padded, lf.num_tokens_padded) if lf else (0, 0)
    impl_rows, impl_counts = _live_part(impl)
    ref_rows, ref_counts = _live_part(ref)
    pairs = [("req_ids", impl.host_req_ids, ref.host_req_ids),
             ("num_computed_tokens", impl.num_computed_tokens, ref.num_computed_tokens),
             ("num_prompt_tokens", impl.num_prompt_tokens, ref.num_prompt_tokens),
             ("last_forward", _forward_fields(impl.last_forward), _forward_fields(ref.last_forward))]
    for g in range(len(impl.host_block_table)):
        pairs += [(f"block_table[{g}]", impl_rows[g], ref_rows[g]),
                  (f"num_blocks_per_row[{g}]", impl_counts[g], ref_counts[g]),
                  (f"device_block_table[{g}]", *_defined(impl.device_block_table[g],
                                                         ref.device_block_table[g], rows_used,
                                                         ref.device_row_counts, g))]
    for g, v in ref.slot_mapping.items():
        pairs.append((f"slot_mapping[{g}]", impl.slot_mapping[g][:tokens_used], v[:tokens_used]))
    for name in ("state_indices", "kv_cache", "attn_out"):
        for g, v in getattr(ref, name).items():
            pairs.append((f"{name}[{g}]", getattr(impl, name)[g], v))
    for g, v in ref.mamba_state.items():  # the null block is scratch: excluded
        pairs.append((f"mamba_state[{g}] (blocks 1..)", impl.mamba_state[g][1:], v[1:]))
    for name, a, b in pairs:
        if a.shape != b.shape:
            return [Violation("MATCHES_REFERENCE", op_index, op,
                              f"{name}: shape {a.shape} vs reference {b.shape}")]
        same = (a == b) if a.dtype == object else ((a == b) | (np.isnan(a) & np.isnan(b))
                                                   if a.dtype.kind == "f" else a == b)
        if not np.all(same):
            idx = tuple(int(i) for i in np.argwhere(~np.asarray(same, bool))[0])
            return [Violation("MATCHES_REFERENCE", op_index, op,
                              f"{name}{list(idx)} is {_item(a[idx])}, reference has "
                              f"{_item(b[idx])}")]
    return []


def _forward_fields(info) -> np.ndarray:
    """A ForwardInfo as a comparable object array (empty before the first forward)."""
    if info is None:
        return np.array((), object)
    return np.array([info.dummy, info.cudagraph_mode, info.num_reqs, info.num_reqs_padded,
                     info.num_tokens, info.num_tokens_padded, tuple(info.req_ids)], object)
