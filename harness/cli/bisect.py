"""Verb ``bisect``: the first engine release (vLLM, or SGLang for token-slot
traces) where a trace's verdict changes."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

from harness.cli.common import EXIT_OK, EXIT_VIOLATION, UsageError

DEFAULT_CACHE = Path.home() / ".cache" / "blockfuzz" / "vllm-envs"


def _cell(v: dict) -> str:
    """A verdict, and the vllm target's mode that measured it (runner / adapter)."""
    mode = f" [{v['mode']}]" if v.get("mode") else ""
    if v["verdict"] == "fail":
        return f"fail {v['invariant']} at op {v['op_index']} ({v['op']}){mode}"
    return v["verdict"] + mode


def cmd_bisect(args) -> int:
    """Load the traces, bisect the releases, print the table and the change point."""
    from harness.core.trace import canonical_json, load, write_atomic
    from harness.tools.bisect import BisectError, ReleaseEnvs, bisect, engine_of, \
        measure_in, parse_releases

    traces = [(p, load(p)) for p in args.traces]  # all validated before anything runs
    try:
        engine = engine_of([t for _, t in traces])
        releases = parse_releases(args.releases or engine.default, engine.known)
    except BisectError as e:
        raise UsageError(str(e)) from None
    from harness.cli.common import _check_out

    # writable, before anything runs
    envs = ReleaseEnvs(_check_out(args.cache, "--cache"), engine=engine.name)
    # --json: stdout is the one JSON document; every human line goes to stderr.
    say = functools.partial(print, file=sys.stderr if args.json else sys.stdout)
    say(f"blockfuzz bisect: {len(traces)} trace(s) over {engine.title} "
        f"{', '.join(releases)} (cache {args.cache})", flush=True)
    missing = [r for r in releases if not envs.ready(r)]
    if missing:
        say(f"to install when needed (about a minute each, once): {', '.join(missing)}",
            flush=True)
    paths = [str(p) for p, _ in traces]

    def measure(release: str) -> list[dict]:
        verdicts = measure_in(envs.python(release), paths, engine.name)
        say(f"  {release}: " + "; ".join(_cell(v) for v in verdicts), flush=True)
        return verdicts

    try:
        result = bisect(releases, measure, every=args.every)
    except BisectError as e:
        raise UsageError(str(e)) from None
    rows = [{"release": r, "measured": r in result.measured,
             "environment": envs.where(r) if r in result.measured else None,
             "verdicts": result.measured.get(r)} for r in releases]
    if args.json:
        print(json.dumps({"releases": rows, "change": result.change,
                          "installed": envs.installed}, indent=1))
    else:
        _print_table(rows, paths, engine.name)
    if result.change is None:
        say("no change: every release listed gives the same verdicts" if args.every else
            f"no change: {releases[0]} and {releases[-1]} give the same verdicts; "
            "the releases between were not run")
    else:
        old, new = result.change
        say(f"first release where the verdict changes: {new} (after {old}; "
            f"{len(result.measured)} of {len(releases)} releases run, "
            f"{len(envs.installed)} installed now)")
    if args.write:
        for path, trace in traces:
            i = paths.index(str(path))
            recorded = trace.meta.setdefault("expect_by_release", {})
            for r in result.measured:
                recorded[r] = {k: v for k, v in result.measured[r][i].items() if k != "op"}
            write_atomic(Path(path), canonical_json(trace.to_json()))
        say(f"wrote meta.expect_by_release for {', '.join(result.measured)} into "
            f"{len(traces)} trace(s)")
    return EXIT_OK if result.change is not None else EXIT_VIOLATION


def _print_table(rows: list[dict], paths: list[str], target: str = "vllm") -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    plain = not Console().is_terminal  # ASCII when piped, as explain does
    table = Table(title=f"verdict per release ({target} target, no faults)", title_justify="left",
                  box=box.ASCII if plain else box.SQUARE)
    table.add_column("release")
    for p in paths:
        table.add_column(Path(p).name)
    table.add_column("environment")
    for row in rows:
        cells = [_cell(v) for v in row["verdicts"]] if row["verdicts"] else \
            ["(not run)"] * len(paths)
        table.add_row(row["release"], *cells, row["environment"] or "-")
    Console(width=160).print(table)
