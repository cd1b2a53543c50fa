"""A target over a model runner built on gpu_impl's runner shell
(:class:`gpu_impl.runner_shell.RunnerShell`): ops go to the runner's scheduler-
and forward-facing methods, observations come from :meth:`RunnerShell.snapshot`.

gpu_impl's own runners and the vLLM adapter's runners are both wrapped by it;
an adapter for another engine's block-table classes needs only its runner.
"""

from __future__ import annotations

import numpy as np

from gpu_impl.host_tier import LRUHostManager
from gpu_impl.kv_transfer import ABORT, FAILED, STORE, KVTransferTracker

from harness.core.observation import Observation, rows_indexed_by


class RunnerTarget:
    """name: the registered target name; runner: a ``RunnerShell`` subclass instance
    built for ``runner.config`` (a ``reference.RunnerConfig``); manager: the
    scheduler side's KV-cache manager for ``config.allocator == "engine"``
    (``admit`` / ``allocate`` / ``free`` / ``computed`` / ``rolled_back`` /
    ``pool_view``, as :class:`gpu_impl.kv_cache_manager.KVCacheManager`), None
    when the trace names the blocks; host_manager: ``num_blocks -> manager`` of
    one attention group's host tier (default gpu_impl's
    :class:`~gpu_impl.host_tier.LRUHostManager`)."""

    def __init__(self, name: str, runner, manager=None, transfers=None, host_manager=None):
        self.name = name
        self.runner = runner
        self.config = runner.config
        self.manager = manager
        self.prompts: dict[int, np.ndarray] = {}  # the scheduler's prompt token ids
        # The scheduler side of asynchronous KV loads (gpu_impl.kv_transfer's
        # tracker), and the blocks of requests that left while one was in flight.
        self.transfers = transfers if transfers is not None else KVTransferTracker(())
        self.left_blocks: dict[int, list[list[int]]] = {}
        # The host tier's scheduler side: one LRU manager for every attention
        # group (keys name their group), and the keys each offload / onboard in
        # flight stores / reads.
        cfg = self.config
        make = host_manager or (lambda n: LRUHostManager(n, self.transfers.faults))
        self.host = make(cfg.host_blocks) if cfg.host_blocks else None
        self.host_keys: dict[int, list[tuple]] = {}

    def add(self, req, blocks, prompt_len):
        self.runner.add_request(req, blocks, prompt_len)

    def append(self, req, blocks):
        self.runner.append_blocks(req, blocks)

    def admit(self, req, prompt_len, prefix, num_new_tokens, choice=None):
        """The scheduler admits a request: its manager picks the hit and blocks
        (``choice`` is the trace's record; a target always chooses anew)."""
        tokens = req * 256 + np.arange(prompt_len, dtype=np.int64)
        if prefix:
            src, n = prefix
            tokens[:n] = self.prompts[src][:n]
        self.prompts[req] = tokens
        blocks, hit = self.manager.admit(req, tokens, num_new_tokens)
        if blocks is not None:
            self.runner.add_request(req, blocks, prompt_len, hit, tokens)
            for g, ids in enumerate(blocks):  # new blocks (align mode's null pads kept)
                self.runner.poison_blocks(g, [b for b in ids[self.config.hit_columns(g, hit):]
                                              if b != self.config.null_block(g)])
        return {"blocks": blocks, "num_cached_tokens": hit}

    def allocate(self, req, num_new_tokens, choice=None):
        """A running request's next tokens: the manager frees what its sliding
        windows left (poisoned; the runner's row keeps the ids, as vLLM's does)
        and picks new blocks."""
        # Align mode with a drafter: a speculative block the request holds may
        # move to the end of its list — handed again, not new (not poisoned).
        moves = self.config.mamba_cache_mode == "align" and self.config.num_speculative_tokens
        held = [set(ids) for ids in self.manager.req_blocks[req]] if moves \
            else [set() for _ in self.config.groups]
        new, freed = self.manager.allocate(req, num_new_tokens)
        # A block freed is poisoned where it was freed, as it was then: free (and
        # unregistered), even if this allocation handed it to another group of
        # the one pool (kv_sharing) right after.
        retaken = {b for ids in (new or []) for b in ids} if self.config.kv_sharing else set()
        for g, ids in enumerate(freed):
            self.runner.poison_blocks(g, [b for b in ids
                                          if self.manager.is_free(g, b) or b in retaken])
        if new is not None:
            for g, ids in enumerate(new):
                self.runner.poison_blocks(g, [b for b in ids if b != self.config.null_block(g)
                                              and b not in held[g] - set(freed[g])])
            self.runner.append_blocks(req, new)
        return {"blocks": new, "freed": freed}

    def remove(self, req):
        self._leave(req, ABORT)

    def _leave(self, req, reason: str) -> None:
        """``req`` leaves the batch; its blocks are freed now or, while a load
        into them is in flight, when the last one ends (the tracker decides)."""
        if self.transfers.finish(req, reason):
            if self.manager is None:
                self.runner.finish_request(req)
            else:
                self.runner.finish_request(req, self.manager.free(req))
            return
        self.left_blocks[req] = [list(b) for b in self.runner.requests[req].block_ids]
        self.runner.finish_request(req, [[] for _ in self.config.groups])

    def preempt(self, req):
        """The scheduler preempts ``req`` (recompute): it leaves the batch; its
        blocks are freed now or, while a store still reads them, when it ends."""
        if self.transfers.finish(req, ABORT):
            freed = (self.runner.requests[req].block_ids if self.manager is None
                     else self.manager.free(req))
        else:
            self.left_blocks[req] = [list(b) for b in self.runner.requests[req].block_ids]
            freed = [[] for _ in self.config.groups]
        self.runner.preempt_request(req, freed)

    def resume(self, req, blocks):
        self.runner.resume_request(req, blocks)

    def _free_left(self, req) -> None:
        """The blocks of ``req``, which left earlier, are freed now."""
        blocks = self.left_blocks.pop(req)
        freed = blocks if self.manager is None else self.manager.free(req)
        for g, ids in enumerate(freed):
            self.runner.poison_blocks(g, ids)

    def kv_load_begin(self, req, handle, blocks):
        self.transfers.begin(handle, req)
        self.runner.kv_load_begin(req, handle, blocks)

    def _host_key(self, req: int, g: int, column: int) -> tuple:
        """(group, the token ids up to the end of ``req``'s block ``column``)."""
        state = self.runner.requests[req]
        n = (column + 1) * self.config.tokens_per_block(g)
        return (g, tuple(int(t) for t in state.token_ids(np.arange(n))))

    def _touch_request(self, req: int, num_tokens: int) -> None:
        """The connector touches the keys of ``req``'s full blocks of its first
        ``num_tokens`` tokens, group by group."""
        state = self.runner.requests[req]
        for g in self.config.attention_groups:
            n = min(num_tokens // self.config.tokens_per_block(g), len(state.block_ids[g]))
            self.host.touch([self._host_key(req, g, c) for c in range(n)])

    def offload_begin(self, req, handle, blocks):
        """The connector's scheduler side asks the host manager for room for the
        blocks' keys (it evicts, or stores nothing) and hands the worker the
        copies."""
        state = self.runner.requests[req]
        named = [(g, b, self._host_key(req, g, state.block_ids[g].index(b)))
                 for g, ids in enumerate(blocks) for b in ids]
        room = self.host.prepare_store([k for _, _, k in named])
        copies, stored = [], []
        if room is not None and room[0]:
            slot_of = dict(zip(room[0], room[1]))
            copies = [(g, b, slot_of[k]) for g, b, k in named if k in slot_of]
            stored = list(room[0])
            self._touch_request(req, state.num_computed_tokens)
        self.host_keys[handle] = stored
        self.transfers.begin(handle, req, STORE)
        self.runner.offload_begin(handle, copies)

    def offload_complete(self, req, handle):
        self.runner.offload_complete(handle)
        self.host.complete_store(self.host_keys.pop(handle))
        _, free = self.transfers.end(handle)
        if free:
            self._free_left(req)

    def onboard_begin(self, req, handle, blocks):
        """The connector (its lookup touched the request's keys) pins the host
        blocks of those keys and hands the worker the copies into the
        request's blocks."""
        state = self.runner.requests[req]
        named = [(g, b, self._host_key(req, g, state.block_ids[g].index(b)))
                 for g, ids in enumerate(blocks) for b in ids]
        self._touch_request(req, state.prompt_len)
        slots = self.host.prepare_load([k for _, _, k in named])
        self.host_keys[handle] = [k for _, _, k in named]
        self.transfers.begin(handle, req)
        self.runner.onboard_begin(req, handle, blocks,
                                  [(g, b, slot) for (g, b, _), slot in zip(named, slots)])

    def onboard_complete(self, req, handle):
        self.kv_load_complete(req, handle)

    def _unpin(self, handle) -> None:
        keys = self.host_keys.pop(handle, None)
        if keys:
            self.host.complete_load(keys)

    def host_view(self) -> dict | None:
        """The host tier: {(group, hash): float32 (block_size, head_size) when
        ready, None while its store is in flight}."""
        if self.host is None:
            return None
        return {key: self.runner.host_block(key[0], slot) if ready else None
                for key, (slot, ready) in self.host.view().items()}

    def kv_load_complete(self, req, handle):
        ready = self.runner.kv_load_complete(handle)
        self._unpin(handle)
        req, free = self.transfers.end(handle)
        if ready:
            self.runner.loaded_prompt(req)
            self._computed([req])
        if free:
            self._free_left(req)

    def kv_store_begin(self, req, handle, num_tokens):
        self.transfers.begin(handle, req, STORE)
        self.runner.kv_store_begin(req, handle, num_tokens)

    def kv_store_complete(self, req, handle):
        self.runner.kv_store_complete(handle)
        _, free = self.transfers.end(handle)
        if free:
            self._free_left(req)

    def kv_load_fail(self, req, handle):
        self.runner.kv_load_fail(handle)
        self._unpin(handle)
        req, free = self.transfers.end(handle)
        if req in self.runner.requests:  # the engine fails the request (policy "fail")
            self._leave(req, FAILED)
        elif free:
            self._free_left(req)

    def _computed(self, reqs) -> None:
        if self.manager is not None:
            for req in reqs:
                self.manager.computed(req, self.runner.requests[req].num_computed_tokens)

    def condense(self):
        self.runner.condense()

    def swap(self, i, j):
        self.runner.swap_states(i, j)

    def kv_load(self, req):
        self.runner.kv_load(req)
        self._computed([req])

    def rollback(self, req, num_tokens):
        self.runner.rollback_tokens(req, num_tokens)
        if self.manager is not None:
            self.manager.rolled_back(req, self.runner.requests[req].num_computed_tokens)

    def step(self, scheduled, cudagraph_mode, accepted=None, in_flight=False,
             placeholders=None):
        # placeholders: the engine does not know which drafts are placeholders
        # (its rejection sampler rejects them); the accepted counts say so.
        self.runner.execute_model(scheduled, cudagraph_mode, accepted, in_flight)
        self._computed([req for req, *_ in scheduled])

    def step_complete(self):
        self.runner.complete_step()

    def dummy_run(self, num_reqs, num_tokens, cudagraph_mode):
        self.runner.dummy_run(num_reqs, num_tokens, cudagraph_mode)

    def observe(self) -> Observation:
        return Observation(runner=self.config.runner,
                           rows_indexed_by=rows_indexed_by(self.config.runner),
                           pool=None if self.manager is None else self.manager.pool_view(),
                           host_tier=self.host_view(),
                           **self.runner.snapshot())
