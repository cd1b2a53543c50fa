"""The oracle: a V1 model runner over a hybrid KV cache, in NumPy.

Models ``vllm/v1/worker/gpu_model_runner.py`` as far as block tables reach:
``_update_states`` (requests not scheduled leave the persistent batch but keep
their blocks; new ones enter at the lowest free row; ``condense``), padding to
CUDA-graph capture sizes, slot mapping with the ``PAD_SLOT_ID`` tail, the KV
write that skips ``PAD_SLOT_ID``, a Mamba-style state update written in place at
``block_table[row, 0]`` (rows padded for a FULL graph go to the null block), a
paged-attention read that weights masked positions by 0, and ``_dummy_run``
with a NaN payload, PAD-filled slot mappings and metadata re-staged from the
(zeroed) rows — every fix of the seed bugs applied.

Persistent buffers are modelled as buffers: what a forward does not overwrite
keeps what an earlier forward left there, exactly as on a device.  The runner
starts like an engine: one warm-up dummy run per capture size, largest first.
"""

from __future__ import annotations

import abc
import copy
from dataclasses import dataclass

import numpy as np

from .block_table import EMPTY_ROW, PersistentBatchRows
from .config import ALIGN, ALL, ALWAYS, CUDAGRAPH_MODES, FULL, NONE, PIECEWISE, RunnerConfig
from .dcp import global_position
from .ledger import Ledger, OpError
from .kv_cache_manager import choose_admit, choose_allocate, choose_skipped
from .quant import roundtrip
from .payload import (NULL_BLOCK_ID, PAD_SLOT_ID, SENTINEL, draft_payload, mamba_state_of,
                      token_payload,
                      payload)


@dataclass(frozen=True)
class ForwardInfo:
    """What the last forward was: its dispatched mode, its sizes (requests and
    tokens, before and after padding to a capture size) and the request of each
    real batch row.  Shared by every runner: the reference, gpu_impl and the
    targets' adapters report their last forward with it (vLLM has no one
    record for this; ``BatchDescriptor`` + ``num_reqs`` come closest)."""

    dummy: bool
    cudagraph_mode: str  # dispatched (after fallback)
    num_reqs: int
    num_reqs_padded: int
    num_tokens: int
    num_tokens_padded: int
    req_ids: tuple = ()  # request of each real batch row, in batch order (empty: dummy run)
    metadata: bool = True  # attention metadata was built: Mamba updates and attention ran


def is_uniform_decode(config: RunnerConfig, query_lens: list[int], starts: list[int],
                      decodes: list[bool] | None = None) -> bool:
    """Is a real batch a uniform decode (FULL-eligible)?  ``1 + k`` tokens per
    request (:attr:`RunnerConfig.uniform_query_len`; one without a drafter) —
    and, with Mamba groups, every row is a decode for the Mamba builder: prior
    state (``start > 0``) and, with a drafter, its prompt done (``decodes``).

    vLLM dispatches by shape alone, but its Mamba metadata builder keeps a
    request's first prompt chunk a prefill (no prior state for the decode
    kernel to read) — and, with speculative decoding, any prompt chunk longer
    than one token (``treat_short_extends_as_decodes=False``) — and refreshes
    the persistent decode state-index buffer a FULL graph reads only for
    all-decode batches; the model does not dispatch such a batch to a FULL
    graph (docs/model.md, "Modelling choices").
    """
    q = config.uniform_query_len
    if any(n != q for n in query_lens):
        return False
    if not config.mamba_groups:
        return True
    if not all(start > 0 for start in starts):
        return False
    return q == 1 or decodes is None or all(decodes)


def dispatch(config: RunnerConfig, num_reqs: int, num_tokens: int, uniform_decode: bool,
             requested: str, query_len: int | None = None) -> tuple[str, int, int]:
    """cudagraph dispatch: (mode, num_tokens_padded, num_reqs_padded).

    FULL needs a uniform-decode batch (``query_len`` tokens per request:
    default ``1 + num_speculative_tokens``; the drafter's single-token passes
    dispatch with 1, through a dispatcher of their own as vLLM's drafter has)
    padded to a capture size that uniform batch fills exactly, rows padded to
    ``size // query_len`` (:meth:`RunnerConfig.full_sizes`) — or, with
    ``cudagraph_support`` ``ALWAYS``, any batch within a capture size, rows
    padded to ``min(size, max_num_reqs)`` (vLLM ``CudagraphDispatcher``: a
    uniform batch falls back to the non-uniform FULL key when no uniform one
    fits).  Otherwise PIECEWISE pads tokens only; a batch larger than every
    capture size, or mode NONE, runs eager and unpadded.
    """
    if requested == NONE:
        return NONE, num_tokens, num_reqs
    padded = config.padded_num_tokens(num_tokens)
    if padded is None:
        return NONE, num_tokens, num_reqs
    if requested == FULL and padded in config.full_sizes(query_len) and (
            uniform_decode or config.cudagraph_support == ALWAYS):
        return FULL, padded, config.full_graph_rows(padded, query_len)
    return PIECEWISE, padded, num_reqs


def store_key(token_ids) -> tuple:
    """The external store's key of a prefix: its token ids (a connector keys a
    saved prefix by its tokens' hashes; the model's token ids name them)."""
    return tuple(int(t) for t in token_ids)


