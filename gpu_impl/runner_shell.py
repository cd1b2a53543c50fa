"""The model-runner shell the V1 and V2 runners share: buffers, kernels, padding,
graphs — fault-free, for any engine's block-table classes.

Our own implementation of the block-table-facing parts of vLLM's model runners
(``vllm/v1/worker/gpu_model_runner.py``, ``vllm/v1/worker/gpu/model_runner.py``):

- ``execute_model`` asks the subclass for the batch (``_batch``) and to stage
  its block tables (V1: commit the persistent rows; V2: gather the staged rows
  into the input block tables), then stages the persistent metadata buffers
  (token payloads, query start locations, sequence lengths, slot mappings
  through a Triton kernel, Mamba state indices from ``block_table[:, 0]``)
  and runs the forward — eagerly (``NONE``, ``PIECEWISE``: metadata rebuilt
  every step, tokens padded to a capture size) or by replaying a ``FULL``
  graph that reads the persistent buffers.
- ``dummy_run`` is an idle data-parallel rank's padded fake batch: NaN payload,
  slot mappings PAD-filled and metadata re-staged from the block tables the
  dummy run is handed (``_prepare_dummy``) — also before a FULL replay.
- Graphs are captured at start-up through dummy runs, one per capture size,
  largest first (after an eager warm-up on CUDA, to compile).
- :meth:`RunnerShell.snapshot` reports the runner's observable state, the
  addresses graphs read taken from their recorded launches.

Nothing here consults a fault: gpu_impl's runners (:mod:`gpu_impl.model_runner`,
:mod:`gpu_impl.model_runner_v2`) add theirs by overriding the hooks at the
places the upstream bugs lived; other engines' adapters (``harness/targets/vllm.py``)
subclass :mod:`gpu_impl.runner_shell_v1` / :mod:`gpu_impl.runner_shell_v2`.
"""

from __future__ import annotations

import abc

import numpy as np
import torch

from reference.runner import ForwardInfo  # the record type every runner reports; no oracle logic

from .attention import paged_attention_read, quantize_rows, reshape_and_cache
from .block_table import CpuGpuBuffer, compute_slot_mapping
from .cuda_graph import Graph, record_launches
from .mamba import mamba_state_update

NONE, PIECEWISE, FULL = "NONE", "PIECEWISE", "FULL"
NULL_BLOCK_ID = 0
PAD_SLOT_ID = -1
SENTINEL = -7.0  # what a freed block is poisoned with (finite, no payload uses it)


def token_payload(req: int, positions: np.ndarray, head_size: int) -> np.ndarray:
    """The model's stand-in activations of ``req``'s own tokens (id ``req * 256 +
    pos``): float32 (N, head_size), integer-valued."""
    return ids_payload(req * 256 + positions.astype(np.int64), head_size)


def ids_payload(token_ids: np.ndarray, head_size: int) -> np.ndarray:
    """The model's stand-in activations of token ids: float32 (N, head_size),
    ``id * 4 + d + 1`` (a function of the input token, as a real model's KV is)."""
    d = np.arange(head_size, dtype=np.int64)
    return (np.asarray(token_ids, np.int64)[:, None] * 4 + d + 1).astype(np.float32)


