"""The sglang target: SGLang's own scheduler-side KV-cache code under test.

Per token-slot op (:mod:`harness.core.ops.token_slots`), what runs is SGLang's
code, driven as its scheduler drives it (``sglang/srt/managers/scheduler.py``,
``schedule_policy.py``, ``schedule_batch.py``):

- ``sgl_admit``: a real ``Req``; ``Req.init_next_round_input`` matches its
  prompt in the radix tree; the prefill adder's commit
  (its extend range, ``tree_cache.lock(last_node)``); ``ScheduleBatch.init_new``
  and ``prepare_for_extend`` (``alloc_for_extend``: a row from
  ``ReqToTokenPool``, slots from the token or paged allocator, the
  ``req_to_token`` write); the forward's KV write through
  ``MHATokenToKVPool.set_kv_buffer``; the first output token, then
  ``checkpoint_kv_cache`` (the prompt's KV published into the radix tree, the
  request's duplicates of tree slots freed and its row pointed at the tree's:
  what ``process_batch_result_prefill`` does for a request that goes on); the
  new batch merged into the running one (``merge_batch``);
- ``sgl_decode``: ``prepare_for_decode`` of the running batch
  (``alloc_for_decode``), the decode CUDA graph's padding
  (``build_decode_registry(...).fill_from``), and the replay's KV write at the
  padded ``out_cache_loc`` (padded rows write NaN: garbage, as a model's
  padded rows compute);
- ``sgl_idle``: an idle batch through the same padding (no real row);
- ``sgl_finish``: ``release_kv_cache`` (the radix tree's insert of the
  request's KV, unlock, free of the rest and of the row) and
  ``filter_batch`` of the running batch;
- ``sgl_evict``: the tree's ``evict``.

The tree is the release's default, from its own factory (``create_tree_cache``:
a ``UnifiedRadixCache``), on SGLang's Python tree core, whose nodes the
observation walks (:data:`TREE_CORE_ENV`).

The harness plays the scheduler's admission (the oracle refuses an op that
could not fit) and the model (KV values are :func:`reference.token_slots.payload`
of the token prefix; sampled tokens are :func:`~reference.token_slots.token_of`).
Process-wide SGLang config is published once from a one-layer local model
config (no hub access).
"""

from __future__ import annotations

import json
import os
import tempfile
from array import array
from types import SimpleNamespace

import numpy as np

from reference.token_slots import (RESERVED_ROW, TokenSlotConfig, payload, state_after,
                                   token_of)

from harness.core.observation import TokenSlotObservation
from harness.targets.registry import TargetRefused, TargetSpec, TargetUnavailable
from harness.targets.sglang_release import installed_version, load, load_mamba

# A one-layer model config: SGLang's ServerArgs resolves a model path at
# publication; nothing of the model is loaded.
_MODEL_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                 "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2,
                 "num_key_value_heads": 1, "num_hidden_layers": 1, "vocab_size": 1000,
                 "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
                 "torch_dtype": "float32"}
_PUBLISHED: SimpleNamespace | None = None
# The unified tree's core the target drives: SGLang's Python core, whose nodes the
# observation walks (SGLang's default is its rust core: SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND).
TREE_CORE_ENV = "BLOCKFUZZ_SGLANG_TREE_CORE"
TREE_CORE = "python"


def _publish() -> SimpleNamespace:
    """Publish SGLang's process-wide config once (its scheduler reads it), and
    return the classes the target drives beyond :func:`load`'s."""
    global _PUBLISHED
    if _PUBLISHED is not None:
        return _PUBLISHED
    s = load()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from sglang.srt import runtime_context
        from sglang.srt.managers.schedule_batch import FINISH_LENGTH, Req, ScheduleBatch
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams
        from sglang.srt.sampling.sampling_params import SamplingParams
        from sglang.srt.server_args import ServerArgs
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    path = tempfile.mkdtemp(prefix="blockfuzz-sglang-model-")
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(_MODEL_CONFIG, f)
    try:
        # SGLang's warnings about this stand-in serving config (no Intel AMX on this
        # CPU, ...) say nothing about what is under test: its loggers stay quiet here.
        import logging

        logging.disable(logging.WARNING)
        try:
            args = ServerArgs(model_path=path, device="cpu", skip_tokenizer_init=True,
                              load_format="dummy")
            runtime_context.publish(args, role="scheduler")
        finally:
            logging.disable(logging.NOTSET)
    except Exception as e:  # noqa: BLE001 (any failure: this release cannot be driven here)
        raise TargetUnavailable(f"SGLang {s.version}: publishing a local model config failed "
                                f"({type(e).__name__}: {e})") from None
    _PUBLISHED = SimpleNamespace(Req=Req, ScheduleBatch=ScheduleBatch, EvictParams=EvictParams,
                                 SamplingParams=SamplingParams, FINISH_LENGTH=FINISH_LENGTH,
                                 NONE=SpeculativeAlgorithm.NONE)
    return _PUBLISHED


