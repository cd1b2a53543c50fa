"""The vllm target's model runners: gpu_impl's fault-free runner shells over the
installed vLLM's block-table classes.

A module of its own because it imports gpu_impl's kernels (and so Triton):
:func:`harness.targets.vllm.make_vllm_runner` imports it only after
:func:`harness.targets.vllm_release.load` has set the environment vLLM and the Triton
interpreter need.  Everything here subclasses :mod:`gpu_impl.runner_shell_v1` /
:mod:`gpu_impl.runner_shell_v2` — never gpu_impl's own runners, so no gpu_impl
fault can reach the vllm target.  The hook table is in docs/writing-a-target.md.
"""

from __future__ import annotations

import numpy as np
import torch

from gpu_impl.runner_shell_v1 import EMPTY_ROW, RunnerShellV1
from gpu_impl.runner_shell_v2 import RunnerShellV2
from harness.targets.vllm_release import (_group_sizes, _kwargs_for, load, max_model_len,
                                          staged_rows)

VOCAB_SIZE = 32
"""Vocabulary of the requests handed to vLLM's ``InputBatch`` (sampling state is
sized by it; no token is ever sampled)."""


class VllmInputBatch:
    """vLLM's own V1 persistent batch (``InputBatch`` in
    ``vllm/v1/worker/gpu_input_batch.py``) behind the interface the V1 runner
    shell drives (:class:`gpu_impl.runner_shell_v1.PersistentBatch`): which
    request sits in which row, ``add_request`` (a free row: the lowest one
    removal left, else the end), ``remove_request`` (``clear_row``),
    ``condense`` (``move_row``), ``swap_states`` (``swap_row``) — vLLM's code
    paths, on vLLM's ``MultiGroupBlockTable`` (``block_table``).

    Request ids are vLLM's strings (``str(req)``); ``req_ids`` reads them back
    as int64 (max_num_reqs,), -1 for an empty row.  ``num_computed_tokens`` /
    ``num_prompt_tokens`` are vLLM's host arrays, int32 (max_num_reqs,) — an
    empty row keeps what its last request left (vLLM never clears them;
    nothing reads them past the live rows).

    One adapter rule, ours: vLLM applies a scheduler output as removals, then
    additions, then ``condense`` + ``refresh_metadata`` (``_update_states``),
    and its ``BatchUpdateBuilder`` refuses a removal once an addition has
    read the removed rows.  A trace may remove after it added with no condense
    in between; the adapter then starts the next update itself, carrying the
    rows still empty over into it, as the next scheduler output would find them.
    """

    def __init__(self, config, device):
        vllm = load()
        sizes, kernel = _group_sizes(config)
        cand = dict(max_num_reqs=config.max_num_reqs, max_model_len=max_model_len(config),
                    max_num_batched_tokens=config.max_num_batched_tokens, device=device,
                    vocab_size=VOCAB_SIZE, block_sizes=sizes, kernel_block_sizes=kernel,
                    max_num_blocks_per_req=[config.blocks_per_req_max(g)
                                            for g in range(len(config.groups))],
                    cp_kv_cache_interleave_size=config.cp_kv_cache_interleave_size)
        if vllm.v1_slot_mapping_modes and vllm.SlotMappingMode is not None:
            modes = vllm.SlotMappingMode
            cand["slot_mapping_modes"] = [
                modes.TOKEN_TO_KV_SLOT if s.kind == "attention" else modes.NONE
                for s in config.groups]
        self.batch = vllm.InputBatch(**_kwargs_for(vllm.InputBatch.__init__, cand))
        self.max_num_reqs = config.max_num_reqs
        self._vllm = vllm

    @property
    def block_table(self):
        return self.batch.block_table

    @property
    def num_computed_tokens(self) -> np.ndarray:
        return self.batch.num_computed_tokens_cpu

    @property
    def num_prompt_tokens(self) -> np.ndarray:
        return self.batch.num_prompt_tokens

    @property
    def num_accepted_tokens(self) -> np.ndarray:
        """vLLM's ``num_accepted_tokens_cpu`` (moved by its condense / swap_states)."""
        return self.batch.num_accepted_tokens_cpu

    @property
    def req_ids(self) -> np.ndarray:
        out = np.full(self.max_num_reqs, EMPTY_ROW, np.int64)
        for row, req in enumerate(self.batch._req_ids):
            if req is not None:
                out[row] = int(req)
        return out

    @property
    def num_reqs(self) -> int:
        return self.batch.num_reqs

    def row_of(self, req: int) -> int | None:
        return self.batch.req_id_to_index.get(str(req))

    def add_request(self, req: int, block_ids: list[list[int]], num_computed_tokens: int,
                    num_prompt_tokens: int, num_accepted_tokens: int = 1) -> int:
        """vLLM's ``add_request`` (it sets the row's accepted count to 1 whatever
        ``num_accepted_tokens`` the request had; only spec-decode configs, which
        this target refuses, would read it)."""
        vllm = self._vllm
        state = vllm.CachedRequestState(**_kwargs_for(vllm.CachedRequestState.__init__, dict(
            req_id=str(req), prompt_token_ids=[0] * num_prompt_tokens, mm_features=[],
            sampling_params=vllm.SamplingParams(temperature=0.0), generator=None,
            block_ids=tuple(list(ids) for ids in block_ids),
            num_computed_tokens=num_computed_tokens, output_token_ids=[])))
        return self.batch.add_request(state)

    def remove_request(self, req: int) -> int | None:
        builder = self.batch.batch_update_builder
        if getattr(builder, "_is_removed_sorted", False):
            self._next_update(carry=list(builder.removed))
        return self.batch.remove_request(str(req))

    def swap_states(self, i: int, j: int) -> None:
        self.batch.swap_states(i, j)

    def condense(self) -> None:
        self.batch.condense()
        self._next_update(carry=[])

    def _next_update(self, carry: list[int]) -> None:
        """End vLLM's current batch update (``refresh_metadata``), then register
        ``carry`` — rows still empty — as removed in the next one."""
        self.batch.refresh_metadata()
        for row in sorted(carry, reverse=True):
            self.batch.batch_update_builder.removed_append(row)


