"""The ``rollback`` op (harness/core/ops/speculative.py): rejected speculative tokens.

Added through the op registry as docs/traces.md, "Adding an op", describes: one
registry entry, the reference's ``rollback`` (ledger legality), gpu_impl's
``rollback_tokens`` and the target adapter's method.
"""

import json

import pytest

from gpu_impl.runner_shell import RunnerShell
from harness.core.session import replay
from harness.core.trace import Trace, TraceError, parse
from reference import GroupSpec, RunnerConfig

NO_MAMBA = RunnerConfig(groups=(GroupSpec("attention", 4, 4),))
OPS = [
    {"op": "add", "req": 0, "blocks": [[1, 2]], "prompt_len": 2},
    {"op": "step", "scheduled": [[0, 2]], "cudagraph_mode": "NONE"},
    {"op": "step", "scheduled": [[0, 3]], "cudagraph_mode": "PIECEWISE"},  # 1 + 2 drafts
    {"op": "rollback", "req": 0, "num_tokens": 2},  # both drafts rejected
    {"op": "step", "scheduled": [[0, 1]], "cudagraph_mode": "FULL"},  # overwrites position 3
]


def _trace(ops, config=NO_MAMBA) -> Trace:
    return parse(json.loads(Trace(config, ops).dumps()), "rollback.json")


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_rollback_holds_every_invariant_on_the_fixed_implementation(runner):
    config = RunnerConfig.from_json(dict(NO_MAMBA.to_json(), runner=runner))
    verdict = replay(_trace(OPS, config))
    assert verdict.violation is None and verdict.ops_run == len(OPS), verdict.violation


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_a_runner_that_forgets_the_rollback_is_caught(monkeypatch, runner):
    """gpu_impl ignoring the scheduler's lowered count (V1 copies it into the batch
    row at the next step, V2 keeps it in the request state) starts the next step
    at the wrong position: its slots and reads differ from the reference's."""
    monkeypatch.setattr(RunnerShell, "rollback_tokens", lambda self, req, num_tokens: None)
    config = RunnerConfig.from_json(dict(NO_MAMBA.to_json(), runner=runner))
    verdict = replay(_trace(OPS, config))
    assert verdict.violation is not None, runner
    assert verdict.violation.op_index in (3, 4), verdict.violation.line()


@pytest.mark.parametrize("bad, field", [
    ({"op": "rollback", "req": 0, "num_tokens": 3}, "num_tokens"),  # all of the step's tokens
    ({"op": "rollback", "req": 9, "num_tokens": 1}, "req"),
])
def test_illegal_rollback_is_one_line(bad, field):
    with pytest.raises(TraceError) as e:
        _trace(OPS[:3] + [bad])
    assert f"ops[3] (rollback).{field}" in str(e.value) and "\n" not in str(e.value)


def test_rollback_refused_with_a_mamba_group():
    hybrid = [dict(OPS[0], blocks=[[1, 2], [3]])] + OPS[1:4]
    with pytest.raises(TraceError, match="ops.3. .rollback..op: .*Mamba"):
        _trace(hybrid, RunnerConfig())
