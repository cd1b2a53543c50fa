"""The ``blockfuzz`` command line (also ``python -m harness``).

Exit codes everywhere: 0 clean, 1 violation found or reproduced, 2 bad input or
usage (one line on stderr naming the file, field or flag; nothing written).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
import tempfile
from pathlib import Path

EXIT_OK, EXIT_VIOLATION, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """Bad flags or input: reported as one line, exit 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse prints usage otherwise)
        raise UsageError(f"{self.prog}: {message}")


def _target_names() -> list[str]:
    from harness.targets import TARGETS

    return list(TARGETS)


def _add_common(p: argparse.ArgumentParser, faults: bool = True) -> None:
    if faults:
        p.add_argument("--fault", action="append", default=[], metavar="ID",
                       help="switch on a gpu_impl fault (repeatable; see `blockfuzz faults`)")
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
                        "verdict matches the trace's `expect`, 1 otherwise (--target vllm: "
                        "meta.expect_by_release of the installed release, no faults)")
    _add_common(p)

    p = sub.add_parser("nightly", help="time-budgeted, crash-isolated, sharded campaign "
                                       "with report.json and JUnit XML")
    p.add_argument("--time-budget", type=float, required=True, metavar="S")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--shard", default="0/1", metavar="K/N",
                   help="run seeds K, K+N, K+2N, ... (disjoint across a CI matrix)")
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--corpus", default="corpora/found", metavar="DIR",
                   help="where findings are also written as corpus entries ('' for none)")
    p.add_argument("--runner", default=None, choices=["v1", "v2"])
    p.add_argument("--fault", action="append", default=[], metavar="ID")
    p.add_argument("--seed-timeout", type=float, default=300.0, metavar="S",
                   help="a seed running longer is killed and recorded as a crash")
    p.add_argument("--examples-per-seed", type=int, default=25)
    p.add_argument("--device", default=None, choices=["auto", "cpu", "cuda"])
    p.add_argument("--target", default="gpu_impl",
                   choices=[t for t in _target_names() if t != "reference"],
                   help="implementation under test (vllm: the installed release's classes)")

    p = sub.add_parser("faults", help="the fault catalogue")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    return parser


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
                        help="run chunks of examples until S seconds are spent")
    default_out = "fuzz-out" if verb == "fuzz" else "corpora/found"
    p.add_argument("--out", default=default_out, metavar="DIR",
                   help=f"where a shrunk failing trace is written (default {default_out})")
    p.add_argument("--config", default=None, metavar="FILE",
                   help="pin the geometry: a JSON runner config, or a trace whose `config` is "
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


STRUCTURAL = ("VACATED_ROWS_ZERO", "DUMMY_TABLES_ZERO")


def _print_consequence(trace, invariant: str, faults, target: str, device: str) -> None:
    """For a structural finding (stale ids in a row), replay without the structural
    checks and say whether this trace also writes through the stale ids — what a
    maintainer asks first."""
    if invariant not in STRUCTURAL:
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
    """Refuse an output path that cannot be written, before any work is done."""
    if not path:
        raise UsageError(f"{flag}: must not be empty")
    out = Path(path)
    if out.exists() and out.is_dir() != is_dir:
        raise UsageError(f"{flag} {path}: exists and is {'not ' if is_dir else ''}a directory")
    for parent in out.parents:
        if parent.exists():
            if not parent.is_dir():
                raise UsageError(f"{flag} {path}: {parent} is not a directory")
            if not os.access(parent, os.W_OK):
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


def _replay_command(path: Path, faults: list[str], device: str,
                    target: str = "gpu_impl") -> str:
    parts = ["blockfuzz", "replay", str(path)] + [a for f in faults for a in ("--fault", f)]
    if target != "gpu_impl":
        parts += ["--target", target]
    return shlex.join(parts + ["--device", device])


def _check_target(config, target: str, source: str) -> None:
    """A config the target cannot express: one line naming the source and field."""
    if config is None:
        return
    from harness.targets import target_spec

    refused = target_spec(target).refusal(config)
    if refused is not None:
        raise UsageError(f"{source}: config.{refused}")


def cmd_fuzz(args) -> int:
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
    examples = args.examples if args.examples is not None else (
        None if args.time_budget else 200)
    budget = f"examples={examples}" if examples else f"time_budget={args.time_budget:g}s"
    print(f"blockfuzz {args.verb}: seed={args.seed} runner={runner or 'drawn'} "
          f"target={args.target} device={device} faults={','.join(faults) or '-'} {budget} "
          f"profile={args.profile}")
    print("config: " + (json.dumps(config.to_json(), sort_keys=True, separators=(",", ":"))
                        if config else "drawn per example (recorded in any trace written)"))
    sys.stdout.flush()
    from harness.search.fuzz import fuzz, signature
    from harness.core.trace import write_atomic

    result = fuzz(config, args.seed, examples, faults, args.target, device,
                  args.time_budget, args.profile,
                  shrink_trace=not getattr(args, "no_shrink", False),
                  found_by=f"blockfuzz {args.verb}", runner=runner)
    if args.time_budget is not None:
        print(f"chunk seeds run: {', '.join(map(str, result.chunk_seeds))}")
    rate = f"{result.steps} steps in {result.seconds:.1f} s ({result.steps_per_s:.0f} steps/s)"
    if result.violation is None:
        print(f"PASS: {result.examples} examples, {rate}; no invariant violated")
        return EXIT_OK
    trace = result.trace
    path = out_dir / f"{signature(trace)}.json"
    print(f"FAIL: {result.violation.line()}")
    try:
        write_atomic(path, trace.dumps())
    except OSError as e:  # never lose a finding: print it instead
        print(f"cannot write {path}: {e.strerror or e}; the trace follows\n{trace.dumps()}")
        return EXIT_VIOLATION
    print(f"found within {result.examples} examples, {rate}; shrunk {result.hypothesis_ops} "
          f"-> {len(trace.ops)} ops in {result.shrink_replays} replays")
    _print_consequence(trace, result.violation.invariant, faults, args.target, device)
    print(f"trace: {path}")
    if args.verb == "repro":
        from harness.tools.reproducer import reproducer_source

        script = path.with_suffix(".py")
        write_atomic(script, reproducer_source(trace, script.name))
        print(f"reproducer: {script} (python {script}"
              f"{''.join(' --fault ' + f for f in faults)}; exits 1 while the bug is present)")
    print(f"replay: {_replay_command(path, faults, device, args.target)}")
    return EXIT_VIOLATION


def _trace_faults(args, trace, source: str = "trace") -> list[str]:
    faults = _check_faults(args.fault)
    if args.faults_from_trace:
        faults = sorted(set(faults) | set(trace.faults))
    if faults and args.target != "gpu_impl":
        raise UsageError(f"{_fault_source(args.fault)}: faults live in gpu_impl; use --target "
                         "gpu_impl")
    _check_trace_faults(faults, trace.config.runner, source)
    return faults


def cmd_shrink(args) -> int:
    from harness.core.session import replay
    from harness.search.shrink import shrink
    from harness.core.trace import load, write_atomic

    trace = load(args.trace)
    faults = _trace_faults(args, trace, args.trace)
    out = _check_out(args.out, "--out", is_dir=False) if args.out else \
        Path(args.trace).with_suffix(".shrunk.json")
    device = _select_device(args.device, args.target)
    _check_target(trace.config, args.target, args.trace)
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
    write_atomic(out, small.dumps())
    print(f"FAIL: {final.violation.line()}")
    print(f"shrunk {len(trace.ops)} -> {len(small.ops)} ops in {replays} replays: {out}")
    _print_consequence(small, invariant, faults, args.target, device)
    print(f"replay: {_replay_command(out, faults, device, args.target)}")
    return EXIT_VIOLATION


def cmd_explain(args) -> int:
    from harness.tools.explain import explain, render
    from harness.core.trace import load

    trace = load(args.trace)
    faults = _trace_faults(args, trace, args.trace)
    device = _select_device(args.device, args.target)
    _check_target(trace.config, args.target, args.trace)
    records = explain(trace, faults, device, args.target, stop_at_first=not args.all)
    text = render(records, args.format)
    if text is not None:
        print(text)
    return EXIT_VIOLATION if any(r["violations"] for r in records) else EXIT_OK


def cmd_replay(args) -> int:
    from harness.core.session import replay
    from harness.core.trace import load

    by_release = args.check_expect and args.target == "vllm"
    if args.check_expect and not by_release:
        args.faults_from_trace = True
    traces = [(p, load(p)) for p in args.traces]  # all validated before anything runs
    per_trace = [_trace_faults(args, trace, str(p)) for p, trace in traces]
    device = _select_device(args.device, args.target)
    version = None
    if by_release:
        from harness.targets.vllm import installed_version

        version = installed_version()
    refused = {}
    for path, trace in traces:
        try:
            _check_target(trace.config, args.target, str(path))
        except UsageError as e:
            refused[str(path)] = str(e)
    if refused and len(refused) == len(traces):
        raise UsageError(next(iter(refused.values())))  # nothing could run
    violations = mismatches = unchecked = 0
    for (path, trace), use in zip(traces, per_trace):
        if str(path) in refused:  # one of several: the rest still run
            print(f"SKIP {refused[str(path)]}")
            unchecked += 1
            continue
        expect = trace.expect
        found_on = trace.meta.get("target", "gpu_impl")
        if found_on != args.target and not args.check_expect:
            print(f"note: {path} was found on target {found_on}; replaying on {args.target} "
                  f"(--target {found_on} replays it there)")
        if by_release:  # the engine's verdict for the installed release, no faults
            expect = trace.meta.get("expect_by_release", {}).get(version)
            if expect is None:
                print(f"SKIP {path}: no verdict recorded for vLLM {version} "
                      "(meta.expect_by_release)")
                unchecked += 1
                continue
        verdict = replay(trace, use, args.target, device)
        tag = f" (faults: {','.join(use)})" if use else ""
        if verdict.violation is None:
            print(f"PASS {path}: {verdict.ops_run} ops{tag}")
        else:
            print(f"FAIL {path}{tag}: {verdict.violation.line()}")
            violations += 1
        if args.check_expect:
            got = ("pass" if verdict.violation is None else
                   f"fail {verdict.violation.invariant} at op {verdict.violation.op_index}")
            e = expect
            want = e.get("verdict", "pass") + (f" {e['invariant']}" if e.get("invariant") else "") \
                + (f" at op {e['op_index']}" if e.get("op_index") is not None else "")
            ok = verdict.matches(e)
            mismatches += not ok
            print(f"  expect {want}: {'matches' if ok else 'MISMATCH, got ' + got}")
            if not ok and not by_release and found_on != args.target:
                print(f"  (expect is its verdict on target {found_on}: add --target {found_on})")
    if args.check_expect:
        print(f"{len(traces) - mismatches - unchecked} matched, {mismatches} mismatched"
              + (f", {unchecked} not checked (SKIP)" if unchecked else ""))
        return EXIT_VIOLATION if mismatches else EXIT_OK
    return EXIT_VIOLATION if violations else EXIT_OK


def cmd_faults(args) -> int:
    from gpu_impl.faults import CATALOGUE

    faults = [CATALOGUE[k] for k in sorted(CATALOGUE)]
    if args.json:
        print(json.dumps([f.to_json() for f in faults], indent=1, sort_keys=True))
        return EXIT_OK
    from rich.console import Console
    from rich.table import Table

    table = Table(title="blockfuzz faults (gpu_impl, off by default)")
    for col in ("id", "runners", "caught by", "description", "source"):
        table.add_column(col, overflow="fold")
    for f in faults:
        caught = f.invariant + "".join(f" (or {a})" for a in f.also)
        table.add_row(f.id, ",".join(f.runners), caught, f.description, f.source)
    console = Console()
    Console(width=None if console.is_terminal else 160).print(table)
    return EXIT_OK


def cmd_nightly(args) -> int:
    from harness.search.nightly import Campaign, run

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
    out = _check_out(args.out, "--out")
    if args.corpus:
        _check_out(args.corpus, "--corpus")
    faults = _check_faults(args.fault, args.runner)
    runner = args.runner or _fault_runner(faults)
    if faults and args.target != "gpu_impl":
        raise UsageError(f"{_fault_source(args.fault)}: faults live in gpu_impl; use --target "
                         "gpu_impl")
    device = _select_device(args.device, args.target)
    c = Campaign(out, args.time_budget, args.workers, (k, n), device, runner, tuple(faults),
                 Path(args.corpus) if args.corpus else None, args.seed_timeout,
                 args.examples_per_seed, args.target)
    print(f"blockfuzz nightly: shard={k}/{n} workers={args.workers} device={device} "
          f"target={args.target} "
          f"runner={runner or 'drawn'} faults={','.join(faults) or '-'} "
          f"time_budget={args.time_budget:g}s out={out}")
    sys.stdout.flush()
    from harness.search.nightly import CampaignMismatch

    try:
        progress = run(c, tick=_nightly_ticker(args.time_budget))
    except CampaignMismatch as e:
        raise UsageError(f"--out {out}: {e}") from None
    print(f"{len(progress.seeds)} seeds, {progress.steps} steps in {progress.elapsed:.0f} s "
          f"({progress.steps / max(progress.elapsed, 1e-9):.0f} steps/s), "
          f"{len(progress.findings)} finding(s), {progress.crashes} crash(es)")
    for sig in sorted(progress.findings):
        f = progress.findings[sig]
        print(f"FINDING {sig}: {f.get('violation', '')}")
        if f.get("replay"):
            print(f"  replay: {f['replay']}")
    print(f"report: {out / 'report.json'}  junit: {out / 'junit.xml'}")
    return EXIT_VIOLATION if progress.findings else EXIT_OK


def _nightly_ticker(budget: float):
    """A rich progress bar on a terminal; a plain line every 10 s when piped."""
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
    last = [0.0]

    def tick(elapsed, p):
        if elapsed - last[0] >= 10:
            last[0] = elapsed
            print(f"[{elapsed:5.0f}s] seeds {len(p.seeds)} steps {p.steps} "
                  f"findings {len(p.findings)}", flush=True)
    return tick


VERBS = {"fuzz": cmd_fuzz, "repro": cmd_fuzz, "shrink": cmd_shrink, "explain": cmd_explain,
         "replay": cmd_replay, "faults": cmd_faults, "nightly": cmd_nightly}


def main(argv: list[str] | None = None) -> int:
    # Hypothesis keeps a small cache of constants; keep it out of the user's tree.
    os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY",
                          os.path.join(tempfile.gettempdir(), "blockfuzz-hypothesis"))
    from gpu_impl.device import DeviceError

    from harness.core.trace import TraceError

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_worker"]:  # a nightly worker subprocess
        from harness.search.nightly import worker_main

        return worker_main(argv[1:])
    try:
        args = build_parser().parse_args(argv)
        return VERBS[args.verb](args)
    except (UsageError, TraceError, DeviceError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `blockfuzz explain ... | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
