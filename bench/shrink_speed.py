"""Shrinking speed on a fixed set of unshrunk findings, one revision at a time.

``bench/find_rate.py --save DIR`` writes every finding before shrinking; this
shrinks each of them with the shrinker of the tree it is run from (its
faults from the trace, the invariant from its ``expect``) and prints replays,
seconds and ops before / after, with the worst and total rows.  Run it from
two checkouts (``PYTHONPATH=<worktree> python bench/shrink_speed.py DIR``) on
the same DIR to compare shrinkers on identical inputs; the replay counts are
deterministic, seconds depend on load.

Usage: python bench/shrink_speed.py DIR [--json OUT]
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
    p.add_argument("dir")
    p.add_argument("--json", dest="json_out", default=None)
    args = p.parse_args(argv)
    import harness
    from harness.core.trace import load
    from harness.search.shrink import shrink
    from rich.console import Console
    from rich.table import Table

    rows = []
    for path in sorted(Path(args.dir).glob("*.json")):
        trace = load(path)
        start = time.perf_counter()
        small, replays = shrink(trace, trace.expect["invariant"], trace.faults)
        rows.append({"trace": path.stem, "ops_before": len(trace.ops),
                     "ops_after": len(small.ops), "replays": replays,
                     "seconds": round(time.perf_counter() - start, 2)})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    table = Table(title=f"shrink speed ({Path(harness.__file__).parent.parent})")
    for col in ("trace", "ops before", "ops after", "replays", "seconds"):
        table.add_column(col)
    for r in sorted(rows, key=lambda r: -r["seconds"]):
        table.add_row(r["trace"], str(r["ops_before"]), str(r["ops_after"]), str(r["replays"]),
                      f"{r['seconds']:.2f}")
    if rows:
        table.add_row("worst", "", "", str(max(r["replays"] for r in rows)),
                      f"{max(r['seconds'] for r in rows):.2f}")
        table.add_row("total", "", str(sum(r["ops_after"] for r in rows)),
                      str(sum(r["replays"] for r in rows)),
                      f"{sum(r['seconds'] for r in rows):.2f}")
    Console(width=140).print(table)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
