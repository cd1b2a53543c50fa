"""V1 model runner over a hybrid KV cache: padding, metadata, graphs, dummy runs.

Our own implementation of the block-table-facing parts of
``vllm/v1/worker/gpu_model_runner.py``:

- ``execute_model`` runs ``_update_states`` (requests not scheduled leave the
  persistent batch but keep their blocks; scheduled ones not in it enter at the
  lowest free row; ``condense``), commits the block tables, stages the
  persistent metadata buffers (token payloads, query start locations, sequence
  lengths, slot mappings through a Triton kernel, Mamba state indices from
  ``block_table[:, 0]``), and runs the forward — eagerly (``NONE``,
  ``PIECEWISE``: metadata rebuilt every step, tokens padded to a capture size)
  or by replaying a ``FULL`` graph that reads the persistent buffers.
- ``dummy_run`` is an idle data-parallel rank's padded fake batch: NaN payload,
  slot mappings filled with ``PAD_SLOT_ID`` and metadata re-staged from the
  (zeroed) rows — also before a FULL replay.
- Graphs are captured at start-up through dummy runs, one per capture size,
  largest first, after an eager warm-up of the same size.

Faults consulted here: ``full-replay-not-restaged``, ``dummy-slots-not-padded``,
``dummy-slots-unpadded-count``.
"""

from __future__ import annotations

import numpy as np
import torch

from .attention import paged_attention_read, reshape_and_cache
from .block_table import PAD_SLOT_ID, CpuGpuBuffer
from .cuda_graph import Graph
from .faults import FaultSet
from .input_batch import EMPTY_ROW, InputBatch
from .mamba import mamba_state_update

NONE, PIECEWISE, FULL = "NONE", "PIECEWISE", "FULL"
NULL_BLOCK_ID = 0
SENTINEL = -7.0  # what a freed block is poisoned with (finite, no payload uses it)


def token_payload(req: int, positions: np.ndarray, head_size: int) -> np.ndarray:
    """The model's stand-in activations: float32 (N, head_size), integer-valued."""
    d = np.arange(head_size, dtype=np.int64)
    return (req * 1024 + positions.astype(np.int64)[:, None] * 4 + d + 1).astype(np.float32)


class CachedRequestState:
    """What the runner keeps for a live request, in the batch or not."""

    def __init__(self, req: int, prompt_len: int, block_ids: list[list[int]]):
        self.req = req
        self.prompt_len = prompt_len
        self.block_ids = [list(b) for b in block_ids]
        self.num_computed_tokens = 0


