"""The model runner mode registers with vLLM: vLLM's own layer classes, gpu_impl's kernels.

Imported only after :func:`harness.targets.vllm_engine.prepare` (its classes
subclass vLLM's).  One layer per KV-cache group of the trace's config, in
order: group ``g`` of kind attention is vLLM's ``Attention`` named
``model.layers.{g}.self_attn.attn``, of kind mamba vLLM's ``MambaMixer2``
named ``model.layers.{g}.mixer`` — so the KV-cache specs, the groups vLLM
forms, the metadata builders (``TritonAttentionMetadataBuilder``,
``Mamba2AttentionMetadataBuilder``) and what the runner hands each layer are
the release's.  The layers' own kernels never run: :class:`ModelKernels`
runs gpu_impl's on exactly what the forward context holds for each layer —

- KV write (``gpu_impl.attention.reshape_and_cache``) through the layer's slot
  mapping (the forward context's per-layer ``slot_mapping`` where the release
  has one, else the metadata's), over every entry it holds, as vLLM's write
  kernel covers its slot mapping's length (``PAD_SLOT_ID`` skipped);
- Mamba update (``gpu_impl.mamba.mamba_state_update``): decode rows through
  ``state_indices_tensor_d`` (as long as the metadata holds it: a FULL
  replay's padded length, ``PAD_SLOT_ID`` rows skipped), then prefill rows
  through ``state_indices_tensor_p`` with ``query_start_loc_p`` and
  ``has_initial_states_p``;
- paged-attention read (``gpu_impl.attention.paged_attention_read``) through
  the metadata's ``block_table`` and ``seq_lens``, into ``attn_out``.

The caches are the model's own, laid out as the trace's config says
(``kv_cache[g]`` float32 (num_blocks, block_size, head_size), ``mamba_state[g]``
float32 (num_blocks, state_floats)), indexed by vLLM's block ids and slots.
The tensors vLLM allocates and binds to the layers (``layer.kv_cache``) are
not written: vLLM's hybrid allocator lays every group's pages over one pool,
which a trace whose groups have pools of their own cannot express.

The token payload is ``gpu_impl.runner_shell.ids_payload`` of ``req * 256 +
position`` — the request vLLM's persistent batch holds in the token's row and
vLLM's own ``positions`` buffer — NaN for a dummy run
(:attr:`ModelKernels.garbage`) and for padded tokens: the reference's payload
of the same token.  Sampled token ids feed nothing (a request's token past
its prompt that vLLM has not sampled, after a ``kv_load``, still has its
payload).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from vllm.model_executor.models.interfaces import HasInnerState, IsHybrid
from vllm.v1.attention.backends import triton_attn

from gpu_impl.attention import paged_attention_read, reshape_and_cache
from gpu_impl.mamba import mamba_state_update
from gpu_impl.runner_shell import NULL_BLOCK_ID, SENTINEL, ids_payload



def architecture(hybrid: bool) -> str:
    """The registered architecture name of the model for a config with / without Mamba."""
    return "BlockfuzzHybridForCausalLM" if hybrid else "BlockfuzzAttentionForCausalLM"


def layer_name(config, group: int) -> str:
    """vLLM's layer name of the trace's KV-cache group ``group``."""
    if config.groups[group].kind == "attention":
        return f"model.layers.{group}.self_attn.attn"
    return f"model.layers.{group}.mixer"


class BlockfuzzTritonBackend(triton_attn.TritonAttentionBackend):
    """vLLM's Triton attention backend (its metadata builder, cache layout and
    impl) declaring any kernel block size: the kernels that read and write the
    caches are gpu_impl's, which take any block size, so the trace's small
    blocks (4 tokens) need no kernel-block split."""

    @staticmethod
    def get_supported_kernel_block_sizes(*spec):  # 0.33 passes the layer's spec
        return [triton_attn.MultipleOf(1)]

    @classmethod
    def supports_block_size(cls, block_size) -> bool:
        return True

    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, *args, **kwargs):
        """The release's cache shape, its block-size check aside (the layout
        differs between releases: asked of vLLM with a stand-in block size)."""
        stand_in = 16 * 1031
        shape = triton_attn.TritonAttentionBackend.get_kv_cache_shape(
            num_blocks, stand_in, *args, **kwargs)
        return tuple(block_size if d == stand_in else d for d in shape)


class ModelKernels:
    """One example's caches and kernels (the model is built once per geometry;
    the target hands it a fresh one per runner).  config: the trace's
    ``reference.RunnerConfig``.

    ``kv_cache`` / ``mamba_state``: per group, as in the module docstring;
    ``attn_out[g]`` float32 (rows, head_size); ``garbage``: True while the
    target runs ``_dummy_run`` or ``capture_model`` (the payload is NaN);
    ``forwards``: one record per model forward since the target last cleared
    it (runtime mode, tokens, rows).
    """

    def __init__(self, config):
        self.config = config
        head, n = config.head_size, config.num_blocks
        self.kv_cache = {g: self._cache((n, config.groups[g].block_size, head))
                         for g in config.attention_groups}
        self.mamba_state = {g: self._cache((n, config.state_floats(g)))
                            for g in config.mamba_groups}
        rows = max(config.max_num_reqs, config.max_num_batched_tokens,
                   *config.cudagraph_capture_sizes)
        self.attn_out = {g: torch.zeros((rows, head)) for g in config.attention_groups}
        self.mamba_read = {g: torch.zeros(rows, dtype=torch.int32) for g in config.mamba_groups}
        self.garbage = False
        # () -> [(req, tokens)] per batch row of the forward being run, as the
        # target reads vLLM's persistent batch; None: no real tokens (a dummy run).
        self.rows = None
        # req -> tokens the sampler keeps of its speculative row this step (plan_samples)
        self.accepted: dict[int, int] = {}
        self.forwards: list[dict] = []

    @staticmethod
    def _cache(shape) -> torch.Tensor:
        cache = torch.full(shape, SENTINEL, dtype=torch.float32)
        cache[NULL_BLOCK_ID] = 0.0
        return cache

    def plan_samples(self, out: torch.Tensor) -> None:
        """Write into the forward's output (float32 (tokens, hidden)) the token id
        greedy sampling is to pick at each token (``out[:, 0]``), so that vLLM's
        rejection sampler keeps ``accepted[req]`` tokens of a speculative row:
        draft ``j`` (1-based) is token id ``j`` (:func:`draft_token_ids`), the
        row's token ``j - 1`` predicts it, and the first one not to be kept is
        predicted as 0.  Rows without a count (prefills, plain steps) pick 0."""
        if not self.accepted or self.rows is None or self.garbage:
            return
        start = 0
        for req, n in self.rows():
            a = self.accepted.get(req)
            if a is not None:
                for j in range(min(a - 1, n)):
                    out[start + j, 0] = float(j + 1)
            start += n

    def poison(self, group: int, ids: list[int]) -> None:
        """What the allocator does to blocks it frees: they hold ``SENTINEL``."""
        if ids:
            cache = self.kv_cache.get(group, self.mamba_state.get(group))
            cache[torch.tensor(ids, dtype=torch.long)] = SENTINEL

    def forward(self, ctx, positions: torch.Tensor) -> None:
        """The layers' work for one model forward (module docstring)."""
        metadata = ctx.attn_metadata
        if isinstance(metadata, list):
            # Micro-batches (vLLM's ubatching): runner mode's VllmConfig never
            # enables them, so this is blockfuzz's limit, never a finding in vLLM
            from harness.targets.registry import TargetRefused

            raise TargetRefused("vllm", "runner mode's model runs one batch per forward; "
                                "vLLM handed it micro-batches (ubatching), which it does "
                                "not model")
        num_tokens = int(positions.shape[-1])
        record = {"mode": getattr(ctx.cudagraph_runtime_mode, "name",
                                  str(ctx.cudagraph_runtime_mode)),
                  "num_tokens": num_tokens, "rows": 0, "metadata": bool(metadata)}
        self.forwards.append(record)
        if not metadata:  # vLLM's layers write nothing without metadata
            return
        cfg = self.config
        slots = getattr(ctx, "slot_mapping", None)
        hidden = self._payload(positions, slots, metadata)
        for g in cfg.attention_groups:
            name = layer_name(cfg, g)
            md = metadata[name]
            slot = slots[name] if isinstance(slots, dict) and name in slots else md.slot_mapping
            slot = slot.to(torch.int64)
            reshape_and_cache(hidden, slot, self.kv_cache[g], int(slot.shape[0]))
        for g in cfg.mamba_groups:
            self._mamba(g, metadata[layer_name(cfg, g)], hidden)
        for g in cfg.attention_groups:
            md = metadata[layer_name(cfg, g)]
            rows = int(md.seq_lens.shape[0])
            record["rows"] = rows
            paged_attention_read(md.block_table.to(torch.int32).contiguous(),
                                 md.seq_lens.to(torch.int32), self.kv_cache[g],
                                 self.attn_out[g], rows, cfg.groups[g].block_size)

    def _payload(self, positions: torch.Tensor, slots, metadata) -> torch.Tensor:
        """float32 (tokens, head_size): token ``t`` of batch row ``r`` gets the payload
        of id ``req * 256 + positions[t]`` — ``req`` the request vLLM's persistent
        batch holds in row ``r`` (:attr:`rows`), ``positions`` vLLM's own buffer —
        and NaN past the real tokens and in dummy runs; as many rows as the
        longest slot mapping a layer holds."""
        longest = max([int(positions.shape[-1])] + [
            int(m.slot_mapping.shape[0]) for m in metadata.values()
            if getattr(m, "slot_mapping", None) is not None] + (
            [int(v.shape[0]) for v in slots.values()] if isinstance(slots, dict) else []))
        ids = np.zeros(longest, np.int64)
        real = 0
        if not self.garbage and self.rows is not None:
            pos = positions.reshape(-1).detach().cpu().numpy().astype(np.int64)
            for req, n in self.rows():
                ids[real:real + n] = req * 256 + pos[real:real + n]
                real += n
        hidden = torch.from_numpy(ids_payload(ids, self.config.head_size))
        hidden[real:] = float("nan")
        return hidden

    def _mamba(self, g: int, md, hidden: torch.Tensor) -> None:
        """Group ``g``'s Mamba update over vLLM's Mamba2 metadata (decode rows first)."""
        ncol = 1 + self.config.num_speculative_tokens
        parts, starts, init, accepted, spec = [], [0], [], [], []
        decode = md.state_indices_tensor_d
        if md.num_decodes and decode is not None:
            decode = decode if decode.dim() == 2 else decode[:, None]
            rows_d = decode.shape[0]
            parts.append(_columns(decode, ncol))
            init += [1] * rows_d
            qsl_d = getattr(md, "query_start_loc_d", None)
            counts = getattr(md, "num_accepted_tokens", None)
            if qsl_d is not None and counts is not None:  # speculative decodes
                # Rows past the real ones (a FULL replay's padding) run no token.
                qsl = qsl_d.to(torch.int64).tolist()
                starts += qsl[1:rows_d + 1] + [qsl[-1]] * (rows_d + 1 - len(qsl))
                accepted += [int(x) for x in counts[:rows_d].tolist()]
                spec += [1] * rows_d
            else:
                starts += list(range(1, rows_d + 1))
                accepted += [1] * rows_d
                spec += [0] * rows_d
        if md.num_prefills:
            prefill = md.state_indices_tensor_p
            prefill = prefill if prefill.dim() == 2 else prefill[:, None]
            parts.append(_columns(prefill[:md.num_prefills, :1], ncol))
            offset = starts[-1]
            qsl = md.query_start_loc_p.to(torch.int64).tolist()
            starts += [offset + q for q in qsl[1:md.num_prefills + 1]]
            init += [int(x) for x in md.has_initial_states_p[:md.num_prefills].tolist()]
            accepted += [1] * md.num_prefills
            spec += [0] * md.num_prefills
        if not parts:
            return
        indices = torch.cat(parts)
        rows = int(indices.shape[0])
        self.forwards[-1]["mamba_rows"] = rows
        self.forwards[-1].setdefault("accepted", {})[g] = accepted  # the column each row starts from, + 1
        self.forwards[-1].setdefault("state_indices", {})[g] = indices.tolist()
        if ncol == 1:
            indices = indices[:, 0].contiguous()
        mamba_state_update(hidden, torch.tensor(starts, dtype=torch.int32), indices,
                           torch.tensor(init, dtype=torch.int32), self.mamba_state[g], rows,
                           num_accepted=torch.tensor(accepted, dtype=torch.int32),
                           spec_rows=torch.tensor(spec, dtype=torch.int32),
                           read_out=self.mamba_read[g][:rows],
                           conv_size=self.config.groups[g].conv_size)


