"""The Hypothesis state machine that drives a :class:`Session` with legal ops.

Its rules come from the op registry (:mod:`harness.core.ops`): one rule per op,
named after it, drawing the op with the op's ``draw`` under the op's
``enabled`` precondition.  Rules are few and draw small arguments;
preconditions (never ``assume``) keep every op legal, so Hypothesis never
wastes an example.  Block ids are drawn
from the whole free pool, so freed blocks are handed to new requests; steps
schedule any subset of live requests (prefill chunks and decodes mixed, or
one token each so FULL graphs apply); ``kv_load`` and dummy runs in every
cudagraph mode are rules of their own.

Every op is recorded; a violation raises :class:`InvariantViolationError`
carrying the op list, which after Hypothesis's shrinking is the minimal trace.
"""

from __future__ import annotations

import json

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from reference import RunnerConfig

from harness.core.invariants import Violation
from harness.core.ops import REGISTRY as OPS
from harness.core.session import Session
from harness.search import profiles  # noqa: F401  (generation a function of the seed alone)
from harness.search.geometry import runner_configs, target_limits

class InvariantViolationError(AssertionError):
    """Raised inside the machine; ``violation`` and the recorded ``ops``."""

    def __init__(self, violation: Violation, ops: list[dict], config: RunnerConfig):
        listing = "\n".join(json.dumps(op, sort_keys=True) for op in ops)
        super().__init__(f"{violation.line()}\nconfig: "
                         f"{json.dumps(config.to_json(), sort_keys=True)}\n"
                         f"ops ({len(ops)}):\n{listing}")
        self.violation = violation
        self.ops = ops
        self.config = config


_ERROR_TYPES: dict[str, type] = {}


def _error_type(invariant: str) -> type:
    """One exception type per invariant, so Hypothesis shrinks each bug apart."""
    if invariant not in _ERROR_TYPES:
        _ERROR_TYPES[invariant] = type(f"{invariant}_Violation", (InvariantViolationError,), {})
    return _ERROR_TYPES[invariant]


class BlockFuzzMachine(RuleBasedStateMachine):
    """Subclassed per run by :func:`make_machine` with config / faults / target
    and one rule per registered op.

    ``config`` None: the geometry is drawn per example (``runner`` pins the
    runner); a config pins it.  ``stats``: ``examples`` (machines started),
    ``steps`` (ops applied).  What op draws may use: ``cfg``, ``session``,
    ``ledger``, ``free(g)``, ``next_req``.
    """

    config: RunnerConfig | None = RunnerConfig()
    runner: str | None = None
    faults: tuple = ()
    target: str = "gpu_impl"
    device: str | None = None
    stats: dict = {}

    def __init__(self):
        super().__init__()
        self.session: Session | None = None
        self.ops: list[dict] = []
        self.next_req = 0
        self.stats["examples"] = self.stats.get("examples", 0) + 1

    @initialize(data=st.data())
    def start(self, data):
        config = self.config or data.draw(
            runner_configs(self.runner, **target_limits(self.target)), label="config")
        self.cfg = config
        self.session = Session(config, self.faults, self.target, self.device)
        if self.session.startup_violations:
            v = self.session.startup_violations[0]
            raise _error_type(v.invariant)(v, [], config)

    def do(self, op: dict) -> None:
        """Record and apply ``op``; raise on its first violation."""
        self.ops.append(op)
        self.stats["steps"] = self.stats.get("steps", 0) + 1
        found = self.session.apply(op)
        if found:
            raise _error_type(found[0].invariant)(found[0], list(self.ops), self.cfg)

    @property
    def ledger(self):
        return self.session.ledger

    def free(self, g: int) -> list[int]:
        """Free block ids of group ``g`` (the whole pool: freed blocks get reused)."""
        return self.ledger.free_blocks(g)


def _rule_for(spec):
    """A Hypothesis rule applying ops drawn by ``spec`` (named after the op)."""
    if spec.draws_data:
        def body(self, data):
            self.do(spec.draw(self, data))
        decorated = rule(data=st.data())(body)
    else:
        def body(self):
            self.do(spec.draw(self))
        decorated = rule()(body)
    body.__name__ = body.__qualname__ = spec.name
    return precondition(lambda self: spec.enabled(self))(decorated)


def op_rules() -> dict:
    """{op name: rule} for every registered op that can be drawn."""
    return {spec.name: _rule_for(spec) for spec in OPS.values() if spec.draw is not None}


def make_machine(config: RunnerConfig | None, faults=(), target: str = "gpu_impl",
                 device: str | None = None, stats: dict | None = None,
                 runner: str | None = None, base: type = BlockFuzzMachine) -> type:
    """A fresh machine class bound to one run's parameters (and stats dict).

    config None draws the geometry per example; runner pins its runner; base:
    the class to bind (a subclass of :class:`BlockFuzzMachine` — e.g. the
    bench's, which records the generated ops in its ``teardown``).
    """
    return type("BlockFuzzMachine_run", (base,),
                {**op_rules(), "config": config, "runner": runner, "faults": tuple(faults),
                 "target": target, "device": device,
                 "stats": {} if stats is None else stats})
