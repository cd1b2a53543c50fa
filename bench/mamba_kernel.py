"""Milliseconds per launch of gpu_impl's Mamba state-update kernel, per shape.

The interpreter's cost is per Triton operation, so a kernel's cost depends on
how many operations its shape unrolls into: state columns (``1 +
num_speculative_tokens``) and conv-state entries (``conv_size``).  Times one
launch of :func:`gpu_impl.mamba.mamba_state_update` over 4 rows for each
(columns, conv) shape, after a warm-up launch, and prints a table with each
shape's cost against the plain shape (1 column, no conv state) of the same run.
Run it from two checkouts (``PYTHONPATH=<worktree> python bench/mamba_kernel.py``)
to compare kernels; seconds depend on load, the ratios less.

Usage: python bench/mamba_kernel.py [--reps N]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("TRITON_INTERPRET", "1")

SHAPES = ((1, 0), (1, 3), (3, 0), (3, 3), (4, 1))  # (state columns, conv entries)


def _ms_per_launch(ncol: int, conv: int, reps: int) -> float:
    import torch

    from gpu_impl.mamba import mamba_state_update

    rows, head = 4, 4
    num_blocks = 1 + rows * max(ncol for ncol, _ in SHAPES)  # every column's block in the pool
    hidden = torch.arange(16 * head, dtype=torch.float32).reshape(16, head)
    qsl = torch.tensor([0, 1, 4, 7, 9], dtype=torch.int32)
    idx = torch.arange(1, 1 + rows * ncol, dtype=torch.int32)
    idx = idx.reshape(rows, ncol) if ncol > 1 else idx
    init = torch.ones(rows, dtype=torch.int32)
    state = torch.zeros(num_blocks, (conv + 1) * head)
    accepted = torch.ones(rows, dtype=torch.int32)
    spec = torch.ones(rows, dtype=torch.int32) if ncol > 1 else None
    args = (hidden, qsl, idx, init, state, rows, accepted, spec)
    mamba_state_update(*args, conv_size=conv)  # warm-up
    start = time.perf_counter()
    for _ in range(reps):
        mamba_state_update(*args, conv_size=conv)
    return (time.perf_counter() - start) / reps * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    from rich.console import Console
    from rich.table import Table

    times = {shape: _ms_per_launch(*shape, args.reps) for shape in SHAPES}
    table = Table(title="Mamba state-update kernel, ms per launch (4 rows)")
    for col in ("state columns", "conv entries", "ms per launch", "vs 1 column, no conv"):
        table.add_column(col)
    for (ncol, conv), ms in times.items():
        table.add_row(str(ncol), str(conv), f"{ms:.1f}", f"{ms / times[(1, 0)]:.2f}x")
    Console().print(table)


if __name__ == "__main__":
    main()
