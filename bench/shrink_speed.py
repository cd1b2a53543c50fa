"""Shrinking speed on a fixed set of unshrunk findings, one revision at a time.

``bench/find_rate.py --save DIR`` writes every finding before shrinking; this
shrinks each of them with the shrinker of the tree it is run from (its
faults from the trace, the invariant from its ``expect``) and prints replays,
seconds and ops before / after, with the worst and total rows.  Run it from
two checkouts (``PYTHONPATH=<worktree> python bench/shrink_speed.py DIR``) on
the same DIR to compare shrinkers on identical inputs; the replay counts are
deterministic, seconds depend on load.

``--compare-cache`` shrinks each finding twice back to back, without and with
the replay snapshots (:class:`harness.core.session.SnapshotCache`) and the
reuse of interpreted launches on identical memory
(:func:`gpu_impl.cuda_graph.memoized_launches`), and
prints both, their ratio and whether the shrunk traces are the same (they
must be: a resumed replay is the replay from the start).  ``--no-cache``
shrinks without them.

``DIR`` defaults to ``bench/shrink_set/``: 8 unshrunk findings kept in the
repository (the longest finding of each of the 8 faults with the longest
ones in a find-rate run, 2026-12-01), so every checkout is measured on the
same inputs; a ``--save`` directory of another run can be passed instead.

Usage: python bench/shrink_speed.py [DIR] [--json OUT] [--compare-cache | --no-cache]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir", nargs="?", default=str(Path(__file__).resolve().parent / "shrink_set"))
    p.add_argument("--json", dest="json_out", default=None)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--compare-cache", action="store_true")
    mode.add_argument("--no-cache", action="store_true")
    args = p.parse_args(argv)
    import harness
    import harness.search.shrink as shrink_mod
    from harness.core.trace import load
    from rich.console import Console
    from rich.table import Table

    def timed(trace, cache: bool):
        shrink_mod.USE_CACHE = cache
        start = time.perf_counter()
        small, replays = shrink_mod.shrink(trace, trace.expect["invariant"], trace.faults)
        return small, replays, round(time.perf_counter() - start, 2)

    paths = sorted(Path(args.dir).glob("*.json"))
    if not paths:
        print(f"shrink_speed: {args.dir}: no *.json traces", file=sys.stderr)
        return 2
    rows = []
    for path in paths:
        trace = load(path)
        small, replays, secs = timed(trace, not args.no_cache)
        row = {"trace": path.stem, "ops_before": len(trace.ops), "ops_after": len(small.ops),
               "replays": replays, "seconds": secs}
        if args.compare_cache:
            plain, plain_replays, plain_secs = timed(trace, False)
            row |= {"seconds_no_cache": plain_secs,
                    "same": (plain.config, plain.ops, plain_replays) == (small.config, small.ops,
                                                                         replays)}
        rows.append(row)
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    table = Table(title=f"shrink speed ({Path(harness.__file__).parent.parent})"
                  + (", without replay snapshots or launch reuse" if args.no_cache else ""))
    cols = ["trace", "ops before", "ops after", "replays", "seconds"]
    if args.compare_cache:
        cols += ["seconds without snapshots or launch reuse", "ratio", "same shrunk trace"]
    for col in cols:
        table.add_column(col)
    for r in sorted(rows, key=lambda r: -r["seconds"]):
        extra = [f"{r['seconds_no_cache']:.2f}",
                 f"{r['seconds'] / r['seconds_no_cache']:.2f}x" if r["seconds_no_cache"] else "-",
                 "yes" if r["same"] else "NO"] if args.compare_cache else []
        table.add_row(r["trace"], str(r["ops_before"]), str(r["ops_after"]), str(r["replays"]),
                      f"{r['seconds']:.2f}", *extra)
    if rows:
        extra = [f"{max(r['seconds_no_cache'] for r in rows):.2f}", "", ""] \
            if args.compare_cache else []
        table.add_row("worst", "", "", str(max(r["replays"] for r in rows)),
                      f"{max(r['seconds'] for r in rows):.2f}", *extra)
        extra = [f"{sum(r['seconds_no_cache'] for r in rows):.2f}", "",
                 f"{sum(r['same'] for r in rows)}/{len(rows)}"] if args.compare_cache else []
        table.add_row("total", "", str(sum(r["ops_after"] for r in rows)),
                      str(sum(r["replays"] for r in rows)),
                      f"{sum(r['seconds'] for r in rows):.2f}", *extra)
    Console(width=140).print(table)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
