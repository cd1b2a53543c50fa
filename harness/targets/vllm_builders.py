"""vLLM's own metadata builders, driven by the vllm target's runner shells:
Mamba2 for Mamba groups, Triton attention for attention groups.

:class:`VllmMambaBuilders` constructs the installed release's
``Mamba2AttentionMetadataBuilder`` (``vllm/v1/attention/backends/mamba2_attn.py``
over ``mamba_attn.py``'s ``BaseMambaAttentionMetadataBuilder``) once per Mamba
KV-cache group and calls its ``build`` on every forward that builds attention
metadata.  vLLM's code then decides, from the ``CommonAttentionMetadata`` the
runner shell hands it: which rows are decodes (its one-token-prefill-with-prior-
state rule and ``split_decodes_and_prefills``), the state index each row's
kernel reads, and whether its persistent decode buffer ``state_indices_tensor_d``
— the buffer FULL graphs read — is refreshed.  The runner shell's FULL graphs
are captured on that buffer (``state_indices[g]`` is a view of it), so a replay
reads what vLLM's builder left there.

What stays ours (the runner side, ``gpu_model_runner.py``): the counters and
``is_prefilling`` the shell classifies, padded rows' metadata, and nulling the
padded block-table rows before the build (vLLM's runner does it in place on the
device table; here on a copy, so a stale padded row a fault-free shell never
has stays visible to the structural invariants).

Construction on a CPU-only machine needs four shims, each the least that works
(measured on 0.26.0 and 0.33.0):

- ``VllmConfig(device_config=DeviceConfig("cpu"), ...)``: the unspecified
  platform cannot infer a device;
- ``model_config`` is a stand-in with the one method the builder reads
  (``get_mamba_chunk_size``): a real ``ModelConfig`` needs a Hugging Face
  config and the model registry (which imports ``einops``);
- ``compilation_config.cudagraph_mode`` / ``cudagraph_capture_sizes`` are set
  after construction (``VllmConfig`` forces ``NONE`` on a platform without
  static graphs); ``FULL_AND_PIECEWISE`` when the config has capture sizes;
- ``PIN_MEMORY`` is off in ``vllm.v1.attention.backends.utils`` (set by
  :func:`harness.targets.vllm_release.load`).

The attention side is :class:`VllmAttentionBuilders`: the release's
``TritonAttentionMetadataBuilder`` (``vllm/v1/attention/backends/triton_attn.py``,
the attention builder that constructs on a CPU — FlashAttention's and the CPU
backend's need ``einops`` / ``vllm._C``), built on every forward that builds
metadata; the KV write and the attention read take the slot mapping, block
table and ``seq_lens`` it hands the layer.  It keeps no buffer of its own for
them (it passes the runner's through), so FULL graphs read the runner's.
Its ``build_for_cudagraph_capture`` (which sets ``seq_lens`` to 1) is not used:
capture builds like any other forward.

A release whose builder cannot be constructed or built this way raises
:class:`harness.targets.vllm.TargetUnavailable` with a one-line reason.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from harness.targets.vllm_release import TargetUnavailable, _kwargs_for, load

MAMBA_LAYER = "model.layers.0.mixer"
CHUNK_SIZE = 8  # Mamba2 chunk size: only prefill chunk metadata depends on it


def vllm_config(config):
    """A real ``VllmConfig`` for ``config`` (a ``RunnerConfig``) on the CPU, with
    the shims the module docstring lists."""
    from vllm.config import (CacheConfig, CompilationConfig, DeviceConfig, SchedulerConfig,
                             VllmConfig)
    from vllm.config.compilation import CUDAGraphMode

    from harness.targets.vllm_release import max_model_len

    sizes = list(config.cudagraph_capture_sizes)
    model_len = max_model_len(config)
    scheduler = SchedulerConfig(**_kwargs_for(SchedulerConfig, dict(
        max_num_seqs=config.max_num_reqs,
        max_num_batched_tokens=max(config.max_num_batched_tokens, model_len),
        max_model_len=model_len, is_encoder_decoder=False)))
    out = VllmConfig(
        device_config=DeviceConfig(device="cpu"), scheduler_config=scheduler,
        cache_config=CacheConfig(**_kwargs_for(CacheConfig, dict(mamba_cache_mode="none"))),
        compilation_config=CompilationConfig(
            max_cudagraph_capture_size=max(sizes) if sizes else None))
    compilation = out.compilation_config
    compilation.cudagraph_mode = CUDAGraphMode.FULL_AND_PIECEWISE if sizes \
        else CUDAGraphMode.NONE
    compilation.cudagraph_capture_sizes = sizes
    compilation.max_cudagraph_capture_size = max(sizes) if sizes else None
    if config.num_speculative_tokens:
        # A drafter: what VllmConfig.num_speculative_tokens and the builders'
        # reorder threshold read (a real SpeculativeConfig needs a draft model).
        out.speculative_config = SimpleNamespace(
            num_speculative_tokens=config.num_speculative_tokens, parallel_drafting=False,
            method="mtp", use_eagle=lambda: False, use_eagle_block_drop=lambda: False)
    out.model_config = SimpleNamespace(
        max_model_len=model_len, dtype=torch.float32, rswa_window=None,
        get_mamba_chunk_size=lambda: CHUNK_SIZE,
        get_num_attention_heads=lambda parallel_config: 1,
        get_num_kv_heads=lambda parallel_config: 1,
        get_head_size=lambda: config.head_size)
    return out


def common_metadata(device, qsl_host: np.ndarray, seq_lens_host: np.ndarray,
                    table: torch.Tensor, **tensors):
    """vLLM's ``CommonAttentionMetadata`` for ``len(seq_lens_host)`` batch rows
    (the fields the installed release has); qsl_host int32 (num_rows + 1,),
    seq_lens_host int32 (num_rows,).  ``tensors``: device tensors to use as
    they are (``query_start_loc``, ``seq_lens``, ``slot_mapping``: the runner's
    buffers), else fresh ones from the host arrays; ``is_prefilling``: bool
    NumPy (num_rows,) or None."""
    from vllm.v1.attention.backend import CommonAttentionMetadata

    qsl = torch.from_numpy(np.ascontiguousarray(qsl_host, np.int32))
    lens = torch.from_numpy(np.ascontiguousarray(seq_lens_host, np.int32))
    num_tokens = int(qsl[-1])
    prefilling = tensors.pop("is_prefilling", None)
    cand = dict(
        query_start_loc=qsl.to(device), query_start_loc_cpu=qsl, seq_lens=lens.to(device),
        seq_lens_cpu=lens, seq_lens_cpu_upper_bound=lens,
        num_computed_tokens_cpu=lens - torch.diff(qsl), num_reqs=len(lens),
        num_actual_tokens=num_tokens, max_query_len=int(torch.diff(qsl).max()),
        max_seq_len=int(lens.max()), block_table_tensor=table,
        slot_mapping=torch.full((num_tokens,), -1, dtype=torch.int64, device=device),
        causal=True,
        is_prefilling=None if prefilling is None else torch.from_numpy(prefilling.copy()))
    cand.update(tensors)
    return CommonAttentionMetadata(**_kwargs_for(CommonAttentionMetadata, cand))


class VllmAttentionBuilders:
    """One vLLM ``TritonAttentionMetadataBuilder`` per attention group of ``config``."""

    def __init__(self, config, device: torch.device, kernel_block_sizes: dict):
        try:
            from vllm.v1.attention.backends.triton_attn import TritonAttentionMetadataBuilder
            from vllm.v1.kv_cache_interface import FullAttentionSpec

            shared = vllm_config(config)
            self._builders = {
                g: TritonAttentionMetadataBuilder(
                    FullAttentionSpec(**_kwargs_for(FullAttentionSpec, dict(
                        block_size=kernel_block_sizes[g], num_kv_heads=1,
                        head_size=config.head_size, dtype=torch.float32))),
                    [f"model.layers.{g}.self_attn.attn"], shared, device)
                for g in config.attention_groups}
        except Exception as e:  # noqa: BLE001 - the release's constructor refused
            raise TargetUnavailable(f"vLLM {load().version}'s Triton attention metadata builder "
                                    f"cannot be constructed on the CPU ({type(e).__name__}: "
                                    f"{e})") from None
        self.device = device

    def build(self, g: int, query_start_loc, seq_lens, table, slot_mapping) -> tuple:
        """vLLM's build over ``table.shape[0]`` rows: (slot_mapping, block_table,
        seq_lens) as its metadata hands them to the attention layer.

        query_start_loc / seq_lens: the runner's device buffers (int32), their
        host copies read for the maxima; table int32 (num_rows, width);
        slot_mapping int64 (num_tokens_padded,)."""
        num_rows = table.shape[0]
        common = common_metadata(
            self.device, query_start_loc.cpu().numpy()[:num_rows + 1],
            seq_lens.cpu().numpy()[:num_rows], table,
            query_start_loc=query_start_loc[:num_rows + 1], seq_lens=seq_lens[:num_rows],
            slot_mapping=slot_mapping)
        md = self._builders[g].build(0, common)
        return md.slot_mapping, md.block_table, md.seq_lens


class VllmMambaBuilders:
    """One vLLM ``Mamba2AttentionMetadataBuilder`` per Mamba group of ``config``.

    ``persistent(g)``: int32 (decode_cudagraph_max_bs,) view of the builder's
    ``state_indices_tensor_d`` column 0 (what a FULL graph reads) — with
    speculative decoding the whole (decode_cudagraph_max_bs, 1 + k) buffer;
    :meth:`build` returns the state indices each batch row's kernel reads.
    """

    def __init__(self, config, device: torch.device):
        try:
            self._builders = {g: self._make(config, device) for g in config.mamba_groups}
        except Exception as e:  # noqa: BLE001 - the release's constructor refused
            raise TargetUnavailable(f"vLLM {load().version}'s Mamba2 metadata builder cannot be "
                                    f"constructed on the CPU ({type(e).__name__}: {e})") from None
        self.device = device
        self.k = config.num_speculative_tokens

    @staticmethod
    def _make(config, device):
        from vllm.v1.attention.backends.mamba2_attn import Mamba2AttentionMetadataBuilder
        from vllm.v1.kv_cache_interface import MambaSpec

        from harness.targets.vllm_release import max_model_len

        spec = MambaSpec(**_kwargs_for(MambaSpec, dict(
            block_size=max_model_len(config), shapes=((3, 8), (2, 4, 4)),
            dtypes=(torch.float32, torch.float32), mamba_cache_mode="none",
            num_speculative_blocks=config.num_speculative_tokens)))
        return Mamba2AttentionMetadataBuilder(spec, [MAMBA_LAYER], vllm_config(config),
                                              device)

    def persistent(self, g: int) -> torch.Tensor:
        buf = self._builders[g].state_indices_tensor_d
        return buf if self.k else buf[:, 0]

    def build_spec(self, g: int, table: torch.Tensor, query_start_loc: np.ndarray,
                   seq_lens: np.ndarray, is_prefilling: np.ndarray,
                   num_accepted: np.ndarray) -> tuple:
        """vLLM's build with speculative decoding (k > 0) over ``num_rows`` rows.

        table: int32 (num_rows, 1 + k) — the Mamba group's state columns, padded
        rows already the null block; num_accepted: int32 (num_rows,), each row's
        last accepted count.  Returns (indices int32 (num_rows, 1 + k): the
        decode rows' (a view of the persistent buffer when vLLM refreshed it),
        then the prefill rows' column 0 with the null block in the others;
        counts int32 (num_rows,): vLLM's accepted count per decode row (its
        persistent buffer's, padded rows 1, when refreshed), 1 for prefill
        rows; num_decodes)."""
        common = common_metadata(self.device, query_start_loc, seq_lens, table,
                                 is_prefilling=is_prefilling)
        acc = torch.from_numpy(np.ascontiguousarray(num_accepted, np.int32)).to(self.device)
        md = self._builders[g].build(common_prefix_len=0, common_attn_metadata=common,
                                     num_accepted_tokens=acc)
        num_rows, nd = len(seq_lens), md.num_decodes
        decode = md.state_indices_tensor_d
        counts = np.ones(num_rows, np.int32)
        if md.num_accepted_tokens is not None and nd:
            got = md.num_accepted_tokens.cpu().numpy()
            counts[:min(len(got), num_rows)] = got[:num_rows]
        prefill = md.state_indices_tensor_p
        if prefill is None or md.num_prefills == 0:
            return decode, counts, nd
        rest = torch.zeros((md.num_prefills, 1 + self.k), dtype=torch.int32,
                           device=self.device)
        rest[:, 0] = prefill if prefill.dim() == 1 else prefill[:, 0]
        return torch.cat([decode.reshape(-1, 1 + self.k), rest]), counts, nd

    def build(self, g: int, table: torch.Tensor, query_start_loc: np.ndarray,
              seq_lens: np.ndarray, is_prefilling: np.ndarray) -> torch.Tensor:
        """vLLM's build over ``num_rows = len(seq_lens)`` batch rows.

        table: int32 (num_rows, 1) — column 0 the state index, padded rows already
        the null block; query_start_loc int32 (num_rows + 1,); seq_lens int32
        (num_rows,); is_prefilling bool (num_rows,).  Returns int32 (num_rows,):
        the decode rows' indices (a view of the persistent buffer when vLLM
        refreshed it) followed by the prefill rows'.
        """
        common = common_metadata(self.device, query_start_loc, seq_lens, table,
                                 is_prefilling=is_prefilling)
        md = self._builders[g].build(common_prefix_len=0, common_attn_metadata=common)
        decode = md.state_indices_tensor_d
        decode = decode[:, 0] if decode.dim() == 2 else decode
        prefill = md.state_indices_tensor_p
        if prefill is None or md.num_prefills == 0:
            return decode
        prefill = prefill[:, 0] if prefill.dim() == 2 else prefill
        return torch.cat([decode, prefill])
