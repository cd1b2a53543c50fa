"""Preemption: ``preempt`` and ``resume`` (recompute).

Modelled on vLLM's scheduler preempting a running request when the pool runs
short (``vllm/v1/core/sched/scheduler.py``: ``_preempt_request`` frees its
blocks and resets its computed tokens) and rescheduling it later, and on the
model runner's side of it (``vllm/v1/worker/gpu_model_runner.py``,
``_update_states``: the preempted request leaves the persistent batch, its
cached request state stays; when it is scheduled again with
``resumed_from_preemption`` its block ids are *replaced* by the new ones and it
recomputes from the scheduler's count).  A store still reading a preempted
request's blocks keeps them, as for a request that finished.  With the trace
naming blocks (allocator ``trace``); not with the engine's KV-cache manager
yet.  Swap-out is the host tier's composition (``offload_*``, ``preempt``,
``resume``, ``onboard_*``), as an engine with a CPU offloading connector
runs it.
"""

from __future__ import annotations

from harness.core.ops import BLOCK_IDS, INT, OpSpec, register
from harness.core.ops.lifecycle import _permit_remove, _rename, _req


def _preemptable(m) -> list[int]:
    ledger = m.ledger
    if m.cfg.allocator != "trace":
        return []
    busy = {r for reqs in ledger.steps_in_flight for r in reqs}
    return [r for r, s in sorted(ledger.requests.items())
            if not ledger.loads_in_flight(s) and r not in busy and r not in ledger.finishing]


def _need(cfg, g: int, prompt_len: int) -> int:
    """Fewest blocks of group ``g`` a request with ``prompt_len`` tokens enters with."""
    if cfg.groups[g].kind == "mamba":
        return cfg.mamba_columns
    # A narrow row holds at most its width (no KV past it).
    return min(-(-prompt_len // cfg.tokens_per_block(g)), cfg.blocks_per_req_max(g))


def _resumable(m) -> list[int]:
    cfg, ledger = m.cfg, m.ledger
    if len(ledger.requests) >= cfg.max_num_reqs:
        return []
    out = []
    for req, prompt_len in sorted(ledger.preempted.items()):
        if cfg.kv_sharing:
            fits = m.free_count(0) >= sum(_need(cfg, g, prompt_len)
                                          for g in range(len(cfg.groups)))
        else:
            fits = all(m.free_count(g) >= _need(cfg, g, prompt_len)
                       for g in range(len(cfg.groups)))
        if fits:
            out.append(req)
    return out


def _draw_resume(m, data) -> dict:
    cfg = m.cfg
    req = data.choice(_resumable(m))
    prompt_len = m.ledger.preempted[req]
    blocks, taken = [], set()
    for g, spec in enumerate(cfg.groups):
        free = [b for b in m.free(g) if b not in taken]
        least = _need(cfg, g, prompt_len)
        spare = len(free) - (sum(_need(cfg, h, prompt_len) for h in range(g + 1, len(cfg.groups)))
                             if cfg.kv_sharing else 0)
        most = least if spec.kind == "mamba" else max(least, min(cfg.blocks_per_req_max(g),
                                                                 spare))
        blocks.append(data.unique_sample(free, least, most))
        if cfg.kv_sharing:
            taken |= set(blocks[-1])
    return {"op": "resume", "req": req, "blocks": blocks}


register(OpSpec(
    name="preempt", summary="the scheduler preempts a running request (recompute): it leaves "
    "the batch and its blocks are freed until it resumes",
    fields={"req": INT}, example={"op": "preempt", "req": 0},
    apply=lambda t, op: t.preempt(op["req"]),
    draw=lambda m, data: {"op": "preempt", "req": data.choice(_preemptable(m))},
    enabled=lambda m: bool(_preemptable(m)), requests=_req, rename=_rename,
    permit=_permit_remove, family="async"))
register(OpSpec(
    name="resume", summary="a preempted request resumes on new blocks and recomputes from "
    "position 0",
    fields={"req": INT, "blocks": BLOCK_IDS},
    example={"op": "resume", "req": 0, "blocks": [[5, 6], [7]]},
    apply=lambda t, op: t.resume(op["req"], op["blocks"]),
    draw=_draw_resume, enabled=lambda m: bool(_resumable(m)), requests=_req, rename=_rename,
    family="async"))
