"""gpu_impl's scheduler-side KV-cache manager (``config.allocator == "engine"``).

Written as vLLM's is (``vllm/v1/core/block_pool.py``, ``kv_cache_manager.py``,
``single_type_kv_cache_manager.py``), one :class:`BlockPool` per KV-cache
group, or one for all groups with ``kv_sharing`` (vLLM's hybrid allocator):

- a free queue of blocks, the null block (id 0) taken out first and never
  handed out; ``get_new_blocks`` pops from its head, evicting a popped block's
  prefix-cache registration;
- a reference count per block; ``touch`` (a prefix hit) takes a free block
  out of the queue and counts the new holder;
- ``free_blocks``: a block reaching 0 holders goes to the head of the queue
  when unregistered (reused first), to its tail when registered (evicted
  last, LRU) — vLLM frees a request's blocks tail first;
- prefix caching: a full block is registered under the token ids up to its
  end once they are computed (:meth:`KVCacheManager.cache_blocks`); a new
  prompt's hit is its longest registered prefix, at most ``len - 1`` tokens,
  a multiple of every group's block size;
- Mamba prefix caching in align mode (vLLM's ``MambaManager`` with
  ``mamba_cache_mode="align"``): a request's Mamba list has one entry per
  ``block_size`` tokens, the null block wherever no state is kept; a step that
  reaches a new column gets one new state block there; blocks before the
  column of the last computed token are freed before allocating
  (``get_num_skipped_tokens`` = ``num_computed - 1``); a full state block is
  registered like an attention block; a hit needs the state block at its end;
- in all mode (``mamba_cache_mode="all"``) likewise, except that the list
  takes a state block in every column, as an attention list does.

Faults (``family: scheduler``) live at the lines their upstream bugs did.
"""

from __future__ import annotations

from collections import deque

import numpy as np

NULL_BLOCK_ID = 0


class BlockPool:
    """Blocks of one KV-cache group: ``ref_cnt`` int64 (num_blocks,), the free
    queue, and the prefix cache (hash key -> registered blocks)."""

    def __init__(self, num_blocks: int, faults, null_block: bool = True):
        self.faults = faults
        self.ref_cnt = np.zeros(num_blocks, np.int64)
        self.block_hash: list[tuple | None] = [None] * num_blocks
        self.cached: dict[tuple, dict[int, None]] = {}
        self.free_queue = deque(range(num_blocks))
        if null_block:  # not a Mamba pool under mamba_padding pad_slot_no_null
            assert self.free_queue.popleft() == NULL_BLOCK_ID  # never handed out

    def num_free(self) -> int:
        return len(self.free_queue)

    def get_cached_block(self, key: tuple) -> int | None:
        blocks = self.cached.get(key)
        return next(iter(blocks)) if blocks else None

    def get_new_blocks(self, n: int) -> list[int]:
        if n > len(self.free_queue):
            raise ValueError(f"cannot get {n} free blocks from the pool")
        out = [self.free_queue.popleft() for _ in range(n)]
        for b in out:
            self._maybe_evict(b)
            self.ref_cnt[b] += 1
        return out

    def _maybe_evict(self, b: int) -> None:
        key = self.block_hash[b]
        if key is not None:
            del self.cached[key][b]
            if not self.cached[key]:
                del self.cached[key]
            self.block_hash[b] = None

    def touch(self, blocks: list[int]) -> None:
        """A prefix hit's blocks gain a holder; a free one leaves the free queue."""
        for b in blocks:
            if self.ref_cnt[b] == 0 and "touch-leaves-block-in-free-queue" not in self.faults:
                self.free_queue.remove(b)
            self.ref_cnt[b] += 1

    def free_blocks(self, ordered: list[int]) -> None:
        head = []
        for b in ordered:
            self.ref_cnt[b] -= 1
            if self.ref_cnt[b] == 0:
                if self.block_hash[b] is None:
                    head.append(b)
                else:
                    self.free_queue.append(b)
        self.free_queue.extendleft(reversed(head))

    def register(self, b: int, key: tuple) -> None:
        if self.block_hash[b] is None:
            self.block_hash[b] = key
            self.cached.setdefault(key, {})[b] = None

    def unregister(self, b: int) -> None:
        self._maybe_evict(b)


