"""The blockfuzz command line (also: python -m harness).

Exit codes everywhere: 0 clean, 1 violation found or reproduced, 2 bad input or
usage (one line on stderr naming the file, field or flag; nothing written),
130 interrupted (Ctrl-C; what was done is kept and printed).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path

EXIT_OK, EXIT_VIOLATION, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

EPILOG = """exit codes:
  0    clean: no invariant violated (replay --check-expect: every verdict matched)
  1    a violation was found or reproduced (--check-expect: a verdict mismatched)
  2    bad input or usage: one line on stderr naming the file, field or flag;
       nothing written (--check-expect: nothing could be checked)
  130  interrupted (Ctrl-C): what was done is kept and printed"""


class UsageError(Exception):
    """Bad flags or input: reported as one line, exit 2."""


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors and the exit codes in every --help."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("epilog", EPILOG)
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message):  # one line, exit 2 (argparse prints usage otherwise)
        raise UsageError(f"{self.prog}: {message}")


def _target_names() -> list[str]:
    from harness.targets import TARGETS

    return list(TARGETS)


def _add_common(p: argparse.ArgumentParser, faults: bool = True) -> None:
    if faults:
        p.add_argument("--fault", action="append", default=[], metavar="ID",
                       help="switch on a gpu_impl fault (repeatable; see: blockfuzz faults)")
    p.add_argument("--device", default=None, choices=["auto", "cpu", "cuda"],
                   help="cpu runs Triton in interpreter mode with emulated graphs "
                        "(default: $BLOCKFUZZ_DEVICE or auto)")
    p.add_argument("--target", default="gpu_impl", choices=_target_names(),
                   help="implementation under test: gpu_impl, the installed vLLM's own "
                        "block-table classes (vllm), or the oracle itself (reference)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="blockfuzz", description=__doc__.splitlines()[0])
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

    p = sub.add_parser("replay", help="replay traces against the implementation")
    p.add_argument("traces", nargs="+", metavar="TRACE")
    _add_fault_source(p)
    p.add_argument("--check-expect", action="store_true",
                   help="corpus check: use each trace's meta.faults; exit 0 iff every "
                        "verdict matches the trace's expect, 1 otherwise, 2 when no trace "
                        "could be checked (--target vllm: meta.expect_by_release of the "
                        "installed release, no faults)")
    _add_common(p)

    _add_nightly(sub.add_parser("nightly", help="time-budgeted, crash-isolated, sharded "
                                                "campaign with report.json and JUnit XML"))

    for verb, text in (("faults", "the fault catalogue (id, family, runners, source, invariant)"),
                       ("ops", "the op vocabulary (fields, runners, targets, example)"),
                       ("invariants", "the invariants (id, meaning, structural, checked after)")):
        p = sub.add_parser(verb, help=text, description=text)
        p.add_argument("--json", action="store_true", help="machine-readable output")
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
                   help="switch on a gpu_impl fault (repeatable)")
    p.add_argument("--seed-timeout", type=float, default=300.0, metavar="S",
                   help="a seed running longer is killed and recorded as a crash")
    p.add_argument("--examples-per-seed", type=int, default=25)
    p.add_argument("--max-seeds", type=int, default=None, metavar="N",
                   help="stop handing out seeds after N seeds in this run (default: the "
                        "time budget alone bounds it)")
    p.add_argument("--device", default=None, choices=["auto", "cpu", "cuda"],
                   help="default: $BLOCKFUZZ_DEVICE or auto")
    p.add_argument("--target", default="gpu_impl",
                   choices=[t for t in _target_names() if t != "reference"],
                   help="implementation under test (vllm: the installed release's classes)")


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
    if verb == "fuzz":
        p.add_argument("--no-shrink", action="store_true", help="skip trace shrinking")
    _add_common(p)


# -- verbs ---------------------------------------------------------------------
def _load_config(path: str | None, runner: str | None):
    from reference import ConfigError, RunnerConfig

    from harness.core.trace import read_json

    if path is None:
        return None
    obj = read_json(path)
    if isinstance(obj, dict) and "config" in obj:
        obj = obj["config"]
    if isinstance(obj, dict) and runner:
        obj = dict(obj, runner=runner)
    try:
        return RunnerConfig.from_json(obj)
    except ConfigError as e:
        raise UsageError(f"{path}: {e}") from None




def _print_consequence(trace, invariant: str, faults, target: str, device: str) -> None:
    """For a structural finding (stale ids in a row), replay without the structural
    checks and say whether this trace also writes through the stale ids — what a
    maintainer asks first."""
    from harness.core.invariants import structural_ids

    if invariant not in structural_ids():
        return
    from harness.core.session import replay

    seen = replay(trace, faults, target, device, skip={invariant, "MATCHES_REFERENCE"})
    if seen.violation is None:
        print("consequence: none in this trace (structural only: no kernel writes through "
              "the stale ids here)")
    else:
        print(f"consequence (with {invariant} unchecked): {seen.violation.line()}")


def _fault_source(ids: list[str]) -> str:
    """The flag or variable that switched faults on, for error messages."""
    if ids:
        return "--fault"
    if os.environ.get("BLOCKFUZZ_FAULTS"):
        return "$BLOCKFUZZ_FAULTS"
    return "--faults-from-trace (the trace's meta.faults)"


def _check_faults(ids: list[str], runner: str | None = None) -> list[str]:
    """Validated fault ids, plus those of ``$BLOCKFUZZ_FAULTS`` (so they are reported)."""
    from gpu_impl.faults import CATALOGUE

    env = [f for f in os.environ.get("BLOCKFUZZ_FAULTS", "").split(",") if f]
    for fid in [*ids, *env]:
        flag = "--fault" if fid in ids else "$BLOCKFUZZ_FAULTS"
        if fid not in CATALOGUE:
            raise UsageError(f"{flag} {fid}: unknown fault; known: {', '.join(sorted(CATALOGUE))}")
        if runner and runner not in CATALOGUE[fid].runners:
            raise UsageError(f"{flag} {fid}: applies to runner(s) "
                             f"{', '.join(CATALOGUE[fid].runners)}, not {runner}")
    return sorted(set(ids) | set(env))


def _fault_runner(faults: list[str]) -> str | None:
    """The one runner every fault applies to, if there is exactly one."""
    from gpu_impl.faults import CATALOGUE

    common = {"v1", "v2"}
    for fid in faults:
        common &= set(CATALOGUE[fid].runners)
    if faults and not common:
        raise UsageError("--fault: these faults share no runner; fuzz them separately")
    return common.pop() if len(common) == 1 else None


def _check_out(path: str, flag: str, is_dir: bool = True) -> Path:
    """Refuse an output path that cannot be written, before any work is done.

    is_dir: the path is a directory to create or write into (else a file,
    written atomically beside itself, so its folder must be writable too).
    """
    if not path:
        raise UsageError(f"{flag}: must not be empty")
    out = Path(path)
    if out.exists() and out.is_dir() != is_dir:
        raise UsageError(f"{flag} {path}: exists and is {'not ' if is_dir else ''}a directory")
    if is_dir and out.is_dir() and not os.access(out, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {path}: is not writable")
    for parent in out.parents:
        if parent.exists():
            if not parent.is_dir():
                raise UsageError(f"{flag} {path}: {parent} is not a directory")
            if not (is_dir and out.is_dir()) and not os.access(parent, os.W_OK | os.X_OK):
                raise UsageError(f"{flag} {path}: {parent} is not writable")
            break
    return out


def _check_trace_faults(faults: list[str], runner: str, source: str) -> None:
    from gpu_impl.faults import CATALOGUE

    for fid in faults:
        if runner not in CATALOGUE[fid].runners:
            raise UsageError(f"{source}: fault {fid} applies to runner(s) "
                             f"{', '.join(CATALOGUE[fid].runners)}, the trace is {runner}")


def _select_device(device: str, target: str) -> str:
    """The device kind ``target`` runs on (its registered device policy)."""
    from harness.targets import TargetUnavailable, target_spec

    try:
        return target_spec(target).select_device(device)
    except TargetUnavailable as e:
        raise UsageError(str(e)) from None


def _check_target(config, target: str, source: str) -> None:
    """A config the target cannot express: one line naming the source and field."""
    if config is None:
        return
    from harness.targets import target_spec

    refused = target_spec(target).refusal(config)
    if refused is not None:
        raise UsageError(f"{source}: config.{refused}")


def _fuzz_setup(args):
    """Every check of fuzz / repro, before anything is printed or run."""
    if args.examples is not None and args.examples < 1:
        raise UsageError("--examples: must be >= 1")
    if args.time_budget is not None and not (0 < args.time_budget < math.inf):
        raise UsageError("--time-budget: must be a finite number of seconds > 0")
    out_dir = _check_out(args.out, "--out")
    faults = _check_faults(args.fault, args.runner)
    config = _load_config(args.config, args.runner)
    runner = config.runner if config is not None else (args.runner or _fault_runner(faults))
    if config is not None:
        _check_faults(args.fault, runner)
    if faults and args.target != "gpu_impl":
        raise UsageError(f"{_fault_source(args.fault)}: faults live in gpu_impl; use --target "
                         "gpu_impl")
    device = _select_device(args.device, args.target)
    _check_target(config, args.target, args.config)
    return out_dir, faults, config, runner, device


def cmd_fuzz(args) -> int:
    """fuzz / repro: header, search, shrink, then the trace and the commands to use it."""
    from harness.tools.commands import RunSettings

    out_dir, faults, config, runner, device = _fuzz_setup(args)
    examples = args.examples if args.examples is not None else (
        None if args.time_budget else 200)
    budget = f"examples={examples}" if examples else f"time_budget={args.time_budget:g}s"
    print(f"blockfuzz {args.verb}: seed={args.seed} runner={runner or 'drawn'} "
          f"target={args.target} device={device} faults={','.join(faults) or '-'} {budget} "
          f"profile={args.profile}")
    print("config: " + (json.dumps(config.to_json(), sort_keys=True, separators=(",", ":"))
                        if config else "drawn per example (recorded in any trace written)"))
    sys.stdout.flush()
    from harness.search.fuzz import FuzzInterrupted, fuzz

    run = RunSettings(runner=runner, profile=args.profile, target=args.target,
                      faults=tuple(faults), examples=examples, device=device,
                      config=args.config)
    try:
        result = fuzz(config, args.seed, examples, faults, args.target, device,
                      args.time_budget, args.profile,
                      shrink_trace=not getattr(args, "no_shrink", False),
                      found_by=f"blockfuzz {args.verb}", runner=runner)
    except FuzzInterrupted as stop:
        return _fuzz_interrupted(args, stop, out_dir, run)
    if args.time_budget is not None:
        print(f"chunk seeds run: {', '.join(map(str, result.chunk_seeds))}")
    if result.violation is None:
        print(f"PASS: {_examples_text(result)}, {_rate_text(result)}; no invariant violated")
        return EXIT_OK
    print(f"FAIL: {result.violation.line()}")
    path = _write_finding(out_dir, result.trace, "")
    if path is None:
        return EXIT_VIOLATION
    shrunk = (f"; shrunk {result.hypothesis_ops} -> {len(result.trace.ops)} ops in "
              f"{result.shrink_replays} replays ({result.shrink_seconds:.1f} s)"
              if not getattr(args, "no_shrink", False) else "")
    print(f"found within {_examples_text(result)}, {_rate_text(result)}{shrunk}")
    _print_consequence(result.trace, result.violation.invariant, faults, args.target, device)
    print(f"trace: {path}")
    if args.verb == "repro":
        _write_reproducer(path, result.trace, run)
    print(f"explain: {run.on_trace('explain', path)}")
    print(f"replay: {run.on_trace('replay', path)}")
    return EXIT_VIOLATION


def _examples_text(result) -> str:
    """How many examples ran to completion, and how many Hypothesis discarded."""
    text = f"{result.examples} examples"
    if result.discarded:
        text += (f" ({result.discarded} more started and discarded by Hypothesis: "
                 "its choice buffer ran out)")
    return text


def _rate_text(result) -> str:
    return (f"{result.steps} steps in {result.search_seconds:.1f} s of search "
            f"({result.steps_per_s:.0f} steps/s)")


def _write_finding(out_dir: Path, trace, suffix: str) -> Path | None:
    """Write a failing trace as DIR/<signature><suffix>.json; on an OSError print it
    instead (a finding is never lost) and return None."""
    from harness.core.trace import write_atomic
    from harness.search.fuzz import signature

    path = out_dir / f"{signature(trace)}{suffix}.json"
    try:
        write_atomic(path, trace.dumps())
    except OSError as e:
        print(f"cannot write {path}: {e.strerror or e}; the trace follows\n{trace.dumps()}")
        return None
    return path


def _write_reproducer(path: Path, trace, run) -> None:
    """repro: the standalone script beside the trace, executable."""
    from harness.core.trace import write_atomic
    from harness.tools.reproducer import reproducer_source

    script = path.with_suffix(".py")
    write_atomic(script, reproducer_source(trace, script.name))
    script.chmod(script.stat().st_mode | 0o111)
    print(f"reproducer: {run.reproducer(script)} (switches on the trace's faults; exits 1 "
          "while the bug is present, 0 with --no-faults or once fixed)")


def _fuzz_interrupted(args, stop, out_dir: Path, run) -> int:
    """Ctrl-C in fuzz / repro: print the chunks run; keep an unshrunk finding."""
    result = stop.result
    print("interrupted" + (" while shrinking" if stop.shrinking else ""))
    if args.time_budget is not None:
        print(f"chunk seeds run: {', '.join(map(str, result.chunk_seeds))} (the last one "
              "was cut short)")
    if stop.shrinking:
        print(f"FAIL: {result.violation.line()}")
        path = _write_finding(out_dir, result.trace, "-unshrunk")
        if path is not None:
            print(f"unshrunk trace ({len(result.trace.ops)} ops): {path}")
            print(f"shrink: {run.on_trace('shrink', path)}")
            print(f"replay: {run.on_trace('replay', path)}")
    return EXIT_INTERRUPTED


def _trace_faults(args, trace, source: str = "trace", note: str | None = "stdout") -> list[str]:
    """The faults to replay ``trace`` with; prints one note (to ``note``: "stdout",
    "stderr" or None for none) when the trace records faults (meta.faults) that
    stay off."""
    faults = _check_faults(args.fault)
    if args.faults_from_trace:
        faults = sorted(set(faults) | set(trace.faults))
    if faults and args.target != "gpu_impl":
        raise UsageError(f"{_fault_source(args.fault)}: faults live in gpu_impl; use --target "
                         "gpu_impl")
    _check_trace_faults(faults, trace.config.runner, source)
    off = [f for f in trace.faults if f not in faults]
    if off and note is not None and args.target == "gpu_impl":
        print(f"note: {source} was found with fault(s) {','.join(off)} (meta.faults), off "
              "here; --faults-from-trace switches them on",
              file=sys.stdout if note == "stdout" else sys.stderr)
    return faults


def cmd_shrink(args) -> int:
    """Shrink a failing trace to TRACE.shrunk.json (or --out)."""
    from harness.core.session import replay
    from harness.core.trace import load, write_atomic
    from harness.search.shrink import shrink
    from harness.tools.commands import RunSettings

    trace = load(args.trace)
    faults = _trace_faults(args, trace, args.trace, note=None)
    out = _check_out(args.out or str(Path(args.trace).with_suffix(".shrunk.json")),
                     "--out" if args.out else "TRACE (writes TRACE.shrunk.json; --out)",
                     is_dir=False)
    device = _select_device(args.device, args.target)
    _check_target(trace.config, args.target, args.trace)
    _trace_faults(args, trace, args.trace)  # validated above; now the note, if any
    verdict = replay(trace, faults, args.target, device)
    if verdict.violation is None:
        print(f"PASS {args.trace}: nothing to shrink (no violation"
              f"{' with faults ' + ','.join(faults) if faults else ''})")
        return EXIT_OK
    invariant = verdict.violation.invariant
    small, replays = shrink(trace, invariant, faults, args.target, device)
    final = replay(small, faults, args.target, device)
    small.expect = {"verdict": "fail", "invariant": invariant,
                    "op_index": final.violation.op_index}
    small.meta = dict(trace.meta, faults=faults, shrunk_from=str(args.trace))
    print(f"FAIL: {final.violation.line()}")
    try:
        write_atomic(out, small.dumps())
    except OSError as e:  # checked before, but never lose the result
        print(f"cannot write {out}: {e.strerror or e}; the trace follows\n{small.dumps()}")
        return EXIT_VIOLATION
    print(f"shrunk {len(trace.ops)} -> {len(small.ops)} ops in {replays} replays: {out}")
    _print_consequence(small, invariant, faults, args.target, device)
    run = RunSettings(target=args.target, faults=tuple(faults), device=device)
    print(f"replay: {run.on_trace('replay', out)}")
    return EXIT_VIOLATION


def cmd_explain(args) -> int:
    """Op-by-op table; the recorded-faults note goes to stderr (stdout is the document)."""
    from harness.core.trace import load
    from harness.tools.explain import explain, render

    trace = load(args.trace)
    faults = _trace_faults(args, trace, args.trace, note=None)
    device = _select_device(args.device, args.target)
    _check_target(trace.config, args.target, args.trace)
    _trace_faults(args, trace, args.trace, note="stderr")
    records = explain(trace, faults, device, args.target, stop_at_first=not args.all)
    text = render(records, args.format)
    if text is not None:
        print(text)
    return EXIT_VIOLATION if any(r["violations"] for r in records) else EXIT_OK


def _refusals(traces, target: str) -> dict:
    """path -> one-line reason, for traces the target cannot express."""
    refused = {}
    for path, trace in traces:
        try:
            _check_target(trace.config, target, str(path))
        except UsageError as e:
            refused[str(path)] = str(e)
    if refused and len(refused) == len(traces):
        raise UsageError(next(iter(refused.values())))  # nothing could run
    return refused


def _want_text(e: dict) -> str:
    return e.get("verdict", "pass") + (f" {e['invariant']}" if e.get("invariant") else "") \
        + (f" at op {e['op_index']}" if e.get("op_index") is not None else "")


def _replay_one(args, path, trace, use, device, expect) -> tuple[bool, bool]:
    """Replay one trace and print its lines; returns (violated, mismatched)."""
    from harness.core.session import replay

    found_on = trace.meta.get("target", "gpu_impl")
    if found_on != args.target and not args.check_expect:
        print(f"note: {path} was found on target {found_on}; replaying on {args.target} "
              f"(--target {found_on} replays it there)")
    verdict = replay(trace, use, args.target, device)
    tag = f" (faults: {','.join(use)})" if use else ""
    if verdict.violation is None:
        print(f"PASS {path}: {verdict.ops_run} ops{tag}")
    else:
        print(f"FAIL {path}{tag}: {verdict.violation.line()}")
    if not args.check_expect:
        return verdict.violation is not None, False
    got = ("pass" if verdict.violation is None else
           f"fail {verdict.violation.invariant} at op {verdict.violation.op_index}")
    ok = verdict.matches(expect)
    print(f"  expect {_want_text(expect)}: {'matches' if ok else 'MISMATCH, got ' + got}")
    if not ok and args.target != "vllm" and found_on != args.target:
        print(f"  (expect is its verdict on target {found_on}: add --target {found_on})")
    return verdict.violation is not None, not ok


def cmd_replay(args) -> int:
    """Replay traces; --check-expect compares each verdict with the trace's expect."""
    from harness.core.trace import load

    by_release = args.check_expect and args.target == "vllm"
    if args.check_expect and not by_release:
        args.faults_from_trace = True
    traces = [(p, load(p)) for p in args.traces]  # all validated before anything runs
    per_trace = [_trace_faults(args, trace, str(p), note=None) for p, trace in traces]
    device = _select_device(args.device, args.target)
    version = None
    if by_release:
        from harness.targets.vllm import installed_version

        version = installed_version()
    refused = _refusals(traces, args.target)
    violations = mismatches = unchecked = not_applicable = 0
    for (path, trace), use in zip(traces, per_trace):
        if str(path) in refused:  # one of several: the rest still run
            print(f"SKIP {refused[str(path)]}")
            unchecked += 1
            continue
        expect = trace.expect
        if by_release:  # the engine's verdict for the installed release, no faults
            expect = trace.meta.get("expect_by_release", {}).get(version)
            if expect is None:
                print(f"SKIP {path}: no verdict recorded for vLLM {version} "
                      "(meta.expect_by_release)")
                unchecked += 1
                continue
            if expect.get("verdict") == "n/a":  # the bug's code path is ours, not vLLM's
                print(f"N/A {path}: not applicable to vLLM {version}: "
                      f"{expect.get('reason', 'the code path is not the engine’s')}")
                not_applicable += 1
                continue
        _trace_faults(args, trace, str(path))  # the recorded-faults note, if any
        violated, mismatched = _replay_one(args, path, trace, use, device, expect)
        violations += violated
        mismatches += mismatched
    if not args.check_expect:
        return EXIT_VIOLATION if violations else EXIT_OK
    print(f"{len(traces) - mismatches - unchecked - not_applicable} matched, "
          f"{mismatches} mismatched"
          + (f", {unchecked} not checked (SKIP)" if unchecked else "")
          + (f", {not_applicable} not applicable (N/A)" if not_applicable else ""))
    if unchecked + not_applicable == len(traces):
        raise UsageError(f"--check-expect: nothing was checked: all {len(traces)} trace(s) "
                         "skipped (see the SKIP lines)")
    return EXIT_VIOLATION if mismatches else EXIT_OK


