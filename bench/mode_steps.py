"""Steps/s of one decode workload per cudagraph_mode (NONE / PIECEWISE / FULL), on
the current device, and the FULL/eager step-time ratio. Prints a table.

Usage: python bench/mode_steps.py [--steps N] [--device auto|cpu|cuda]
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--device", default="auto")
    args = ap.parse_args()
    from gpu_impl.device import select_device

    device = select_device(args.device)
    from rich.console import Console
    from rich.table import Table

    from gpu_impl import FaultSet, GPUModelRunnerV1
    from reference import GroupSpec, RunnerConfig

    # 3 decoding requests with 16 blocks of 16 tokens each: room for 250 steps.
    config = RunnerConfig(groups=(GroupSpec("attention", 16, 16), GroupSpec("mamba", 16, 16)),
                          num_blocks=64, max_num_blocks_per_req=16)
    rates = {}
    for mode in ("NONE", "PIECEWISE", "FULL"):
        runner = GPUModelRunnerV1(config, FaultSet(), device)
        for req in range(3):
            runner.add_request(req, [list(range(1 + 16 * req, 17 + 16 * req)), [1 + req]], 1)
        sched = [[req, 1] for req in range(3)]
        runner.execute_model(sched, mode)  # warm-up (compile on CUDA)
        steps = min(args.steps, 250)
        if device.type == "cuda":
            import torch
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(steps - 1):
            runner.execute_model(sched, mode)
        if device.type == "cuda":
            import torch
            torch.cuda.synchronize()
        rates[mode] = (steps - 1) / (time.perf_counter() - start)
    table = Table(title=f"decode steps/s per cudagraph_mode (device {device.type})")
    for col in ("mode", "steps/s", "step time vs NONE"):
        table.add_column(col)
    for mode, rate in rates.items():
        table.add_row(mode, f"{rate:.0f}", f"{rates['NONE'] / rate:.2f}x")
    Console(width=100).print(table)


if __name__ == "__main__":
    main()
