"""The Hypothesis state machine that drives a :class:`Session` with legal ops.

Its ops come from the op registry (:mod:`harness.core.ops`): one rule, ``act``,
picks an op whose ``enabled`` precondition holds, weighted by the example's
:class:`~harness.search.swarm.Swarm` (drawn first, with the geometry: swarm
testing), and applies what the op's ``draw`` drew from the example's seeded
generator (:class:`~harness.search.draws.ExampleDraws`; :func:`run` puts an
example's ops in one Hypothesis step).  Draws are small;
preconditions (never ``assume``) keep every op legal, so Hypothesis never
wastes an example.  Block ids are drawn from the whole free pool, so freed
blocks are handed to new requests; steps schedule any subset of live requests
(prefill chunks and decodes mixed, or one token each so FULL graphs apply);
``kv_load`` and dummy runs in every cudagraph mode are ops of their own.

Every op is recorded, and its behaviour-coverage features
(:mod:`harness.search.coverage`) counted in ``stats``; a violation raises
:class:`InvariantViolationError` carrying the op list, which the trace
shrinker then minimises.
"""

from __future__ import annotations

import contextlib
import gc
import json

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

from reference import RunnerConfig

from harness.core.invariants import Violation
from harness.core.ops import REGISTRY as OPS
from harness.core.ops import requests_of, spec_of
from harness.core.session import Session
from harness.search import profiles  # noqa: F401  (generation a function of the seed alone)
from harness.search import steer
from harness.search import swarm as swarm_mod
from harness.search.draws import Draws, ExampleDraws, example_seed
from harness.search.coverage import tracker_for
from harness.search.geometry import configs_for

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
    """Subclassed per run by :func:`make_machine` with config / faults / target;
    its one rule, ``act``, draws any registered op.

    ``config`` None: the geometry is drawn per example (``runner`` pins the
    runner); a config pins it.  ``swarm`` False keeps the uniform op mix.
    ``stats``: ``examples`` (machines started), ``steps`` (ops applied),
    ``coverage`` (feature -> ops that hit it), ``coverage_examples`` (feature ->
    examples that hit it).  What op draws may use: ``cfg``, ``session``,
    ``ledger``, ``free(g)``, ``free_count(g)``, ``next_req``, ``swarm``.
    """

    config: RunnerConfig | None = RunnerConfig()
    runner: str | None = None
    faults: tuple = ()
    target: str = "gpu_impl"
    device: str | None = None
    stats: dict = {}
    use_swarm: bool = True
    use_steer: bool = True  # start some examples from the run's rarest prefixes (steer.py)
    seed_corpus: tuple = ()  # traces an example may start from (harness.search.corpus)
    ops_per_step: int = 1  # ops per Hypothesis step (rule call); run() sets an example's worth
    salt: int = 0  # mixed into every example's op-draw seed (fuzz: the run's chunk seed)

    def __init__(self):
        super().__init__()
        self.session: Session | None = None
        self.ledger = None  # the session's ledger (set in start)
        self.ops: list[dict] = []
        self.next_req = 0
        self.start_key = None  # what the example started from (a steering key, "corpus")
        self.draws: ExampleDraws | None = None  # the example's op draws (set in start)
        self._state_memo: tuple = (-1, {})  # (ledger version, {name: value}): per_state
        self._ledger_version = 0  # ops applied that may have changed the ledger
        self.stats["examples"] = self.stats.get("examples", 0) + 1

    @initialize(data=st.data())
    def start(self, data):
        hyp = Draws(data)  # the example's start: Hypothesis choices, one each
        prefix = None
        if self.seed_corpus and hyp.boolean():
            prefix = hyp.choice(self.seed_corpus)
        rare, configs, front = ((self.stats.get("steer_pool", []),
                                 self.stats.get("steer_configs_pool", []),
                                 self.stats.get("steer_frontier_pool", []))
                                if self.use_steer and prefix is None else ([], [], []))
        if rare or configs or front:
            pick = hyp.integer(0, 7)
            if rare and pick < steer.SHARE_EIGHTHS:
                prefix = hyp.choice(rare)
            elif configs and 0 <= pick - steer.SHARE_EIGHTHS < steer.CONFIG_EIGHTHS:
                prefix = hyp.choice(configs)
            elif front and 0 <= pick - steer.SHARE_EIGHTHS - steer.CONFIG_EIGHTHS \
                    < steer.FRONTIER_EIGHTHS:
                prefix = hyp.choice(front)
        config = prefix.config if prefix is not None else self.config or hyp.draw(
            configs_for(self.target, self.runner), label="config")
        self.cfg = config
        ops = engine_ops(config)  # the config's kind of ops: block-table or token-slot
        self.swarm = (swarm_mod.draw_swarm(hyp, list(ops)) if self.use_swarm
                      else swarm_mod.DEFAULT)
        if prefix is not None and (prefix.meta or {}).get("swarm") is not None:
            # A frontier prefix goes on under the op mix that reached it: the
            # mix of ops that got to the broader feature is the likeliest to
            # get past it (the drawn swarm is drawn all the same, so the
            # choices after it are where they were).
            self.swarm = prefix.meta["swarm"]
        self.draws = ExampleDraws(example_seed(data, self.salt))  # every op draw after this
        self.session = Session(config, self.faults, self.target, self.device, record=True)
        # The ops this example may draw, in registry order (registered by now; the
        # target's one-line refusals out), and those its swarm weighs above 0.
        refused = getattr(self.session.target, "refused_ops", ())
        self._drawable = [spec for spec in ops.values() if spec.name not in refused]
        self._weighted = [spec for spec in self._drawable if self.swarm.weight(spec.name) > 0]
        self.ledger = self.session.ledger  # the reference's: one object for the session
        self.coverage = tracker_for(config)
        if self.session.startup_violations:
            v = self.session.startup_violations[0]
            raise _error_type(v.invariant)(v, [], config)
        self.prefix_len = len(prefix.ops) if prefix is not None else 0
        if prefix is not None:
            self.start_key = (prefix.meta or {}).get("steer_key", "corpus")
        if prefix is not None:  # its ops first, recorded like drawn ones
            for op in prefix.ops:
                self.do(op)
                self.next_req = max([self.next_req, *(r + 1 for r in requests_of(op))])

    def do(self, op: dict) -> None:
        """Record and apply ``op``; raise on its first violation."""
        self.ops.append(op)
        self.stats["steps"] = self.stats.get("steps", 0) + 1
        reference = self.session.reference
        self.coverage.before(op, self.ledger, reference)
        found = self.session.apply(op)
        if not spec_of(op).keeps_ledger:
            self._ledger_version += 1
        counts = self.stats.setdefault("coverage", {})
        for f in self.coverage.after(op, reference):
            counts[f] = counts.get(f, 0) + 1
        if found:
            raise _error_type(found[0].invariant)(found[0], list(self.ops), self.cfg)

    def free(self, g: int) -> list[int]:
        """Free block ids of group ``g`` (the whole pool: freed blocks get reused);
        once per state (the list is shared: do not mutate it)."""
        return self.per_state(("free", g), lambda: self.ledger.free_blocks(g))

    def free_count(self, g: int) -> int:
        """``len(free(g))``, once per state, without listing the blocks (what a
        precondition needs)."""
        return self.per_state(("free count", g), lambda: self.ledger.free_block_count(g))

    def per_state(self, name: str, compute):
        """``compute()``, once per ledger state: a value worked out from the
        oracle's ledger (with the config, the example's swarm and the next
        request id, which only ledger-changing ops move) that an op's
        precondition and its draw both need (the steppable requests, the
        enabled ops) is kept under ``name`` until an op that may change the
        ledger is applied (one not ``OpSpec.keeps_ledger``: a dummy run, a
        condense or a swap keeps it).  The value is shared: do not mutate it."""
        key = self._ledger_version
        if self._state_memo[0] != key:
            self._state_memo = (key, {})
        memo = self._state_memo[1]
        if name not in memo:
            memo[name] = compute()
        return memo[name]

    def enabled_ops(self, weighted: bool = False) -> list:
        """Drawable ops whose precondition holds now, in registry order: those
        that read only the ledger once per ledger state, those that read the
        oracle's rows (``OpSpec.reads_rows``) every time.  weighted: only those
        the example's swarm weighs above 0 (their preconditions alone are
        evaluated)."""
        kept = self.per_state(("enabled ops", weighted), lambda: [
            spec for spec in (self._weighted if weighted else self._drawable)
            if spec.reads_rows or spec.enabled(self)])
        return [spec for spec in kept if not spec.reads_rows or spec.enabled(self)]

    @rule()
    def act(self):
        """``ops_per_step`` ops (:func:`run` puts a whole example in one step)."""
        # No Hypothesis precondition: ``dummy_run`` is enabled in every state
        # (an idle rank can always run one), so some op always is.
        for _ in range(self.ops_per_step):
            # An op the swarm weighs 0 is picked only when no weighted one is
            # enabled (swarm.pick), so the others' preconditions are evaluated
            # only then: the same pick, without their cost.
            spec = swarm_mod.pick(self.enabled_ops(weighted=True) or self.enabled_ops(),
                                  self.swarm, self.draws, self)
            self.do(spec.draw(self, self.draws) if spec.draws_data else spec.draw(self))

    def teardown(self):
        """Count the features this example hit, and keep, per feature, the
        shortest op prefix that first hit it (``stats["prefixes"]``: feature ->
        (config, ops); a nightly campaign's seed corpus comes from them)."""
        per_example = self.stats.setdefault("coverage_examples", {})
        prefixes = self.stats.setdefault("prefixes", {})
        if getattr(self, "coverage", None) is not None:
            for f, i in self.coverage.first.items():
                per_example[f] = per_example.get(f, 0) + 1
                if f not in prefixes or len(prefixes[f][1]) > i + 1:
                    prefixes[f] = (self.cfg, list(self.ops[:i + 1]))
            steer.learn(self.stats, self.cfg, self.ops, self.coverage.first,
                        getattr(self, "swarm", None))
            steer.learn_config(self.stats, self.cfg)
        super().teardown()


