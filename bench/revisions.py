"""Throughput of two (or more) revisions on one recorded workload, in one run.

``bench/bench.py`` regenerates its workload from the fuzz machine, so when the
op rules or Hypothesis settings change between revisions its rows are not
comparable.  This bench records the workload once (with the working tree's
machine: ``--examples`` examples per runner, default hybrid config), then
replays the same ops through each revision's session (reference + gpu_impl +
invariants) and gpu_impl target alone, in a subprocess per revision checked
out as a temporary git worktree, alternating revisions for ``--rounds`` rounds
so machine load hits them alike.  Prints steps/s per round and the ratio of
each revision's median to the first revision's.

``--fail-below R``: exit status 1 when any row of a later revision runs
below R times the first revision's median (the whole fuzz loop's guard is
``bench/search_throughput.py``, which takes the same option).

Usage: python bench/revisions.py [--examples 30] [--rounds 2] [--fail-below R] REV [REV ...]
       (e.g. ``fa527dd HEAD``; ``WORKTREE`` means the working tree as it is)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("session", "gpu_impl alone")

# Run inside each revision (its own import paths: before and after the harness layout).
TIMER = r'''
import json, sys, time
from reference import RunnerConfig
import os, harness
# Decide by the tree, not by trying: an editable install would resolve a missing
# harness.core from another checkout.
if os.path.isdir(os.path.join(os.path.dirname(harness.__file__), "core")):
    from harness.core.session import Session
    from harness.core.ops import apply_op
else:  # revisions before the harness/core layout
    from harness.session import Session
    from harness.trace import apply_op
from harness.targets import GpuImplTarget
work = json.load(open(sys.argv[1]))
out = {}
for runner, traces in sorted(work.items()):
    cfg = RunnerConfig(runner=runner)
    for layer in ("session", "gpu_impl alone"):
        steps, start = 0, time.perf_counter()
        for ops in traces:
            s = Session(cfg, (), "gpu_impl", "cpu") if layer == "session" else \
                GpuImplTarget(cfg, (), "cpu")
            for op in ops:
                s.apply(op) if layer == "session" else apply_op(s, op)
                steps += 1
        out[f"{runner} {layer}"] = steps / (time.perf_counter() - start)
print(json.dumps(out))
'''


def record(examples: int, path: Path) -> None:
    """The workload: ops of ``examples`` fuzz examples per runner (reference target)."""
    from hypothesis import Phase, seed, settings
    from hypothesis.stateful import run_state_machine_as_test

    from _recording import recording_machine  # bench/ is on sys.path as a script
    from harness.search import machine, profiles
    from reference import RunnerConfig

    work = {}
    for runner in ("v1", "v2"):
        stats = {"traces": []}
        m = machine.make_machine(RunnerConfig(runner=runner), (), "reference", None, stats,
                                 base=recording_machine())
        seed(0)(m)
        run_state_machine_as_test(m, settings=settings(
            profiles.get("dev"), max_examples=examples, phases=[Phase.generate]))
        work[runner] = [ops for ops in stats["traces"] if ops]
    path.write_text(json.dumps(work))


def checkout(rev: str, tmp: Path) -> Path:
    """A detached worktree of ``rev`` under ``tmp`` (the working tree for WORKTREE)."""
    if rev == "WORKTREE":
        return ROOT
    where = tmp / rev.replace("/", "_")
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(where),
                    rev], check=True)
    return where


def run_in(tree: Path, script: str, *args: str, what: str = "the script") -> dict:
    """Run ``script`` (``python -c``) with ``tree`` first on the path, on the CPU;
    its last stdout line, parsed as JSON.  SystemExit with its stderr tail
    when it fails."""
    env = dict(os.environ, PYTHONPATH=str(tree), BLOCKFUZZ_DEVICE="cpu")
    proc = subprocess.run([sys.executable, "-c", script, *args], cwd=tree, env=env,
                          capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{tree}: {what} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def time_revision(tree: Path, workload: Path) -> dict:
    return run_in(tree, TIMER, str(workload), what="the timer")


def report_slow(rates: dict, revs: list, fail_below: float | None) -> int:
    """The guard's exit status: 1 (and a line naming them) when a later
    revision's median on some row is below ``fail_below`` x the first's.
    rates: {rev: [{row: steps/s} per round]}."""
    if fail_below is None:
        return 0
    first, slow = revs[0], []
    for key in rates[first][0]:
        base = statistics.median(r[key] for r in rates[first])
        for rev in revs[1:]:
            ratio = statistics.median(r[key] for r in rates[rev]) / base
            if ratio < fail_below:
                slow.append(f"{rev}: {key} {ratio:.2f}x")
    if slow:
        Console(stderr=True).print(f"below {fail_below:g}x {first}: " + "; ".join(slow))
        return 1
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("revs", nargs="+", metavar="REV")
    ap.add_argument("--examples", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--fail-below", type=float, metavar="R",
                    help="exit 1 when a later revision's row is below R x the first's")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="blockfuzz-revs-") as tmp_name:
        tmp = Path(tmp_name)
        workload = tmp / "workload.json"
        record(args.examples, workload)
        trees = {rev: checkout(rev, tmp) for rev in args.revs}
        try:
            runs = {rev: [] for rev in args.revs}
            for _ in range(args.rounds):
                for rev in args.revs:
                    runs[rev].append(time_revision(trees[rev], workload))
        finally:
            for rev, tree in trees.items():
                if tree != ROOT:
                    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                                    str(tree)], check=False)
    _print(runs, args)
    return report_slow(runs, args.revs, args.fail_below)


def _print(runs: dict, args) -> None:
    first = args.revs[0]
    table = Table(title=f"same workload ({args.examples} examples per runner, default hybrid "
                        f"config), steps/s per round; ratio of medians vs {first}")
    for col in ("rows", *args.revs):
        table.add_column(col)
    for key in sorted(runs[first][0]):
        base = statistics.median(r[key] for r in runs[first])
        cells = []
        for rev in args.revs:
            vals = [r[key] for r in runs[rev]]
            ratio = statistics.median(vals) / base
            cells.append(" / ".join(f"{v:.0f}" for v in vals) + f"  ({ratio:.2f}x)")
        table.add_row(key, *cells)
    Console().print(table)


if __name__ == "__main__":
    raise SystemExit(main())