MAMBA_LAYER = 1  # the hybrid model's Mamba layer (its attention layer is 0)


def _hybrid_pool(s, config: TokenSlotConfig):
    """SGLang's ``HybridReqToTokenPool`` for a hybrid model of one attention and
    one Mamba2 layer whose state is one float32 value per slot (the temporal
    state; the conv state rides along): ``config.mamba_slots`` slots plus the
    reserved slot 0, no extra tracking buffer (the default ``no_buffer``
    strategy), no overlap scheduling."""
    import torch

    m = load_mamba()
    shape = m.Mamba2StateShape.create(tp_world_size=1, intermediate_size=1, n_groups=1,
                                      num_heads=1, head_dim=1, state_size=1, conv_kernel=2)
    params = m.Mamba2CacheParams(shape=shape, layers=[MAMBA_LAYER], dtype=m.Mamba2StateDType(
        conv=torch.float32, temporal=torch.float32))
    given = dict(size=config.max_num_reqs, mamba_size=config.mamba_slots,
                 mamba_spec_state_size=config.mamba_slots,
                 max_context_len=config.max_context_len, device="cpu",
                 enable_memory_saver=False, cache_params=params, mamba_layer_ids=[MAMBA_LAYER],
                 enable_mamba_extra_buffer=False, enable_overlap_schedule=False)
    return m.HybridReqToTokenPool(**{k: v for k, v in given.items() if k in m.pool_kwargs})


def _mamba_backend(pool, max_bs: int):
    """SGLang's Mamba2 attention backend as far as its decode-graph replay goes:
    an instance whose construction (which needs a model runner) is replaced by
    the attributes it would set for this pool, then its own
    ``init_cuda_graph_state`` (the captured per-batch-size state-index buffers)."""
    import torch

    m = load_mamba()
    b = object.__new__(m.Mamba2AttnBackend)
    b.pad_slot_id, b.device, b.topk, b.is_draft_worker = m.PAD_SLOT_ID, "cpu", 0, False
    b.req_to_token_pool, b.token_to_kv_pool = pool, None
    b.enable_unified_memory, b._fused_state_indices_ok = False, False
    b.forward_metadata, b.mamba_track_indices_buf = None, None
    b.state_indices_list, b.query_start_loc_list = [], []
    b.replayssm_write_pos_list = b.replayssm_force_flush_list = None
    b.retrieve_next_token_list, b.retrieve_next_sibling_list = [], []
    b.retrieve_parent_token_list = []
    b.cached_cuda_graph_decode_query_start_loc = None
    b.cached_cuda_graph_verify_query_start_loc = None
    b._graph_seq_len_fill_value = 1
    with torch.no_grad():
        b.init_cuda_graph_state(max_bs, max_bs)
    return b


