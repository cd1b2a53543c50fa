"""Kill rate: every fault in the catalogue is found from seed 0 within 200 examples,
named by the invariant the catalogue expects, and shrunk to at most one op more
than its hand-written trace in corpora/seeds/.

These are the harness's reason to exist: if one of them fails, the fuzzer has
lost the ability to see a bug it was built for.
"""

from pathlib import Path

import pytest

from gpu_impl.faults import CATALOGUE
from harness.fuzz import fuzz
from harness.session import replay
from harness.trace import load
from reference import RunnerConfig

SEEDS = Path(__file__).resolve().parents[2] / "corpora" / "seeds"
EXAMPLES = 200


def _hand_written(fault_id):
    lengths = [len(t.ops) for t in map(load, sorted(SEEDS.glob("*.json")))
               if t.faults == [fault_id]]
    assert lengths, f"no hand-written trace for {fault_id} in corpora/seeds"
    return min(lengths)


@pytest.mark.parametrize("fault_id", sorted(CATALOGUE))
def test_fault_killed_from_seed_0(fault_id):
    fault = CATALOGUE[fault_id]
    result = fuzz(RunnerConfig(), seed=0, examples=EXAMPLES, faults=[fault_id],
                  profile="ci", found_by="tests/quality")
    assert result.violation is not None, f"{fault_id} survived {EXAMPLES} examples"
    assert result.examples <= EXAMPLES
    assert result.violation.invariant == fault.invariant, result.violation.line()
    assert len(result.trace.ops) <= _hand_written(fault_id) + 1, result.trace.dumps()
    # The shrunk trace is a real reproducer: fails with the fault, passes without.
    assert replay(result.trace, [fault_id]).matches(result.trace.expect)
    assert replay(result.trace, []).violation is None


def test_fixed_implementation_survives_seed_0():
    result = fuzz(RunnerConfig(), seed=0, examples=60, profile="ci")
    assert result.violation is None, result.violation.line()
    assert result.steps > 60 * 5  # the machine really ran op sequences