def cmd_faults(args) -> int:
    from harness.tools.catalogues import print_faults

    print_faults(args.json)
    return EXIT_OK


def cmd_ops(args) -> int:
    from harness.tools.catalogues import print_ops

    print_ops(args.json)
    return EXIT_OK


def cmd_invariants(args) -> int:
    from harness.tools.catalogues import print_invariants

    print_invariants(args.json)
    return EXIT_OK


def _nightly_campaign(args):
    """Every check of nightly, before anything is printed or run: the Campaign."""
    from harness.search.nightly import Campaign

    try:
        k, n = (int(x) for x in args.shard.split("/"))
    except ValueError:
        raise UsageError(f"--shard {args.shard}: expected K/N, e.g. 0/4") from None
    if not (n >= 1 and 0 <= k < n):
        raise UsageError(f"--shard {args.shard}: need 0 <= K < N")
    if not (0 < args.time_budget < math.inf) or not (0 < args.seed_timeout < math.inf) \
            or args.workers < 1 or args.examples_per_seed < 1:
        raise UsageError("--time-budget, --seed-timeout, --workers and --examples-per-seed "
                         "must be positive and finite")
    if args.max_seeds is not None and args.max_seeds < 1:
        raise UsageError("--max-seeds: must be >= 1")
    out = _check_out(args.out, "--out")
    if args.corpus:
        _check_out(args.corpus, "--corpus")
    faults = _check_faults(args.fault, args.runner)
    runner = args.runner or _fault_runner(faults)
    if faults and args.target != "gpu_impl":
        raise UsageError(f"{_fault_source(args.fault)}: faults live in gpu_impl; use --target "
                         "gpu_impl")
    device = _select_device(args.device, args.target)
    return Campaign(out, args.time_budget, args.workers, (k, n), device, runner, tuple(faults),
                    Path(args.corpus) if args.corpus else None, args.seed_timeout,
                    args.examples_per_seed, args.target, args.max_seeds)


