"""Search throughput of two (or more) revisions: what ``blockfuzz fuzz`` does per second.

``bench/revisions.py`` replays one recorded workload through each revision's
session, which isolates the runners and kernels.  This one runs each
revision's whole search — its generator, steering, coverage tracking,
session and target — as ``fuzz(None, seed=S, examples=N, target=T)`` does
(no fault, no shrink), in a subprocess per revision checked out as a
temporary git worktree, alternating revisions for ``--rounds`` rounds so
machine load hits them alike.  Each revision draws its own examples, so the
steps differ between revisions; the table gives steps, search seconds and
steps/s per round, and the ratio of each revision's median steps/s to the
first revision's.

Usage: python bench/search_throughput.py [--target gpu_impl] [--examples 40]
       [--seed 1] [--rounds 2] REV [REV ...]   (``WORKTREE``: the working tree)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from revisions import ROOT, checkout, run_in  # bench/ is sys.path[0] when run as a script

RUN = r'''
import json, os, sys
os.environ.setdefault("TRITON_INTERPRET", "1")
from harness.search.fuzz import fuzz
seed, examples, target = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
r = fuzz(None, seed=seed, examples=examples, target=target, shrink_trace=False)
print(json.dumps({"steps": r.steps, "seconds": r.search_seconds, "examples": r.examples}))
'''


def run_revision(tree: Path, seed: int, examples: int, target: str) -> dict:
    return run_in(tree, RUN, str(seed), str(examples), target, what="the search")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("revs", nargs="+", metavar="REV")
    ap.add_argument("--target", default="gpu_impl", choices=("gpu_impl", "reference"))
    ap.add_argument("--examples", type=int, default=40)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="blockfuzz-search-") as tmp_name:
        trees = {rev: checkout(rev, Path(tmp_name)) for rev in args.revs}
        try:
            runs = {rev: [] for rev in args.revs}
            for _ in range(args.rounds):
                for rev in args.revs:
                    runs[rev].append(run_revision(trees[rev], args.seed, args.examples,
                                                  args.target))
                    print(rev, json.dumps(runs[rev][-1]), file=sys.stderr, flush=True)
        finally:
            for tree in trees.values():
                if tree != ROOT:
                    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                                    str(tree)], check=False)
    first = statistics.median(r["steps"] / r["seconds"] for r in runs[args.revs[0]])
    table = Table(title=f"search throughput: fuzz(seed={args.seed}, examples={args.examples}, "
                        f"target={args.target}), per round; ratio of median steps/s vs "
                        f"{args.revs[0]}")
    for col in ("revision", "steps", "search s", "steps/s", "ratio"):
        table.add_column(col)
    for rev in args.revs:
        rates = [r["steps"] / r["seconds"] for r in runs[rev]]
        table.add_row(rev, " / ".join(str(r["steps"]) for r in runs[rev]),
                      " / ".join(f"{r['seconds']:.1f}" for r in runs[rev]),
                      " / ".join(f"{v:.0f}" for v in rates),
                      f"{statistics.median(rates) / first:.2f}x")
    Console().print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
