"""Invariants as a registry: one :class:`Invariant` entry each, checked in the
order they are registered.

Ids and meaning are stable (docs/model.md, "Invariants"; ``blockfuzz invariants``).  Every check is a pure
function of one :class:`CheckContext` — the target's observation before and
after the op, the reference's observation, the ownership ledger, the op's
write permit and the op — and returns :class:`Violation` records naming the
invariant, the op index and where (group, block, row).  ``NO_STALE_WRITE``
diffs the caches against the permit; it never asks a kernel what it wrote.

The session (:mod:`harness.core.session`), start-up, ``explain``, the CLI's
structural/consequence split and ``blockfuzz invariants`` iterate
:data:`REGISTRY`; adding an invariant is one :func:`register` call in the
module that fits it (imported at the bottom of this file, in check order).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from reference import Ledger, RunnerConfig

from harness.core.observation import Observation

# Not an invariant: the implementation raised while applying a legal op.
IMPL_CRASH = "IMPL_CRASH"
START = "start"  # the op name of violations found at start-up (graph capture); op_index -1
START_OP_INDEX = -1


@dataclass(frozen=True)
class Violation:
    """One broken invariant. group/block/row are None where they do not apply;
    op_index is -1 (op ``start``) for a violation found at start-up."""

    invariant: str
    op_index: int
    op: str
    detail: str
    group: int | None = None
    block: int | None = None
    row: int | None = None

    def line(self) -> str:
        where = ", ".join(f"{k} {v}" for k, v in (("group", self.group), ("block", self.block),
                                                   ("row", self.row)) if v is not None)
        at = "start-up" if self.op_index == START_OP_INDEX else f"op {self.op_index}"
        return (f"{self.invariant} at {at} ({self.op})"
                + (f" [{where}]" if where else "") + f": {self.detail}")

    def to_json(self) -> dict:
        return {"invariant": self.invariant, "op_index": self.op_index, "op": self.op,
                "detail": self.detail, "group": self.group, "block": self.block, "row": self.row}


@dataclass(frozen=True)
class CheckContext:
    """Everything a check may read about one op (or start-up).

    before: the target's observation before the op (None at start-up); after:
    after it; reference: the oracle's observation after it; ledger: ownership
    after the op; permit: the cells the op may write (a
    :class:`~harness.core.invariants.writes.WritePermit`, None at start-up);
    op: the op dict (None at start-up); op_index: -1 at start-up.
    """

    config: RunnerConfig
    ledger: Ledger
    after: Observation
    reference: Observation
    op_index: int = START_OP_INDEX
    op: dict | None = None
    before: Observation | None = None
    permit: object | None = None
    choice: object | None = None  # an op whose target chooses: scheduler.ChoiceFacts

    @property
    def kind(self) -> str:
        """The op's name, or ``start``."""
        return START if self.op is None else self.op["op"]

    def violation(self, invariant: str, detail: str, **where) -> Violation:
        return Violation(invariant, self.op_index, self.kind, detail, **where)


def _every_op(spec) -> bool:
    return True


@dataclass(frozen=True)
class Invariant:
    """One invariant: ``check(ctx)`` -> violations.

    structural: judges a buffer's layout (stale ids in a row), not a kernel's
    effect — the CLI then replays without it to show the consequence.
    applies(op_spec) -> bool: after which ops it runs (an
    :class:`~harness.core.ops.OpSpec`); at_startup: also after graph capture.
    """

    id: str
    meaning: str
    check: Callable[[CheckContext], list[Violation]]
    structural: bool = False
    applies: Callable = _every_op
    applies_text: str = "every op"
    at_startup: bool = False
    runners: tuple = ("v1", "v2")  # the configs' runners it judges (token slots: "sglang")

    def to_json(self) -> dict:
        from harness.core.ops import REGISTRY as OPS

        after = [name for name, spec in OPS.items()
                 if self.applies(spec) and set(self.runners) & set(spec.runners)]
        return {"id": self.id, "meaning": self.meaning, "structural": self.structural,
                "runners": list(self.runners),
                "after": ([START] if self.at_startup else []) + after}


REGISTRY: dict[str, Invariant] = {}


def register(entry: Invariant) -> Invariant:
    """Add ``entry``; registration order is check order."""
    assert entry.id not in REGISTRY and entry.id != IMPL_CRASH, entry.id
    REGISTRY[entry.id] = entry
    return entry


def ids() -> tuple[str, ...]:
    """Invariant ids in check order."""
    return tuple(REGISTRY)


def structural_ids() -> tuple[str, ...]:
    return tuple(i for i, e in REGISTRY.items() if e.structural)


# (op name or None, skip) -> (the registry's entries then, the op's spec, the applicable ones)
_APPLICABLE: dict = {}


def _applicable(spec, skip, runner: str) -> tuple:
    """The entries that judge an op of ``spec`` (None: start-up) on a config of
    ``runner``, in check order, less ``skip``; worked out once per (op, skip,
    runner) while the registry holds the same entries (a test may patch one in)."""
    entries = tuple(REGISTRY.values())
    key = (None if spec is None else spec.name, skip, runner)
    hit = _APPLICABLE.get(key)
    if hit is None or hit[1] is not spec or hit[0] != entries:
        hit = _APPLICABLE[key] = (entries, spec, tuple(
            e for e in entries if e.id not in skip and runner in e.runners
            and (e.at_startup if spec is None else e.applies(spec))))
    return hit[2]


def check(ctx: CheckContext, skip=frozenset()) -> list[Violation]:
    """Every applicable invariant not in ``skip``, in order; their violations."""
    spec = None if ctx.op is None else _OPS[ctx.op["op"]]
    found = []
    for entry in _applicable(spec, frozenset(skip), ctx.config.runner):
        found += entry.check(ctx)
    return found


def describe() -> list[dict]:
    """The registry for ``blockfuzz invariants --json``."""
    return [e.to_json() for e in REGISTRY.values()]


from harness.core.ops import REGISTRY as _OPS  # noqa: E402  (the op registry, read per check)

# Check order = import order, then registration order within each module.
from harness.core.invariants import structural, transfers, caches, reads, differential, scheduler, token_slots  # noqa: E402,F401,I001
from harness.core.invariants.caches import (  # noqa: E402
    check_loaded_blocks, check_no_stale_write, check_null_block_finite)
from harness.core.invariants.differential import check_matches_reference  # noqa: E402
from harness.core.invariants.reads import check_reads, oracle_read  # noqa: E402
from harness.core.invariants.structural import (  # noqa: E402
    check_dummy_tables_zero, check_graph_addresses, check_vacated_rows_zero)
from harness.core.invariants.writes import (  # noqa: E402
    WritePermit, classify_writes, owner_text, permit_for)


__all__ = ["IMPL_CRASH", "REGISTRY", "START", "CheckContext", "Invariant", "Violation",
           "WritePermit", "check", "check_dummy_tables_zero", "check_graph_addresses",
           "check_loaded_blocks", "check_matches_reference", "check_no_stale_write",
           "check_null_block_finite", "check_reads", "check_vacated_rows_zero",
           "classify_writes", "describe", "ids", "oracle_read", "owner_text", "permit_for",
           "register", "structural_ids"]