def cmd_nightly(args) -> int:
    """A campaign: header, progress, totals, findings with their commands."""
    from harness.search.nightly import CampaignMismatch, prepare, run

    c = _nightly_campaign(args)
    try:
        progress = prepare(c)
    except CampaignMismatch as e:
        raise UsageError(f"--out {c.out}: {e}") from None
    resuming = f"resuming ({progress.resumed} seeds done) " if progress.resumed else ""
    print(f"blockfuzz nightly: {resuming}shard={c.shard[0]}/{c.shard[1]} workers={c.workers} "
          f"device={c.device} target={c.target} runner={c.runner or 'drawn'} "
          f"faults={','.join(c.faults) or '-'} time_budget={c.time_budget_s:g}s "
          + (f"max_seeds={c.max_seeds} " if c.max_seeds else "") + f"out={c.out}")
    sys.stdout.flush()
    progress = run(c, tick=_nightly_ticker(args.time_budget), progress=progress)
    _print_campaign(c, progress, args)
    if progress.interrupted:
        return EXIT_INTERRUPTED
    return EXIT_VIOLATION if progress.findings else EXIT_OK


def _print_campaign(c, progress, args) -> None:
    """Totals (every run of this DIR), findings with their commands, report paths."""
    from harness.tools.commands import command

    if progress.interrupted:
        print(f"interrupted: {len(progress.seeds) - progress.resumed} seed(s) finished in "
              "this run; the reports cover every finished seed")
    print(f"{len(progress.seeds)} seeds, {progress.examples} examples, {progress.steps} steps "
          f"in {progress.elapsed:.0f} s ({progress.steps / max(progress.elapsed, 1e-9):.0f} "
          f"steps/s), {len(progress.findings)} finding(s), {progress.crashes} crash(es)"
          + (f" (totals include {progress.resumed} seeds of earlier runs)"
             if progress.resumed else ""))
    for sig in sorted(progress.findings):
        f = progress.findings[sig]
        print(f"FINDING {sig}: {f.get('violation', '')}")
        for key in ("replay", "rerun"):
            if f.get(key):
                print(f"  {key}: {f[key]}")
    print(f"report: {c.out / 'report.json'}  junit: {c.out / 'junit.xml'}")
    if progress.interrupted:
        print("resume: " + command(
            "nightly", time_budget=args.time_budget, workers=args.workers, shard=args.shard,
            out=args.out, corpus=args.corpus if args.corpus else "", runner=args.runner,
            fault=args.fault, seed_timeout=args.seed_timeout,
            examples_per_seed=args.examples_per_seed, max_seeds=args.max_seeds,
            device=args.device, target=None if args.target == "gpu_impl" else args.target))


