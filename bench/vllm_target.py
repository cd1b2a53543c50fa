"""Cost of a vllm-target step against a gpu_impl step, in one run.

On the same generated workloads (Hypothesis state machine, default hybrid
config per runner, ops recorded once), times per step:
  - the target alone (ops applied, construction and graph capture included),
  - the differential session (reference + target + observation + invariants),
for gpu_impl and for the installed vLLM in each mode that can run the config —
runner mode (vLLM's own model runner, V1 and V2) and the component adapter — and
prints the ratio.  vLLM's import (and runner mode's one-off set-up) happens
before any clock starts.  Target: a vllm session step within 3x a gpu_impl
session step.

Usage: python bench/vllm_target.py [--examples N] [--seed S]
Needs vLLM installed (scripts/install-vllm-target.sh RELEASE).
"""

from __future__ import annotations

import argparse
import os
import time

from rich.console import Console
from rich.table import Table

from _recording import recording_machine  # bench/ is on sys.path when run as a script


def _workload(config, examples: int, seed_: int) -> list[list[dict]]:
    from hypothesis import Phase, seed, settings
    from hypothesis.stateful import run_state_machine_as_test

    from harness.search import machine, profiles

    stats = {"traces": []}
    m = machine.make_machine(config, (), "reference", None, stats, base=recording_machine())
    seed(seed_)(m)
    run_state_machine_as_test(m, settings=settings(
        profiles.get("dev"), max_examples=examples, phases=[Phase.generate]))
    return [ops for ops in stats["traces"] if ops]


def _alone(target, config, workload) -> tuple[int, float]:
    from harness.targets import make_target
    from harness.core.trace import apply_op

    steps, start = 0, time.perf_counter()
    for ops in workload:
        t = make_target(target, config, (), "cpu")
        for op in ops:
            apply_op(t, op)
            steps += 1
    return steps, time.perf_counter() - start


def _session(target, config, workload, violating: dict) -> tuple[int, float]:
    """Ops with a violation (a pre-fix release has some) are counted in
    ``violating[target]``; the trace goes on."""
    from harness.core.session import Session

    steps, start = 0, time.perf_counter()
    for ops in workload:
        s = Session(config, (), target, "cpu")
        for op in ops:
            violating[target] = violating.get(target, 0) + bool(s.apply(op))
            steps += 1
    return steps, time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    from harness.targets import vllm as vllm_target

    t = time.perf_counter()
    vllm = vllm_target.load()  # import, environment and shims: not timed below
    load_s = time.perf_counter() - t
    from reference import RunnerConfig

    console = Console()
    table = Table(title=f"vllm target (vLLM {vllm.version}) vs gpu_impl, steps/s "
                        f"(import {load_s:.1f} s, not counted)")
    for col in ("runner", "measure", "steps", "gpu_impl", "vllm", "vllm time / gpu_impl time"):
        table.add_column(col, justify="right" if col not in ("runner", "measure") else "left")
    violating: dict = {}
    for runner in ("v1", "v2"):
        config = RunnerConfig(runner=runner)
        workload = _workload(config, args.examples, args.seed)
        for mode in ("runner", "adapter"):
            os.environ[vllm_target.MODE_ENV] = mode
            try:
                vllm_target.target_mode(config)
            except vllm_target.TargetRefused:
                continue  # runner mode refuses this config
            if mode == "runner":  # its one-off set-up (and first runner) before the clocks
                _alone("vllm", config, workload[:1])
            for name, fn in (("target alone", _alone),
                             ("session step", lambda *a: _session(*a, violating))):
                g_steps, g_s = fn("gpu_impl", config, workload)
                v_steps, v_s = fn("vllm", config, workload)
                assert g_steps == v_steps
                table.add_row(runner, f"{name} ({mode})", str(g_steps), f"{g_steps / g_s:.0f}",
                              f"{v_steps / v_s:.0f}", f"{v_s / g_s:.2f}x")
    os.environ.pop(vllm_target.MODE_ENV, None)
    console.print(table)
    print(f"ops with a violation in the session runs: {violating}")


if __name__ == "__main__":
    main()