class KVCacheManager:
    """Per-request blocks over one :class:`BlockPool` per group (one for all
    groups with ``kv_sharing``).

    config: ``reference.RunnerConfig`` (read only); faults: a ``FaultSet``.
    Token ids per request are what the scheduler knows (the prompt's, then the
    request's own); blocks are per group, hit blocks first.
    """

    def __init__(self, config, faults):
        self.config = config
        self.faults = faults
        # kv_sharing: one BlockPool serves every group (vLLM's hybrid allocator).
        shared = BlockPool(config.num_blocks, faults) if config.kv_sharing else None
        self.pools = [shared or BlockPool(config.num_blocks, faults, config.has_null_block(g))
                      for g in range(len(config.groups))]
        self.req_blocks: dict[int, list[list[int]]] = {}
        self.req_tokens: dict[int, np.ndarray] = {}
        self.num_computed: dict[int, int] = {}
        self.unit = config.prefix_unit
        # Mamba groups whose states the prefix cache keeps (align or all mode),
        # and those whose lists pad skipped columns with the null block (align).
        self.caches = [config.caches_state(g) for g in range(len(config.groups))]
        self.align = [config.pads_with_null(g) for g in range(len(config.groups))]

    # -- prefix cache ------------------------------------------------------------
    def _key(self, tokens: np.ndarray, g: int, i: int) -> tuple:
        return tuple(int(t) for t in tokens[:(i + 1) * self.config.tokens_per_block(g)])

    def get_computed_blocks(self, tokens: np.ndarray) -> tuple[int, list[list[int]]]:
        """(hit tokens, hit blocks per group) for a prompt of ``tokens``."""
        cfg = self.config
        blocks = [[] for _ in cfg.groups]
        if not cfg.enable_prefix_caching:
            return 0, blocks
        # The last prompt token is always recomputed (its logits are needed).
        max_len = len(tokens) if "hit-not-capped-below-prompt" in self.faults else len(tokens) - 1
        hit = max_len // self.unit * self.unit
        windows = {}
        for g in cfg.attention_groups:
            if cfg.groups[g].sliding_window:
                continue
            bs, pool, i = cfg.tokens_per_block(g), self.pools[g], 0
            while (i + 1) * bs <= hit and pool.get_cached_block(self._key(tokens, g, i)) is not None:
                i += 1
            hit = min(hit, i * bs // self.unit * self.unit)
        eagle = bool(cfg.num_speculative_tokens)
        for g in cfg.attention_groups:  # sliding windows, within the full-attention hit
            if cfg.groups[g].sliding_window:
                hit, windows[g] = self._window_hit(g, tokens, hit, eagle)
                eagle = False  # the window's search dropped the drafter's block
        if eagle and hit:  # EAGLE/MTP: recompute the last unit
            hit -= self.unit
        mamba = [g for g in cfg.mamba_groups if self.caches[g]]
        # A hybrid hit needs the Mamba state at its end: the longest such length
        # within the attention groups' hit.
        while hit and any(self.pools[g].get_cached_block(self._key(
                tokens, g, hit // cfg.tokens_per_block(g) - 1)) is None for g in mamba):
            hit -= self.unit
        for g in cfg.attention_groups:
            bs = cfg.tokens_per_block(g)
            if g in windows:
                blocks[g] = windows[g][:hit // bs]
                continue
            blocks[g] = [self.pools[g].get_cached_block(self._key(tokens, g, i))
                         for i in range(hit // bs)]
        for g in mamba:
            n = hit // cfg.tokens_per_block(g)
            if n:
                blocks[g] = [NULL_BLOCK_ID] * (n - 1) + [
                    self.pools[g].get_cached_block(self._key(tokens, g, n - 1))]
        return hit, blocks

    def _window_hit(self, g: int, tokens: np.ndarray, max_len: int,
                    eagle: bool = False) -> tuple[int, list[int]]:
        """A sliding-window group's hit within ``max_len`` tokens (vLLM's
        ``SlidingWindowManager.find_longest_cache_hit``): scanning from the
        right, the first run of ``cdiv(window - 1, block_size)`` cached blocks
        whose right end is a multiple of the unit; the blocks before it are
        null.  No such run: the run of cached blocks from block 0, trimmed to
        the unit.  With a drafter (``eagle``) the run is one block longer and
        its last block is dropped (vLLM PR #17398).  Returns (hit tokens,
        blocks)."""
        bs, pool = self.config.tokens_per_block(g), self.pools[g]
        need = -(-(self.config.groups[g].sliding_window - 1) // bs)
        if eagle and "sliding-window-eagle-drop-unextended" not in self.faults:
            need += 1  # the fault's path: the drop below leaves a window short of a block
        need = max(need, 1)
        n = max_len // bs
        blocks = [NULL_BLOCK_ID] * n
        run = 0
        for i in range(n - 1, -1, -1):
            b = pool.get_cached_block(self._key(tokens, g, i))
            if b is None:
                run = 0
                continue
            if run == 0 and (i + 1) * bs % self.unit:
                continue
            blocks[i] = b
            run += 1
            if run >= need:
                blocks = blocks[:i + run]
                break
        else:
            blocks = blocks[:run]
            while len(blocks) * bs % self.unit:
                blocks.pop()
        if eagle and blocks:  # the drafter recomputes the last matched block
            blocks.pop()
        return len(blocks) * bs, blocks

    def _needed(self, g: int, have: int, num_tokens: int, first: bool = False) -> int:
        cfg = self.config
        if self.align[g]:
            # Align mode: the running state block and k speculative ones at the
            # list's end, cdiv(num_tokens, block_size) + k entries; a running
            # request reuses its speculative blocks and needs at most one more.
            k = cfg.num_speculative_tokens
            required = -(-num_tokens // cfg.tokens_per_block(g)) + k
            if first:
                return 1 + k
            return int(required > have)
        if cfg.groups[g].kind == "mamba" and not self.caches[g]:
            return cfg.mamba_columns if have == 0 else 0
        # All mode: a Mamba group takes a state block per column, as attention does.
        want = min(num_tokens + cfg.num_speculative_tokens, cfg.max_model_len)
        # A narrow row (a cache-only group) holds at most its width.
        return max(min(-(-want // cfg.tokens_per_block(g)), cfg.blocks_per_req_max(g)) - have, 0)

    # -- scheduler calls -----------------------------------------------------------
    def admit(self, req: int, tokens: np.ndarray, num_new_tokens: int):
        """A waiting request: (blocks per group or None when the pool is short, hit)."""
        hit, hit_blocks = self.get_computed_blocks(tokens)
        groups = range(len(self.config.groups))
        needed = [self._needed(g, len(hit_blocks[g]), hit + num_new_tokens, True)
                  for g in groups]
        want = {}  # per pool object: what every group drawing from it needs at once
        for g in groups:
            evictable = sum(1 for b in hit_blocks[g]
                            if b != NULL_BLOCK_ID and self.pools[g].ref_cnt[b] == 0)
            want[id(self.pools[g])] = want.get(id(self.pools[g]), 0) + needed[g] + evictable
        if any(want[id(self.pools[g])] > self.pools[g].num_free() for g in groups):
            return None, hit
        blocks = []
        for g in groups:
            self.pools[g].touch([b for b in hit_blocks[g] if b != NULL_BLOCK_ID])
            blocks.append(hit_blocks[g] + self._pads(g, len(hit_blocks[g]), hit + num_new_tokens,
                                                     needed[g])
                          + self.pools[g].get_new_blocks(needed[g]))
        self.req_blocks[req] = [list(b) for b in blocks]
        self.req_tokens[req] = np.asarray(tokens, np.int64)
        self.num_computed[req] = hit
        if "cache-blocks-before-compute" in self.faults:  # the tokens known: the prompt's
            self.cache_blocks(req, min(hit + num_new_tokens, len(tokens)))
        return blocks, hit

    def _pads(self, g: int, have: int, num_tokens: int, needed: int) -> list[int]:
        """Align mode: null entries for the columns between the list's end and
        the new running state block's (vLLM's align-mode ``allocate_new_blocks``)."""
        if not self.align[g] or not needed:
            return []
        return [NULL_BLOCK_ID] * max(-(-num_tokens // self.config.tokens_per_block(g)) - 1 - have,
                                     0)

    def _move_spec_blocks(self, g: int, row: list[int], num_tokens: int) -> list[int]:
        """Align mode with a drafter, a running request's list growing: each of
        its k speculative blocks (the list's last k entries) that would fall
        before the new running column moves to the end, its old entry becoming
        the null block (vLLM's "reuse previous speculative blocks"); returns
        the moved ids, in order, to append after the pads."""
        k = self.config.num_speculative_tokens
        if not self.align[g] or not k:
            return []
        skipped = -(-num_tokens // self.config.tokens_per_block(g)) - 1
        moved = []
        for c in range(max(len(row) - k, 0), len(row)):
            if c >= skipped:
                break
            moved.append(row[c])
            row[c] = NULL_BLOCK_ID
        return moved

    def remove_skipped_blocks(self, req: int) -> list[list[int]]:
        """Free ``req``'s blocks no longer needed — those that left a sliding
        window (every position before the first one the next token attends to:
        ``num_computed - window + 1``), and with Mamba prefix caching the state blocks
        before the last computed token's column (``num_computed - 1``); their
        entries become the null block.  Returns the freed ids per group."""
        freed = []
        for g, spec in enumerate(self.config.groups):
            out = []
            skip = 0
            if spec.sliding_window:
                skip = self.num_computed[req] - spec.sliding_window + 1
                if "sliding-window-boundary-early" in self.faults:
                    skip += 1
            elif self.caches[g]:
                skip = self.num_computed[req] - 1
            if skip > 0:
                bs = self.config.tokens_per_block(g)
                row = self.req_blocks[req][g]
                for i, b in enumerate(row):
                    if b != NULL_BLOCK_ID and (i + 1) * bs <= skip:
                        out.append(b)
                        row[i] = NULL_BLOCK_ID
                self.pools[g].free_blocks(list(reversed(out)))
            freed.append(out)
        return freed

    def allocate(self, req: int, num_new_tokens: int):
        """A running request's next tokens: (new blocks per group or None, the
        blocks its sliding windows left, freed first)."""
        freed = self.remove_skipped_blocks(req)
        groups = range(len(self.config.groups))
        have = self.req_blocks[req]
        total = self.num_computed[req] + num_new_tokens
        needed = [self._needed(g, len(have[g]), total) for g in groups]
        want = {}
        for g in groups:
            want[id(self.pools[g])] = want.get(id(self.pools[g]), 0) + needed[g]
        if any(want[id(self.pools[g])] > self.pools[g].num_free() for g in groups):
            return None, freed
        new = []
        for g in groups:
            pads = self._pads(g, len(have[g]), total, needed[g])
            moved = self._move_spec_blocks(g, have[g], total) if needed[g] else []
            fresh = self.pools[g].get_new_blocks(needed[g])
            have[g].extend(pads + moved + fresh)
            new.append(pads + moved + fresh)
        if "cache-blocks-before-compute" in self.faults:
            self.cache_blocks(req, min(total, max(len(self.req_tokens[req]),
                                                  self.num_computed[req])))
        return new, freed

    def token_ids(self, req: int, num_tokens: int) -> np.ndarray:
        pos = np.arange(num_tokens, dtype=np.int64)
        out = req * 256 + pos
        prompt = self.req_tokens[req]
        n = min(len(prompt), num_tokens)
        out[:n] = prompt[:n]
        return out

    def cache_blocks(self, req: int, num_tokens: int) -> None:
        """Register ``req``'s full blocks of its first ``num_tokens`` tokens."""
        cfg = self.config
        if not cfg.enable_prefix_caching:
            return
        tokens = self.token_ids(req, num_tokens)
        for g in cfg.attention_groups + [g for g in cfg.mamba_groups if self.caches[g]]:
            for i in range(min(num_tokens // cfg.tokens_per_block(g),
                               len(self.req_blocks[req][g]))):
                b = self.req_blocks[req][g][i]
                if b != NULL_BLOCK_ID:  # align mode: a column whose state is not kept
                    self.pools[g].register(b, self._key(tokens, g, i))

    def computed(self, req: int, num_computed: int) -> None:
        """The runner computed ``req``'s tokens up to ``num_computed`` (a step or a
        KV load): register its blocks that are now full and computed."""
        self.num_computed[req] = num_computed
        self.cache_blocks(req, num_computed)

    def rolled_back(self, req: int, num_computed: int) -> None:
        """Rejected tokens (configs without prefix caching: nothing registered)."""
        self.num_computed[req] = num_computed

    def free(self, req: int) -> list[list[int]]:
        """Free ``req``'s blocks (tail first); returns those now free and
        unregistered per group (the allocator poisons them)."""
        blocks = self.req_blocks.pop(req)
        self.req_tokens.pop(req)
        self.num_computed.pop(req)
        out = []
        for g, ids in enumerate(blocks):
            pool = self.pools[g]
            if self.config.has_null_block(g):  # not a Mamba pool without one
                ids = [b for b in ids if b != NULL_BLOCK_ID]  # entries a window freed
            pool.free_blocks(list(reversed(ids)))
            out.append([b for b in ids if pool.ref_cnt[b] == 0 and pool.block_hash[b] is None])
        return out

    def is_free(self, group: int, block: int) -> bool:
        """No holder and not registered (what the allocator poisons)."""
        pool = self.pools[group]
        return pool.ref_cnt[block] == 0 and pool.block_hash[block] is None

    def pool_view(self) -> dict:
        """{group: {"ref_count": int64 (num_blocks,), "num_free": int}}."""
        return {g: {"ref_count": p.ref_cnt.copy(), "num_free": p.num_free()}
                for g, p in enumerate(self.pools)}
