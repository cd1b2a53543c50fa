"""The oracle of the V2 model runner: staged block tables and a gather.

Models ``vllm/v1/worker/gpu/block_table.py`` (``BlockTables``) and the V2
``vllm/v1/worker/gpu/model_runner.py``, fixed semantics:

- a request keeps a stable *state index* (its row of the staged tables) from
  add to remove; steps never move it, so there is no condense or swap;
- block-id writes are staged on the host and applied to the device tables;
- a step gathers the scheduled requests' rows, in scheduling order, into the
  persistent batch-ordered *input block tables* through ``idx_mapping``,
  copying each row's ``num_blocks`` entries (what lies past them is whatever an
  earlier batch left) and zeroing rows padded for a FULL graph;
- ``get_dummy_block_tables`` zeroes the input rows a dummy run uses (views of
  the persistent tensor), ``get_dummy_slot_mappings`` PAD-fills the whole
  persistent slot-mapping buffer, and a FULL dummy replay re-stages state
  indices from the zeroed rows.

``device_block_table[g]`` is the input block table (what kernels read);
``rows`` holds the staged per-request rows (``remove`` frees the state index and
clears its staged row, as the shared base does).
"""

from __future__ import annotations

import numpy as np

from .ledger import OpError
from .runner import ReferenceRunnerBase


class ReferenceV2Runner(ReferenceRunnerBase):
    """Fixed V2 semantics (see module docstring).

    device_row_counts[g]: int32 (max_num_reqs,) — entries of each input-table
    row the last gather defined (a real row: its request's ``num_blocks``; padded
    and dummy rows: all of them); None before the first forward.
    """

    device_row_counts: list | None = None

    def condense(self) -> None:
        raise OpError("op", "condense is a V1 persistent-batch op; runner v2 has none")

    def swap(self, i: int, j: int) -> None:
        raise OpError("op", "swap is a V1 persistent-batch op; runner v2 has none")

    def _batch(self, scheduled: list) -> list[tuple[int, int, int]]:
        """The scheduled requests in the op's order — with a drafter, ordered as
        vLLM's V2 ``sort_batch_req_ids`` does (``vllm/v1/worker/gpu/model_runner.py``):
        requests verifying drafts first, then those of ``1 + k`` tokens, then by
        token count (stable), which its Mamba builder's decode split relies on."""
        k = self.config.num_speculative_tokens
        if k:
            def key(item):
                req, n = item
                drafts = self.ledger.requests[req].is_decode() and n > 1
                return (not drafts, n != 1 + k, n)
            scheduled = sorted(scheduled, key=key)
        return [(req, n, self.rows.row_of(req)) for req, n in scheduled]

    def _stage_tables(self, rows: list[int], reqs_padded: int) -> None:
        self.device_row_counts = []
        for g, table in enumerate(self.rows.block_table):
            inputs = self.device_block_table[g]
            counts = np.full(inputs.shape[0], inputs.shape[1], np.int32)
            for b, row in enumerate(rows):
                n = int(self.rows.num_blocks_per_row[g][row])
                inputs[b, :n] = table[row, :n]
                counts[b] = n
            inputs[len(rows):reqs_padded] = self.rows.empty[g]
            self.device_row_counts.append(counts)

    def _prepare_dummy(self, reqs_padded: int) -> None:
        self.device_row_counts = [np.full(t.shape[0], t.shape[1], np.int32)
                                  for t in self.device_block_table]
        for inputs, empty in zip(self.device_block_table, self.rows.empty):
            inputs[:reqs_padded] = empty

    def _dummy_pad_extent(self, tokens_padded: int) -> int:
        return self.config.max_num_batched_tokens  # the whole persistent buffer