class _VllmMetadataBuilders:
    """The metadata build through vLLM's own builders
    (:mod:`harness.targets.vllm_builders`).  Mamba groups: FULL graphs are
    captured on ``Mamba2AttentionMetadataBuilder``'s persistent decode buffer,
    and every build's state indices are what it returns.  Attention groups: the
    KV write and attention read take what ``TritonAttentionMetadataBuilder``
    hands the layer.  The runner side stays the shell's: counters,
    ``is_prefilling``, padded rows (nulled on a copy of the block table for the
    Mamba build, as vLLM's runner nulls them in place)."""

    def _init_tables(self) -> None:
        super()._init_tables()
        from harness.targets.vllm_builders import VllmAttentionBuilders, VllmMambaBuilders

        self.attn_builders = VllmAttentionBuilders(
            self.config, self.device, {g: self.kernel_block_size(g) for g in self.attn_groups})
        self.mamba_builders = None
        if self.mamba_groups:
            self.mamba_builders = VllmMambaBuilders(self.config, self.device)
            for g in self.mamba_groups:
                # Ours: zeroed where vLLM allocates it empty, so replays are deterministic.
                self.state_indices[g] = self.mamba_builders.persistent(g)
                self.state_indices[g].zero_()

    def _attention_inputs(self, g, num_rows, num_tokens, table, metadata) -> tuple:
        if not metadata or num_rows == 0:  # no metadata: the KV write reads the slots alone
            return super()._attention_inputs(g, num_rows, num_tokens, table, metadata)
        return self.attn_builders.build(g, self.query_start_loc.gpu, self.seq_lens.gpu,
                                        table[:num_rows], self.slot_mappings[g][:num_tokens])

    def _build_mamba_metadata(self, num_reqs, num_rows, tables=None) -> None:
        if not self.mamba_groups or num_rows == 0:
            return
        qsl = self.query_start_loc.np[:num_rows + 1]
        seq_lens = self.seq_lens.np[:num_rows]
        prefilling = self.is_prefilling[:num_rows]
        k = self.config.num_speculative_tokens
        if k:
            # The rows' last accepted counts (a dummy run's: 1), as vLLM's runner
            # hands them to the builder; vLLM's build decides the decodes and
            # the counts and state columns their kernels read.
            acc = np.ones(num_rows, np.int32)
            if tables is None and num_reqs:
                acc[:num_reqs] = self._row_accepted(num_reqs)
            self._vllm_spec = None
            for g in self.mamba_groups:
                table = (self.kernel_table(g) if tables is None else tables[g])[
                    :num_rows, :1 + k].clone()
                table[num_reqs:] = 0  # NULL_BLOCK_ID: vLLM's runner nulls padded rows
                indices, counts, num_decodes = self.mamba_builders.build_spec(
                    g, table, qsl, seq_lens, prefilling, acc)
                self.read_state_indices[g] = indices
                self._vllm_spec = (counts, num_decodes)
            return
        for g in self.mamba_groups:
            table = (self.kernel_table(g) if tables is None else tables[g])[:num_rows, :1].clone()
            table[num_reqs:] = 0  # NULL_BLOCK_ID: vLLM's runner nulls padded rows
            self.read_state_indices[g] = self.mamba_builders.build(g, table, qsl, seq_lens,
                                                                   prefilling)


    def _build_spec_metadata(self, num_reqs, num_rows, dummy) -> None:
        """The spec-decode inputs of the Mamba kernel from vLLM's build: its
        decode rows run the spec path with the counts it returned."""
        spec = getattr(self, "_vllm_spec", None)
        if not self.config.num_speculative_tokens or not self.mamba_groups or spec is None:
            return super()._build_spec_metadata(num_reqs, num_rows, dummy)
        counts, num_decodes = spec
        self.num_accepted.np[:num_rows] = counts[:num_rows]
        self.spec_rows.np[:num_rows] = 0
        self.spec_rows.np[:num_decodes] = 1
        self.num_accepted.copy_to_gpu()
        self.spec_rows.copy_to_gpu()
        self._vllm_spec = None

    def _draft_slot_mapping(self, num_reqs, num_rows) -> None:
        """vLLM's own EAGLE step kernel (``eagle_step_update_slot_mapping_and_metadata``,
        ``vllm/v1/spec_decode/utils.py``): each real row's previous position + 1
        through the draft group's kernel-block table, PAD from ``max_model_len``
        on and for the padded rows ``[num_reqs, num_rows)``."""
        from vllm.v1.spec_decode.utils import eagle_step_update_slot_mapping_and_metadata

        g = self.draft_group
        if num_reqs == 0:  # a dummy run: vLLM's kernel launched over padding only
            self.draft_slots[:num_rows] = -1
            return
        previous = self.draft_positions.gpu[:num_reqs] - 1
        seq_lens = previous + 1
        clamped = torch.zeros_like(previous)
        eagle_step_update_slot_mapping_and_metadata(
            previous, self.kernel_table(g)[:num_reqs], seq_lens, self.kernel_block_size(g),
            self.config.max_model_len, clamped, self.draft_slots, input_batch_size=num_rows)
        # Rows with no draft position (past max_model_len): vLLM clamps them the same way.


