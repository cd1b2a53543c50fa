"""Find rate: how often, and how fast, the default search finds each catalogue fault.

For every catalogue fault (or ``--faults``) and every seed in ``--seeds``, runs
what a user runs — ``blockfuzz fuzz --seed S --examples N --fault F`` with the
runner drawn — and records whether the fault was found, after how many
examples (completed examples, the failing one included) and how many seconds
of search, and what shrinking the finding cost (replays, seconds).  Prints one
row per fault: found on how many seeds, median and worst examples and seconds
to find, worst shrink.  A miss counts as ``N`` examples in the worst column
and is shown as ``miss`` there.

Examples-to-find are deterministic (a pure function of seed and code);
seconds depend on machine load, so compare them only within one run.

``--rows A.json[,B.json]`` prints the table of rows a run (or several, e.g.
seeds 0..9 and 10..19) wrote with ``--json``, without searching.
``--against OLD.json[,...]`` compares the rows with an earlier table's on
the (fault, seed) pairs both hold: per fault, seeds found and median
examples before and now (a miss counts as ``--examples``: give the budget
both tables were run with), the faults where either moved, and a count of
faults found on fewer seeds and of medians higher and lower.  Ten seeds are
a small sample for a fault found in a few percent of examples: a change of
one seed, or a median that moves either way, is often the luck of the
seeds (docs/benchmarks.md compares seeds 0..9 with 10..19).

Usage: python bench/find_rate.py [--seeds 0..9] [--examples 200] [--jobs 2]
                                 [--faults A,B] [--no-shrink] [--json OUT] [--save DIR]
                                 [--rows A.json,...] [--against OLD.json,...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")

from _args import parse_seeds  # noqa: E402  (bench/ is sys.path[0] when run as a script)
from _find_rate_tables import compare, load_rows  # noqa: E402
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def one(job: tuple) -> dict:
    """Run one (fault, seed) fuzz; returns its row (in a worker process)."""
    fault, seed, examples, do_shrink, save = job
    from harness.search.fuzz import fuzz

    target = _target(fault)
    r = fuzz(None, seed=seed, examples=examples, faults=(fault,), shrink_trace=False,
             target=target, runner="sglang" if target == "sglang" else None)
    if r.trace is not None and save:
        (Path(save) / f"{fault}-seed{seed}.json").write_text(r.trace.dumps())
    if r.trace is not None and do_shrink:  # what fuzz does next, timed apart
        import time

        from harness.search.shrink import shrink

        start = time.perf_counter()
        small, r.shrink_replays = shrink(r.trace, r.violation.invariant, (fault,), target)
        r.shrink_seconds, r.trace = time.perf_counter() - start, small
    return {"fault": fault, "seed": seed, "found": r.violation is not None,
            "invariant": r.violation.invariant if r.violation else None,
            "examples": r.examples, "search_s": round(r.search_seconds, 2),
            "steps": r.steps, "shrink_replays": r.shrink_replays,
            "shrink_s": round(r.shrink_seconds, 2),
            "ops": len(r.trace.ops) if r.trace is not None else None}


def _target(fault: str) -> str:
    """SGLang's faults run on the installed SGLang (the sglang target), the rest on
    gpu_impl."""
    from gpu_impl.faults import CATALOGUE

    return "sglang" if CATALOGUE[fault].runners == ("sglang",) else "gpu_impl"


def summarise(rows: list[dict], examples: int) -> list[dict]:
    """One summary per fault: found count, median/worst examples and seconds to find."""
    out = []
    for fault in sorted({r["fault"] for r in rows}):
        mine = [r for r in rows if r["fault"] == fault]
        hits = [r for r in mine if r["found"]]
        ex = [r["examples"] if r["found"] else examples for r in mine]
        secs = [r["search_s"] for r in hits]
        out.append({
            "fault": fault, "seeds": len(mine), "found": len(hits),
            "median_examples": statistics.median(ex),
            "worst_examples": "miss" if len(hits) < len(mine) else max(ex),
            "median_s": statistics.median(secs) if secs else None,
            "worst_s": max(secs) if secs else None,
            "worst_shrink_s": max((r["shrink_s"] for r in hits), default=None),
            "worst_shrink_replays": max((r["shrink_replays"] for r in hits), default=None),
            "missed_seeds": [r["seed"] for r in mine if not r["found"]]})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default=None, type=parse_seeds, help="default 0..9")
    p.add_argument("--examples", type=int, default=200)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--faults", default=None, help="comma-separated ids (default: all)")
    p.add_argument("--no-shrink", action="store_true", help="search only")
    p.add_argument("--json", dest="json_out", default=None, help="write rows + summary here")
    p.add_argument("--save", default=None, metavar="DIR",
                   help="write each unshrunk finding here (input for bench/shrink_speed.py)")
    p.add_argument("--rows", default=None, metavar="A.json,...",
                   help="print the table of these --json files' rows (no search)")
    p.add_argument("--against", default=None, metavar="OLD.json,...",
                   help="compare with an earlier --json table, seed by seed")
    args = p.parse_args(argv)
    if args.rows:
        given = [f for f, v in (("--seeds", args.seeds), ("--faults", args.faults),
                                ("--json", args.json_out), ("--save", args.save)) if v]
        if given:
            print(f"find_rate.py: --rows prints stored rows and runs no search: "
                  f"{', '.join(given)} does not apply", file=sys.stderr)
            return 2
    args.seeds = args.seeds or parse_seeds("0..9")
    try:
        stored = load_rows(args.rows, "--rows") if args.rows else None
        old = load_rows(args.against, "--against") if args.against else None
    except ValueError as e:
        print(f"find_rate.py: {e}", file=sys.stderr)
        return 2
    if stored is not None:
        report(stored, args, old)
        return 0

    from gpu_impl.faults import CATALOGUE

    faults = args.faults.split(",") if args.faults else sorted(CATALOGUE)
    for f in faults:
        if f not in CATALOGUE:
            print(f"find_rate.py: --faults: unknown fault {f!r}", file=sys.stderr)
            return 2
    from harness.targets.sglang_release import installed_version

    if installed_version() is None and any(_target(f) == "sglang" for f in faults):
        if args.faults:
            print("find_rate.py: --faults: SGLang's faults need SGLang "
                  "(scripts/install-sglang-target.sh RELEASE)", file=sys.stderr)
            return 2
        faults = [f for f in faults if _target(f) != "sglang"]
        print("find_rate.py: SGLang is not installed: its faults are left out",
              file=sys.stderr)
    if args.save:
        Path(args.save).mkdir(parents=True, exist_ok=True)
    jobs = [(f, s, args.examples, not args.no_shrink, args.save)
            for f in faults for s in args.seeds]
    rows = []
    with ProcessPoolExecutor(args.jobs) as pool:
        for row in pool.map(one, jobs):
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    summary = report(rows, args, old)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"rows": rows, "summary": summary}, indent=1))
    return 0


def report(rows: list[dict], args, old: list[dict] | None) -> list[dict]:
    """Print the find-rate table of ``rows`` (and, with ``old``, the comparison);
    returns the summary."""
    from rich.console import Console
    from rich.table import Table

    summary = summarise(rows, args.examples)
    seeds = sorted({r["seed"] for r in rows})
    table = Table(title=f"find rate: seeds {_ranges(seeds)}, "
                        f"--examples {args.examples}, runner drawn")
    for col in ("fault", "found", "median ex", "worst ex", "median s", "worst s",
                "worst shrink s (replays)", "missed seeds"):
        table.add_column(col)
    for s in summary:
        shrink = ("-" if s["worst_shrink_s"] is None
                  else f"{s['worst_shrink_s']:.1f} ({s['worst_shrink_replays']})")
        table.add_row(s["fault"], f"{s['found']}/{s['seeds']}", f"{s['median_examples']:g}",
                      str(s["worst_examples"]),
                      "-" if s["median_s"] is None else f"{s['median_s']:.1f}",
                      "-" if s["worst_s"] is None else f"{s['worst_s']:.1f}", shrink,
                      ",".join(map(str, s["missed_seeds"])) or "-")
    console = Console(width=160)
    console.print(table)
    if old is not None:
        moved, counts = compare(rows, old, args.examples)
        diff = Table(title=f"against {args.against}: the faults whose seeds found or median "
                           "examples moved (same fault and seed pairs)")
        for col in ("fault", "seeds", "found before", "found now", "median before",
                    "median now"):
            diff.add_column(col)
        for m in moved:
            if (m["found_before"], m["median_before"]) != (m["found_now"], m["median_now"]):
                diff.add_row(m["fault"], str(m["seeds"]), str(m["found_before"]),
                             str(m["found_now"]), f"{m['median_before']:g}",
                             f"{m['median_now']:g}")
        console.print(diff if diff.row_count else
                      f"against {args.against}: " + ("no fault moved" if counts["faults"]
                                                     else "no (fault, seed) pair in common"))
        console.print(f"{counts['faults']} faults compared: {counts['fewer']} found on fewer "
                      f"seeds, {counts['more']} on more; {counts['higher']} medians higher, "
                      f"{counts['lower']} lower"
                      + (f"; {counts['unpaired']} rows without a partner (other faults or "
                         "seeds) left out" if counts["unpaired"] else ""))
    return summary


def _ranges(seeds: list[int]) -> str:
    """``0..19`` for a run of seeds, else the list."""
    if seeds and seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}..{seeds[-1]}"
    return ",".join(map(str, seeds))


if __name__ == "__main__":
    raise SystemExit(main())
