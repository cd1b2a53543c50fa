"""``blockfuzz faults | ops | invariants``: the three registries, as a table or JSON.

Each listing iterates its registry (the fault catalogue in
:mod:`gpu_impl.faults`, :data:`harness.core.ops.REGISTRY`,
:data:`harness.core.invariants.REGISTRY`); nothing here knows an entry by name.
JSON goes to stdout with sorted keys (for tools); the table is a rich table,
plain ASCII at 160 columns when stdout is not a terminal.
"""

from __future__ import annotations

import json


def _print_table(title: str, columns: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = Console()
    plain = not console.is_terminal
    table = Table(title=title, box=box.ASCII if plain else box.SQUARE)
    for i, col in enumerate(columns):  # the first column is an id to copy: never wrapped
        table.add_column(col, overflow="fold", no_wrap=i == 0, min_width=None)
    for row in rows:
        table.add_row(*row)
    Console(width=160, no_color=True, highlight=False).print(table) if plain \
        else console.print(table)


def _print_json(records: list[dict]) -> None:
    print(json.dumps(records, indent=1, sort_keys=True))


def print_faults(as_json: bool, long: bool = False) -> None:
    """The fault catalogue.  By default a compact list, one line per fault (id,
    family, runners, the invariant that catches it), readable at 80-100
    columns; ``long``: the table with description and source; ``as_json``: every
    field."""
    from gpu_impl.faults import CATALOGUE

    faults = [CATALOGUE[k] for k in sorted(CATALOGUE)]
    if as_json:
        return _print_json([f.to_json() for f in faults])
    if not long:
        width = max(len(f.id) for f in faults)
        family = max(len(f.family) for f in faults)
        print(f"{len(faults)} faults in gpu_impl, off by default (--fault ID; --long: "
              "descriptions, sources)")
        for f in faults:
            print(f"{f.id:<{width}}  {f.family:<{family}}  {','.join(f.runners):<5}  "
                  f"{f.invariant}")
        return None
    rows = [(f.id, f.family, ",".join(f.runners),
             f.invariant + "".join(f" (or {a})" for a in f.also), f.description, f.source)
            for f in faults]
    _print_table("blockfuzz faults (gpu_impl, off by default)",
                 ("id", "family", "runners", "caught by", "description", "source"), rows)


def print_ops(as_json: bool) -> None:
    """The op vocabulary in registry order: name, fields, runners, targets, example."""
    from harness.core.ops import describe

    records = describe()
    if as_json:
        return _print_json(records)
    rows = [(r["op"], r["family"], ", ".join(r["fields"]) or "-", ",".join(r["runners"]),
             ",".join(r["targets"]), r["summary"], json.dumps(r["example"], sort_keys=True))
            for r in records]
    _print_table("blockfuzz ops (the trace vocabulary)",
                 ("op", "family", "fields", "runners", "targets", "what", "example"), rows)


def print_invariants(as_json: bool) -> None:
    """The invariants in check order: id, meaning, structural, checked after which ops."""
    from harness.core.invariants import describe

    records = describe()
    if as_json:
        return _print_json(records)
    rows = [(r["id"], "yes" if r["structural"] else "", ", ".join(r["after"]), r["meaning"])
            for r in records]
    _print_table("blockfuzz invariants (checked in this order; the first violation is the "
                 "verdict)", ("id", "structural", "checked after", "holds when"), rows)


# -- the reference pages (docs/reference/*.md), generated from the registries -----
PAGES_DIR = "docs/reference"
_NOTE = ("Generated from the registry by `python scripts/write_catalogues.py`; do not edit "
         "(a test fails when this page is stale).")


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _faults_page() -> str:
    from gpu_impl.faults import CATALOGUE

    lines = ["# Fault catalogue", "", _NOTE, "",
             "Each fault is a switchable reintroduction of a public upstream bug in gpu_impl "
             "(`--fault ID`), at the code path where the bug lived (`sites`: the engine "
             "files), with the invariant that catches it.", ""]
    for f in (CATALOGUE[k].to_json() for k in sorted(CATALOGUE)):
        caught = f["invariant"] + "".join(f" (or {a})" for a in f.get("also", []))
        lines += [f"## `{f['id']}`", "",
                  f"- family: `{f['family']}`; runners: {', '.join(f['runners'])}; "
                  f"caught by: `{caught}`",
                  f"- source: {f['source']}",
                  f"- sites: {', '.join(f'`{s}`' for s in f.get('sites', [])) or '-'}",
                  "", f["description"], ""]
    return "\n".join(lines).rstrip() + "\n"


def _ops_page() -> str:
    from harness.core.ops import describe

    lines = ["# Ops (the trace vocabulary)", "", _NOTE, "",
             "| op | family | fields | runners | targets | what | example |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in describe():
        lines.append("| " + " | ".join(_cell(c) for c in (
            f"`{r['op']}`", r["family"], ", ".join(r["fields"]) or "-", ", ".join(r["runners"]),
            ", ".join(r["targets"]), r["summary"],
            "`" + json.dumps(r["example"], sort_keys=True) + "`")) + " |")
    return "\n".join(lines) + "\n"


def _invariants_page() -> str:
    from harness.core.invariants import describe

    lines = ["# Invariants", "", _NOTE, "",
             "Checked in this order after every op; the first violation is the verdict.", "",
             "| id | structural | checked after | holds when |", "| --- | --- | --- | --- |"]
    for r in describe():
        lines.append("| " + " | ".join(_cell(c) for c in (
            f"`{r['id']}`", "yes" if r["structural"] else "", ", ".join(r["after"]),
            r["meaning"])) + " |")
    return "\n".join(lines) + "\n"


def pages() -> dict[str, str]:
    """{path relative to the repository root: markdown} of the three catalogue pages."""
    return {f"{PAGES_DIR}/faults.md": _faults_page(), f"{PAGES_DIR}/ops.md": _ops_page(),
            f"{PAGES_DIR}/invariants.md": _invariants_page()}