class _ReferenceWidth:
    """Report the block-table columns the reference has: vLLM V1 pads each row to
    an alignment its attention backends need (columns nothing writes)."""

    def _report_width(self, group: int) -> int:
        cfg = self.config
        spec = cfg.groups[group]
        split = spec.block_size // self.kernel_block_size(group) \
            if spec.kind == "attention" else 1
        return cfg.blocks_per_req_max(group) * split


class VllmV1Runner(_VllmMetadataBuilders, _ReferenceWidth, RunnerShellV1):
    """The V1 runner shell over vLLM's own persistent batch (:class:`VllmInputBatch`:
    vLLM's ``InputBatch`` with its ``MultiGroupBlockTable``).  (config, device)."""

    def _make_input_batch(self) -> VllmInputBatch:
        cfg = self.config
        batch = VllmInputBatch(cfg, self.device)
        tables = batch.block_table
        for g in self.attn_groups:
            # vLLM reads these from the decode-context-parallel group at
            # construction; a single process has none, so set what it would give.
            tables[g].dcp_world_size = cfg.dcp_world_size
            tables[g].dcp_rank = cfg.dcp_rank
            self.slot_mappings[g] = tables[g].slot_mapping.gpu
        self._num_reqs = self._num_tokens = 0
        return batch

    def kernel_block_size(self, group: int) -> int:
        return self.input_batch.block_table[group].block_size

    def _reorder(self, num_tokens_of: dict, threshold: int) -> None:
        """vLLM's own ``reorder_batch_to_split_decodes_and_prefills`` on its
        ``InputBatch`` (the scheduler output: the step's token counts)."""
        from types import SimpleNamespace

        scheduled = SimpleNamespace(num_scheduled_tokens={str(r): n
                                                          for r, n in num_tokens_of.items()})
        load().reorder_batch(self.input_batch.batch, scheduled, decode_threshold=threshold)

    def _commit_rows(self, num_rows: int) -> None:
        self.input_batch.block_table.commit_block_table(num_rows)

    def _stage_tables(self, batch, reqs_padded) -> None:
        self._num_reqs = len(batch)
        self._num_tokens = sum(n for _, n, _ in batch)
        super()._stage_tables(batch, reqs_padded)

    def _compute_slot_mapping(self, group: int, tokens_padded: int) -> None:
        self.input_batch.block_table[group].compute_slot_mapping(
            self._num_reqs, self.query_start_loc.gpu[:self._num_reqs + 1],
            self.positions.gpu[:self._num_tokens])


