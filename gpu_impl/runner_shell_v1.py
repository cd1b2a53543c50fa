"""V1 runner shell: the persistent batch around any engine's V1 block tables.

Our own take on ``vllm/v1/worker/gpu_model_runner.py`` and
``vllm/v1/worker/gpu_input_batch.py``, fault-free: ``_update_states`` removes
requests a step does not schedule from the persistent batch (they keep their
blocks), adds scheduled ones at the lowest free row and condenses; the batch
rows are then rows 0..num_reqs-1, and each forward commits them to the device
table the kernels read.  A dummy run is an idle rank's step with nothing
scheduled.  The block tables are the subclass's (``_make_input_batch``):
gpu_impl's :class:`gpu_impl.block_table.MultiGroupBlockTable` or another
engine's class with the same row methods (``add_row``, ``append_row``,
``clear_row``, ``move_row``, ``swap_row``).
"""

from __future__ import annotations

import abc

import numpy as np
import torch

from .block_table import PAD_SLOT_ID
from .runner_shell import FULL, RunnerShell

EMPTY_ROW = -1


class PersistentBatch:
    """Rows of the V1 persistent batch: which request sits in which row.

    req_ids: int64 (max_num_reqs,), -1 for a free row; num_computed_tokens /
    num_prompt_tokens: int32 (max_num_reqs,); block_table: a multi-group block
    table (indexable by group, with the row methods above).  A new request takes
    the lowest free row; removing one clears its block-table row
    (``_clear_removed_row``); ``condense`` moves the last live row into the
    lowest hole (``move_row``) until live rows are contiguous; ``swap_states``
    swaps two rows.  As in vLLM's ``InputBatch``, an emptied row keeps the
    counters its last request left (nothing clears them; the metadata builder
    must not trust them past the live rows).
    """

    def __init__(self, max_num_reqs: int, block_table):
        self.req_ids = np.full(max_num_reqs, EMPTY_ROW, np.int64)
        self.num_computed_tokens = np.zeros(max_num_reqs, np.int32)
        self.num_prompt_tokens = np.zeros(max_num_reqs, np.int32)
        # The sampler's last kept count per row (vLLM's num_accepted_tokens_cpu):
        # the next step's running Mamba state column, so it moves with the row.
        self.num_accepted_tokens = np.ones(max_num_reqs, np.int32)
        self.block_table = block_table

    @property
    def num_reqs(self) -> int:
        return int((self.req_ids != EMPTY_ROW).sum())

    def row_of(self, req: int) -> int | None:
        rows = np.flatnonzero(self.req_ids == req)
        return int(rows[0]) if rows.size else None

    def add_request(self, req: int, block_ids: list[list[int]], num_computed_tokens: int,
                    num_prompt_tokens: int, num_accepted_tokens: int = 1) -> int:
        free = np.flatnonzero(self.req_ids == EMPTY_ROW)
        assert free.size, "persistent batch is full"
        row = int(free[0])
        self.req_ids[row] = req
        self.num_computed_tokens[row] = num_computed_tokens
        self.num_prompt_tokens[row] = num_prompt_tokens
        self.num_accepted_tokens[row] = num_accepted_tokens
        self.block_table.add_row(block_ids, row)
        return row

    def remove_request(self, req: int) -> int | None:
        row = self.row_of(req)
        if row is None:
            return None
        self.req_ids[row] = EMPTY_ROW  # counters stay, as vLLM's remove_request leaves them
        self._clear_removed_row(row)
        return row

    def _clear_removed_row(self, row: int) -> None:
        """A removed request's row must not keep its ids (``clear_row``): dummy runs
        read rows past the live requests (vLLM PR #37728)."""
        self.block_table.clear_row(row)

    def swap_states(self, i: int, j: int) -> None:
        for arr in (self.req_ids, self.num_computed_tokens, self.num_prompt_tokens,
                    self.num_accepted_tokens):
            arr[[i, j]] = arr[[j, i]]
        self.block_table.swap_row(i, j)

    def condense(self) -> None:
        for _ in range(len(self.req_ids)):
            live = np.flatnonzero(self.req_ids != EMPTY_ROW)
            holes = np.flatnonzero(self.req_ids == EMPTY_ROW)
            if live.size == 0 or holes.size == 0 or holes[0] > live[-1]:
                return
            src, tgt = int(live[-1]), int(holes[0])
            self.req_ids[tgt] = self.req_ids[src]
            self.num_computed_tokens[tgt] = self.num_computed_tokens[src]
            self.num_prompt_tokens[tgt] = self.num_prompt_tokens[src]
            self.num_accepted_tokens[tgt] = self.num_accepted_tokens[src]
            self.req_ids[src] = EMPTY_ROW  # counters stay, as vLLM's condense leaves them
            self.block_table.move_row(src, tgt)
        raise AssertionError("condense did not converge")


