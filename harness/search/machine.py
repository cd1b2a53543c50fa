"""The Hypothesis state machine that drives a :class:`Session` with legal ops.

Rules are few and draw small arguments; preconditions (never ``assume``) keep
every op legal, so Hypothesis never wastes an example.  Block ids are drawn
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
from reference.payload import POSITION_MAX, REQ_ID_MAX

from harness.search.geometry import runner_configs, target_limits
from harness.core.invariants import Violation
from harness.core.session import Session

MODES = ("FULL", "PIECEWISE", "NONE")  # FULL first: shrinking prefers it


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
    """Subclassed per run by :func:`make_machine` with config / faults / target.

    ``config`` None: the geometry is drawn per example (``runner`` pins the
    runner); a config pins it.
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

    def teardown(self):
        if "traces" in self.stats:  # bench/ records the generated workloads
            self.stats["traces"].append(list(self.ops))

    # -- helpers -------------------------------------------------------------
    def _do(self, op: dict) -> None:
        self.ops.append(op)
        self.stats["steps"] = self.stats.get("steps", 0) + 1
        found = self.session.apply(op)
        if found:
            raise _error_type(found[0].invariant)(found[0], list(self.ops), self.cfg)

    @property
    def _ledger(self):
        return self.session.ledger

    def _free(self, g: int) -> list[int]:
        return self._ledger.free_blocks(g)

    def _room(self, req: int) -> int:
        r = self._ledger.requests[req]
        return min(r.capacity_tokens(self.cfg), POSITION_MAX + 1) - r.num_computed_tokens

    # -- rules -------------------------------------------------------------------
    def _can_add(self) -> bool:
        cfg = self.cfg
        return (len(self._ledger.requests) < cfg.max_num_reqs and self.next_req <= REQ_ID_MAX
                and all(self._free(g) for g in range(len(cfg.groups))))

    @precondition(_can_add)
    @rule(data=st.data())
    def add(self, data):
        cfg = self.cfg
        blocks = []
        for g, spec in enumerate(cfg.groups):
            free = self._free(g)
            size = 1 if spec.kind == "mamba" else None
            blocks.append(data.draw(st.lists(
                st.sampled_from(free), min_size=1,
                max_size=size or min(cfg.max_num_blocks_per_req, len(free)), unique=True)))
        capacity = min(len(blocks[g]) * cfg.groups[g].block_size for g in cfg.attention_groups)
        prompt_len = data.draw(st.integers(1, capacity))
        self._do({"op": "add", "req": self.next_req, "blocks": blocks, "prompt_len": prompt_len})
        self.next_req += 1

    def _steppable(self) -> list[int]:
        return [r for r in self._ledger.live() if self._room(r) > 0]

    @precondition(lambda self: bool(self._steppable()))
    @rule(data=st.data())
    def step(self, data):
        cands = self._steppable()
        reqs = data.draw(st.lists(st.sampled_from(cands), min_size=1,
                                  max_size=min(len(cands), self.cfg.max_num_batched_tokens),
                                  unique=True))
        budget = self.cfg.max_num_batched_tokens - len(reqs)
        decode_only = data.draw(st.booleans())  # one token each: FULL graphs apply
        scheduled = []
        for req in reqs:
            n = 1 if decode_only else data.draw(
                st.integers(1, 1 + min(self._room(req) - 1, budget)))
            budget -= n - 1
            scheduled.append([req, n])
        mode = data.draw(st.sampled_from(MODES))
        self._do({"op": "step", "scheduled": scheduled, "cudagraph_mode": mode})

    @precondition(lambda self: bool(self._ledger.requests))
    @rule(data=st.data())
    def remove(self, data):
        req = data.draw(st.sampled_from(self._ledger.live()))
        self._do({"op": "remove", "req": req})

    @precondition(lambda self: self.cfg.runner == "v1")
    @rule()
    def condense(self):
        self._do({"op": "condense"})

    @rule(data=st.data())
    def dummy_run(self, data):
        cfg = self.cfg
        num_reqs = data.draw(st.integers(1, cfg.max_num_reqs))
        uniform = data.draw(st.booleans())  # num_tokens == num_reqs: FULL applies
        num_tokens = num_reqs if uniform else data.draw(
            st.integers(num_reqs, cfg.max_num_batched_tokens))
        mode = data.draw(st.sampled_from(MODES))
        self._do({"op": "dummy_run", "num_reqs": num_reqs, "num_tokens": num_tokens,
                  "cudagraph_mode": mode})

    def _loadable(self) -> list[int]:
        return [r for r, s in sorted(self._ledger.requests.items())
                if not (s.stepped or s.loaded or s.num_computed_tokens)]

    @precondition(lambda self: bool(self._loadable()))
    @rule(data=st.data())
    def kv_load(self, data):
        self._do({"op": "kv_load", "req": data.draw(st.sampled_from(self._loadable()))})

    def _appendable(self) -> list[int]:
        cfg = self.cfg
        if not all(self._free(g) for g in cfg.attention_groups):
            return []
        return [r for r, s in sorted(self._ledger.requests.items())
                if all(len(s.blocks[g]) < cfg.max_num_blocks_per_req
                       for g in cfg.attention_groups)]

    @precondition(lambda self: bool(self._appendable()))
    @rule(data=st.data())
    def append(self, data):
        req = data.draw(st.sampled_from(self._appendable()))
        blocks = [[] for _ in self.cfg.groups]
        for g in self.cfg.attention_groups:
            blocks[g] = [data.draw(st.sampled_from(self._free(g)))]
        self._do({"op": "append", "req": req, "blocks": blocks})

    def _occupied_rows(self) -> list[int]:
        return [int(i) for i, r in enumerate(self.session.reference.rows.req_ids) if r != -1]

    @precondition(lambda self: self.cfg.runner == "v1" and len(self._occupied_rows()) >= 2)
    @rule(data=st.data())
    def swap(self, data):
        rows = self._occupied_rows()
        i, j = data.draw(st.lists(st.sampled_from(rows), min_size=2, max_size=2, unique=True))
        self._do({"op": "swap", "i": i, "j": j})


def make_machine(config: RunnerConfig | None, faults=(), target: str = "gpu_impl",
                 device: str | None = None, stats: dict | None = None,
                 runner: str | None = None) -> type:
    """A fresh machine class bound to one run's parameters (and stats dict).

    config None draws the geometry per example; runner pins its runner.
    """
    return type("BlockFuzzMachine_run", (BlockFuzzMachine,),
                {"config": config, "runner": runner, "faults": tuple(faults),
                 "target": target, "device": device,
                 "stats": {} if stats is None else stats})