class SglangTarget:
    """SGLang's pools, allocator, radix cache, scheduler batches and decode-graph
    padding for one :class:`~reference.token_slots.TokenSlotConfig`.

    faults: ids of the catalogue's runner-``sglang`` faults, re-created in these
    objects (:mod:`harness.targets.sglang_faults`).  Raises
    :class:`TargetUnavailable` when SGLang is absent or cannot be driven,
    ``ValueError`` for a fault that is not SGLang's.
    """

    name = "sglang"

    def __init__(self, config: TokenSlotConfig, faults=(), device: str | None = None):
        import torch

        self.config = config
        s, p = load(), _publish()
        self._s, self._p, self._torch = s, p, torch
        if config.mamba_slots:  # a hybrid model: one Mamba layer beside the attention one
            self.req_to_token_pool = _hybrid_pool(s, config)
        else:
            self.req_to_token_pool = s.ReqToTokenPool(
                size=config.max_num_reqs, max_context_len=config.max_context_len, device="cpu",
                enable_memory_saver=False)
        self.kv_pool = s.MHATokenToKVPool(
            size=config.num_slots, page_size=config.page_size, dtype=torch.float32, head_num=1,
            head_dim=1, layer_num=1, device="cpu", enable_memory_saver=False)
        if config.page_size == 1:
            self.allocator = s.TokenToKVPoolAllocator(
                size=config.num_slots, dtype=torch.float32, device="cpu", kvcache=self.kv_pool,
                need_sort=False)
        else:
            self.allocator = s.PagedTokenToKVPoolAllocator(
                size=config.num_slots, page_size=config.page_size, dtype=torch.float32,
                device="cpu", kvcache=self.kv_pool, need_sort=False)
        self._model_config = SimpleNamespace(
            vocab_size=_MODEL_CONFIG["vocab_size"], is_encoder_decoder=False,
            attention_arch=None, is_multimodal=False, hf_config=SimpleNamespace(),
            context_len=config.max_context_len)
        self.tree = self._make_tree(s, config)
        top = max(config.capture_bs)
        self.registry = s.build_decode_registry(
            device=torch.device("cpu"), max_bs=top, max_num_token=top, seq_len_fill_value=1,
            cache_loc_dtype=torch.int64)
        self._layer = SimpleNamespace(layer_id=0)
        self.mamba_backend = _mamba_backend(self.req_to_token_pool, top) \
            if config.mamba_slots else None
        self._reads = None  # the last decode's attention reads, per real row
        self._state_written = None  # Mamba slots the last forward wrote
        if self.mamba_backend is not None:
            self._capture()
        self.reqs: dict[int, object] = {}  # live request id -> SGLang Req
        self.seen: dict[int, object] = {}  # every admitted request (prefix sources)
        self.running = None  # the running ScheduleBatch
        self._padded = None
        self._written = None
        from harness.targets import sglang_faults

        sglang_faults.apply(self, faults)  # SGLang's history, on these objects only

    def _make_tree(self, s, config):
        """The release's default tree through its own factory (``create_tree_cache``:
        a ``UnifiedRadixCache`` with the FULL component, on the tree core
        :data:`TREE_CORE`), or a ``RadixCache`` where the release has no factory."""
        import dataclasses

        params = s.CacheInitParams(
            disable=not config.radix_cache, req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool_allocator=self.allocator, page_size=config.page_size)
        if s.create_tree_cache is None:
            return s.RadixCache(params)
        if "tree_core_backend" in {f.name for f in dataclasses.fields(params)}:
            params.tree_core_backend = os.environ.get(TREE_CORE_ENV, TREE_CORE)
        from sglang.srt.runtime_context import get_server_args

        given = dict(server_args=get_server_args(), params=params, is_hybrid_swa=False,
                     is_hybrid_ssm=bool(config.mamba_slots), enable_hierarchical_cache=False,
                     disable_radix_cache=not config.radix_cache, tp_worker=None,
                     model_config=self._model_config, tp_size=1, tp_rank=0, tp_group=None,
                     effective_chunked_prefill_size=config.max_context_len)  # (0.5.20)
        fields = dataclasses.fields(s.TreeCacheBuildContext)
        unknown = [f.name for f in fields if f.name not in given
                   and f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING]
        if unknown:
            raise TargetUnavailable(f"SGLang {s.version}: its tree factory wants "
                                    f"{', '.join(unknown)}, which the sglang target does not "
                                    "know how to give")
        return s.create_tree_cache(s.TreeCacheBuildContext(
            **{k: v for k, v in given.items() if k in {f.name for f in fields}}))

    # -- the model's part ----------------------------------------------------------
    def _write(self, locs, values) -> None:
        """The forward's KV write for one layer: ``values`` at slots ``locs``."""
        torch = self._torch
        locs = torch.as_tensor(locs, dtype=torch.int64)
        vals = torch.as_tensor(np.asarray(values, np.float32)).reshape(-1, 1, 1)
        self.kv_pool.set_kv_buffer(self._layer, locs, vals, vals)
        self._written = locs.numpy().copy()

    def _state(self):
        """The Mamba layer's temporal (SSM) state, one float32 value per slot (a view)."""
        pool = self.req_to_token_pool.mamba_pool
        return pool.mamba_cache.temporal[0].reshape(pool.mamba_cache.temporal.shape[1], -1)[:, 0]

    def _conv(self):
        """The Mamba layer's conv state, every value of a slot's window (a view,
        ``[slots + 1, window values]``)."""
        conv = self.req_to_token_pool.mamba_pool.mamba_cache.conv[0][0]
        return conv.reshape(conv.shape[0], -1)

    def _update_states(self, slots, token_lists) -> None:
        """The Mamba layer's forward (ours: SGLang's kernels need a GPU): each row
        with a state index >= 0 continues its slot's SSM state, and its conv
        window (every value the same), each from what it held, by its tokens
        (:func:`~reference.token_slots.state_after`); a row of
        ``None`` tokens is a padded row and writes NaN (garbage, as a padded row
        computes); ``PAD_SLOT_ID`` (-1) rows are skipped, as SGLang's kernels skip
        them."""
        state, conv = self._state(), self._conv()
        written = []
        for slot, toks in zip([int(x) for x in slots], token_lists):
            if slot < 0:
                continue
            # The SSM state and the conv window each continue from what the slot
            # held (so a copy or clear that skips either shows).
            state[slot] = np.nan if toks is None else float(state_after(toks, float(state[slot])))
            conv[slot] = np.nan if toks is None else float(state_after(toks, float(conv[slot, 0])))
            written.append(slot)
        self._state_written = np.asarray(written, np.int64)

    def _capture(self) -> None:
        """The decode graphs' capture at start-up, as far as the Mamba layer goes:
        per captured size, the backend's metadata for a batch of dummy rows
        (``req_pool_indices`` all 0, no padding counted: every row reads
        ``req_index_to_mamba_index_mapping[0]``, slot 0) and their state
        update, which writes garbage (NaN) into slot 0."""
        torch, m = self._torch, load_mamba()
        for bs in self.config.capture_bs:
            self.mamba_backend._replay_metadata(bs, torch.zeros(bs, dtype=torch.int64),
                                                m.ForwardMode.DECODE, None, None,
                                                num_padding=0, in_capture=True)
            self._update_states(self.mamba_backend.state_indices_list[bs - 1][:bs].clone(),
                                [None] * bs)
        self._state_written = None

    def _mamba_prefill(self, batch, token_lists) -> None:
        """An extend batch's Mamba part: the model runner's deferred copy-on-write
        of a prefix hit's state into the request's slot, or the clear of a fresh
        slot (SGLang's own), then the layer's update from the request's slot
        (``get_mamba_indices`` of its row)."""
        pool = self.req_to_token_pool
        # The model runner's deferred clear / copy-on-write before an extend's
        # Mamba layers run (model_runner.py: _maybe_execute_deferred_mamba_cow_and_clear;
        # that module needs the server's imports): what the batch collected.
        clear = getattr(batch, "mamba_clear_indices", None)
        if clear is not None and len(clear):
            pool.mamba_pool.clear_slots(pool.translate_mamba_indices(clear))
        src = getattr(batch, "mamba_cow_src_indices", None)
        if src is not None and len(src):
            pool.copy_mamba_state(pool.translate_mamba_indices(src),
                                  pool.translate_mamba_indices(batch.mamba_cow_dst_indices))
        slots = self.req_to_token_pool.get_mamba_indices(batch.req_pool_indices.to(self._torch.int64))
        self._update_states(slots, token_lists)

    @staticmethod
    def _prefix_len(r) -> int:
        """The matched prefix's length (``prefix_len``; ``prefix_indices`` before it)."""
        n = getattr(r, "prefix_len", None)
        return len(r.prefix_indices) if n is None else n

    def _new_batch(self, reqs):
        p = self._p
        return p.ScheduleBatch.init_new(reqs, self.req_to_token_pool, self.allocator, self.tree,
                                        self._model_config, False, p.NONE)

    # -- ops ---------------------------------------------------------------------------
    def sgl_admit(self, req: int, prompt_len: int, prefix=None) -> None:
        p = self._p
        head = []
        if prefix:
            src = self.seen[prefix[0]]
            head = list(src.origin_input_ids) + list(src.output_ids)
            head = head[:prefix[1]]
        tokens = head + [token_of(req, i) for i in range(len(head), prompt_len)]
        r = p.Req(str(req), "", array("q", tokens),
                  p.SamplingParams(max_new_tokens=self.config.max_context_len))
        r.init_next_round_input(self.tree)  # match_kv_cache: the prefix hit
        # the prefill adder's commit: the whole prompt (an extend range before 0.5.23) ...
        if hasattr(r, "set_extend_range"):
            r.set_extend_range(self._prefix_len(r), prompt_len)
        else:
            r.extend_end = prompt_len
        if self._s.tree_lock:  # ... and a lock on the matched path
            r.lock = self.tree.lock(r.last_node)
        else:  # (before tree locks: a receipt of inc_lock_ref)
            r.lock_receipt = self.tree.inc_lock_ref(r.last_node).to_dec_params()
        batch = self._new_batch([r])
        batch.prepare_for_extend()  # alloc_for_extend: row, slots, req_to_token
        self._write(batch.out_cache_loc, payload(tokens)[self._prefix_len(r):prompt_len])
        if self.config.mamba_slots:
            self._mamba_prefill(batch, [tokens[self._prefix_len(r):prompt_len]])
        r.output_ids.append(token_of(req, prompt_len))
        self._s.publish_prefill(r, self.tree)  # the result processor's, after prefill
        self.reqs[req] = self.seen[req] = r
        if self.running is None:
            self.running = batch
        else:
            self.running.merge_batch(batch)

    def sgl_decode(self) -> None:
        torch = self._torch
        batch = self.running
        batch.prepare_for_decode()  # alloc_for_decode: one slot each, req_to_token
        bs = batch.batch_size()
        values = []
        for r in batch.reqs:
            fill = list(r.origin_input_ids) + list(r.output_ids)
            values.append(payload(fill)[-1])
        last = [[(list(r.origin_input_ids) + list(r.output_ids))[-1]] for r in batch.reqs]
        padded = self.config.padded_bs(bs)
        rids = [int(r.rid) for r in batch.reqs]
        if padded is None:  # no captured size fits: eager, unpadded
            self._write(batch.out_cache_loc, values)
            self._read(rids, batch.req_pool_indices, batch.seq_lens)
            if self.config.mamba_slots:
                self._update_states(self.req_to_token_pool.get_mamba_indices(
                    batch.req_pool_indices.to(torch.int64)), last)
        else:
            seq = batch.seq_lens.to(torch.int64)
            fb = SimpleNamespace(
                input_ids=torch.zeros(bs, dtype=torch.int64), positions=seq - 1,
                out_cache_loc=batch.out_cache_loc.to(torch.int64),
                req_pool_indices=batch.req_pool_indices.to(torch.int64), seq_lens=seq,
                seq_lens_cpu=seq.clone(), mrope_positions=None,
                global_num_token_non_padded=None, num_token_non_padded=None)
            self._replay(fb, bs, padded, values, last)
            self._read(rids, *(self.registry.get_slot(n).buffer[:bs]
                               for n in ("req_pool_indices", "seq_lens")))
        for r in batch.reqs:
            r.output_ids.append(token_of(int(r.rid), len(r.origin_input_ids) + len(r.output_ids)))

    def _read(self, rids, req_pool_indices, seq_lens) -> None:
        """The decode's attention read (ours: SGLang's kernels need a GPU): each
        real row gathers the KV of positions [0, seq_len) through its row of
        ``req_to_token``, from the inputs the forward ran with (the captured
        buffers on a graph replay); the rows' reads are kept for the checks."""
        r2t = self.req_to_token_pool.req_to_token
        kv = self.kv_pool.k_buffer[0][:, 0, 0]
        rows = [int(x) for x in req_pool_indices.tolist()]
        lens = [int(x) for x in seq_lens.tolist()]
        self._reads = [(rid, row, n, kv[r2t[row, :n].to(self._torch.int64)].numpy().copy())
                       for rid, row, n in zip(rids, rows, lens)]

    def _replay(self, fb, bs: int, padded: int, values, tokens=()) -> None:
        """The decode graph's replay: its padding fills the captured buffers, and
        the captured KV write reads ``out_cache_loc`` from them (padded rows: NaN).
        A hybrid model's Mamba backend then turns the captured ``req_pool_indices``
        into state indices (its ``_replay_metadata``: padded rows to
        ``PAD_SLOT_ID``), and the captured state update reads them."""
        self.registry.fill_from(fb, raw_bs=bs, padded_bs=padded, raw_num_tokens=bs,
                                padded_num_tokens=padded)
        buf = {n: self.registry.get_slot(n).buffer for n in
               ("req_pool_indices", "out_cache_loc", "seq_lens")}
        self._padded = {n: b[:padded].numpy().astype(np.int64) for n, b in buf.items()}
        self._padded.update(raw_bs=bs, padded_bs=padded)
        self._write(buf["out_cache_loc"][:padded].clone(),
                    list(values) + [np.nan] * (padded - bs))
        if self.mamba_backend is not None:
            m = load_mamba()
            seq = buf["seq_lens"][:padded].clone()
            self.mamba_backend._replay_metadata(
                padded, buf["req_pool_indices"][:padded], m.ForwardMode.DECODE, None, seq,
                num_padding=padded - bs)
            idx = self.mamba_backend.state_indices_list[padded - 1][:padded].clone()
            self._padded["state_indices"] = idx.numpy().astype(np.int64)
            self._update_states(idx, list(tokens) + [None] * (padded - bs))

    def sgl_idle(self, bs: int) -> None:
        torch = self._torch
        empty = torch.zeros(0, dtype=torch.int64)
        fb = SimpleNamespace(input_ids=empty, positions=empty, out_cache_loc=empty,
                             req_pool_indices=empty, seq_lens=empty, seq_lens_cpu=empty,
                             mrope_positions=None, global_num_token_non_padded=None,
                             num_token_non_padded=None)
        self._replay(fb, 0, bs, [])

    def sgl_finish(self, req: int) -> None:
        r = self.reqs.pop(req)
        r.finished_reason = self._p.FINISH_LENGTH(length=len(r.output_ids))
        self._s.release_kv_cache(r, self.tree,
                                 **{self._s.release_insert_kw: self.config.radix_cache})
        self.running.filter_batch()
        if self.running.is_empty():
            self.running = None

    def sgl_evict(self, num_tokens: int) -> None:
        self.tree.evict(self._p.EvictParams(num_tokens=num_tokens))

    # -- observation -------------------------------------------------------------------
    def _free_pages(self) -> np.ndarray:
        a = self.allocator
        parts = [a.free_pages.numpy()]
        if getattr(a, "release_pages", None) is not None and len(a.release_pages):
            parts.append(a.release_pages.numpy())
        return np.sort(np.concatenate(parts).astype(np.int64))

    def _tree_nodes(self) -> list:
        """Every node below the root: (token path, slot path, lock count).  A
        ``UnifiedRadixCache`` keeps a node's slots and locks per component (FULL
        here); a ``RadixCache`` on the node.  A node whose KV was evicted (no
        value) ends its path."""
        root = self.tree.root_node
        if isinstance(root, int):  # a tree core of NodeIds (rust): no Python nodes
            raise TargetUnavailable(f"SGLang's {self.tree._tree_core_backend} tree core keeps "
                                    f"its nodes out of Python; set {TREE_CORE_ENV}=python")
        full = None
        if hasattr(root, "component_data"):
            from sglang.srt.mem_cache.unified_cache.components import ComponentType

            full = ComponentType.FULL
        out = []
        stack = [(root, (), ())]
        while stack:
            node, toks, slots = stack.pop()
            for child in node.children.values():
                data = child if full is None else child.component_data[full]
                if data.value is None:
                    continue
                t = toks + tuple(int(x) for x in child.key.token_ids)
                v = slots + tuple(int(x) for x in data.value.tolist())
                out.append((t, v, int(data.lock_ref)))
                stack.append((child, t, v))
        return sorted(out)

    def _tree_states(self) -> list:
        """The radix tree's Mamba states: (token path, state slot, lock count) per
        node whose MAMBA component holds a value (the state after that path)."""
        from sglang.srt.mem_cache.unified_cache.components import ComponentType

        mamba, full = ComponentType.MAMBA, ComponentType.FULL
        out, stack = [], [(self.tree.root_node, ())]
        while stack:
            node, toks = stack.pop()
            for child in node.children.values():
                if child.component_data[full].value is None:
                    continue
                t = toks + tuple(int(x) for x in child.key.token_ids)
                data = child.component_data.get(mamba) if hasattr(
                    child.component_data, "get") else child.component_data[mamba]
                if data is not None and data.value is not None:
                    for slot in data.value.reshape(-1).tolist():
                        out.append((t, int(slot), int(data.lock_ref)))
                stack.append((child, t))
        return sorted(out)

    def _mamba_observation(self) -> dict:
        if not self.config.mamba_slots:
            return {}
        pool = self.req_to_token_pool
        written, self._state_written = self._state_written, None
        rows = {q: int(r.kv.req_pool_idx) for q, r in self.reqs.items()}
        mapping = pool.req_index_to_mamba_index_mapping
        return dict(
            state_slots={q: int(mapping[row]) for q, row in rows.items()},
            state=self._state().numpy().astype(np.float32).copy(),
            conv=self._conv().numpy().astype(np.float32).copy(),
            state_free=np.sort(np.asarray(pool.mamba_allocator.free_slots.tolist(), np.int64)),
            state_tree=self._tree_states() if self.config.radix_cache else [],
            state_written=written)

    def observe(self) -> TokenSlotObservation:
        kv = self.kv_pool.k_buffer[0][:, 0, 0].numpy().copy()
        written, self._written = self._written, None
        reads, self._reads = self._reads, None
        return TokenSlotObservation(
            rows={q: int(r.kv.req_pool_idx) for q, r in self.reqs.items()},
            kv_len={q: int(r.kv.kv_committed_len) for q, r in self.reqs.items()},
            req_to_token=self.req_to_token_pool.req_to_token.numpy().copy(),
            kv=kv, free_pages=self._free_pages(),
            tree=self._tree_nodes() if self.config.radix_cache else [],
            padding=None if self._padded is None else dict(self._padded),
            written=written, reads=reads, **self._mamba_observation())


