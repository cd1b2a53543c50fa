"""Search throughput of two (or more) revisions: what ``blockfuzz fuzz`` does per second.

``bench/revisions.py`` replays one recorded workload through each revision's
session, which isolates the runners and kernels.  This one runs each
revision's whole search — its generator, steering, coverage tracking,
session and target — as ``fuzz(config, seed=S, examples=N, target=T,
runner=R)`` does (no fault, no shrink), for each runner in ``--runners``
and each geometry in ``--geometry`` (``default``: the default hybrid config
pinned; ``drawn``: drawn per example), in a subprocess per revision checked
out as a temporary git worktree, alternating revisions for ``--rounds``
rounds so machine load hits them alike.  The table gives steps and steps/s
per round and the ratio of each revision's median steps/s to the first
revision's.  Each revision draws its own examples; a row says whether every
revision drew the same ones (the same steps and behaviour-coverage counts),
and only then do its rows compare like for like.

``--fail-below R`` makes this the harness's speed regression guard: exit
status 1 when a later revision's median steps/s on any row is below R times
the first revision's (e.g. ``--fail-below 0.9 main WORKTREE`` before merging
a change to the harness).  A bench run by hand or by a dedicated job, never
a timed test.

Usage: python bench/search_throughput.py [--target gpu_impl] [--examples 15]
       [--seed 0] [--rounds 2] [--runners v1,v2] [--geometry default,drawn]
       [--fail-below R] REV [REV ...]   (``WORKTREE``: the working tree)
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

from revisions import ROOT, checkout, report_slow, run_in  # bench/ is sys.path[0]

RUN = r'''
import hashlib, json, os, sys
os.environ.setdefault("TRITON_INTERPRET", "1")
from harness.search.fuzz import fuzz
from reference import RunnerConfig
seed, examples, target, runner, geometry = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3],
                                            sys.argv[4], sys.argv[5])
config = RunnerConfig(runner=runner) if geometry == "default" else None
r = fuzz(config, seed=seed, examples=examples, target=target, runner=runner, shrink_trace=False)
drew = hashlib.sha256(json.dumps(sorted(r.coverage.items())).encode()).hexdigest()[:8]
print(json.dumps({"steps": r.steps, "seconds": r.search_seconds, "examples": r.examples,
                  "drew": f"{r.steps} steps, coverage {drew}"}))
'''


def run_revision(tree: Path, seed: int, examples: int, target: str, runner: str,
                 geometry: str) -> dict:
    return run_in(tree, RUN, str(seed), str(examples), target, runner, geometry,
                  what="the search")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("revs", nargs="+", metavar="REV")
    ap.add_argument("--target", default="gpu_impl", choices=("gpu_impl", "reference"))
    ap.add_argument("--examples", type=int, default=15)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--runners", default="v1,v2")
    ap.add_argument("--geometry", default="default,drawn")
    ap.add_argument("--fail-below", type=float, metavar="R",
                    help="exit 1 when a later revision's row is below R x the first's")
    args = ap.parse_args()
    rows = [(runner, geometry) for runner in args.runners.split(",")
            for geometry in args.geometry.split(",")]
    for flag, got, known in (("--runners", [r for r, _ in rows], ("v1", "v2")),
                             ("--geometry", [g for _, g in rows], ("default", "drawn"))):
        bad = [x for x in got if x not in known]
        if bad:
            print(f"search_throughput.py: {flag}: {bad[0]!r} is not one of {', '.join(known)}",
                  file=sys.stderr)
            return 2
    with tempfile.TemporaryDirectory(prefix="blockfuzz-search-") as tmp_name:
        trees = {rev: checkout(rev, Path(tmp_name)) for rev in args.revs}
        try:
            runs = {rev: [] for rev in args.revs}
            for _ in range(args.rounds):
                for rev in args.revs:
                    got = {}
                    for runner, geometry in rows:
                        got[f"{runner} {geometry}"] = run_revision(
                            trees[rev], args.seed, args.examples, args.target, runner, geometry)
                    runs[rev].append(got)
                    print(rev, json.dumps(got), file=sys.stderr, flush=True)
        finally:
            for tree in trees.values():
                if tree != ROOT:
                    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                                    str(tree)], check=False)
    table = Table(title=f"search throughput: fuzz(seed={args.seed}, examples={args.examples}, "
                        f"target={args.target}), steps/s per round; ratio of medians vs "
                        f"{args.revs[0]}")
    for col in ("runner, geometry", *args.revs):
        table.add_column(col)
    rates = {rev: [{k: r["steps"] / r["seconds"] for k, r in got.items()} for got in runs[rev]]
             for rev in args.revs}
    first = args.revs[0]
    for key in rates[first][0]:
        base = statistics.median(r[key] for r in rates[first])
        table.add_row(key, *[" / ".join(f"{r[key]:.0f}" for r in rates[rev])
                             + f"  ({statistics.median(r[key] for r in rates[rev]) / base:.2f}x)"
                             for rev in args.revs])
        drew = [runs[rev][0][key]["drew"] for rev in args.revs]
        same = "same examples" if len(set(drew)) == 1 else "DIFFERENT examples"
        table.add_row(f"  drew ({same})", *drew)
    Console().print(table)
    return report_slow(rates, args.revs, args.fail_below)


if __name__ == "__main__":
    raise SystemExit(main())