def _differs(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """bool (len(a),): whether each block (first dimension) of ``a`` and ``b``
    differs; NaN equals NaN (a NaN left in place is not a write)."""
    same = a == b
    if a.is_floating_point():
        same |= torch.isnan(a) & torch.isnan(b)
    return ~same.reshape(a.shape[0], -1).all(1)


def host(t: torch.Tensor) -> np.ndarray:
    """A NumPy copy of a (device) tensor."""
    return t.detach().cpu().numpy().copy()


class CachedRequestState:
    """What the runner keeps for a live request, in the batch or not."""

    def __init__(self, req: int, prompt_len: int, block_ids: list[list[int]],
                 num_computed_tokens: int = 0, prompt_token_ids=None):
        self.req = req
        self.prompt_len = prompt_len
        self.block_ids = [list(b) for b in block_ids]
        self.num_computed_tokens = num_computed_tokens
        self.num_accepted = 1  # the sampler's last kept count (speculative decoding)
        self.prompt_token_ids = (req * 256 + np.arange(prompt_len, dtype=np.int64)
                                 if prompt_token_ids is None
                                 else np.asarray(prompt_token_ids, np.int64))

    def token_ids(self, positions: np.ndarray) -> np.ndarray:
        """Token ids at ``positions``: the prompt's, then the request's own."""
        pos = np.asarray(positions, np.int64)
        out = self.req * 256 + pos
        inside = pos < self.prompt_len
        out[inside] = self.prompt_token_ids[pos[inside]]
        return out


# Tests set this to run the CUDA-only start-up warm-up forward under the
# interpreter too (it only costs launches there).
_WARMUP_FORWARD_ON_CPU = False


class RunnerShell(abc.ABC):
    """Shared runner. config: a ``reference.RunnerConfig``-shaped object (read for
    its fields only); device: torch.device.

    Tensors: ``kv_caches[g]`` float32 (num_blocks, block_size, head_size) — with
    ``kv_cache_dtype`` ``int8`` uint8, and ``kv_params[g]`` float32 (num_blocks,
    block_size, 2) the scale and zero point of each slot —,
    ``mamba_states[g]`` float32 (num_blocks, head_size), persistent buffers in
    :meth:`buffers`.  ``last_forward``: :class:`reference.ForwardInfo` of the last
    step or dummy run; ``dummy_read``: per group, the block table the last dummy
    run's state-index staging and kernels were handed.
    """

    def __init__(self, config, device: torch.device):
        self.config = cfg = config
        self.device = device
        # Start-up warm-ups run the forward eagerly before capture (to compile
        # the kernels): on CUDA only, unless a test asks for it on the CPU.
        self.warmup_forward = device.type == "cuda" or _WARMUP_FORWARD_ON_CPU
        groups = cfg.groups
        self.attn_groups = [g for g, s in enumerate(groups) if s.kind == "attention"]
        self.mamba_groups = [g for g, s in enumerate(groups) if s.kind == "mamba"]
        self.requests: dict[int, CachedRequestState] = {}
        self.preempted: dict[int, CachedRequestState] = {}  # waiting to resume
        # Asynchronous KV loads in flight: handle -> (req, columns per group, the
        # writes it delivers); per request loading by transfers, columns landed.
        self.transfers: dict[int, tuple] = {}
        # Steps dispatched and not completed: (batch, accepted counts, the
        # blocks' content before the step wrote them), oldest first.
        self.steps_in_flight: list[tuple] = []
        # Copies to the host tier or the store whose reads were fixed at launch
        # (see :meth:`_launch_reads`): handle -> {group: (kv, params or None)}.
        self.early_reads: dict[int, dict] = {}
        # The external KV store a connector saves to: prefix token ids -> {group:
        # float32 (positions on this rank, head_size)}; stores in flight:
        # handle -> (key, per group (blocks, offsets) the copy reads).
        self.kv_store: dict[tuple, dict] = {}
        self.stores: dict[int, tuple] = {}
        self.landed: dict[int, list[list[int]]] = {}
        # Align mode: the column of each request's running Mamba state after its
        # latest step (vLLM's runner-side ``mamba_state_idx``).
        self.mamba_state_idx: dict[int, int] = {}
        self.align = cfg.mamba_cache_mode == "align"
        self.all_mode = cfg.mamba_cache_mode == "all"
        self.mamba_block_size = (groups[self.mamba_groups[0]].block_size if self.mamba_groups
                                 else 0)
        self.kv_caches, self.mamba_states, self.kv_params = {}, {}, {}
        for g in self.attn_groups:
            self.kv_caches[g] = self._cache((cfg.num_blocks, groups[g].block_size,
                                             cfg.head_size))
            if cfg.quantized:  # the payload and parameter buffers of the same content
                q, p = quantize_rows(self.kv_caches[g].view(-1, cfg.head_size))
                self.kv_caches[g] = q.view(self.kv_caches[g].shape)
                self.kv_params[g] = p.view(cfg.num_blocks, groups[g].block_size, 2)
        pages = {m: a for a, m in cfg.shared_pages().items()}
        for g in self.mamba_groups:
            if g in pages:  # kv_sharing: the state view of the attention group's pages
                self.mamba_states[g] = self._state_view(self.kv_caches[pages[g]], g)
            else:
                self.mamba_states[g] = self._cache((cfg.num_blocks, cfg.state_floats(g)))
        # The host tier's buffers (host_blocks > 0): per attention group, host
        # blocks laid out as the device cache's blocks (payload, and parameters
        # when quantized); offloads / onboards in flight: handle -> [(group,
        # device block, host slot)] the copy moves at its end.
        self.host_kv = {g: self.kv_caches[g].new_zeros((cfg.host_blocks,
                                                       *self.kv_caches[g].shape[1:]))
                        for g in self.attn_groups} if cfg.host_blocks else {}
        self.host_params = {g: p.new_zeros((cfg.host_blocks, *p.shape[1:]))
                            for g, p in self.kv_params.items()} if cfg.host_blocks else {}
        self.host_copies: dict[int, list[tuple[int, int, int]]] = {}
        self._init_buffers()
        self.graphs: dict[int, Graph] = {}
        self._graph_ptrs_memo: dict = {}  # bindings key -> graph_addresses(), a few kept
        self.last_forward: ForwardInfo | None = None
        self.dummy_read: list[torch.Tensor] | None = None
        self._init_tables()
        self._capture_model()

    def _row_widths(self) -> list[int]:
        """Block-table columns per group, as the engine sizes its tables (vLLM's
        ``InputBatch`` / ``BlockTables``: an attention group's row holds
        ``cdiv(max_model_len, block_size)`` blocks of its own block size)."""
        return [self.config.blocks_per_req_max(g) for g in range(len(self.config.groups))]

    def _mamba_pad_index(self) -> int:
        """The state index of a Mamba row padded to a capture size: the null
        block or ``PAD_SLOT_ID`` (``config.mamba_padding``)."""
        return self.config.mamba_pad_index

    def _mamba_pad_target(self, g: int) -> int | None:
        """Where group ``g``'s Mamba kernel sends a ``PAD_SLOT_ID`` state index:
        None, nowhere — the row is skipped (vLLM's ``selective_state_update``
        with ``pad_slot_id``); a block id, read and written as that block (a
        fault's path: a wrapper that remaps the sentinel before a kernel that
        cannot take it)."""
        return None

    def _mamba_skips_null(self, g: int) -> bool:
        """Does Mamba group ``g``'s kernel drop state writes into the null block?
        Where its pages are shared (``kv_sharing``): the null page is also the
        attention null block, which masked reads gather."""
        return self.config.page_partner(g) is not None

    def _state_view(self, kv_cache: torch.Tensor, g: int) -> torch.Tensor:
        """Mamba group ``g``'s state tensor over a shared KV tensor (vLLM's
        state-tensor builder in ``gpu_model_runner``): (num_blocks,
        state_floats) float32, one state — conv part, then SSM part — at the
        start of each page, the page size as its block stride."""
        pages = kv_cache.view(kv_cache.shape[0], -1)
        return torch.as_strided(pages, (pages.shape[0], self.config.state_floats(g)),
                                (pages.stride(0), 1))

    def _cache(self, shape) -> torch.Tensor:
        cache = torch.full(shape, SENTINEL, dtype=torch.float32, device=self.device)
        cache[NULL_BLOCK_ID] = 0.0
        return cache

    def _init_buffers(self) -> None:
        """Persistent input and metadata buffers: allocated once, graph-captured."""
        cfg, device = self.config, self.device
        rows, tokens, heads = cfg.max_num_reqs, cfg.max_num_batched_tokens, cfg.head_size
        self.req_indices = CpuGpuBuffer((tokens,), torch.int32, device)
        self.positions = CpuGpuBuffer((tokens,), torch.int64, device)
        self.hidden = CpuGpuBuffer((tokens, heads), torch.float32, device)
        self.query_start_loc = CpuGpuBuffer((rows + 1,), torch.int32, device)
        self.seq_lens = CpuGpuBuffer((rows,), torch.int32, device)
        self.has_initial_state = CpuGpuBuffer((rows,), torch.int32, device)
        self.slot_mappings = {g: torch.zeros(tokens, dtype=torch.int64, device=device)
                              for g in self.attn_groups}
        # Backends that keep their own slot buffer (GroupSpec.slot_buffer): their
        # metadata builder copies the generic slot mapping in; their KV write and
        # FULL graphs read it.
        self.backend_slots = {g: torch.zeros(tokens, dtype=torch.int64, device=device)
                              for g in self.attn_groups if cfg.groups[g].slot_buffer}
        # One state column per speculative position; all mode: the whole row.
        self.state_indices = {g: torch.zeros((rows, cfg.blocks_per_req_max(g) if self.all_mode
                                              else cfg.mamba_columns),
                                             dtype=torch.int32, device=device)
                              for g in self.mamba_groups}  # the decode buffer FULL graphs read
        # All mode's per-row block indices (persistent: FULL graphs read them).
        self.prefix_meta = CpuGpuBuffer((rows, 5), torch.int32, device)
        # The Mamba builder's per-row spec-decode metadata (persistent: FULL graphs
        # read it): last accepted count and spec-decode flag; and what each row's
        # kernel read its initial state through.
        self.num_accepted = CpuGpuBuffer((rows,), torch.int32, device, fill=1)
        self.spec_rows = CpuGpuBuffer((rows,), torch.int32, device)
        self.mamba_read = {g: torch.zeros(rows, dtype=torch.int32, device=device)
                           for g in self.mamba_groups}
        self._init_drafter()
        self.is_prefilling = np.zeros(rows, bool)  # host, per batch row of the last forward
        self.read_state_indices: dict[int, torch.Tensor] = {}  # what the last forward read
        self.attn_inputs: dict | None = None  # per attention group, what its builder handed over
        self.attn_out = {g: torch.zeros((rows, heads), dtype=torch.float32, device=device)
                         for g in self.attn_groups}

    def _init_drafter(self) -> None:
        """The drafter's layer and persistent inputs (vLLM's EAGLE proposer keeps
        its own ``positions``, hidden states and ``_slot_mapping_buffer``, sized
        for its CUDA graphs): nothing without speculative decoding."""
        cfg, device = self.config, self.device
        self.draft_group = cfg.draft_group
        self.draft_graphs: dict[int, Graph] = {}
        self.draft_rows: tuple | None = None  # (real rows, rows run) of the last pass
        if self.draft_group is None:
            return
        tokens, heads = cfg.max_num_batched_tokens, cfg.head_size
        self.draft_kv = self._cache(tuple(self.kv_caches[self.draft_group].shape))
        self.draft_req_indices = CpuGpuBuffer((tokens,), torch.int32, device, fill=-1)
        self.draft_positions = CpuGpuBuffer((tokens,), torch.int64, device)
        self.draft_hidden = CpuGpuBuffer((tokens, heads), torch.float32, device)
        # The first pass's slots (the target's, copied) and the single-token passes'
        # own slot buffer (what the drafter's FULL graphs read).
        self.draft_first_slots = torch.full((tokens,), PAD_SLOT_ID, dtype=torch.int64,
                                            device=device)
        self.draft_slots = torch.full((tokens,), PAD_SLOT_ID, dtype=torch.int64, device=device)

    # -- subclass hooks ----------------------------------------------------------
    @abc.abstractmethod
    def _init_tables(self) -> None:
        """Allocate the block tables."""

    @abc.abstractmethod
    def _rows_add(self, req: int, state: CachedRequestState) -> None:
        """A new request enters the tables."""

    @abc.abstractmethod
    def _rows_append(self, req: int, block_ids: list[list[int]]) -> None:
        """A live request's new blocks enter its row (if it has one)."""

    @abc.abstractmethod
    def _rows_remove(self, req: int) -> None:
        """A finished request leaves the tables."""

    @abc.abstractmethod
    def _set_num_computed(self, req: int, num_tokens: int) -> None:
        """Row-side token counter of ``req`` (kv_load)."""

    @abc.abstractmethod
    def _batch(self, scheduled: list) -> list[tuple[int, int, int]]:
        """(req, num_tokens, num_computed_tokens) per batch row, in batch order."""

    @abc.abstractmethod
    def _stage_tables(self, batch: list, reqs_padded: int) -> None:
        """Make :meth:`kernel_table` hold the batch's rows."""

    @abc.abstractmethod
    def _advance(self, batch: list) -> None:
        """Row-side token counters after a step."""

    @abc.abstractmethod
    def _prepare_dummy(self, reqs_padded: int, warmup: bool) -> list[torch.Tensor]:
        """The block table per group a dummy run reads, rows [0, reqs_padded) being
        what its kernels use (a view of :meth:`kernel_table`, whose storage graphs read)."""

    @abc.abstractmethod
    def _fill_dummy_slots(self, num_tokens: int, tokens_padded: int, warmup: bool) -> None:
        """PAD-fill the slot mappings a dummy run uses."""

    @abc.abstractmethod
    def _compute_slot_mapping(self, group: int, tokens_padded: int) -> None:
        """Slot mapping of the batch's tokens into ``slot_mappings[group]``."""

    @abc.abstractmethod
    def kernel_table(self, group: int) -> torch.Tensor:
        """The device block table kernels read for ``group``, int32 (max_num_reqs, width)."""

    @abc.abstractmethod
    def kernel_block_size(self, group: int) -> int:
        """Block size the kernels index ``kernel_table(group)`` with."""

    @abc.abstractmethod
    def _row_counters(self, reqs_padded: int) -> tuple[np.ndarray, np.ndarray]:
        """(num_computed_tokens, num_prompt_tokens) int32 (reqs_padded,) of batch rows
        [0, reqs_padded) as the runner's host rows hold them before this step
        advances them (rows past the batch: whatever those rows hold)."""

    @abc.abstractmethod
    def _row_accepted(self, num_reqs: int) -> np.ndarray:
        """Last accepted count of batch rows [0, num_reqs) as the runner's rows hold
        them (int32), before this step's sampler."""

    @abc.abstractmethod
    def _store_accepted(self, batch: list, kept: list[int]) -> None:
        """The sampler's kept counts of this step, per batch row, into the rows
        (vLLM ``_update_states_after_model_execute``)."""

    @abc.abstractmethod
    def _host_rows(self) -> dict:
        """The observation's host-row fields (``host_block_table``,
        ``host_num_blocks_per_row``, ``host_req_ids``, ``num_computed_tokens``,
        ``num_prompt_tokens``), NumPy copies."""

    def _stage_dummy_state_indices(self, tables: list, num_reqs: int, reqs_padded: int,
                                   mode: str, warmup: bool) -> None:
        """FULL replays read the persistent state indices: re-stage them from the
        dummy rows, never keep the previous real batch's (vLLM's ``_dummy_run``
        builds metadata for FULL dummy replays, ``for_cudagraph_capture``)."""
        self._build_mamba_metadata(reqs_padded, reqs_padded if mode == FULL else num_reqs,
                                   tables)

    def _classify(self, num_reqs: int, reqs_padded: int) -> None:
        """``is_prefilling`` of batch rows [0, reqs_padded): a row's computed
        tokens short of its prompt (vLLM ``_build_attention_metadata``), then
        :meth:`_clear_padded_prefilling`."""
        computed, prompt = self._row_counters(reqs_padded)
        self.is_prefilling[:reqs_padded] = computed < prompt
        self._clear_padded_prefilling(num_reqs, reqs_padded)

    def _clear_padded_prefilling(self, num_reqs: int, reqs_padded: int) -> None:
        """Rows padded for a FULL graph are no prefill, whatever counters a
        vacated row kept (vLLM's ``is_prefilling[num_reqs:] = False``: stale
        counters left by ``condense`` must not make padding a prefill)."""
        self.is_prefilling[num_reqs:reqs_padded] = False

    def _build_mamba_metadata(self, num_reqs: int, num_rows: int,
                              tables: list | None = None) -> None:
        """The Mamba backend's metadata builder (vLLM ``mamba_attn.py``:
        ``build`` + ``_update_metadata_for_cudagraph_capture``).

        Rows [0, num_rows) are classified: a row of at most 1 + k tokens (one
        without a drafter) whose prompt is done is a decode, and a one-token row
        with prior state is one even while prefilling; decodes come first, the first non-decode
        row starts the prefills.  State indices are column 0 of the rows
        (``tables[g]``, default the kernel table), rows past ``num_reqs``
        :meth:`_mamba_pad_index` (the null block or ``PAD_SLOT_ID``); with speculative decoding every state column of the rows
        (``block_table[:, :1 + k]``).  Only an all-decode batch of at most ``min(max_num_reqs,
        largest capture size)`` rows (vLLM's ``decode_cudagraph_max_bs``)
        refreshes the persistent decode buffer ``state_indices[g]`` that FULL
        graphs read — padded to ``num_rows`` likewise — and reads it;
        any other batch's kernels read a fresh tensor.
        """
        qsl = self.query_start_loc.np
        query_lens = np.diff(qsl[:num_rows + 1])
        seq_lens = self.seq_lens.np[:num_rows]
        prefilling = self.is_prefilling[:num_rows].copy()
        prefilling[prefilling & (seq_lens > query_lens) & (query_lens == 1)] = False
        # With speculative decoding a decode verifies its drafts: up to 1 + k
        # tokens (vLLM's decode_threshold = reorder_batch_threshold).
        decode = (query_lens <= self._decode_threshold()) & ~prefilling
        num_decodes = int(np.argmin(decode)) if not decode.all() else num_rows
        # vLLM's decode_cudagraph_max_bs: min(max_num_seqs, largest capture size).
        sizes = self.config.cudagraph_capture_sizes
        max_bs = min(self.config.max_num_reqs, max(sizes)) if sizes else 0
        ncol = self.config.mamba_columns
        first = torch.zeros((num_rows, 1), dtype=torch.int64, device=self.device)
        if self.all_mode:
            ncol = self.kernel_table(self.mamba_groups[0]).shape[1]
            self._stage_prefix_meta(num_rows, seq_lens, query_lens, decode)
        elif self.align:  # the last scheduled token's column (mamba_get_block_table_tensor),
            # within the row (a dummy row's seq_len may pass max_model_len)
            width = self.kernel_table(self.mamba_groups[0]).shape[1]
            first[:, 0] = torch.from_numpy(np.clip(
                (seq_lens.astype(np.int64) - 1) // self.mamba_block_size, 0,
                width - ncol)).to(self.device)
        take = first + torch.arange(ncol, device=self.device)
        for g in self.mamba_groups:
            table = self.kernel_table(g) if tables is None else tables[g]
            fresh = torch.gather(table[:num_rows], 1, take)
            fresh[num_reqs:] = self._mamba_pad_index()
            if num_decodes == num_rows and 0 < num_decodes <= max_bs:
                self.state_indices[g][:num_rows] = fresh
                self.read_state_indices[g] = self.state_indices[g][:num_rows]
            else:
                self.read_state_indices[g] = self._layer_state_indices(fresh, num_decodes)

    def _stage_prefix_meta(self, num_rows: int, seq_lens: np.ndarray, query_lens: np.ndarray,
                           decode: np.ndarray) -> None:
        """All mode: the Mamba builder's per-row block indices (vLLM's
        ``_compute_prefix_caching_block_indices``) into ``prefix_meta`` rows
        [0, num_rows): computed tokens ``s = seq_len - query_len``, the column
        of the last computed token ``cdiv(s, block_size) - 1``, of the first
        scheduled ``s // block_size`` and of the last scheduled ``(seq_len -
        1) // block_size`` (each at least 0, the last within the row), and
        whether the row is a prefill."""
        bs = self.mamba_block_size
        width = self.kernel_table(self.mamba_groups[0]).shape[1]
        seq = seq_lens.astype(np.int64)
        computed = seq - query_lens
        last = np.clip((seq - 1) // bs, 0, width - 1)
        meta = self.prefix_meta.np
        meta[:num_rows, 0] = computed
        meta[:num_rows, 1] = np.clip(-(-computed // bs) - 1, 0, width - 1)
        meta[:num_rows, 2] = np.clip(computed // bs, 0, last)
        meta[:num_rows, 3] = last
        meta[:num_rows, 4] = ~decode
        self.prefix_meta.copy_to_gpu(num_rows)

    def _mamba_state_grid(self) -> bool:
        """All mode: does the Mamba kernel put boundary states on its own chunks
        from the chunk's start (a fault's path) rather than the block grid?"""
        return False

    def _conv_to_source(self) -> bool:
        """All mode: does a short prefill chunk store its conv state through the
        block it read (a fault's path)?"""
        return False

    def _preprocess_mamba(self, batch: list) -> None:
        """Align mode, before the forward (vLLM's ``preprocess_mamba``): each
        request's running state moves to the column of its last scheduled
        token, ``cdiv(num_computed + n, block_size) - 1``, copied from the
        column it was in after its previous step; a request not seen yet
        starts from the column of its last computed token,
        ``(num_computed - 1) // block_size`` (its prefix hit's state block),
        unless its runner seeded one when it was added (V2).  Runs after the
        batch's rows are staged (batch row ``b`` of :meth:`kernel_table`)."""
        if not self.align:
            return
        bs = self.mamba_block_size
        spec = bool(self.config.num_speculative_tokens)
        accepted = self._row_accepted(len(batch)) if spec else None
        for b, (req, n, start) in enumerate(batch):
            prev = self.mamba_state_idx.get(req, (start - 1) // bs)
            curr = -(-(start + n) // bs) - 1
            self.mamba_state_idx[req] = curr
            if prev < 0 or prev == curr:
                continue
            # With a drafter the running state sits ``accepted - 1`` columns past
            # the previous running one (vLLM passes it as the copy's token bias);
            # once moved, the next read is at offset 0.
            src = prev + (max(int(accepted[b]), 1) - 1 if spec else 0)
            self._copy_state_columns(b, src, curr)
            if spec and self._resets_accepted():
                self._set_accepted(req, 1)

    def _copy_state_columns(self, b: int, src: int, dst: int) -> None:
        """Every Mamba group's state of batch row ``b``'s column ``src`` into its
        column ``dst``, through the batch row of the block table, as vLLM's
        align-mode copy kernels read it (``block_table[row, column]``): a column
        past the request's ids reads whatever the row holds there; past the
        row's width a GPU reads another row's memory — dropped here."""
        for g in self.mamba_groups:
            row = self.kernel_table(g)[b]
            if src < row.shape[0] and dst < row.shape[0]:
                self.mamba_states[g][row[dst].long()] = self.mamba_states[g][row[src].long()]

    def _resets_accepted(self) -> bool:
        """Does the align-mode migration reset the accepted count to 1 (a fault's
        path overrides it)?"""
        return True

    def _postprocess_bias(self, bias: int) -> int:
        """Columns past the running one that the postprocess copy reads the
        completed block's state from: the accepted-token bias (a fault's path
        overrides it)."""
        return bias

    def _postprocess_mamba(self, batch: list, kept: list[int], decode_of: dict) -> list[int]:
        """Align mode with a drafter, after the forward (vLLM's
        ``postprocess_mamba_fused_kernel``): per batch row, with ``running =
        num_computed + num_scheduled - num_drafts`` and ``aligned = (running +
        accepted - 1) // block_size * block_size``, a row whose accepted tokens
        reach ``aligned >= running`` copies the state of column ``running
        column + (aligned - running)`` into column ``aligned // block_size - 1``,
        the block they complete; when that is the running column the accepted
        count becomes 1.  Returns the accepted counts to store, per row."""
        if not self.align or not self.config.num_speculative_tokens:
            return list(kept)
        bs = self.mamba_block_size
        out = list(kept)
        for b, ((req, n, start), a) in enumerate(zip(batch, kept)):
            running = start + (1 if decode_of[req] else n)
            aligned = (running + a - 1) // bs * bs
            if aligned < running:
                continue
            bias, src, dest = aligned - running, self.mamba_state_idx[req], aligned // bs - 1
            if src == dest:
                out[b] = 1
                if bias == 0:
                    continue
            self._copy_state_columns(b, src + self._postprocess_bias(bias), dest)
        return out

    def _mamba_seed_block_size(self) -> int:
        """Tokens per column a runner seeds a new request's running Mamba column
        with: the Mamba block size (a fault's path overrides it)."""
        return self.mamba_block_size

    def _layer_state_indices(self, indices: torch.Tensor, num_decodes: int) -> torch.Tensor:
        """The state index each row's Mamba layer uses, from the builder's
        ``indices`` (batch order: the ``num_decodes`` decodes first, then the
        prefills): the decode part is ``indices[:num_decodes]``, the prefill part
        the rest (vLLM's mixers slice decodes first, as the batch is reordered)."""
        return indices

    def _decode_threshold(self) -> int:
        """Most tokens a row classified a decode by the Mamba builder runs."""
        return 1 + self.config.num_speculative_tokens

    def _column_unbounded(self) -> bool:
        """The Mamba kernel's running column without its lower bound (a fault's path)."""
        return False

    def _after_capture(self) -> None:
        """Called once the start-up graphs are captured (nothing to do here)."""

    def _report_width(self, group: int) -> int | None:
        """Block-table columns a snapshot reports (None: all the runner has)."""
        return None

    def dummy_tables_read(self) -> list | None:
        """Per group (the rows [0, num_reqs_padded) the last dummy run's metadata build
        and kernels were handed hold only the group's empty entry — zero, the
        null block, or ``PAD_SLOT_ID`` where block 0 is ordinary —, that tensor is a view of the persistent
        kernel table — what a FULL graph reads); None unless the last forward was a
        dummy run that built metadata (a V1 dummy run without it reads no table)."""
        last = self.last_forward
        if last is None or not last.dummy or not last.metadata or self.dummy_read is None:
            return None
        rows = last.num_reqs_padded
        return [(not bool((t[:rows] != self.config.empty_entry(g)).any()),
                 t.data_ptr() == self.kernel_table(g).data_ptr())
                for g, t in enumerate(self.dummy_read)]

    def dcp(self, group: int) -> tuple[int, int, int]:
        """(world size, rank, interleave) of ``group``: attention KV is sharded by decode
        context parallelism, Mamba state is replicated."""
        cfg = self.config
        if cfg.groups[group].kind != "attention":
            return (1, 0, 1)
        return (cfg.dcp_world_size, cfg.dcp_rank, cfg.cp_kv_cache_interleave_size)

    def _local_positions(self, group: int, pos: np.ndarray):
        """(kept, allocation column, offset in block) of positions: kept iff this
        rank's and inside the group's row (a narrow group keeps none past it)."""
        world, rank, interleave = self.dcp(group)
        bs = self.config.groups[group].block_size
        virtual = pos % (bs * world)
        column = pos // (bs * world)
        local = ((virtual // interleave) % world == rank) \
            & (column < self.config.blocks_per_req_max(group))
        return local, column, (virtual // (world * interleave)) * interleave \
            + virtual % interleave

    # -- scheduler-driven request ops ----------------------------------------
    def add_request(self, req: int, block_ids: list[list[int]], prompt_len: int,
                    num_computed_tokens: int = 0, prompt_token_ids=None) -> None:
        """A new request with allocation block ids per KV-cache group (vLLM's
        ``NewRequestData``): ``num_computed_tokens`` its prefix-cache hit,
        ``prompt_token_ids`` int64 (prompt_len,) (None: its own tokens)."""
        self.requests[req] = state = CachedRequestState(req, prompt_len, block_ids,
                                                        num_computed_tokens, prompt_token_ids)
        self._rows_add(req, state)

    def poison_blocks(self, group: int, ids: list[int]) -> None:
        """What the allocator does to a block it frees or hands out anew: every
        layer viewing it (KV, Mamba state, the drafter's KV) holds ``SENTINEL``."""
        if not ids:
            return
        index = torch.tensor(ids, dtype=torch.long, device=self.device)
        if group in self.kv_params:  # quantized: the poison's payload and parameters
            block = torch.full(self.kv_caches[group].shape[1:], SENTINEL, device=self.device)
            q, p = quantize_rows(block)
            self.kv_caches[group][index] = q
            self.kv_params[group][index] = p
        else:
            self.kv_caches.get(group, self.mamba_states.get(group))[index] = SENTINEL
        if group == self.draft_group:
            self.draft_kv[index] = SENTINEL

    def append_blocks(self, req: int, block_ids: list[list[int]]) -> None:
        """More allocation blocks (per group) for a live request."""
        state = self.requests[req]
        for g, ids in enumerate(block_ids):
            state.block_ids[g].extend(ids)
        self._rows_append(req, block_ids)

    def finish_request(self, req: int, freed: list[list[int]] | None = None) -> None:
        """Remove the request; the allocator poisons the blocks it frees —
        ``freed`` per group (a KV-cache manager keeps registered and shared
        ones), None: all of the request's."""
        self._rows_remove(req)
        self.mamba_state_idx.pop(req, None)
        self.landed.pop(req, None)
        state = self.requests.pop(req)
        for g, ids in enumerate(state.block_ids if freed is None else freed):
            self.poison_blocks(g, ids)

    def preempt_request(self, req: int, freed: list[list[int]]) -> None:
        """The scheduler preempted ``req`` (recompute): it leaves the batch, the
        allocator poisons ``freed`` (per group); the runner keeps its request
        state for when it resumes (vLLM keeps ``self.requests[req_id]``)."""
        self._rows_remove(req)
        self.mamba_state_idx.pop(req, None)
        self.landed.pop(req, None)  # what loads landed is gone with the blocks
        self.preempted[req] = self.requests.pop(req)
        for g, ids in enumerate(freed):
            self.poison_blocks(g, ids)

    def resume_request(self, req: int, block_ids: list[list[int]]) -> None:
        """A preempted request resumes on ``block_ids`` (per group) from position
        0: vLLM's ``_update_states`` for ``resumed_from_preemption`` replaces the
        request's block ids and takes the scheduler's computed count."""
        state = self.requests[req] = self.preempted.pop(req)
        state.block_ids = self._resumed_block_ids(state, block_ids)
        state.num_computed_tokens = 0
        state.num_accepted = 1
        self._rows_add(req, state)

    def _resumed_block_ids(self, state: CachedRequestState, block_ids) -> list[list[int]]:
        """A resumed request's block ids: the new ones, replacing those it held."""
        return [list(b) for b in block_ids]

    def kv_load(self, req: int) -> None:
        """A P/D connector writes the prompt's KV and the final Mamba state."""
        state = self.requests[req]
        self._write_load(self._load_writes(state, None))
        state.num_computed_tokens = state.prompt_len
        self._set_num_computed(req, state.prompt_len)

    def _load_writes(self, state: CachedRequestState, columns) -> list:
        """What a connector's transfer of ``state``'s prompt delivers into block
        ``columns`` per group (None: all): [(group, (blocks, offsets) or a state
        block, values)] — attention cells of this rank's prompt positions in those
        columns, a Mamba group's final state when its column 0 is among them."""
        pos = np.arange(state.prompt_len)
        values = torch.from_numpy(ids_payload(state.token_ids(pos),
                                              self.config.head_size)).to(self.device)
        out = []
        for g in self.attn_groups:
            local, column, offset = self._local_positions(g, pos)  # DCP: this rank's share
            if columns is not None:
                local &= np.isin(column, columns[g])
            blocks = torch.tensor(np.asarray(state.block_ids[g])[column[local]],
                                  device=self.device)
            cells = (blocks, torch.from_numpy(offset[local]).to(self.device))
            out.append((g, cells, values[torch.from_numpy(local).to(self.device)]))
        for g in self.mamba_groups:  # the state after the prompt: conv part, SSM part
            if columns is not None and 0 not in columns[g]:
                continue
            conv = self.config.groups[g].conv_size
            tail = torch.zeros((conv, values.shape[1]), device=self.device)
            if conv:
                last = values[max(len(values) - conv, 0):]
                tail[conv - len(last):] = last
            out.append((g, state.block_ids[g][0], torch.cat([tail.reshape(-1),
                                                              values.sum(dim=0)])))
        return out

    def _write_load(self, writes: list) -> None:
        for g, where, rows in writes:
            if g in self.mamba_groups:
                self.mamba_states[g][where] = rows
            elif g in self.kv_params:  # quantized: the connector writes payload and parameters
                q, p = quantize_rows(rows)
                self.kv_caches[g][where], self.kv_params[g][where] = q, p
            else:
                self.kv_caches[g][where] = rows

    # -- asynchronous KV loads (the worker side of a KV connector) ------------
    def kv_load_begin(self, req: int, handle: int, blocks: list[list[int]]) -> None:
        """A connector starts loading part of ``req``'s prompt into ``blocks`` (per
        group, blocks the request holds); what it will deliver is fixed now
        (the remote side's data), nothing lands before :meth:`kv_load_complete`."""
        state = self.requests[req]
        columns = [[state.block_ids[g].index(b) for b in ids] for g, ids in enumerate(blocks)]
        self.transfers[handle] = (req, columns, self._load_writes(state, columns))
        self.landed.setdefault(req, [[] for _ in self.config.groups])

    def kv_load_complete(self, handle: int) -> bool:
        """Transfer ``handle``'s data lands in its blocks (whoever holds them now).
        Returns whether its request, still live, now has every prompt column
        (and Mamba state) it needs: the caller then marks the prompt computed
        (:meth:`loaded_prompt`)."""
        req, columns, writes = self.transfers.pop(handle)
        if writes is None:  # an onboard: the host blocks' content, as it is now
            self._copy_host(handle, to_host=False)
        else:
            self._write_load(writes)
        landed = self.landed.get(req)
        state = self.requests.get(req)
        if landed is None or state is None:
            return False
        for g, cols in enumerate(columns):
            landed[g].extend(cols)
        pos = np.arange(state.prompt_len)
        for g in self.attn_groups:
            local, column, _ = self._local_positions(g, pos)
            if not set(column[local].tolist()) <= set(landed[g]):
                return False
        return all(0 in landed[g] for g in self.mamba_groups)

    def kv_load_fail(self, handle: int) -> None:
        """Transfer ``handle`` failed: nothing lands."""
        self.transfers.pop(handle)
        self.host_copies.pop(handle, None)

    # -- the host tier's copies (the worker side of an offloading connector) ---
    def offload_begin(self, handle: int, copies: list[tuple[int, int, int]]) -> None:
        """An offload starts: ``copies`` [(group, device block, host slot)] the
        scheduler side chose; the copy reads the device blocks until
        :meth:`offload_complete`."""
        self.host_copies[handle] = copies
        self._note_launch(handle)

    def _note_launch(self, handle: int) -> None:
        reads = self._launch_reads()
        if reads is not None:
            self.early_reads[handle] = reads

    def offload_complete(self, handle: int) -> None:
        """The offload's copy finishes: its host slots hold what its device blocks
        hold now (a copy ordered after the compute stream)."""
        self._copy_host(handle, to_host=True)

    def onboard_begin(self, req: int, handle: int, blocks: list[list[int]],
                      copies: list[tuple[int, int, int]]) -> None:
        """An onboard of ``req``'s full prompt blocks starts: ``copies`` [(group,
        device block, host slot)]; it lands at :meth:`kv_load_complete` with
        what the host slots hold then."""
        state = self.requests[req]
        columns = [[state.block_ids[g].index(b) for b in ids] for g, ids in enumerate(blocks)]
        self.transfers[handle] = (req, columns, None)
        self.host_copies[handle] = copies
        self.landed.setdefault(req, [[] for _ in self.config.groups])

    def _copy_host(self, handle: int, to_host: bool) -> None:
        early = self.early_reads.pop(handle, None)
        for g, block, slot in self.host_copies.pop(handle):
            src = self.kv_caches if early is None else {g: early[g][0]}
            pairs = [(self.host_kv, src)]
            if g in self.kv_params:
                pairs.append((self.host_params,
                              self.kv_params if early is None else {g: early[g][1]}))
            for host_buf, dev_buf in pairs:
                if to_host:
                    host_buf[g][slot] = dev_buf[g][block]
                else:
                    dev_buf[g][block] = host_buf[g][slot]

    def host_block(self, g: int, slot: int) -> np.ndarray:
        """Host slot ``slot`` of group ``g`` as reads would see it: float32
        (block_size, head_size), dequantized when quantized."""
        kv = self.host_kv[g][slot]
        if g in self.host_params:
            p = self.host_params[g][slot]
            kv = kv.to(torch.float32) * p[..., 0:1] + p[..., 1:2]
        return host(kv)

    def kv_store_begin(self, req: int, handle: int, num_tokens: int) -> None:
        """A connector starts saving ``req``'s first ``num_tokens`` tokens' KV to the
        external store (keyed by their token ids); the copy reads the blocks
        until :meth:`kv_store_complete`."""
        state = self.requests[req]
        pos = np.arange(num_tokens)
        cells = {}
        for g in self.attn_groups:
            local, column, offset = self._local_positions(g, pos)
            cells[g] = (np.asarray(state.block_ids[g])[column[local]], offset[local])
        self.stores[handle] = (tuple(int(t) for t in state.token_ids(pos)), cells)
        self._note_launch(handle)

    def kv_store_complete(self, handle: int) -> None:
        """The copy finishes: the store holds what those blocks hold now (a copy
        ordered after the compute stream)."""
        key, cells = self.stores.pop(handle)
        early = self.early_reads.pop(handle, None)
        self.kv_store[key] = {
            g: host(self._dequantized(g, None if early is None else early[g])
                    [torch.from_numpy(blocks), torch.from_numpy(offsets)])
            for g, (blocks, offsets) in cells.items()}

    def loaded_prompt(self, req: int) -> None:
        """Every transfer of ``req`` has landed: its prompt counts as computed."""
        state = self.requests[req]
        state.num_computed_tokens = state.prompt_len
        self._set_num_computed(req, state.prompt_len)

    def rollback_tokens(self, req: int, num_tokens: int) -> None:
        """Rejected speculative tokens: the scheduler lowers the request's computed
        token count (vLLM V1 ``_update_states`` copies the scheduler's
        ``num_computed_tokens`` into the request state and the batch row)."""
        state = self.requests[req]
        state.num_computed_tokens -= num_tokens
        self._set_num_computed(req, state.num_computed_tokens)

    # -- forwards --------------------------------------------------------------
    def execute_model(self, scheduled: list, cudagraph_mode: str,
                      accepted: list | None = None, in_flight: bool = False) -> None:
        """One real step. scheduled: [(req, num_tokens)], any subset of live requests;
        accepted: per item, the tokens the sampler keeps (speculative decoding;
        None: every token of a decode, one for a prefill chunk that ends the
        prompt, none for one that does not).  in_flight: async scheduling — the
        step's per-request results (accepted counts) are copied back to the host
        only at :meth:`complete_step`, after whatever ops came in between."""
        self.draft_rows = None
        # Per request: the tokens the sampler keeps, and how far it advances (a
        # decode by its kept tokens, the rejected ones' KV is garbage; a prefill
        # chunk by all of them).
        kept_of, advance_of, decode_of = {}, {}, {}
        for i, (req, n) in enumerate(scheduled):
            st = self.requests[req]
            decode_of[req] = st.num_computed_tokens >= st.prompt_len
            if decode_of[req]:  # a decode
                kept_of[req] = advance_of[req] = n if accepted is None else accepted[i]
            else:
                kept_of[req] = int(st.num_computed_tokens + n >= st.prompt_len)
                advance_of[req] = n
        batch = self._batch(scheduled)
        num_reqs = len(batch)
        num_tokens = sum(n for _, n, _ in batch)
        # A uniform decode: 1 + k tokens per row (vLLM's uniform_decode_query_len),
        # and with Mamba groups every row a decode for the builder: prior state (a
        # first prompt chunk stays a prefill) and, with a drafter, its prompt done
        # (a longer prompt chunk stays a prefill too).
        q = 1 + self.config.num_speculative_tokens
        uniform = all(n == q and (not self.mamba_groups or start > 0 and (q == 1 or decode_of[req]))
                      for req, n, start in batch)
        mode, tokens_padded, reqs_padded = self._dispatch(num_reqs, num_tokens, uniform,
                                                          cudagraph_mode)
        self._stage_tables(batch, reqs_padded)
        self._preprocess_mamba(batch)
        self._stage_batch(batch)
        self._stage_padding(num_reqs, reqs_padded, num_tokens, tokens_padded)
        for g in self.attn_groups:
            self._compute_slot_mapping(g, tokens_padded)
        self._build_slot_buffers(num_tokens, tokens_padded)
        num_rows = reqs_padded if mode == FULL else num_reqs
        self._classify(num_reqs, reqs_padded)
        self._build_mamba_metadata(num_reqs, num_rows)
        self._build_spec_metadata(num_reqs, num_rows, dummy=False)
        self._build_attention_inputs(num_rows, tokens_padded, None, True)
        before = self._device_blocks() if in_flight else None
        self._run_forward(mode, num_rows, tokens_padded)
        # The counts the next step reads its state with (align mode: the copy
        # after the forward may reset them).
        stored = self._postprocess_mamba(batch, [kept_of[req] for req, _, _ in batch],
                                         decode_of)
        advanced = [(req, advance_of[req], start) for req, _, start in batch]
        if self.draft_group is not None:
            self._run_drafter(advanced, num_tokens, cudagraph_mode)
        self._advance(advanced)
        for req, adv, start in advanced:
            self.requests[req].num_computed_tokens = start + adv
        if in_flight:
            self.steps_in_flight.append((batch, stored, self._written_since(before)))
        else:
            self._store_accepted(batch, stored)
        self.last_forward = ForwardInfo(False, mode, num_reqs, reqs_padded, num_tokens,
                                        tokens_padded, tuple(req for req, _, _ in batch))

    def complete_step(self) -> None:
        """The oldest dispatched step completes: its results land on the host,
        on the requests that ran it (:meth:`_land_results`)."""
        batch, kept, _ = self.steps_in_flight.pop(0)
        self._land_results(batch, kept)

    # -- the device's stream order, as a copy on another stream sees it ---------
    def _device_blocks(self) -> dict:
        """The attention groups' cache content now: {group: (payload, parameters
        or None)}, copies."""
        return {g: (self.kv_caches[g].clone(),
                    self.kv_params[g].clone() if g in self.kv_params else None)
                for g in self.attn_groups}

    def _written_since(self, before: dict) -> dict:
        """{group: {block: (payload, parameters or None) as in ``before``}} for
        the blocks whose content differs now: what a step in flight wrote, as it
        was before the step."""
        out = {}
        for g, (kv, params) in before.items():
            changed = _differs(kv, self.kv_caches[g])
            if params is not None:
                changed |= _differs(params, self.kv_params[g])
            out[g] = {int(b): (kv[b], None if params is None else params[b])
                      for b in torch.nonzero(changed).flatten().tolist()}
        return out

    def _unretired_view(self) -> dict:
        """The attention groups' content as a copy that does not wait for the
        compute stream may read it while steps are in flight: each block a step
        in flight writes as it was before the oldest such step (the step's
        kernels have not retired), every other block as it is.  {group:
        (payload, parameters or None)}, copies."""
        view = self._device_blocks()
        for _, _, written in reversed(self.steps_in_flight):  # the oldest wins
            for g, blocks in written.items():
                kv, params = view[g]
                for b, (old_kv, old_params) in blocks.items():
                    kv[b] = old_kv
                    if params is not None:
                        params[b] = old_params
        return view

    def _launch_reads(self) -> dict | None:
        """What a GPU -> host copy launched now reads, when that is fixed at
        launch; None: the copy is ordered after the compute stream (vLLM's
        offloading worker waits on it before a GPU -> CPU copy) and reads the
        blocks at its end, after every step dispatched before it."""
        return None

    def _land_results(self, batch: list, kept: list[int]) -> None:
        """A completed step's accepted counts, per request of its batch that is
        still live: where it sits now (vLLM keeps the dispatch's request ids and
        maps them to the rows the batch has at completion)."""
        for (req, _, _), a in zip(batch, kept):
            if req in self.requests:
                self._set_accepted(req, a)

    def _build_spec_metadata(self, num_reqs: int, num_rows: int, dummy: bool) -> None:
        """The Mamba builder's spec-decode metadata of rows [0, num_rows): each
        real row's last accepted count and whether it is a spec decode (prompt
        done, speculative decoding on: vLLM's ``spec_sequence_masks``); padded
        and dummy rows count 1 and are no spec decode."""
        acc, spec = self.num_accepted.np, self.spec_rows.np
        acc[:num_rows], spec[:num_rows] = 1, 0
        if not dummy and num_reqs and self.config.num_speculative_tokens:
            computed, prompt = self._row_counters(num_reqs)
            acc[:num_reqs] = self._row_accepted(num_reqs)
            spec[:num_reqs] = computed >= prompt
        self.num_accepted.copy_to_gpu()
        self.spec_rows.copy_to_gpu()

    def _run_drafter(self, advanced: list, num_tokens: int, requested: str) -> None:
        """The drafter after a real forward (vLLM ``EagleProposer.propose``).

        Pass 0 runs the batch's tokens through the draft layer, writing draft KV
        at the target's slots of the draft group (copied, the tail
        ``PAD_SLOT_ID``).  Each further pass
        (``num_speculative_tokens - 1``) runs one token per request at the
        position after its last valid token, then the next; the slots come from
        the shared block table (:meth:`_draft_slot_mapping`; the requests hold
        blocks for k lookahead tokens, and a position from ``max_model_len`` on
        maps to ``PAD_SLOT_ID``, as vLLM's EAGLE step kernel clamps it), and a
        uniform batch replays the drafter's FULL graph
        over rows padded to a capture size when FULL was requested.
        advanced: (req, tokens it advanced by, start) per batch row.
        """
        cfg, g = self.config, self.draft_group
        self.draft_first_slots[:num_tokens].copy_(self.slot_mappings[g][:num_tokens])
        self.draft_first_slots[num_tokens:] = PAD_SLOT_ID
        self.draft_hidden.np[:num_tokens] = self.hidden.np[:num_tokens] + np.float32(0.5)
        self.draft_hidden.copy_to_gpu()
        reshape_and_cache(self.draft_hidden.gpu, self.draft_first_slots, self.draft_kv,
                          num_tokens)
        num_reqs = len(advanced)
        # The drafter's own dispatcher: one token per row.
        mode, _, rows_padded = self._dispatch(num_reqs, num_reqs, True, requested, query_len=1)
        for i in range(1, cfg.num_speculative_tokens):
            for b, (req, adv, start) in enumerate(advanced):
                q = start + adv - 1 + i
                inside = q < cfg.max_model_len
                self.draft_req_indices.np[b] = b if inside else -1
                self.draft_positions.np[b] = q
                self.draft_hidden.np[b] = (token_payload(req, np.array([q]), cfg.head_size)[0]
                                           + np.float32(0.5)) if inside else np.nan
            self._run_draft_pass(num_reqs, rows_padded if mode == FULL else num_reqs, mode)

    def _run_draft_pass(self, num_reqs: int, num_rows: int, mode: str) -> None:
        """One single-token draft pass over rows [0, num_rows) whose first
        ``num_reqs`` are real (host inputs staged): rows past them carry no
        request (``draft_req_indices`` -1: slot ``PAD_SLOT_ID``)."""
        self.draft_rows = (num_reqs, num_rows)
        self.draft_req_indices.np[num_reqs:num_rows] = -1
        for buf in (self.draft_req_indices, self.draft_positions, self.draft_hidden):
            buf.copy_to_gpu()
        self._draft_slot_mapping(num_reqs, num_rows)
        if mode == FULL:
            self.draft_graphs[num_rows].replay()
        else:
            reshape_and_cache(self.draft_hidden.gpu, self.draft_slots, self.draft_kv, num_rows)

    def _draft_slot_mapping(self, num_reqs: int, num_rows: int) -> None:
        """The drafter's slots for rows [0, num_rows) from the draft group's kernel
        table at ``draft_positions`` (vLLM's ``eagle_step_update_slot_mapping``:
        the kernel block size the table holds, rows past the batch padded)."""
        g = self.draft_group
        compute_slot_mapping(self.kernel_table(g), self.config.groups[g].block_size,
                             self.kernel_block_size(g), self.dcp(g), self.draft_req_indices.gpu,
                             self.draft_positions.gpu, self.draft_slots, num_rows)

    def _stage_batch(self, batch: list) -> None:
        """Host side of the token and per-row metadata buffers for a real batch."""
        t = 0
        self.query_start_loc.np[0] = 0
        for row, (req, n, start) in enumerate(batch):
            pos = np.arange(start, start + n)
            self.req_indices.np[t:t + n] = row
            self.positions.np[t:t + n] = pos
            self.hidden.np[t:t + n] = ids_payload(self.requests[req].token_ids(pos),
                                                  self.config.head_size)
            self.seq_lens.np[row] = start + n
            self.has_initial_state.np[row] = int(start > 0)
            t += n
            self.query_start_loc.np[row + 1] = t

    def dummy_run(self, num_reqs: int, num_tokens: int, cudagraph_mode: str,
                  _warmup: bool = False) -> None:
        """A padded fake batch with a NaN payload (idle DP rank, capture warm-up).

        num_reqs <= num_tokens <= max_num_batched_tokens; an even split (the
        remainder on the last row): ``1 + k`` tokens per row when num_tokens is
        num_reqs * (1 + k) (uniform decode, FULL-eligible).
        """
        self.draft_rows = None
        mode, tokens_padded, reqs_padded = self._dispatch(
            num_reqs, num_tokens, num_tokens == num_reqs * (1 + self.config.num_speculative_tokens),
            cudagraph_mode)
        tables = self._prepare_dummy(reqs_padded, _warmup)
        metadata = self._dummy_builds_metadata(mode)
        if metadata:
            lens = np.full(num_reqs, num_tokens // num_reqs, np.int32)
            lens[-1] += num_tokens % num_reqs
            self.query_start_loc.np[0] = 0
            self.query_start_loc.np[1:num_reqs + 1] = np.cumsum(lens)
            self.seq_lens.np[:num_reqs] = lens
            self.has_initial_state.np[:num_reqs] = 0
            self.is_prefilling[:reqs_padded] = False  # dummy rows carry no request
            self._pad_rows(num_reqs, reqs_padded)
        self.hidden.np[:tokens_padded] = np.nan  # dummy activations are garbage
        self._stage_padding(num_reqs, num_reqs, num_tokens, tokens_padded)  # tokens; copies
        self._fill_dummy_slots(num_tokens, tokens_padded, _warmup)
        if metadata:
            self._build_slot_buffers(num_tokens, tokens_padded)
            self._stage_dummy_state_indices(tables, num_reqs, reqs_padded, mode, _warmup)
            self._build_spec_metadata(0, reqs_padded, dummy=True)
        else:
            self.read_state_indices = {}  # no metadata: the Mamba kernels do not run
        num_rows = reqs_padded if mode == FULL else num_reqs
        self._build_attention_inputs(num_rows, tokens_padded, tables, metadata)
        if not _warmup:
            self._run_forward(mode, num_rows, tokens_padded, tables, metadata)
            if self.draft_group is not None and mode == FULL \
                    and self.config.num_speculative_tokens > 1:
                # The drafter's dummy run (an idle rank stays in lockstep) over the
                # padded rows, no request in them: its FULL graph where its own
                # dispatcher has one for them.
                dmode, _, drows = self._dispatch(num_rows, num_rows, True, FULL, query_len=1)
                drows = drows if dmode == FULL else num_rows
                self.draft_hidden.np[:drows] = np.nan
                self._run_draft_pass(0, drows, dmode)
        elif self.warmup_forward:
            # Start-up warm-up compiles the kernels before capture, eagerly, with
            # the metadata this dummy run built (none: KV writes alone, through
            # the PAD-filled slot mappings).  Under the interpreter there is
            # nothing to compile, and a warm-up's only effect would be garbage
            # in the mamba null block (scratch).
            self._forward(num_rows, tokens_padded, tables, None, metadata, self.attn_inputs)
        self.dummy_read = tables
        self.last_forward = ForwardInfo(True, mode, num_reqs, reqs_padded, num_tokens,
                                        tokens_padded, metadata=metadata)

    def _dummy_builds_metadata(self, mode: str) -> bool:
        """Does a dummy run in ``mode`` build attention metadata (V2: always)?
        Without it only the KV writes run (they read the slot mappings alone)."""
        return True

    # -- internals -------------------------------------------------------------
    def _dispatch(self, num_reqs: int, num_tokens: int, uniform_decode: bool, requested: str,
                  query_len: int | None = None):
        """(mode, tokens padded, rows padded) a batch runs with; query_len: tokens
        per row of a uniform batch (default 1 + k; the drafter's passes 1)."""
        if requested == NONE:
            return NONE, num_tokens, num_reqs
        sizes = [s for s in self.config.cudagraph_capture_sizes if s >= num_tokens]
        if not sizes:
            return NONE, num_tokens, num_reqs
        padded, cfg = sizes[0], self.config
        q = 1 + cfg.num_speculative_tokens if query_len is None else query_len
        # FULL: a uniform decode whose size has a uniform-decode graph (a multiple
        # of q, rows padded to size // q), or any batch when every backend
        # captures mixed batches (vLLM AttentionCGSupport.ALWAYS; rows padded to
        # min(size, max_num_reqs) as vLLM's dispatcher pads its FULL keys).
        if requested == FULL and cfg.cudagraph_support == "ALWAYS":
            return FULL, padded, min(padded, cfg.max_num_reqs)
        if requested == FULL and uniform_decode and padded % q == 0 \
                and padded // q <= cfg.max_num_reqs:
            return FULL, padded, padded // q
        return PIECEWISE, padded, num_reqs

    def _pad_rows(self, num_reqs: int, reqs_padded: int) -> None:
        """Rows padded for a FULL graph: an empty query (``query_start_loc``
        past the batch holds its token count, as vLLM fills it), ``seq_len`` 0,
        no initial state."""
        for row in range(num_reqs, reqs_padded):
            self.query_start_loc.np[row + 1] = self.query_start_loc.np[row]
            self.seq_lens.np[row] = 0
            self.has_initial_state.np[row] = 0

    def _stage_padding(self, num_reqs, reqs_padded, num_tokens, tokens_padded) -> None:
        """Padding rows and tokens, then one host -> device copy per buffer."""
        self._pad_rows(num_reqs, reqs_padded)
        self.req_indices.np[num_tokens:tokens_padded] = -1
        self.hidden.np[num_tokens:tokens_padded] = np.nan
        for buf in (self.req_indices, self.positions, self.hidden, self.query_start_loc,
                    self.seq_lens, self.has_initial_state):
            buf.copy_to_gpu()

    def _run_forward(self, mode: str, num_rows: int, tokens_padded: int,
                     tables: list | None = None, metadata: bool = True) -> None:
        if mode == FULL:
            assert num_rows == self.config.full_graph_rows(tokens_padded) and metadata
            self.graphs[tokens_padded].replay()  # reads the captured (persistent) buffers
            for g in self.mamba_groups:  # whatever the builder staged, the graph read this
                self.read_state_indices[g] = self.state_indices[g][:num_rows]
        else:
            self._forward(num_rows, tokens_padded, tables, self.read_state_indices, metadata,
                          self.attn_inputs)

    def _kv_view(self, g: int) -> torch.Tensor:
        """The KV cache as the kernels see it: (num_kernel_blocks, kernel_block_size, head)."""
        kbs = self.kernel_block_size(g)
        return self.kv_caches[g].view(-1, kbs, self.config.head_size)

    def _params_view(self, g: int) -> torch.Tensor | None:
        """A quantized group's parameters as the read kernel sees them:
        (num_kernel_blocks, kernel_block_size, 2); None unquantized."""
        if g not in self.kv_params:
            return None
        return self.kv_params[g].view(-1, self.kernel_block_size(g), 2)

    def _kv_write(self, g: int, slots: torch.Tensor, num_tokens: int,
                  wrap_negative: bool = False) -> None:
        """The KV write of group ``g`` through ``slots`` (the cache's dtype decides
        whether it quantizes; :meth:`_kv_params_unguarded` is a fault's hook)."""
        reshape_and_cache(self.hidden.gpu, slots, self.kv_caches[g], num_tokens,
                          wrap_negative=wrap_negative, kv_params=self.kv_params.get(g),
                          params_unguarded=self._kv_params_unguarded())

    def _kv_params_unguarded(self) -> bool:
        """Does the quantized write store parameters for ``PAD_SLOT_ID`` tokens
        (indexed as torch would)?  No: both stores skip the sentinel."""
        return False

    def _forward(self, num_rows: int, num_tokens: int, tables: list | None = None,
                 state_indices: dict | None = None, metadata: bool = True,
                 attn_inputs: dict | None = None) -> None:
        """The model: KV writes, then — with attention metadata — Mamba state
        updates (through ``state_indices[g]``, default the persistent decode
        buffer) and attention reads (through ``tables[g]``, default
        :meth:`kernel_table`), with the slot mapping, block table and
        ``seq_lens`` of ``attn_inputs[g]`` (what the backend's builder handed
        over: :meth:`_build_attention_inputs`; default the runner's buffers).
        A backend with its own slot buffer writes through it, and only with
        metadata (its layer sees none otherwise)."""
        inputs = attn_inputs or {
            g: (self.slot_mappings[g], self.kernel_table(g) if tables is None else tables[g],
                self.seq_lens.gpu) for g in self.attn_groups}
        for g in self.attn_groups:
            if g in self.backend_slots:
                if metadata:
                    self._backend_cache_write(g, num_tokens)
                continue
            self._kv_write(g, inputs[g][0], num_tokens)
        if not metadata:
            return
        for g in self.mamba_groups:
            indices = self.state_indices[g] if state_indices is None else state_indices[g]
            mamba_state_update(self.hidden.gpu, self.query_start_loc.gpu, indices,
                               self.has_initial_state.gpu, self.mamba_states[g], num_rows,
                               self.num_accepted.gpu, self.spec_rows.gpu, self.mamba_read[g],
                               self._column_unbounded(), skip_null=self._mamba_skips_null(g),
                               pad_target=self._mamba_pad_target(g),
                               conv_size=self.config.groups[g].conv_size,
                               prefix_meta=self.prefix_meta.gpu, all_mode=self.all_mode,
                               block_size=self.mamba_block_size,
                               chunk_grid=self._mamba_state_grid(),
                               conv_to_source=self._conv_to_source())
        for g in self.attn_groups:
            _, table, seq_lens = inputs[g]
            paged_attention_read(table, seq_lens, self._kv_view(g), self.attn_out[g],
                                 num_rows, self.config.groups[g].block_size, self.dcp(g),
                                 self.config.groups[g].sliding_window, self._params_view(g))

    def _build_attention_inputs(self, num_rows: int, num_tokens: int, tables: list | None,
                                metadata: bool) -> None:
        """The attention backends' metadata build, once per forward (before a
        FULL replay too, as engines build before replaying): ``attn_inputs``."""
        self.attn_inputs = {
            g: self._attention_inputs(g, num_rows, num_tokens,
                                      self.kernel_table(g) if tables is None else tables[g],
                                      metadata)
            for g in self.attn_groups}

    def _attention_inputs(self, g: int, num_rows: int, num_tokens: int, table: torch.Tensor,
                          metadata: bool) -> tuple:
        """(slot mapping, block table, seq_lens) group ``g``'s attention layer gets
        from its metadata builder: the runner's own buffers (an attention builder
        that keeps none of its own passes them through)."""
        return self.slot_mappings[g], table, self.seq_lens.gpu

    def _build_slot_buffers(self, num_tokens: int, tokens_padded: int) -> None:
        """Metadata build of backends with their own slot buffer: the batch's
        tokens copied from the generic slot mapping, the padded tail
        ``[num_tokens, tokens_padded)`` set to ``PAD_SLOT_ID`` — a FULL replay
        reads the whole padded extent, and an earlier, larger batch left its
        slots there (vLLM's EAGLE proposer pads its own ``_slot_mapping_buffer``
        over the CUDA-graph padding range the same way)."""
        for g, own in self.backend_slots.items():
            own[:num_tokens].copy_(self.slot_mappings[g][:num_tokens])
            own[num_tokens:tokens_padded] = PAD_SLOT_ID

    def _backend_cache_write(self, g: int, num_tokens: int) -> None:
        """The KV write of a backend with its own slot buffer (skips PAD_SLOT_ID)."""
        self._kv_write(g, self.backend_slots[g], num_tokens)

    def buffers(self) -> dict[str, torch.Tensor]:
        """Every persistent device buffer a forward reads or writes, by name."""
        named = {"req_indices": self.req_indices.gpu, "positions": self.positions.gpu,
                 "hidden": self.hidden.gpu, "query_start_loc": self.query_start_loc.gpu,
                 "seq_lens": self.seq_lens.gpu, "has_initial_state": self.has_initial_state.gpu}
        for g in self.attn_groups:
            named[f"slot_mapping[{g}]"] = self.slot_mappings[g]
            if g in self.backend_slots:
                named[f"backend_slot_mapping[{g}]"] = self.backend_slots[g]
            named[f"kv_cache[{g}]"] = self.kv_caches[g]
            if g in self.kv_params:
                named[f"kv_params[{g}]"] = self.kv_params[g]
            named[f"attn_out[{g}]"] = self.attn_out[g]
            named[f"block_table[{g}]"] = self.kernel_table(g)
        named["num_accepted"] = self.num_accepted.gpu
        named["spec_rows"] = self.spec_rows.gpu
        if self.mamba_groups:
            named["prefix_meta"] = self.prefix_meta.gpu
        if self.draft_group is not None:
            named["draft_first_slot_mapping"] = self.draft_first_slots
            named["draft_slot_mapping"] = self.draft_slots
            named["draft_hidden"] = self.draft_hidden.gpu
            named["draft_kv_cache"] = self.draft_kv
        for g in self.mamba_groups:
            named[f"mamba_read[{g}]"] = self.mamba_read[g]
            named[f"state_indices[{g}]"] = self.state_indices[g]
            named[f"mamba_state[{g}]"] = self.mamba_states[g]
            named[f"block_table[{g}]"] = self.kernel_table(g)
        return named

    def _capture_model(self) -> None:
        """Warm up and capture one graph per FULL capture size, largest first."""
        cfg = self.config
        for size in reversed(cfg.cudagraph_capture_sizes):
            self.dummy_run(cfg.capture_rows(size), size, FULL, _warmup=True)
            if size in cfg.full_capture_sizes:  # mixed-batch graphs run min(size, rows) rows
                graph = Graph(self.device)
                with graph.capture():  # on what the warm-up's metadata build handed over
                    self._forward(cfg.full_graph_rows(size), size, attn_inputs=self.attn_inputs)
                self.graphs[size] = graph
            # The drafter's graphs: its single-token passes, by rows.
            rows = cfg.full_graph_rows(size, query_len=1)
            if self.draft_group is not None and size in cfg.full_sizes(query_len=1) \
                    and rows not in self.draft_graphs:
                graph = Graph(self.device)  # the drafter's single-token passes, by rows
                with graph.capture():
                    reshape_and_cache(self.draft_hidden.gpu, self.draft_slots, self.draft_kv,
                                      rows)
                self.draft_graphs[rows] = graph
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self.last_forward = None
        self.dummy_read = None
        self.attn_inputs = None  # until a forward builds: the runner's buffers
        self._after_capture()

    # -- observation -------------------------------------------------------------
    def graph_addresses(self) -> dict[int, dict[str, tuple[int, int]]]:
        """{capture size: {buffer: (data_ptr the graph's recorded launches read, data_ptr
        the runner would launch the same forward with now)}}.

        The current side is recorded (not run) from :meth:`_forward`; tensors are named
        by the :meth:`buffers` whose storage they use, else ``kernel.parameter``.  Where
        one buffer feeds several launches, a differing pair wins.

        The current side is a function of what :meth:`_forward` launches with:
        the tensors :meth:`buffers` names and the builder's hand-over
        (``attn_inputs``).  It is recorded again only when one of them is
        bound to another tensor, a graph was captured again, or a view moved
        (:meth:`_bindings`); otherwise the answer for those bindings stands
        (recording every graph's forward took most of an observation's time).
        """
        buffers = self.buffers()
        key = self._bindings(buffers)
        if key in self._graph_ptrs_memo:
            return self._graph_ptrs_memo[key]
        names = {t.untyped_storage().data_ptr(): n for n, t in sorted(buffers.items())}
        out = {}
        for size, graph in sorted(self.graphs.items()):
            with record_launches() as now:  # the latest build's inputs: no builder runs here
                self._forward(self.config.full_graph_rows(size), size,
                              attn_inputs=self.attn_inputs)
            pairs: dict[str, tuple[int, int]] = {}
            for was, cur in zip(graph.launches, now):
                for (param, old), (_, new) in zip(was.tensors(), cur.tensors()):
                    name = names.get(new.untyped_storage().data_ptr(), f"{was.name}.{param}")
                    pair = (old.data_ptr(), new.data_ptr())
                    if name not in pairs or pairs[name][0] == pairs[name][1]:
                        pairs[name] = pair
            out[size] = pairs
        if len(self._graph_ptrs_memo) >= 8:  # a few hand-overs alternate (V2: dummy tables)
            self._graph_ptrs_memo.pop(next(iter(self._graph_ptrs_memo)))
        self._graph_ptrs_memo[key] = out
        return out

    def _bindings(self, buffers: dict) -> tuple:
        """What :meth:`graph_addresses`' current side depends on: each named
        buffer's and each handed-over tensor's address, shape and strides, and
        the captured graphs."""
        def ptrs(x):
            # A rebound buffer is a new allocation: the captured one is still held
            # by the graph's launches, so its address cannot be reused.
            if isinstance(x, torch.Tensor):
                return (x.data_ptr(), x.shape, x.stride())
            if isinstance(x, (tuple, list)):
                return tuple(ptrs(y) for y in x)
            if isinstance(x, dict):
                return tuple((k, ptrs(v)) for k, v in sorted(x.items()))
            return id(x)

        tensor = torch.Tensor
        # buffers() names them in a fixed order: no sorting (one observation each).
        return (tuple(buffers),
                tuple((x.data_ptr(), x.shape, x.stride()) if isinstance(x, tensor) else ptrs(x)
                      for x in buffers.values()),
                ptrs(self.attn_inputs),
                tuple((size, id(g), len(g.launches)) for size, g in sorted(self.graphs.items())))

    def _dequantized(self, g: int, content: tuple | None = None) -> torch.Tensor:
        """Group ``g``'s KV cache as its reads see it: float32 (num_blocks,
        block_size, head_size), ``q * scale + zero`` when quantized.  content:
        (payload, parameters or None) to read instead of the live cache."""
        kv, p = content if content is not None else (self.kv_caches[g],
                                                     self.kv_params.get(g))
        if p is None:
            return kv
        return kv.to(torch.float32) * p[..., 0:1] + p[..., 1:2]

    def _read_indices(self, g: int) -> np.ndarray:
        """What the last forward's Mamba kernel read for group ``g``, int32
        (max_num_reqs,), 0 past the rows it ran over."""
        out = np.zeros(self.config.max_num_reqs, np.int32)
        if g in self.read_state_indices and self.last_forward is not None:
            n = len(self.read_state_indices[g])  # rows the kernel ran over
            out[:n] = host(self.mamba_read[g])[:n]
        return out

    def snapshot(self) -> dict:
        """The runner's observable state as the fields of
        ``harness.core.observation.Observation`` (all but ``runner`` and
        ``rows_indexed_by``), NumPy copies; see that class for shapes and dtypes."""
        groups = range(len(self.config.groups))
        rows = self._host_rows()
        rows["host_block_table"] = [t[:, :self._report_width(g)]
                                    for g, t in zip(groups, rows["host_block_table"])]
        return dict(
            **rows,
            device_block_table=[host(self.kernel_table(g))[:, :self._report_width(g)]
                                for g in groups],
            kv_cache={g: host(self._dequantized(g)) for g in self.kv_caches},
            kv_params={g: host(p) for g, p in self.kv_params.items()} or None,
            draft_kv_cache=({} if self.draft_group is None
                            else {self.draft_group: host(self.draft_kv)}),
            draft_slot_mapping=None if self.draft_group is None else host(self.draft_slots),
            draft_rows=self.draft_rows,
            mamba_state={g: host(v) for g, v in self.mamba_states.items()},
            slot_mapping={g: host(self.backend_slots.get(g, v))
                          for g, v in self.slot_mappings.items()},
            state_indices={g: self._read_indices(g) for g in self.mamba_groups},
            metadata={"query_start_loc": self.query_start_loc.np.copy(),
                      "seq_lens": self.seq_lens.np.copy(),
                      "has_initial_state": self.has_initial_state.np.copy(),
                      "is_prefilling": self.is_prefilling.copy()},
            attn_out={g: host(v) for g, v in self.attn_out.items()},
            last_forward=self.last_forward,
            graph_ptrs=self.graph_addresses(),
            dummy_tables=self.dummy_tables_read(),
            kv_store={k: dict(v) for k, v in self.kv_store.items()},
        )