class ReferenceRunnerBase(abc.ABC):
    """What both runners share: request ops, buffers, kernels; one instance per replay.

    Subclasses decide how block tables reach the kernels (``_stage_tables``,
    ``_prepare_dummy``) and which rows a step uses (``_batch``).

    Public state (all NumPy, read by the harness): ``rows`` (host persistent
    batch), ``device_block_table[g]`` int32 (max_num_reqs, width_g) — the copy
    kernels read, committed per forward — ``kv_cache[g]`` float32 (num_blocks,
    block_size, head_size) for attention groups, ``mamba_state[g]`` float32
    (num_blocks, head_size) for mamba groups, persistent buffers
    ``slot_mapping[g]`` int64 (max_num_batched_tokens,) — the generic one, and
    ``backend_slot_mapping[g]`` for groups whose backend keeps its own
    (``GroupSpec.slot_buffer``; :meth:`write_slots` is what the KV write reads) —
    ``state_indices[g]``
    int32 (max_num_reqs,), ``attn_out[g]`` float32 (max_num_reqs, head_size),
    ``ledger`` and ``last_forward``.  Illegal ops raise :class:`OpError` before
    changing anything.
    """

    def _shared_state(self, g: int, a: int) -> np.ndarray:
        """kv_sharing: Mamba group ``g``'s states as a view of attention group
        ``a``'s pages (the first ``state_floats(g)`` floats of each)."""
        cfg = self.config
        return self.kv_cache[a].reshape(cfg.num_blocks, -1)[:, :cfg.state_floats(g)]

    def __deepcopy__(self, memo):
        # NumPy copies a view as an array of its own: a shared Mamba state must
        # be a view of the copy's pages again (the shrinker's replay snapshots).
        new = self.__class__.__new__(self.__class__)
        memo[id(self)] = new
        for name, value in self.__dict__.items():
            setattr(new, name, copy.deepcopy(value, memo))
        for a, m in self.config.shared_pages().items():
            new.mamba_state[m] = new._shared_state(m, a)
        return new

    def __init__(self, config: RunnerConfig):
        self.config = cfg = config
        rows, tokens, heads = cfg.max_num_reqs, cfg.max_num_batched_tokens, cfg.head_size
        self.ledger = Ledger(cfg)
        self.runner_blocks: dict[int, list[list[int]]] = {}  # ids as the runner was told
        self.rows = PersistentBatchRows(cfg)
        self.device_block_table = [np.full_like(t, e) for t, e in zip(self.rows.block_table,
                                                                       self.rows.empty)]
        self.kv_cache, self.mamba_state = {}, {}
        self._cells_of: dict[int, tuple] = {}  # group -> _cells(group)
        self.slot_mapping, self.state_indices, self.attn_out = {}, {}, {}
        self.backend_slot_mapping = {g: np.zeros(tokens, np.int64) for g in cfg.attention_groups
                                     if cfg.groups[g].slot_buffer}
        for g in cfg.attention_groups:
            bs = cfg.groups[g].block_size
            self.kv_cache[g] = np.full((cfg.num_blocks, bs, heads), SENTINEL, np.float32)
            self.kv_cache[g][NULL_BLOCK_ID] = 0.0
            self.slot_mapping[g] = np.zeros(tokens, np.int64)
            self.attn_out[g] = np.zeros((rows, heads), np.float32)
        pages = {m: a for a, m in cfg.shared_pages().items()}
        for g in cfg.mamba_groups:
            if g in pages:  # kv_sharing: the first head_size floats of each page
                self.mamba_state[g] = self._shared_state(g, pages[g])
            else:
                self.mamba_state[g] = np.full((cfg.num_blocks, cfg.state_floats(g)), SENTINEL,
                                              np.float32)
                self.mamba_state[g][NULL_BLOCK_ID] = 0.0
            self.state_indices[g] = np.zeros(rows, np.int32)
        self.hidden = np.zeros((tokens, heads), np.float32)
        self.query_start_loc = np.zeros(rows + 1, np.int32)
        self.seq_lens = np.zeros(rows, np.int32)
        self.has_initial_state = np.zeros(rows, np.int32)
        self.is_prefilling = np.zeros(rows, bool)
        # Speculative decoding: the state column each row reads (the running
        # column), whether it is a spec decode, the Mamba columns it may write,
        # each request's last accepted count, and the draft layer's KV cache.
        self.state_columns = np.zeros(rows, np.int32)
        self.spec_rows = np.zeros(rows, bool)
        # All mode: every column of a row (the kernels pick theirs by position).
        self.write_indices = {g: np.zeros((rows, cfg.blocks_per_req_max(g)
                                           if cfg.mamba_cache_mode == ALL
                                           else cfg.mamba_columns), np.int32)
                              for g in cfg.mamba_groups}
        self.num_accepted_of: dict[int, int] = {}
        self.results_in_flight: list[dict[int, int]] = []  # per step in flight, oldest first
        # The external KV store (kv_store_complete): prefix key -> {group: KV}.
        self.kv_store: dict[tuple, dict] = {}
        # The host tier's ready blocks (offload_complete): (group, block hash) ->
        # float32 (block_size, head_size).
        self.host_kv: dict[tuple, np.ndarray] = {}
        # Align mode: the column holding each request's running Mamba state
        # after its latest step (vLLM's runner-side ``mamba_state_idx``).
        self.mamba_state_idx: dict[int, int] = {}
        # The last step's Mamba state copies in align mode: (req, src column, dst
        # column, kind): "restored" (a first step from its hit's state block),
        # "carried" (across a block boundary, before the forward) or
        # "completed" (into the block accepted tokens completed, after it).
        self.mamba_copies: list[tuple[int, int, int, str]] = []
        # Which of those copies read past the running column, by the accepted-token
        # bias (coverage): "carried-with-bias", "completed-with-bias".
        self.mamba_events: list[str] = []
        self.draft_kv_cache = {}
        if cfg.draft_group is not None:
            self.draft_kv_cache[cfg.draft_group] = self.kv_cache[cfg.draft_group].copy()
        # The drafter's single-token slot buffer and the rows its last pass ran.
        self.draft_slot_mapping = np.full(tokens, PAD_SLOT_ID, np.int64)
        self.draft_rows: tuple | None = None
        for size in reversed(cfg.cudagraph_capture_sizes):  # engine start-up
            self.dummy_run(cfg.capture_rows(size), size, FULL)
        self.last_forward: ForwardInfo | None = None
        self.draft_rows = None  # start-up warm-ups run no drafter

    # -- request / row ops -------------------------------------------------
    def add(self, req: int, blocks: list[list[int]], prompt_len: int) -> None:
        self.ledger.add(req, blocks, prompt_len)
        self.runner_blocks[req] = [list(b) for b in blocks]
        self.num_accepted_of[req] = 1  # vLLM's add_request: one accepted token
        self._enter_batch(req)

    def append(self, req: int, blocks: list[list[int]]) -> None:
        self.ledger.append(req, blocks)
        for g, ids in enumerate(blocks):
            self.runner_blocks[req][g].extend(ids)
        row = self.rows.row_of(req)
        if row is not None:
            for g, ids in enumerate(blocks):
                self.rows.append_row(row, g, ids)

    def admit(self, req: int, prompt_len: int, prefix: list, num_new_tokens: int,
              choice: dict | None = None) -> dict:
        """allocator ``engine``: a new request asks the KV-cache manager for its
        prefix hit and blocks for ``num_new_tokens`` more tokens (plus the
        drafter's lookahead), then enters the batch with the hit as computed
        tokens (vLLM's ``get_computed_blocks`` + ``allocate_slots``, then
        ``NewRequestData``).  ``choice``: what the target chose —
        ``{"blocks": per group, hit blocks first, or None when refused,
        "num_cached_tokens": hit}``; None: choose (:mod:`reference.kv_cache_manager`).
        New (non-hit) blocks are poisoned: an evicted block's old content is gone.
        Returns the choice.  Raises :class:`OpError` for an illegal op."""
        tokens, _ = self.ledger.check_admit(req, prompt_len, prefix, num_new_tokens)
        if choice is None:
            blocks, hit = choose_admit(self.ledger, tokens, num_new_tokens)
            choice = {"blocks": blocks, "num_cached_tokens": hit}
        new = self.ledger.admit(req, prompt_len, tokens, choice["blocks"],
                                choice["num_cached_tokens"])
        if new is not None:
            for g, ids in enumerate(new):
                self._poison(g, ids)
            self.num_accepted_of[req] = 1
            self.runner_blocks[req] = [list(b) for b in choice["blocks"]]
            self._enter_batch(req)
        return choice

    def allocate(self, req: int, num_new_tokens: int, choice: dict | None = None) -> dict:
        """allocator ``engine``: a running request asks for blocks covering
        ``num_new_tokens`` more tokens (vLLM's ``allocate_slots`` for a running
        request, then ``CachedRequestData.new_block_ids``); first the blocks its
        sliding windows left are freed (vLLM's ``remove_skipped_blocks``: the
        scheduler's entries become the null block; the runner's row keeps the
        old ids, which no read reaches).  ``choice``: ``{"blocks": new ids per
        group, or None when refused, "freed": ids freed per group}``; None: choose.
        Returns the choice.  Raises :class:`OpError` for an illegal op."""
        self.ledger.check_allocate(req, num_new_tokens)
        if choice is None:
            freed = choose_skipped(self.ledger, req)
            for g, ids in enumerate(self.ledger.free_skipped(req, freed)):
                self._poison(g, ids)
            choice = {"blocks": choose_allocate(self.ledger, req, num_new_tokens),
                      "freed": freed}
        else:
            for g, ids in enumerate(self.ledger.free_skipped(req, choice["freed"])):
                self._poison(g, ids)
        new = self.ledger.allocate(req, choice["blocks"])
        if new is not None:
            for g, ids in enumerate(new):
                self._poison(g, ids)
            row = self.rows.row_of(req)
            for g, ids in enumerate(choice["blocks"]):
                self.runner_blocks[req][g].extend(ids)
                if row is not None:
                    self.rows.append_row(row, g, ids)
        return choice

    def remove(self, req: int) -> None:
        """Request finished: leave the batch, free (and poison) its blocks."""
        self.ledger.get(req)
        self._leave(req)
        for g, ids in enumerate(self.ledger.remove(req)):
            self._poison(g, ids)

    def preempt(self, req: int) -> None:
        """The scheduler preempts ``req`` (recompute): it leaves the batch and its
        blocks are freed (poisoned) — kept while a store still reads them."""
        self.ledger.check_preempt(req)
        self._leave(req)
        for g, ids in enumerate(self.ledger.preempt(req)):
            self._poison(g, ids)

    def resume(self, req: int, blocks: list[list[int]]) -> None:
        """A preempted request resumes on ``blocks`` (per group), its KV and state
        recomputed from position 0: to the runner, the request's blocks are
        these, its count starts over (vLLM's ``resumed_from_preemption``: the
        runner replaces the request's block ids)."""
        self.ledger.resume(req, blocks)
        self.runner_blocks[req] = [list(b) for b in blocks]
        self.num_accepted_of[req] = 1
        self._enter_batch(req)

    def _leave(self, req: int) -> None:
        """``req`` leaves the batch (its blocks are the ledger's business)."""
        row = self.rows.row_of(req)
        if row is not None:
            self.rows.clear_row(row)
        self.num_accepted_of.pop(req, None)
        self.mamba_state_idx.pop(req, None)
        self.runner_blocks.pop(req, None)

    def kv_load(self, req: int) -> None:
        """A P/D transfer fills ``req``'s prompt KV and its mamba state."""
        self.ledger.kv_load(req)
        r = self.ledger.requests[req]
        self._land(r, None)
        self._row_progress(req, r.prompt_len)

    def _land(self, r, columns: list[list[int]] | None) -> None:
        """Write ``r``'s prompt KV into its blocks at ``columns`` per group (None:
        all of them) and, where a Mamba group's column 0 is among them, the
        prompt's final state: what a connector's transfer delivers."""
        cfg = self.config
        pos = np.arange(r.prompt_len)
        for g in cfg.attention_groups:
            is_local, col, off = cfg.kept_slots(g, pos)
            if columns is not None:
                is_local &= np.isin(col, columns[g])
            blocks = np.asarray(r.blocks[g])[col[is_local]]
            self.kv_cache[g][blocks, off[is_local]] = self._stored(token_payload(
                self.ledger.token_ids(r.req, pos[is_local]), cfg.head_size))
        for g in self.config.mamba_groups:
            if columns is None or 0 in columns[g]:
                self.mamba_state[g][r.blocks[g][0]] = mamba_state_of(token_payload(
                    self.ledger.token_ids(r.req, pos), cfg.head_size), cfg.groups[g].conv_size)

    def kv_load_begin(self, req: int, handle: int, blocks: list[list[int]]) -> None:
        """A connector starts loading part of ``req``'s prompt KV into ``blocks``
        (per group); nothing lands until :meth:`kv_load_complete`."""
        self.ledger.kv_load_begin(req, handle, blocks)

    def onboard_begin(self, req: int, handle: int, blocks: list[list[int]]) -> None:
        """A connector starts loading full prompt blocks of ``req`` from the host
        tier into ``blocks`` (per attention group); the host blocks it reads are
        pinned until :meth:`onboard_complete`."""
        self.ledger.kv_load_begin(req, handle, blocks, source="host")

    def onboard_complete(self, req: int, handle: int) -> None:
        """The onboard lands: its blocks hold what the host blocks hold — the
        prompt's KV, by the host tier's provenance; as :meth:`kv_load_complete`."""
        self._load_complete(req, handle, "host")

    def kv_load_complete(self, req: int, handle: int) -> None:
        """Transfer ``handle``'s KV lands in its blocks (its request may have left:
        the blocks were kept for it); the request's prompt counts as computed
        once all of it has landed; a request that left is freed after its last
        transfer."""
        self._load_complete(req, handle, "remote")

    def _load_complete(self, req: int, handle: int, source: str) -> None:
        t = self.ledger.transfer(handle, req, "load", source)
        r = self.ledger.owner_of_transfer(t)
        self._land(r, t.columns)
        freed = self.ledger.kv_load_complete(handle)
        if r.loaded:
            self._row_progress(r.req, r.prompt_len)
        for g, ids in enumerate(freed or []):
            self._poison(g, ids)

    def kv_store_begin(self, req: int, handle: int, num_tokens: int) -> None:
        """A connector starts saving ``req``'s first ``num_tokens`` tokens' KV to the
        external store; it reads the blocks until :meth:`kv_store_complete`."""
        self.ledger.kv_store_begin(req, handle, num_tokens)

    def kv_store_complete(self, req: int, handle: int) -> None:
        """The store's copy finishes: the external store holds, under the prefix's
        token ids, that prefix's KV (this rank's positions) — what the request's
        blocks, kept for it, hold; a request that left is freed after its last
        transfer."""
        t = self.ledger.transfer(handle, req, "store", "remote")
        ids = self.ledger.token_ids(req, np.arange(t.num_tokens))
        self.kv_store[store_key(ids)] = self._prefix_kv(ids)
        for g, ids in enumerate(self.ledger.kv_store_complete(handle) or []):
            self._poison(g, ids)

    def offload_begin(self, req: int, handle: int, blocks: list[list[int]]) -> None:
        """A connector starts copying full computed blocks of ``req`` to the host
        tier, which evicts (LRU) to make room or stores nothing; the copy reads
        the blocks it stores until :meth:`offload_complete`."""
        self.ledger.offload_begin(req, handle, blocks)
        for key in self.ledger.host.last_evicted:
            self.host_kv.pop(key, None)

    def offload_complete(self, req: int, handle: int) -> None:
        """The offload's copy finishes: each host block it wrote holds its block
        hash's KV (the last block's tokens of that prefix) and is ready; a
        request that left is freed after its last transfer."""
        t = self.ledger.transfer(handle, req, "store", "host")
        for g, tokens in t.host_keys:
            bs = self.config.tokens_per_block(g)
            self.host_kv[(g, tokens)] = self._stored(token_payload(
                np.asarray(tokens[-bs:], dtype=np.int64), self.config.head_size))
        for g, ids in enumerate(self.ledger.kv_store_complete(handle) or []):
            self._poison(g, ids)

    def _prefix_kv(self, token_ids: np.ndarray) -> dict:
        """{attention group: float32 (positions on this rank, head_size)}: the KV of
        a prefix of ``token_ids``, as the cache stores it."""
        cfg = self.config
        out = {}
        for g in cfg.attention_groups:
            local, _, _ = cfg.kept_slots(g, np.arange(len(token_ids)))
            out[g] = self._stored(token_payload(token_ids[local], cfg.head_size))
        return out

    def kv_load_fail(self, req: int, handle: int) -> None:
        """Transfer ``handle`` failed: nothing lands; its request fails (leaves the
        batch, the first failure only) and keeps its blocks until its last
        transfer has ended."""
        t = self.ledger.transfer(handle, req)
        left, freed = self.ledger.kv_load_fail(handle)
        if left:
            self._leave(t.req)
        for g, ids in enumerate(freed or []):
            self._poison(g, ids)

    def rollback(self, req: int, num_tokens: int) -> None:
        """The scheduler rolls back ``num_tokens`` rejected speculative tokens of
        ``req``'s latest step (vLLM: ``num_computed_tokens -= num_rejected`` in the
        scheduler's ``update_from_output``).  Their KV stays as garbage that the
        next step overwrites; reads mask it.  Refused with Mamba groups: one
        state column per request cannot be rolled back; speculative rows with
        one column per draft are ``spec_step``'s."""
        if self.config.mamba_groups:
            raise OpError("op", "rollback needs a config without Mamba groups (a single "
                          "state column per request cannot be rolled back)")
        if self.config.num_speculative_tokens:
            raise OpError("op", "rollback is for configs without a drafter; with "
                          "num_speculative_tokens > 0 accepted counts come with spec_step")
        if self.config.enable_prefix_caching:
            raise OpError("op", "rollback needs a config without prefix caching (its step "
                          "registered the tokens it rolls back; an engine caches only "
                          "accepted tokens: use spec_step with a drafter)")
        if any(g.sliding_window for g in self.config.groups):
            raise OpError("op", "rollback needs a config without sliding windows (an "
                          "allocate since the step may have freed the blocks of the positions "
                          "it rolls back to; an engine rejects tokens before it allocates)")
        self.ledger.rollback(req, num_tokens)
        self._row_progress(req, self.ledger.requests[req].num_computed_tokens)

    # -- forwards ----------------------------------------------------------
    def step(self, scheduled: list, cudagraph_mode: str, accepted: list | None = None,
             in_flight: bool = False, placeholders: list | None = None) -> None:
        """One real step; scheduled: [[req, num_tokens], ...], any subset of live
        requests; accepted: per item, the tokens the sampler keeps (speculative
        decoding: ``Ledger.sampled``; None = every decode token).  With
        ``num_speculative_tokens`` the drafter runs after the forward.

        in_flight: the step stays in flight (async scheduling): its device work
        happens now — in stream order, before anything later on the device — and
        the scheduler's counts move as an async scheduler moves them, but the
        per-request results the host copies back (each request's accepted
        count) land at :meth:`step_complete`, on the requests that ran.

        placeholders: per item, how many of its last tokens are placeholder
        drafts (``Ledger.check_placeholders``): a decode padded to ``1 + k``
        tokens so the batch is uniform (vLLM's scheduler pads a request with
        no drafts yet, PR #45237).  Their KV is written at their real
        positions and never kept; the sampler never accepts one."""
        _check_mode(cudagraph_mode)
        if in_flight:
            self.ledger.check_dispatch(scheduled)
        else:
            self.ledger.check_no_step_in_flight()
        if accepted is not None and not self.config.num_speculative_tokens:
            raise OpError("op", "spec_step needs a config with num_speculative_tokens > 0 "
                          "(a drafter); use step")
        self.ledger.check_step(scheduled)
        self.ledger.check_placeholders(scheduled, accepted, placeholders)
        kept = self.ledger.sampled(scheduled, accepted)
        is_decode = {req: self.ledger.requests[req].is_decode() for req, _ in scheduled}
        kept_of = {req: a for (req, _), a in zip(scheduled, kept)}
        batch = self._batch(scheduled)  # [(req, num_tokens, state row)] in batch order
        num_reqs = len(batch)
        num_tokens = sum(n for _, n, _ in batch)
        starts = [int(self.rows.num_computed_tokens[row]) for _, _, row in batch]
        uniform = is_uniform_decode(self.config, [n for _, n, _ in batch], starts,
                                    [is_decode[req] for req, _, _ in batch])
        mode, tokens_padded, reqs_padded = dispatch(self.config, num_reqs, num_tokens,
                                                    uniform, cudagraph_mode)
        self._stage_tables([row for _, _, row in batch], reqs_padded)
        qsl = self.query_start_loc
        qsl[0], t = 0, 0
        for b, (req, n, row) in enumerate(batch):
            start = int(self.rows.num_computed_tokens[row])
            pos = np.arange(start, start + n)
            self.hidden[t:t + n] = token_payload(self.ledger.token_ids(req, pos),
                                                 self.config.head_size)
            for g in self.config.attention_groups:
                self.slot_mapping[g][t:t + n] = self._slots(g, b, pos)
            self.seq_lens[b] = start + n
            self.has_initial_state[b] = int(start > 0)
            self.is_prefilling[b] = start < int(self.rows.num_prompt_tokens[row])
            t += n
            qsl[b + 1] = t
        self._stage_padding(num_reqs, reqs_padded, num_tokens, tokens_padded)
        self._build_slot_buffers(tokens_padded)
        spec = bool(self.config.num_speculative_tokens)
        self._preprocess_mamba(batch)
        self.spec_rows[:] = False
        self.state_columns[:] = 0
        for b, (req, _, _) in enumerate(batch):
            self.spec_rows[b] = spec and is_decode[req]
            # The running column: the state after the last accepted token
            # (bounded: a count of 0 — a discarded prefill sample — reads column 0).
            self.state_columns[b] = max(self.num_accepted_of[req], 1) - 1 if spec else 0
        self._stage_state_indices(num_reqs, reqs_padded)
        self._run_kernels(mode, reqs_padded if mode == FULL else num_reqs, tokens_padded)
        # The accepted count each request's next step reads its state with.
        next_accepted = self._postprocess_mamba(batch, kept_of, is_decode)
        self.draft_rows = None
        if spec:
            self._draft(batch, kept_of, is_decode, num_tokens, cudagraph_mode)
        self.ledger.step(scheduled, kept)
        if in_flight:
            self.ledger.steps_in_flight.append([req for req, _, _ in batch])
            self.results_in_flight.append({req: next_accepted[req] for req, _, _ in batch})
        for req, n, row in batch:
            if not in_flight:
                self.num_accepted_of[req] = next_accepted[req]
            self._row_progress(req, self.ledger.requests[req].num_computed_tokens)
        self.last_forward = ForwardInfo(False, mode, num_reqs, reqs_padded, num_tokens,
                                        tokens_padded, tuple(req for req, _, _ in batch))

    def step_complete(self) -> None:
        """The oldest step in flight completes: each of its requests still live
        gets the accepted count it had (the host copy lands by request)."""
        if not self.ledger.steps_in_flight:
            raise OpError("op", "no step in flight (step_dispatch first)")
        self.ledger.last_completed = self.ledger.steps_in_flight.pop(0)
        for req, kept in self.results_in_flight.pop(0).items():
            if req in self.num_accepted_of:  # still live
                self.num_accepted_of[req] = kept

    def _preprocess_mamba(self, batch: list) -> None:
        """Align mode, before the forward: each request's running state moves to
        the column of its last scheduled token, ``cdiv(num_computed + n,
        block_size) - 1``, copied from the column it was in after its previous
        step — for a request's first step, the column of its last computed
        token, ``(num_computed - 1) // block_size`` (its prefix hit's state
        block; none without a hit) — through the request's own block ids
        (vLLM's ``preprocess_mamba`` / ``collect_mamba_copy_meta``)."""
        cfg = self.config
        self.mamba_copies = []
        self.mamba_events = []  # align mode with a drafter: what the copies did (coverage)
        if cfg.mamba_cache_mode != ALIGN:
            return
        bs = cfg.tokens_per_block(cfg.mamba_groups[0])  # one block size (validated)
        spec = bool(cfg.num_speculative_tokens)
        for req, n, _ in batch:
            start = self.ledger.requests[req].num_computed_tokens
            first = req not in self.mamba_state_idx
            prev = self.mamba_state_idx.get(req, (start - 1) // bs)
            curr = -(-(start + n) // bs) - 1
            if prev >= 0 and prev != curr:
                # With a drafter the state after the last accepted token is in
                # the column ``accepted - 1`` past the running one; once moved,
                # the next read is at offset 0 (the count resets to 1).
                bias = max(self.num_accepted_of[req], 1) - 1 if spec else 0
                self.mamba_copies.append((req, prev + bias, curr,
                                          "restored" if first else "carried"))
                for g in cfg.mamba_groups:
                    ids = self.runner_blocks[req][g]
                    self.mamba_state[g][ids[curr]] = self.mamba_state[g][ids[prev + bias]]
                if spec:
                    self.num_accepted_of[req] = 1
                    if bias:
                        self.mamba_events.append("carried-with-bias")
            self.mamba_state_idx[req] = curr

    def _postprocess_mamba(self, batch: list, kept_of: dict, is_decode: dict) -> dict:
        """Align mode with a drafter, after the forward (vLLM's align-mode
        ``postprocess_mamba``): a request whose accepted tokens reach a Mamba
        block boundary ``B = (num_computed + accepted) // block_size *
        block_size`` at or past its first scheduled token's end gets the state
        at ``B`` — written by the kernel into the column ``B - 1 - (num_computed
        + n - drafts) + 1`` past the running one — copied into column ``B //
        block_size - 1``, the block those tokens complete, so that block holds
        the state at its end before it is registered; when that block is the
        running one, the next step reads it at offset 0.  Returns, per
        request of ``batch``, the accepted count its next step reads its state
        with (the kept count, or 1 after a copy into the running column)."""
        cfg = self.config
        out = {req: kept_of[req] for req, _, _ in batch}
        if cfg.mamba_cache_mode != ALIGN or not cfg.num_speculative_tokens:
            return out
        bs = cfg.tokens_per_block(cfg.mamba_groups[0])
        for req, n, _ in batch:
            start = self.ledger.requests[req].num_computed_tokens
            running = start + (1 if is_decode[req] else n)  # tokens before the drafts
            done = running + kept_of[req] - 1
            aligned = done // bs * bs
            if aligned < running:
                continue
            bias, src, dest = aligned - running, self.mamba_state_idx[req], aligned // bs - 1
            if src == dest:
                out[req] = 1
                if bias == 0:
                    continue
            self.mamba_copies.append((req, src + bias, dest, "completed"))
            if bias:  # the state comes from a column past the running one
                self.mamba_events.append("completed-with-bias")
            for g in cfg.mamba_groups:
                ids = self.runner_blocks[req][g]
                self.mamba_state[g][ids[dest]] = self.mamba_state[g][ids[src + bias]]
        return out

    def _stage_state_indices(self, num_rows: int, rows_padded: int) -> None:
        """Mamba state columns of batch rows [0, rows_padded): the device table's
        columns for real rows, ``config.mamba_pad_index`` (the null block or
        ``PAD_SLOT_ID``) for padded ones; ``state_indices``
        is the block each row reads its initial state from (its running column).
        Align mode: a row's columns start at its last scheduled token's,
        ``(seq_len - 1) // block_size`` (vLLM's ``mamba_get_block_table_tensor``).
        All mode: every column of the row (vLLM's ``state_indices_tensor`` is
        the block table); a row reads through the column of its last computed
        token, ``cdiv(seq_len - query_len, block_size) - 1`` at least 0
        (``block_idx_last_computed_token``)."""
        cfg = self.config
        for g in cfg.mamba_groups:
            cols = self.write_indices[g]
            first = np.zeros(num_rows, np.int64)
            if cfg.mamba_cache_mode == ALL:
                cols[:num_rows] = self.device_block_table[g][:num_rows, :cols.shape[1]]
                cols[num_rows:rows_padded] = cfg.mamba_pad_index
                computed = self.seq_lens[:rows_padded].astype(np.int64) \
                    - np.diff(self.query_start_loc[:rows_padded + 1])
                read = np.clip(-(-computed // cfg.tokens_per_block(g)) - 1, 0, cols.shape[1] - 1)
                self.state_indices[g][:rows_padded] = cols[np.arange(rows_padded), read]
                continue
            if cfg.mamba_cache_mode == ALIGN:
                # Clamped to the row: a dummy row's seq_len (its tokens) may pass
                # max_model_len; its row holds null blocks whatever the column.
                width = self.device_block_table[g].shape[1]
                first = np.clip((self.seq_lens[:num_rows].astype(np.int64) - 1)
                                // cfg.tokens_per_block(g), 0, width - cols.shape[1])
            take = first[:, None] + np.arange(cols.shape[1])
            cols[:num_rows] = np.take_along_axis(self.device_block_table[g][:num_rows], take,
                                                 axis=1)
            cols[num_rows:rows_padded] = cfg.mamba_pad_index  # null block or PAD_SLOT_ID
            rows = np.arange(rows_padded)
            self.state_indices[g][:rows_padded] = cols[rows, self.state_columns[:rows_padded]]

    def _draft(self, batch: list, kept_of: dict, is_decode: dict, num_tokens: int,
               requested: str) -> None:
        """The drafter after a real forward (vLLM's EAGLE proposer ``propose``): its
        first pass re-runs the batch's tokens through the draft layer, writing
        draft KV at the target's slots of the draft group; each further pass
        (``num_speculative_tokens - 1`` of them) runs one token per request at
        the position after its last valid token, then the next — slots from the
        shared block table (the step's requests hold blocks for k lookahead
        tokens), ``PAD_SLOT_ID`` from ``max_model_len`` on (vLLM's EAGLE step
        kernel clamps such positions and pads their slots).  Padded
        rows and padded tokens write nothing; the single-token passes run over
        rows padded as a uniform batch dispatches with ``requested`` (their FULL
        graph), recorded in ``draft_slot_mapping`` / ``draft_rows`` (padded rows:
        ``PAD_SLOT_ID``).  Values: ``draft_payload``."""
        cfg = self.config
        g = cfg.draft_group
        flat = self.draft_kv_cache[g].reshape(-1, cfg.head_size)
        slots = self.slot_mapping[g][:num_tokens]
        keep = slots != PAD_SLOT_ID
        flat[slots[keep]] = draft_payload(self.hidden[:num_tokens][keep])
        num_reqs = len(batch)
        mode, _, rows_padded = dispatch(cfg, num_reqs, num_reqs, True, requested, query_len=1)
        rows = rows_padded if mode == FULL else num_reqs
        self.draft_full = mode == FULL
        for i in range(1, cfg.num_speculative_tokens):
            self.draft_slot_mapping[:rows] = PAD_SLOT_ID
            self.draft_rows = (num_reqs, rows)
            for b, (req, n, row) in enumerate(batch):
                start = int(self.rows.num_computed_tokens[row])
                last = start + (kept_of[req] if is_decode[req] else n) - 1
                q = last + i
                if q >= cfg.max_model_len:
                    continue
                slot = int(self._slots(g, b, np.array([q]))[0])
                self.draft_slot_mapping[b] = slot
                if slot != PAD_SLOT_ID:
                    flat[slot] = draft_payload(payload(req, np.array([q]), cfg.head_size))[0]

    def dummy_run(self, num_reqs: int, num_tokens: int, cudagraph_mode: str) -> None:
        """An idle rank's padded fake batch (DP lockstep): NaN payload, no real rows."""
        _check_mode(cudagraph_mode)
        check_dummy_sizes(self.config, num_reqs, num_tokens)
        mode, tokens_padded, reqs_padded = dispatch(
            self.config, num_reqs, num_tokens,
            num_tokens == num_reqs * self.config.uniform_query_len, cudagraph_mode)
        self._prepare_dummy(reqs_padded)
        metadata = self._dummy_builds_metadata(mode)
        if metadata:
            per_req = dummy_query_lens(num_reqs, num_tokens)
            self.query_start_loc[0] = 0
            self.query_start_loc[1:num_reqs + 1] = np.cumsum(per_req)
            self.seq_lens[:num_reqs] = per_req
            self.has_initial_state[:num_reqs] = 0
            self.is_prefilling[:num_reqs] = False
            self._stage_padding(num_reqs, reqs_padded, num_tokens, tokens_padded)
        self.hidden[:tokens_padded] = np.nan
        for g in self.config.attention_groups:
            self.slot_mapping[g][:self._dummy_pad_extent(tokens_padded)] = PAD_SLOT_ID
        if metadata:
            self._build_slot_buffers(tokens_padded)
            self.spec_rows[:] = False
            self.state_columns[:] = 0
            self._stage_state_indices(reqs_padded, reqs_padded)
        self._run_kernels(mode, reqs_padded if mode == FULL else num_reqs, tokens_padded,
                          metadata)
        self.draft_rows = None
        if mode == FULL and self.config.num_speculative_tokens > 1:
            # The drafter's dummy run over the padded rows, no request: its FULL
            # graph where its own dispatcher has one for them.
            dmode, _, drows = dispatch(self.config, reqs_padded, reqs_padded, True, FULL,
                                       query_len=1)
            rows = drows if dmode == FULL else reqs_padded
            self.draft_slot_mapping[:rows] = PAD_SLOT_ID
            self.draft_rows = (0, rows)
            self.draft_full = dmode == FULL
        self.last_forward = ForwardInfo(True, mode, num_reqs, reqs_padded, num_tokens,
                                        tokens_padded, metadata=metadata)

    # -- runner-specific hooks ---------------------------------------------
    @abc.abstractmethod
    def _batch(self, scheduled: list) -> list[tuple[int, int, int]]:
        """The step's batch: (req, num_tokens, state row) per batch index."""

    @abc.abstractmethod
    def _stage_tables(self, rows: list[int], reqs_padded: int) -> None:
        """Make ``device_block_table`` hold the batch's rows (commit / gather)."""

    @abc.abstractmethod
    def _prepare_dummy(self, reqs_padded: int) -> None:
        """Make ``device_block_table[:reqs_padded]`` what a dummy run reads."""

    def _dummy_pad_extent(self, tokens_padded: int) -> int:
        return tokens_padded

    def _row_progress(self, req: int, num_computed: int) -> None:
        """A request's computed-token count changed (a step, a KV load, a
        rollback): V2's request state follows it at once."""
        row = self.rows.row_of(req)
        if row is not None:
            self.rows.num_computed_tokens[row] = num_computed

    def _dummy_builds_metadata(self, mode: str) -> bool:
        """Does a dummy run in ``mode`` build attention metadata (and so run the
        Mamba updates and attention reads, which need it)?  V2: always."""
        return True

    # -- internals ---------------------------------------------------------
    def _enter_batch(self, req: int) -> None:
        row = self.rows.lowest_free_row()
        assert row is not None, "live requests never exceed max_num_reqs"
        r = self.ledger.requests[req]
        # The runner's own copy of the request's ids (vLLM's CachedRequestState:
        # new ids appended, entries a sliding window freed kept as they were).
        self.rows.add_row(row, req, self.runner_blocks.setdefault(req, r.blocks),
                          r.num_computed_tokens, r.prompt_len)

    def _slots(self, group: int, row: int, pos: np.ndarray) -> np.ndarray:
        """Slots on this rank: DCP layout in allocation blocks, then kernel blocks;
        a position past the row (a narrow group's) has none: ``PAD_SLOT_ID``."""
        cfg = self.config
        bs, kbs = cfg.groups[group].block_size, cfg.groups[group].kernel_block_size
        kept, col, off = cfg.kept_slots(group, pos)
        kcol = np.where(kept, col * (bs // kbs) + off // kbs, 0)
        blocks = self.device_block_table[group][row, kcol].astype(np.int64)
        return np.where(kept, blocks * kbs + off % kbs, PAD_SLOT_ID)

    def _stage_padding(self, num_reqs, reqs_padded, num_tokens, tokens_padded) -> None:
        """Padded rows (FULL): an empty query (vLLM fills ``query_start_loc`` past
        the batch with its token count), seq_len 0, no initial state, not a
        prefill; padded tokens: NaN, PAD slot (they belong to no row)."""
        for b in range(num_reqs, reqs_padded):
            self.query_start_loc[b + 1] = self.query_start_loc[b]
            self.seq_lens[b] = 0
            self.has_initial_state[b] = 0
            self.is_prefilling[b] = False
        self.hidden[num_tokens:tokens_padded] = np.nan
        for g in self.config.attention_groups:
            self.slot_mapping[g][num_tokens:tokens_padded] = PAD_SLOT_ID

    def _build_slot_buffers(self, tokens_padded: int) -> None:
        """Backends with their own slot buffer copy the generic slot mapping of
        the batch's tokens, padded tail included (``PAD_SLOT_ID``)."""
        for g, own in self.backend_slot_mapping.items():
            own[:tokens_padded] = self.slot_mapping[g][:tokens_padded]

    def write_slots(self, g: int) -> np.ndarray:
        """The slot buffer group ``g``'s KV write reads, int64 (max_num_batched_tokens,)."""
        return self.backend_slot_mapping.get(g, self.slot_mapping[g])

    def _run_kernels(self, mode: str, num_rows: int, num_tokens: int,
                     metadata: bool = True) -> None:
        """KV writes (through the generic slot mappings, which need no metadata;
        a backend's own slot buffer only with metadata), then — with attention
        metadata — Mamba updates and attention reads."""
        for g in self.config.attention_groups:
            if metadata or g not in self.backend_slot_mapping:
                self._kv_write(g, num_tokens)
        if not metadata:
            return
        for g in self.config.mamba_groups:
            self._mamba_update(g, num_rows)
        for g in self.config.attention_groups:
            self._attention(g, num_rows)

    def _kv_write(self, g: int, num_tokens: int) -> None:
        slots = self.write_slots(g)[:num_tokens]
        keep = slots != PAD_SLOT_ID
        flat = self.kv_cache[g].reshape(-1, self.config.head_size)
        flat[slots[keep]] = self._stored(self.hidden[:num_tokens][keep])

    def _stored(self, rows: np.ndarray) -> np.ndarray:
        """What the attention KV cache reads back for float32 ``rows``: the rows,
        or their quantized round trip (``kv_cache_dtype`` ``int8``)."""
        return roundtrip(rows) if self.config.quantized else rows

    def _mamba_update(self, g: int, num_rows: int) -> None:
        """Each row starts from the state at ``state_indices`` (its running
        column; 0 without initial state); a spec-decode row writes the state
        after each of its tokens to columns 0, 1, ... (vLLM's spec-decode
        ``ssm_state_indices`` / ``num_accepted_tokens`` kernels), any other row
        its final state to column 0.  All mode: a row of ``n`` tokens after
        ``s`` computed writes, to each column ``c`` from ``s // block_size``
        (``block_idx_first_scheduled_token``) to ``(s + n - 1) // block_size``
        (``block_idx_last_scheduled_token``), the state after position
        ``min((c + 1) * block_size, s + n) - 1``: every block boundary the
        chunk crosses, then its end."""
        # kv_sharing: a write into the null block is dropped (its page is shared).
        keep_null = self.config.page_partner(g) is None
        conv, heads = self.config.groups[g].conv_size, self.config.head_size
        cfg_all = self.config.mamba_cache_mode == ALL
        bs = self.config.tokens_per_block(g)
        for b in range(num_rows):
            idx = int(self.state_indices[g][b])
            if idx == PAD_SLOT_ID:
                continue
            lo, hi = int(self.query_start_loc[b]), int(self.query_start_loc[b + 1])
            old = self.mamba_state[g][idx].copy() if self.has_initial_state[b] \
                else np.zeros(self.config.state_floats(g), np.float32)
            cols = self.write_indices[g][b]

            def after(end: int) -> np.ndarray:
                """The state after tokens [lo, end): conv shifted, SSM summed."""
                seq = np.concatenate([old[:conv * heads].reshape(conv, heads),
                                      self.hidden[lo:end]])
                ssm = old[conv * heads:] + self.hidden[lo:end].sum(axis=0, dtype=np.float32)
                return np.concatenate([seq[len(seq) - conv:].reshape(-1), ssm])

            if cfg_all:
                s = int(self.seq_lens[b]) - (hi - lo)
                last = min(max(int(self.seq_lens[b]) - 1, 0) // bs, cols.shape[0] - 1)
                for c in range(max(min(s // bs, last), 0), last + 1):
                    end = lo + min((c + 1) * bs - s, hi - lo)
                    if keep_null or cols[c] != NULL_BLOCK_ID:
                        self.mamba_state[g][cols[c]] = after(end)
            elif self.spec_rows[b]:
                for t in range(hi - lo):
                    if keep_null or cols[t] != NULL_BLOCK_ID:
                        self.mamba_state[g][cols[t]] = after(lo + t + 1)
            elif keep_null or cols[0] != NULL_BLOCK_ID:
                self.mamba_state[g][cols[0]] = after(hi)

    def _cells(self, g: int) -> tuple:
        """(kernel-block column, offset in it, position held) of each cell of a
        group ``g`` row, int64 ``(width * kernel_block_size,)`` each: the
        position each cell holds on this rank (DCP: only this rank's share).
        Fixed by the config: worked out once per group."""
        cells = self._cells_of.get(g)
        if cells is None:
            cfg = self.config
            bs, kbs = cfg.groups[g].block_size, cfg.groups[g].kernel_block_size
            j = np.arange(self.device_block_table[g].shape[1] * kbs)
            held = global_position((j // kbs) // (bs // kbs),
                                   (j // kbs) % (bs // kbs) * kbs + j % kbs,
                                   bs, cfg.dcp_world_size, cfg.dcp_rank,
                                   cfg.cp_kv_cache_interleave_size)
            cells = self._cells_of[g] = (j // kbs, j % kbs, held)
        return cells

    def _attention(self, g: int, num_rows: int) -> None:
        cfg = self.config
        kbs = cfg.groups[g].kernel_block_size
        kv = self.kv_cache[g].reshape(-1, kbs, cfg.head_size)  # kernel blocks
        col, off, held = self._cells(g)
        window = cfg.groups[g].sliding_window
        for b in range(num_rows):
            blocks = self.device_block_table[g][b, col]
            vals = kv[blocks, off]
            inside = held < self.seq_lens[b]
            if window:  # sliding-window attention: the last `window` positions only
                inside &= held >= self.seq_lens[b] - window
            weight = inside.astype(np.float32)
            self.attn_out[g][b] = (weight[:, None] * vals).sum(axis=0, dtype=np.float32)

    def _poison(self, g: int, ids: list[int]) -> None:
        if g in self.draft_kv_cache:
            self.draft_kv_cache[g][ids] = SENTINEL
        if g in self.kv_cache:
            self.kv_cache[g][ids] = SENTINEL
        else:
            self.mamba_state[g][ids] = SENTINEL


class ReferenceV1Runner(ReferenceRunnerBase):
    """V1: the persistent batch. A step's batch rows are the persistent rows
    0..num_reqs-1 after ``_update_states``; the device table is the committed
    copy of the host rows."""

    def condense(self) -> None:
        self.rows.condense()

    def swap(self, i: int, j: int) -> None:
        for name, v in (("i", i), ("j", j)):
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < len(self.rows.req_ids):
                raise OpError(name, f"row {v!r} out of range [0, {len(self.rows.req_ids)})")
            if self.rows.req_ids[v] == EMPTY_ROW:
                raise OpError(name, f"row {v} holds no request")
        if i == j:
            raise OpError("j", "swap needs two different rows")
        self.rows.swap_row(i, j)

    def _batch(self, scheduled: list) -> list[tuple[int, int, int]]:
        num_tokens_of = {req: n for req, n in scheduled}
        self._update_states(num_tokens_of)
        return [(int(self.rows.req_ids[b]), num_tokens_of[int(self.rows.req_ids[b])], b)
                for b in range(len(scheduled))]

    def _stage_tables(self, rows: list[int], reqs_padded: int) -> None:
        self._commit(reqs_padded)

    def _prepare_dummy(self, reqs_padded: int) -> None:
        self._update_states({})  # an idle rank: nothing scheduled, every request leaves
        self._commit(reqs_padded)

    def _dummy_builds_metadata(self, mode: str) -> bool:
        """V1 ``_dummy_run`` builds attention metadata only for FULL (or when forced):
        its KV writes still run through the slot mappings, its Mamba mixers and
        attention layers see no metadata and do nothing."""
        return mode == FULL

    def _row_progress(self, req: int, num_computed: int) -> None:
        """V1: a row's counter is set when its request is scheduled (vLLM's
        ``_update_states`` copies the scheduler's count); nothing advances it
        after the forward, so a row keeps its request's count as of the start
        of its last step."""

    def _update_states(self, num_tokens_of: dict) -> None:
        for row in range(len(self.rows.req_ids)):
            req = int(self.rows.req_ids[row])
            if req != EMPTY_ROW and req not in num_tokens_of:
                self.rows.clear_row(row)
        for req in num_tokens_of:
            row = self.rows.row_of(req)
            if row is None:
                self._enter_batch(req)
            else:
                self.rows.num_computed_tokens[row] = \
                    self.ledger.requests[req].num_computed_tokens
        self.rows.condense()
        if self.config.reorder_batch_threshold and num_tokens_of:
            self.rows.permute(reorder_decode_first(
                [num_tokens_of[int(r)] for r in self.rows.req_ids[:len(num_tokens_of)]],
                self.rows.num_computed_tokens[:len(num_tokens_of)],
                self.rows.num_prompt_tokens[:len(num_tokens_of)],
                self.config.reorder_batch_threshold))

    def _commit(self, num_rows: int) -> None:
        for g, table in enumerate(self.rows.block_table):
            self.device_block_table[g][:num_rows] = table[:num_rows]


def reorder_decode_first(num_scheduled, num_computed, num_prompt, threshold: int) -> list[int]:
    """The batch order vLLM's ``reorder_batch_to_split_decodes_and_prefills``
    (``vllm/v1/attention/backends/utils.py``) leaves: row i of the result is old
    row ``order[i]``.

    Regions, in this order: decodes (at most ``threshold`` tokens, prior state,
    prompt done), short extends (same, prompt not done), long extends (more
    tokens, prior state), first chunks (no prior state).  Rows already in their
    region's span stay; the others are dealt, by region and then by position,
    to the positions that were out of place — not a full stable sort.
    """
    computed = np.asarray(num_computed)
    has_context = computed > 0
    below = np.asarray(num_scheduled) <= threshold
    done = computed >= np.asarray(num_prompt)
    region = np.where(~has_context, 3, np.where(~below, 2, np.where(done, 0, 1)))
    target = np.sort(region, kind="stable")
    out_of_place = np.flatnonzero(region != target)
    moved = out_of_place[np.argsort(region[out_of_place], kind="stable")]
    order = list(range(len(region)))
    for dst, src in zip(out_of_place, moved):
        order[int(dst)] = int(src)
    return order


def _check_mode(mode) -> None:
    if mode not in CUDAGRAPH_MODES:
        raise OpError("cudagraph_mode", f"{mode!r} not one of {list(CUDAGRAPH_MODES)}")


def check_dummy_sizes(config: RunnerConfig, num_reqs, num_tokens) -> None:
    """Raise :class:`OpError` unless 1 <= num_reqs <= num_tokens within the limits."""
    for name, v, hi in (("num_reqs", num_reqs, config.max_num_reqs),
                        ("num_tokens", num_tokens, config.max_num_batched_tokens)):
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= hi:
            raise OpError(name, f"must be an integer in [1, {hi}], got {v!r}")
    if num_tokens < num_reqs:
        raise OpError("num_tokens", f"{num_tokens} < num_reqs={num_reqs}")


def dummy_query_lens(num_reqs: int, num_tokens: int) -> np.ndarray:
    """Tokens per dummy request: an even split, the remainder on the last (int32)."""
    lens = np.full(num_reqs, num_tokens // num_reqs, np.int32)
    lens[-1] += num_tokens % num_reqs
    return lens
