"""Block pool and ownership ledger: who owns which block, from the ops alone.

Models the scheduler side of vLLM (``vllm/v1/core/kv_cache_manager.py`` /
``block_pool.py``): block 0 of every KV-cache group is the null block, reserved
and never allocated; a request owns an ordered list of blocks per group until it
is removed, then they are free again and may be handed to another request.
With ``config.allocator == "trace"`` block ids are explicit in traces, so the
ledger checks them rather than choosing them.  With ``"engine"`` the target's
KV-cache manager chooses them (``admit`` / ``allocate``) and the ledger
*mirrors* the choice — reference counts, prefix-cache registrations, what a
choice took that was not free — for the scheduler invariants to judge
(:mod:`harness.core.invariants.scheduler`); it does not refuse a bad choice.

Every request has token ids (:func:`reference.payload.default_token_ids`
unless its prompt shares an earlier request's prefix); the prefix cache keys
a full block by every token id up to its end (vLLM's chained block hash).

The ledger is also where an op's legality is decided: every check raises
:class:`OpError` naming the field, before anything changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .config import ALL, ENGINE, MAMBA, TRACE, RunnerConfig
from .host_tier import HostTier
from .payload import NULL_BLOCK_ID, POSITION_MAX, REQ_ID_MAX, default_token_ids

FREE = -1
RESERVED = -2
MAX_STEPS_IN_FLIGHT = 2  # async scheduling: step N+1 is prepared while step N runs


class OpError(ValueError):
    """An op is not legal in the current state.

    ``field`` names the offending op field (``blocks[0][1]``, ``scheduled[2]``).
    """

    def __init__(self, field_path: str, message: str):
        super().__init__(f"{field_path}: {message}" if field_path else message)
        self.field = field_path


@dataclass
class RequestLedger:
    """What the scheduler knows about one live request."""

    req: int
    prompt_len: int
    blocks: list[list[int]]  # per group, in order
    num_computed_tokens: int = 0
    loaded: bool = False  # filled by kv_load and not yet stepped
    stepped: bool = False  # has had its first real step
    last_step_tokens: int = 0  # tokens its latest step ran, until rolled back (speculation)
    last_seq_len: int = 0  # context its latest step's attention read (rejected tokens included)
    num_cached_tokens: int = 0  # prefix-cache hit when admitted (allocator "engine")
    # Asynchronous KV loads (kv_load_begin): handles in flight, the block columns
    # already landed per group, and whether one failed.
    pending: set = field(default_factory=set)
    landed: list = field(default_factory=list)
    load_failed: bool = False

    def is_decode(self) -> bool:
        """Its prompt is done (stepped or loaded): a step of it decodes."""
        return self.num_computed_tokens >= self.prompt_len

    def capacity_tokens(self, config: RunnerConfig) -> int:
        """Tokens the request's attention blocks can hold (:func:`capacity_tokens`)."""
        return capacity_tokens(config, self.blocks)


def capacity_tokens(config: RunnerConfig, blocks) -> int:
    """Tokens attention blocks ``blocks`` (one list per group) can hold: the
    least over groups, where a narrow group (``GroupSpec.max_num_blocks``)
    whose row is full sets no bound (it keeps no KV past its row)."""
    return min(len(blocks[g]) * config.tokens_per_block(g) for g in config.attention_groups
               if not (config.groups[g].max_num_blocks
                       and len(blocks[g]) >= config.blocks_per_req_max(g)))


