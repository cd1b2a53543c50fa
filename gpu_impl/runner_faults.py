"""gpu_impl's fault branches in the runner shell, shared by its V1 and V2 runners.

:class:`RunnerFaults` is mixed in before :class:`gpu_impl.runner_shell.RunnerShell`
(``class GPUModelRunnerV1(RunnerFaults, RunnerShellV1)``): it keeps the
:class:`FaultSet` and overrides the shell's hooks at the places the upstream
bugs lived; with no fault on, every override defers to the fixed shell.

Faults consulted here: ``full-replay-not-restaged``, ``captured-buffer-rebound``,
``padded-rows-classified-as-prefill``, ``padded-rows-metadata-stale``,
``backend-slot-tail-stale``, ``pad-slot-wraps-to-last-slot``,
``decode-slots-sliced-prefill-first``, ``draft-slots-tail-stale``,
``accepted-column-unbounded``, ``draft-slots-allocation-block-size``,
``mamba-align-seed-attention-block-size``, ``mamba-state-view-unpadded-stride``,
``mamba-writes-shared-null-block``, ``row-width-first-group-block-size``,
``mamba-pad-index-clamped-to-zero``, ``mamba-pad-index-to-last-slot``,
``resumed-blocks-appended``, ``offload-copy-skips-compute-wait``,
``spec-decodes-split-as-prefills``, ``mamba-all-boundary-on-chunk-grid``,
``mamba-short-chunk-conv-to-source``, ``mamba-align-spec-accepted-not-reset``,
``mamba-align-spec-postprocess-bias-dropped``.
"""

from __future__ import annotations

import torch

from .block_table import compute_slot_mapping
from .faults import FaultSet
from .runner_shell import FULL


