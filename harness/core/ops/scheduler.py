"""Scheduler-side ops where the target's KV-cache manager chooses the blocks:
``admit`` and ``allocate`` (``config.allocator == "engine"``).

Modelled on vLLM's scheduler calling its KV-cache manager
(``vllm/v1/core/sched/scheduler.py`` → ``vllm/v1/core/kv_cache_manager.py``):
a waiting request is admitted with its prefix-cache hit
(``get_computed_blocks``) and blocks for its first chunk
(``allocate_slots``); a running request asks for blocks for its next tokens.
The model runner then receives the block ids, as ``NewRequestData`` /
``CachedRequestData.new_block_ids``.  A refusal (the pool is short) is a legal
outcome: the request stays out (``admit``) or gets nothing (``allocate``).

These ops *record* what the target chose (``records``): ``blocks`` (per group;
``null`` when refused) and, for ``admit``, ``num_cached_tokens`` (the hit).
A search or a shrink fills them in from the target; a replay of a saved
trace compares the target's new choice with them (``ALLOCATION_REPLAYED``)
and the reference mirrors them, so the scheduler invariants judge the
choice (:mod:`harness.core.invariants.scheduler`).  A trace may leave them
out; the first replay records them.
"""

from __future__ import annotations

import copy

import numpy as np
from reference.ledger import RequestLedger
from reference.payload import REQ_ID_MAX

from harness.core.ops import BLOCK_IDS, INT, OpSpec, Size, register

RECORDED_BLOCKS = {"anyOf": [{"type": "null"},
                             {"type": "array", "items": {"type": "array", "items": INT}}]}
PREFIX = {"type": "array", "items": INT, "maxItems": 2}


def _engine(m) -> bool:
    return m.cfg.allocator == "engine"


def recorded(op: dict, spec) -> dict | None:
    """The choice ``op`` records (its ``records`` fields), or None when it has none."""
    if not all(f in op for f in spec.records):
        return None
    return {f: copy.deepcopy(op[f]) for f in spec.records}


def without_recorded(op: dict) -> dict:
    """``op`` without the fields its target records (a candidate to be re-recorded)."""
    from harness.core.ops import spec_of

    return {k: v for k, v in op.items() if k not in spec_of(op).records}


# -- admit -------------------------------------------------------------------------
def _can_admit(m) -> bool:
    return (_engine(m) and len(m.ledger.requests) < m.cfg.max_num_reqs
            and m.next_req <= REQ_ID_MAX)