class BlockfuzzProposer:
    """The drafter runner mode hands vLLM (``speculative_config`` method
    ``custom_class``, ``vllm/v1/spec_decode/custom_class_proposer.py``): the
    trace decides every step's draft tokens (the target puts them in the
    scheduler output), so it proposes none and writes no KV.  What vLLM's
    runner does with drafts — the rejection sampler, accepted counts, the
    Mamba builder's speculative state columns — is vLLM's."""

    def __init__(self, vllm_config, *args, **kwargs):
        self.vllm_config = vllm_config

    def propose(self, sampled_token_ids, *args, **kwargs) -> list[list[int]]:
        return [[] for _ in sampled_token_ids]


PROPOSER = f"{__name__}.BlockfuzzProposer"


def draft_token_ids(num_drafts: int) -> list[int]:
    """The draft tokens runner mode schedules for a speculative row: 1..num_drafts."""
    return list(range(1, num_drafts + 1))


def _columns(indices: torch.Tensor, ncol: int) -> torch.Tensor:
    """int32 (rows, ncol): ``indices``' columns, zero past them."""
    out = torch.zeros((indices.shape[0], ncol), dtype=torch.int32)
    n = min(ncol, indices.shape[1])
    out[:, :n] = indices[:, :n].to(torch.int32)
    return out