def run(machine: type, settings) -> None:
    """Run ``machine`` (a :func:`make_machine` class) as
    ``run_state_machine_as_test(machine, settings=settings)`` would, with each
    example's ``settings.stateful_step_count - 1`` drawn ops (Hypothesis counts
    the ``start`` rule as a step) in a single Hypothesis step.

    The ops are the same either way: they are drawn from the example's own
    generator (:class:`~harness.search.draws.ExampleDraws`), whichever rule
    call asks.  One step instead of ~50 saves Hypothesis's work per step (a
    span, a stop choice, a rule draw; docs/benchmarks.md).  Raises what the
    machine raises (:class:`InvariantViolationError` on a violation)."""
    from hypothesis import settings as settings_cls
    from hypothesis.stateful import run_state_machine_as_test

    whole = type(machine.__name__, (machine,),
                 {"ops_per_step": max(settings.stateful_step_count - 1, 0)})
    with settled_heap():
        run_state_machine_as_test(whole, settings=settings_cls(settings, stateful_step_count=2))


# Young objects the collector lets pile up during a search before a generation-0
# pass (CPython's default is 700).
GEN0_THRESHOLD = 5000


@contextlib.contextmanager
def settled_heap():
    """Within the block, the objects that exist when it starts (the imported
    modules of torch, Triton, NumPy and Hypothesis: about 200,000) are left out
    of the cyclic garbage collector's passes (``gc.freeze``), and a
    generation-0 pass waits for :data:`GEN0_THRESHOLD` new objects; both are
    restored on exit, when those objects are collected as before.  Where the
    program had already frozen objects (``gc.get_freeze_count()``), nothing
    is frozen or unfrozen: an exit must not thaw what it did not freeze.

    A search allocates steadily, and every full pass walked that whole heap
    (about 0.1 s each on the 2-core machine): about 0.03 ms a step of a V1
    search's 2.2; young passes took 0.015 ms a step, 0.010 with this
    (docs/benchmarks.md).  Nothing a search draws or checks depends on it."""
    threshold, freeze = gc.get_threshold(), gc.get_freeze_count() == 0
    if freeze:
        gc.freeze()
    gc.set_threshold(max(threshold[0], GEN0_THRESHOLD), *threshold[1:])
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        if freeze:
            gc.unfreeze()


