"""Verbs that search: ``fuzz``, ``repro`` and ``nightly``."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from harness.cli.common import (
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_VIOLATION,
    UsageError,
    _check_faults,
    _check_out,
    _check_fault_needs,
    _check_fault_target,
    _check_target,
    _fault_runner,
    _load_config,
    _print_consequence,
    _select_device,
)


def _fuzz_setup(args):
    """Every check of fuzz / repro, before anything is printed or run."""
    if args.examples is not None and args.examples < 1:
        raise UsageError("--examples: must be >= 1")
    if args.time_budget is not None and not (0 < args.time_budget < math.inf):
        raise UsageError("--time-budget: must be a finite number of seconds > 0")
    out_dir = _check_out(args.out, "--out")
    faults = _check_faults(args.fault, args.runner)
    # A --config without "runner" takes the one the faults share, as a drawn geometry does.
    config = _load_config(args.config, args.runner, _fault_runner(faults))
    runner = config.runner if config is not None else (args.runner or _fault_runner(faults))
    if config is not None:
        _check_faults(args.fault, runner)
    _check_fault_target(faults, args.target, args.fault)
    runner = runner if config is not None else _target_runner(args, runner)
    device = _select_device(args.device, args.target)
    _check_target(config, args.target, args.config)
    _check_fault_needs(faults, config, args.config)
    return out_dir, faults, config, runner, device


def _target_runner(args, runner: str | None) -> str | None:
    """The runner a search draws for: the target's only one, when it runs one kind
    of config (sglang: token slots; ``--runner`` of another kind is one line,
    exit 2), else ``runner``."""
    from harness.targets import target_spec

    runners = target_spec(args.target).runners
    if len(runners) != 1:
        return runner
    if args.runner is not None and args.runner not in runners:
        raise UsageError(f"--runner {args.runner}: the {args.target} target runs runner "
                         f"{runners[0]} configs only")
    return runners[0]


def _seed_corpus(path: str | None) -> list:
    """The --seed-corpus traces (TraceError, one line naming the file, if unusable)."""
    if path is None:
        return []
    from harness.search.corpus import load_dir

    return load_dir(path)


def cmd_fuzz(args) -> int:
    """fuzz / repro: header, search, shrink, then the trace and the commands to use it."""
    from harness.tools.commands import RunSettings

    out_dir, faults, config, runner, device = _fuzz_setup(args)
    seed_corpus = _seed_corpus(args.seed_corpus)
    examples = args.examples if args.examples is not None else (
        None if args.time_budget else 200)
    budget = f"examples={examples}" if examples else f"time_budget={args.time_budget:g}s"
    print(f"blockfuzz {args.verb}: seed={args.seed} runner={runner or 'drawn'} "
          f"target={args.target} device={device} faults={','.join(faults) or '-'} {budget} "
          f"profile={args.profile}")
    print("config: " + (json.dumps(config.to_json(), sort_keys=True, separators=(",", ":"))
                        if config else "drawn per example (recorded in any trace written)"))
    if args.target == "vllm":
        print(_vllm_mode_text(config, runner))
    sys.stdout.flush()
    from harness.search.fuzz import FuzzInterrupted, fuzz

    run = RunSettings(runner=runner, profile=args.profile, target=args.target,
                      faults=tuple(faults), examples=examples, device=device,
                      config=args.config, seed_corpus=args.seed_corpus)
    stats: dict = {}
    try:
        with FuzzProgress(args.verb, examples, args.time_budget, stats):
            result = fuzz(config, args.seed, examples, faults, args.target, device,
                          args.time_budget, args.profile,
                          shrink_trace=not getattr(args, "no_shrink", False),
                          found_by=f"blockfuzz {args.verb}", runner=runner,
                          seed_corpus=seed_corpus, stats=stats)
    except FuzzInterrupted as stop:
        return _fuzz_interrupted(args, stop, out_dir, run)
    if args.time_budget is not None:
        print(f"chunk seeds run: {', '.join(map(str, result.chunk_seeds))}")
    if getattr(args, "coverage", False):
        print_coverage(result.coverage, result.coverage_examples,
                       f"behaviour coverage: seed {args.seed}, search only", runner, config)
    if result.violation is None:
        print(f"PASS: {_examples_text(result)}, {_rate_text(result)}; no invariant violated")
        return EXIT_OK
    print(f"FAIL: {result.violation.line()}")
    if args.target == "vllm":
        print(f"ran on: {_vllm_mode_text(result.trace.config)}")
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


class FuzzProgress:
    """Progress of a running search, from another thread, on stderr (stdout keeps
    the report): on a terminal a live line (examples done of the total, steps,
    steps/s, elapsed), redrawn twice a second and gone at the end; piped (a CI
    log), the same as a plain line every :attr:`PLAIN_EVERY_S` seconds.  Reads
    the search's ``stats`` dict (``completed``, ``steps``)."""

    PLAIN_EVERY_S = 30.0

    def __init__(self, verb: str, examples: int | None, budget_s: float | None, stats: dict):
        import threading

        self.verb, self.examples, self.budget_s, self.stats = verb, examples, budget_s, stats
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.start = 0.0

    def line(self) -> str:
        import time

        elapsed = time.perf_counter() - self.start
        done, steps = self.stats.get("completed", 0), self.stats.get("steps", 0)
        of = f"/{self.examples}" if self.examples else f" ({self.budget_s:g} s budget)"
        return (f"{self.verb}: {done}{of} examples, {steps} steps "
                f"({steps / max(elapsed, 1e-9):.0f} steps/s), {elapsed:.0f} s")

    def __enter__(self):
        import time

        self.start = time.perf_counter()
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(timeout=5)
        return False

    def _run(self) -> None:
        if sys.stderr.isatty():
            from rich.console import Console
            from rich.live import Live

            with Live(self.line(), console=Console(stderr=True), transient=True,
                      refresh_per_second=2) as live:
                while not self.stop.wait(0.5):
                    live.update(self.line())
            return
        while not self.stop.wait(self.PLAIN_EVERY_S):
            print(self.line(), file=sys.stderr, flush=True)


