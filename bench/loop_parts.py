"""Where a fuzz step's wall time goes, part by part, with no profiler.

cProfile charges every Python call, so the harness's many small calls look two
to three times as costly as they are next to gpu_impl's; this wraps only the
parts named below, each with a timer, and runs ``blockfuzz fuzz``'s loop
(``machine.run``, no shrinking) as it is.  Each part's time is its own:
a timed call inside another (the implementation's start-up inside a
session's) counts to the inner part only.  "rest" is the loop's time no part
claims: Hypothesis's work per example, the machine's own loop, and the
timers themselves (about a microsecond a timed call).  Nothing is compared
with a threshold; it says where to look (``bench/bench.py`` measures).

Usage:
  python bench/loop_parts.py [--runner v1|v2] [--examples N] [--seed S]
                             [--drawn] [--target gpu_impl|reference] [--top N]
"""

from __future__ import annotations

import functools
import os
import time
from collections import Counter

os.environ.setdefault("TRITON_INTERPRET", "1")

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from _args import loop_parser  # noqa: E402  (bench/ is sys.path[0] when run as a script)


class Clock:
    """Own wall time per label of the wrapped callables (a nested timed call's
    time goes to its own label, not its caller's)."""

    def __init__(self) -> None:
        self.own: Counter = Counter()
        self.calls: Counter = Counter()
        self._children: list[float] = []  # time of timed calls nested in each open one

    def wrap(self, fn, label):
        """``fn`` timed under ``label`` (a str, or fn(args) -> str)."""
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            start = time.perf_counter()
            self._children.append(0.0)
            try:
                return fn(*args, **kwargs)
            finally:
                spent = time.perf_counter() - start
                nested = self._children.pop()
                name = label if isinstance(label, str) else label(args)
                self.own[name] += spent - nested
                self.calls[name] += 1
                if self._children:
                    self._children[-1] += spent
        return timed

    def patch(self, owner, name: str, label) -> None:
        setattr(owner, name, self.wrap(getattr(owner, name), label))


def instrument(clock: Clock) -> None:
    """Wrap the loop's parts (module and class attributes: for this process)."""
    from harness import targets
    from harness.core import invariants, ops, session
    from harness.core.invariants import writes
    from harness.search import coverage, machine, steer, swarm

    gpu = targets.GpuImplTarget
    for name in [n for n in dir(gpu) if not n.startswith("_") and callable(getattr(gpu, n))]:
        clock.patch(gpu, name, "gpu_impl")
    clock.patch(gpu, "__init__", "gpu_impl")
    clock.patch(targets, "ReferenceTarget", "oracle: start-up")
    session.ReferenceTarget = targets.ReferenceTarget
    clock.patch(targets._ObserveReference, "observe", "oracle: observation")
    apply_op = session.apply_op
    oracle = clock.wrap(apply_op, "oracle: op")
    session.apply_op = lambda target, op: (oracle if isinstance(
        target, targets._ObserveReference) else apply_op)(target, op)
    for entry in invariants.REGISTRY.values():
        object.__setattr__(entry, "check", clock.wrap(entry.check, f"invariant {entry.id}"))
    for spec in ops.REGISTRY.values():
        if spec.draw is not None:
            object.__setattr__(spec, "enabled",
                               clock.wrap(spec.enabled, f"precondition {spec.name}"))
            object.__setattr__(spec, "draw", clock.wrap(spec.draw, "op draws"))
    clock.patch(writes, "permit_for", "write permit")
    session.inv.permit_for = writes.permit_for
    clock.patch(coverage.Tracker, "before", "coverage")
    clock.patch(coverage.Tracker, "after", "coverage")
    clock.patch(session.Session, "__init__", "session start (own)")
    clock.patch(machine.BlockFuzzMachine, "enabled_ops", "preconditions (own)")
    clock.patch(swarm, "pick", "swarm: pick")
    clock.patch(swarm, "draw_swarm", "swarm: draw")
    clock.patch(steer, "learn", "steering")
    clock.patch(steer, "learn_config", "steering")


def main() -> int:
    ap = loop_parser(__doc__, examples=60)
    ap.add_argument("--target", default="gpu_impl", choices=("gpu_impl", "reference"))
    ap.add_argument("--top", type=int, default=12, help="invariants and preconditions listed")
    args = ap.parse_args()

    from hypothesis import seed

    from harness.search import machine, profiles
    from reference import RunnerConfig

    config = None if args.drawn else RunnerConfig(runner=args.runner)

    def search(examples: int, s: int) -> tuple[int, float]:
        stats: dict = {}
        m = machine.make_machine(config, (), args.target, "cpu", stats, runner=args.runner)
        seed(s)(m)
        start = time.perf_counter()
        machine.run(m, profiles.search_settings("dev", examples))
        return stats["steps"], time.perf_counter() - start

    clock = Clock()
    instrument(clock)
    search(3, args.seed + 1)  # warm-up: the first examples interpret the kernels
    clock.own.clear()
    clock.calls.clear()
    steps, seconds = search(args.examples, args.seed)

    per_step = {k: v / steps * 1e3 for k, v in clock.own.items()}
    rest = seconds / steps * 1e3 - sum(per_step.values())
    table = Table(title=f"fuzz loop parts: {args.runner}, "
                        f"{'drawn geometry' if args.drawn else 'default config'}, "
                        f"target {args.target}, seed {args.seed}",
                  caption=f"{args.examples} examples, {steps} steps, "
                          f"{seconds / steps * 1e3:.3f} ms a step")
    for col in ("part", "ms a step", "share of the loop", "calls a step"):
        table.add_column(col, justify="left" if col == "part" else "right")
    kinds = ("invariant ", "precondition ")
    grouped, calls = Counter(), Counter()
    for k, v in per_step.items():
        name = next((p.strip() + "s (all)" for p in kinds if k.startswith(p)), k)
        grouped[name] += v
        calls[name] += clock.calls[k] / steps
    rows = sorted(grouped.items(), key=lambda kv: -kv[1]) + [("rest (Hypothesis, the machine's "
                                                              "loop, the timers)", rest)]
    for name, ms in rows:
        table.add_row(name, f"{ms:.3f}", f"{ms / (seconds / steps * 1e3):.1%}",
                      f"{calls[name]:.2f}" if calls[name] else "")
    step_ms = seconds / steps * 1e3
    outside = step_ms - per_step.get("gpu_impl", 0.0)
    table.add_section()  # a subtotal of the rows above, less gpu_impl
    table.add_row("of which outside gpu_impl", f"{outside:.3f}", f"{outside / step_ms:.1%}", "")
    console = Console()
    console.print(table)
    for prefix in kinds:
        top = sorted(((k[len(prefix):], v) for k, v in per_step.items() if k.startswith(prefix)),
                     key=lambda kv: -kv[1])[:args.top]
        console.print(f"{prefix.strip()}s, most costly: " + ", ".join(
            f"{name} {ms:.3f}" for name, ms in top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
