"""The token-slot oracle: SGLang's shape of a paged KV cache, beside the
block-table runners of :mod:`reference.runner`.

SGLang gives every token of a request one KV *slot*
(``sglang/srt/mem_cache/memory_pool.py``: ``ReqToTokenPool.req_to_token[row,
position]``), allocates slots from a token or paged allocator
(``sglang/srt/mem_cache/allocator``), caches finished prefixes in a radix
tree over token ids with lock counts (``sglang/srt/mem_cache/radix_cache.py``),
and pads decode batches for its CUDA graphs by pointing the padded rows at
index 0 of every pool (``cuda_graph_buffer_registry.fill_from``): request row
0 and KV slot 0 are reserved, and padding really writes there.  There is no
persistent batch to condense and no block table.

The engine chooses rows and slots; this oracle does not predict its choices.
It knows what the engine must hold: every live request's tokens (prompt, then
outputs), how many of them have KV (``kv_len``), and the KV each position must
hold (:func:`payload`, a function of the token prefix, so a prefix hit must
read the same values its first owner wrote).  The token-slot invariants
(:mod:`harness.core.invariants.token_slots`) judge the engine's state against
it.  An op it refuses raises :class:`~reference.OpError` and changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from reference.config import ConfigError
from reference.ledger import OpError

# KV slot 0 and request row 0 are SGLang's padding index in every pool.
RESERVED_SLOT = 0
RESERVED_ROW = 0
TOKEN_VOCAB = 1000  # token ids are drawn below this
PAYLOAD_MOD = 1 << 24  # payloads are integers below 2**24: exact in float32
# Bounds of a token-slot config: what a CPU run holds with room to spare.
LIMITS = {"num_slots": 1 << 16, "page_size": 64, "max_num_reqs": 256,
          "max_context_len": 4096}
MAMBA_SLOTS_MAX = 512  # Mamba state slots (0: no Mamba layer)
# The state a cleared Mamba slot holds (SGLang's clear_slots zeroes it): the
# state of the empty prefix.
EMPTY_STATE = 0.0


@dataclass(frozen=True)
class TokenSlotConfig:
    """Geometry of one SGLang-style KV cache (``runner`` is always ``"sglang"``).

    num_slots: KV pool size in tokens (SGLang's ``size``; the buffer has
    ``num_slots + page_size`` slots, the first page reserved); page_size:
    the allocator's page (1: ``TokenToKVPoolAllocator``, > 1:
    ``PagedTokenToKVPoolAllocator``); max_num_reqs: request rows (the pool has
    one more, row 0); max_context_len: slots per row; capture_bs: the decode
    CUDA graph's batch sizes (a decode batch is padded to the smallest that
    fits; larger ones run eager, unpadded); radix_cache: a finished request's
    KV goes into the radix tree (False: SGLang's ``disable_radix_cache``);
    mamba_slots: a hybrid model's Mamba state slots (SGLang's ``mamba_size``:
    ``HybridReqToTokenPool`` holds one more, slot 0, the padding slot; each
    live request holds one slot through its row's entry in
    ``req_index_to_mamba_index_mapping``, and the radix tree keeps finished
    prefixes' states in slots of its own), 0 for an attention-only model;
    at most :data:`MAMBA_SLOTS_MAX`.
    Raises :class:`~reference.config.ConfigError` naming the field.
    """

    num_slots: int = 64
    page_size: int = 1
    max_num_reqs: int = 4
    max_context_len: int = 32
    capture_bs: tuple = (1, 2, 4)
    radix_cache: bool = True
    mamba_slots: int = 0
    runner: str = "sglang"

    def __post_init__(self):
        if not isinstance(self.capture_bs, (list, tuple)):
            raise ConfigError("capture_bs", f"must be a list of batch sizes, got "
                              f"{self.capture_bs!r}")
        object.__setattr__(self, "capture_bs", tuple(self.capture_bs))
        if self.runner != "sglang":
            raise ConfigError("runner", f"a token-slot config is runner 'sglang', not {self.runner!r}")
        for name, most in LIMITS.items():
            v = getattr(self, name)
            if type(v) is not int or not 1 <= v <= most:
                raise ConfigError(name, f"must be an integer in 1..{most}, got {v!r}")
        if type(self.mamba_slots) is not int or not 0 <= self.mamba_slots <= MAMBA_SLOTS_MAX:
            raise ConfigError("mamba_slots", f"must be an integer in 0..{MAMBA_SLOTS_MAX}, got "
                              f"{self.mamba_slots!r}")
        if type(self.radix_cache) is not bool:
            raise ConfigError("radix_cache", f"must be true or false, got {self.radix_cache!r}")
        if 0 < self.mamba_slots < self.mamba_slots_for(1):
            raise ConfigError("mamba_slots", f"{self.mamba_slots} holds no request with a "
                              f"prefix hit: 0 (no Mamba layer), or at least "
                              f"{self.mamba_slots_for(1)} with radix_cache "
                              f"{str(self.radix_cache).lower()}")
        if self.num_slots % self.page_size:
            raise ConfigError("num_slots", f"{self.num_slots} is not a multiple of page_size "
                              f"{self.page_size}")
        if self.num_slots < 2 * self.page_size:
            raise ConfigError("num_slots", f"{self.num_slots} holds no request: at least two "
                              f"pages of {self.page_size} (one more is over-asked per request)")
        if self.max_context_len < 2:
            raise ConfigError("max_context_len", "must be at least 2 (a prompt token and a "
                              "decoded one)")
        if not self.capture_bs or any(type(b) is not int or b < 1 for b in self.capture_bs) \
                or list(self.capture_bs) != sorted(set(self.capture_bs)):
            raise ConfigError("capture_bs", f"must be increasing positive integers, at least "
                              f"one, got {list(self.capture_bs)}")

    def mamba_slots_for(self, live: int, hit: bool = True) -> int:
        """Mamba state slots ``live`` requests may need at once, the last one
        admitted just now: each holds its own slot; with the radix cache each
        also locks the tree's copy of its state after its prefill (the
        result processor's checkpoint), and the newest, where its prompt may
        hit (``hit``), its hit's state until then."""
        return 2 * live + int(hit) if self.radix_cache else live

    @property
    def num_pages(self) -> int:
        """Allocatable pages (page 0, the reserved one, not counted)."""
        return self.num_slots // self.page_size

    def padded_bs(self, bs: int) -> int | None:
        """The graph batch size a decode batch of ``bs`` rows runs at (None: eager)."""
        return next((c for c in self.capture_bs if c >= bs), None)

    def to_json(self) -> dict:
        return {"runner": self.runner, "num_slots": self.num_slots,
                "page_size": self.page_size, "max_num_reqs": self.max_num_reqs,
                "max_context_len": self.max_context_len, "capture_bs": list(self.capture_bs),
                "radix_cache": self.radix_cache,
                **({"mamba_slots": self.mamba_slots} if self.mamba_slots else {})}

    @classmethod
    def from_json(cls, d: dict) -> TokenSlotConfig:
        known = {"runner", "num_slots", "page_size", "max_num_reqs", "max_context_len",
                 "capture_bs", "radix_cache", "mamba_slots"}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(unknown[0], "not a token-slot config field")
        return cls(**d)


def payload(tokens) -> np.ndarray:
    """The KV value each position of ``tokens`` must hold: a rolling hash of the
    prefix ending there (float32, shape ``(len(tokens),)``, integers below
    2**24).  Two requests with the same first p + 1 tokens hold the same value
    at position p — what a prefix hit relies on."""
    out = np.empty(len(tokens), np.float32)
    h = 7
    for i, t in enumerate(tokens):
        h = (h * 1000003 + int(t) + 1) % PAYLOAD_MOD
        out[i] = h
    return out


def state_after(tokens, state: float = EMPTY_STATE) -> float:
    """A Mamba layer's state after it consumes ``tokens`` from ``state``: the
    rolling hash of :func:`payload` continued from the hash ``state`` holds
    (:data:`EMPTY_STATE`: the empty prefix), so the state of a request that has
    consumed its first n tokens equals the KV payload of its position n - 1,
    and a state that started wrong (a hit's state not copied, a slot not
    cleared, NaN from a padded row) stays wrong.  Returns a float32 value (NaN
    in, NaN out)."""
    if np.isnan(state):
        return np.float32(np.nan)
    h = 7 if state == EMPTY_STATE else int(state)
    for t in tokens:
        h = (h * 1000003 + int(t) + 1) % PAYLOAD_MOD
    return np.float32(h)


def token_of(req: int, position: int) -> int:
    """The token id request ``req`` has at ``position`` when it is its own (a
    prompt token it did not copy from a source, or an output it sampled)."""
    return (req * 7919 + position * 104729 + 13) % TOKEN_VOCAB


@dataclass
class RequestTokens:
    """One request as the oracle knows it: ``tokens`` (prompt, then outputs),
    ``kv_len`` (positions whose KV is computed), ``live`` (False once finished)."""

    tokens: list
    kv_len: int
    prompt_len: int
    live: bool = True


class TokenSlotReference:
    """The oracle for a :class:`TokenSlotConfig` (``target`` ``reference`` for it).

    Op methods (one per token-slot op of :mod:`harness.core.ops.token_slots`):
    ``sgl_admit``, ``sgl_decode``, ``sgl_idle``, ``sgl_finish``, ``sgl_evict``.
    Each checks legality first and raises :class:`OpError` (nothing changed).
    """

    name = "reference"

    def __init__(self, config: TokenSlotConfig):
        self.config = config
        self.requests: dict[int, RequestTokens] = {}
        self.last_forward: dict | None = None  # {"kind", "reqs", "positions"}

    @property
    def ledger(self) -> TokenSlotReference:
        """What the session calls the ledger: the oracle itself (ownership is
        the engine's choice, judged against the requests it knows)."""
        return self

    def observe(self, copy: bool = True) -> TokenSlotReference:
        """The oracle as the checks read it (themselves; they never write it)."""
        return self

    # -- legality ------------------------------------------------------------------
    def live(self) -> list[int]:
        return [r for r, s in self.requests.items() if s.live]

    def _pages(self, n: int) -> int:
        return -(-n // self.config.page_size)

    def held_slots(self) -> int:
        """Slots the live requests hold at most (their KV rounded up to pages, a
        shared prefix counted per request): what no eviction can free."""
        return sum(self._pages(self.requests[r].kv_len + 1) * self.config.page_size
                   for r in self.live())

    def _room(self, tokens: int, reqs: int) -> bool:
        # SGLang's paged allocation over-asks a page per request.
        need = tokens + reqs * self.config.page_size
        return self.held_slots() + need <= self.config.num_slots

    def prompt_tokens(self, req: int, prompt_len: int, prefix=None) -> list[int]:
        """The prompt of a new request: ``prefix`` ``[src, n]`` copies request
        ``src``'s first ``n`` tokens (prompt and outputs), then its own."""
        head = []
        if prefix:
            src, n = prefix
            if src not in self.requests:
                raise OpError("prefix[0]", f"request {src} was never admitted")
            if not 1 <= n <= min(prompt_len, len(self.requests[src].tokens)):
                raise OpError("prefix[1]", f"prefix length {n} outside 1..{min(prompt_len, len(self.requests[src].tokens))}")
            head = list(self.requests[src].tokens[:n])
        return head + [token_of(req, p) for p in range(len(head), prompt_len)]

    # -- ops ------------------------------------------------------------------------
    def sgl_admit(self, req: int, prompt_len: int, prefix=None) -> None:
        """Prefill a new request's prompt (its prefix hit included) and sample
        its first output token."""
        cfg = self.config
        if req in self.requests:
            raise OpError("req", f"request {req} was admitted before")
        if len(self.live()) >= cfg.max_num_reqs:
            raise OpError("req", f"{cfg.max_num_reqs} requests are live (max_num_reqs)")
        if not 1 <= prompt_len <= cfg.max_context_len - 1:
            raise OpError("prompt_len", f"{prompt_len} outside 1..{cfg.max_context_len - 1}")
        tokens = self.prompt_tokens(req, prompt_len, prefix)
        if not self._room(prompt_len, 1):
            raise OpError("prompt_len", f"no room for {prompt_len} tokens ({self.held_slots()} of "
                          f"{cfg.num_slots} slots held by live requests)")
        live = len(self.live())
        need = cfg.mamba_slots_for(live + 1, hit=bool(prefix))
        if cfg.mamba_slots and need > cfg.mamba_slots:
            raise OpError("req", f"no Mamba state slot for one more request: {live} live "
                          f"and this one may need {need} of the {cfg.mamba_slots} slots")
        self.requests[req] = RequestTokens(tokens + [token_of(req, prompt_len)], prompt_len,
                                           prompt_len)
        self.last_forward = {"kind": "extend", "reqs": [req],
                             "positions": {req: (0, prompt_len)}}

    def sgl_decode(self) -> None:
        """One decode step of the running batch (every live request, as SGLang's
        scheduler runs it): each writes the KV of its last token and samples
        the next; the batch is padded to a captured size when one fits."""
        cfg = self.config
        reqs = self.live()
        if not reqs:
            raise OpError("", "no live request to decode")
        for r in reqs:
            if self.requests[r].kv_len + 1 >= cfg.max_context_len:
                raise OpError("", f"request {r} is at max_context_len {cfg.max_context_len}")
        if not self._room(len(reqs), len(reqs)):
            raise OpError("", f"no room to decode {len(reqs)} requests")
        positions = {}
        for r in reqs:
            s = self.requests[r]
            positions[r] = (s.kv_len, s.kv_len + 1)
            s.kv_len += 1
            s.tokens.append(token_of(r, len(s.tokens)))
        self.last_forward = {"kind": "decode", "reqs": list(reqs), "positions": positions,
                             "padded_bs": cfg.padded_bs(len(reqs))}

    def sgl_idle(self, bs: int) -> None:
        """An idle batch (a DP rank with no requests) run in the decode graph of
        ``bs`` rows: padding only."""
        if bs not in self.config.capture_bs:
            raise OpError("bs", f"{bs} is not a captured size "
                          f"{list(self.config.capture_bs)}")
        self.last_forward = {"kind": "idle", "reqs": [], "positions": {}, "padded_bs": bs}

    def sgl_finish(self, req: int) -> None:
        """The request finishes: its KV goes into the radix tree (if on), its
        row and the rest of its slots back to the pools."""
        if req not in self.requests or not self.requests[req].live:
            raise OpError("req", f"request {req} is not live")
        self.requests[req].live = False
        self.last_forward = None

    def sgl_evict(self, num_tokens: int) -> None:
        """The radix tree evicts at least ``num_tokens`` tokens of unlocked leaves
        (fewer when it has fewer)."""
        if num_tokens < 1:
            raise OpError("num_tokens", f"{num_tokens} is below 1")
        self.last_forward = None

    # -- what the invariants read -----------------------------------------------------
    def expected_state(self, req: int) -> np.float32:
        """The Mamba state request ``req``'s slot must hold: the state after its
        first ``kv_len`` tokens (hybrid configs)."""
        s = self.requests[req]
        return state_after(s.tokens[:s.kv_len])

    def expected_kv(self, req: int) -> np.ndarray:
        """The KV request ``req``'s first ``kv_len`` positions must hold."""
        s = self.requests[req]
        return payload(s.tokens[:s.kv_len])
