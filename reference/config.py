"""Runner configuration shared by the reference, gpu_impl and traces.

A :class:`RunnerConfig` is the ``config`` object of a trace: which model runner
(``v1`` persistent batch), which KV-cache groups (attention or mamba, each with
its allocation block size and kernel block size), the pool size, the batch
limits and the CUDA-graph capture sizes.  It models the parts of vLLM's
``KVCacheConfig`` / ``SchedulerConfig`` / ``CompilationConfig`` that the
block-table code reads.

Everything here is plain Python; errors are :class:`ConfigError` naming the
field, so a trace loader can turn them into a one-line message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from .payload import PAD_SLOT_ID

ATTENTION = "attention"
MAMBA = "mamba"
GROUP_KINDS = (ATTENTION, MAMBA)
RUNNERS = ("v1", "v2")
# cudagraph_mode values (vLLM ``CUDAGraphMode``): eager; graphs around
# everything but attention with metadata rebuilt every step; whole step
# replayed from a graph that reads persistent metadata buffers.
NONE, PIECEWISE, FULL = "NONE", "PIECEWISE", "FULL"
CUDAGRAPH_MODES = (NONE, PIECEWISE, FULL)
# What the attention backends' FULL graphs can capture (vLLM ``AttentionCGSupport``;
# the runner takes the least over its backends): uniform decode batches only
# (1 + num_speculative_tokens tokens per row), or any batch (mixed prefill +
# decode; FlashAttention 3, Triton).
UNIFORM_BATCH, ALWAYS = "UNIFORM_BATCH", "ALWAYS"
CUDAGRAPH_SUPPORTS = (UNIFORM_BATCH, ALWAYS)
# Who chooses block ids: the trace (``add`` / ``append`` name them), or the
# target's own KV-cache manager (``admit`` / ``allocate`` ask it; the trace
# records what it chose).
TRACE, ENGINE = "trace", "engine"
ALLOCATORS = (TRACE, ENGINE)
# vLLM's mamba_cache_mode with prefix caching on a hybrid model (see
# RunnerConfig.mamba_cache_mode): a state kept at chunk ends that prefill
# chunks put on block boundaries, or a state kept at every block boundary a
# chunk crosses and where it ends.
ALIGN, ALL = "align", "all"
MAMBA_PREFIX_MODES = (ALIGN, ALL)
# What a Mamba group's metadata puts in batch rows padded to a capture size,
# and whether block 0 is its null block (see RunnerConfig.mamba_padding).
NULL_PAD, PAD_SLOT, PAD_SLOT_NO_NULL = "null", "pad_slot", "pad_slot_no_null"
MAMBA_PADDINGS = (NULL_PAD, PAD_SLOT, PAD_SLOT_NO_NULL)
# The attention groups' KV-cache storage (vLLM's CacheConfig.cache_dtype):
# float32 as computed, or an 8-bit payload with a float32 scale per token slot.
KV_AUTO, KV_INT8 = "auto", "int8"
KV_CACHE_DTYPES = (KV_AUTO, KV_INT8)

# Bounds that keep a fuzz step affordable on a 2-core CPU under the Triton
# interpreter, and keep payload sums exact in float32 (see payload.py).
NUM_BLOCKS_MAX = 64
MAX_NUM_REQS_MAX = 8
MAX_NUM_BLOCKS_PER_REQ_MAX = 16
MAX_NUM_BATCHED_TOKENS_MAX = 64
BLOCK_SIZE_MAX = 64  # any size: hybrid models pick e.g. 48 to fill the Mamba page
HEAD_SIZE_MAX = 8
NUM_GROUPS_MAX = 4
SPECULATIVE_TOKENS_MAX = 4
CONV_SIZE_MAX = 3  # tokens of convolution state (a width-4 causal conv keeps 3)
HOST_BLOCKS_MAX = 64  # host-tier blocks (shared by the attention groups)


class ConfigError(ValueError):
    """A config field is missing, of the wrong type or out of bounds.

    ``field`` is the dotted path of the offending field (``groups[1].block_size``).
    """

    def __init__(self, field_path: str, message: str):
        super().__init__(f"config.{field_path}: {message}" if field_path else f"config: {message}")
        self.field = field_path


@dataclass(frozen=True)
class GroupSpec:
    """One KV-cache group.

    kind: ``"attention"`` (paged KV cache, ``block_size`` tokens per block) or
    ``"mamba"`` (one recurrent-state slot per block; a request owns exactly
    ``1 + num_speculative_tokens`` blocks — one state column per speculative
    position — and without speculation its state index is ``block_table[row, 0]``).
    kernel_block_size: attention kernel's block size; must divide ``block_size``
    (one allocation block is then ``block_size // kernel_block_size`` kernel
    blocks in block tables and slot mappings).
    slot_buffer: attention only; the group's backend keeps its own persistent
    slot buffer, which its metadata builder copies from the generic slot
    mapping (padded tail ``PAD_SLOT_ID``), and its KV write — run only when
    attention metadata was built — and its FULL graphs read that buffer (a
    sparse indexer's or a drafter's own slot mapping, as vLLM's EAGLE
    proposer keeps one).  Serialised only when true.
    sliding_window: attention only; 0 = full attention, W > 0 = sliding-window
    attention over the last W tokens (a row's read covers positions
    ``[seq_len - W, seq_len)``; vLLM's ``SlidingWindowSpec``).  With
    ``allocator: engine`` the KV-cache manager frees a request's blocks once
    they leave the window (vLLM's ``remove_skipped_blocks``); with prefix
    caching a hit needs only the blocks inside the window of its first new
    token, the ones before are the null block (vLLM's
    ``SlidingWindowManager.find_longest_cache_hit``).  Serialised only when
    non-zero.
    conv_size: mamba only; tokens of convolution state the Mamba layer keeps
    before its SSM state (vLLM's ``MambaSpec`` shapes: a conv state, then an
    SSM state, laid one after the other in the state block): the state of a
    request is ``conv_size`` token payloads — its last ones, oldest first,
    zeros before its first token — then the running sum of its payloads, so
    ``(conv_size + 1) * head_size`` floats (:meth:`RunnerConfig.state_floats`).
    0 (the default, not serialised): the SSM part alone.
    max_num_blocks: attention only; 0 (the default, not serialised) sizes the
    group's block-table row as every attention group's is (``model_len`` or
    ``max_num_blocks_per_req``); n > 0 gives it a row of n allocation blocks,
    narrower than a request's positions (``n * block_size < max_model_len``):
    a cache-only or tail group the engine sizes apart from the main attention
    group (vLLM's per-group ``max_num_blocks`` in ``BlockTables``; vLLM
    issue #53982 reports such groups).  The group keeps KV for the positions its
    row spans, ``[0, n * block_size)`` on this rank's view, and no more: a
    request holds at most n of its blocks, a position past the row has no
    slot (``PAD_SLOT_ID``: the slot-mapping kernel bounds its block-table
    load by the row's width, vLLM PR #54296) and the group's read covers the
    row's positions only.  Not the first attention group (the drafter's and
    ``max_model_len``'s), no sliding window, no prefix caching, host tier or
    ``kv_sharing`` with it (not modelled).
    """

    kind: str
    block_size: int
    kernel_block_size: int
    slot_buffer: bool = False
    sliding_window: int = 0
    conv_size: int = 0
    max_num_blocks: int = 0


@dataclass(frozen=True)
class RunnerConfig:
    """Geometry and limits of one model runner.

    num_blocks: blocks per KV-cache group, including the null block 0 (with
      ``kv_sharing``: blocks of the one pool all groups share).
    max_num_blocks_per_req: block-table width (columns) of the attention groups
      whose rows span ``max_model_len`` — with ``model_len``, of the widest one
      (a narrow group, ``GroupSpec.max_num_blocks``, has a width of its own).
    model_len: ``max_model_len`` in tokens (JSON ``"max_model_len"``); 0 = derived
      from one width for every attention group (``max_num_blocks_per_req``
      blocks each).  Set, each attention group's row is
      ``cdiv(max_model_len, block_size * dcp_world_size)`` columns wide, as
      vLLM's ``InputBatch`` / ``BlockTables`` size each group's table, so groups
      with different block sizes get different widths; ``max_num_blocks_per_req``
      must then be the widest.  Serialised only when set.
    cudagraph_capture_sizes: token counts graphs are captured for, ascending;
      FULL graphs exist only for sizes a uniform decode batch fills exactly:
      multiples of ``1 + num_speculative_tokens`` of at most ``max_num_reqs``
      rows (:meth:`full_sizes`).
    head_size: floats per KV cell / state slot.
    dcp_world_size / dcp_rank / cp_kv_cache_interleave_size: decode context
      parallelism as seen by one rank.  Attention KV is sharded: within a
      *virtual block* of ``block_size * dcp_world_size`` positions, runs of
      ``interleave`` positions go to ranks round-robin; this rank stores only
      its own positions (others map to ``PAD_SLOT_ID``), packed into its
      ``block_size`` slots.  Mamba groups are replicated (not sharded).
    reorder_batch_threshold: V1 only; 0 = no attention backend asks for a
      reorder; n > 0 = the persistent batch is reordered decode-first after
      every ``condense`` (vLLM's ``reorder_batch_threshold``: its Mamba builders
      ask for 1) — rows with at most n scheduled tokens and prior state first.
      Serialised only when non-zero, so traces from before it keep their bytes.
    cudagraph_support: ``UNIFORM_BATCH`` — FULL graphs replay uniform decode
      batches only (``1 + num_speculative_tokens`` tokens per row), of at most
      ``max_num_reqs`` rows;
      ``ALWAYS`` — the attention backends also capture mixed batches, so a
      FULL request replays any batch that fits a capture size, rows padded to
      ``min(size, max_num_reqs)`` (vLLM's dispatcher for FULL non-uniform
      keys).  ``ALWAYS`` needs a config without Mamba groups (vLLM's Mamba
      builders support uniform batches only, and the least support wins).
      Serialised only when ``ALWAYS``.
    num_speculative_tokens: k, draft tokens per decode (0: no speculative
      decoding).  With k > 0 (vLLM ``SpeculativeConfig`` with an EAGLE/MTP
      drafter): a decode runs 1..1+k tokens and reports how many were accepted;
      a drafter writes a draft layer's KV cache through the first attention
      group's block table after every forward; a step's requests hold blocks
      for k lookahead tokens past it (vLLM's ``num_lookahead_tokens``, up to
      ``max_model_len``); each Mamba group keeps 1 + k state columns per
      request (vLLM's ``num_speculative_blocks``).
      Serialised only when non-zero.
    allocator: ``trace`` — block ids are named by the trace (``add`` /
      ``append``); ``engine`` — the target's KV-cache manager chooses them
      (``admit`` / ``allocate``, modelled on vLLM's ``KVCacheManager`` with its
      ``BlockPool``: reference-counted blocks, a free queue, the null block
      never handed out) and the trace records its choices.  Serialised only
      when ``engine``.
    enable_prefix_caching: ``engine`` only: full blocks are registered under
      the hash of every token up to their end once computed; freed
      registered blocks keep their content until evicted, and a new request
      shares the longest registered prefix of its prompt (at most
      ``prompt_len - 1`` tokens, a multiple of every group's block size).
      With Mamba groups this is vLLM's ``mamba_cache_mode`` ``"align"`` or
      ``"all"`` (:attr:`mamba_prefix_mode`; all mode needs
      ``num_speculative_tokens`` 0; align mode with a drafter needs a Mamba
      block of at least ``1 + num_speculative_tokens`` tokens — see
      :meth:`reference.ledger.align_growth`).  Needs DCP off.  Serialised
      only when true.
    mamba_prefix_mode: which Mamba prefix caching a hybrid config with prefix
      caching runs (JSON ``"mamba_cache_mode"``): ``"align"`` (the default,
      not serialised) or ``"all"`` — see :attr:`mamba_cache_mode`.  ``"all"``
      needs prefix caching and a Mamba group.
    kv_sharing: vLLM's hybrid KV-cache layout (its hybrid allocator with
      ``KVCacheTensor.shared_by``).  One block pool for every group: a block
      id is held by at most one (request, group) at a time and freeing returns
      it to that one pool (``num_blocks`` is the pool's size).  The i-th
      attention group's KV tensor is shared with the i-th Mamba group's state
      tensor (:meth:`shared_pages`): block ``b`` is one page of
      ``block_size * head_size`` floats; the attention view is the whole page,
      the Mamba view its first ``head_size`` floats (the state laid out from
      the page's start, at the page's stride — the engine's state-tensor
      builder derives that stride from the page size).  So a Mamba write
      through a block id that an attention group now holds lands in that
      request's KV (token 0 of the block).  The shared null page stays clean:
      Mamba kernels drop a state write into the null block as they drop
      ``PAD_SLOT_ID`` (its attention view is read, weighted 0, by every row
      with null entries).  Needs an attention and a Mamba group and no
      drafter; not with prefix caching yet.  Serialised only when true.
    mamba_padding: the padding convention of the Mamba groups' state indices
      (rows padded to a capture size in a FULL replay or dummy run, and the
      empty entries of their block-table rows):
      ``"null"`` — padded rows index block 0, the reserved null block, which
      Mamba kernels may treat as scratch (the default; not serialised);
      ``"pad_slot"`` — padded rows hold ``PAD_SLOT_ID`` (-1), which the
      kernels skip; block 0 is still reserved (vLLM's Mamba builders pad
      ``state_indices_tensor`` with ``PAD_SLOT_ID``; SGLang's Mamba pool keeps
      slot 0 as the dummy target);
      ``"pad_slot_no_null"`` — ``PAD_SLOT_ID`` padding and no null block:
      block 0 is a state block like any other, and an empty block-table entry
      holds ``PAD_SLOT_ID`` (a radix-cache Mamba pool whose slot 0 is
      allocatable, as tokenspeed's is).  Needs a Mamba group;
      ``pad_slot_no_null`` needs prefix caching off (align mode pads a row
      with the null block) and ``kv_sharing`` off (block 0 is the attention
      null page).
    sharing_map: with ``kv_sharing``, which attention group shares its tensor
      with which Mamba group: ((attention group, Mamba group), ...), each group
      at most once (JSON ``"kv_sharing_map"``: a list of pairs); empty (the
      default, not serialised): the i-th attention group with the i-th Mamba
      group.  A group left out keeps a tensor of its own in the one pool.
    kv_cache_dtype: ``"auto"`` — attention KV stored as computed (float32; the
      default, not serialised); ``"int8"`` — a quantized KV cache: each
      attention group stores an int8 payload (num_blocks, block_size,
      head_size) and a float32 scale buffer (num_blocks, block_size), one
      scale per token slot (per-token-head scales with one KV head, as
      vLLM's and SGLang's per-token quantized caches keep them); the
      arithmetic is :mod:`reference.quant`.  Observations and invariants see
      the dequantized cache (payload x scale), so a NaN or stale scale shows
      in every element of its token.  The drafter's layer stays float32.  Not
      with ``kv_sharing`` (a Mamba state over int8 pages is not modelled).
    host_blocks: capacity of a host (CPU) tier in blocks, shared by every
      attention group; 0 for none (the default, not serialised).  With a host
      tier, a connector offloads full computed attention blocks to it
      (``offload_begin`` / ``_complete``) and onboards them into a new
      request's blocks (``onboard_begin`` / ``_complete``), modelled on vLLM
      0.26's offloading connector with its ``CPUOffloadingManager`` (LRU
      policy): one host block per (attention group, block hash); a block
      being stored is not ready and cannot be loaded or evicted; a load pins
      its blocks until it ends; an offload that needs room evicts the least
      recently used evictable blocks not among its own hashes, or stores
      nothing when there are too few (:mod:`reference.host_tier`).  Needs an
      attention group, no sliding windows and ``dcp_world_size`` 1.
    """

    runner: str = "v1"
    groups: tuple[GroupSpec, ...] = field(
        default_factory=lambda: (
            GroupSpec(ATTENTION, 4, 4),
            GroupSpec(MAMBA, 16, 16),
        )
    )
    num_blocks: int = 12
    max_num_reqs: int = 4
    max_num_blocks_per_req: int = 4
    max_num_batched_tokens: int = 16
    cudagraph_capture_sizes: tuple[int, ...] = (1, 2, 4, 8)
    head_size: int = 4
    dcp_world_size: int = 1
    dcp_rank: int = 0
    cp_kv_cache_interleave_size: int = 1
    reorder_batch_threshold: int = 0
    cudagraph_support: str = UNIFORM_BATCH
    num_speculative_tokens: int = 0
    allocator: str = TRACE
    enable_prefix_caching: bool = False
    kv_sharing: bool = False
    model_len: int = 0
    mamba_padding: str = NULL_PAD
    kv_cache_dtype: str = KV_AUTO
    sharing_map: tuple[tuple[int, int], ...] = ()
    host_blocks: int = 0
    mamba_prefix_mode: str = ALIGN

    def __post_init__(self):
        self.validate()

    def __getstate__(self) -> dict:
        """Its fields only: what is worked out once per config (a
        ``cached_property``: the group lists, the scratch null groups) is left
        out of a pickle or copy and worked out again there on first use, so a
        config pickles the same whichever of them were asked for."""
        return {k: v for k, v in self.__dict__.items() if k not in _DERIVED}

    # -- derived -----------------------------------------------------------
    @cached_property
    def attention_groups(self) -> list[int]:
        """(once per config: shared, do not mutate)"""
        return [i for i, g in enumerate(self.groups) if g.kind == ATTENTION]

    @cached_property
    def mamba_groups(self) -> list[int]:
        """(once per config: shared, do not mutate)"""
        return [i for i, g in enumerate(self.groups) if g.kind == MAMBA]

    def blocks_per_req_max(self, group: int) -> int:
        """Columns of ``group``'s block table (a mamba group: one state column per
        speculative position, ``1 + num_speculative_tokens``; in align mode one
        state block per ``block_size`` tokens of ``max_model_len``, as vLLM's
        runner sizes the row: ``cdiv(max_model_len, block_size)``)."""
        if self.groups[group].kind == MAMBA:
            if self.caches_state(group):  # align mode: + the speculative state columns
                return -(-self.max_model_len // self.groups[group].block_size) \
                    + self.num_speculative_tokens
            return self.mamba_columns
        if self.groups[group].max_num_blocks:  # a row narrower than a request
            return self.groups[group].max_num_blocks
        if self.model_len:  # per group, as the engine sizes each group's table
            return -(-self.model_len // self.tokens_per_block(group))
        return self.max_num_blocks_per_req

    def row_source(self, group: int) -> str:
        """Which config field sets ``group``'s row width (for error messages)."""
        if self.groups[group].max_num_blocks:
            return f"groups[{group}].max_num_blocks"
        if self.model_len:
            return "cdiv(max_model_len, block_size)"
        return "max_num_blocks_per_req"

    def row_tokens(self, group: int) -> int:
        """Positions an attention group's row spans on this rank's view; a
        narrow group (``GroupSpec.max_num_blocks``) keeps no KV past them."""
        return self.blocks_per_req_max(group) * self.tokens_per_block(group)

    def kept_slots(self, group: int, pos) -> tuple:
        """Where attention group ``group`` keeps positions ``pos`` on this rank:
        (kept bool, allocation column int64, offset in block int64) per
        position — kept iff this rank's DCP share (:func:`reference.dcp.local_slots`)
        and inside the group's row (a narrow group keeps none past it)."""
        from .dcp import local_slots

        local, col, off = local_slots(pos, self.groups[group].block_size, self.dcp_world_size,
                                      self.dcp_rank, self.cp_kv_cache_interleave_size)
        return local & (col < self.blocks_per_req_max(group)), col, off

    @property
    def narrow_groups(self) -> list[int]:
        """Attention groups whose rows are narrower than a request's positions."""
        return [g for g in self.attention_groups if self.groups[g].max_num_blocks]

    @property
    def full_width_groups(self) -> list[int]:
        """Attention groups whose rows span ``max_model_len``."""
        return [g for g in self.attention_groups if not self.groups[g].max_num_blocks]

    @cached_property
    def mamba_cache_mode(self) -> str:
        """vLLM's ``CacheConfig.mamba_cache_mode`` as this config implies it:
        :attr:`mamba_prefix_mode` (``"align"`` or ``"all"``) with prefix
        caching and Mamba groups, else ``"none"``.

        In all mode (vLLM's ``mamba_cache_mode="all"``, the first Mamba prefix
        caching: ``mamba_attn.py``'s ``_compute_prefix_caching_block_indices``)
        a request's Mamba row holds a state block in every column, allocated
        as an attention row is; a step's kernels read the initial state from
        the column of the last computed token, ``cdiv(num_computed,
        block_size) - 1``, write the state at each block boundary the chunk
        crosses into that block's column and the state at the chunk's end
        into the column of its last token, ``(seq_len - 1) // block_size`` —
        so a block whose tokens are all computed holds the state at its end,
        and a block a chunk ended inside holds a state short of its end until
        a later chunk crosses it.  Prefill chunks end anywhere; no copy runs
        before the forward.

        In align mode a Mamba group's ``block_size`` is tokens per state block:
        a request's row has one column per ``block_size`` tokens; its running
        state lives in the column of its last scheduled token,
        ``(seq_len - 1) // block_size``; the runner copies the state from the
        previous step's column into a new one before the forward (vLLM's
        ``preprocess_mamba``); a block whose tokens are all computed holds the
        state at its end and is registered in the prefix cache; prefill chunks
        end on block boundaries up to the prompt's last one (vLLM's
        ``_mamba_block_aligned_split``); a decode runs one token."""
        return self.mamba_prefix_mode if self.enable_prefix_caching and self.mamba_groups \
            else "none"

    def caches_state(self, group: int) -> bool:
        """Is ``group`` a Mamba group whose state blocks the prefix cache keeps
        (align or all mode): a full state block is registered like an
        attention block, a hit needs the state block at its end, and blocks
        before the last computed token's column are freed
        (``get_num_skipped_tokens`` = ``num_computed - 1``)."""
        return self.groups[group].kind == MAMBA and self.mamba_cache_mode != "none"

    @cached_property
    def quantized(self) -> bool:
        """Is the attention KV cache quantized (``kv_cache_dtype`` ``int8``)?"""
        return self.kv_cache_dtype == KV_INT8

    def state_floats(self, group: int) -> int:
        """Floats of one state of Mamba group ``group``: its conv part
        (``conv_size`` tokens) then its SSM part, each token ``head_size``."""
        return (self.groups[group].conv_size + 1) * self.head_size

    def has_null_block(self, group: int) -> bool:
        """Is block 0 of ``group`` the reserved null block?  Always, except a
        Mamba group under ``mamba_padding`` ``pad_slot_no_null``."""
        return not (self.groups[group].kind == MAMBA
                    and self.mamba_padding == PAD_SLOT_NO_NULL)

    @cached_property
    def scratch_null_groups(self) -> frozenset[int]:
        """Mamba groups whose block 0 is the reserved null block, which a dummy or
        padded row's state update may write (scratch); once per config."""
        return frozenset(g for g in self.mamba_groups if self.has_null_block(g))

    def null_block(self, group: int) -> int | None:
        """``group``'s null block id (0), or None where it has none."""
        return 0 if self.has_null_block(group) else None

    def empty_entry(self, group: int) -> int:
        """What an empty block-table entry of ``group`` holds: the null block
        (0), or ``PAD_SLOT_ID`` where block 0 is an ordinary block."""
        return 0 if self.has_null_block(group) else PAD_SLOT_ID

    @cached_property
    def empty_entries(self) -> tuple[int, ...]:
        """:meth:`empty_entry` of every group, in group order; once per config."""
        return tuple(self.empty_entry(g) for g in range(len(self.groups)))

    @property
    def mamba_pad_index(self) -> int:
        """The state index of a Mamba row padded to a capture size: the null
        block (``null``) or ``PAD_SLOT_ID`` (``pad_slot``, ``pad_slot_no_null``)."""
        return 0 if self.mamba_padding == NULL_PAD else PAD_SLOT_ID

    def pads_with_null(self, group: int) -> bool:
        """Align mode's Mamba groups: a request's block list holds the null block
        in the columns whose state is not kept (vLLM's align-mode
        ``MambaManager``); elsewhere the null block is only a freed entry."""
        return self.groups[group].kind == MAMBA and self.mamba_cache_mode == ALIGN

    def hit_columns(self, group: int, hit_tokens: int) -> int:
        """Entries of ``group``'s block list that a prefix hit of ``hit_tokens``
        fills: every full block for attention, ``hit // block_size`` for a Mamba
        group in align mode (null blocks, then the state block at the hit's
        end; all mode likewise), none for a Mamba group otherwise."""
        if self.groups[group].kind == MAMBA and not self.caches_state(group):
            return 0
        return hit_tokens // self.tokens_per_block(group)

    @cached_property
    def max_model_len(self) -> int:
        """Longest request in tokens: ``model_len`` when set, else what the
        narrowest attention row holds on this rank's view, at most 256 (the
        payload's position bound)."""
        if self.model_len:
            return self.model_len
        return min(min(self.max_num_blocks_per_req * self.tokens_per_block(g)
                       for g in self.full_width_groups), 256)

    @cached_property
    def mamba_columns(self) -> int:
        """State blocks a request holds in each Mamba group: ``1 + num_speculative_tokens``."""
        return 1 + self.num_speculative_tokens

    @property
    def draft_group(self) -> int | None:
        """The attention group whose block table the drafter shares (its draft
        layer's KV cache has that group's shape), or None without speculation."""
        return self.attention_groups[0] if self.num_speculative_tokens else None

    def shared_pages(self) -> dict[int, int]:
        """With ``kv_sharing``: {attention group: Mamba group} whose tensors are
        one — ``sharing_map`` when the config names the pairs, else the i-th
        attention group with the i-th Mamba group, as vLLM's hybrid allocator
        pairs layers across groups (its ``KVCacheTensor.shared_by``); else {}."""
        if not self.kv_sharing:
            return {}
        if self.sharing_map:
            return dict(self.sharing_map)
        return dict(zip(self.attention_groups, self.mamba_groups))

    def page_partner(self, group: int) -> int | None:
        """The group whose view shares ``group``'s pages, or None."""
        pairs = self.shared_pages()
        back = {m: a for a, m in pairs.items()}
        return pairs.get(group, back.get(group))

    @cached_property
    def prefix_unit(self) -> int:
        """Prefix-cache hits are multiples of this many tokens: the least common
        multiple of the attention groups' block sizes — and, with Mamba prefix
        caching, the Mamba groups' (vLLM's scheduler block size for a hybrid model)."""
        import math

        groups = self.attention_groups + [g for g in self.mamba_groups if self.caches_state(g)]
        return math.lcm(*(self.tokens_per_block(g) for g in groups))

    def tokens_per_block(self, group: int) -> int:
        """Positions one allocation block covers on this rank's view (x dcp_world_size)."""
        return self._tokens_per_block[group]

    @cached_property
    def _tokens_per_block(self) -> tuple[int, ...]:
        """:meth:`tokens_per_block` of every group, in group order; once per config."""
        return tuple(spec.block_size * (self.dcp_world_size if spec.kind == ATTENTION else 1)
                     for spec in self.groups)

    def padded_num_tokens(self, num_tokens: int) -> int | None:
        """Smallest capture size >= ``num_tokens``, or None when none fits."""
        for size in self.cudagraph_capture_sizes:
            if size >= num_tokens:
                return size
        return None

    @cached_property
    def uniform_query_len(self) -> int:
        """Tokens per row of a uniform decode batch: ``1 + num_speculative_tokens``
        (vLLM's ``uniform_decode_query_len``: a decode verifies its k drafts)."""
        return 1 + self.num_speculative_tokens

    def full_sizes(self, query_len: int | None = None) -> tuple[int, ...]:
        """Capture sizes with a FULL graph for batches of ``query_len`` tokens
        per row (default :attr:`uniform_query_len`; the drafter's passes: 1):
        those a uniform batch fills exactly, ``size % query_len == 0`` with at
        most ``max_num_reqs`` rows — or every size with ``cudagraph_support``
        ``ALWAYS``.  vLLM captures its uniform-decode FULL graphs at sizes that
        are multiples of ``1 + k`` (``uniform_decode_query_len``); a batch
        padded to a size without one runs PIECEWISE (before vLLM PR #53407)."""
        q = self.uniform_query_len if query_len is None else query_len
        if self.cudagraph_support == ALWAYS:
            return tuple(self.cudagraph_capture_sizes)
        return tuple(s for s in self.cudagraph_capture_sizes
                     if s % q == 0 and s // q <= self.max_num_reqs)

    @property
    def full_capture_sizes(self) -> tuple[int, ...]:
        """The target model's FULL capture sizes (:meth:`full_sizes`)."""
        return self.full_sizes()

    def full_graph_rows(self, size: int, query_len: int | None = None) -> int:
        """Batch rows a FULL graph of capture size ``size`` runs over: ``size //
        query_len`` (default :attr:`uniform_query_len`), or with
        ``cudagraph_support`` ``ALWAYS`` ``min(size, max_num_reqs)`` (one
        mixed-batch graph per size)."""
        q = self.uniform_query_len if query_len is None else query_len
        if self.cudagraph_support == ALWAYS:
            return min(size, self.max_num_reqs)
        return size // q

    def capture_rows(self, size: int) -> int:
        """Rows of the start-up dummy run at capture size ``size``: its FULL
        graph's rows where it has one, else ``min(size, max_num_reqs)`` (a
        PIECEWISE warm-up)."""
        if size in self.full_capture_sizes:
            return self.full_graph_rows(size)
        return min(size, self.max_num_reqs)

    # -- (de)serialisation -------------------------------------------------
    def to_json(self) -> dict:
        return {
            "runner": self.runner,
            "groups": [
                {"kind": g.kind, "block_size": g.block_size,
                 "kernel_block_size": g.kernel_block_size}
                | ({"slot_buffer": True} if g.slot_buffer else {})
                | ({"sliding_window": g.sliding_window} if g.sliding_window else {})
                | ({"conv_size": g.conv_size} if g.conv_size else {})
                | ({"max_num_blocks": g.max_num_blocks} if g.max_num_blocks else {})
                for g in self.groups
            ],
            "num_blocks": self.num_blocks,
            "max_num_reqs": self.max_num_reqs,
            "max_num_blocks_per_req": self.max_num_blocks_per_req,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "cudagraph_capture_sizes": list(self.cudagraph_capture_sizes),
            "head_size": self.head_size,
            "dcp_world_size": self.dcp_world_size,
            "dcp_rank": self.dcp_rank,
            "cp_kv_cache_interleave_size": self.cp_kv_cache_interleave_size,
        } | ({"reorder_batch_threshold": self.reorder_batch_threshold}
             if self.reorder_batch_threshold else {}) \
          | ({"cudagraph_support": self.cudagraph_support}
             if self.cudagraph_support != UNIFORM_BATCH else {}) \
          | ({"num_speculative_tokens": self.num_speculative_tokens}
             if self.num_speculative_tokens else {}) \
          | ({"allocator": self.allocator} if self.allocator != TRACE else {}) \
          | ({"enable_prefix_caching": True} if self.enable_prefix_caching else {}) \
          | ({"kv_sharing": True} if self.kv_sharing else {}) \
          | ({"max_model_len": self.model_len} if self.model_len else {}) \
          | ({"mamba_padding": self.mamba_padding} if self.mamba_padding != NULL_PAD else {}) \
          | ({"kv_cache_dtype": self.kv_cache_dtype} if self.kv_cache_dtype != KV_AUTO else {}) \
          | ({"kv_sharing_map": [list(p) for p in self.sharing_map]} if self.sharing_map else {}) \
          | ({"host_blocks": self.host_blocks} if self.host_blocks else {}) \
          | ({"mamba_cache_mode": self.mamba_prefix_mode}
             if self.mamba_prefix_mode != ALIGN else {})

    @classmethod
    def from_json(cls, obj) -> "RunnerConfig":
        """Build from a trace's ``config`` object; raises :class:`ConfigError`."""
        if not isinstance(obj, dict):
            raise ConfigError("", "must be an object")
        known = {"runner", "groups", "num_blocks", "max_num_reqs",
                 "max_num_blocks_per_req", "max_num_batched_tokens",
                 "cudagraph_capture_sizes", "head_size", "dcp_world_size", "dcp_rank",
                 "cp_kv_cache_interleave_size", "reorder_batch_threshold",
                 "cudagraph_support", "num_speculative_tokens", "allocator",
                 "enable_prefix_caching", "kv_sharing", "max_model_len", "mamba_padding",
                 "kv_cache_dtype", "kv_sharing_map", "host_blocks", "mamba_cache_mode"}
        for key in sorted(obj):
            if key not in known:
                raise ConfigError(key, "unknown field")
        kwargs = {}
        for key in sorted(known - {"runner", "groups", "cudagraph_capture_sizes",
                                   "cudagraph_support", "allocator",
                                   "enable_prefix_caching", "kv_sharing", "max_model_len",
                                   "mamba_padding", "kv_cache_dtype", "kv_sharing_map",
                                   "mamba_cache_mode"}):
            if key in obj:
                kwargs[key] = _int(obj[key], key)
        if "max_model_len" in obj:
            kwargs["model_len"] = _int(obj["max_model_len"], "max_model_len")
            _bound(kwargs["model_len"], 1, 256, "max_model_len")
            if "max_num_blocks_per_req" not in obj:  # the widest row, as derived
                probe = cls(**{k: v for k, v in kwargs.items() if k != "model_len"})
                kwargs["max_num_blocks_per_req"] = max(
                    -(-kwargs["model_len"] // probe.tokens_per_block(g))
                    for g in probe.attention_groups)
        for key in ("runner", "cudagraph_support", "allocator", "mamba_padding",
                    "kv_cache_dtype"):
            if key in obj:
                kwargs[key] = obj[key]
        if "mamba_cache_mode" in obj:
            kwargs["mamba_prefix_mode"] = obj["mamba_cache_mode"]
        for key in ("enable_prefix_caching", "kv_sharing"):
            if key in obj:
                if not isinstance(obj[key], bool):
                    raise ConfigError(key, f"must be true or false, got {obj[key]!r}")
                kwargs[key] = obj[key]
        if "kv_sharing_map" in obj:
            pairs = obj["kv_sharing_map"]
            if not isinstance(pairs, list) or not all(
                    isinstance(p, list) and len(p) == 2 for p in pairs):
                raise ConfigError("kv_sharing_map", "must be a list of [attention group, "
                                  "Mamba group] pairs")
            kwargs["sharing_map"] = tuple(
                (_int(a, f"kv_sharing_map[{i}][0]"), _int(m, f"kv_sharing_map[{i}][1]"))
                for i, (a, m) in enumerate(pairs))
        if "groups" in obj:
            groups = obj["groups"]
            if not isinstance(groups, list):
                raise ConfigError("groups", "must be a list")
            specs = []
            for i, g in enumerate(groups):
                if not isinstance(g, dict):
                    raise ConfigError(f"groups[{i}]", "must be an object")
                for key in sorted(g):
                    if key not in ("kind", "block_size", "kernel_block_size", "slot_buffer",
                                   "sliding_window", "conv_size", "max_num_blocks"):
                        raise ConfigError(f"groups[{i}].{key}", "unknown field")
                if "kind" not in g or "block_size" not in g:
                    raise ConfigError(f"groups[{i}]", "needs 'kind' and 'block_size'")
                bs = _int(g["block_size"], f"groups[{i}].block_size")
                kbs = _int(g.get("kernel_block_size", bs), f"groups[{i}].kernel_block_size")
                own = g.get("slot_buffer", False)
                if not isinstance(own, bool):
                    raise ConfigError(f"groups[{i}].slot_buffer", f"must be true or false, "
                                      f"got {own!r}")
                window = _int(g.get("sliding_window", 0), f"groups[{i}].sliding_window")
                conv = _int(g.get("conv_size", 0), f"groups[{i}].conv_size")
                narrow = _int(g.get("max_num_blocks", 0), f"groups[{i}].max_num_blocks")
                specs.append(GroupSpec(g["kind"], bs, kbs, own, window, conv, narrow))
            kwargs["groups"] = tuple(specs)
        if "cudagraph_capture_sizes" in obj:
            sizes = obj["cudagraph_capture_sizes"]
            if not isinstance(sizes, list):
                raise ConfigError("cudagraph_capture_sizes", "must be a list")
            kwargs["cudagraph_capture_sizes"] = tuple(
                _int(s, f"cudagraph_capture_sizes[{i}]") for i, s in enumerate(sizes))
        return cls(**kwargs)

    def validate(self) -> None:
        """Raise :class:`ConfigError` for the first field out of bounds."""
        if self.runner not in RUNNERS:
            raise ConfigError("runner", f"{self.runner!r} not one of {list(RUNNERS)}")
        if not 1 <= len(self.groups) <= NUM_GROUPS_MAX:
            raise ConfigError("groups", f"need 1..{NUM_GROUPS_MAX} groups")
        for i, g in enumerate(self.groups):
            if g.kind not in GROUP_KINDS:
                raise ConfigError(f"groups[{i}].kind", f"{g.kind!r} not one of {list(GROUP_KINDS)}")
            _bound(g.block_size, 1, BLOCK_SIZE_MAX if g.kind == ATTENTION else 1024,
                   f"groups[{i}].block_size")
            if g.kind == MAMBA and g.kernel_block_size != g.block_size:
                raise ConfigError(f"groups[{i}].kernel_block_size",
                                  "a mamba group has no kernel blocks: must equal block_size")
            if not 1 <= g.kernel_block_size <= g.block_size or g.block_size % g.kernel_block_size:
                raise ConfigError(f"groups[{i}].kernel_block_size",
                                  f"{g.kernel_block_size} is not a divisor of block_size "
                                  f"{g.block_size} (1..{g.block_size}, dividing it)")
            if g.sliding_window:
                if g.kind != ATTENTION:
                    raise ConfigError(f"groups[{i}].sliding_window", "only an attention group "
                                      "has a sliding window")
                _bound(g.sliding_window, 1, 256, f"groups[{i}].sliding_window")
                if self.allocator != ENGINE or self.dcp_world_size != 1:
                    raise ConfigError(f"groups[{i}].sliding_window", "needs allocator 'engine' "
                                      "(its KV-cache manager frees blocks leaving the window) "
                                      "and dcp_world_size 1 (not modelled yet)")
                if self.enable_prefix_caching and (self.mamba_groups or (
                        self.num_speculative_tokens and len(self.groups) > 1)):
                    raise ConfigError(f"groups[{i}].sliding_window", "with prefix caching "
                                      "needs no Mamba group, and with a drafter no other "
                                      "group (not modelled yet)")
            if g.conv_size:
                if g.kind != MAMBA:
                    raise ConfigError(f"groups[{i}].conv_size", "only a Mamba group keeps a "
                                      "convolution state")
                _bound(g.conv_size, 0, CONV_SIZE_MAX, f"groups[{i}].conv_size")
            if g.slot_buffer and g.kind != ATTENTION:
                raise ConfigError(f"groups[{i}].slot_buffer", "only an attention backend keeps "
                                  "a slot buffer (a mamba group has no slot mapping)")
        if not self.attention_groups:
            raise ConfigError("groups", "need at least one attention group")
        for i, g in enumerate(self.groups):
            if not g.max_num_blocks:
                continue
            where = f"groups[{i}].max_num_blocks"
            if g.kind != ATTENTION:
                raise ConfigError(where, "only an attention group has a row of its own width")
            _bound(g.max_num_blocks, 1, MAX_NUM_BLOCKS_PER_REQ_MAX, where)
            if i == self.attention_groups[0]:
                raise ConfigError(where, "the first attention group's row spans "
                                  "max_model_len (it sets max_model_len, and a drafter writes "
                                  "through it); narrow a later attention group")
            for name, on in (("sliding_window", g.sliding_window),
                             ("enable_prefix_caching", self.enable_prefix_caching),
                             ("host_blocks", self.host_blocks), ("kv_sharing", self.kv_sharing)):
                if on:
                    raise ConfigError(where, f"a narrow row with {name} is not modelled yet")
        _bound(self.num_blocks, 2, NUM_BLOCKS_MAX, "num_blocks")
        _bound(self.max_num_reqs, 1, MAX_NUM_REQS_MAX, "max_num_reqs")
        _bound(self.max_num_blocks_per_req, 1, MAX_NUM_BLOCKS_PER_REQ_MAX,
               "max_num_blocks_per_req")
        _bound(self.max_num_batched_tokens, 1, MAX_NUM_BATCHED_TOKENS_MAX,
               "max_num_batched_tokens")
        _bound(self.head_size, 1, HEAD_SIZE_MAX, "head_size")
        if self.head_size & (self.head_size - 1):
            raise ConfigError("head_size", "must be a power of two")
        sizes = self.cudagraph_capture_sizes
        if list(sizes) != sorted(set(sizes)):
            raise ConfigError("cudagraph_capture_sizes", "must be ascending and distinct")
        for i, s in enumerate(sizes):
            _bound(s, 1, self.max_num_batched_tokens, f"cudagraph_capture_sizes[{i}]")
        if self.dcp_world_size not in (1, 2, 4):
            raise ConfigError("dcp_world_size", f"{self.dcp_world_size} not one of [1, 2, 4]")
        _bound(self.dcp_rank, 0, self.dcp_world_size - 1, "dcp_rank")
        interleave = self.cp_kv_cache_interleave_size
        _bound(interleave, 1, BLOCK_SIZE_MAX, "cp_kv_cache_interleave_size")
        for g in self.attention_groups:
            if self.groups[g].block_size % interleave:
                raise ConfigError("cp_kv_cache_interleave_size",
                                  f"{interleave} must divide every attention block_size")
        _bound(self.reorder_batch_threshold, 0, self.max_num_batched_tokens,
               "reorder_batch_threshold")
        if self.cudagraph_support not in CUDAGRAPH_SUPPORTS:
            raise ConfigError("cudagraph_support", f"{self.cudagraph_support!r} not one of "
                              f"{list(CUDAGRAPH_SUPPORTS)}")
        if self.cudagraph_support == ALWAYS and self.mamba_groups:
            raise ConfigError("cudagraph_support", "ALWAYS needs a config without Mamba "
                              "groups (Mamba backends capture uniform batches only)")
        _bound(self.num_speculative_tokens, 0, SPECULATIVE_TOKENS_MAX, "num_speculative_tokens")
        if self.reorder_batch_threshold and self.runner != "v1":
            raise ConfigError("reorder_batch_threshold", "batch reordering is V1's (the "
                              "persistent batch); V2 batches are built per step: use 0")
        if self.allocator not in ALLOCATORS:
            raise ConfigError("allocator", f"{self.allocator!r} not one of {list(ALLOCATORS)}")
        if self.enable_prefix_caching:
            if self.allocator != ENGINE:
                raise ConfigError("enable_prefix_caching", "needs allocator 'engine' (the "
                                  "target's KV-cache manager keeps the prefix cache)")
            if self.mamba_groups and self.num_speculative_tokens \
                    and self.mamba_prefix_mode == ALL:
                raise ConfigError("mamba_cache_mode", "'all' needs num_speculative_tokens 0 "
                                  "(all mode's speculative state columns are not modelled; "
                                  "align mode's are)")
            for g in self.mamba_groups if self.num_speculative_tokens else ():
                if 1 + self.num_speculative_tokens > self.groups[g].block_size:
                    raise ConfigError(f"groups[{g}].block_size", "align mode with a drafter "
                                      "needs a Mamba block of at least 1 + "
                                      "num_speculative_tokens tokens (a verification crosses "
                                      "at most one block boundary; vLLM's align-mode Mamba "
                                      "blocks are hundreds of tokens)")
            if len({self.groups[g].block_size for g in self.mamba_groups}) > 1:
                raise ConfigError("groups", f"{self.mamba_prefix_mode} mode needs one block "
                                  "size for every Mamba group (vLLM's hybrid models have one "
                                  "MambaSpec)")
            for g in self.mamba_groups if self.mamba_prefix_mode == ALIGN else ():
                if self.groups[g].block_size > self.max_num_batched_tokens:
                    raise ConfigError(f"groups[{g}].block_size", "align mode needs a Mamba "
                                      "block size <= max_num_batched_tokens (a prefill chunk "
                                      "ends on a Mamba block boundary)")
            if self.mamba_groups and self.reorder_batch_threshold > 1 + self.num_speculative_tokens:
                raise ConfigError("reorder_batch_threshold", f"{self.mamba_prefix_mode} mode "
                                  "decodes at most 1 + num_speculative_tokens tokens per step: "
                                  f"use at most {1 + self.num_speculative_tokens}")
            if self.dcp_world_size != 1:
                raise ConfigError("enable_prefix_caching", "needs dcp_world_size 1 (prefix "
                                  "caching under DCP is not modelled)")
        if self.mamba_prefix_mode not in MAMBA_PREFIX_MODES:
            raise ConfigError("mamba_cache_mode", f"{self.mamba_prefix_mode!r} not one of "
                              f"{list(MAMBA_PREFIX_MODES)}")
        if self.mamba_prefix_mode == ALL and not (self.enable_prefix_caching
                                                  and self.mamba_groups):
            raise ConfigError("mamba_cache_mode", "'all' needs enable_prefix_caching true and "
                              "a Mamba group (it is how Mamba prefix caching keeps states)")
        _bound(self.host_blocks, 0, HOST_BLOCKS_MAX, "host_blocks")
        if self.host_blocks:
            if not self.attention_groups:
                raise ConfigError("host_blocks", "a host tier holds attention KV: needs an "
                                  "attention group")
            if any(g.sliding_window for g in self.groups):
                raise ConfigError("host_blocks", "a host tier with sliding windows is not "
                                  "modelled (a window frees blocks under an offload)")
            if self.dcp_world_size != 1:
                raise ConfigError("host_blocks", "a host tier under DCP is not modelled: "
                                  "use dcp_world_size 1")
        if self.sharing_map:
            if not self.kv_sharing:
                raise ConfigError("kv_sharing_map", "needs kv_sharing true (it says which "
                                  "groups share pages)")
            seen = set()
            for i, (a, m) in enumerate(self.sharing_map):
                if a not in self.attention_groups or m not in self.mamba_groups:
                    raise ConfigError(f"kv_sharing_map[{i}]", f"[{a}, {m}] is not [an attention "
                                      f"group, a Mamba group] (attention groups "
                                      f"{self.attention_groups}, Mamba groups "
                                      f"{self.mamba_groups})")
                if a in seen or m in seen:
                    raise ConfigError(f"kv_sharing_map[{i}]", f"group {a if a in seen else m} "
                                      "shares its tensor twice")
                seen |= {a, m}
        if self.kv_sharing:
            if not self.mamba_groups:
                raise ConfigError("kv_sharing", "needs a Mamba group (attention and Mamba "
                                  "layers share pages)")
            if self.num_speculative_tokens:
                raise ConfigError("kv_sharing", "needs num_speculative_tokens 0 (the draft "
                                  "layer's tensor in the shared layout is not modelled yet)")
            if self.enable_prefix_caching:
                raise ConfigError("kv_sharing", "not with prefix caching yet (shared-pool "
                                  "evictions across groups are not modelled)")
            for a, m in self.shared_pages().items():
                if self.groups[a].block_size * self.head_size < self.state_floats(m):
                    raise ConfigError(f"groups[{a}].block_size", f"with kv_sharing a page of "
                                      f"{self.groups[a].block_size} tokens x {self.head_size} "
                                      f"floats cannot hold group {m}'s "
                                      f"{self.state_floats(m)}-float Mamba state (the engine "
                                      "derives the block size from the state: "
                                      "hybrid_attention_block_size)")
            least = len(self.attention_groups) + self.mamba_columns * len(self.mamba_groups)
            if self.num_blocks < 1 + least:
                raise ConfigError("num_blocks", f"{self.num_blocks} with kv_sharing: one pool "
                                  f"must hold the null block and a request's {least} blocks "
                                  "(one per attention group, one per Mamba column)")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ConfigError("kv_cache_dtype", f"{self.kv_cache_dtype!r} not one of "
                              f"{list(KV_CACHE_DTYPES)}")
        if self.kv_cache_dtype == KV_INT8 and self.kv_sharing:
            raise ConfigError("kv_cache_dtype", "int8 needs kv_sharing off (a Mamba state "
                              "view over quantized pages is not modelled)")
        if self.mamba_padding not in MAMBA_PADDINGS:
            raise ConfigError("mamba_padding", f"{self.mamba_padding!r} not one of "
                              f"{list(MAMBA_PADDINGS)}")
        if self.mamba_padding != NULL_PAD and not self.mamba_groups:
            raise ConfigError("mamba_padding", "needs a Mamba group (it is the Mamba state "
                              "indices' padding convention)")
        if self.mamba_padding == PAD_SLOT_NO_NULL:
            if self.enable_prefix_caching:
                raise ConfigError("mamba_padding", "pad_slot_no_null needs prefix caching off "
                                  "(Mamba prefix caching pads a Mamba row with the null block)")
            if self.kv_sharing:
                raise ConfigError("mamba_padding", "pad_slot_no_null needs kv_sharing off "
                                  "(block 0 is the attention null page every group shares)")
        if self.model_len:
            _bound(self.model_len, 1, 256, "max_model_len")
            widest = max(self.blocks_per_req_max(g) for g in self.full_width_groups)
            if self.max_num_blocks_per_req != widest:
                raise ConfigError("max_num_blocks_per_req", f"with max_model_len "
                                  f"{self.model_len} must be the widest attention row, "
                                  f"{widest} (cdiv(max_model_len, block_size * "
                                  "dcp_world_size) per group)")
        for g in self.narrow_groups:
            if self.row_tokens(g) >= self.max_model_len:
                raise ConfigError(f"groups[{g}].max_num_blocks", f"a row of "
                                  f"{self.groups[g].max_num_blocks} blocks spans "
                                  f"{self.row_tokens(g)} positions, not fewer than "
                                  f"max_model_len {self.max_model_len}: drop the field")
        for g in self.attention_groups:
            if self.groups[g].block_size * self.blocks_per_req_max(g) > 256:
                raise ConfigError(f"groups[{g}].block_size",
                                  "block_size * the row's width (max_num_blocks_per_req) "
                                  "must be <= 256")


# RunnerConfig's cached_property names (left out of its pickled state).
_DERIVED = frozenset(name for name, v in vars(RunnerConfig).items()
                     if isinstance(v, cached_property))


def hybrid_attention_block_size(state_floats: int, head_size: int, kernel_alignment: int) -> int:
    """The attention block size a hybrid model's engine derives so that one
    attention page holds one Mamba state (vLLM's hybrid-model config update:
    the least multiple of the kernel block alignment whose page — ``block_size
    * head_size`` floats here — is at least the Mamba page).  Sizes that are not
    powers of two follow (48 for a 3-kernel-block page)."""
    tokens = -(-state_floats // head_size)
    return kernel_alignment * -(-tokens // kernel_alignment)


def _int(value, field_path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(field_path, f"must be an integer, got {value!r}")
    return value


def _bound(value: int, lo: int, hi: int, field_path: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(field_path, f"must be an integer, got {value!r}")
    if not lo <= value <= hi:
        raise ConfigError(field_path, f"{value} out of bounds [{lo}, {hi}]")
