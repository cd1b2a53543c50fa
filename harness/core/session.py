"""A differential session: every op goes to the reference and the target under
test, then every invariant is checked; and :func:`replay` of a whole trace.

The reference validates each op first (an illegal op raises ``OpError`` and
changes nothing anywhere), so the target only ever sees legal ops.
"""

from __future__ import annotations

from dataclasses import dataclass

from reference import OpError, RunnerConfig

from harness.core import invariants as inv
from harness.targets import ReferenceTarget, make_target
from harness.core.trace import Trace, apply_op


@dataclass
class Verdict:
    """Outcome of a replay: ``violation`` is None when every op passed."""

    violation: inv.Violation | None
    ops_run: int

    @property
    def verdict(self) -> str:
        return "pass" if self.violation is None else "fail"

    def matches(self, expect: dict) -> bool:
        """Does this verdict equal a trace's ``expect`` (invariant/op_index if given)?"""
        if expect.get("verdict", "pass") != self.verdict:
            return False
        if self.violation is None:
            return True
        for key in ("invariant", "op_index"):
            if expect.get(key) is not None and expect[key] != getattr(self.violation, key):
                return False
        return True


class Session:
    """Drives ``reference`` and a target side by side.

    target: ``gpu_impl`` (default) or ``reference`` (self-check); faults: ids
    for gpu_impl; device: ``auto``/``cpu``/``cuda``.
    """

    def __init__(self, config: RunnerConfig, faults=(), target: str = "gpu_impl",
                 device: str | None = None, skip=()):
        self.config = config
        self.skip = frozenset(skip)  # invariant ids not reported (to see what else catches)
        self.reference = ReferenceTarget(config)
        self.target = make_target(target, config, tuple(faults), device)
        self.op_index = 0
        self.steps = 0
        self._before = self.target.observe()
        # Start-up (graph capture through dummy runs) must already hold the invariants.
        self.startup_violations = (
            inv.check_null_block_finite(self._before, -1, "start")
            + inv.check_graph_addresses(self._before, -1, "start")
            + inv.check_matches_reference(self._before, self.reference.observe(), -1, "start"))

    @property
    def ledger(self):
        return self.reference.ledger

    def apply(self, op: dict) -> list[inv.Violation]:
        """Apply one op; returns its violations in :data:`invariants.ORDER` order.

        Raises ``OpError`` (nothing applied) when the op is illegal.
        """
        i, kind = self.op_index, op["op"]
        try:
            permit = inv.permit_for(self.config, self.ledger, op)
        except (KeyError, TypeError, ValueError):
            permit = None  # an illegal op: the reference raises OpError next
        apply_op(self.reference, op)  # validates; raises OpError before any change
        assert permit is not None, op
        self.op_index += 1
        self.steps += 1
        try:
            apply_op(self.target, op)
        except Exception as e:  # a legal op must not crash the implementation
            return [inv.Violation(inv.IMPL_CRASH, i, kind, f"{type(e).__name__}: {e}")]
        after = self.target.observe()
        before, self._before = self._before, after
        self.last = (before, after, permit)  # for explain: what this op changed
        found = inv.check_vacated_rows_zero(after, i, kind)
        found += inv.check_dummy_tables_zero(after, i, kind) if kind == "dummy_run" else []
        found += inv.check_graph_addresses(after, i, kind)
        found += inv.check_null_block_finite(after, i, kind)
        found += inv.check_no_stale_write(before, after, permit, i, kind)
        found += inv.check_loaded_blocks(self.config, self.ledger, after, i, kind)
        batch_reqs = ([req for req, _ in op["scheduled"]]
                      if kind == "step" and self.config.runner == "v2" else None)
        found += inv.check_reads(self.config, self.ledger, after, i, kind, batch_reqs)
        found += inv.check_matches_reference(after, self.reference.observe(), i, kind)
        return [v for v in found if v.invariant not in self.skip]


def replay(trace: Trace, faults=None, target: str = "gpu_impl",
           device: str | None = None, skip=()) -> Verdict:
    """Replay ``trace`` (faults default to none) and stop at the first violation.

    skip: invariant ids to ignore, e.g. to show which invariant would catch a
    bug's consequence if its structural invariant were not checked.
    """
    session = Session(trace.config, faults or (), target, device, skip)
    if session.startup_violations:
        return Verdict(session.startup_violations[0], 0)
    for op in trace.ops:
        try:
            found = session.apply(op)
        except OpError as e:  # parse() dry-runs traces, so only hand-built ones get here
            raise ValueError(f"ops[{session.op_index}] ({op['op']}): {e}") from None
        if found:
            return Verdict(found[0], session.op_index)
    return Verdict(None, session.op_index)
