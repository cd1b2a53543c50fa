"""Structural invariants: the layout of block-table rows and graph buffers.

``VACATED_ROWS_ZERO`` (V1 persistent batch, ``BlockTable.move_row`` /
``clear_row`` in ``vllm/v1/worker/block_table.py``), ``DUMMY_TABLES_ZERO`` (V2
``get_dummy_block_tables`` in ``vllm/v1/worker/gpu/block_table.py``; V1 the rows
``_dummy_run`` commits before building metadata),
``PADDED_ROWS_NEUTRAL`` (the per-row metadata of rows padded for a graph) and
``GRAPH_ADDRESSES_STABLE`` (CUDA graphs read persistent buffers by address).
"""

from __future__ import annotations

import numpy as np

from harness.core.invariants import Invariant, Violation, register
from harness.core.observation import Observation
from reference import RunnerConfig


def check_vacated_rows_zero(obs: Observation, op_index: int, op: str,
                            config: RunnerConfig) -> list[Violation]:
    """V1 only: V2 rows are by state index and a free index is overwritten on reuse.
    An empty row holds the group's empty entry (``config.empty_entry``: zero,
    the null block; ``PAD_SLOT_ID`` where block 0 is an ordinary block)."""
    out = []
    if obs.runner != "v1":
        return out
    empty_rows = (obs.host_req_ids == -1).nonzero()[0]
    if not empty_rows.size:
        return out  # every row holds a request
    # (take and count_nonzero: a boolean mask and ndarray.any cost more on rows this small)
    nonzero, entries, counts = np.count_nonzero, config.empty_entries, obs.host_num_blocks_per_row
    for g, table in enumerate(obs.host_block_table):
        if nonzero(table.take(empty_rows, 0) != entries[g]) or nonzero(counts[g].take(empty_rows)):
            break
    else:
        return out  # every empty row is clean (the usual case): no per-row walk
    for row in empty_rows:
        for g, table in enumerate(obs.host_block_table):
            empty = config.empty_entry(g)
            if (table[row] != empty).any() or obs.host_num_blocks_per_row[g][row]:
                ids = [int(x) for x in table[row] if x != empty]
                out.append(Violation("VACATED_ROWS_ZERO", op_index, op,
                                     f"row {row} holds no request but keeps block ids {ids} "
                                     f"(num_blocks={int(obs.host_num_blocks_per_row[g][row])})",
                                     group=g, block=ids[0] if ids else None, row=int(row)))
    return out


def check_dummy_tables_zero(obs: Observation, op_index: int, op: str,
                            config: RunnerConfig) -> list[Violation]:
    """The tables a dummy run's metadata build and kernels were handed are zero and
    views of the persistent tables (V1: the committed rows; V2: the input tables)."""
    out = []
    for g, (zero, same_ptr) in enumerate(obs.dummy_tables or []):
        if not zero:
            rows = obs.last_forward.num_reqs_padded
            ids = sorted({int(x) for x in obs.device_block_table[g][:rows].ravel()
                          if x != config.empty_entry(g)})
            out.append(Violation("DUMMY_TABLES_ZERO", op_index, op,
                                 f"dummy block table rows [0, {rows}) hold block ids {ids} "
                                 "left by the previous batch", group=g,
                                 block=ids[0] if ids else None))
        if not same_ptr:
            out.append(Violation("DUMMY_TABLES_ZERO", op_index, op,
                                 "dummy block tables are not views of the persistent input "
                                 "tables (a CUDA graph would read the old storage)", group=g))
    return out


def check_padded_rows_neutral(obs: Observation, op_index: int, op: str,
                              config: RunnerConfig) -> list[Violation]:
    """Rows the last forward padded (``[num_reqs, num_reqs_padded)``) feed its
    kernels nothing: query length 0 or 1 (vLLM pads 0-token queries, the model
    one padding token), ``seq_len`` 0, no initial state, no
    prefill, the null block as Mamba state index (vLLM: ``_build_attention_metadata``
    clears ``is_prefilling`` and the block-table rows of padding, ``_prepare_inputs``
    pads ``query_start_loc`` and zero-fills ``seq_lens``).  The Mamba state
    index is neutral when it is ``PAD_SLOT_ID`` under a ``mamba_padding`` that
    pads with it, or the group's null block where it has one."""
    out = _padded_draft_rows(obs, op_index, op)
    lf, md = obs.last_forward, obs.metadata
    if lf is None or md is None or lf.num_reqs_padded <= lf.num_reqs:
        return out
    qsl = md["query_start_loc"]
    for row in range(lf.num_reqs, lf.num_reqs_padded):
        bad = []
        if int(qsl[row + 1]) - int(qsl[row]) not in (0, 1):  # vLLM pads 0, the model 1
            bad.append(f"query length {int(qsl[row + 1]) - int(qsl[row])}")
        if md["seq_lens"][row] != 0:
            bad.append(f"seq_len {int(md['seq_lens'][row])}")
        if md["has_initial_state"][row]:
            bad.append("has_initial_state")
        if md["is_prefilling"][row]:
            bad.append("is_prefilling")
        for g, indices in obs.state_indices.items():
            neutral = {config.mamba_pad_index} | ({0} if config.has_null_block(g) else set())
            if lf.cudagraph_mode == "FULL" and int(indices[row]) not in neutral:
                bad.append(f"Mamba state index {int(indices[row])} (group {g})")
        if bad:
            out.append(Violation("PADDED_ROWS_NEUTRAL", op_index, op,
                                 f"row {row}, padded for a {lf.cudagraph_mode} "
                                 f"{'dummy run' if lf.dummy else 'step'} of {lf.num_reqs} "
                                 f"request(s), feeds its kernels {', '.join(bad)}", row=row))
    return out


