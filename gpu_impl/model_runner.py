"""V1 model runner: the persistent batch (``InputBatch`` + ``BlockTable``).

Our own take on ``vllm/v1/worker/gpu_model_runner.py``: ``_update_states``
removes requests a step does not schedule from the persistent batch (they keep
their blocks), adds scheduled ones at the lowest free row and condenses; the
batch rows are then rows 0..num_reqs-1, and each forward commits them to the
device table the kernels read.  A dummy run is an idle rank's step with
nothing scheduled.  Shared machinery: :mod:`gpu_impl.runner_base`.

Faults consulted here: ``dummy-slots-not-padded``, ``dummy-slots-unpadded-count``
(plus those of the input batch and block tables).
"""

from __future__ import annotations

import torch

from .block_table import PAD_SLOT_ID
from .input_batch import EMPTY_ROW, InputBatch
from .runner_base import GPUModelRunnerBase


class GPUModelRunnerV1(GPUModelRunnerBase):
    """The implementation under test for runner ``v1``."""

    def _init_tables(self) -> None:
        cfg = self.config
        groups = cfg.groups
        widths = [1 if s.kind == "mamba" else cfg.max_num_blocks_per_req for s in groups]
        self.input_batch = InputBatch(cfg.max_num_reqs, widths, [s.block_size for s in groups],
                                      [s.kernel_block_size for s in groups], self.device,
                                      self.faults, [self.dcp(g) for g in range(len(groups))])

    def kernel_table(self, group: int) -> torch.Tensor:
        return self.input_batch.block_table[group].block_table.gpu

    def kernel_block_size(self, group: int) -> int:
        return self.input_batch.block_table[group].kernel_block_size

    def _compute_slot_mapping(self, group: int, tokens_padded: int) -> None:
        self.input_batch.block_table[group].compute_slot_mapping(
            self.req_indices.gpu, self.positions.gpu, self.slot_mappings[group], tokens_padded)

    # -- V1-only ops -------------------------------------------------------------
    def condense(self) -> None:
        self.input_batch.condense()

    def swap_states(self, i: int, j: int) -> None:
        self.input_batch.swap_states(i, j)

    # -- hooks -------------------------------------------------------------------
    def _rows_add(self, req, state) -> None:
        self.input_batch.add_request(req, state.block_ids, 0, state.prompt_len)

    def _rows_append(self, req, block_ids) -> None:
        row = self.input_batch.row_of(req)
        if row is not None:
            self.input_batch.block_table.append_row(block_ids, row)

    def _rows_remove(self, req) -> None:
        self.input_batch.remove_request(req)

    def _set_num_computed(self, req, num_tokens) -> None:
        row = self.input_batch.row_of(req)
        if row is not None:
            self.input_batch.num_computed_tokens[row] = num_tokens

    def _batch(self, scheduled):
        num_tokens_of = {req: n for req, n in scheduled}
        self._update_states(num_tokens_of)
        batch = self.input_batch
        out = []
        for row in range(len(num_tokens_of)):
            req = int(batch.req_ids[row])
            out.append((req, num_tokens_of[req], int(batch.num_computed_tokens[row])))
        return out

    def _stage_tables(self, batch, reqs_padded) -> None:
        self.input_batch.block_table.commit(reqs_padded)

    def _advance(self, batch) -> None:
        for row, (req, n, start) in enumerate(batch):
            self.input_batch.num_computed_tokens[row] = start + n

    def _prepare_dummy(self, reqs_padded, warmup) -> None:
        self._update_states({})  # an idle rank: nothing scheduled, every request leaves
        self.input_batch.block_table.commit(reqs_padded)

    def _fill_dummy_slots(self, num_tokens, tokens_padded, warmup) -> None:
        for g in self.attn_groups:
            sm = self.slot_mappings[g]
            # Faults apply to runtime dummy runs (idle DP ranks); start-up warm-ups
            # stage capture metadata on their own path.
            if "dummy-slots-not-padded" in self.faults and not warmup:
                sm[:tokens_padded].zero_()  # the historical zero-initialised buffer
            elif "dummy-slots-unpadded-count" in self.faults and not warmup:
                sm[:num_tokens].fill_(PAD_SLOT_ID)  # padded tail keeps old slots
            else:
                sm[:tokens_padded].fill_(PAD_SLOT_ID)

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
