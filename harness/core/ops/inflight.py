"""Steps in flight: ``step_dispatch`` and ``step_complete``.

Modelled on async scheduling in vLLM (``vllm/v1/worker/gpu_model_runner.py``
with ``async_scheduling``; ``AsyncGPUModelRunnerOutput``): the runner
dispatches step N and returns before it finishes; the scheduler prepares
step N+1 meanwhile, and requests leave, the batch is condensed or reordered
and new requests arrive while step N runs.  The step's device work happens in
stream order, so the model runs it at dispatch; what the host copies back —
each request's accepted count (speculative decoding), which the next step's
Mamba metadata reads from a row-indexed buffer — lands only at completion, and
must land on the requests that ran the step, wherever they sit then.

At most two steps are in flight; steps complete in dispatch order.  With a
drafter a request runs in one step in flight at a time (its next step needs
its accepted count).  Plain ``step`` / ``spec_step`` are refused while a step
is in flight.  ``ROW_RESULTS_FOLLOW_REQUESTS`` and the effect invariants judge
where the results landed.
"""

from __future__ import annotations

from reference import OpError

from harness.core.ops import CUDAGRAPH_MODE, INT, OpSpec, register
from harness.core.ops.forward import (_draw_step, _narrow_step, _step_without, _steppable,
                                      permit_forward)
from harness.core.ops.speculative import _draw_spec_step


def split_scheduled(scheduled) -> tuple[list, list | None, list | None]:
    """``[[req, n]]`` or ``[[req, n, accepted(, placeholders)]]`` -> (pairs,
    accepted or None, placeholders or None); raises :class:`OpError` for a mix."""
    if not isinstance(scheduled, list) or not scheduled:
        raise OpError("scheduled", "must be a non-empty list of [req, num_tokens] "
                      "(or [req, num_tokens, num_accepted] with a drafter)")
    sizes = {len(x) if isinstance(x, (list, tuple)) else 0 for x in scheduled}
    if sizes == {2}:
        return [list(x) for x in scheduled], None, None
    if sizes <= {3, 4}:
        return ([list(x[:2]) for x in scheduled], [x[2] for x in scheduled],
                [x[3] if len(x) > 3 else 0 for x in scheduled] if 4 in sizes else None)
    raise OpError("scheduled", "items must all be [req, num_tokens] or all [req, "
                  "num_tokens, num_accepted] (a fourth field: placeholder drafts)")


def _dispatch(t, op):
    pairs, accepted, placeholders = split_scheduled(op["scheduled"])
    return t.step(pairs, op["cudagraph_mode"], accepted, in_flight=True,
                  placeholders=placeholders)


def _can_dispatch(m) -> bool:
    from reference.ledger import MAX_STEPS_IN_FLIGHT

    return len(m.ledger.steps_in_flight) < MAX_STEPS_IN_FLIGHT and bool(_steppable(m))


def _draw_dispatch(m, data) -> dict:
    step = _draw_spec_step(m, data) if m.cfg.num_speculative_tokens else _draw_step(m, data)
    return dict(step, op="step_dispatch")


def _permit_dispatch(config, ledger, op):
    pairs, accepted, _ = split_scheduled(op["scheduled"])
    return permit_forward(config, ledger, pairs, accepted)


def _as_step(op: dict) -> dict:
    """The dispatch as a plain step (``spec_step`` with accepted counts)."""
    name = "spec_step" if len(op["scheduled"][0]) >= 3 else "step"
    return {"op": name, "scheduled": [list(x) for x in op["scheduled"]],
            "cudagraph_mode": op["cudagraph_mode"]}


def _narrow_dispatch(op: dict):
    """A plain step first (legal where nothing completes it later), then the
    step's own narrowings."""
    yield _as_step(op)
    yield from _narrow_step(op)


def _merge_dispatch(op: dict, nxt: dict) -> dict | None:
    """A dispatch completed right away is a plain step."""
    return _as_step(op) if nxt["op"] == "step_complete" else None


register(OpSpec(
    name="step_dispatch", summary="a real step dispatched and left in flight (async "
    "scheduling): its per-request results reach the host at step_complete",
    fields={"scheduled": {"type": "array", "minItems": 1,
                          "items": {"type": "array", "items": INT, "minItems": 2,
                                    "maxItems": 4}},
            "cudagraph_mode": CUDAGRAPH_MODE},
    example={"op": "step_dispatch", "scheduled": [[0, 1], [1, 1]], "cudagraph_mode": "FULL"},
    apply=_dispatch, draw=_draw_dispatch, enabled=_can_dispatch,
    requests=lambda op: [x[0] for x in op["scheduled"]], without_request=_step_without,
    rename=lambda op, req, block: dict(op, scheduled=[[req(x[0]), *x[1:]]
                                                      for x in op["scheduled"]]),
    narrow=_narrow_dispatch, merge=_merge_dispatch, permit=_permit_dispatch,
    forward="real", family="async"))
register(OpSpec(
    name="step_complete", summary="the oldest step in flight completes: its accepted counts "
    "land on the requests that ran it",
    fields={}, example={"op": "step_complete"},
    apply=lambda t, op: t.step_complete(), draw=lambda m: {"op": "step_complete"},
    draws_data=False, enabled=lambda m: bool(m.ledger.steps_in_flight), family="async"))
