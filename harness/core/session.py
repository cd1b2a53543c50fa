"""A differential session: every op goes to the reference and the target under
test, then every registered invariant is checked (:mod:`harness.core.invariants`);
and :func:`replay` of a whole trace.

The reference validates each op first (an illegal op raises ``OpError`` and
changes nothing anywhere), so the target only ever sees legal ops.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from reference import OpError, RunnerConfig

from harness.core import interrupt
from harness.core import invariants as inv
from harness.core.invariants import scheduler as sched_inv
from harness.core.ops import apply_op, spec_of
from harness.core.ops.scheduler import recorded, without_recorded
from harness.core.trace import Trace
from harness.targets import ReferenceTarget, make_target
from harness.targets.registry import TargetRefused, TargetUnavailable


@dataclass
class Verdict:
    """Outcome of a replay: ``violation`` is None when every op passed."""

    violation: inv.Violation | None
    ops_run: int
    ops: list = field(default_factory=list)  # the ops as replayed (choices recorded)
    diverged: list = field(default_factory=list)  # where the target chose unlike the trace

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

    target: a registered target name (:mod:`harness.targets`); faults: ids for
    gpu_impl; device: ``auto``/``cpu``/``cuda``; skip: invariant ids not
    checked (at start-up too), to see what else catches a bug's consequence.
    ``startup_violations``: what graph capture broke (op_index -1).
    ``last``: (before, after, permit) of the last op, None after a crash (the
    implementation's state was not observed) — ``explain`` reads it.
    Ops whose target chooses (``OpSpec.records``: the KV-cache manager's
    blocks) get the target's choice written into the op dict; where the op
    had recorded another one, ``diverged`` gets a line (unless ``record``: a
    search or shrink, whose candidates' records are stale anyway).  A
    different choice is the manager's policy, not a violation: the scheduler
    invariants judge the choice made.
    """

    def __init__(self, config: RunnerConfig, faults=(), target: str = "gpu_impl",
                 device: str | None = None, skip=(), record: bool = False):
        self.config = config
        self.record = record
        self.diverged: list[str] = []
        self.skip = frozenset(skip)
        self.reference = ReferenceTarget(config)
        self.target = make_target(target, config, tuple(faults), device)
        self.op_index = 0
        self.steps = 0
        self.last = None
        self._before = self.target.observe()
        # Start-up (graph capture through dummy runs) must already hold the invariants.
        self.startup_violations = inv.check(inv.CheckContext(
            config, self.ledger, self._before, self.reference.observe(copy=False)), self.skip)

    @property
    def ledger(self):
        return self.reference.ledger

    def apply(self, op: dict) -> list[inv.Violation]:
        """Apply one op; returns its violations in the invariant registry's order.

        Raises ``OpError`` (nothing applied) when the op is illegal.
        """
        interrupt.check()  # a Ctrl-C swallowed by a GC callback stops here
        if spec_of(op).records:
            return self._apply_chosen(op)
        i, kind = self.op_index, op["op"]
        block_tables = self.config.runner != "sglang"  # token slots: no block permits
        try:
            permit = inv.permit_for(self.config, self.ledger, op) if block_tables else None
        except (KeyError, TypeError, ValueError, IndexError):
            permit = None  # an illegal op: the reference raises OpError next
        apply_op(self.reference, op)  # validates; raises OpError before any change
        assert permit is not None or not block_tables, op
        self.op_index += 1
        self.steps += 1
        try:
            apply_op(self.target, op)
        except (TargetRefused, TargetUnavailable):
            raise  # the target cannot run this: blockfuzz's own failure, never a finding
        except Exception as e:  # a legal op must not crash the implementation
            self.last = None
            return [inv.Violation(inv.IMPL_CRASH, i, kind, f"{type(e).__name__}: {e}")]
        after = self.target.observe()
        before, self._before = self._before, after
        self.last = (before, after, permit)
        ctx = inv.CheckContext(self.config, self.ledger, after,
                               self.reference.observe(copy=False),  # read by these checks only
                               i, op, before, permit)
        return inv.check(ctx, self.skip)


    def _apply_chosen(self, op: dict) -> list[inv.Violation]:
        """An op whose target chooses (``admit`` / ``allocate``): the reference
        checks the op's own fields, the target chooses, the choice is recorded
        (or compared with the recorded one), checked for shape, mirrored by the
        reference, then every invariant runs — the scheduler ones judge it."""
        interrupt.check()
        i, kind, spec = self.op_index, op["op"], spec_of(op)
        spec.check(self.reference, op)  # OpError: nothing applied anywhere
        was = recorded(op, spec)
        self.op_index += 1
        self.steps += 1
        try:
            chosen = apply_op(self.target, without_recorded(op))
        except (TargetRefused, TargetUnavailable):
            raise  # the target cannot run this: blockfuzz's own failure, never a finding
        except Exception as e:  # a legal op must not crash the implementation
            self.last = None
            return [inv.Violation(inv.IMPL_CRASH, i, kind, f"{type(e).__name__}: {e}")]
        chosen = {f: chosen.get(f) for f in spec.records}
        if was is not None and was != chosen and not self.record:
            self.diverged.append(f"ops[{i}] ({kind}): the target chose {chosen}; the trace "
                                 f"recorded {was}")
        op.update(copy.deepcopy(chosen))
        facts = sched_inv.facts_before(self.config, self.ledger, op, was)
        problem = sched_inv.malformed(self.config, self.ledger, op)
        if problem:
            self.last = None
            return [inv.Violation(problem[0], i, kind, problem[1])]
        permit = inv.permit_for(self.config, self.ledger, op)
        apply_op(self.reference, op)
        after = self.target.observe()
        before, self._before = self._before, after
        self.last = (before, after, permit)
        ctx = inv.CheckContext(self.config, self.ledger, after,
                               self.reference.observe(copy=False), i, op, before, permit, facts)
        return inv.check(ctx, self.skip)