def align_growth(have: int, num_tokens: int, block_size: int, k: int,
                 first: bool) -> tuple[list[int], int, int]:
    """How an align-mode Mamba block list of ``have`` entries grows to cover
    ``num_tokens`` tokens with ``k`` speculative state columns (vLLM's
    ``MambaManager.allocate_new_blocks`` with ``mamba_cache_mode="align"``).

    The list's last ``1 + k`` entries are the running state block (column
    ``cdiv(num_tokens, block_size) - 1``, the last scheduled token's) and the
    ``k`` speculative blocks after it; it needs ``cdiv(num_tokens,
    block_size) + k`` entries.  When it is shorter it gets, appended in this
    order: null blocks up to the new running column (``pads``), then each
    speculative block that would fall before that column moves from its
    column (which becomes the null block) to the end (``moves``, columns in
    order), then ``new`` fresh blocks — ``1 + k`` on a request's first
    allocation (``first``: a hit's state block is only read), one after.

    Returns (moves, pads, new); ([], 0, 0) when the list is long enough (an
    earlier step allocated for drafts that were rejected).  With ``k = 0``
    this is align mode's one state block per column reached."""
    required = -(-num_tokens // block_size) + k
    if required <= have and not first:
        return [], 0, 0
    skipped = required - k - 1  # columns before the running one
    pads = max(skipped - have, 0)
    moves = [] if first else [c for c in range(max(have - k, 0), have) if c < skipped]
    return moves, pads, required - have - pads - len(moves)


@dataclass
class Transfer:
    """One asynchronous KV transfer in flight: a load (``kv_load_begin``) — the
    request it loads for and, per group, the block columns it fills (attention
    groups: the prompt positions of those columns on this rank; a Mamba group:
    column 0, the prompt's final state) — or a store (``kv_store_begin``): the
    request whose first ``num_tokens`` tokens' KV it reads, from those blocks."""

    handle: int
    req: int
    columns: list[list[int]]
    blocks: list[list[int]]
    kind: str = "load"  # or "store": the connector reads the blocks (kv_store_begin)
    num_tokens: int = 0  # a store: the prefix it saves
    owner: "RequestLedger | None" = None  # the request as it was at begin (not a resumed one)
    # "remote" (a P/D connector, an external store) or "host": the host tier,
    # whose blocks ``host_keys`` this transfer writes (an offload) or reads (an onboard).
    source: str = "remote"
    host_keys: list = field(default_factory=list)


@dataclass
class Ledger:
    """Ownership of every block of every group, and the live requests.

    owner[g]: int64 (num_blocks,): request id, ``FREE`` or ``RESERVED`` (null block).
    """

    config: RunnerConfig
    owner: list[np.ndarray] = field(init=False)
    requests: dict[int, RequestLedger] = field(default_factory=dict)
    used_req_ids: set[int] = field(default_factory=set)
    # Token ids of every prompt ever admitted (prefix sources outlive their requests).
    prompts: dict[int, np.ndarray] = field(default_factory=dict)
    # (group, prompt_len) -> prompt_columns: a function of the config alone.
    _prompt_columns: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self):
        # One pool per group, or (kv_sharing) one pool for all: then every
        # group's owner / ref_count entry is the same array, so a block held in
        # one group is taken in all (vLLM's hybrid allocator).
        n, pools = self.config.num_blocks, self.pool_count
        owners = []
        for p in range(pools):
            o = np.full(n, FREE, dtype=np.int64)
            if any(self.config.has_null_block(g) for g in self.pool_groups_of(p)):
                o[NULL_BLOCK_ID] = RESERVED  # not under mamba_padding pad_slot_no_null
            owners.append(o)
        self.owner = [owners[self.pool_of(g)] for g in range(len(self.config.groups))]
        # allocator "engine": holders per block, prefix-cache registrations
        # (block -> hash key, the token ids up to its end), and what the latest
        # admit / allocate took that was not free ((group, block, holders)).
        counts = [np.zeros(n, np.int64) for _ in range(pools)]
        self.ref_count = [counts[self.pool_of(g)] for g in range(len(self.config.groups))]
        self.registered: list[dict[int, tuple]] = [{} for _ in self.config.groups]
        self.last_taken_busy: list[tuple[int, int, tuple]] = []
        # Asynchronous KV loads: handle -> Transfer while in flight; handles ever
        # used; requests that left (removed, or failed by a load) while a load
        # into their blocks was in flight — they keep their blocks until it ends.
        self.transfers: dict[int, Transfer] = {}
        # Steps dispatched and not completed (step_dispatch): their requests, oldest first.
        self.steps_in_flight: list[list[int]] = []
        self.last_completed: list[int] = []  # the requests of the step completed last
        # Preempted requests (recompute) waiting to resume: req -> prompt_len.
        self.preempted: dict[int, int] = {}
        self.used_handles: set[int] = set()
        self.finishing: dict[int, RequestLedger] = {}
        # The host tier's block hashes and LRU order (config.host_blocks > 0).
        self.host = HostTier(self.config.host_blocks)

    @property
    def pool_count(self) -> int:
        """Block pools: one per group, or one for all with ``kv_sharing``."""
        return 1 if self.config.kv_sharing else len(self.config.groups)

    def is_block(self, group: int, b: int) -> bool:
        """Is ``b`` a block of ``group``'s pool that a request can hold (not the
        null block, where the group has one; not out of range)?"""
        return int(self.config.has_null_block(group)) <= b < self.config.num_blocks

    def pool_groups_of(self, pool: int) -> list[int]:
        """The groups drawing from ``pool``."""
        return [g for g in range(len(self.config.groups)) if self.pool_of(g) == pool]

    def pool_of(self, group: int) -> int:
        """The pool ``group`` draws its block ids from."""
        return 0 if self.config.kv_sharing else group

    def pool_groups(self, group: int) -> list[int]:
        """The groups drawing from ``group``'s pool (itself included)."""
        return [g for g in range(len(self.config.groups)) if self.pool_of(g) == self.pool_of(group)]

    # -- tokens ------------------------------------------------------------
    def token_ids(self, req: int, positions) -> np.ndarray:
        """Token ids of ``req`` at ``positions`` (int64): its prompt's where it has
        one, else its own (``req * 256 + pos``)."""
        pos = np.asarray(positions, dtype=np.int64)
        out = default_token_ids(req, pos)
        prompt = self.prompts.get(req)
        if prompt is not None:
            inside = pos < len(prompt)
            out[inside] = prompt[pos[inside]]
        return out

    def prompt_tokens(self, req: int, prompt_len: int, prefix) -> np.ndarray:
        """Token ids of a new prompt: its own, with ``prefix`` = [src, n] taking
        src's first n token ids (src: any request admitted earlier)."""
        tokens = default_token_ids(req, np.arange(prompt_len))
        if prefix:
            src, n = prefix
            tokens[:n] = self.token_ids(src, np.arange(n))
        return tokens

    def check_prefix(self, prefix, prompt_len: int) -> None:
        if not isinstance(prefix, list) or len(prefix) not in (0, 2):
            raise OpError("prefix", "must be [] or [src_req, num_tokens]")
        if not prefix:
            return
        src, n = prefix
        if isinstance(src, bool) or not isinstance(src, int) or src not in self.prompts:
            raise OpError("prefix[0]", f"request {src!r} was never admitted (a prefix "
                          "comes from an earlier request's prompt)")
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= min(
                prompt_len, len(self.prompts[src])):
            raise OpError("prefix[1]", f"{n!r} not in [1, {min(prompt_len, len(self.prompts[src]))}]"
                          f" (the prompt's and request {src}'s prompt length)")

    # -- prefix cache (allocator "engine" with enable_prefix_caching) -------
    def block_key(self, group: int, tokens: np.ndarray, index: int) -> tuple:
        """Hash key of block ``index`` of ``group`` for a request with ``tokens``."""
        return tuple(int(t) for t in tokens[:(index + 1) * self.config.tokens_per_block(group)])

    def cached_block(self, group: int, key: tuple) -> int | None:
        """The block registered first under ``key`` (as vLLM's ``get_cached_block``
        returns its dict's first entry), or None."""
        return next((b for b, k in self.registered[group].items() if k == key), None)

    def expected_hit(self, tokens: np.ndarray) -> tuple[int, list[list[int]]]:
        """The prefix-cache hit for a prompt of ``tokens``: (tokens, blocks per
        group) — the longest prefix, at most ``len(tokens) - 1`` tokens and a
        multiple of :attr:`RunnerConfig.prefix_unit`, whose every full block is
        registered in every attention group and — in align mode — whose end has
        a registered state block in every Mamba group (vLLM's hybrid
        coordinator: the longest length every group hits), less one unit with
        a drafter (vLLM drops the last matched block for EAGLE/MTP).  A Mamba
        group's hit blocks are null blocks up to the state block at the hit's
        end (vLLM's ``MambaManager.find_longest_cache_hit``).  A sliding-window
        group needs only the blocks inside the window of the first new token
        (from position ``hit - W + 1``); its entries before are null blocks
        (vLLM's ``SlidingWindowManager.find_longest_cache_hit``: the rightmost
        run of ``cdiv(W - 1, block_size)`` cached blocks)."""
        cfg = self.config
        if not cfg.enable_prefix_caching:
            return 0, [[] for _ in cfg.groups]
        unit = cfg.prefix_unit
        best = (len(tokens) - 1) // unit * unit
        windowed = [g for g in cfg.attention_groups if cfg.groups[g].sliding_window]
        for g in cfg.attention_groups:  # full attention: every block of the prefix
            if g in windowed:
                continue
            bs = cfg.tokens_per_block(g)
            i = 0
            while (i + 1) * bs <= best and self.cached_block(g, self.block_key(g, tokens, i)) is not None:
                i += 1
            best = min(best, i * bs // unit * unit)
        # A drafter (EAGLE/MTP) needs the hidden states of the tokens before the
        # generation point: the last matched unit is computed again (vLLM's
        # drop_eagle_block); a window then needs one cached block past the hit.
        drop = unit if cfg.num_speculative_tokens else 0
        for g in windowed:  # then the longest length whose window is cached
            bs = cfg.tokens_per_block(g)
            best -= drop
            while best > 0 and any(self.cached_block(g, self.block_key(g, tokens, i)) is None
                                   for i in range(self.hit_first_block(g, best, bool(drop)),
                                                  best // bs + (1 if drop else 0))):
                best -= unit
            best = max(best, 0)
            drop = 0
        if drop and best:  # the attention groups' hit, less the drafter's unit
            best -= unit
        # Align mode: then the longest length within it whose end has a state block
        # (vLLM's MambaManager searches within the attention groups' hit).
        if cfg.mamba_cache_mode != "none":
            while best and any(self.cached_block(g, self.block_key(
                    g, tokens, best // cfg.tokens_per_block(g) - 1)) is None
                    for g in cfg.mamba_groups):
                best -= unit
        blocks = [[] for _ in cfg.groups]
        for g in cfg.attention_groups:
            bs = cfg.tokens_per_block(g)
            skipped = self.hit_first_block(g, best, bool(cfg.num_speculative_tokens))
            blocks[g] = [NULL_BLOCK_ID] * skipped + [
                self.cached_block(g, self.block_key(g, tokens, i))
                for i in range(skipped, best // bs)]
        for g in cfg.mamba_groups:
            n = cfg.hit_columns(g, best)
            if n:
                blocks[g] = [NULL_BLOCK_ID] * (n - 1) + [
                    self.cached_block(g, self.block_key(g, tokens, n - 1))]
        return best, blocks

    def blocks_needed(self, group: int, have: int, num_tokens: int,
                      first: bool = False) -> int:
        """New blocks ``group`` needs for a request holding ``have`` blocks to
        cover ``num_tokens`` tokens plus the drafter's lookahead (at most
        ``max_model_len``); a Mamba group: its columns at admission, then none
        — in align mode :func:`align_growth`'s (``first``: the request's
        first allocation, at admission); in all mode one per column, as for
        attention."""
        cfg = self.config
        if cfg.pads_with_null(group):
            return align_growth(have, num_tokens, cfg.tokens_per_block(group),
                                cfg.num_speculative_tokens, first)[2]
        if cfg.groups[group].kind == MAMBA and not cfg.caches_state(group):
            return cfg.mamba_columns if have == 0 else 0
        want = min(num_tokens + cfg.num_speculative_tokens, cfg.max_model_len)
        return max(min(-(-want // cfg.tokens_per_block(group)),
                       cfg.blocks_per_req_max(group)) - have, 0)

    def num_skipped_tokens(self, group: int, num_computed: int) -> int:
        """Leading tokens whose blocks ``group`` no longer needs (vLLM's
        ``get_num_skipped_tokens``): before the sliding window of the next
        token (``num_computed - W + 1``); with prefix caching (align or all
        mode) a Mamba group keeps only the state of the last computed token
        (``num_computed - 1``); else 0."""
        spec = self.config.groups[group]
        if spec.sliding_window:
            return num_computed - spec.sliding_window + 1
        if self.config.caches_state(group):
            return num_computed - 1
        return 0

    def hit_first_block(self, group: int, hit: int, drafter: bool = False) -> int:
        """Sliding-window group: the first block a hit of ``hit`` tokens needs,
        the block of the first position the next token attends to — the hit
        ends a run of ``c = cdiv(W - 1, block_size)`` cached blocks, at least
        one (vLLM's ``SlidingWindowManager``); with a drafter the run is
        ``c + 1`` blocks ending one block past the hit, whose last vLLM then
        drops (PR #17398).  Those before are the null block.  Else 0."""
        window = self.config.groups[group].sliding_window
        if not window:
            return 0
        bs = self.config.tokens_per_block(group)
        c = -(-(window - 1) // bs)
        return max(hit // bs - (c if drafter else max(c, 1)), 0)

    def null_pads(self, group: int, have: int, num_tokens: int, first: bool = False) -> int:
        """Align mode: null entries a Mamba group's list gets before the state
        block :meth:`blocks_needed` asks for (the columns it skips); else 0."""
        cfg = self.config
        if not cfg.pads_with_null(group):
            return 0
        return align_growth(have, num_tokens, cfg.tokens_per_block(group),
                            cfg.num_speculative_tokens, first)[1]

    def spec_moves(self, group: int, have: int, num_tokens: int) -> list[int]:
        """Align mode with a drafter: the columns whose speculative state block
        moves to the end of the list when a running request's list grows
        (:func:`align_growth`); else []."""
        cfg = self.config
        if not cfg.pads_with_null(group):
            return []
        return align_growth(have, num_tokens, cfg.tokens_per_block(group),
                            cfg.num_speculative_tokens, False)[0]

    def skipped_blocks(self, req: int) -> list[list[int]]:
        """Per group, the column indices of ``req``'s blocks wholly before
        :meth:`num_skipped_tokens` (vLLM's ``remove_skipped_blocks``: the
        manager frees them before allocating).  Empty for full attention."""
        r = self.requests[req]
        out = []
        for g, spec in enumerate(self.config.groups):
            skip = self.num_skipped_tokens(g, r.num_computed_tokens)
            bs = self.config.tokens_per_block(g)
            out.append([i for i, b in enumerate(r.blocks[g]) if b and (i + 1) * bs <= skip])
        return out

    def num_free(self, group: int) -> int:
        """Blocks of ``group`` no request holds (registered ones included: evictable)."""
        free = self.ref_count[group] == 0
        if self.config.has_null_block(group):
            free[NULL_BLOCK_ID] = False
        return int(free.sum())

    def fits(self, needed: list[int], hit_blocks: list[list[int]],
             returned: list[int] | None = None) -> bool:
        """Can every group hand out ``needed`` new blocks, after the hit's
        evictable blocks leave the free pool (vLLM's ``get_num_blocks_to_allocate``)
        and ``returned[g]`` blocks (a window's, freed first) come back to it?"""
        want = [0] * self.pool_count  # a shared pool serves every group's need at once
        for g in range(len(self.config.groups)):
            evictable = sum(1 for b in hit_blocks[g] if b and self.ref_count[g][b] == 0)
            want[self.pool_of(g)] += needed[g] + evictable - (returned[g] if returned else 0)
        return all(want[self.pool_of(g)] <= self.num_free(g)
                   for g in range(len(self.config.groups)))

    def holders(self, group: int, block: int) -> list[int]:
        """Requests holding ``block`` of ``group``: live ones, and those that left
        while a load into their blocks was in flight."""
        return sorted(r for held in (self.requests, self.finishing)
                      for r, s in held.items() if block in s.blocks[group])

    # -- queries -----------------------------------------------------------
    def free_blocks(self, group: int) -> list[int]:
        return [int(b) for b in np.flatnonzero(self.owner[group] == FREE)]

    def free_block_count(self, group: int) -> int:
        """``len(free_blocks(group))``, without listing them."""
        return int(np.count_nonzero(self.owner[group] == FREE))

    def live(self) -> list[int]:
        return sorted(self.requests)

    def get(self, req, field_path: str = "req") -> RequestLedger:
        if isinstance(req, bool) or not isinstance(req, int):
            raise OpError(field_path, f"must be an integer request id, got {req!r}")
        if req not in self.requests:
            raise OpError(field_path, f"request {req} is not live")
        return self.requests[req]

    # -- checks (raise OpError, change nothing) ----------------------------
    def _check_allocator(self, allocator: str, op: str) -> None:
        if self.config.allocator != allocator:
            other = "admit / allocate" if allocator == TRACE else "add / append"
            raise OpError("op", f"{op} needs config.allocator {allocator!r} (this config's "
                          f"is {self.config.allocator!r}: use {other})")

    def _check_new_req(self, req) -> None:
        if isinstance(req, bool) or not isinstance(req, int) or not 0 <= req <= REQ_ID_MAX:
            raise OpError("req", f"must be an integer in [0, {REQ_ID_MAX}], got {req!r}")
        if req in self.used_req_ids:
            raise OpError("req", f"request id {req} was already used")
        if len(self.requests) >= self.config.max_num_reqs:
            raise OpError("req", f"already {self.config.max_num_reqs} live requests (max_num_reqs)")

    def check_add(self, req, blocks, prompt_len) -> None:
        cfg = self.config
        self._check_allocator(TRACE, "add")
        self._check_new_req(req)
        self._check_request_blocks(blocks, prompt_len)

    def _check_request_blocks(self, blocks, prompt_len) -> None:
        """The blocks a request enters with: free, at least one per attention
        group, a Mamba group's columns, holding its whole prompt."""
        cfg = self.config
        self._check_blocks(blocks, new=True)
        for g in cfg.attention_groups:
            if not blocks[g]:
                raise OpError(f"blocks[{g}]", "a new request needs at least one block")
        for g in cfg.mamba_groups:
            if len(blocks[g]) != cfg.mamba_columns:
                raise OpError(f"blocks[{g}]", "a mamba group takes exactly "
                              + ("one block" if cfg.mamba_columns == 1 else
                                 f"{cfg.mamba_columns} blocks (1 + num_speculative_tokens)"))
        capacity = capacity_tokens(cfg, blocks)
        if isinstance(prompt_len, bool) or not isinstance(prompt_len, int):
            raise OpError("prompt_len", f"must be an integer, got {prompt_len!r}")
        if not 1 <= prompt_len <= min(capacity, POSITION_MAX + 1):
            raise OpError("prompt_len", f"{prompt_len} not in [1, {capacity}] (blocks given)")

    def check_append(self, req, blocks) -> None:
        self._check_allocator(TRACE, "append")
        r = self.get(req)
        self._check_blocks(blocks, new=False)
        for g in self.config.mamba_groups:
            if blocks[g]:
                raise OpError(f"blocks[{g}]", "a mamba group's block is fixed at add")
        for g in self.config.attention_groups:
            width = self.config.blocks_per_req_max(g)
            if len(r.blocks[g]) + len(blocks[g]) > width:
                raise OpError(f"blocks[{g}]", f"request would exceed its row's {width} "
                              f"column(s) ({self.config.row_source(g)})")
        if not any(blocks):
            raise OpError("blocks", "append needs at least one block")

    def prompt_columns(self, r: RequestLedger, g: int) -> list[int]:
        """Block columns of attention group ``g`` holding ``r``'s prompt positions
        on this rank (what a KV load of the whole prompt fills)."""
        cols = self._prompt_columns.get((g, r.prompt_len))
        if cols is None:  # once per prompt length (every precondition asks)
            local, col, _ = self.config.kept_slots(g, np.arange(r.prompt_len))
            cols = self._prompt_columns[g, r.prompt_len] = tuple(sorted(set(col[local].tolist())))
        return list(cols)

    def _named_columns(self, r: RequestLedger, blocks) -> list[list[tuple[str, int, int]]]:
        """A transfer's ``blocks`` (per group, blocks ``r`` holds), checked for
        shape and ownership: per group, (field path, block, its column)."""
        groups = len(self.config.groups)
        if not isinstance(blocks, list) or len(blocks) != groups:
            raise OpError("blocks", f"must be a list of {groups} lists (one per group)")
        out = []
        for g, ids in enumerate(blocks):
            if not isinstance(ids, list):
                raise OpError(f"blocks[{g}]", "must be a list of block ids")
            named = []
            for k, b in enumerate(ids):
                path = f"blocks[{g}][{k}]"
                if isinstance(b, bool) or not isinstance(b, int) or b not in r.blocks[g]:
                    raise OpError(path, f"block {b!r} is not one of request {r.req}'s blocks "
                                  f"of group {g}")
                named.append((path, b, r.blocks[g].index(b)))
            out.append(named)
        return out

    def _check_handle(self, handle) -> None:
        if isinstance(handle, bool) or not isinstance(handle, int) or handle < 0:
            raise OpError("handle", f"must be an integer >= 0, got {handle!r}")
        if handle in self.used_handles:
            raise OpError("handle", f"handle {handle} was used already (one per transfer)")

    def _check_host_tier(self, op: str) -> None:
        if not self.config.host_blocks:
            raise OpError("op", f"{op} needs a config with a host tier (host_blocks > 0)")

    def host_key(self, req: int, group: int, column: int) -> tuple:
        """The host tier's key of block ``column`` of attention group ``group`` of
        ``req``: (group, the token ids up to the block's end)."""
        n = (column + 1) * self.config.tokens_per_block(group)
        return (group, tuple(int(t) for t in self.token_ids(req, np.arange(n))))

    def check_kv_load_begin(self, req, handle, blocks, source: str = "remote") -> list[list[int]]:
        """Legality of a ``kv_load_begin``; returns the columns per group it fills.

        A connector starts loading part of a new request's prompt KV into
        ``blocks`` (per group, blocks the request holds): attention blocks
        holding prompt positions, a Mamba group's state block (column 0).
        Several handles may load one request, never the same block twice.
        ``source`` "host" (``onboard_begin``): from the host tier — attention
        blocks only, each a full prompt block whose hash the tier holds ready."""
        r = self.get(req)
        cfg = self.config
        op = "onboard_begin" if source == "host" else "kv_load_begin"
        if source == "host":
            self._check_host_tier(op)
        self._check_one_incarnation(req)
        if cfg.mamba_cache_mode != "none":
            raise OpError("op", f"{op} with Mamba prefix caching ({cfg.mamba_cache_mode} "
                          "mode) is not "
                          "modelled (where a connector puts the state block)")
        # From the host tier, the blocks past a prefix hit (vLLM's connector is
        # asked for the tokens after the locally computed ones).
        hit = r.num_cached_tokens if source == "host" else 0
        if r.stepped or r.loaded or r.num_computed_tokens != hit:
            raise OpError("req", f"request {req} already has KV (stepped, loaded or a "
                          "prefix hit)")
        if r.load_failed:
            raise OpError("req", f"request {req} failed a load")
        self._check_handle(handle)
        busy = self._busy_columns(r)
        columns = []
        for g, named in enumerate(self._named_columns(r, blocks)):
            allowed = self._load_columns(r, g)
            cols = []
            for path, b, c in named:
                if c not in allowed:
                    raise OpError(path, f"block {b} holds none of request {req}'s prompt "
                                  + ("positions on this rank" if cfg.groups[g].kind != MAMBA
                                     else "state (a Mamba group loads its state block)"))
                if c in busy[g] or c in cols:
                    raise OpError(path, f"block {b} is loaded already or by a transfer in "
                                  "flight")
                if source == "host" and c not in self.onboard_columns(r, g):
                    raise OpError(path, f"block {b} is not a full prompt block whose hash the "
                                  "host tier holds ready" + (" (a Mamba state is not offloaded)"
                                                             if cfg.groups[g].kind == MAMBA
                                                             else ""))
                cols.append(c)
            columns.append(cols)
        if not any(columns):
            raise OpError("blocks", "a transfer loads at least one block")
        return columns

    def _load_columns(self, r: RequestLedger, g: int) -> list[int]:
        """Columns of group ``g`` a load of ``r``'s prompt fills: the prompt's
        blocks (attention), the state block (Mamba)."""
        return [0] if self.config.groups[g].kind == MAMBA else self.prompt_columns(r, g)

    def _busy_columns(self, r: RequestLedger) -> list[set]:
        """Per group, the columns of ``r`` landed already or loaded by a transfer in flight."""
        busy = [set(r.landed[g]) if r.landed else set() for g in range(len(self.config.groups))]
        for h in self.loads_in_flight(r):
            for g, cols in enumerate(self.transfers[h].columns):
                busy[g] |= set(cols)
        return busy

    def prompt_block_columns(self, r: RequestLedger, g: int) -> list[int]:
        """Columns of attention group ``g`` holding a full block of ``r``'s prompt
        (among the blocks it holds)."""
        return list(range(min(r.prompt_len // self.config.tokens_per_block(g),
                              len(r.blocks[g]))))

    def touch_request(self, r: RequestLedger, columns) -> None:
        """The connector touches a request's keys, group by group: those of
        ``columns(r, g)``."""
        for g in self.config.attention_groups:
            self.host.touch([self.host_key(r.req, g, c) for c in columns(r, g)])

    def onboard_columns(self, r: RequestLedger, g: int) -> list[int]:
        """Columns of attention group ``g`` an onboard of ``r`` may fill: full
        prompt blocks past its prefix hit whose hash the host tier holds ready."""
        if not self.config.host_blocks or self.config.groups[g].kind == MAMBA:
            return []
        hit = r.num_cached_tokens // self.config.tokens_per_block(g)  # past a prefix hit
        return [c for c in self.prompt_block_columns(r, g)[hit:]
                if self.host.is_ready(self.host_key(r.req, g, c))]

    def open_load_blocks(self, r: RequestLedger, source: str = "remote") -> list[list[int]]:
        """Per group, the blocks of ``r`` a new ``kv_load_begin`` (``source``
        "remote") or ``onboard_begin`` ("host") may name (what
        :meth:`check_kv_load_begin` admits)."""
        busy = self._busy_columns(r)
        cols = self._load_columns if source == "remote" else self.onboard_columns
        return [[r.blocks[g][c] for c in cols(r, g) if c not in busy[g]]
                for g in range(len(self.config.groups))]

    def kv_load_begin(self, req: int, handle: int, blocks: list[list[int]],
                      source: str = "remote") -> None:
        """A load starts; from the host tier (``source`` "host") it pins the host
        blocks it reads and makes them most recently used."""
        columns = self.check_kv_load_begin(req, handle, blocks, source)
        r = self.requests[req]
        if not r.landed:
            r.landed = [[] for _ in self.config.groups]
        r.pending.add(handle)
        self.used_handles.add(handle)
        keys = [self.host_key(req, g, c) for g, cols in enumerate(columns) for c in cols] \
            if source == "host" else []
        if keys:  # the connector's lookup touched the request's keys; the load pins its own
            self.touch_request(r, self.prompt_block_columns)
            self.host.prepare_load(keys)
        self.transfers[handle] = Transfer(handle, req, columns, [list(b) for b in blocks],
                                          owner=r, source=source, host_keys=keys)

    def transfer(self, handle, req=None, kind: str = "load", source: str | None = None
                 ) -> Transfer:
        """The transfer ``handle`` in flight, a ``kind`` ("load" / "store") for
        ``req`` when given, from / to ``source`` ("remote" / "host") when given;
        raises :class:`OpError`."""
        if isinstance(handle, bool) or not isinstance(handle, int):
            raise OpError("handle", f"must be an integer handle, got {handle!r}")
        if handle not in self.transfers:
            raise OpError("handle", f"no transfer {handle} in flight")
        t = self.transfers[handle]
        if t.kind != kind:
            raise OpError("handle", f"transfer {handle} is a {t.kind}, not a {kind}")
        if source is not None and t.source != source:
            what = {("load", "host"): "an onboard", ("store", "host"): "an offload",
                    ("load", "remote"): "a connector load", ("store", "remote"): "a store"}
            raise OpError("handle", f"transfer {handle} is {what[t.kind, t.source]}, not "
                          f"{what[t.kind, source]}")
        if req is not None and t.req != req:
            raise OpError("req", f"transfer {handle} is request {t.req}'s, not {req!r}'s")
        return t

    def owner_of_transfer(self, t: Transfer) -> RequestLedger:
        """The request a transfer is for, as it was when the transfer began: left
        with the transfer in flight (removed, failed, or preempted — then perhaps
        resumed on new blocks), or live."""
        return t.owner

    def _end_transfer(self, handle: int) -> list[list[int]] | None:
        """End ``handle``; when its request has left and this was its last
        transfer, free its blocks now (returned per group as :meth:`remove`)."""
        t = self.transfers.pop(handle)
        if t.source == "host":
            if t.kind == "load":
                self.host.complete_load(t.host_keys)
            else:
                self.host.complete_store(t.host_keys)
        r = self.owner_of_transfer(t)
        r.pending.discard(handle)
        if self.finishing.get(t.req) is r and not r.pending:
            return self._free(self.finishing.pop(t.req))
        return None

    def kv_load_complete(self, handle: int) -> list[list[int]] | None:
        """The transfer's KV has landed: its columns are loaded; the request is
        ``loaded`` (its prompt computed) once every prompt column of every group
        has landed and no load failed.  An onboard unpins its host blocks.
        Returns blocks freed (see :meth:`_end_transfer`)."""
        t = self.transfer(handle)
        r = self.owner_of_transfer(t)
        for g, cols in enumerate(t.columns):
            r.landed[g].extend(cols)
        if t.req in self.requests and not r.load_failed and self.loads_in_flight(r) == [handle]:
            cfg = self.config
            if all(set(self.prompt_columns(r, g)) <= set(r.landed[g])
                   for g in cfg.attention_groups) \
                    and all(0 in r.landed[g] for g in cfg.mamba_groups):
                r.loaded = True
                r.num_computed_tokens = r.prompt_len
                self.register_computed(t.req)
        return self._end_transfer(handle)

    def kv_load_fail(self, handle: int) -> tuple[bool, list[list[int]] | None]:
        """The transfer failed: the engine fails its request (it leaves now — the
        first failure only — and keeps its blocks until its last transfer has
        ended: vLLM's ``kv_load_failure_policy`` "fail" with the frees the
        scheduler delays).  Returns (whether the request left now, blocks freed)."""
        t = self.transfer(handle)
        r = self.owner_of_transfer(t)
        r.load_failed = True
        left = t.req in self.requests
        if left:
            del self.requests[t.req]
            self.finishing[t.req] = r
        return left, self._end_transfer(handle)

    def loads_in_flight(self, r: RequestLedger) -> list[int]:
        """Handles of the loads into ``r``'s blocks in flight."""
        return sorted(h for h in r.pending if self.transfers[h].kind == "load")

    def check_kv_store_begin(self, req, handle, num_tokens) -> list[list[int]]:
        """Legality of a ``kv_store_begin``; returns the block columns it reads per group.

        A connector starts saving ``req``'s first ``num_tokens`` computed tokens'
        KV (attention groups) to an external store keyed by those tokens' ids;
        it reads the blocks until :meth:`kv_store_complete`."""
        r = self.get(req)
        cfg = self.config
        self._check_one_incarnation(req)
        if any(g.sliding_window for g in cfg.groups):
            raise OpError("op", "kv_store_begin with sliding windows is not modelled (a "
                          "window's frees under a store in flight)")
        self._check_handle(handle)
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) \
                or not 1 <= num_tokens <= r.num_computed_tokens:
            raise OpError("num_tokens", f"must be in [1, {r.num_computed_tokens}] (request "
                          f"{req}'s computed tokens), got {num_tokens!r}")
        columns = [[] for _ in cfg.groups]
        for g in cfg.attention_groups:
            local, col, _ = cfg.kept_slots(g, np.arange(num_tokens))
            columns[g] = sorted(set(col[local].tolist()))
        return columns

    def kv_store_begin(self, req: int, handle: int, num_tokens: int) -> None:
        columns = self.check_kv_store_begin(req, handle, num_tokens)
        r = self.requests[req]
        r.pending.add(handle)
        self.used_handles.add(handle)
        self.transfers[handle] = Transfer(
            handle, req, columns, [[r.blocks[g][c] for c in cols] for g, cols in
                                   enumerate(columns)], "store", num_tokens, owner=r)

    def kv_store_complete(self, handle: int) -> list[list[int]] | None:
        """The store's copy has finished (an offload's host blocks are ready now);
        returns blocks freed (its request left and this was its last transfer)."""
        return self._end_transfer(handle)

    def offloadable_columns(self, r: RequestLedger, g: int) -> list[int]:
        """Columns of attention group ``g`` an offload of ``r`` may read: its full
        blocks whose tokens are all computed."""
        if not self.config.host_blocks or self.config.groups[g].kind == MAMBA:
            return []
        n = min(r.num_computed_tokens // self.config.tokens_per_block(g), len(r.blocks[g]))
        return list(range(n))

    def check_offload_begin(self, req, handle, blocks) -> list[list[int]]:
        """Legality of an ``offload_begin``; returns the columns per group it names.

        A connector starts copying some of ``req``'s full computed attention
        blocks (per group, blocks the request holds) to the host tier."""
        self._check_host_tier("offload_begin")
        r = self.get(req)
        cfg = self.config
        self._check_one_incarnation(req)
        self._check_handle(handle)
        columns = []
        for g, named in enumerate(self._named_columns(r, blocks)):
            allowed = self.offloadable_columns(r, g)
            cols = []
            for path, b, c in named:
                if c not in allowed or c in cols:
                    raise OpError(path, f"block {b} is not a full computed block of request "
                                  f"{req}" + (" (a Mamba state is not offloaded)"
                                              if cfg.groups[g].kind == MAMBA else "")
                                  + (" or is named twice" if c in cols else ""))
                cols.append(c)
            columns.append(cols)
        if not any(columns):
            raise OpError("blocks", "an offload names at least one block")
        return columns

    def offload_begin(self, req: int, handle: int, blocks: list[list[int]]) -> None:
        """The host tier makes room (its LRU eviction) for the hashes of those
        blocks it lacks, or stores nothing when it cannot; the copy reads the
        blocks it stores until :meth:`kv_store_complete`.  After a store that
        stores something, the request's keys are touched."""
        columns = self.check_offload_begin(req, handle, blocks)
        r = self.requests[req]
        keys = [self.host_key(req, g, c) for g, cols in enumerate(columns) for c in cols]
        new = set(self.host.prepare_store(keys) or ())
        if new:  # vLLM touches after a store that stores something
            self.touch_request(r, self.offloadable_columns)
        stored = [[c for c in cols if self.host_key(req, g, c) in new]
                  for g, cols in enumerate(columns)]
        r.pending.add(handle)
        self.used_handles.add(handle)
        self.transfers[handle] = Transfer(
            handle, req, stored, [[r.blocks[g][c] for c in cols] for g, cols in
                                  enumerate(stored)], "store", owner=r, source="host",
            host_keys=[k for k in keys if k in new])

    def _check_one_incarnation(self, req) -> None:
        """A resumed request starts no transfer while one of the blocks it gave
        back at preemption is still in flight (one incarnation's at a time)."""
        if req in self.finishing:
            raise OpError("req", f"request {req} resumed while a transfer of the blocks it "
                          "gave back is still in flight")

    def check_preempt(self, req) -> None:
        """Preemption (recompute) of a running request: not while a load into its
        blocks or a step of it is in flight; allocator ``trace`` only."""
        self._check_allocator(TRACE, "preempt")
        r = self.get(req)
        if self.loads_in_flight(r):
            raise OpError("req", f"request {req} waits for its KV (transfers "
                          f"{self.loads_in_flight(r)} in flight): it is not running")
        if any(req in reqs for reqs in self.steps_in_flight):
            raise OpError("req", f"request {req} has a step in flight")
        if req in self.finishing:
            raise OpError("req", f"request {req} was preempted before and a transfer of "
                          "its old blocks is still in flight")

    def preempt(self, req: int) -> list[list[int]]:
        """The scheduler preempts ``req`` (recompute): it leaves the batch, its
        blocks are freed (kept while a store still reads them, as for a
        request that finished), its computed tokens are gone; it waits to
        :meth:`resume`.  Returns the blocks freed now per group."""
        self.check_preempt(req)
        self.preempted[req] = self.requests[req].prompt_len
        return self.remove(req)

    def check_resume(self, req, blocks) -> None:
        """A preempted request comes back with new blocks (per group, free ones
        holding its prompt, as for ``add``) and recomputes from position 0."""
        self._check_allocator(TRACE, "resume")
        if isinstance(req, bool) or not isinstance(req, int) or req not in self.preempted:
            raise OpError("req", f"request {req!r} is not preempted")
        if len(self.requests) >= self.config.max_num_reqs:
            raise OpError("req", f"already {self.config.max_num_reqs} live requests "
                          "(max_num_reqs)")
        self._check_request_blocks(blocks, self.preempted[req])

    def resume(self, req: int, blocks: list[list[int]]) -> None:
        self.check_resume(req, blocks)
        prompt_len = self.preempted.pop(req)
        self.requests[req] = RequestLedger(req, prompt_len, [list(b) for b in blocks])
        for g, ids in enumerate(blocks):
            self.owner[g][ids] = req
            self.ref_count[g][ids] = 1

    def check_dispatch(self, scheduled) -> None:
        """A ``step_dispatch`` besides what any step needs: at most
        :data:`MAX_STEPS_IN_FLIGHT` steps in flight; with a drafter a request runs
        in one of them at a time (its next drafts and accepted count are only
        known when its step completes)."""
        if len(self.steps_in_flight) >= MAX_STEPS_IN_FLIGHT:
            raise OpError("op", f"{MAX_STEPS_IN_FLIGHT} steps are in flight already: "
                          "step_complete first")
        if self.config.num_speculative_tokens:
            busy = {r for reqs in self.steps_in_flight for r in reqs}
            for i, item in enumerate(scheduled):
                if isinstance(item, (list, tuple)) and item and item[0] in busy:
                    raise OpError(f"scheduled[{i}][0]", f"request {item[0]} has a step in "
                                  "flight (with a drafter its next step waits for its "
                                  "accepted count)")

    def check_no_step_in_flight(self) -> None:
        if self.steps_in_flight:
            raise OpError("op", f"{len(self.steps_in_flight)} step(s) in flight: an engine "
                          "with steps in flight dispatches its steps (step_dispatch) and "
                          "completes them in order (step_complete)")

    def pending_blocks(self, group: int) -> dict[int, int]:
        """{block: handle} of ``group`` that a transfer in flight writes."""
        return {b: h for h, t in self.transfers.items() for b in t.blocks[group]}

    def check_kv_load(self, req) -> None:
        r = self.get(req)
        if r.pending or r.landed:
            raise OpError("req", f"request {req} loads by transfers (kv_load_begin)")
        if self.config.mamba_cache_mode != "none":
            raise OpError("op", f"kv_load with Mamba prefix caching "
                          f"({self.config.mamba_cache_mode} mode) is not "
                          "modelled (where a connector puts the state block)")
        if r.stepped or r.loaded or r.num_computed_tokens:
            raise OpError("req", f"request {req} already has KV (stepped or loaded)")
        if r.capacity_tokens(self.config) < r.prompt_len:
            raise OpError("req", f"request {req}'s blocks hold {r.capacity_tokens(self.config)} "
                          f"tokens, not its {r.prompt_len}-token prompt (a KV load fills the "
                          "whole prompt)")

    def align_problem(self, r: RequestLedger, start: int, n: int, step: bool) -> str | None:
        """Why ``n`` tokens from position ``start`` of request ``r`` are not a
        chunk align mode schedules (None: they are, or not align mode):
        a prefill chunk stops at the prompt's end, does not run past the last
        Mamba block boundary whose state is cached (the prompt's last one; with
        a drafter one block before it, as EAGLE's hit drops a block), and ends
        on a boundary unless it ends the prompt (vLLM's
        ``_mamba_block_aligned_split`` since 0.27.0, PR #51113: only at a chunk's
        end is a state materialised, and a block a chunk ended inside would be
        cached as full once a later chunk crossed it); a decode runs one token,
        up to ``1 + k`` with a drafter; and a step (``step``: vLLM's scheduler
        allocates for every step it schedules) finds the Mamba list holding
        ``cdiv(end, block_size) + k`` entries, its last token's column (and
        with a drafter a decode's speculative columns after it) holding state
        blocks, and skips no column that holds a state block (two allocations
        before one step would leave one unwritten, then registered as if it
        held the state at its end).  All mode: a prefill
        chunk ends anywhere up to the prompt's end, a decode runs one token,
        and a step's every column, from its last computed token's (the state
        it reads) to its last token's, holds a state block."""
        cfg = self.config
        mode = cfg.mamba_cache_mode
        if mode == "none":
            return None
        end = start + n
        k = cfg.num_speculative_tokens
        for g in cfg.mamba_groups:
            bs = cfg.tokens_per_block(g)
            # With a drafter the last matched block is dropped from a hit (EAGLE),
            # so vLLM's scheduler stops aligning one block earlier.
            last = max(r.prompt_len // bs * bs - (bs if k else 0), 0)
            if start >= r.prompt_len:
                if n > 1 + k:
                    most = f"at most 1 + num_speculative_tokens = {1 + k} tokens" if k \
                        else "one token"
                    return f"request {r.req} decodes: {most} per step in {mode} mode, not {n}"
            elif end > r.prompt_len:
                return (f"request {r.req} prefills: a chunk stops at its prompt's end "
                        f"({r.prompt_len - start} tokens left), not {n}")
            if mode == ALL:
                if step:
                    for c in range(max(start - 1, 0) // bs, (end - 1) // bs + 1):
                        if c >= len(r.blocks[g]) or r.blocks[g][c] == NULL_BLOCK_ID:
                            return (f"request {r.req} holds no Mamba state block in column "
                                    f"{c} (group {g}), which its step from position {start} "
                                    "reads or writes: allocate those tokens first")
                continue
            if start < r.prompt_len and start < last < end:
                return (f"request {r.req} prefills: in align mode a chunk from {start} stops "
                        f"at {last}, the last Mamba block boundary whose state is cached"
                        + (" (one block before the prompt's last: the drafter's hit drops a "
                           "block)" if k else "") + f"; {end} runs past it")
            if start < r.prompt_len and end < r.prompt_len and end % bs:
                # vLLM >= 0.27 (PR #51113): a chunk that ends inside a block would
                # leave that block's state short of its end, then cached as full
                # once a later chunk crosses it.
                return (f"request {r.req} prefills: in align mode a chunk ends on a Mamba "
                        f"block boundary (multiple of {bs}) unless it ends the prompt "
                        f"({r.prompt_len}); {end} does neither")
            if step:
                want = -(-end // bs) + k
                if len(r.blocks[g]) < want:  # vLLM allocates for every step it schedules
                    return (f"request {r.req}'s Mamba list (group {g}) has {len(r.blocks[g])} "
                            f"entries; a step to position {end} needs {want} (the running "
                            f"state block and {k} speculative one(s) at its end): allocate "
                            "those tokens first")
                col = (end - 1) // bs
                # A decode with a drafter writes the state after each of its
                # tokens into the running column and the speculative ones after it.
                for c in range(col, col + (n if k and start >= r.prompt_len else 1)):
                    if c >= len(r.blocks[g]) or r.blocks[g][c] == NULL_BLOCK_ID:
                        return (f"request {r.req} holds no Mamba state block in column {c} "
                                f"(group {g}) for position {end - 1}: allocate those "
                                "tokens first")
                for c in range((start - 1) // bs + 1, col):
                    if r.blocks[g][c] != NULL_BLOCK_ID:
                        return (f"request {r.req}'s step would skip Mamba column {c} (group "
                                f"{g}), which holds a state block it never writes: align "
                                "mode allocates once per step, for the tokens it schedules")
        return None

    def check_step(self, scheduled) -> None:
        cfg = self.config
        if not isinstance(scheduled, list) or not scheduled:
            raise OpError("scheduled", "must be a non-empty list of [req, num_tokens]")
        if len(scheduled) > cfg.max_num_reqs:
            raise OpError("scheduled", f"more than max_num_reqs={cfg.max_num_reqs} requests")
        seen = set()
        total = 0
        for i, item in enumerate(scheduled):
            if not isinstance(item, (list, tuple)) or len(item) != 2:
                raise OpError(f"scheduled[{i}]", "must be [req, num_tokens]")
            req, n = item
            r = self.get(req, f"scheduled[{i}][0]")
            if self.loads_in_flight(r):
                raise OpError(f"scheduled[{i}][0]", f"request {req} waits for its KV "
                              f"(transfers {self.loads_in_flight(r)} in flight)")
            if req in seen:
                raise OpError(f"scheduled[{i}][0]", f"request {req} scheduled twice")
            seen.add(req)
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise OpError(f"scheduled[{i}][1]", f"num_tokens must be an integer >= 1, got {n!r}")
            end = r.num_computed_tokens + n
            if end > min(r.capacity_tokens(cfg), POSITION_MAX + 1):
                raise OpError(f"scheduled[{i}][1]", f"request {req} has room for "
                              f"{r.capacity_tokens(cfg) - r.num_computed_tokens} more tokens, not {n}")
            why = self.align_problem(r, r.num_computed_tokens, n, step=True)
            if why:
                raise OpError(f"scheduled[{i}][1]", why)
            k = cfg.num_speculative_tokens
            ahead = min(end + k, cfg.max_model_len)
            if k and ahead > r.capacity_tokens(cfg):
                raise OpError(f"scheduled[{i}][1]", f"request {req} needs blocks for "
                              f"{ahead} tokens ({r.num_computed_tokens} computed, {n} "
                              f"scheduled, the drafter's {k} lookahead tokens, at most "
                              f"max_model_len {cfg.max_model_len}: vLLM allocates "
                              f"num_lookahead_tokens slots); its blocks hold "
                              f"{r.capacity_tokens(cfg)}")
            if k and r.is_decode() and n > 1 + k:
                raise OpError(f"scheduled[{i}][1]", f"request {req} decodes: at most 1 + "
                              f"num_speculative_tokens = {1 + k} tokens, not {n}")
            if k and not r.is_decode() and end > r.prompt_len:
                left = r.prompt_len - r.num_computed_tokens
                raise OpError(f"scheduled[{i}][1]", f"request {req} prefills: with speculative "
                              f"decoding a chunk stops at its prompt's end ({left} tokens "
                              f"left), not {n}")
            total += n
        if total > cfg.max_num_batched_tokens:
            raise OpError("scheduled", f"{total} tokens > max_num_batched_tokens="
                          f"{cfg.max_num_batched_tokens}")

    def _check_blocks(self, blocks, new: bool) -> None:
        cfg = self.config
        if not isinstance(blocks, list) or len(blocks) != len(cfg.groups):
            raise OpError("blocks", f"must be a list of {len(cfg.groups)} lists (one per group)")
        seen_in_pool: dict[int, set] = {}  # kv_sharing: one id once across the groups
        for g, ids in enumerate(blocks):
            if not isinstance(ids, list):
                raise OpError(f"blocks[{g}]", "must be a list of block ids")
            if cfg.groups[g].kind != MAMBA and len(ids) > cfg.blocks_per_req_max(g):
                raise OpError(f"blocks[{g}]", f"more blocks than the row's "
                              f"{cfg.blocks_per_req_max(g)} column(s) ({cfg.row_source(g)})")
            seen = seen_in_pool.setdefault(self.pool_of(g), set())
            for k, b in enumerate(ids):
                path = f"blocks[{g}][{k}]"
                if isinstance(b, bool) or not isinstance(b, int):
                    raise OpError(path, f"must be an integer block id, got {b!r}")
                if not 0 <= b < cfg.num_blocks:
                    raise OpError(path, f"block {b} out of range [0, {cfg.num_blocks})")
                if b == NULL_BLOCK_ID and cfg.has_null_block(g):
                    raise OpError(path, "block 0 is the null block; it is never allocated")
                pending = self.pending_blocks(g) if self.transfers else {}
                if b in pending:
                    t = self.transfers[pending[b]]
                    doing = "loading into it" if t.kind == "load" else "reading it (a store)"
                    raise OpError(path, f"block {b} is not free: request {t.req} holds it and "
                                  f"transfer {t.handle} is {doing}")
                if b in seen or self.owner[g][b] != FREE:
                    raise OpError(path, f"block {b} is not free" + (
                        " (kv_sharing: one pool for every group)" if cfg.kv_sharing else ""))
                seen.add(b)

    # -- mutations (call the matching check first) -------------------------
    def add(self, req: int, blocks: list[list[int]], prompt_len: int) -> None:
        self.check_add(req, blocks, prompt_len)
        self.requests[req] = RequestLedger(req, prompt_len, [list(b) for b in blocks])
        self.used_req_ids.add(req)
        self.prompts[req] = default_token_ids(req, np.arange(prompt_len))
        for g, ids in enumerate(blocks):
            self.owner[g][ids] = req
            self.ref_count[g][ids] = 1

    # -- allocator "engine": checks of the op's own fields, then the mirror ----
    def check_admit(self, req, prompt_len, prefix, num_new_tokens) -> tuple[np.ndarray, int]:
        """Legality of an ``admit`` before the target chooses; returns the prompt's
        token ids and the expected prefix hit (tokens)."""
        self._check_allocator(ENGINE, "admit")
        self._check_new_req(req)
        cfg = self.config
        if isinstance(prompt_len, bool) or not isinstance(prompt_len, int) \
                or not 1 <= prompt_len <= cfg.max_model_len:
            raise OpError("prompt_len", f"{prompt_len!r} not in [1, {cfg.max_model_len}] "
                          "(max_model_len)")
        self.check_prefix(prefix, prompt_len)
        tokens = self.prompt_tokens(req, prompt_len, prefix)
        hit, _ = self.expected_hit(tokens)
        if isinstance(num_new_tokens, bool) or not isinstance(num_new_tokens, int) \
                or not 1 <= num_new_tokens <= prompt_len - hit:
            raise OpError("num_new_tokens", f"{num_new_tokens!r} not in [1, {prompt_len - hit}]"
                          f" (the prompt's {prompt_len} tokens less its {hit}-token prefix hit)")
        why = self.align_problem(RequestLedger(req, prompt_len, [[] for _ in cfg.groups]),
                                 hit, num_new_tokens, step=False)
        if why:
            raise OpError("num_new_tokens", why)
        return tokens, hit

    def check_allocate(self, req, num_new_tokens) -> None:
        self._check_allocator(ENGINE, "allocate")
        r = self.get(req)
        left = self.config.max_model_len - r.num_computed_tokens
        if isinstance(num_new_tokens, bool) or not isinstance(num_new_tokens, int) \
                or not 1 <= num_new_tokens <= left:
            raise OpError("num_new_tokens", f"{num_new_tokens!r} not in [1, {left}] (request "
                          f"{req} has {r.num_computed_tokens} computed tokens, max_model_len "
                          f"{self.config.max_model_len})")
        why = self.align_problem(r, r.num_computed_tokens, num_new_tokens, step=False)
        if why:
            raise OpError("num_new_tokens", why)

    def _take(self, req: int, group: int, ids: list[int]) -> None:
        """``req`` takes new blocks (not a hit): a registered one is evicted; one
        somebody holds is noted for ONE_OWNER_PER_BLOCK."""
        pad = self.config.pads_with_null(group)
        for b in ids:
            if b == NULL_BLOCK_ID and pad:
                continue  # align mode: the null block pads a Mamba row's skipped columns
            if not self.is_block(group, b):
                self.last_taken_busy.append((group, b, ()))
                continue
            if self.ref_count[group][b]:
                held = [h for g in self.pool_groups(group) for h in self.holders(g, b) if h != req]
                self.last_taken_busy.append((group, b, tuple(held)))
            self.registered[group].pop(b, None)
            self.ref_count[group][b] += 1
            if self.owner[group][b] == FREE:
                self.owner[group][b] = req

    def admit(self, req: int, prompt_len: int, tokens: np.ndarray, blocks, num_cached: int):
        """Mirror an ``admit`` the target decided: ``blocks`` per group (hit blocks
        first; None: refused), ``num_cached`` its prefix hit.  Returns the new
        (non-hit) blocks per group, which the runner poisons."""
        self.last_taken_busy = []
        self.prompts[req] = tokens
        self.used_req_ids.add(req)
        if blocks is None:
            return None
        r = RequestLedger(req, prompt_len, [list(b) for b in blocks],
                          num_computed_tokens=num_cached, num_cached_tokens=num_cached)
        self.requests[req] = r
        new = []
        for g, ids in enumerate(blocks):
            n_hit = self.config.hit_columns(g, num_cached)
            for b in ids[:n_hit]:
                if self.is_block(g, b):
                    self.ref_count[g][b] += 1
                    if self.owner[g][b] == FREE:
                        self.owner[g][b] = req
            self._take(req, g, ids[n_hit:])
            new.append([b for b in ids[n_hit:] if self.is_block(g, b)])
        return new

    def free_skipped(self, req: int, freed) -> list[list[int]]:
        """Mirror the blocks the target freed from ``req``'s sliding windows
        (``freed`` per group): each entry becomes the null block; returns those
        now free and unregistered per group (the allocator poisons them)."""
        r = self.requests[req]
        out = []
        for g, ids in enumerate(freed or []):
            gone = []
            for b in ids:
                if b in r.blocks[g] and b:
                    r.blocks[g][r.blocks[g].index(b)] = NULL_BLOCK_ID
                    self.ref_count[g][b] = max(self.ref_count[g][b] - 1, 0)
                    if self.ref_count[g][b] == 0:
                        self.owner[g][b] = FREE
                        if b not in self.registered[g]:
                            gone.append(b)
            out.append(gone)
        return out

    def allocate(self, req: int, blocks) -> list[list[int]] | None:
        """Mirror an ``allocate``: the new blocks per group (None: refused)."""
        self.last_taken_busy = []
        if blocks is None:
            return None
        r = self.requests[req]
        out = []
        for g, ids in enumerate(blocks):
            # Align mode with a drafter: a speculative block the request holds
            # moves to the end of its list (:func:`align_growth`); its old
            # column becomes the null block.
            moved = [b for b in ids if b != NULL_BLOCK_ID and b in r.blocks[g]] \
                if self.config.pads_with_null(g) else []
            for b in moved:
                r.blocks[g][r.blocks[g].index(b)] = NULL_BLOCK_ID
            r.blocks[g].extend(ids)
            fresh = [b for b in ids if b not in moved]
            self._take(req, g, fresh)
            out.append([b for b in fresh if self.is_block(g, b)])
        return out

    def register_computed(self, req: int) -> None:
        """Prefix caching: register ``req``'s full blocks whose every token is
        computed (once content is written; vLLM registers at allocation, which
        lets a same-step hit read unwritten blocks — #37152): attention blocks,
        and with Mamba prefix caching Mamba state blocks (each then holds the
        state at its end; null entries are skipped)."""
        cfg = self.config
        if not cfg.enable_prefix_caching:
            return
        r = self.requests[req]
        tokens = self.token_ids(req, np.arange(r.num_computed_tokens))
        groups = cfg.attention_groups + [g for g in cfg.mamba_groups if cfg.caches_state(g)]
        for g in groups:
            for i in range(min(r.num_computed_tokens // cfg.tokens_per_block(g),
                               len(r.blocks[g]))):
                b = r.blocks[g][i]
                if 0 < b < cfg.num_blocks and b not in self.registered[g]:
                    self.registered[g][b] = self.block_key(g, tokens, i)

    def append(self, req: int, blocks: list[list[int]]) -> None:
        self.check_append(req, blocks)
        r = self.requests[req]
        for g, ids in enumerate(blocks):
            r.blocks[g].extend(ids)
            self.owner[g][ids] = req
            self.ref_count[g][ids] = 1

    def remove(self, req: int) -> list[list[int]]:
        """Free ``req``'s blocks; returns, per group, those that are now free and
        not registered in the prefix cache (the allocator poisons them; a
        registered block keeps its content until evicted, a shared one stays
        with its other holders)."""
        r = self.get(req)
        del self.requests[req]
        if r.pending:  # a transfer of its blocks is in flight: they stay until it ends
            self.finishing[req] = r
            return [[] for _ in self.config.groups]
        return self._free(r)

    def _free(self, r: RequestLedger) -> list[list[int]]:
        req = r.req
        freed = []
        for g, ids in enumerate(r.blocks):
            out = []
            for b in ids:
                if not self.is_block(g, b):
                    continue
                self.ref_count[g][b] = max(self.ref_count[g][b] - 1, 0)
                if self.ref_count[g][b] == 0:
                    self.owner[g][b] = FREE
                    if b not in self.registered[g]:
                        out.append(b)
                elif self.owner[g][b] == req:
                    self.owner[g][b] = self.holders(g, b)[0]
            freed.append(out)
        return freed

    def kv_load(self, req: int) -> None:
        self.check_kv_load(req)
        r = self.requests[req]
        r.loaded = True
        r.num_computed_tokens = r.prompt_len
        self.register_computed(req)

    def check_rollback(self, req, num_tokens) -> None:
        """Rejected speculative tokens of ``req``'s latest step: at least one of that
        step's tokens is accepted, and only tokens past the prompt are rolled back."""
        r = self.get(req)
        if isinstance(num_tokens, bool) or not isinstance(num_tokens, int):
            raise OpError("num_tokens", f"must be an integer, got {num_tokens!r}")
        if not 1 <= num_tokens < r.last_step_tokens:
            raise OpError("num_tokens", f"{num_tokens} not in [1, {r.last_step_tokens - 1}]: "
                          f"request {req}'s latest step ran {r.last_step_tokens} token(s) "
                          "(one at least is accepted; a step is rolled back once)")
        if r.num_computed_tokens - num_tokens < r.prompt_len:
            raise OpError("num_tokens", f"would roll request {req} back into its prompt "
                          f"({r.prompt_len} tokens)")

    def check_placeholders(self, scheduled: list, accepted, placeholders) -> None:
        """Placeholder drafts (``placeholders``: one count per item, or None): a
        row's last p tokens stand for drafts the scheduler does not have, so
        that the row runs ``1 + num_speculative_tokens`` tokens and the batch
        stays uniform for a FULL graph (vLLM PR #45237 pads a newly scheduled one-token
        decode step so).  Only a decode of exactly ``1 + k`` tokens has them,
        at least its first token is real, and the rejection sampler never
        keeps one: accepted <= num_tokens - p.  Raises :class:`OpError`
        naming ``scheduled[i][3]``."""
        if placeholders is None:
            return
        q = self.config.uniform_query_len
        for i, ((req, n), p) in enumerate(zip(scheduled, placeholders)):
            if isinstance(p, bool) or not isinstance(p, int) or not 0 <= p < n:
                raise OpError(f"scheduled[{i}][3]", f"placeholders must be an integer in "
                              f"[0, {n - 1}] (num_tokens - 1), got {p!r}")
            if not p:
                continue
            if not self.requests[req].is_decode() or n != q:
                raise OpError(f"scheduled[{i}][3]", f"placeholder drafts pad a decode to "
                              f"1 + num_speculative_tokens = {q} tokens; request {req} "
                              + ("prefills" if not self.requests[req].is_decode()
                                 else f"runs {n}"))
            a = n if accepted is None else accepted[i]
            if isinstance(a, int) and not isinstance(a, bool) and not 1 <= a <= n - p:
                raise OpError(f"scheduled[{i}][2]", f"num_accepted must be in [1, {n - p}] "
                              f"(request {req} has {n - p} real token(s) of {n}; placeholders "
                              f"are never accepted), got {a}")

    def sampled(self, scheduled: list, accepted=None) -> list[int]:
        """Tokens the sampler keeps per scheduled item (vLLM: a row's valid sampled
        tokens, what the hybrid runner stores as ``num_accepted_tokens``): a
        decode keeps ``accepted`` (1..num_tokens; default all), a prefill chunk
        that ends its prompt 1, one that does not 0 (its sample is discarded).
        ``accepted``: one count per item or None; raises :class:`OpError`."""
        out = []
        for i, (req, n) in enumerate(scheduled):
            r = self.requests[req]
            if r.is_decode():
                a = n if accepted is None else accepted[i]
                if isinstance(a, bool) or not isinstance(a, int) or not 1 <= a <= n:
                    raise OpError(f"scheduled[{i}][2]", f"request {req} decodes {n} token(s): "
                                  f"num_accepted must be in [1, {n}], got {a!r}")
            else:
                a = int(r.num_computed_tokens + n >= r.prompt_len)
                if accepted is not None and accepted[i] != a:
                    raise OpError(f"scheduled[{i}][2]", f"request {req} prefills: its sampler "
                                  f"keeps {a} token(s) (1 when the chunk ends the prompt, "
                                  f"else 0), not {accepted[i]!r}")
            out.append(a)
        return out

    def rollback(self, req: int, num_tokens: int) -> None:
        self.check_rollback(req, num_tokens)
        r = self.requests[req]
        r.num_computed_tokens -= num_tokens
        r.last_step_tokens = 0

    def step(self, scheduled: list, accepted=None) -> None:
        """A step of ``scheduled`` [[req, num_tokens]]; with speculative decoding a
        decode advances by its accepted tokens (:meth:`sampled`), the rejected
        ones' KV is left as garbage."""
        self.check_step(scheduled)
        kept = self.sampled(scheduled, accepted)
        for (req, n), a in zip(scheduled, kept):
            r = self.requests[req]
            r.last_seq_len = r.num_computed_tokens + n
            r.num_computed_tokens += a if r.is_decode() else n
            r.last_step_tokens = n
            r.stepped = True
            r.loaded = False
            self.register_computed(req)
