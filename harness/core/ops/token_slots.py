"""Token-slot ops: the trace vocabulary of an SGLang-shaped engine (``runner``
``sglang``; :class:`reference.token_slots.TokenSlotConfig`).

SGLang has no block table, persistent batch or trace-chosen blocks: its
scheduler matches a prompt in the radix tree, locks the hit, and its
allocators choose a row and one slot per token (``sglang/srt/managers/``,
``sglang/srt/mem_cache/``).  So these ops name requests and token counts only;
the engine chooses where things go and the token-slot invariants judge it
(:mod:`harness.core.invariants.token_slots`).  The block-table ops
(``condense``, ``swap``, ``add`` with block ids, …) have no meaning here: their
``runners`` leave ``sglang`` out, and a trace that mixes them is refused.

The state machine draws them for a token-slot config (``fuzz --target
sglang``); each ``enabled`` keeps the op legal for the oracle, which refuses
what SGLang's scheduler would not admit (no room, no row).
"""

from __future__ import annotations

from harness.core.ops import INT, OpSpec, Size, register

RUNNERS = ("sglang",)
TARGETS = ("reference", "sglang")
FAMILY = "token-slot"
PREFIX = {"type": "array", "items": INT, "minItems": 2, "maxItems": 2}


def _ref(m):
    return m.ledger  # a token-slot session's ledger is its oracle


def _token_slots(m) -> bool:
    return m.cfg.runner == "sglang"


def _prompt_room(m) -> int:
    """The longest prompt the oracle would admit now (0: none)."""
    ref, cfg = _ref(m), m.cfg
    return max(0, min(cfg.max_context_len - 1,
                      cfg.num_slots - ref.held_slots() - cfg.page_size))


def _state_room(m, hit: bool) -> bool:
    """A hybrid model's Mamba pool holds one more request (``hit``: whose prompt
    starts with an earlier one's tokens); always, without a Mamba pool."""
    cfg = m.cfg
    return not cfg.mamba_slots or \
        cfg.mamba_slots_for(len(_ref(m).live()) + 1, hit) <= cfg.mamba_slots


def _can_admit(m) -> bool:
    live, cfg = len(_ref(m).live()), m.cfg
    return (_token_slots(m) and live < cfg.max_num_reqs and _prompt_room(m) >= 1
            and _state_room(m, hit=False))


def _draw_admit(m, data) -> dict:
    """A new request: mostly a prompt that starts with an earlier request's tokens
    (a finished one's: what the radix tree may hold; a whole cached path, or a
    cut of it), else its own tokens; a prompt as long as the pool allows."""
    ref = _ref(m)
    req = m.next_req
    m.next_req += 1
    room = _prompt_room(m)
    sources = sorted(ref.requests)
    op = {"op": "sgl_admit", "req": req}
    if sources and data.integer(0, 2) and _state_room(m, hit=True):
        done = [r for r in sources if not ref.requests[r].live]
        src = data.choice(done if done and data.integer(0, 3) else sources)
        have = min(len(ref.requests[src].tokens), room)
        n = have if data.boolean() else data.integer(1, have)
        op["prompt_len"] = min(room, n + (0 if data.boolean() else data.integer(0, 4)))
        op["prefix"] = [src, n]
    else:
        op["prompt_len"] = data.integer(1, room)
    return op


def _can_decode(m) -> bool:
    if not _token_slots(m):
        return False
    ref, cfg = _ref(m), m.cfg
    live = ref.live()
    return bool(live) and all(ref.requests[r].kv_len + 1 < cfg.max_context_len
                              for r in live) and \
        ref.held_slots() + len(live) * (1 + cfg.page_size) <= cfg.num_slots


def _can_finish(m) -> bool:
    return _token_slots(m) and bool(_ref(m).live())


def _can_evict(m) -> bool:
    return _token_slots(m) and m.cfg.radix_cache and any(
        not s.live for s in _ref(m).requests.values())