def _vllm_mode_text(config, runner: str | None = None) -> str:
    """What the vllm target drives: for one config, the mode line; for drawn ones,
    the rule (each finding names the mode that ran it)."""
    from harness.targets.vllm import (MODE_ENV, installed_version, mode_line, mode_name,
                                      mode_setting)

    if config is not None:
        return mode_line(config)
    if mode_setting() != "auto":
        return f"vLLM {installed_version()}: {mode_name(mode_setting(), runner)} (${MODE_ENV})"
    return (f"vLLM {installed_version()}: {mode_name('runner', runner)} where a drawn config "
            "allows it (see docs/vllm-target.md), else the component adapter")


def print_coverage(counts: dict, examples: dict | None, title: str,
                   runner: str | None = None, config=None) -> None:
    """The coverage table: every feature with its hits (ops, examples), unhit first;
    the summary counts the features this runner / config pinning can reach."""
    from rich.console import Console
    from rich.table import Table

    from harness.search.coverage import reachable, table_rows, unhit

    table = Table(title=title, title_justify="left")
    for col in ("feature", "ops", "examples", "meaning"):
        table.add_column(col, no_wrap=col != "meaning")
    rows = sorted(table_rows(counts, examples, runner), key=lambda r: r[1] > 0)
    for feature, ops, ex, meaning in rows:
        table.add_row(feature, str(ops), "-" if ex is None else str(ex), meaning)
    Console(width=150, soft_wrap=False).print(table)
    missing, total = unhit(counts, runner, config), len(reachable(runner, config))
    print(f"coverage: {total - len(missing)}/{total} reachable features hit"
          + (f"; unhit: {', '.join(missing)}" if missing else ""))


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
    runner = _target_runner(args, args.runner or _fault_runner(faults))
    _check_fault_target(faults, args.target, args.fault)
    if args.release_cache is not None and args.releases is None:
        raise UsageError("--release-cache: only used with --releases (a campaign across "
                         "vLLM releases)")
    pythons = _release_pythons(args) if args.releases is not None else {}
    device = "cpu" if pythons else _select_device(args.device, args.target)
    if args.seed_corpus is not None:
        _seed_corpus(args.seed_corpus)  # every trace usable, or one line naming the file
    extra = {}
    if pythons:
        from harness.tools.bisect import ROOT

        newest = pythons[list(pythons)[-1]]
        extra = dict(release_pythons=pythons, worker_command=(newest, "-m", "harness", "_worker"),
                     worker_env={"PYTHONPATH": str(ROOT)})
    return Campaign(out, args.time_budget, args.workers, (k, n), device, runner, tuple(faults),
                    Path(args.corpus) if args.corpus else None, args.seed_timeout,
                    args.examples_per_seed, args.target, args.max_seeds,
                    seed_corpus=Path(args.seed_corpus) if args.seed_corpus else None, **extra)


