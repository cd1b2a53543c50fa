"""What a target shows the harness after every op: :class:`Observation`.

Invariants are pure functions of observations (plus the ledger, the op and
its write permit), so this type is the whole contract between a target and
the checks.  Every field is a NumPy copy; ``None`` where a target has no such
buffer (the reference has no CUDA graphs).  The one exception: the session's
own oracle observation holds the oracle's arrays (valid until its next op,
read only by that op's checks) — checks never write into an observation.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from reference import ForwardInfo

ROWS_BY_BATCH_ROW = "batch_row"  # V1: the persistent batch, one row per batch slot
ROWS_BY_STATE_INDEX = "state_index"  # V2: staged tables, one row per request state index
# An engine's own model runner (the vllm target's runner mode): rows where the
# engine's persistent batch put them, from scheduler outputs, not op by op.
ROWS_BY_ENGINE = "engine_row"


@dataclass
class Observation:
    """A target's observable state after an op (NumPy copies).

    Host rows (``host_*``), indexed as ``rows_indexed_by`` says — V1: persistent
    batch rows; V2: staged block tables by request state index:

    - ``host_block_table[g]`` int32 (max_num_reqs, width_g): block ids per row
      (kernel block ids where a group splits blocks);
    - ``host_num_blocks_per_row[g]`` int32 (max_num_reqs,): a row's block count
      (not the pool size, which is ``config.num_blocks``);
    - ``host_req_ids`` int64 (max_num_reqs,): request in each row, -1 for none;
    - ``num_computed_tokens`` / ``num_prompt_tokens`` int32 (max_num_reqs,).

    What kernels read and wrote:

    - ``device_block_table[g]`` int32 (max_num_reqs, width_g): the batch-ordered
      table the last forward's kernels read (V1: committed rows; V2: input block
      tables);
    - ``kv_cache[g]`` float32 (num_blocks, block_size, head_size) per attention
      group — with ``kv_cache_dtype`` ``int8`` the dequantized cache (payload x
      scale + zero point), and ``kv_params[g]`` float32 (num_blocks,
      block_size, 2) the parameter buffer itself (scale, zero point per slot;
      None unquantized); ``mamba_state[g]`` float32 (num_blocks, head_size) per Mamba group;
    - ``slot_mapping[g]`` int64 (max_num_batched_tokens,): the slot buffer the
      group's KV write reads (the generic slot mapping, or the backend's own
      where ``GroupSpec.slot_buffer``); ``attn_out[g]``
      float32 (max_num_reqs, head_size);
    - ``state_indices[g]`` int32 (max_num_reqs,): the state index each row of
      the last forward's Mamba kernel read (rows :func:`rows_read`; 0 past
      them) — the persistent decode buffer for a FULL replay, the builder's
      fresh indices otherwise;
    - ``metadata``: the per-row attention metadata of the last forward, host
      copies — ``query_start_loc`` int32 (max_num_reqs + 1,), ``seq_lens``,
      ``has_initial_state`` int32 (max_num_reqs,), ``is_prefilling`` bool
      (max_num_reqs,); rows [0, num_reqs_padded) are the last forward's;
    - ``last_forward``: :class:`reference.ForwardInfo` of the last step or dummy
      run (None before the first);
    - ``graph_ptrs``: {capture size: {buffer: (data_ptr its recorded launches
      read, data_ptr the runner stages into now)}}, None without graphs;
    - ``dummy_tables``: per group, (rows the last dummy run's kernels read are
      all zero, they are views of the persistent input tables) — V2 only;
    - ``draft_kv_cache[g]`` float32 (num_blocks, block_size, head_size): the
      drafter's layer's KV cache (speculative decoding), keyed by the attention
      group whose block table the drafter shares; empty without a drafter;
    - ``draft_slot_mapping`` int64 (max_num_batched_tokens,) and ``draft_rows``
      (real rows, rows run): the drafter's single-token slot buffer and the rows
      its last pass in the last forward ran over (padded for its FULL graph);
      None when the last forward ran no such pass;
    - ``pool``: allocator ``engine`` only — the target's KV-cache manager's own
      view of each group's pool, ``{g: {"ref_count": int64 (num_blocks,),
      "num_free": int}}``; None otherwise;
    - ``row_accepted`` int32 (max_num_reqs,): V1 only — the host row buffer of
      each persistent row's last accepted count (vLLM's
      ``num_accepted_tokens_cpu``), meaningful for occupied rows; None
      elsewhere;
    - ``kv_store``: the external KV store the connector saved to
      (``kv_store_complete``): {prefix token ids (tuple): {attention group:
      float32 (positions on this rank, head_size)}}; None where the target has
      no store;
    - ``host_tier``: the host tier's blocks (``host_blocks`` > 0): {(attention
      group, block hash: the token ids up to the block's end): float32
      (block_size, head_size) once its offload completed, None while it is in
      flight}; None without a host tier;
    - ``device_row_counts[g]`` (reference V2 only): entries of each input-table
      row the last gather defined; past them a row holds whatever the engine
      left, and is compared up to there only.
    """

    runner: str
    rows_indexed_by: str
    host_block_table: list
    host_num_blocks_per_row: list
    host_req_ids: np.ndarray
    num_computed_tokens: np.ndarray
    num_prompt_tokens: np.ndarray
    device_block_table: list
    kv_cache: dict
    mamba_state: dict
    slot_mapping: dict
    state_indices: dict
    attn_out: dict
    last_forward: ForwardInfo | None
    graph_ptrs: dict | None = None
    dummy_tables: list | None = None
    device_row_counts: list | None = None
    metadata: dict | None = None
    draft_kv_cache: dict | None = None
    draft_slot_mapping: np.ndarray | None = None
    draft_rows: tuple | None = None
    pool: dict | None = None
    kv_params: dict | None = None
    row_accepted: np.ndarray | None = None
    kv_store: dict | None = None
    host_tier: dict | None = None

    def caches(self) -> list[tuple[str, int, np.ndarray, bool]]:
        """Every cache a kernel writes, as (name, group, array, is_mamba): the
        attention KV caches, the Mamba states, the draft layer's KV caches
        (listed once per observation: several checks ask)."""
        out = self.__dict__.get("_caches")
        if out is not None:
            return out
        out = [(f"kv_cache[{g}]", g, v, False) for g, v in sorted(self.kv_cache.items())]
        out += [(f"mamba_state[{g}]", g, v, True) for g, v in sorted(self.mamba_state.items())]
        out += [(f"draft_kv_cache[{g}]", g, v, False)
                for g, v in sorted((self.draft_kv_cache or {}).items())]
        self.__dict__["_caches"] = out
        return out

    def batch_req_ids(self) -> tuple:
        """Request of each real batch row of the last forward (empty for a dummy run)."""
        return () if self.last_forward is None else tuple(self.last_forward.req_ids)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit for bit equal: shape, dtype and bytes (then equal NaN-aware too, at a
    fraction of ``np.array_equal``'s cost: the usual case of a check)."""
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def rows_indexed_by(runner: str) -> str:
    """How host rows are indexed for ``runner`` (``v1`` / ``v2``)."""
    return ROWS_BY_STATE_INDEX if runner == "v2" else ROWS_BY_BATCH_ROW


