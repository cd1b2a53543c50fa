"""harness/tools/explain.py and the session around it: what a report shows must be
what the invariants judged."""

from harness.core.session import Session, replay
from harness.core.trace import load
from harness.targets import GpuImplTarget
from harness.tools.explain import explain
from harness.core.invariants import structural_ids
from tests.conftest import CORPORA

SEED000 = CORPORA / "seeds" / "seed000-stale-row-mamba-into-loading-request.json"


def test_offending_writes_are_exactly_what_no_stale_write_flags():
    """explain's ``!!`` marks and NO_STALE_WRITE come from one classifier: with the
    structural check skipped, the op NO_STALE_WRITE names is the op explain marks."""
    trace = load(SEED000)
    seen = replay(trace, trace.faults, skip=set(structural_ids()) | {"MATCHES_REFERENCE"})
    assert seen.violation.invariant == "NO_STALE_WRITE"
    records = explain(trace, trace.faults, stop_at_first=False)
    marked = [(r["op_index"], w["group"], w["block"]) for r in records for w in r["writes"]
              if w["offending"]]
    v = seen.violation
    assert (v.op_index, v.group, v.block) in marked
    assert all(i >= v.op_index for i, _, _ in marked)  # nothing offending before it


def test_explain_all_shows_a_crashed_op_as_not_observed(monkeypatch):
    """After an IMPL_CRASH, the crashed op's record says its state was not observed
    (it must not repeat the previous op's rows and writes)."""
    trace = load(SEED000)
    step_index = next(i for i, op in enumerate(trace.ops) if op["op"] == "step")

    def crash(self, scheduled, mode):
        raise RuntimeError("injected by the test")
    monkeypatch.setattr(GpuImplTarget, "step", crash)
    records = explain(trace, (), stop_at_first=False)
    crashed = records[step_index]
    assert crashed["violations"][0]["invariant"] == "IMPL_CRASH"
    assert crashed["rows"] is None and crashed["writes"] is None
    assert records[step_index - 1]["rows"] is not None


def test_replay_skip_applies_at_startup(monkeypatch):
    """A start-up violation is reported at op_index -1, and an invariant in
    ``skip`` is not checked at start-up either."""
    from harness.core import invariants as inv

    trace = load(CORPORA / "seeds" / "vacated-row-not-cleared.json")
    assert Session(trace.config, ()).startup_violations == []
    real = inv.REGISTRY["GRAPH_ADDRESSES_STABLE"]
    monkeypatch.setitem(inv.REGISTRY, real.id, type(real)(
        real.id, real.meaning, lambda c: [inv.Violation(real.id, c.op_index, c.kind, "injected")],
        at_startup=True))
    verdict = replay(trace, ())
    assert verdict.violation.op_index == -1 and verdict.violation.op == "start"
    assert "start-up" in verdict.violation.line()
    assert replay(trace, (), skip={real.id}).violation is None


def test_explain_shows_align_mode_state_copies():
    """Align mode: the reference's running-state copy (hit column -> new column)
    is in the record, beside the write the target made."""
    from pathlib import Path

    from harness.core.trace import load
    from harness.tools.explain import explain

    seeds = Path(__file__).resolve().parents[2] / "corpora" / "seeds"
    trace = load(seeds / "mamba-align-seed-attention-block-size.json")
    records = explain(trace, faults=["mamba-align-seed-attention-block-size"], device="cpu")
    last = records[-1]
    assert last["violations"][0]["invariant"] == "MATCHES_REFERENCE"
    assert last["copies"] == [{"req": 1, "group": 1, "from_column": 1, "from_block": 1,
                               "to_column": 2, "to_block": 2, "kind": "restored"}]


def test_text_table_never_folds_across_a_json_key_and_names_the_drafter_layer():
    """The op column holds one field a line (a narrow column folds inside a value,
    not across a key), and a write of the drafter's layer says so."""
    import io

    from rich.console import Console

    from harness.tools.explain import _op_text, render

    op = {"op": "step", "scheduled": [[0, 1], [1, 2]], "cudagraph_mode": "FULL"}
    lines = _op_text(op, wrap=True).splitlines()
    assert lines[0] == "step" and all(line.lstrip(" {").startswith('"') for line in lines[1:])
    trace = load(CORPORA / "seeds" / "draft-slots-tail-stale.json")
    records = explain(trace, trace.faults, stop_at_first=False)
    draft = [w for r in records for w in (r["writes"] or []) if w["layer"] == "draft"]
    assert draft, "no write of the drafter's layer in a trace with a drafter"
    out = io.StringIO()
    render(records, "text", console=Console(file=out, width=100, force_terminal=True))
    assert "drafter layer: " in out.getvalue()