def _nightly_ticker(budget: float):
    """A rich progress bar on a terminal; a plain line right away, then every 10 s
    when piped."""
    if sys.stdout.isatty():
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        bar = Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                       transient=True)
        task = bar.add_task("nightly", total=budget)
        bar.start()

        def tick(elapsed, p):
            bar.update(task, completed=min(elapsed, budget),
                       description=f"seeds {len(p.seeds)} steps {p.steps} "
                                   f"findings {len(p.findings)}")
            if elapsed >= budget and not bar.finished:
                bar.stop()
        return tick
    last = [-math.inf]

    def tick(elapsed, p):
        if elapsed - last[0] >= 10:
            last[0] = elapsed
            print(f"[{elapsed:5.0f}s] seeds {len(p.seeds)} steps {p.steps} "
                  f"findings {len(p.findings)}", flush=True)
    return tick


VERBS = {"fuzz": cmd_fuzz, "repro": cmd_fuzz, "shrink": cmd_shrink, "explain": cmd_explain,
         "replay": cmd_replay, "faults": cmd_faults, "ops": cmd_ops,
         "invariants": cmd_invariants, "nightly": cmd_nightly}


class _PipeSafeStdout:
    """stdout that survives its reader going away (``blockfuzz explain ... | head``):
    after a BrokenPipeError further output is dropped and the verb runs on, so
    its exit code is the verdict's, not the pipe's."""

    def __init__(self, inner):
        self._inner, self.broken = inner, False

    def _closed(self) -> None:
        self.broken = True
        try:  # so the interpreter's final flush of the real stream succeeds too
            os.dup2(os.open(os.devnull, os.O_WRONLY), self._inner.fileno())
        except (OSError, ValueError, AttributeError):
            pass

    def write(self, text: str) -> int:
        if not self.broken:
            try:
                return self._inner.write(text)
            except BrokenPipeError:
                self._closed()
        return len(text)

    def flush(self) -> None:
        if not self.broken:
            try:
                self._inner.flush()
            except BrokenPipeError:
                self._closed()

    def __getattr__(self, name):
        return getattr(self._inner, name)


def _parse(argv: list[str]):
    """Parsed arguments; an unknown flag is named with its sub-command."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        raise UsageError(f"blockfuzz {args.verb}: unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run one verb; returns its exit code (0 clean, 1 violation, 2 usage, 130 Ctrl-C)."""
    # Hypothesis keeps a small cache of constants; keep it out of the user's tree.
    os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY",
                          os.path.join(tempfile.gettempdir(), "blockfuzz-hypothesis"))
    from gpu_impl.device import DeviceError

    from harness.core.trace import TraceError

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_worker"]:  # a nightly worker subprocess
        from harness.search.nightly import worker_main

        return worker_main(argv[1:])
    stdout, sys.stdout = sys.stdout, _PipeSafeStdout(sys.stdout)
    try:
        args = _parse(argv)
        return VERBS[args.verb](args)
    except (UsageError, TraceError, DeviceError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        sys.stdout.flush()
        sys.stdout = stdout


if __name__ == "__main__":
    raise SystemExit(main())
