"""The op vocabulary as a registry: one :class:`OpSpec` per op, one module per
op family.

Everything the harness knows about an op lives in its family's module:

- its JSON fields (``fields``: a JSON Schema per field) and an example;
- how it is applied to a target (``apply``: calls the target's op method);
- which requests it mentions and how it changes when a request is dropped or
  renamed (``requests``, ``without_request``, ``rename``: the shrinker);
- simpler versions of it, merged or folded forms (``narrow``, ``merge``, ``fold``: the shrinker),
  and the integers the shrinker may lower by bisection (``sizes``: token counts);
- how the state machine draws it (``draw``) and when it may (``enabled``);
- the cache cells it may write (``permit``: ``NO_STALE_WRITE`` and ``explain``);
- whether it runs a forward (``forward``: ``"real"`` / ``"dummy"``), which the
  invariant registry uses to decide what to check after it;
- which of its fields the *target* fills in (``records``: its KV-cache
  manager's choices — the session records them, or compares them on replay;
  ``apply`` then returns the choice).

:mod:`harness.core.trace` (schema, :func:`apply_op`), the state machine
(:mod:`harness.search.machine`), the shrinker, ``explain`` and ``blockfuzz
ops`` iterate :data:`REGISTRY`.  Adding an op is one new entry here (in its
family's module, imported at the bottom of this file) plus the op method in
each implementation: the reference runner, gpu_impl's runner, and the vllm
adapter where vLLM has the concept (docs/traces.md, "Adding an op").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

INT = {"type": "integer"}
BLOCK_IDS = {"type": "array", "items": {"type": "array", "items": INT}}
MODES = ["NONE", "PIECEWISE", "FULL"]
CUDAGRAPH_MODE = {"enum": MODES}
ALL_RUNNERS = ("v1", "v2")
ALL_TARGETS = ("reference", "gpu_impl", "vllm")  # the block-table targets (sglang: token-slot ops only)


def _no_requests(op: dict) -> list[int]:
    return []


def _mentions(spec: OpSpec, op: dict, req: int) -> bool:
    return req in spec.requests(op)


def _keep(op: dict, req: int) -> dict | None:
    return op


def _rename_nothing(op: dict, req, block) -> dict:
    return dict(op)


def _no_narrowing(op: dict) -> Iterable[dict]:
    return ()


def _no_sizes(op: dict) -> list:
    return []


class Size(NamedTuple):
    """One integer of an op the shrinker may lower (an op's ``sizes`` entry):
    ``key`` names it (stable while the op is resized), ``value`` is its value
    now, ``least`` the smallest legal-looking value, ``make(v)`` the op with
    it set to ``v`` (fields that depend on it adjusted, recorded choices
    dropped).  The shrinker bisects between ``least`` and ``value``, the
    reference's dry run deciding legality."""

    key: str
    value: int
    least: int
    make: Callable[[int], dict]


@dataclass(frozen=True)
class OpSpec:
    """One op of the trace vocabulary (see the module docstring for each field's role).

    apply(target, op): drive the target (raises ``reference.OpError`` on the
    reference when illegal).  draw(machine, data) -> op dict, or draw(machine)
    when ``draws_data`` is False; ``data`` is the machine's
    :class:`~harness.search.draws.ExampleDraws` (``integer``, ``choice``,
    ``boolean``, ``permutation``, ``unique_sample``; a test may pass a
    :class:`~harness.search.draws.Draws` on its ``st.data()``).  enabled(machine) -> bool.  without_request(op,
    req) -> the op with ``req`` removed, or None to drop it.  rename(op, req,
    block) -> a copy with request ids mapped by ``req(r)`` and block ids by
    ``block(group, b)``.  narrow(op) -> simpler variants.  merge(op, next_op)
    -> one op doing what two adjacent ops of this kind did, or None (the
    shrinker tries it; legality is checked by its dry run).  fold(op, req,
    into) -> the op with ``req``'s work moved onto request ``into`` (a step
    keeps its token count), or None when the op has nothing to fold: the
    shrinker drops ``req`` everywhere else.  permit(config,
    ledger, op) -> (cells, runs): cells[g] = {block: (first_offset, end_offset)
    | None (any cell)}, runs = requests the op writes for.  eager(machine) ->
    bool: the engine does this op whenever it can (a connector stores each
    newly computed full block): while it holds, the search draws the op
    :data:`harness.search.swarm.EAGER_FACTOR` times as often.  keeps_ledger:
    applying the op leaves the oracle's ledger as it was (its rows, caches
    and forward buffers may change), so what the state machine worked out
    from the ledger still holds after it (``BlockFuzzMachine.per_state``);
    reads_rows: the op's precondition reads the oracle's persistent-batch
    rows, not only the ledger, the config and the example's swarm (it is
    evaluated afresh after every op).
    """

    name: str
    summary: str
    fields: dict
    example: dict
    apply: Callable
    draw: Callable | None = None
    enabled: Callable = lambda machine: True
    draws_data: bool = True
    runners: tuple = ALL_RUNNERS
    targets: tuple = ALL_TARGETS
    requests: Callable = _no_requests
    without_request: Callable | None = None
    rename: Callable = _rename_nothing
    narrow: Callable = _no_narrowing
    sizes: Callable = _no_sizes
    merge: Callable | None = None
    fold: Callable | None = None
    permit: Callable | None = None
    forward: str | None = None  # "real" (a step), "dummy" (a dummy run), None
    records: tuple = ()  # fields the target chooses (apply returns them); optional in traces
    check: Callable | None = None  # check(reference, op): legality before the target chooses
    eager: Callable | None = None  # eager(machine): the engine would do it now (drawn more)
    optional: tuple = ()  # fields a trace may leave out (besides ``records``)
    keeps_ledger: bool = False  # applying it changes nothing in the ledger
    reads_rows: bool = False  # its precondition reads the oracle's rows
    family: str = "core"
    extra: dict = field(default_factory=dict)

    def schema(self) -> dict:
        """JSON Schema of one op object of this kind."""
        props = dict(self.fields, op={"const": self.name})
        return {"type": "object", "properties": props,
                "required": sorted(set(props) - set(self.records) - set(self.optional)),
                "additionalProperties": False}

    def drop_request(self, op: dict, req: int) -> dict | None:
        """``op`` without ``req``: None drops the op (default: when it mentions ``req``)."""
        if self.without_request is not None:
            return self.without_request(op, req)
        return None if req in self.requests(op) else op

    def to_json(self) -> dict:
        return {"op": self.name, "summary": self.summary, "family": self.family,
                "fields": {k: v for k, v in sorted(self.fields.items())},
                "runners": list(self.runners), "targets": list(self.targets),
                "forward": self.forward, "records": list(self.records),
                "example": self.example}


REGISTRY: dict[str, OpSpec] = {}


def register(spec: OpSpec) -> OpSpec:
    """Add ``spec`` to :data:`REGISTRY` (registration order is listing order)."""
    assert spec.name not in REGISTRY, f"op {spec.name} registered twice"
    REGISTRY[spec.name] = spec
    return spec


def spec_of(op: dict) -> OpSpec:
    """The spec of an op dict already shape-checked (KeyError otherwise)."""
    return REGISTRY[op["op"]]


def apply_op(target, op: dict):
    """Dispatch one op dict to a target (or a reference runner); returns what an op
    with ``records`` chose (a reference runner mirrors the op's recorded choice
    when it has one)."""
    return spec_of(op).apply(target, op)


def requests_of(op: dict) -> list[int]:
    """Request ids ``op`` mentions."""
    return spec_of(op).requests(op)


def describe() -> list[dict]:
    """The vocabulary for ``blockfuzz ops --json``."""
    return [spec.to_json() for spec in REGISTRY.values()]


# Families, in listing order (their import registers their ops).
from harness.core.ops import lifecycle, persistent_batch, transfer, forward, speculative, scheduler, inflight, preemption, token_slots  # noqa: E402,F401,I001
