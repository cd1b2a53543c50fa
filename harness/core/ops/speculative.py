"""Speculative-decoding ops: ``rollback``.

Modelled on the scheduler side of speculative decoding in vLLM
(``vllm/v1/core/sched/scheduler.py``, ``update_from_output``): a step that ran
draft tokens learns how many were accepted, and the request's computed-token
count drops by the rejected ones (``num_computed_tokens -= num_rejected``).
The rejected positions' KV stays in the blocks as garbage the next step
overwrites; reads mask it.  The next step's write permit, the attention
oracle and ``MATCHES_REFERENCE`` all follow the lowered count.

Not modelled here (issue #14): draft passes, accepted counts arriving with the
next step, multi-column Mamba rows — so a rollback is refused where a Mamba
group would need its state rolled back.
"""

from __future__ import annotations

from harness.core.ops import INT, OpSpec, register


def _rollbackable(m) -> list[int]:
    if m.cfg.mamba_groups:
        return []
    return [r for r, s in sorted(m.ledger.requests.items())
            if s.last_step_tokens >= 2 and s.num_computed_tokens - 1 >= s.prompt_len]


def _draw_rollback(m, data) -> dict:
    from hypothesis import strategies as st  # search only: reproducers import no Hypothesis

    req = data.draw(st.sampled_from(_rollbackable(m)))
    s = m.ledger.requests[req]
    most = min(s.last_step_tokens - 1, s.num_computed_tokens - s.prompt_len)
    return {"op": "rollback", "req": req, "num_tokens": data.draw(st.integers(1, most))}


def _narrow_rollback(op: dict):
    if op["num_tokens"] > 1:
        yield dict(op, num_tokens=1)


register(OpSpec(
    name="rollback", summary="rejected speculative tokens: a request's latest step is rolled "
    "back by num_tokens (no Mamba groups)",
    fields={"req": INT, "num_tokens": INT},
    example={"op": "rollback", "req": 0, "num_tokens": 2},
    apply=lambda t, op: t.rollback(op["req"], op["num_tokens"]),
    draw=_draw_rollback, enabled=lambda m: bool(_rollbackable(m)),
    requests=lambda op: [op["req"]], rename=lambda op, req, block: dict(op, req=req(op["req"])),
    narrow=_narrow_rollback, family="speculative"))