def _attention_cls():
    try:
        from vllm.model_executor.layers.attention import Attention  # 0.33
    except ImportError:
        from vllm.attention.layer import Attention  # older releases
    return Attention


class _BlockfuzzModel(nn.Module):
    """vLLM's layers, one per trace group; forward runs :attr:`kernels`."""

    supports_pp = False

    def __init__(self, *, vllm_config, prefix: str = ""):
        super().__init__()
        hf = vllm_config.model_config.hf_config
        self.vocab, self.hidden = hf.vocab_size, hf.hidden_size
        self.kernels: ModelKernels | None = None
        attention = set(hf.attn_layer_indices)
        layers = []
        for i in range(hf.num_hidden_layers):
            layers.append(self._attention(hf, vllm_config, i) if i in attention
                          else self._mixer(hf, vllm_config, i))
        self.blockfuzz_layers = nn.ModuleList(layers)
        self.dummy = nn.Parameter(torch.zeros(1))

    @staticmethod
    def _attention(hf, vllm_config, i):
        head = hf.hidden_size // hf.num_attention_heads
        return _attention_cls()(num_heads=hf.num_attention_heads, head_size=head,
                                scale=head ** -0.5, num_kv_heads=hf.num_key_value_heads,
                                cache_config=vllm_config.cache_config,
                                prefix=f"model.layers.{i}.self_attn.attn")

    @staticmethod
    def _mixer(hf, vllm_config, i):
        from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2

        return MambaMixer2(
            hidden_size=hf.hidden_size, ssm_state_size=hf.mamba_d_state,
            conv_kernel_size=hf.mamba_d_conv, intermediate_size=hf.mamba_expand * hf.hidden_size,
            use_conv_bias=True, use_bias=False, n_groups=hf.mamba_n_groups,
            num_heads=hf.mamba_n_heads, head_dim=hf.mamba_d_head, rms_norm_eps=1e-5,
            activation="silu", model_config=vllm_config.model_config,
            cache_config=vllm_config.cache_config, prefix=f"model.layers.{i}.mixer")

    def embed_input_ids(self, input_ids):
        return torch.zeros(input_ids.shape[0], self.hidden)

    get_input_embeddings = embed_input_ids

    def forward(self, input_ids=None, positions=None, intermediate_tensors=None,
                inputs_embeds=None, **kwargs):
        from vllm.forward_context import get_forward_context

        n = input_ids.shape[0] if input_ids is not None else inputs_embeds.shape[0]
        out = torch.zeros(n, self.hidden)
        if self.kernels is not None and positions is not None:
            ctx = get_forward_context()
            self.kernels.forward(ctx, positions)
            self._record_launch(ctx, positions)
            self.kernels.plan_samples(out)
        return out

    def _record_launch(self, ctx, positions) -> None:
        """While V2's graph manager captures a FULL graph (``EmulatedCUDAGraph``),
        keep this forward as a launch of it: the forward context's metadata and
        slot mappings and the ``positions`` view as they are now.  A replay runs
        the kernels only: the output (and with it :meth:`ModelKernels.plan_samples`)
        stays as captured, which is right while V2 runs no drafter of ours
        (``runner_refusal`` refuses one): sampled ids feed no payload."""
        from types import SimpleNamespace

        from vllm.config import CUDAGraphMode

        from harness.targets.vllm_engine import EmulatedCUDAGraph

        graph = EmulatedCUDAGraph.current()
        if graph is None:
            return
        kept = SimpleNamespace(attn_metadata=ctx.attn_metadata,
                               slot_mapping=getattr(ctx, "slot_mapping", None),
                               cudagraph_runtime_mode=CUDAGraphMode.FULL)
        graph.launches.append(lambda: self.kernels.forward(kept, positions))

    def compute_logits(self, hidden_states, *args, **kwargs):
        """One-hot logits at the token id ``hidden_states[:, 0]`` holds
        (:meth:`ModelKernels.plan_samples`; 0 unless a speculative step planned
        otherwise): greedy sampling picks it.  No payload depends on sampled ids
        (:meth:`ModelKernels._payload`)."""
        ids = hidden_states[:, 0].round().long().clamp(0, self.vocab - 1)
        logits = torch.zeros(hidden_states.shape[0], self.vocab)
        logits[torch.arange(ids.shape[0]), ids] = 1.0
        return logits

    def load_weights(self, weights):
        return set()


