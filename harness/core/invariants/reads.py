"""Read invariants: what a real step's attention read returned.

``NO_FOREIGN_READ``: each request's paged-attention output equals a read of
its own blocks (the null block, masked, past them) — a read through a stale
or foreign block id shows up as a different value, because freed blocks hold
a finite sentinel.  ``ATTENTION_FINITE``: that output is finite (the
user-visible consequence of seed 001's NaN in the null block).
"""

from __future__ import annotations

import numpy as np

from reference import Ledger, RunnerConfig
from reference.dcp import global_position

from harness.core.invariants import Invariant, Violation, register
from harness.core.invariants.writes import fmt_values, owner_text
from harness.core.observation import Observation, same_bits


def oracle_read(config: RunnerConfig, blocks: list[int], seq_len: int, kv: np.ndarray,
                group: int) -> np.ndarray:
    """The read a request should see: its own blocks (this rank's DCP share of each),
    null block past them; with a sliding window, only its last positions."""
    bs = config.groups[group].block_size
    row = np.zeros(config.blocks_per_req_max(group), np.int64)
    row[:len(blocks)] = blocks
    j = np.arange(row.size * bs)
    held = global_position(j // bs, j % bs, bs, config.dcp_world_size, config.dcp_rank,
                           config.cp_kv_cache_interleave_size)
    inside = held < seq_len
    window = config.groups[group].sliding_window
    if window:  # sliding window: the last `window` positions (freed blocks before them)
        inside &= held >= seq_len - window
    w = inside.astype(np.float32)
    return (w[:, None] * kv[row[j // bs], j % bs]).sum(axis=0, dtype=np.float32)


def check_reads(config: RunnerConfig, ledger: Ledger, obs: Observation,
                op_index: int, op: str) -> list[Violation]:
    """NO_FOREIGN_READ then ATTENTION_FINITE over the real rows of the last step
    (each row's request from ``obs.last_forward.req_ids``)."""
    return (check_foreign_reads(config, ledger, obs, op_index, op)
            + check_attention_finite(config, obs, op_index, op))


def _real_rows(config: RunnerConfig, obs: Observation):
    """(row, req, group) of each real batch row of the last forward, attention groups."""
    if obs.last_forward is None or obs.last_forward.dummy:
        return
    for row, req in enumerate(obs.batch_req_ids()):
        for g in config.attention_groups:
            yield row, req, g


def check_foreign_reads(config: RunnerConfig, ledger: Ledger, obs: Observation,
                        op_index: int, op: str) -> list[Violation]:
    out = []
    for row, req, g in _real_rows(config, obs):
        r = ledger.requests.get(req)
        if r is None:
            continue
        got = obs.attn_out[g][row]
        want = oracle_read(config, r.blocks[g], r.last_seq_len, obs.kv_cache[g], g)
        if not same_bits(got, want) and not np.array_equal(got, want, equal_nan=True):
            out.append(_foreign(config, ledger, obs, r, req, row, g, got, want, op_index, op))
    return out + check_state_reads(config, ledger, obs, op_index, op)


def check_state_reads(config: RunnerConfig, ledger: Ledger, obs: Observation,
                      op_index: int, op: str) -> list[Violation]:
    """The state each real row's Mamba kernel started from was read through one of
    its request's own state blocks or the null block — an initial state of zero
    (``obs.state_indices``: the index the kernel read; with speculative decoding,
    the running column's block).  A state lost into the null block is
    ``MATCHES_REFERENCE``'s to report."""
    out = []
    last = obs.last_forward
    if last is None or last.dummy or not last.metadata:
        return out
    for row, req in enumerate(obs.batch_req_ids()):
        r = ledger.requests.get(req)
        if r is None:
            continue
        for g in config.mamba_groups:
            b = int(obs.state_indices[g][row])
            if b != config.null_block(g) and b not in r.blocks[g]:
                out.append(Violation(
                    "NO_FOREIGN_READ", op_index, op,
                    f"req {req}'s Mamba state was read through block {b} "
                    f"({owner_text(ledger, g, b)}), not one of its own {r.blocks[g]}",
                    group=g, block=b, row=row))
    return out


def check_attention_finite(config: RunnerConfig, obs: Observation, op_index: int,
                           op: str) -> list[Violation]:
    out = []
    for row, req, g in _real_rows(config, obs):
        got = obs.attn_out[g][row]
        if not np.isfinite(got).all():
            out.append(Violation("ATTENTION_FINITE", op_index, op,
                                 f"req {req}'s attention output is {fmt_values(got)}",
                                 group=g, row=row))
    return out


def _foreign(config, ledger, obs, r, req, row, g, got, want, op_index, op) -> Violation:
    """The NO_FOREIGN_READ record, naming the first block-table column that
    points elsewhere than the request's own kernel blocks."""
    table = obs.device_block_table[g][row]
    k = config.groups[g].block_size // config.groups[g].kernel_block_size
    own = [b * k + j for b in r.blocks[g] for j in range(k)]
    own += [0] * (table.size - len(own))
    cols = [c for c in range(table.size) if int(table[c]) != own[c]]
    blk = int(table[cols[0]]) if cols else None
    return Violation(
        "NO_FOREIGN_READ", op_index, op,
        f"req {req}'s attention read {fmt_values(got)}, its own blocks give {fmt_values(want)}"
        + (f"; block-table column {cols[0]} points at kernel block {blk} (allocation block "
           f"{blk // k}, {owner_text(ledger, g, blk // k)})" if cols else ""),
        group=g, block=blk, row=row)


def _real(spec) -> bool:
    return spec.forward == "real"


register(Invariant(
    "NO_FOREIGN_READ", "each request's attention output equals a read of its own blocks "
    "(null block past them), and its Mamba state is read through one of its own state blocks",
    lambda c: check_foreign_reads(c.config, c.ledger, c.after, c.op_index, c.kind),
    applies=_real, applies_text="real steps"))
register(Invariant(
    "ATTENTION_FINITE", "each real request's attention output is finite",
    lambda c: check_attention_finite(c.config, c.after, c.op_index, c.kind),
    applies=_real, applies_text="real steps"))
