"""The argument parser: one sub-command per verb, the exit codes in every --help."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.cli.common import BISECT_EPILOG, _Parser, _target_names


def _add_common(p: argparse.ArgumentParser, faults: bool = True) -> None:
    if faults:
        p.add_argument("--fault", action="append", default=[], metavar="ID",
                       help="switch on a catalogue fault (repeatable; see: blockfuzz faults): "
                            "gpu_impl's, or SGLang's (sgl-*) on --target sglang")
    p.add_argument("--device", default=None, choices=["auto", "cpu", "cuda"],
                   help="cpu runs Triton in interpreter mode with emulated graphs "
                        "(default: $BLOCKFUZZ_DEVICE or auto)")
    p.add_argument("--target", default="gpu_impl", choices=_target_names(),
                   help="implementation under test: gpu_impl, the installed vLLM's own "
                        "code (vllm), the installed SGLang's own code (sglang: token-slot "
                        "traces), or the oracle itself (reference)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="blockfuzz", description=(
        "Deterministic fuzz and regression harness for the block-table / dummy-run "
        "invariants of paged-KV LLM serving engines (README.md: the workflow; docs/cli.md)."))
    sub = parser.add_subparsers(dest="verb", required=True, parser_class=_Parser)

    for verb, text in (("fuzz", "search for an invariant violation from a seed"),
                       ("repro", "fuzz, shrink, and write a corpus trace plus a standalone "
                                 "reproducer script")):
        _add_search(sub.add_parser(verb, help=text), verb)

    p = sub.add_parser("shrink", help="shrink a failing trace (from anywhere) to a minimal one")
    p.add_argument("trace", metavar="TRACE")
    p.add_argument("--out", default=None, metavar="FILE",
                   help="where to write it (default: TRACE with .shrunk.json)")
    _add_fault_source(p)
    _add_common(p)

    p = sub.add_parser("explain", help="op-by-op table of rows, owners, writes and verdicts")
    p.add_argument("trace", metavar="TRACE")
    p.add_argument("--format", default="text", choices=["text", "json", "md"])
    p.add_argument("--all", action="store_true", help="keep going after the first violation")
    _add_fault_source(p)
    _add_common(p)

    p = sub.add_parser("replay", help="replay traces (or scenarios) against the implementation")
    p.add_argument("traces", nargs="+", metavar="TRACE",
                   help="trace files, or scenario files (corpora/scenarios/: one story, "
                        "turned into the trace of the --target's model)")
    p.add_argument("--runner", default=None, choices=["v1", "v2"],
                   help="the block-table runner a scenario runs on (default v1; a trace "
                        "names its own)")
    _add_fault_source(p)
    p.add_argument("--check-expect", action="store_true",
                   help="corpus check: use each trace's meta.faults; exit 0 iff every "
                        "verdict matches the trace's expect, 1 otherwise, 2 when no trace "
                        "could be checked (--target vllm: meta.expect_by_release of the "
                        "installed release, no faults)")
    _add_common(p)

    p = sub.add_parser("bisect", help="the first vLLM release (SGLang release for token-slot "
                                      "traces) where a trace's verdict changes (binary "
                                      "search, one environment per release)",
                       epilog=BISECT_EPILOG)
    p.add_argument("traces", nargs="+", metavar="TRACE")
    p.add_argument("--releases", default=None, metavar="A..B|X,Y,Z",
                   help="releases to search, oldest to newest (default: vLLM "
                        "0.26.0..0.33.0, the nine releases on the index between them; "
                        "SGLang 0.5.20..0.5.23 for token-slot traces)")
    p.add_argument("--cache", default=str(Path.home() / ".cache" / "blockfuzz" / "vllm-envs"),
                   metavar="DIR", help="where each release's environment is made once and "
                                       "reused")
    p.add_argument("--json", action="store_true", help="machine-readable result")
    p.add_argument("--every", action="store_true",
                   help="replay on every release listed, oldest first (no binary search); "
                        "the first change between neighbours is reported")
    p.add_argument("--write", action="store_true",
                   help="record the measured verdicts in each trace's meta.expect_by_release")

    _add_nightly(sub.add_parser("nightly", help="time-budgeted, crash-isolated, sharded "
                                                "campaign with report.json and JUnit XML"))

    for verb, text in (("faults", "the fault catalogue (id, family, runners, source, invariant)"),
                       ("ops", "the op vocabulary (fields, runners, targets, example)"),
                       ("invariants", "the invariants (id, meaning, structural, checked after)")):
        p = sub.add_parser(verb, help=text, description=text)
        p.add_argument("--json", action="store_true", help="machine-readable output")
        if verb == "faults":
            p.add_argument("--long", action="store_true",
                           help="the full table: description and public source of each")
    return parser


def _add_nightly(p) -> None:
    """The nightly campaign's flags."""
    p.add_argument("--time-budget", type=float, required=True, metavar="S",
                   help="hand out seeds until S seconds are spent (seeds in flight finish)")
    p.add_argument("--workers", type=int, default=1, help="worker subprocesses")
    p.add_argument("--shard", default="0/1", metavar="K/N",
                   help="run seeds K, K+N, K+2N, ... (disjoint across a CI matrix)")
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--corpus", default="corpora/found", metavar="DIR",
                   help="where findings are also written as corpus entries ('' for none)")
    p.add_argument("--runner", default=None, choices=["v1", "v2"],
                   help="pin the model runner (default: drawn per example)")
    p.add_argument("--fault", action="append", default=[], metavar="ID",
                   help="switch on a catalogue fault (repeatable): gpu_impl's, or SGLang's "
                        "(sgl-*) on --target sglang")
    p.add_argument("--seed-timeout", type=float, default=300.0, metavar="S",
                   help="a seed running longer is killed and recorded as a crash")
    p.add_argument("--examples-per-seed", type=int, default=25)
    p.add_argument("--seed-corpus", default=None, metavar="DIR",
                   help="traces examples may start from, e.g. an earlier campaign's "
                        "DIR/learned (snapshotted into this campaign's DIR/seed-corpus)")
    p.add_argument("--max-seeds", type=int, default=None, metavar="N",
                   help="stop handing out seeds after N seeds in this run (default: the "
                        "time budget alone bounds it)")
    p.add_argument("--device", default=None, choices=["auto", "cpu", "cuda"],
                   help="default: $BLOCKFUZZ_DEVICE or auto")
    p.add_argument("--target", default="gpu_impl",
                   choices=[t for t in _target_names() if t != "reference"],
                   help="implementation under test (vllm / sglang: the installed release's "
                        "own code)")
    p.add_argument("--releases", default=None, metavar="A..B|X,Y,Z",
                   help="with --target vllm or sglang: search the newest of these releases (in "
                        "its own cached environment), replay each finding on the older ones "
                        "and mark the findings new in the newest")
    p.add_argument("--release-cache", default=None, metavar="DIR",
                   help="with --releases: where each release's environment is made once (as "
                        "bisect --cache; default ~/.cache/blockfuzz/vllm-envs)")