class VllmV2Runner(_VllmMetadataBuilders, _ReferenceWidth, RunnerShellV2):
    """The V2 runner shell with vLLM's ``BlockTables`` as its tables and vLLM's
    ``RequestState`` (``vllm/v1/worker/gpu/states.py``) assigning and releasing
    state indices (its free list: the last index freed is the next one given).
    (config, device)."""

    def _make_block_tables(self):
        vllm, cfg = load(), self.config
        sizes, kernel = _group_sizes(cfg)
        attn = [s.kind == "attention" for s in cfg.groups]
        cand = dict(block_sizes=sizes, max_num_reqs=cfg.max_num_reqs,
                    max_num_batched_tokens=cfg.max_num_batched_tokens,
                    max_num_blocks_per_group=[cfg.blocks_per_req_max(g)
                                              for g in range(len(cfg.groups))],
                    device=self.device, kernel_block_sizes=kernel,
                    slot_mapping_enabled=attn, dcp_sharded=attn,
                    cp_size=cfg.dcp_world_size, cp_rank=cfg.dcp_rank,
                    cp_interleave=cfg.cp_kv_cache_interleave_size)
        tables = vllm.BlockTables(**_kwargs_for(vllm.BlockTables.__init__, cand))
        self.req_states = vllm.RequestState(**_kwargs_for(vllm.RequestState.__init__, dict(
            max_num_reqs=cfg.max_num_reqs, max_model_len=max_model_len(cfg),
            max_num_batched_tokens=cfg.max_num_batched_tokens, num_speculative_steps=0,
            vocab_size=VOCAB_SIZE, device=self.device)))
        self.kernel_sizes = kernel if vllm.v2_kernel_blocks else sizes
        for g in self.attn_groups:
            self.slot_mappings[g] = tables.slot_mappings[g]
        self._num_reqs = 0
        self._pending: set[int] = set()  # state indices with a staged write
        return tables

    def kernel_block_size(self, group: int) -> int:
        return self.kernel_sizes[group]

    # Staged writes are applied once per step, as vLLM's runner does (all the
    # adds / appends of one scheduler output in one launch).  vLLM stages at
    # most one write per request between two steps (a new request arrives with
    # all its blocks), and 0.26's fused writer is sized for exactly that; a
    # trace can stage a second write to the same state index (add then append,
    # or remove and re-add) — that starts a new scheduler output: flush first.
    def _stage_write(self, index: int) -> None:
        if index in self._pending:
            self._apply_staged_writes()
        self._pending.add(index)

    def _apply_staged_writes(self) -> None:
        self.req_states.apply_staged_writes()
        self.block_tables.apply_staged_writes()
        self._pending.clear()

    def _assign_index(self, req, state) -> int:
        """vLLM's ``RequestState.add_request`` picks the index (prompt tokens: zeros)."""
        index = self.req_states.free_indices[-1] if self.req_states.free_indices else None
        if index is not None:
            self._stage_write(index)  # before add_request stages its own writes
        self.req_states.add_request(str(req), state.prompt_len, [0] * state.prompt_len,
                                    state.num_computed_tokens,
                                    max_model_len(self.config) - state.prompt_len)
        index = self.req_states.req_id_to_index[str(req)]
        self.req_index[req] = index
        return index

    def _release_index(self, req) -> int:
        index = self.req_states.remove_request(str(req))
        self.req_index.pop(req)
        return index

    def _rows_append(self, req, block_ids) -> None:
        self._stage_write(self.req_index[req])
        super()._rows_append(req, block_ids)

    def _clear_staged_row(self, index: int) -> None:
        """vLLM keeps a finished request's staged row; add overwrites it on reuse."""

    def _gather(self, num_reqs: int, reqs_padded: int) -> None:
        self._num_reqs = num_reqs
        self._apply_staged_writes()  # the request states' (the tables' were just applied)
        self.block_tables.gather_block_tables(self.idx_mapping.gpu[:num_reqs], reqs_padded)

    def _compute_slot_mapping(self, group: int, tokens_padded: int) -> None:
        if group != self.attn_groups[0]:
            return  # one launch computes every group's slot mapping
        n = self._num_reqs
        num_tokens = int(self.query_start_loc.np[n])
        self.block_tables.compute_slot_mappings(
            self.idx_mapping.gpu[:n], self.query_start_loc.gpu[:n + 1],
            self.positions.gpu[:num_tokens], tokens_padded)

    def _fill_dummy_slots(self, num_tokens, tokens_padded, warmup) -> None:
        self.block_tables.get_dummy_slot_mappings(num_tokens)

    def _staged_rows(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """vLLM's staged rows as they will be after ``apply_staged_writes``."""
        return staged_rows(self.block_tables, self.config.max_num_reqs)