class RunnerFaults:
    """Fault hooks of gpu_impl's runners. faults: :class:`FaultSet`."""

    def __init__(self, config, faults: FaultSet, device: torch.device):
        self.faults = faults
        super().__init__(config, device)

    def _resumed_block_ids(self, state, block_ids):
        if "resumed-blocks-appended" not in self.faults:
            return super()._resumed_block_ids(state, block_ids)
        # The historical branch: a resumed request's new block ids are appended
        # to the ones it held before preemption (the path for a running
        # request's new blocks), so its row starts with blocks it gave back.  A
        # row holds its width: the ids past it are dropped (vLLM's append past a
        # row's width raises instead).
        return [(ids + list(new))[:self.config.mamba_columns if g in self.mamba_groups
                                  else self.config.blocks_per_req_max(g)]
                for g, (ids, new) in enumerate(zip(state.block_ids, block_ids))]

    def _launch_reads(self):
        if "offload-copy-skips-compute-wait" in self.faults and self.steps_in_flight:
            # The historical bug: no wait on the compute stream; the copy may run
            # before the steps in flight retire (emulated: it reads now, each
            # block they write as it was before them).
            return self._unretired_view()
        return super()._launch_reads()

    def _stage_dummy_state_indices(self, tables, num_reqs, reqs_padded, mode, warmup) -> None:
        if mode == FULL and not warmup and "full-replay-not-restaged" in self.faults:
            return  # the historical bug: the replay reads the last real batch's indices
        super()._stage_dummy_state_indices(tables, num_reqs, reqs_padded, mode, warmup)

    def _row_widths(self) -> list[int]:
        widths = super()._row_widths()
        cfg = self.config
        if "row-width-first-group-block-size" in self.faults and cfg.model_len:
            # The historical bug class: one block size (the first group's) sizes
            # every attention group's row.
            first = cfg.tokens_per_block(cfg.attention_groups[0])
            for g in cfg.attention_groups:
                widths[g] = -(-cfg.model_len // first)
        return widths

    def _mamba_skips_null(self, g: int) -> bool:
        if "mamba-writes-shared-null-block" in self.faults:
            return False  # the historical bug: block 0 treated as scratch, as unshared
        return super()._mamba_skips_null(g)

    def _kv_params_unguarded(self) -> bool:
        # The historical bug class: the scale store misses the PAD_SLOT_ID guard.
        return "kv-params-store-unguarded" in self.faults or super()._kv_params_unguarded()

    def _mamba_pad_target(self, g: int) -> int | None:
        if "mamba-pad-index-clamped-to-zero" in self.faults:
            return 0  # the historical bug: indices clamped to >= 0, -1 becomes block 0
        if "mamba-pad-index-to-last-slot" in self.faults:
            return self.config.num_blocks - 1  # the pool's last row, taken for a sentinel
        return super()._mamba_pad_target(g)

    def _state_view(self, kv_cache: torch.Tensor, g: int) -> torch.Tensor:
        if "mamba-state-view-unpadded-stride" in self.faults:
            # The historical bug class: the state tensor laid over the shared
            # buffer at the state's own size as its block stride, not the page's.
            flat = kv_cache.view(-1)
            size = self.config.state_floats(g)
            return flat[:kv_cache.shape[0] * size].view(kv_cache.shape[0], -1)
        return super()._state_view(kv_cache, g)

    def _mamba_seed_block_size(self) -> int:
        if "mamba-align-seed-attention-block-size" in self.faults:
            # The historical bug: cache_config.block_size, the least block size
            # over the prefix-cacheable groups (here the attention groups').
            return min(self.config.groups[g].block_size for g in self.attn_groups)
        return super()._mamba_seed_block_size()

    def _clear_padded_prefilling(self, num_reqs, reqs_padded) -> None:
        if "padded-rows-classified-as-prefill" in self.faults:
            return  # the historical bug: padded rows keep the vacated rows' counters
        super()._clear_padded_prefilling(num_reqs, reqs_padded)

    def _pad_rows(self, num_reqs, reqs_padded) -> None:
        if "padded-rows-metadata-stale" in self.faults and self.last_forward is not None:
            return  # padded rows keep what the previous batch staged (after start-up)
        super()._pad_rows(num_reqs, reqs_padded)

    def _build_slot_buffers(self, num_tokens, tokens_padded) -> None:
        if "backend-slot-tail-stale" in self.faults and self.last_forward is not None:
            # The bug class: only the real tokens are copied; the padded tail keeps
            # what an earlier, larger batch left (start-up capture excepted).
            for g, own in self.backend_slots.items():
                own[:num_tokens].copy_(self.slot_mappings[g][:num_tokens])
            return
        super()._build_slot_buffers(num_tokens, tokens_padded)

    def _backend_cache_write(self, g, num_tokens) -> None:
        if "pad-slot-wraps-to-last-slot" in self.faults:
            # The historical bug: the slot used as an index, -1 wrapping to the last slot.
            self._kv_write(g, self.backend_slots[g], num_tokens, wrap_negative=True)
            return
        super()._backend_cache_write(g, num_tokens)

    def _layer_state_indices(self, indices, num_decodes):
        num_prefills = len(indices) - num_decodes
        if "decode-slots-sliced-prefill-first" in self.faults and num_decodes and num_prefills:
            # The historical bug: the mixer slices decodes from the end (a prefill-first
            # layout), so decode row i updates indices[num_prefills + i] and prefill
            # row j indices[j] — other rows' state slots in a mixed batch.
            return torch.roll(indices, -num_prefills, dims=0)
        return super()._layer_state_indices(indices, num_decodes)

    def _draft_slot_mapping(self, num_reqs, num_rows) -> None:
        bug = {"draft-slots-tail-stale", "draft-slots-allocation-block-size"} & self.faults.ids
        if not bug:
            return super()._draft_slot_mapping(num_reqs, num_rows)
        g = self.draft_group
        bs = self.config.groups[g].block_size
        # draft-slots-allocation-block-size: the allocation block size where the table
        # holds kernel blocks; draft-slots-tail-stale: only the real rows are written,
        # the padded rows keep an earlier draft batch's slots.
        kbs = bs if "draft-slots-allocation-block-size" in self.faults else \
            self.kernel_block_size(g)
        rows = num_reqs if "draft-slots-tail-stale" in self.faults else num_rows
        compute_slot_mapping(self.kernel_table(g), bs, kbs, self.dcp(g),
                             self.draft_req_indices.gpu, self.draft_positions.gpu,
                             self.draft_slots, rows)

    def _column_unbounded(self) -> bool:
        return "accepted-column-unbounded" in self.faults or super()._column_unbounded()

    def _mamba_state_grid(self) -> bool:
        return "mamba-all-boundary-on-chunk-grid" in self.faults or super()._mamba_state_grid()

    def _conv_to_source(self) -> bool:
        return "mamba-short-chunk-conv-to-source" in self.faults or super()._conv_to_source()

    def _resets_accepted(self) -> bool:
        if "mamba-align-spec-accepted-not-reset" in self.faults:
            return False  # the historical path: the count stays the previous step's
        return super()._resets_accepted()

    def _postprocess_bias(self, bias: int) -> int:
        if "mamba-align-spec-postprocess-bias-dropped" in self.faults:
            return 0  # the historical copy: the running column's state, not the accepted one's
        return super()._postprocess_bias(bias)

    def _decode_threshold(self) -> int:
        if "spec-decodes-split-as-prefills" in self.faults:
            return 1  # the historical split: one token per decode, drafts or not
        return super()._decode_threshold()

    def _after_capture(self) -> None:
        super()._after_capture()
        if "captured-buffer-rebound" in self.faults and self.attn_groups:
            # The historical bug class: a persistent buffer re-allocated after capture
            # (instead of written in place); eager steps stage into the new tensor,
            # captured graphs keep reading the old one.
            g = self.attn_groups[0]
            self.slot_mappings[g] = torch.full_like(self.slot_mappings[g], -1)
