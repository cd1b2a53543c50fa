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

``--fuzz`` adds the whole fuzz loop (Hypothesis, the machine's draws, the
session, coverage): each revision runs ``blockfuzz fuzz`` itself from seed 0
for ``--fuzz-examples`` examples per runner, on the default hybrid config
and with the geometry drawn.  A loop draws its own ops, so the table also
says whether every revision drew the same examples (steps and coverage
digest): only then do its rows compare like for like.

``--fail-below R`` makes this the regression guard: exit status 1 when any
row of a later revision runs below R times the first revision's median (e.g.
``--fail-below 0.9 --fuzz main WORKTREE`` before merging a change to the
harness).  It is a bench, run by hand or a dedicated job, not a timed test.

Usage: python bench/revisions.py [--examples 30] [--rounds 2] [--fuzz]
                                 [--fuzz-examples 15] [--fail-below R] REV [REV ...]
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


# Run inside each revision: the fuzz loop as `blockfuzz fuzz` runs it (seed 0, gpu_impl).
FUZZ_TIMER = r'''
import hashlib, json, sys, time
from reference import RunnerConfig
from harness.search.fuzz import fuzz
examples = int(sys.argv[1])
out = {}
for runner in ("v1", "v2"):
    for label, cfg in (("default hybrid", RunnerConfig(runner=runner)), ("geometry drawn", None)):
        start = time.perf_counter()
        r = fuzz(cfg, 0, examples, (), "gpu_impl", "cpu", profile="dev", runner=runner)
        secs = time.perf_counter() - start
        digest = hashlib.sha256(json.dumps(sorted(r.coverage.items())).encode()).hexdigest()[:8]
        out[f"{runner} fuzz loop, {label}"] = (r.steps / secs, f"{r.steps} steps {digest}")
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


def time_revision(tree: Path, workload: Path, fuzz_examples: int = 0) -> dict:
    """{row: steps/s} of one revision; with ``fuzz_examples`` the fuzz-loop rows
    too, and {row + " drew": "N steps DIGEST"} beside them."""
    out = run_in(tree, TIMER, str(workload), what="the timer")
    if fuzz_examples:
        for key, (rate, drew) in run_in(tree, FUZZ_TIMER, str(fuzz_examples),
                                        what="the fuzz-loop timer").items():
            out[key], out[key + " drew"] = rate, drew
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("revs", nargs="+", metavar="REV")
    ap.add_argument("--examples", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--fuzz", action="store_true", help="also time the whole fuzz loop")
    ap.add_argument("--fuzz-examples", type=int, default=15)
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
                    runs[rev].append(time_revision(trees[rev], workload,
                                                   args.fuzz_examples if args.fuzz else 0))
        finally:
            for rev, tree in trees.items():
                if tree != ROOT:
                    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                                    str(tree)], check=False)
    slow = _print(runs, args)
    if args.fail_below is not None and slow:
        Console(stderr=True).print(f"below {args.fail_below:g}x the first revision: "
                                   + "; ".join(slow))
        return 1
    return 0


def _print(runs: dict, args) -> list[str]:
    """Print the table; the rows (``rev: row ratio``) below ``--fail-below``."""
    first = args.revs[0]
    table = Table(title=f"same workload ({args.examples} examples per runner, default hybrid "
                        f"config), steps/s per round; ratio of medians vs {first}")
    for col in ("rows", *args.revs):
        table.add_column(col)
    slow = []
    for key in sorted(k for k in runs[first][0] if not k.endswith(" drew")):
        base = statistics.median(r[key] for r in runs[first])
        cells = []
        for rev in args.revs:
            vals = [r[key] for r in runs[rev]]
            ratio = statistics.median(vals) / base
            cells.append(" / ".join(f"{v:.0f}" for v in vals) + f"  ({ratio:.2f}x)")
            if args.fail_below is not None and rev != first and ratio < args.fail_below:
                slow.append(f"{rev}: {key} {ratio:.2f}x")
        table.add_row(key, *cells)
        drew = [runs[rev][0].get(key + " drew") for rev in args.revs]
        if drew[0] is not None:
            same = "same examples" if len(set(drew)) == 1 else "DIFFERENT examples"
            table.add_row(f"  drew ({same})", *drew)
    Console().print(table)
    return slow


if __name__ == "__main__":
    raise SystemExit(main())