class IllegalOp(ValueError):
    """A replayed trace holds an op the reference refuses (``ops[i] (op): why``)."""


def replay(trace: Trace, faults=None, target: str = "gpu_impl",
           device: str | None = None, skip=(), record: bool = False,
           cache: "SnapshotCache | None" = None) -> Verdict:
    """Replay ``trace`` (faults default to none) and stop at the first violation.

    skip: invariant ids to ignore (start-up included), e.g. to show which
    invariant would catch a bug's consequence if its structural invariant were
    not checked.  A start-up violation is reported with op_index -1, 0 ops run.
    The target's KV-cache manager choices are recorded into a copy of the ops
    (``Verdict.ops``), and later ops that name a request's blocks follow
    them (:func:`_follow_choices`); where they differ from the trace's,
    ``Verdict.diverged`` says so (record: not even that — a search or a shrink, whose candidates'
    records are stale).  cache: a :class:`SnapshotCache` of this call's
    faults / target / device / skip (record only): the replay resumes from the
    session after the longest op prefix an earlier replay ran, and leaves its
    own prefixes there.  Raises :class:`IllegalOp` for an op the reference
    refuses.
    """
    ops = copy.deepcopy(trace.ops)
    session, start = None, 0
    if cache is not None:
        assert record, "a snapshot holds recorded choices: record=True only"
        keys = cache.keys(trace.config, ops)
        start, session, prefix = cache.resume(keys)
        ops[:start] = prefix
    if session is None:
        session = Session(trace.config, faults or (), target, device, skip, record)
        if session.startup_violations:
            return Verdict(session.startup_violations[0], 0, ops)
        if cache is not None:
            cache.keep(keys[0], session, [])
    moved: dict = {}  # group -> {recorded block: block the target chose}
    for i in range(start):  # a resumed prefix: what its choices moved
        _note_choice(moved, trace.ops[i], ops[i])
    for i in range(start, len(ops)):
        op = ops[i] = _follow_choices(ops[i], moved)
        try:
            found = session.apply(op)  # an admit / allocate: the choice written into op
        except OpError as e:  # parse() dry-runs traces, so only hand-built ones get here
            raise IllegalOp(f"ops[{session.op_index}] ({op['op']}): {e}") from None
        _note_choice(moved, trace.ops[i], op)
        if found:
            return Verdict(found[0], session.op_index, ops, session.diverged)
        if cache is not None and i + 1 < len(ops):  # the last op's state resumes nothing
            cache.keep(keys[i + 1], session, ops[:i + 1])
    return Verdict(None, session.op_index, ops, session.diverged)