def _draw_admit(m, data) -> dict:

    cfg, ledger = m.cfg, m.ledger
    req = m.next_req
    m.next_req += 1
    prefix = []
    sources = sorted(ledger.prompts)
    conv = max([cfg.groups[g].conv_size for g in cfg.mamba_groups], default=0)
    short_tail = conv - 1 if cfg.mamba_cache_mode == "all" and conv > 2 else 0
    if (cfg.enable_prefix_caching or cfg.host_blocks) and sources and data.integer(0, 3):
        # Mostly a prompt that shares an earlier one's prefix (the whole of it,
        # or a cut), then its own tokens: where prefix hits come from — most
        # often an earlier prompt whose blocks are registered already (or, with
        # a host tier, one of whose prompt blocks the tier holds: what it onboards).
        if cfg.enable_prefix_caching:
            cached = [r for r in sources if ledger.expected_hit(
                np.append(ledger.prompts[r], -1))[0] > 0]
        else:
            cached = [r for r in sources if any(
                ledger.host.is_ready(ledger.host_key(r, g, c)) for g in cfg.attention_groups
                for c in range(len(ledger.prompts[r]) // cfg.tokens_per_block(g)))]
        src = data.choice(cached if cached and data.integer(0, 3) else sources)
        src_len = len(ledger.prompts[src])
        whole = ledger.expected_hit(np.append(ledger.prompts[src], -1))[0]
        if whole and data.integer(0, 3) == 0:
            # The boundary of the hit length: a prompt exactly as long as the
            # source's cached blocks, every token of it cached — the engine must
            # still leave its last token to compute.  In all mode with a conv
            # state of c > 2 tokens, up to c - 1 tokens more: after the hit, a
            # prefill chunk shorter than the conv state.
            prompt_len = n = whole
            if short_tail > 1:
                prompt_len = min(whole + data.integer(0, short_tail), cfg.max_model_len)
        else:
            extra = 0 if data.boolean() else data.integer(0, max(cfg.max_model_len - src_len, 0))
            prompt_len = min(src_len + extra, cfg.max_model_len)
            n = src_len if data.boolean() else data.integer(1, src_len)
        prefix = [src, min(n, prompt_len)]
    elif data.integer(0, 3) == 0:
        # A prompt at a block boundary (a multiple of the block size, or one
        # off): where a last block is exactly full, or holds one token — and,
        # in all mode with a conv state of c > 2 tokens, up to c - 1 past it: a
        # later prompt that hits the full blocks then runs a chunk shorter than
        # the conv state.
        unit = cfg.prefix_unit
        near = sorted({k * unit + d for k in range(1, cfg.max_model_len // unit + 1)
                       for d in range(-1, max(short_tail, 1) + 1)
                       if 1 <= k * unit + d <= cfg.max_model_len})
        prompt_len = data.choice(near) if near else 1
    elif cfg.enable_prefix_caching and data.boolean():
        # A prompt of a block or two (and a few tokens): full blocks to register
        # and share within a few steps — one more with a drafter, whose hit
        # drops its last block (the drafter computes it again).
        units = 2 + (cfg.num_speculative_tokens > 0)
        prompt_len = data.integer(1, min(cfg.max_model_len, units * cfg.prefix_unit + 2))
    else:
        prompt_len = data.integer(1, cfg.max_model_len)
    tokens = ledger.prompt_tokens(req, prompt_len, prefix)
    hit, _ = ledger.expected_hit(tokens)
    most = max(1, min(prompt_len - hit, cfg.max_num_batched_tokens))
    # Mostly what a scheduler does: as much of the prompt as the token budget allows.
    sizes = _chunk_sizes(ledger, RequestLedger(req, prompt_len, []), hit, most)
    num_new = sizes[-1] if data.boolean() else data.choice(sizes)
    return {"op": "admit", "req": req, "prompt_len": prompt_len, "prefix": prefix,
            "num_new_tokens": num_new}


def _chunk_sizes(ledger, r, start: int, most: int) -> list[int]:
    """Token counts 1..``most`` a scheduler may allocate for ``r`` from ``start``
    (align mode: chunks ending on Mamba block boundaries; the config keeps one
    block within the token budget, so there is always one)."""
    return [n for n in range(1, most + 1)
            if ledger.align_problem(r, start, n, step=False) is None] or [1]


def _admit_requests(op: dict) -> list[int]:
    return [op["req"]] + ([op["prefix"][0]] if op["prefix"] else [])


def _admit_without(op: dict, req: int) -> dict | None:
    if op["req"] == req:
        return None
    if op["prefix"] and op["prefix"][0] == req:
        return dict(without_recorded(op), prefix=[])
    return op


def _admit_rename(op: dict, req, block) -> dict:
    out = copy.deepcopy(op)
    out["req"] = req(op["req"])
    if op["prefix"]:
        out["prefix"] = [req(op["prefix"][0]), op["prefix"][1]]
    return out


def _narrow_admit(op: dict):
    base = without_recorded(op)
    if op["prefix"]:
        yield dict(base, prefix=[])
    hit = op.get("num_cached_tokens")
    first = (hit if isinstance(hit, int) and not isinstance(hit, bool) else 0) \
        + op["num_new_tokens"]
    if first < op["prompt_len"]:  # the prompt ends with its first chunk: no more chunks
        yield dict(base, prompt_len=first,
                   prefix=[op["prefix"][0], min(op["prefix"][1], first)] if op["prefix"] else [])


def _admit_sizes(op: dict) -> list[Size]:
    """The prompt (its first chunk and shared prefix clamped to it), then the first chunk."""
    base = without_recorded(op)

    def prompt(n):
        return dict(base, prompt_len=n, num_new_tokens=min(op["num_new_tokens"], n),
                    prefix=[op["prefix"][0], min(op["prefix"][1], n)] if op["prefix"] else [])
    return [Size("prompt_len", op["prompt_len"], 1, prompt),
            Size("num_new_tokens", op["num_new_tokens"], 1,
                 lambda n: dict(base, num_new_tokens=n))]


def _permit_new_blocks(config, ledger, op):
    """Blocks the op newly hands out, any cell (the allocator poisons them: an
    evicted block's old content goes); hit blocks are read, never written."""
    blocks = op.get("blocks")
    cells = {g: {} for g in range(len(config.groups))}
    if blocks is None:
        blocks = [[] for _ in config.groups]
    hit = op.get("num_cached_tokens") or 0
    for g, ids in enumerate(blocks):
        null = config.null_block(g)
        cells[g] = {b: None for b in ids[config.hit_columns(g, hit):] if b != null}  # a pad
    for g, ids in enumerate(op.get("freed") or []):  # left a sliding window: poisoned
        cells[g].update({b: None for b in ids if b})
    if config.draft_group is not None:
        cells[("draft", config.draft_group)] = dict(cells[config.draft_group])
    return cells, frozenset([op["req"]] if op.get("blocks") is not None else [])


def _admit(t, op):
    return t.admit(op["req"], op["prompt_len"], list(op["prefix"]), op["num_new_tokens"],
                   recorded(op, ADMIT))


ADMIT = register(OpSpec(
    name="admit", summary="a new request gets its prefix hit and blocks from the target's "
                          "KV-cache manager (allocator engine)",
    fields={"req": INT, "prompt_len": INT, "prefix": PREFIX, "num_new_tokens": INT,
            "blocks": RECORDED_BLOCKS, "num_cached_tokens": {"anyOf": [{"type": "null"}, INT]}},
    example={"op": "admit", "req": 1, "prompt_len": 9, "prefix": [0, 8], "num_new_tokens": 1,
             "blocks": [[3, 4, 7]], "num_cached_tokens": 8},
    apply=_admit, draw=_draw_admit, enabled=_can_admit, requests=_admit_requests,
    without_request=_admit_without, rename=_admit_rename, narrow=_narrow_admit, sizes=_admit_sizes,
    permit=_permit_new_blocks, family="scheduler", records=("blocks", "num_cached_tokens"),
    check=lambda ref, op: ref.ledger.check_admit(op["req"], op["prompt_len"], op["prefix"],
                                                 op["num_new_tokens"])))


# -- allocate ----------------------------------------------------------------------
def _allocatable(m) -> list[int]:
    if not _engine(m):
        return []
    return [r for r, s in sorted(m.ledger.requests.items())
            if s.num_computed_tokens < m.cfg.max_model_len]


def _state_column_missing(m, r) -> bool:
    """Align mode: ``r`` decodes, and a decode of ``1 + k`` tokens (at most
    what ``max_model_len`` leaves) would need a Mamba state block its list
    does not hold yet."""
    if m.cfg.mamba_cache_mode != "align" or not r.is_decode():
        return False
    n = min(1 + m.cfg.num_speculative_tokens, m.cfg.max_model_len - r.num_computed_tokens)
    return n > 0 and m.ledger.align_problem(r, r.num_computed_tokens, n, step=True) is not None


def _draw_allocate(m, data) -> dict:

    cands = _allocatable(m)
    # Mostly a request whose blocks do not cover its prompt, or that has no room
    # left to step: the scheduler's next chunk, the next decode block — in align
    # mode also a decode whose next 1 + k tokens reach a Mamba column without a
    # state block (its attention blocks may have room).
    k = m.cfg.num_speculative_tokens
    short = [r for r in cands if m.ledger.requests[r].capacity_tokens(m.cfg)
             < max(m.ledger.requests[r].prompt_len,
                   m.ledger.requests[r].num_computed_tokens + 1 + k)
             or _state_column_missing(m, m.ledger.requests[r])]
    req = data.choice(short if short and data.boolean() else cands)
    r = m.ledger.requests[req]
    most = min(m.cfg.max_model_len - r.num_computed_tokens, m.cfg.max_num_batched_tokens)
    sizes = _chunk_sizes(m.ledger, r, r.num_computed_tokens, most)
    # The next chunk of the prompt, or a decode's next step.  In align mode with
    # a drafter that step verifies 1 + k tokens, and the scheduler allocates
    # for all of them (vLLM's ``allocate_slots`` with the scheduled drafts), or
    # the decode could run one token only; other configs keep one token.
    step = 1 + k if k and m.cfg.mamba_cache_mode == "align" and r.is_decode() else 1
    chunk = min(max(r.prompt_len - r.num_computed_tokens, step), most)
    chunk = max([n for n in sizes if n <= chunk] or sizes[:1])
    n = chunk if data.boolean() else data.choice(sizes)
    return {"op": "allocate", "req": req, "num_new_tokens": n}


def _allocate_sizes(op: dict) -> list[Size]:
    return [Size("num_new_tokens", op["num_new_tokens"], 1,
                 lambda n: dict(without_recorded(op), num_new_tokens=n))]


def _allocate(t, op):
    return t.allocate(op["req"], op["num_new_tokens"], recorded(op, ALLOCATE))


ALLOCATE = register(OpSpec(
    name="allocate", summary="a running request gets blocks for its next tokens from the "
                             "target's KV-cache manager (allocator engine)",
    fields={"req": INT, "num_new_tokens": INT, "blocks": RECORDED_BLOCKS, "freed": BLOCK_IDS},
    example={"op": "allocate", "req": 1, "num_new_tokens": 4, "blocks": [[9]], "freed": [[]]},
    apply=_allocate, draw=_draw_allocate, enabled=lambda m: bool(_allocatable(m)),
    requests=lambda op: [op["req"]],
    rename=lambda op, req, block: dict(copy.deepcopy(op), req=req(op["req"])),
    sizes=_allocate_sizes, permit=_permit_new_blocks, family="scheduler",
    records=("blocks", "freed"),
    # vLLM's scheduler allocates before every step it schedules: a decode whose
    # next tokens need a Mamba state block gets it as soon as it can (align mode).
    eager=lambda m: any(_state_column_missing(m, m.ledger.requests[r])
                        for r in _allocatable(m)),
    check=lambda ref, op: ref.ledger.check_allocate(op["req"], op["num_new_tokens"])))
