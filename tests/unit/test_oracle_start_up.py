"""harness/targets: an oracle copied from its config's start-up behaves as one
started afresh (``ReferenceTarget`` starts each config object once)."""

import dataclasses

import numpy as np
import pytest
from hypothesis import seed

from harness import targets
from harness.core.trace import apply_op
from harness.search import profiles
from harness.search.machine import BlockFuzzMachine, make_machine, run
from reference import GroupSpec, RunnerConfig


def _examples(runner: str, n: int, config=None) -> list:
    """(config, ops) of ``n`` examples of a search on the reference (``config``
    None: geometry drawn)."""
    out = []

    class Recording(BlockFuzzMachine):
        def teardown(self):
            if getattr(self, "session", None) is not None:
                out.append((self.cfg, list(self.ops)))
            super().teardown()

    machine = make_machine(config, target="reference", base=Recording, runner=runner)
    seed(5)(machine)
    run(machine, profiles.search_settings("dev", n))
    return out


def _equal(a, b) -> bool:
    """Equal content: arrays bit for bit (shape, dtype, NaN where NaN), containers
    and dataclasses field by field."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.shape == b.shape
                and a.dtype == b.dtype and a.tobytes() == b.tobytes())
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        return type(a) is type(b) and all(_equal(getattr(a, f.name), getattr(b, f.name))
                                          for f in dataclasses.fields(a))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_equal, a, b))
    return a == b


def _fresh(config):
    """An oracle started afresh, past the factory's kept start-ups."""
    return (targets._ReferenceV2Target if config.runner == "v2"
            else targets._ReferenceV1Target)(config)


def _shared(runner: str = "v1") -> RunnerConfig:
    """Shared pages: each Mamba state a view of an attention page."""
    return RunnerConfig(runner=runner, kv_sharing=True,
                        groups=(GroupSpec("attention", 4, 4), GroupSpec("mamba", 4, 4)))


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_copied_oracle_steps_as_a_fresh_one(runner):
    """Drawn geometries and shared pages: the same ops on an oracle the factory
    copied and on one started afresh leave the same observation after each."""
    examples = _examples(runner, 12) + _examples(runner, 3, _shared(runner))
    for config, ops in examples:
        targets.ReferenceTarget(config)
        targets.ReferenceTarget(config)  # the config's second start-up: kept
        copy, fresh = targets.ReferenceTarget(config), _fresh(config)
        assert copy.config is config and copy.ledger.config is config
        for op in ops:
            apply_op(copy, op)
            apply_op(fresh, op)
            assert _equal(copy.observe(), fresh.observe()), op


def test_an_oracle_holding_views_is_started_afresh_each_time():
    """Shared pages: a Mamba state is a view of an attention page, which a copy
    would tear apart; such a config's oracle is never copied."""
    shared, plain = _shared(), RunnerConfig()
    for config in (shared, plain):
        targets.ReferenceTarget(config)
        assert targets._STARTED[id(config)][1] is None  # met once: nothing kept
        targets.ReferenceTarget(config)
    assert targets._STARTED[id(shared)][1] is targets._VIEWS
    assert targets._holds_views(targets.ReferenceTarget(shared), set())
    assert isinstance(targets._STARTED[id(plain)][1], bytes)