def _note_choice(moved: dict, given: dict, chosen: dict) -> None:
    """Record in ``moved`` ({group: {recorded block: block chosen}}) what the
    target chose for an ``admit`` / ``allocate`` (``chosen``) against what the
    trace's op (``given``) recorded, column by column (the latest choice of a
    recorded id wins)."""
    if not spec_of(given).records:
        return
    was = recorded(given, spec_of(given))
    if was is None or not was.get("blocks") or not chosen.get("blocks"):
        return
    for g, (old, new) in enumerate(zip(was["blocks"], chosen["blocks"])):
        moved.setdefault(g, {}).update(zip(old, new))


def _follow_choices(op: dict, moved: dict) -> dict:
    """Where the target's KV-cache manager chose other blocks than the trace
    recorded (its policy differs, or a search or shrink candidate's records
    went stale), a later op naming blocks (a load, onboard or offload) names
    the block the target chose where the trace recorded the one it names —
    hit blocks shared with the request that got them included.  A different
    prefix hit is not followed: the ops' token counts stay as written."""
    if spec_of(op).records or "blocks" not in op or "req" not in op or not moved:
        return op
    return dict(op, blocks=[[moved.get(g, {}).get(b, b) for b in ids]
                            for g, ids in enumerate(op["blocks"])])


class SnapshotCache:
    """Sessions copied after op prefixes, so a replay that shares a prefix with
    an earlier one resumes where that prefix ended (the trace shrinker's
    candidates share long prefixes: a chunk or op dropped near the end keeps
    every op before it).

    One cache serves one (faults, target, device, skip) and ``record=True``
    replays.  A prefix is keyed by the config and its ops without their
    recorded choices (a recording replay makes the choices again); the
    session is stored as a ``copy.deepcopy`` and copied again to resume, so
    no replay changes a snapshot.  ``limit``: snapshots kept (least recently
    used dropped first).  Only for targets whose
    :class:`~harness.targets.registry.TargetSpec` says a copied session goes on
    as the original (``snapshots``); :meth:`for_target` returns None for the
    others.  ``hits`` / ``ops_saved`` count what it spared.
    """

    def __init__(self, limit: int = 256):
        from collections import OrderedDict

        self.limit = limit
        self._snaps: OrderedDict = OrderedDict()
        self.hits = 0
        self.ops_saved = 0

    @classmethod
    def for_target(cls, target: str, device: str | None, limit: int = 256):
        """A cache when ``target`` on ``device`` can be snapshotted, else None."""
        from harness.targets import target_spec

        spec = target_spec(target)
        return cls(limit) if spec.snapshots(spec.select_device(device)) else None

    @staticmethod
    def keys(config: RunnerConfig, ops: list[dict]) -> list[str]:
        """keys[k]: the digest of the config and ``ops[:k]`` (k = 0 .. len(ops))."""
        import hashlib
        import json

        h = hashlib.sha256(json.dumps(config.to_json(), sort_keys=True).encode())
        out = [h.hexdigest()]
        for op in ops:
            h.update(json.dumps(without_recorded(op), sort_keys=True).encode())
            out.append(h.hexdigest())
        return out

    def resume(self, keys: list[str]):
        """(k, a copy of the session after the longest cached prefix, its ops as
        recorded), or (0, None, []) when none is cached."""
        for k in range(len(keys) - 2, -1, -1):  # never the whole trace: its last op decides
            snap = self._snaps.get(keys[k])
            if snap is not None:
                self._snaps.move_to_end(keys[k])
                self.hits += 1
                self.ops_saved += k
                session, ops = copy.deepcopy(snap)
                return k, session, ops
        return 0, None, []

    def keep(self, key: str, session: "Session", ops: list[dict]) -> None:
        """Store a copy of ``session`` after ``ops`` under ``key`` (once)."""
        if key in self._snaps:
            self._snaps.move_to_end(key)
            return
        last, session.last = session.last, None  # explain's view of the last op: not needed
        try:
            self._snaps[key] = copy.deepcopy((session, ops))
        finally:
            session.last = last
        if len(self._snaps) > self.limit:
            self._snaps.popitem(last=False)