def drawable() -> dict:
    """{op name: OpSpec} of every registered op the machine can draw (read per
    call; a machine reads it when an example starts: an op registered before,
    e.g. by a test, is drawn in it)."""
    return {name: spec for name, spec in OPS.items() if spec.draw is not None}


def engine_ops(config) -> dict:
    """:func:`drawable` ops of ``config``'s kind: token-slot ops for a token-slot
    config (runner ``sglang``), block-table ops otherwise (in registry order)."""
    token_slots = config.runner == "sglang"
    return {name: spec for name, spec in drawable().items()
            if ("sglang" in spec.runners) == token_slots}


def make_machine(config: RunnerConfig | None, faults=(), target: str = "gpu_impl",
                 device: str | None = None, stats: dict | None = None,
                 runner: str | None = None, base: type = BlockFuzzMachine,
                 swarm: bool = True, seed_corpus=(), steering: bool = True,
                 salt: int = 0) -> type:
    """A fresh machine class bound to one run's parameters (and stats dict).

    config None draws the geometry per example; runner pins its runner; base:
    the class to bind (a subclass of :class:`BlockFuzzMachine` — e.g. the
    bench's, which records the generated ops in its ``teardown``); swarm:
    False draws every example from the uniform op mix; seed_corpus: traces
    (already filtered by :func:`harness.search.corpus.usable`) an example may
    start from; steering: False never starts an example from the run's own rarest
    prefixes (:mod:`harness.search.steer`); salt: an int mixed into every
    example's op-draw seed (:func:`~harness.search.draws.example_seed`: a
    search passes its seed, so the first example of a run, which Hypothesis
    draws all-simplest, draws other ops in every run).
    """
    return type("BlockFuzzMachine_run", (base,),
                {"config": config, "use_swarm": swarm, "use_steer": steering,
                 "seed_corpus": tuple(seed_corpus), "salt": salt,
                 "runner": runner, "faults": tuple(faults),
                 "target": target, "device": device,
                 "stats": {} if stats is None else stats})