def _padded_draft_rows(obs: Observation, op_index: int, op: str) -> list[Violation]:
    """The drafter's single-token pass of the last forward, over rows padded for
    its FULL graph: their slots are ``PAD_SLOT_ID`` (vLLM's EAGLE step kernel
    writes the padding slot for threads past the batch)."""
    if not obs.draft_rows:
        return []
    real, rows = obs.draft_rows
    slots = obs.draft_slot_mapping[real:rows]
    bad = np.flatnonzero(slots != -1)
    if not bad.size:
        return []
    row = real + int(bad[0])
    return [Violation("PADDED_ROWS_NEUTRAL", op_index, op,
                      f"drafter row {row}, padded for its FULL graph over {real} request(s), "
                      f"has slot {int(obs.draft_slot_mapping[row])}, not PAD_SLOT_ID", row=row)]


def check_graph_addresses(obs: Observation, op_index: int, op: str) -> list[Violation]:
    """Every buffer a captured graph's launches read is the one the runner stages into."""
    out = []
    for size, ptrs in (obs.graph_ptrs or {}).items():
        for name, (captured, current) in ptrs.items():
            if captured != current:
                out.append(Violation("GRAPH_ADDRESSES_STABLE", op_index, op,
                                     f"graph {size} reads {name} from the storage it "
                                     "captured; the runner now stages it into another tensor, "
                                     "so replays read values no later step writes"))
    return out


register(Invariant(
    "VACATED_ROWS_ZERO", "V1: rows holding no request are all zero with num_blocks == 0",
    lambda c: check_vacated_rows_zero(c.after, c.op_index, c.kind, c.config),
    structural=True))
register(Invariant(
    "DUMMY_TABLES_ZERO", "the block tables a dummy run's metadata build and kernels read are "
    "zero views of the persistent tables (V1: committed rows; V2: input tables)",
    lambda c: check_dummy_tables_zero(c.after, c.op_index, c.kind, c.config), structural=True,
    applies=lambda spec: spec.forward == "dummy", applies_text="dummy runs"))
register(Invariant(
    "PADDED_ROWS_NEUTRAL", "rows padded for a graph feed the kernels neutral per-row inputs: "
    "query length 0 or 1, seq_len 0, no initial state, no prefill, the null Mamba state "
    "(or PAD_SLOT_ID: mamba_padding)",
    lambda c: check_padded_rows_neutral(c.after, c.op_index, c.kind, c.config),
    structural=True,
    applies=lambda spec: spec.forward is not None, applies_text="steps and dummy runs"))
LANDS_RESULTS = ("step", "spec_step", "step_complete")


def _counts_by_request(obs) -> dict:
    return {int(r): int(a) for r, a in zip(obs.host_req_ids, obs.row_accepted) if r >= 0}


def check_row_results(ctx) -> list[Violation]:
    """V1 with a drafter, after an op that lands a step's results (``step``,
    ``spec_step``, ``step_complete``): the row of each request whose results
    landed, and the row of any request whose count this op changed, holds that
    request's count — the reference's, whichever row the reference keeps it in.
    (What a row holds when its request re-enters the batch is the engine's
    policy: judged by its effect, the state column read.)"""
    after, ref = ctx.after, ctx.reference
    if after.row_accepted is None or ref.row_accepted is None or ctx.before is None \
            or ctx.before.row_accepted is None or not ctx.config.num_speculative_tokens \
            or after.runner != "v1" or ctx.kind not in LANDS_RESULTS:
        return []
    landed = (ctx.ledger.last_completed if ctx.kind == "step_complete"
              else [item[0] for item in ctx.op["scheduled"]])
    before, now = _counts_by_request(ctx.before), _counts_by_request(after)
    judged = set(landed) | {r for r, a in now.items() if r in before and before[r] != a}
    want = _counts_by_request(ref)
    for row, (req, got) in enumerate(zip(after.host_req_ids, after.row_accepted)):
        req = int(req)
        if req in judged and req in want and int(got) != want[req]:
            return [ctx.violation("ROW_RESULTS_FOLLOW_REQUESTS", f"row {row} holds request "
                                  f"{req} with an accepted count of {int(got)}; its last "
                                  f"completed step accepted {want[req]}", row=row)]
    return []


register(Invariant(
    "ROW_RESULTS_FOLLOW_REQUESTS", "V1 with a drafter: after a step's results land, the rows "
    "they reached hold their own requests' accepted counts (results follow requests, not "
    "rows)",
    check_row_results, structural=True))
register(Invariant(
    "GRAPH_ADDRESSES_STABLE", "every buffer a captured graph reads keeps its data_ptr",
    lambda c: check_graph_addresses(c.after, c.op_index, c.kind), at_startup=True))