class BlockfuzzAttentionModel(_BlockfuzzModel):
    """Attention layers only."""


class BlockfuzzHybridModel(_BlockfuzzModel, HasInnerState, IsHybrid):
    """Attention and Mamba2 layers (vLLM's hybrid-model interfaces: its runner
    sizes Mamba state from these classmethods)."""

    @classmethod
    def get_mamba_state_dtype_from_config(cls, vllm_config):
        from vllm.model_executor.layers.mamba.mamba_utils import MambaStateDtypeCalculator

        c = vllm_config.cache_config
        return MambaStateDtypeCalculator.mamba2_state_dtype(
            vllm_config.model_config.dtype, c.mamba_cache_dtype, c.mamba_ssm_cache_dtype)

    @classmethod
    def get_mamba_state_shape_from_config(cls, vllm_config):
        from vllm.model_executor.layers.mamba.mamba_utils import MambaStateShapeCalculator

        hf = vllm_config.model_config.hf_config
        return MambaStateShapeCalculator.mamba2_state_shape(
            intermediate_size=hf.mamba_expand * hf.hidden_size,
            tp_world_size=vllm_config.parallel_config.tensor_parallel_size,
            n_groups=hf.mamba_n_groups, num_heads=hf.mamba_n_heads, head_dim=hf.mamba_d_head,
            state_size=hf.mamba_d_state, conv_kernel=hf.mamba_d_conv)

    @classmethod
    def get_mamba_state_copy_func(cls):
        from vllm.model_executor.layers.mamba.mamba_utils import MambaStateCopyFuncCalculator

        return MambaStateCopyFuncCalculator.mamba2_state_copy_func()


def register() -> None:
    """Register both model classes with vLLM's ``ModelRegistry`` (idempotent)."""
    from vllm import ModelRegistry

    ModelRegistry.register_model(architecture(True), BlockfuzzHybridModel)
    ModelRegistry.register_model(architecture(False), BlockfuzzAttentionModel)