DEFAULT_RELEASE_CACHE = Path.home() / ".cache" / "blockfuzz" / "vllm-envs"


def _release_pythons(args) -> dict:
    """nightly --releases: release -> the python of its environment (made now when
    missing), oldest first; one line and exit 2 on anything wrong."""
    from harness.tools.bisect import ENGINES, BisectError, ReleaseEnvs, parse_releases

    if args.target not in ENGINES:
        raise UsageError(f"--releases {args.releases}: campaigns across releases need "
                         f"--target {' or '.join(ENGINES)}")
    engine = ENGINES[args.target]
    if args.device == "cuda":
        raise UsageError(f"--device cuda: the {engine.name} target runs on the CPU; use "
                         "--device cpu or auto")
    try:  # its errors name --releases already
        releases = parse_releases(args.releases, engine.known)
    except BisectError as e:
        raise UsageError(str(e)) from None
    cache = _check_out(args.release_cache or str(DEFAULT_RELEASE_CACHE), "--release-cache")
    try:
        envs = ReleaseEnvs(cache, engine=engine.name)
        return {r: envs.python(r) for r in releases}
    except BisectError as e:
        raise UsageError(f"--releases {args.releases}: {e}") from None


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
          + (f"max_seeds={c.max_seeds} " if c.max_seeds else "")
          + (f"releases={','.join(c.releases)} (searching {c.releases[-1]}) " if c.releases
             else "") + f"out={c.out}")
    if c.target == "vllm" and not c.releases:
        print(_vllm_mode_text(None))
    sys.stdout.flush()
    progress = run(c, tick=_nightly_ticker(args.time_budget), progress=progress)
    _print_campaign(c, progress, args)
    if progress.interrupted:
        return EXIT_INTERRUPTED
    if progress.findings:
        return EXIT_VIOLATION
    return EXIT_INTERNAL if progress.harness_errors else EXIT_OK


def _print_campaign(c, progress, args) -> None:
    """Totals (every run of this DIR), findings with their commands, report paths."""
    from harness.search.nightly import release_note
    from harness.tools.commands import command

    if progress.interrupted:
        print(f"interrupted: {len(progress.seeds) - progress.resumed} seed(s) finished in "
              "this run; the reports cover every finished seed")
    print(f"{len(progress.seeds)} seeds, {progress.examples} examples, {progress.steps} steps "
          f"in {progress.elapsed:.0f} s ({progress.steps / max(progress.elapsed, 1e-9):.0f} "
          f"steps/s), {len(progress.findings)} finding(s), "
          f"{len(progress.harness_errors)} harness error(s)"
          + (f" (totals include {progress.resumed} seeds of earlier runs)"
             if progress.resumed else ""))
    for sig in sorted(progress.findings):
        f = progress.findings[sig]
        print(f"FINDING {sig}: {release_note(c, f)}{f.get('violation', '')}")
        for key in ("replay", "rerun"):
            if f.get(key):
                print(f"  {key}: {f[key]}")
    for sig in sorted(progress.harness_errors):  # blockfuzz's own failures: not findings
        e = progress.harness_errors[sig]
        print(f"HARNESS ERROR {sig}: {e.get('violation', '')}")
        print(f"  rerun: {e['rerun']}")
    from harness.search.coverage import reachable, unhit

    missing, total = unhit(progress.coverage, c.runner), len(reachable(c.runner))
    print(f"coverage: {total - len(missing)}/{total} reachable features hit"
          + (f"; unhit: {', '.join(missing)}" if missing else "")
          + f"; learned: {c.out / 'learned'} (the next campaign's --seed-corpus)")
    print(f"report: {c.out / 'report.json'}  junit: {c.out / 'junit.xml'}")
    if progress.interrupted:
        print("resume: " + command(
            "nightly", time_budget=args.time_budget, workers=args.workers, shard=args.shard,
            out=args.out, corpus=args.corpus if args.corpus else "", runner=args.runner,
            fault=args.fault, seed_timeout=args.seed_timeout,
            examples_per_seed=args.examples_per_seed, max_seeds=args.max_seeds,
            seed_corpus=args.seed_corpus,
            device=args.device, target=None if args.target == "gpu_impl" else args.target,
            releases=args.releases, release_cache=args.release_cache if args.releases else None))


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