class GPUModelRunnerV1:
    """The implementation under test for runner ``v1``.

    config: a ``reference.RunnerConfig``-shaped object (read for its fields
    only); faults: :class:`FaultSet`; device: torch.device.  Tensors:
    ``kv_caches[g]`` float32 (num_blocks, block_size, head_size),
    ``mamba_states[g]`` float32 (num_blocks, head_size), persistent buffers in
    ``self.buffers()``.
    """

    def __init__(self, config, faults: FaultSet, device: torch.device):
        self.config = cfg = config
        self.faults = faults
        self.device = device
        groups = cfg.groups
        self.attn_groups = [g for g, s in enumerate(groups) if s.kind == "attention"]
        self.mamba_groups = [g for g, s in enumerate(groups) if s.kind == "mamba"]
        widths = [1 if s.kind == "mamba" else cfg.max_num_blocks_per_req for s in groups]
        self.input_batch = InputBatch(cfg.max_num_reqs, widths, [s.block_size for s in groups],
                                      device, faults)
        self.requests: dict[int, CachedRequestState] = {}
        rows, tokens, heads = cfg.max_num_reqs, cfg.max_num_batched_tokens, cfg.head_size
        self.kv_caches, self.mamba_states = {}, {}
        for g in self.attn_groups:
            kv = torch.full((cfg.num_blocks, groups[g].block_size, heads), SENTINEL,
                            dtype=torch.float32, device=device)
            kv[NULL_BLOCK_ID] = 0.0
            self.kv_caches[g] = kv
        for g in self.mamba_groups:
            st = torch.full((cfg.num_blocks, heads), SENTINEL, dtype=torch.float32, device=device)
            st[NULL_BLOCK_ID] = 0.0
            self.mamba_states[g] = st
        # Persistent input and metadata buffers: allocated once, graph-captured.
        self.req_indices = CpuGpuBuffer((tokens,), torch.int32, device)
        self.positions = CpuGpuBuffer((tokens,), torch.int64, device)
        self.hidden = CpuGpuBuffer((tokens, heads), torch.float32, device)
        self.query_start_loc = CpuGpuBuffer((rows + 1,), torch.int32, device)
        self.seq_lens = CpuGpuBuffer((rows,), torch.int32, device)
        self.has_initial_state = CpuGpuBuffer((rows,), torch.int32, device)
        self.slot_mappings = {g: torch.zeros(tokens, dtype=torch.int64, device=device)
                              for g in self.attn_groups}
        self.state_indices = {g: torch.zeros(rows, dtype=torch.int32, device=device)
                              for g in self.mamba_groups}
        self.attn_out = {g: torch.zeros((rows, heads), dtype=torch.float32, device=device)
                         for g in self.attn_groups}
        self.graphs: dict[int, Graph] = {}
        self.last_forward: tuple | None = None
        self._capture_model()

    # -- scheduler-driven request ops ----------------------------------------
    def add_request(self, req: int, block_ids: list[list[int]], prompt_len: int) -> None:
        self.requests[req] = CachedRequestState(req, prompt_len, block_ids)
        self.input_batch.add_request(req, block_ids, 0, prompt_len)

    def append_blocks(self, req: int, block_ids: list[list[int]]) -> None:
        state = self.requests[req]
        for g, ids in enumerate(block_ids):
            state.block_ids[g].extend(ids)
        row = self.input_batch.row_of(req)
        if row is not None:
            self.input_batch.block_table.append_row(block_ids, row)

    def finish_request(self, req: int) -> None:
        """Remove from the batch; the allocator frees and poisons its blocks."""
        state = self.requests.pop(req)
        self.input_batch.remove_request(req)
        for g, ids in enumerate(state.block_ids):
            cache = self.kv_caches.get(g, self.mamba_states.get(g))
            cache[torch.tensor(ids, dtype=torch.long, device=self.device)] = SENTINEL

    def condense(self) -> None:
        self.input_batch.condense()

    def swap_states(self, i: int, j: int) -> None:
        self.input_batch.swap_states(i, j)

    def kv_load(self, req: int) -> None:
        """A P/D connector writes the prompt's KV and the final Mamba state."""
        state = self.requests[req]
        pos = np.arange(state.prompt_len)
        values = torch.from_numpy(token_payload(req, pos, self.config.head_size)).to(self.device)
        for g in self.attn_groups:
            bs = self.config.groups[g].block_size
            blocks = torch.tensor(np.asarray(state.block_ids[g])[pos // bs], device=self.device)
            self.kv_caches[g][blocks, torch.from_numpy(pos % bs).to(self.device)] = values
        for g in self.mamba_groups:
            self.mamba_states[g][state.block_ids[g][0]] = values.sum(dim=0)
        state.num_computed_tokens = state.prompt_len
        row = self.input_batch.row_of(req)
        if row is not None:
            self.input_batch.num_computed_tokens[row] = state.prompt_len

    # -- forwards --------------------------------------------------------------
    def execute_model(self, scheduled: list, cudagraph_mode: str) -> None:
        """One real step. scheduled: [(req, num_tokens)], any subset of live requests."""
        num_tokens_of = {req: n for req, n in scheduled}
        self._update_states(num_tokens_of)
        batch = self.input_batch
        num_reqs = len(num_tokens_of)
        num_tokens = sum(num_tokens_of.values())
        mode, tokens_padded, reqs_padded = self._dispatch(
            num_reqs, num_tokens, all(n == 1 for n in num_tokens_of.values()), cudagraph_mode)
        batch.block_table.commit(reqs_padded)
        t = 0
        self.query_start_loc.np[0] = 0
        for row in range(num_reqs):
            req = int(batch.req_ids[row])
            n, start = num_tokens_of[req], int(batch.num_computed_tokens[row])
            pos = np.arange(start, start + n)
            self.req_indices.np[t:t + n] = row
            self.positions.np[t:t + n] = pos
            self.hidden.np[t:t + n] = token_payload(req, pos, self.config.head_size)
            self.seq_lens.np[row] = start + n
            self.has_initial_state.np[row] = int(start > 0)
            t += n
            self.query_start_loc.np[row + 1] = t
        self._stage_padding(num_reqs, reqs_padded, num_tokens, tokens_padded)
        for g in self.attn_groups:
            batch.block_table[g].compute_slot_mapping(
                self.req_indices.gpu, self.positions.gpu, self.slot_mappings[g], tokens_padded)
        for g in self.mamba_groups:
            table = batch.block_table[g].block_table.gpu
            self.state_indices[g][:num_reqs] = table[:num_reqs, 0]
            # Rows padded for a FULL graph write their garbage state to the null block.
            self.state_indices[g][num_reqs:reqs_padded] = NULL_BLOCK_ID
        self._run_forward(mode, reqs_padded if mode == FULL else num_reqs, tokens_padded)
        for row in range(num_reqs):
            req = int(batch.req_ids[row])
            batch.num_computed_tokens[row] += num_tokens_of[req]
            self.requests[req].num_computed_tokens = int(batch.num_computed_tokens[row])
        self.last_forward = (False, mode, num_reqs, reqs_padded, num_tokens, tokens_padded)

    def dummy_run(self, num_reqs: int, num_tokens: int, cudagraph_mode: str,
                  _warmup: bool = False) -> None:
        """A padded fake batch with a NaN payload (idle DP rank, capture warm-up).

        num_reqs <= num_tokens <= max_num_batched_tokens; one token per row when
        equal (uniform decode, FULL-eligible), else an even split.
        """
        self._update_states({})
        mode, tokens_padded, reqs_padded = self._dispatch(
            num_reqs, num_tokens, num_tokens == num_reqs, cudagraph_mode)
        self.input_batch.block_table.commit(reqs_padded)
        lens = np.full(num_reqs, num_tokens // num_reqs, np.int32)
        lens[-1] += num_tokens % num_reqs
        self.query_start_loc.np[0] = 0
        self.query_start_loc.np[1:num_reqs + 1] = np.cumsum(lens)
        self.seq_lens.np[:num_reqs] = lens
        self.has_initial_state.np[:num_reqs] = 0
        self.hidden.np[:tokens_padded] = np.nan  # dummy activations are garbage
        self._stage_padding(num_reqs, reqs_padded, num_tokens, tokens_padded)
        for g in self.attn_groups:
            sm = self.slot_mappings[g]
            # Faults apply to runtime dummy runs (idle DP ranks); start-up warm-ups
            # stage capture metadata on their own path.
            if "dummy-slots-not-padded" in self.faults and not _warmup:
                sm[:tokens_padded].zero_()  # the historical zero-initialised buffer
            elif "dummy-slots-unpadded-count" in self.faults and not _warmup:
                sm[:num_tokens].fill_(PAD_SLOT_ID)  # padded tail keeps old slots
            else:
                sm[:tokens_padded].fill_(PAD_SLOT_ID)
        restage = not (mode == FULL and not _warmup and "full-replay-not-restaged" in self.faults)
        if restage:
            # FULL replays read these buffers: re-stage them from the dummy rows,
            # never keep the previous real batch's state indices.
            for g in self.mamba_groups:
                table = self.input_batch.block_table[g].block_table.gpu
                self.state_indices[g][:reqs_padded] = table[:reqs_padded, 0]
        num_rows = reqs_padded if mode == FULL else num_reqs
        if not _warmup:
            self._run_forward(mode, num_rows, tokens_padded)
        elif self.device.type == "cuda":
            # Start-up warm-up compiles the kernels before capture.  Under the
            # interpreter there is nothing to compile, and a warm-up's only
            # effect would be garbage in the mamba null block (scratch).
            self._forward(num_rows, tokens_padded)
        self.last_forward = (True, mode, num_reqs, reqs_padded, num_tokens, tokens_padded)

    # -- internals -------------------------------------------------------------
    def _update_states(self, num_tokens_of: dict) -> None:
        batch = self.input_batch
        for row in range(len(batch.req_ids)):
            req = int(batch.req_ids[row])
            if req != EMPTY_ROW and req not in num_tokens_of:
                batch.remove_request(req)
        for req in num_tokens_of:
            if batch.row_of(req) is None:
                st = self.requests[req]
                batch.add_request(req, st.block_ids, st.num_computed_tokens, st.prompt_len)
        batch.condense()

    def _dispatch(self, num_reqs: int, num_tokens: int, uniform_decode: bool, requested: str):
        if requested == NONE:
            return NONE, num_tokens, num_reqs
        sizes = [s for s in self.config.cudagraph_capture_sizes if s >= num_tokens]
        if not sizes:
            return NONE, num_tokens, num_reqs
        padded = sizes[0]
        if requested == FULL and uniform_decode and padded <= self.config.max_num_reqs:
            return FULL, padded, padded
        return PIECEWISE, padded, num_reqs

    def _stage_padding(self, num_reqs, reqs_padded, num_tokens, tokens_padded) -> None:
        """Padding rows and tokens, then one host -> device copy per buffer."""
        for row in range(num_reqs, reqs_padded):
            self.query_start_loc.np[row + 1] = self.query_start_loc.np[row] + 1
            self.seq_lens.np[row] = 0
            self.has_initial_state.np[row] = 0
        self.req_indices.np[num_tokens:tokens_padded] = -1
        self.hidden.np[num_tokens:tokens_padded] = np.nan
        for buf in (self.req_indices, self.positions, self.hidden, self.query_start_loc,
                    self.seq_lens, self.has_initial_state):
            buf.copy_to_gpu()

    def _run_forward(self, mode: str, num_rows: int, tokens_padded: int) -> None:
        if mode == FULL:
            assert num_rows == tokens_padded
            self.graphs[tokens_padded].replay()
        else:
            self._forward(num_rows, tokens_padded)

    def _forward(self, num_rows: int, num_tokens: int) -> None:
        """The model: KV writes, Mamba state updates, attention reads."""
        for g in self.attn_groups:
            reshape_and_cache(self.hidden.gpu, self.slot_mappings[g], self.kv_caches[g],
                              num_tokens)
        for g in self.mamba_groups:
            mamba_state_update(self.hidden.gpu, self.query_start_loc.gpu, self.state_indices[g],
                               self.has_initial_state.gpu, self.mamba_states[g], num_rows)
        for g in self.attn_groups:
            paged_attention_read(self.input_batch.block_table[g].block_table.gpu,
                                 self.seq_lens.gpu, self.kv_caches[g], self.attn_out[g],
                                 num_rows)

    def buffers(self) -> dict[str, torch.Tensor]:
        """Every persistent device buffer a FULL graph reads or writes, by name."""
        named = {"req_indices": self.req_indices.gpu, "positions": self.positions.gpu,
                 "hidden": self.hidden.gpu, "query_start_loc": self.query_start_loc.gpu,
                 "seq_lens": self.seq_lens.gpu, "has_initial_state": self.has_initial_state.gpu}
        for g in self.attn_groups:
            named[f"slot_mapping[{g}]"] = self.slot_mappings[g]
            named[f"kv_cache[{g}]"] = self.kv_caches[g]
            named[f"attn_out[{g}]"] = self.attn_out[g]
            named[f"block_table[{g}]"] = self.input_batch.block_table[g].block_table.gpu
        for g in self.mamba_groups:
            named[f"state_indices[{g}]"] = self.state_indices[g]
            named[f"mamba_state[{g}]"] = self.mamba_states[g]
            named[f"block_table[{g}]"] = self.input_batch.block_table[g].block_table.gpu
        return named

    def _capture_model(self) -> None:
        """Warm up and capture one graph per FULL capture size, largest first."""
        rows = self.config.max_num_reqs
        for size in reversed(self.config.cudagraph_capture_sizes):
            self.dummy_run(min(size, rows), size, FULL, _warmup=True)
            if size <= rows:
                graph = Graph(self.device)
                with graph.capture(self.buffers()):
                    self._forward(size, size)
                self.graphs[size] = graph
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self.last_forward = None


