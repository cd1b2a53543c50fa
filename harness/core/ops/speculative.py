"""Speculative-decoding ops: ``spec_step`` and ``rollback``.

Modelled on speculative decoding in vLLM: the scheduler gives each decoding
request its last sampled token plus up to k draft tokens
(``num_speculative_tokens``); the model runner verifies them in one forward,
the rejection sampler keeps a prefix (``num_accepted_tokens``, 1..1+k per
decode: the accepted drafts plus one bonus token), the runner stores that
count per persistent-batch row for the next step's Mamba metadata
(``gpu_model_runner.py``, ``_update_states_after_model_execute``), the
scheduler lowers the request's computed tokens by the rejected ones
(``scheduler.py``, ``update_from_output``), and the drafter
(``vllm/v1/spec_decode/eagle.py``) proposes the next drafts from the last
accepted token, writing its own layer's KV cache.

``spec_step`` is a real step whose decodes carry their accepted counts — and,
optionally, how many of their last tokens are placeholder drafts (a fourth
field per item: a decode padded to ``1 + k`` tokens so that the batch is
uniform for a FULL graph, as vLLM's scheduler pads a request with no drafts
yet, PR #45237; never accepted); a plain ``step`` on a config with a drafter
is a ``spec_step`` that accepts every token.  ``rollback`` is the scheduler side alone, for configs without a
drafter or Mamba group (the earlier, narrower model).
"""

from __future__ import annotations

from harness.core.ops import CUDAGRAPH_MODE, INT, OpSpec, Size, register
from harness.core.ops.forward import _draw_step, _step_without, _steppable, permit_forward


def _spec_on(m) -> bool:
    return bool(m.cfg.num_speculative_tokens)


def _draw_spec_step(m, data) -> dict:

    step = _draw_step(m, data)
    q = m.cfg.uniform_query_len
    scheduled = []
    for req, n in step["scheduled"]:
        r = m.ledger.requests[req]
        if r.is_decode():  # the rejection sampler's kept prefix
            # A decode of 1 + k tokens may carry placeholder drafts (one in four):
            # the scheduler had fewer drafts and padded it to the uniform length.
            p = data.integer(1, n - 1) if n == q > 1 and data.integer(0, 3) == 0 else 0
            real = n - p
            a = real if data.integer(0, 3) == 0 else data.integer(1, real)
            scheduled.append([req, n, a] + ([p] if p else []))
        else:  # a prefill's sample is kept only when the chunk ends its prompt
            scheduled.append([req, n, int(r.num_computed_tokens + n >= r.prompt_len)])
    return {"op": "spec_step", "scheduled": scheduled, "cudagraph_mode": step["cudagraph_mode"]}


def _pairs(op: dict) -> list:
    return [[x[0], x[1]] for x in op["scheduled"]]


def _accepted(op: dict) -> list:
    return [x[2] for x in op["scheduled"]]


def _placeholders(op: dict) -> list | None:
    """Placeholder drafts per item (None when no item names any)."""
    if all(len(x) < 4 for x in op["scheduled"]):
        return None
    return [x[3] if len(x) > 3 else 0 for x in op["scheduled"]]


def _narrow_spec_step(op: dict):
    sched = op["scheduled"]
    yield {"op": "step", "scheduled": _pairs(op), "cudagraph_mode": op["cudagraph_mode"]}
    for k, item in enumerate(sched):
        req, n, a = item[:3]
        if len(sched) > 1:
            yield dict(op, scheduled=sched[:k] + sched[k + 1:])
        if len(item) > 3:  # no placeholders: every draft real
            yield dict(op, scheduled=sched[:k] + [[req, n, a]] + sched[k + 1:])
        if a < n and len(item) < 4:  # fewer rejections
            yield dict(op, scheduled=sched[:k] + [[req, n, n]] + sched[k + 1:])
        if n > 1:  # one token: a decode keeps it, a prefill chunk keeps 0 or 1
            for kept in (1, 0):
                yield dict(op, scheduled=sched[:k] + [[req, 1, kept]] + sched[k + 1:])
    if op["cudagraph_mode"] != "NONE":
        yield dict(op, cudagraph_mode="NONE")


def _permit_spec_step(config, ledger, op):
    return permit_forward(config, ledger, _pairs(op), _accepted(op))


register(OpSpec(
    name="spec_step", summary="a real step with speculative decoding: each decode runs its "
    "last token + drafts and keeps num_accepted of them ([req, num_tokens, num_accepted], "
    "or with a fourth field the placeholder drafts that pad it to 1 + k tokens, never "
    "accepted); the drafter runs after the forward",
    fields={"scheduled": {"type": "array", "minItems": 1,
                          "items": {"type": "array", "items": INT, "minItems": 3,
                                    "maxItems": 4}},
            "cudagraph_mode": CUDAGRAPH_MODE},
    example={"op": "spec_step", "scheduled": [[0, 3, 2], [1, 3, 1, 2]], "cudagraph_mode": "FULL"},
    apply=lambda t, op: t.step(_pairs(op), op["cudagraph_mode"], accepted=_accepted(op),
                               placeholders=_placeholders(op)),
    draw=_draw_spec_step, enabled=lambda m: (_spec_on(m) and not m.ledger.steps_in_flight
                                             and bool(_steppable(m))),
    requests=lambda op: [x[0] for x in op["scheduled"]], without_request=_step_without,
    rename=lambda op, req, block: dict(op, scheduled=[[req(x[0]), *x[1:]]
                                                      for x in op["scheduled"]]),
    narrow=_narrow_spec_step, permit=_permit_spec_step, forward="real", family="spec-decode"))


def _rollbackable(m) -> list[int]:
    if m.cfg.mamba_groups or m.cfg.num_speculative_tokens or m.cfg.enable_prefix_caching \
            or any(g.sliding_window for g in m.cfg.groups):
        return []
    return [r for r, s in sorted(m.ledger.requests.items())
            if s.last_step_tokens >= 2 and s.num_computed_tokens - 1 >= s.prompt_len]


def _draw_rollback(m, data) -> dict:

    req = data.choice(_rollbackable(m))
    s = m.ledger.requests[req]
    most = min(s.last_step_tokens - 1, s.num_computed_tokens - s.prompt_len)
    return {"op": "rollback", "req": req, "num_tokens": data.integer(1, most)}


def _rollback_sizes(op: dict) -> list[Size]:
    return [Size("num_tokens", op["num_tokens"], 1, lambda n: dict(op, num_tokens=n))]


register(OpSpec(
    name="rollback", summary="rejected speculative tokens: a request's latest step is rolled "
    "back by num_tokens (no Mamba groups, no drafter: the scheduler side alone)",
    fields={"req": INT, "num_tokens": INT},
    example={"op": "rollback", "req": 0, "num_tokens": 2},
    apply=lambda t, op: t.rollback(op["req"], op["num_tokens"]),
    draw=_draw_rollback, enabled=lambda m: bool(_rollbackable(m)),
    requests=lambda op: [op["req"]], rename=lambda op, req, block: dict(op, req=req(op["req"])),
    sizes=_rollback_sizes, family="spec-decode"))