def _add_fault_source(p) -> None:
    p.add_argument("--faults-from-trace", action="store_true",
                   help="also switch on each trace's meta.faults")


def _add_search(p, verb: str) -> None:
    p.add_argument("--runner", default=None, choices=["v1", "v2"],
                   help="pin the model runner (default: drawn per example, or the one the "
                        "--fault ids share)")
    p.add_argument("--seed", type=int, default=0)
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--examples", type=int, default=None,
                        help="Hypothesis examples (default 200)")
    budget.add_argument("--time-budget", type=float, default=None, metavar="S",
                        help="run chunks of 25 examples until S seconds are spent (the "
                             "chunk in flight finishes: up to one chunk over S)")
    default_out = "fuzz-out" if verb == "fuzz" else "corpora/found"
    p.add_argument("--out", default=default_out, metavar="DIR",
                   help=f"where a shrunk failing trace is written (default {default_out})")
    p.add_argument("--config", default=None, metavar="FILE",
                   help="pin the geometry: a JSON runner config, or a trace whose config is "
                        "used (default: geometry drawn per example)")
    p.add_argument("--profile", default="dev", choices=["dev", "ci", "nightly"])
    p.add_argument("--seed-corpus", default=None, metavar="DIR",
                   help="traces examples may start from (earlier findings, a nightly "
                        "campaign's learned/ directory); the run is a function of seed "
                        "and corpus")
    if verb == "fuzz":
        p.add_argument("--no-shrink", action="store_true", help="skip trace shrinking")
        p.add_argument("--coverage", action="store_true",
                       help="print the behaviour-coverage features the search hit "
                            "(ops and examples per feature)")
    _add_common(p)