def _admit_sizes(op: dict) -> list:
    """The prompt's length (down to its copied prefix), and the copied prefix's
    (the prompt's own tokens after it kept: the prompt shrinks with it)."""
    out = []
    prefix = op.get("prefix")
    least = prefix[1] if prefix else 1
    out.append(Size("prompt_len", op["prompt_len"], least,
                    lambda v: dict(op, prompt_len=v)))
    if prefix:
        tail = op["prompt_len"] - prefix[1]
        out.append(Size("prefix", prefix[1], 1,
                        lambda v: dict(op, prefix=[prefix[0], v], prompt_len=v + tail)))
    return out


def _one_req(op: dict) -> list[int]:
    return [op["req"]]


def _admit_requests(op: dict) -> list[int]:
    return [op["req"]] + ([op["prefix"][0]] if op.get("prefix") else [])


def _rename_admit(op: dict, req, block) -> dict:
    out = dict(op, req=req(op["req"]))
    if op.get("prefix"):
        out["prefix"] = [req(op["prefix"][0]), op["prefix"][1]]
    return out


register(OpSpec(
    name="sgl_admit",
    summary="a new request is prefilled: its prompt matched in the radix tree and the hit "
            "locked, a row and slots allocated for the rest, their KV written; it samples "
            "its first token",
    fields={"req": INT, "prompt_len": INT, "prefix": PREFIX},
    example={"op": "sgl_admit", "req": 1, "prompt_len": 9, "prefix": [0, 6]},
    apply=lambda t, op: t.sgl_admit(op["req"], op["prompt_len"], op.get("prefix")),
    draw=_draw_admit, enabled=_can_admit, runners=RUNNERS, targets=TARGETS, requests=_admit_requests, rename=_rename_admit,
    optional=("prefix",), sizes=_admit_sizes, forward="real", family=FAMILY))

register(OpSpec(
    name="sgl_decode",
    summary="one decode step of the running batch: a slot per request, the batch padded "
            "to a captured graph size (padded rows point at row 0 and slot 0), the KV "
            "written by the replay",
    fields={},
    example={"op": "sgl_decode"},
    apply=lambda t, op: t.sgl_decode(),
    draw=lambda m: {"op": "sgl_decode"}, draws_data=False, enabled=_can_decode,
    runners=RUNNERS, targets=TARGETS, forward="real", family=FAMILY))

register(OpSpec(
    name="sgl_idle",
    summary="an idle batch (a DP rank with no requests) replayed in the decode graph of "
            "bs rows: padding only",
    fields={"bs": INT},
    example={"op": "sgl_idle", "bs": 2},
    apply=lambda t, op: t.sgl_idle(op["bs"]),
    draw=lambda m, data: {"op": "sgl_idle", "bs": data.choice(m.cfg.capture_bs)},
    enabled=_token_slots, runners=RUNNERS, targets=TARGETS, forward="dummy", family=FAMILY))

register(OpSpec(
    name="sgl_finish",
    summary="a request finishes: its KV goes into the radix tree, its lock is released, "
            "its row and the slots the tree did not take return to the pools",
    fields={"req": INT},
    example={"op": "sgl_finish", "req": 0},
    apply=lambda t, op: t.sgl_finish(op["req"]),
    draw=lambda m, data: {"op": "sgl_finish", "req": data.choice(_ref(m).live())},
    enabled=_can_finish, runners=RUNNERS, targets=TARGETS, requests=_one_req,
    rename=lambda op, req, block: dict(op, req=req(op["req"])), family=FAMILY))

register(OpSpec(
    name="sgl_evict",
    summary="the radix tree evicts unlocked leaves, at least num_tokens tokens (fewer "
            "when it holds fewer); their slots return to the allocator",
    fields={"num_tokens": INT},
    example={"op": "sgl_evict", "num_tokens": 8},
    apply=lambda t, op: t.sgl_evict(op["num_tokens"]),
    draw=lambda m, data: {"op": "sgl_evict",
                          "num_tokens": data.integer(1, m.cfg.num_slots)},
    enabled=_can_evict, runners=RUNNERS, targets=TARGETS, family=FAMILY,
    sizes=lambda op: [Size("num_tokens", op["num_tokens"], 1,
                           lambda v: dict(op, num_tokens=v))]))
