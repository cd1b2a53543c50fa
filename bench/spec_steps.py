"""Steps/s of a decode workload without and with speculative decoding (k draft
tokens per decode, the drafter after every forward), on the reference and on
gpu_impl, in one run; prints a table with the ratios.

Usage: python bench/spec_steps.py [--steps N] [--k K] [--device auto|cpu|cuda]
"""

from __future__ import annotations

import argparse
import time


def _rate(make, k: int, steps: int, mode: str) -> float:
    """Steps/s of ``steps`` decode steps of 3 requests (after one warm-up step)."""
    target = make()
    for req in range(3):
        target.add(req, [list(range(1 + 16 * req, 17 + 16 * req)),
                         list(range(1 + (k + 1) * req, 1 + (k + 1) * (req + 1)))], 1)
    n = 1 + k  # every draft accepted: each request advances 1 + k tokens a step
    target.step([[req, 1] for req in range(3)], mode)  # the prompts (and a warm-up)
    start = time.perf_counter()
    for _ in range(steps):
        target.step([[req, n] for req in range(3)], mode)
    return steps / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--k", type=int, default=2)
    ap.add_argument("--device", default="auto")
    args = ap.parse_args()
    from rich.console import Console
    from rich.table import Table

    from harness.targets import GpuImplTarget, ReferenceTarget
    from reference import GroupSpec, RunnerConfig

    # 16 blocks of 16 tokens per request: room for 255 positions, so steps * (1 + k) < 255.
    steps = min(args.steps, 250 // (1 + args.k))
    rows = []
    for runner in ("v1", "v2"):
        for k in (0, args.k):
            config = RunnerConfig(runner=runner, num_blocks=64, max_num_blocks_per_req=16,
                                  max_num_batched_tokens=16, num_speculative_tokens=k,
                                  groups=(GroupSpec("attention", 16, 16),
                                          GroupSpec("mamba", 16, 16)))
            for name, make in (("reference", lambda c=config: ReferenceTarget(c)),
                               ("gpu_impl", lambda c=config: GpuImplTarget(c, (), args.device))):
                mode = "PIECEWISE"
                rows.append((runner, name, k, _rate(make, k, steps, mode)))
    table = Table(title=f"decode steps/s, 3 requests, {steps} steps (PIECEWISE), "
                        f"k = 0 vs k = {args.k}")
    for col in ("runner", "target", "k", "steps/s", "tokens/s", "step time vs k = 0"):
        table.add_column(col)
    base = {(r, n): rate for r, n, k, rate in rows if k == 0}
    for runner, name, k, rate in rows:
        table.add_row(runner, name, str(k), f"{rate:.0f}", f"{rate * 3 * (1 + k):.0f}",
                      f"{base[(runner, name)] / rate:.2f}x")
    Console(width=110).print(table)


if __name__ == "__main__":
    main()
