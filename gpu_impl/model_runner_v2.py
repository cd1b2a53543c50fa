"""V2 model runner: stable state indices, staged block tables, gather.

Our own take on ``vllm/v1/worker/gpu/model_runner.py``, on gpu_impl's
:class:`~gpu_impl.block_table_v2.BlockTables`.  The fault-free machinery is
:mod:`gpu_impl.runner_shell_v2`; the faults this runner can switch on live in
:mod:`gpu_impl.runner_faults` and the block tables.
"""

from __future__ import annotations

from .block_table_v2 import BlockTables
from .runner_faults import RunnerFaults
from .runner_shell_v2 import RunnerShellV2


class GPUModelRunnerV2(RunnerFaults, RunnerShellV2):
    """The implementation under test for runner ``v2``: (config, faults, device)."""

    def _make_block_tables(self) -> BlockTables:
        cfg = self.config
        groups = cfg.groups
        max_blocks = self._row_widths()
        return BlockTables([s.block_size for s in groups], [s.kernel_block_size for s in groups],
                           max_blocks, cfg.max_num_reqs, self.device, self.faults,
                           [self.dcp(g) for g in range(len(groups))],
                           [cfg.empty_entry(g) for g in range(len(groups))])

    def kernel_block_size(self, group: int) -> int:
        return self.block_tables.kernel_block_sizes[group]

    def _compute_slot_mapping(self, group: int, tokens_padded: int) -> None:
        self.block_tables.compute_slot_mappings(group, self.req_indices.gpu, self.positions.gpu,
                                                self.slot_mappings[group], tokens_padded)

    def _clear_staged_row(self, index: int) -> None:
        self.block_tables.clear(index)

    def _gather(self, num_reqs: int, reqs_padded: int) -> None:
        self.block_tables.gather_block_tables(self.idx_mapping.gpu, num_reqs, reqs_padded)

    def _fill_dummy_slots(self, num_tokens, tokens_padded, warmup) -> None:
        if warmup:  # start-up capture stages its own metadata; faults are runtime bugs
            for g in self.attn_groups:
                self.slot_mappings[g].fill_(-1)
            return
        self.block_tables.get_dummy_slot_mappings(
            [self.slot_mappings[g] for g in self.attn_groups], num_tokens)