def rows_read(last_forward: ForwardInfo | None) -> int:
    """Batch rows the last forward's kernels ran over: the padded rows of a FULL
    replay, the real rows otherwise (0 before any forward)."""
    if last_forward is None or not last_forward.metadata:
        return 0  # no forward yet, or one without metadata: no Mamba kernel ran
    return last_forward.num_reqs_padded if last_forward.cudagraph_mode == "FULL" \
        else last_forward.num_reqs


def read_rows_only(values: np.ndarray, last_forward: ForwardInfo | None) -> np.ndarray:
    """``values`` (a per-row buffer) with the rows the last forward did not read zeroed."""
    out = np.zeros_like(values)
    n = rows_read(last_forward)
    out[:n] = values[:n]
    return out


@dataclass
class TokenSlotObservation:
    """A token-slot engine's observable state after an op (SGLang's shape; NumPy
    copies, or plain Python values).

    - ``rows``: ``{req: request row}`` of the live requests (row 0 is the padding row);
    - ``kv_len``: ``{req: positions whose KV is committed}``;
    - ``req_to_token``: int32 ``[max_num_reqs + 1, max_context_len]``, the slot
      of each (row, position);
    - ``kv``: float32 ``[num_slots + page_size]``, one value per KV slot (slot 0
      the reserved one; NaN where a padded row wrote garbage);
    - ``free_pages``: sorted int64, the allocator's free pages (slots when
      ``page_size`` is 1), page 0 never among them;
    - ``tree``: ``[(tokens, slots, lock_ref)]``, one entry per radix-tree node
      below the root: the token ids and KV slots of the path from the root
      to it (tuples of int), and its lock count;
    - ``padding``: the decode graph's input buffers after its last fill
      (``{"req_pool_indices", "out_cache_loc", "seq_lens"}`` int64 arrays,
      ``"raw_bs"``, ``"padded_bs"``), None before any padded forward;
    - ``written``: the slots the last op's forward wrote (int64, in write
      order; padded rows included), None when it ran none;
    - ``reads``: the last op's decode attention reads, one
      ``(req, row, seq_len, values)`` per real row — the row and length the
      forward ran with (the captured buffers on a graph replay) and the KV it
      gathered through that row of ``req_to_token`` (float32 ``[seq_len]``);
      None when the op ran no decode;
    - a hybrid model's Mamba pool (``mamba_slots`` > 0; else empty / None):
      ``state_slots`` ``{req: state slot}`` (its row's entry in
      ``req_index_to_mamba_index_mapping``, what the kernels read);
      ``state``: float32 ``[mamba_slots + 1]``, the SSM state each slot holds
      (slot 0 the reserved one); ``conv``: float32 ``[mamba_slots + 1, w]``,
      each slot's conv window (the target's model writes the state's value
      into every position of it); ``state_free``: sorted int64, the Mamba
      allocator's free slots; ``state_tree``: ``[(tokens, slot, lock_ref)]``,
      one entry per radix-tree node holding a Mamba state (the state after
      its path); ``state_written``: the slots the last op's Mamba update wrote
      (int64; None when it ran none); the padded replay's state indices are
      ``padding["state_indices"]``.
    The reference's own observation is the oracle itself
    (:class:`reference.token_slots.TokenSlotReference`).
    """

    rows: dict
    kv_len: dict
    req_to_token: np.ndarray
    kv: np.ndarray
    free_pages: np.ndarray
    tree: list
    padding: dict | None = None
    written: np.ndarray | None = None
    reads: list | None = None
    state_slots: dict = field(default_factory=dict)
    state: np.ndarray | None = None
    conv: np.ndarray | None = None
    state_free: np.ndarray | None = None
    state_tree: list = field(default_factory=list)
    state_written: np.ndarray | None = None
