"""Run the test suite beside CPU burners: a suite that passes only on an idle
machine is a flaky suite (CI runners are shared).

Starts ``--burners`` processes that spin on the CPU, runs the README's test
command (``pytest -n auto``, extra pytest arguments after ``--``), stops the
burners and prints one table: burners, wall seconds, pytest's exit status.
Exits with pytest's status.

Usage: python bench/busy_suite.py [--burners 2] [-- PYTEST_ARGS...]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent


def _burn(stop) -> None:
    """Spin until ``stop`` is set (a busy neighbour on a shared runner)."""
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x = (x * 1103515245 + 12345) & 0x7FFFFFFF


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--burners", type=int, default=2)
    args = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    stop = mp.Event()
    burners = [mp.Process(target=_burn, args=(stop,), daemon=True) for _ in range(args.burners)]
    for b in burners:
        b.start()
    start = time.perf_counter()
    try:
        rc = subprocess.call([sys.executable, "-m", "pytest", "-n", "auto", *extra], cwd=ROOT)
    finally:
        stop.set()
        for b in burners:
            b.join(timeout=5)
    wall_s = time.perf_counter() - start
    table = Table(title="pytest -n auto beside CPU burners")
    for col in ("burners", "wall s", "pytest exit"):
        table.add_column(col)
    table.add_row(str(args.burners), f"{wall_s:.0f}", str(rc))
    Console().print(table)
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
