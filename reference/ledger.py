"""Block pool and ownership ledger: who owns which block, from the ops alone.

Models the scheduler side of vLLM (``vllm/v1/core/kv_cache_manager.py`` /
``block_pool.py``): block 0 of every KV-cache group is the null block, reserved
and never allocated; a request owns an ordered list of blocks per group until it
is removed, then they are free again and may be handed to another request.
Block ids are explicit in traces, so the ledger checks them rather than
choosing them.

The ledger is also where an op's legality is decided: every check raises
:class:`OpError` naming the field, before anything changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .config import MAMBA, RunnerConfig
from .payload import NULL_BLOCK_ID, POSITION_MAX, REQ_ID_MAX

FREE = -1
RESERVED = -2


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

    def is_decode(self) -> bool:
        """Its prompt is done (stepped or loaded): a step of it decodes."""
        return self.num_computed_tokens >= self.prompt_len

    def capacity_tokens(self, config: RunnerConfig) -> int:
        """Tokens the request's attention blocks can hold (min over groups)."""
        return min(len(self.blocks[g]) * config.tokens_per_block(g)
                   for g in config.attention_groups)


@dataclass
class Ledger:
    """Ownership of every block of every group, and the live requests.

    owner[g]: int64 (num_blocks,): request id, ``FREE`` or ``RESERVED`` (null block).
    """

    config: RunnerConfig
    owner: list[np.ndarray] = field(init=False)
    requests: dict[int, RequestLedger] = field(default_factory=dict)
    used_req_ids: set[int] = field(default_factory=set)

    def __post_init__(self):
        self.owner = []
        for _ in self.config.groups:
            o = np.full(self.config.num_blocks, FREE, dtype=np.int64)
            o[NULL_BLOCK_ID] = RESERVED
            self.owner.append(o)

    # -- queries -----------------------------------------------------------
    def free_blocks(self, group: int) -> list[int]:
        return [int(b) for b in np.flatnonzero(self.owner[group] == FREE)]

    def live(self) -> list[int]:
        return sorted(self.requests)

    def get(self, req, field_path: str = "req") -> RequestLedger:
        if isinstance(req, bool) or not isinstance(req, int):
            raise OpError(field_path, f"must be an integer request id, got {req!r}")
        if req not in self.requests:
            raise OpError(field_path, f"request {req} is not live")
        return self.requests[req]

    # -- checks (raise OpError, change nothing) ----------------------------
    def check_add(self, req, blocks, prompt_len) -> None:
        cfg = self.config
        if isinstance(req, bool) or not isinstance(req, int) or not 0 <= req <= REQ_ID_MAX:
            raise OpError("req", f"must be an integer in [0, {REQ_ID_MAX}], got {req!r}")
        if req in self.used_req_ids:
            raise OpError("req", f"request id {req} was already used")
        if len(self.requests) >= cfg.max_num_reqs:
            raise OpError("req", f"already {cfg.max_num_reqs} live requests (max_num_reqs)")
        self._check_blocks(blocks, new=True)
        for g in cfg.attention_groups:
            if not blocks[g]:
                raise OpError(f"blocks[{g}]", "a new request needs at least one block")
        for g in cfg.mamba_groups:
            if len(blocks[g]) != cfg.mamba_columns:
                raise OpError(f"blocks[{g}]", "a mamba group takes exactly "
                              + ("one block" if cfg.mamba_columns == 1 else
                                 f"{cfg.mamba_columns} blocks (1 + num_speculative_tokens)"))
        capacity = min(len(blocks[g]) * cfg.tokens_per_block(g) for g in cfg.attention_groups)
        if isinstance(prompt_len, bool) or not isinstance(prompt_len, int):
            raise OpError("prompt_len", f"must be an integer, got {prompt_len!r}")
        if not 1 <= prompt_len <= min(capacity, POSITION_MAX + 1):
            raise OpError("prompt_len", f"{prompt_len} not in [1, {capacity}] (blocks given)")

    def check_append(self, req, blocks) -> None:
        r = self.get(req)
        self._check_blocks(blocks, new=False)
        for g in self.config.mamba_groups:
            if blocks[g]:
                raise OpError(f"blocks[{g}]", "a mamba group's block is fixed at add")
        for g in self.config.attention_groups:
            if len(r.blocks[g]) + len(blocks[g]) > self.config.max_num_blocks_per_req:
                raise OpError(f"blocks[{g}]", "request would exceed max_num_blocks_per_req "
                              f"({self.config.max_num_blocks_per_req})")
        if not any(blocks):
            raise OpError("blocks", "append needs at least one block")

    def check_kv_load(self, req) -> None:
        r = self.get(req)
        if r.stepped or r.loaded or r.num_computed_tokens:
            raise OpError("req", f"request {req} already has KV (stepped or loaded)")

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
            if req in seen:
                raise OpError(f"scheduled[{i}][0]", f"request {req} scheduled twice")
            seen.add(req)
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise OpError(f"scheduled[{i}][1]", f"num_tokens must be an integer >= 1, got {n!r}")
            end = r.num_computed_tokens + n
            if end > min(r.capacity_tokens(cfg), POSITION_MAX + 1):
                raise OpError(f"scheduled[{i}][1]", f"request {req} has room for "
                              f"{r.capacity_tokens(cfg) - r.num_computed_tokens} more tokens, not {n}")
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
        for g, ids in enumerate(blocks):
            if not isinstance(ids, list):
                raise OpError(f"blocks[{g}]", "must be a list of block ids")
            if cfg.groups[g].kind != MAMBA and len(ids) > cfg.max_num_blocks_per_req:
                raise OpError(f"blocks[{g}]", f"more than max_num_blocks_per_req="
                              f"{cfg.max_num_blocks_per_req}")
            seen = set()
            for k, b in enumerate(ids):
                path = f"blocks[{g}][{k}]"
                if isinstance(b, bool) or not isinstance(b, int):
                    raise OpError(path, f"must be an integer block id, got {b!r}")
                if not 0 <= b < cfg.num_blocks:
                    raise OpError(path, f"block {b} out of range [0, {cfg.num_blocks})")
                if b == NULL_BLOCK_ID:
                    raise OpError(path, "block 0 is the null block; it is never allocated")
                if b in seen or self.owner[g][b] != FREE:
                    raise OpError(path, f"block {b} is not free")
                seen.add(b)

    # -- mutations (call the matching check first) -------------------------
    def add(self, req: int, blocks: list[list[int]], prompt_len: int) -> None:
        self.check_add(req, blocks, prompt_len)
        self.requests[req] = RequestLedger(req, prompt_len, [list(b) for b in blocks])
        self.used_req_ids.add(req)
        for g, ids in enumerate(blocks):
            self.owner[g][ids] = req

    def append(self, req: int, blocks: list[list[int]]) -> None:
        self.check_append(req, blocks)
        r = self.requests[req]
        for g, ids in enumerate(blocks):
            r.blocks[g].extend(ids)
            self.owner[g][ids] = req

    def remove(self, req: int) -> list[list[int]]:
        """Free ``req``'s blocks; returns them per group."""
        r = self.get(req)
        for g, ids in enumerate(r.blocks):
            self.owner[g][ids] = FREE
        del self.requests[req]
        return r.blocks

    def kv_load(self, req: int) -> None:
        self.check_kv_load(req)
        r = self.requests[req]
        r.loaded = True
        r.num_computed_tokens = r.prompt_len

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
