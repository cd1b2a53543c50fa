"""Request lifecycle ops: ``add``, ``append``, ``remove``.

Modelled on the scheduler output a model runner applies in ``_update_states``
(``vllm/v1/worker/gpu_model_runner.py``): a new request arrives with its
allocated block ids per KV-cache group, a running one gets new blocks, a
finished one leaves and its blocks return to the pool (blockfuzz poisons them
with the sentinel, so a later read of a freed block is visible).
"""

from __future__ import annotations

import copy

from reference.ledger import capacity_tokens
from reference.payload import POSITION_MAX, REQ_ID_MAX

from harness.core.ops import BLOCK_IDS, INT, OpSpec, Size, register


def _req(op: dict) -> list[int]:
    return [op["req"]]


def _rename(op: dict, req, block) -> dict:
    out = copy.deepcopy(op)
    out["req"] = req(op["req"])
    if "blocks" in op:
        out["blocks"] = [[block(g, b) for b in ids] for g, ids in enumerate(op["blocks"])]
    return out


# -- add -------------------------------------------------------------------------------
def _least(cfg, g: int) -> int:
    """Fewest blocks a new request takes in group ``g``."""
    return cfg.mamba_columns if cfg.groups[g].kind == "mamba" else 1


def _can_add(m) -> bool:
    cfg = m.cfg
    if not (cfg.allocator == "trace" and len(m.ledger.requests) < cfg.max_num_reqs
            and m.next_req <= REQ_ID_MAX):
        return False  # (a full batch, the usual case: no pool to count)
    if cfg.kv_sharing:  # one pool: every group's blocks at once
        return m.free_count(0) >= sum(_least(cfg, g) for g in range(len(cfg.groups)))
    return all(m.free_count(g) >= _least(cfg, g) for g in range(len(cfg.groups)))


def _draw_add(m, data) -> dict:
    cfg = m.cfg
    blocks, taken = [], set()
    for g, spec in enumerate(cfg.groups):
        free = [b for b in m.free(g) if b not in taken]
        # kv_sharing: leave the later groups their fewest blocks of the one pool.
        spare = len(free) - (sum(_least(cfg, h) for h in range(g + 1, len(cfg.groups)))
                             if cfg.kv_sharing else 0)
        # A Mamba group: one state block per column (1 + num_speculative_tokens).
        size = cfg.mamba_columns if spec.kind == "mamba" else None
        blocks.append(data.unique_sample(
            free, size or 1, size or min(cfg.blocks_per_req_max(g), spare)))
        if cfg.kv_sharing:
            taken |= set(blocks[-1])
    # What the ledger admits: this rank's blocks cover block_size * dcp_world_size positions.
    capacity = min(capacity_tokens(cfg, blocks), POSITION_MAX + 1)
    if cfg.num_speculative_tokens and capacity < cfg.max_model_len:
        # Mostly a prompt that leaves room for the drafter's lookahead tokens (the
        # scheduler admits one only then); else one that waits for an append.
        if capacity > cfg.num_speculative_tokens and data.integer(0, 3):
            capacity -= cfg.num_speculative_tokens
    prompt_len = data.integer(1, capacity)
    req = m.next_req
    m.next_req += 1
    return {"op": "add", "req": req, "blocks": blocks, "prompt_len": prompt_len}


def _narrow_add(op: dict):
    for g, ids in enumerate(op["blocks"]):
        if len(ids) > 1:
            fewer = copy.deepcopy(op["blocks"])
            fewer[g].pop()
            yield dict(op, blocks=fewer)


def _add_sizes(op: dict) -> list[Size]:
    return [Size("prompt_len", op["prompt_len"], 1, lambda n: dict(op, prompt_len=n))]


def _merge_add(op: dict, nxt: dict) -> dict | None:
    """An ``add`` and the ``append`` of the same request right after it as one
    ``add`` with all the blocks (the request enters with them)."""
    if nxt["op"] != "append" or nxt["req"] != op["req"]:
        return None
    return dict(op, blocks=[a + b for a, b in zip(op["blocks"], nxt["blocks"])])


register(OpSpec(
    name="add", summary="a new request enters with its block ids per KV-cache group",
    fields={"req": INT, "blocks": BLOCK_IDS, "prompt_len": INT},
    example={"op": "add", "req": 0, "blocks": [[1, 2], [3]], "prompt_len": 5},
    apply=lambda t, op: t.add(op["req"], op["blocks"], op["prompt_len"]),
    draw=_draw_add, enabled=_can_add, requests=_req, rename=_rename, narrow=_narrow_add,
    sizes=_add_sizes, merge=_merge_add))


# -- append ----------------------------------------------------------------------------
def _appendable(m) -> list[int]:
    cfg = m.cfg
    need = len(cfg.attention_groups) if cfg.kv_sharing else 1
    if cfg.allocator != "trace" or not all(m.free_count(g) >= need for g in cfg.attention_groups):
        return []
    # A narrow row that is full takes no more (its group gets no block).
    return [r for r, s in sorted(m.ledger.requests.items())
            if all(len(s.blocks[g]) < cfg.blocks_per_req_max(g) for g in cfg.full_width_groups)]


def _draw_append(m, data) -> dict:
    req = data.choice(_appendable(m))
    blocks, taken = [[] for _ in m.cfg.groups], set()
    r = m.ledger.requests[req]
    for g in m.cfg.attention_groups:
        if len(r.blocks[g]) >= m.cfg.blocks_per_req_max(g):
            continue  # a full narrow row
        blocks[g] = [data.choice([b for b in m.free(g) if b not in taken])]
        if m.cfg.kv_sharing:  # one pool: no id twice in one append
            taken.add(blocks[g][0])
    return {"op": "append", "req": req, "blocks": blocks}


register(OpSpec(
    name="append", summary="a live request gets more blocks (attention groups)",
    fields={"req": INT, "blocks": BLOCK_IDS},
    example={"op": "append", "req": 0, "blocks": [[4], []]},
    apply=lambda t, op: t.append(op["req"], op["blocks"]),
    draw=_draw_append, enabled=lambda m: bool(_appendable(m)), requests=_req, rename=_rename))


# -- remove ----------------------------------------------------------------------------
def _draw_remove(m, data) -> dict:
    return {"op": "remove", "req": data.choice(m.ledger.live())}


def _permit_all_blocks(config, ledger, op):
    """The request's own blocks, any cell: freeing poisons them, a load fills them."""
    cells = {g: {b: None for b in ids} for g, ids in enumerate(ledger.requests[op["req"]].blocks)}
    return cells, frozenset([op["req"]])


def _permit_remove(config, ledger, op):
    """Freeing poisons the request's blocks in every layer that views them (the
    drafter's layer too)."""
    cells, runs = _permit_all_blocks(config, ledger, op)
    if config.draft_group is not None:
        cells[("draft", config.draft_group)] = dict(cells[config.draft_group])
    return cells, runs


register(OpSpec(
    name="remove", summary="a finished request leaves; its blocks return to the pool",
    fields={"req": INT}, example={"op": "remove", "req": 0},
    apply=lambda t, op: t.remove(op["req"]),
    draw=_draw_remove, enabled=lambda m: bool(m.ledger.requests), requests=_req,
    rename=_rename, permit=_permit_remove))