def _refusal(config) -> TargetRefused | None:
    if not isinstance(config, TokenSlotConfig):
        return TargetRefused("runner", f"the sglang target runs token-slot configs "
                             f"(runner 'sglang'), not a {config.runner} block-table runner")
    if config.page_size not in load().page_sizes:
        return TargetRefused("page_size", f"{config.page_size}: the sglang target drives "
                             f"page sizes {list(load().page_sizes)}")
    if config.mamba_slots:
        try:
            load_mamba()
        except TargetUnavailable as e:
            return TargetRefused("mamba_slots", str(e))
    if config.mamba_slots and config.page_size != 1:
        return TargetRefused("page_size", f"{config.page_size} with mamba_slots: SGLang's Mamba "
                             "cache component needs page size 1 without its extra tracking "
                             "buffer (the no_buffer strategy the target drives)")
    return None


def _factory(config, faults=(), device=None):
    problem = _refusal(config)
    if problem is not None:
        raise problem
    return SglangTarget(config, faults, device)


def _select_device(requested: str | None) -> str:
    if requested not in (None, "auto", "cpu"):
        raise TargetUnavailable(f"the sglang target runs on the CPU (its pools on torch's "
                                f"CPU device); --device {requested} is not supported")
    load()
    return "cpu"


def _version() -> str | None:
    v = installed_version()
    return None if v is None else f"SGLang {v}"


def _limits() -> dict:
    """What drawn token-slot configs may hold here: a Mamba pool only where this
    release's hybrid-model code loads (:func:`load_mamba`)."""
    try:
        load_mamba()
    except TargetUnavailable:
        return {"mamba": False}
    return {"mamba": True}


SPEC = TargetSpec(name="sglang", description="the installed SGLang's pools, allocators, "
                  "radix cache, scheduler batches and decode-graph padding",
                  factory=_factory, select_device=_select_device, refusal=_refusal,
                  version=_version, runners=("sglang",), takes_faults=True, limits=_limits)

__all__ = ["RESERVED_ROW", "SPEC", "SglangTarget"]
