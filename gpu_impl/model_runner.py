"""V1 model runner: the persistent batch (``InputBatch`` + ``BlockTable``).

Our own take on ``vllm/v1/worker/gpu_model_runner.py``, on gpu_impl's
:class:`~gpu_impl.input_batch.InputBatch` and block tables.  The fault-free
machinery is :mod:`gpu_impl.runner_shell_v1`; this class adds the tables and
the fault branches of the dummy run's slot mappings (plus those of
:mod:`gpu_impl.runner_faults`, the input batch and the block tables).

Faults consulted here: ``dummy-slots-not-padded``, ``dummy-slots-unpadded-count``,
``dummy-rows-not-committed``, ``accepted-counts-land-after-condense``,
``completed-counts-land-by-row``.
"""

from __future__ import annotations


from .block_table import PAD_SLOT_ID
from .input_batch import InputBatch
from .runner_faults import RunnerFaults
from .runner_shell_v1 import RunnerShellV1


class GPUModelRunnerV1(RunnerFaults, RunnerShellV1):
    """The implementation under test for runner ``v1``: (config, faults, device)."""

    def _make_input_batch(self) -> InputBatch:
        cfg = self.config
        groups = cfg.groups
        return InputBatch(cfg.max_num_reqs, self._row_widths(), [s.block_size for s in groups],
                          [s.kernel_block_size for s in groups], self.device,
                          self.faults, [self.dcp(g) for g in range(len(groups))],
                          [cfg.empty_entry(g) for g in range(len(groups))])

    def _commit_rows(self, num_rows: int) -> None:
        self.input_batch.block_table.commit(num_rows)

    def _prepare_dummy(self, reqs_padded, warmup):
        if "dummy-rows-not-committed" in self.faults and not warmup:
            # The historical bug: the idle rank's rows are cleared on the host only;
            # the metadata build reads the device table the last real batch committed.
            self._update_states({})
            return [self.kernel_table(g) for g in range(len(self.config.groups))]
        return super()._prepare_dummy(reqs_padded, warmup)

    def _store_accepted(self, batch, kept) -> None:
        if "accepted-counts-land-after-condense" not in self.faults:
            return super()._store_accepted(batch, kept)
        # The historical race: the copy of the counts (by batch row) lands only
        # after the next step's _update_states moved the rows.
        self._late_accepted = list(kept)
        for (req, _, _), a in zip(batch, kept):
            self.requests[req].num_accepted = a

    def _land_results(self, batch, kept) -> None:
        if "completed-counts-land-by-row" not in self.faults:
            return super()._land_results(batch, kept)
        # The historical race: the host copy of a dispatched step's counts lands
        # in the rows its batch had at dispatch, whoever holds them now.
        for b, ((req, _, _), a) in enumerate(zip(batch, kept)):
            self.input_batch.num_accepted_tokens[b] = a
            if req in self.requests:
                self.requests[req].num_accepted = a

    def _update_states(self, num_tokens_of: dict) -> None:
        super()._update_states(num_tokens_of)
        late = getattr(self, "_late_accepted", None)
        if late is not None:
            self.input_batch.num_accepted_tokens[:len(late)] = late
            self._late_accepted = None

    def kernel_block_size(self, group: int) -> int:
        return self.input_batch.block_table[group].kernel_block_size

    def _compute_slot_mapping(self, group: int, tokens_padded: int) -> None:
        self.input_batch.block_table[group].compute_slot_mapping(
            self.req_indices.gpu, self.positions.gpu, self.slot_mappings[group], tokens_padded)

    def _fill_dummy_slots(self, num_tokens, tokens_padded, warmup) -> None:
        # Faults apply to runtime dummy runs (idle DP ranks); start-up warm-ups
        # stage capture metadata on their own path.
        if warmup or not ({"dummy-slots-not-padded", "dummy-slots-unpadded-count"}
                          & self.faults.ids):
            super()._fill_dummy_slots(num_tokens, tokens_padded, warmup)
            return
        for g in self.attn_groups:
            sm = self.slot_mappings[g]
            if "dummy-slots-not-padded" in self.faults:
                sm[:tokens_padded].zero_()  # the historical zero-initialised buffer
            else:  # dummy-slots-unpadded-count
                sm[:num_tokens].fill_(PAD_SLOT_ID)  # padded tail keeps old slots