class RunnerShellV1(RunnerShell):
    """V1 runner over a :class:`PersistentBatch` (``self.input_batch``).

    Subclasses provide the batch and its tables (``_make_input_batch``), the
    device copy (``_commit_rows``), the slot-mapping call and the kernel block size.
    """

    @abc.abstractmethod
    def _make_input_batch(self) -> PersistentBatch:
        """The persistent batch with the engine's block tables."""

    @abc.abstractmethod
    def _commit_rows(self, num_rows: int) -> None:
        """Copy host rows [0, num_rows) of every group to the device tables."""

    def _init_tables(self) -> None:
        self.input_batch = self._make_input_batch()

    def kernel_table(self, group: int) -> torch.Tensor:
        return self.input_batch.block_table[group].block_table.gpu

    # -- V1-only ops -------------------------------------------------------------
    def condense(self) -> None:
        """Close the holes in the persistent batch (``InputBatch.condense``)."""
        self.input_batch.condense()

    def swap_states(self, i: int, j: int) -> None:
        """Swap two persistent-batch rows (``InputBatch.swap_states``)."""
        self.input_batch.swap_states(i, j)

    # -- hooks -------------------------------------------------------------------
    def _rows_add(self, req, state) -> None:
        self.input_batch.add_request(req, state.block_ids, state.num_computed_tokens,
                                     state.prompt_len)

    def _rows_append(self, req, block_ids) -> None:
        row = self.input_batch.row_of(req)
        if row is not None:
            self.input_batch.block_table.append_row(block_ids, row)

    def _rows_remove(self, req) -> None:
        self.input_batch.remove_request(req)

    def _set_num_computed(self, req, num_tokens) -> None:
        """Nothing on the row: ``_update_states`` sets it when ``req`` is next
        scheduled (vLLM's V1 batch counters follow the scheduler, step by step)."""

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
        self._commit_rows(reqs_padded)

    def _advance(self, batch) -> None:
        """Nothing: vLLM's ``InputBatch`` counters are not advanced after a forward;
        a row keeps its request's count as of the start of its last step."""

    def _prepare_dummy(self, reqs_padded, warmup) -> list[torch.Tensor]:
        self._update_states({})  # an idle rank: nothing scheduled, every request leaves
        self._commit_rows(reqs_padded)
        return [self.kernel_table(g) for g in range(len(self.config.groups))]

    def _dummy_builds_metadata(self, mode: str) -> bool:
        """vLLM's V1 ``_dummy_run`` builds attention metadata only for FULL (or when
        forced): KV writes still run, Mamba mixers and attention layers skip."""
        return mode == FULL

    def _fill_dummy_slots(self, num_tokens, tokens_padded, warmup) -> None:
        for g in self.attn_groups:  # vLLM's _dummy_run: no real slots, all PAD
            self.slot_mappings[g][:tokens_padded].fill_(PAD_SLOT_ID)

    def _update_states(self, num_tokens_of: dict) -> None:
        """Unscheduled requests leave the batch, scheduled ones enter it, then condense."""
        batch = self.input_batch
        for row in range(len(batch.req_ids)):
            req = int(batch.req_ids[row])
            if req != EMPTY_ROW and req not in num_tokens_of:
                batch.remove_request(req)
        for req in num_tokens_of:
            st, row = self.requests[req], batch.row_of(req)
            if row is None:
                batch.add_request(req, st.block_ids, st.num_computed_tokens, st.prompt_len,
                                  st.num_accepted)
            else:  # the scheduler's count for a request already in the batch
                batch.num_computed_tokens[row] = st.num_computed_tokens
        batch.condense()
        if self.config.reorder_batch_threshold and num_tokens_of:
            self._reorder(num_tokens_of, self.config.reorder_batch_threshold)

    def _reorder(self, num_tokens_of: dict, threshold: int) -> None:
        """Decode-first batch reorder an attention backend asks for (vLLM's
        ``reorder_batch_to_split_decodes_and_prefills``): rows are put in regions
        — decode, short extend, long extend, first chunk — by swapping only the
        rows out of their region's span, following each swap cycle."""
        batch = self.input_batch
        n = len(num_tokens_of)
        region = []
        for row in range(n):
            computed = int(batch.num_computed_tokens[row])
            small = num_tokens_of[int(batch.req_ids[row])] <= threshold
            done = computed >= int(batch.num_prompt_tokens[row])
            region.append(3 if computed == 0 else 2 if not small else 0 if done else 1)
        target = sorted(region)
        wrong = [row for row in range(n) if region[row] != target[row]]
        goes_to = dict(zip(sorted(wrong, key=lambda row: region[row]), wrong))
        for src in list(goes_to):
            dst = goes_to[src]
            while src != dst:
                batch.swap_states(src, dst)
                goes_to[dst], dst = dst, goes_to.get(dst, dst)

    def _row_counters(self, reqs_padded: int) -> tuple[np.ndarray, np.ndarray]:
        batch = self.input_batch
        return (np.asarray(batch.num_computed_tokens[:reqs_padded]).copy(),
                np.asarray(batch.num_prompt_tokens[:reqs_padded]).copy())

    def _row_accepted(self, num_reqs: int) -> np.ndarray:
        return np.asarray(self.input_batch.num_accepted_tokens[:num_reqs]).copy()

    def _store_accepted(self, batch, kept) -> None:
        """Batch row b is persistent row b (vLLM writes ``num_accepted_tokens_cpu``
        by batch row after the forward); the request keeps its count for when it
        re-enters the batch."""
        for b, ((req, _, _), a) in enumerate(zip(batch, kept)):
            self.input_batch.num_accepted_tokens[b] = a
            self.requests[req].num_accepted = a

    def _set_accepted(self, req: int, a: int) -> None:
        """``req``'s accepted count, in its row if it has one."""
        self.requests[req].num_accepted = a
        row = self.input_batch.row_of(req)
        if row is not None:
            self.input_batch.num_accepted_tokens[row] = a

    def _host_rows(self) -> dict:
        batch = self.input_batch
        tables = batch.block_table.block_tables
        return dict(host_block_table=[t.block_table.np.copy() for t in tables],
                    host_num_blocks_per_row=[np.asarray(t.num_blocks_per_row).copy()
                                             for t in tables],
                    host_req_ids=batch.req_ids.copy(),
                    num_computed_tokens=batch.num_computed_tokens.copy(),
                    num_prompt_tokens=batch.num_prompt_tokens.copy(),
                    row_accepted=np.asarray(batch.num_accepted_tokens).copy())
