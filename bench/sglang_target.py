"""Cost of an sglang-target step against a gpu_impl step, in one run.

The two engines have different op vocabularies (token slots and block tables),
so each runs the workload the fuzz machine draws for it — seed and examples
the same, the sglang target's token-slot configs drawn per example, gpu_impl's
default hybrid config per runner — recorded once, then timed per step:
  - the target alone (ops applied; construction included),
  - the differential session (reference + target + observation + invariants).
SGLang's import and process-wide config publication happen before any clock
starts.  Target: an sglang session step within 3x a gpu_impl session step.

Usage: python bench/sglang_target.py [--examples N] [--seed S]
Needs SGLang installed (scripts/install-sglang-target.sh RELEASE).
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TRITON_INTERPRET", "1")

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from _recording import recording_machine  # noqa: E402  (bench/ is on sys.path as a script)


def _workload(config, target: str, examples: int, seed_: int) -> list[tuple]:
    """[(config, ops)] the fuzz machine draws for ``target`` (config None: drawn)."""
    from hypothesis import Phase, seed, settings
    from hypothesis.stateful import run_state_machine_as_test

    from harness.search import machine, profiles

    stats = {"traces": []}
    base = recording_machine()

    class WithConfig(base):
        def teardown(self):
            stats.setdefault("configs", []).append(self.cfg)
            super().teardown()

    m = machine.make_machine(config, (), target, None, stats, base=WithConfig)
    seed(seed_)(m)
    run_state_machine_as_test(m, settings=settings(
        profiles.get("dev"), max_examples=examples, phases=[Phase.generate]))
    return [(c, ops) for c, ops in zip(stats["configs"], stats["traces"]) if ops]


def _alone(target: str, workload) -> tuple[int, float]:
    from harness.core.trace import apply_op
    from harness.targets import make_target

    steps, start = 0, time.perf_counter()
    for config, ops in workload:
        t = make_target(target, config, (), "cpu")
        for op in ops:
            apply_op(t, op)
            steps += 1
    return steps, time.perf_counter() - start


def _session(target: str, workload) -> tuple[int, float]:
    from harness.core.session import Session

    steps, start = 0, time.perf_counter()
    for config, ops in workload:
        s = Session(config, (), target, "cpu")
        for op in ops:
            found = s.apply(op)
            assert not found, found[0].line()  # no fault on: every op passes
            steps += 1
    return steps, time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    from harness.targets import sglang as sglang_target
    from harness.targets.sglang_release import load
    from reference import RunnerConfig

    t = time.perf_counter()
    version = load().version
    sglang_target._publish()  # process-wide config: once, not timed
    load_s = time.perf_counter() - t
    sgl = _workload(None, "sglang", args.examples, args.seed)
    _alone("sglang", sgl[:1])  # first-use costs (Triton launchers, caches) before the clocks
    table = Table(title=f"sglang target (SGLang {version}) vs gpu_impl: ms per step "
                        f"(import {load_s:.1f} s, not counted; seed {args.seed}, "
                        f"{args.examples} examples each)")
    for col in ("measure", "sglang steps", "sglang ms/step", "gpu_impl runner",
                "gpu_impl steps", "gpu_impl ms/step", "sglang / gpu_impl"):
        table.add_column(col, justify="left" if col == "measure" else "right")
    for name, fn in (("target alone", _alone), ("session step", _session)):
        s_steps, s_s = fn("sglang", sgl)
        for runner in ("v1", "v2"):
            g = _workload(RunnerConfig(runner=runner), "gpu_impl", args.examples, args.seed)
            _alone("gpu_impl", g[:1])
            g_steps, g_s = fn("gpu_impl", g)
            s_ms, g_ms = 1e3 * s_s / s_steps, 1e3 * g_s / g_steps
            table.add_row(name, str(s_steps), f"{s_ms:.2f}", runner, str(g_steps),
                          f"{g_ms:.2f}", f"{s_ms / g_ms:.2f}x")
    Console(width=150).print(table)


if __name__ == "__main__":
    main()
