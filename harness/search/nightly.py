"""``blockfuzz nightly``: a time-budgeted, crash-isolated, sharded fuzz campaign.

- **Seed schedule.** Shard K of N runs seeds K, K+N, K+2N, ... (disjoint across
  shards), each seed one fuzz run of :data:`EXAMPLES_PER_SEED` examples with the
  geometry drawn per example.  Every finished seed is appended to
  ``DIR/seeds.log``; a re-run with the same DIR skips the seeds already there
  (resume after an interrupt; totals count every run).  ``max_seeds`` bounds
  a run by seeds instead of (or as well as) time.
- **Isolation.** Seeds run in long-lived worker subprocesses (``python -m
  harness _worker``, or ``Campaign.worker_command``) fed one seed at a time
  over a pipe.  A worker that dies
  (segfault, CUDA error, abort) or passes the per-seed timeout is killed and
  replaced; its seed becomes a **harness error** (``CRASH-seedN``), counted
  and reported apart from the engine findings (``report.json``
  ``harness_errors``, a JUnit ``<error>``, exit 3 when it is all there is), and
  the campaign goes on.  Every finding and harness error carries the ``blockfuzz fuzz`` command that re-runs its seed
  (``rerun``) and, when it has a trace, the ``replay`` command
  (:mod:`harness.tools.commands`).
- **Findings** are deduplicated by signature, already shrunk by the worker,
  and written atomically to ``DIR/findings/`` and the corpus directory.
- **Coverage and what it learns.** Each seed reports its behaviour-coverage
  counts (:mod:`harness.search.coverage`) and, per feature, the shortest op
  prefix that first hit it; ``report.json`` has the campaign's counts and
  the features nothing hit.  ``DIR/learned/`` holds the findings' traces and
  the prefixes of the :data:`LEARNED_PREFIXES` rarest features hit: pass it
  as ``--seed-corpus`` to the next campaign, whose examples may then start
  from them (:mod:`harness.search.corpus`).  A campaign snapshots its seed
  corpus into ``DIR/seed-corpus/`` when it starts, so every seed of it —
  and its ``rerun`` command — sees the same corpus.
- **Across releases** (``--target vllm --releases A..B|X,Y,Z``). The campaign
  searches the newest listed release (its workers run in that release's
  environment, :class:`harness.tools.bisect.ReleaseEnvs`), then replays every
  finding's shrunk trace on each older release; a finding is marked
  ``new_in_newest`` when every older release that could run it passes it
  (a regression), false when one fails it, None when none could run it.
- **Reports.** ``DIR/report.json``, ``DIR/junit.xml`` (one test case per
  finding signature plus one for the campaign) and a Markdown summary appended
  to ``$GITHUB_STEP_SUMMARY`` when set.  A progress bar on a terminal, plain
  periodic lines when piped.
"""

from __future__ import annotations

import json
import os
import platform
import selectors
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from harness.core.trace import write_atomic
from harness.search.coverage import features_of, unhit
from harness.tools.commands import RunSettings, command

EXAMPLES_PER_SEED = 25
LEARNED_PREFIXES = 8  # coverage-rarest prefixes kept in DIR/learned
SEED_TIMEOUT_S = 300.0
PROFILE = "nightly"  # the Hypothesis profile every seed runs under
WORKER_COMMAND = (sys.executable, "-m", "harness", "_worker")  # + the spec as JSON


@dataclass
class Campaign:
    """Parameters of one campaign (see :func:`run`).

    worker_command: the worker program; the parent appends the worker spec
    (JSON) as its last argument.  max_seeds: stop handing out seeds after this
    many in this run (None: only the time budget bounds the run).
    """

    out: Path
    time_budget_s: float
    workers: int = 1
    shard: tuple[int, int] = (0, 1)
    device: str = "auto"
    runner: str | None = None
    faults: tuple[str, ...] = ()
    corpus: Path | None = None
    seed_timeout_s: float = SEED_TIMEOUT_S
    examples_per_seed: int = EXAMPLES_PER_SEED
    target: str = "gpu_impl"
    max_seeds: int | None = None
    worker_command: tuple[str, ...] = WORKER_COMMAND
    seed_corpus: Path | None = None  # traces to snapshot into DIR/seed-corpus at the start
    release_pythons: dict = field(default_factory=dict)  # release -> python, oldest first
    worker_env: dict = field(default_factory=dict)  # added to the workers' environment

    @property
    def program(self) -> str:
        """What runs blockfuzz for this campaign's commands: the newest release's
        environment in a campaign across releases."""
        if not self.release_pythons:
            return "blockfuzz"
        from harness.tools.bisect import ROOT

        return command(None, "env", f"PYTHONPATH={ROOT}",
                       self.release_pythons[self.releases[-1]], "-m", "harness", program="")

    @property
    def releases(self) -> list[str]:
        """The releases a campaign across releases covers, oldest first (else [])."""
        return list(self.release_pythons)

    @property
    def corpus_snapshot(self) -> Path | None:
        """Where this campaign's seed corpus lives (None: it has none)."""
        return self.out / "seed-corpus" if self.seed_corpus is not None else None

    def run_settings(self, faults=None, target=None) -> RunSettings:
        """What a seed of this campaign ran with (for the commands a report prints)."""
        return RunSettings(runner=self.runner, profile=PROFILE, program=self.program,
                           target=target or self.target,
                           faults=tuple(self.faults if faults is None else faults),
                           examples=self.examples_per_seed, device=self.device,
                           seed_corpus=str(self.corpus_snapshot) if self.corpus_snapshot
                           else None)


@dataclass
class Progress:
    """Campaign totals: earlier runs of the same DIR (resumed) included.

    ``resumed`` counts the seeds an earlier run finished; ``elapsed`` is the
    wall time of every run together; ``interrupted`` is set on Ctrl-C.
    """

    seeds: list = field(default_factory=list)
    findings: dict = field(default_factory=dict)  # signature -> finding record
    harness_errors: dict = field(default_factory=dict)  # CRASH-seedN -> record (no finding)
    steps: int = 0
    examples: int = 0
    crashes: int = 0
    elapsed: float = 0.0
    resumed: int = 0
    interrupted: bool = False
    coverage: dict = field(default_factory=dict)  # feature -> ops that hit it
    coverage_examples: dict = field(default_factory=dict)  # feature -> examples
    prefixes: dict = field(default_factory=dict)  # feature -> shortest prefix (trace JSON)


# -- worker side -------------------------------------------------------------------
def run_seed(spec: dict, seed: int, device: str, seed_corpus=()) -> dict:
    """One seed of a campaign in this process: its record for the parent."""
    from harness.search import fuzz as search
    from harness.search.corpus import prefix_trace

    found_by = f"blockfuzz nightly seed {seed}"
    result = search.fuzz(None, seed, spec["examples"], spec["faults"], spec["target"], device,
                         profile=PROFILE, found_by=found_by, runner=spec["runner"],
                         seed_corpus=seed_corpus)
    record = {"seed": seed, "examples": result.examples, "steps": result.steps,
              "seconds": result.seconds, "verdict": "pass",
              "coverage": result.coverage, "coverage_examples": result.coverage_examples,
              "prefixes": {f: prefix_trace(cfg, ops, f, found_by).to_json()
                           for f, (cfg, ops) in sorted(result.prefixes.items())}}
    if result.violation is not None:
        record.update(verdict="fail", signature=search.signature(result.trace),
                      violation=result.violation.line(), trace=result.trace.to_json())
    return record


def worker_main(argv: list[str]) -> int:
    """Run seeds read from stdin (one JSON object a line); answer one JSON line each.

    argv[-1] is the spec (JSON).  Ctrl-C or a closed pipe ends the worker
    quietly (exit 130 / 0): the parent owns the campaign's reports.
    """
    spec = dict({"target": "gpu_impl"}, **json.loads(argv[-1]))
    try:
        if spec["target"] == "vllm":
            from harness.targets.vllm import load

            load()  # its environment must be set before Triton is imported
            device = "cpu"
        else:
            from gpu_impl.device import select_device

            device = select_device(spec["device"]).type
        seed_corpus = []
        if spec.get("seed_corpus"):
            from harness.search.corpus import load_dir

            seed_corpus = load_dir(spec["seed_corpus"])
        for line in sys.stdin:
            record = run_seed(spec, json.loads(line)["seed"], device, seed_corpus)
            print(json.dumps(record, sort_keys=True), flush=True)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    return 0


class CampaignMismatch(ValueError):
    """An existing campaign directory was started with other settings."""


class _Worker:
    """One worker subprocess, in its own session: a terminal's Ctrl-C reaches only
    the parent, which kills its workers (no tracebacks in their logs)."""

    def __init__(self, command: tuple[str, ...], spec: dict, stderr_path: Path,
                 env: dict | None = None):
        self.stderr_path = stderr_path  # this worker's own: a crash's traceback is its tail
        stderr_path.parent.mkdir(parents=True, exist_ok=True)
        with stderr_path.open("a", encoding="utf-8") as err:  # crash output lands here
            self.proc = subprocess.Popen(
                [*command, json.dumps(spec)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=err, text=True, bufsize=1, start_new_session=True,
                env=dict(os.environ, **env) if env else None)
        self.seed: int | None = None
        self.started = 0.0

    def give(self, seed: int) -> None:
        self.seed, self.started = seed, time.monotonic()
        self.proc.stdin.write(json.dumps({"seed": seed}) + "\n")
        self.proc.stdin.flush()

    def stderr_tail(self, lines: int = 20) -> list[str]:
        """The last ``lines`` non-empty lines this worker wrote to stderr."""
        try:
            text = self.stderr_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return []
        return [x for x in text.splitlines() if x.strip()][-lines:]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


# -- parent side -------------------------------------------------------------------
def _seed_schedule(shard: tuple[int, int], done: set[int]):
    k, n = shard
    j = 0
    while True:
        seed = k + j * n
        j += 1
        if seed not in done:
            yield seed


def _read_log(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut by an interrupt: that seed simply runs again
    return out


def _record_finding(c: Campaign, progress: Progress, record: dict) -> None:
    sig = record["signature"]
    if sig in progress.findings:
        progress.findings[sig]["seeds"].append(record["seed"])
        return
    finding = {k: record[k] for k in ("signature", "violation", "stderr_tail", "worker_log")
               if k in record}
    finding["seeds"] = [record["seed"]]
    finding["rerun"] = c.run_settings().fuzz(record["seed"])
    written = c.out / "findings" / f"{sig}.json"
    if "trace" not in record and written.exists():  # resumed: the trace is on disk
        record = dict(record, trace=json.loads(written.read_text(encoding="utf-8")))
    if "trace" in record:
        from harness.core.trace import canonical_json

        text = canonical_json(record["trace"])
        for d in filter(None, (c.out / "findings", c.corpus)):
            write_atomic(Path(d) / f"{sig}.json", text)
        meta = record["trace"]["meta"]
        finding["trace"] = str(written)
        finding["replay"] = c.run_settings(meta.get("faults", []), meta.get("target")) \
            .on_trace("replay", written)
    progress.findings[sig] = finding


def _settings(c: Campaign) -> dict:
    return {"shard": list(c.shard), "runner": c.runner, "faults": sorted(c.faults),
            "examples_per_seed": c.examples_per_seed, "target": c.target,
            "seed_corpus": str(c.seed_corpus) if c.seed_corpus is not None else None,
            "releases": c.releases or None}


def prepare(c: Campaign) -> Progress:
    """Create or resume ``c.out``: the totals of the seeds already finished there.

    Raises :class:`CampaignMismatch` (nothing written) when ``c.out`` holds a
    campaign started with other settings (resuming it would mix them).
    """
    settings_path = c.out / "campaign.json"
    if settings_path.exists():
        before = json.loads(settings_path.read_text(encoding="utf-8"))
        before.setdefault("target", "gpu_impl")  # campaigns from before targets were named
        before.setdefault("seed_corpus", None)  # ... and before seed corpora
        before.setdefault("releases", None)  # ... and before campaigns across releases
        if before != _settings(c):
            raise CampaignMismatch(f"was started with {json.dumps(before, sort_keys=True)}; "
                                   "resume with the same settings or use a new directory")
    else:
        c.out.mkdir(parents=True, exist_ok=True)
        if c.seed_corpus is not None:  # the snapshot every seed of this campaign reads
            from harness.search.corpus import load_dir, write_dir

            write_dir(c.corpus_snapshot, {f"{i:04d}": t.to_json()
                                          for i, t in enumerate(load_dir(c.seed_corpus))})
        write_atomic(settings_path, json.dumps(_settings(c), sort_keys=True) + "\n")
    progress = Progress()
    for path in sorted((c.out / "prefixes").glob("*.json")):  # resume: shortest so far
        obj = json.loads(path.read_text(encoding="utf-8"))
        progress.prefixes[obj["meta"]["coverage_prefix"]] = obj
    for rec in _read_log(c.out / "seeds.log"):  # resume: earlier seeds and totals count
        _count(c, progress, rec)
        progress.elapsed = max(progress.elapsed, rec.get("elapsed", 0.0))
    progress.resumed = len(progress.seeds)
    return progress


def _count(c: Campaign, progress: Progress, rec: dict) -> None:
    progress.seeds.append(rec["seed"])
    progress.steps += rec.get("steps", 0)
    progress.examples += rec.get("examples", 0)
    progress.crashes += rec["verdict"] == "crash"
    for key in ("coverage", "coverage_examples"):
        total = getattr(progress, key)
        for f, n in rec.get(key, {}).items():
            total[f] = total.get(f, 0) + n
    if rec["verdict"] == "fail":
        _record_finding(c, progress, rec)
    elif rec["verdict"] == "crash":  # blockfuzz's own failure (or the worker's): not a finding
        error = {k: rec[k] for k in ("signature", "violation", "stderr_tail", "worker_log")
                 if k in rec}
        progress.harness_errors[rec["signature"]] = dict(
            error, seeds=[rec["seed"]], rerun=c.run_settings().fuzz(rec["seed"]))


def _keep_prefixes(c: Campaign, progress: Progress, prefixes: dict) -> None:
    """Keep each feature's shortest prefix (ties: the one seen first), on disk too."""
    for f, obj in sorted(prefixes.items()):
        mine = progress.prefixes.get(f)
        if mine is None or len(obj["ops"]) < len(mine["ops"]):
            from harness.core.trace import canonical_json

            progress.prefixes[f] = obj
            write_atomic(c.out / "prefixes" / f"{_file_safe(f)}.json", canonical_json(obj))


def _file_safe(feature: str) -> str:
    return feature.replace(":", "-")


def _write_learned(c: Campaign, p: Progress) -> dict:
    """DIR/learned: the findings' traces and the prefixes of the rarest features hit
    (fewest examples; ties by name).  Returns what report.json says about it."""
    from harness.core.trace import canonical_json

    learned = c.out / "learned"
    learned.mkdir(parents=True, exist_ok=True)
    for old in learned.glob("*.json"):
        old.unlink()
    rarest = sorted(p.prefixes, key=lambda f: (p.coverage_examples.get(f, 0), f))
    rarest = rarest[:LEARNED_PREFIXES]
    for f in rarest:
        write_atomic(learned / f"prefix-{_file_safe(f)}.json", canonical_json(p.prefixes[f]))
    findings = sorted((c.out / "findings").glob("*.json"))
    for path in findings:
        write_atomic(learned / f"finding-{path.name}", path.read_text(encoding="utf-8"))
    return {"dir": str(learned), "prefixes": rarest, "findings": len(findings)}


class _Pool:
    """The parent's worker pool for one run of a campaign."""

    def __init__(self, c: Campaign, progress: Progress):
        self.c, self.progress = c, progress
        self.schedule = _seed_schedule(c.shard, set(progress.seeds))
        self.spec = {"device": c.device, "examples": c.examples_per_seed,
                     "faults": list(c.faults), "runner": c.runner, "target": c.target,
                     "seed_corpus": str(c.corpus_snapshot) if c.corpus_snapshot else None}
        self.sel = selectors.DefaultSelector()
        self.workers: list[_Worker] = []
        self.handed = 0  # seeds handed out in this run
        self.spawned = 0  # workers started in this run (each logs to workers/worker-N.log)
        self.start = time.monotonic()
        self.before = progress.elapsed  # wall time of earlier runs

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def more(self) -> bool:
        """May another seed be handed out?"""
        c = self.c
        return self.elapsed() < c.time_budget_s and (c.max_seeds is None
                                                     or self.handed < c.max_seeds)

    def give(self, w: _Worker) -> None:
        self.handed += 1
        w.give(next(self.schedule))

    def spawn(self) -> None:
        self.spawned += 1
        w = _Worker(self.c.worker_command, self.spec,
                    self.c.out / "workers" / f"worker-{self.spawned}.log", self.c.worker_env)
        self.give(w)
        self.sel.register(w.proc.stdout, selectors.EVENT_READ, w)
        self.workers.append(w)

    def retire(self, w: _Worker) -> None:
        self.sel.unregister(w.proc.stdout)
        w.kill()
        self.workers.remove(w)

    def finish(self, rec: dict) -> None:
        rec["elapsed"] = round(self.before + self.elapsed(), 3)  # campaign time, all runs
        _keep_prefixes(self.c, self.progress, rec.pop("prefixes", {}))
        _count(self.c, self.progress, rec)
        light = {k: v for k, v in rec.items() if k != "trace"}
        with (self.c.out / "seeds.log").open("a", encoding="utf-8") as f:
            f.write(json.dumps(light, sort_keys=True) + "\n")

    def crash(self, w: _Worker, why: str) -> None:
        self.retire(w)
        tail = w.stderr_tail()
        last = f": {tail[-1].strip()}" if tail else ""
        self.finish({"seed": w.seed, "verdict": "crash", "signature": f"CRASH-seed{w.seed}",
                     "violation": f"worker {why} on seed {w.seed}{last}",
                     "stderr_tail": tail, "worker_log": str(w.stderr_path)})
        if self.more():
            self.spawn()

    def answer(self, w: _Worker) -> None:
        line = w.proc.stdout.readline()
        if not line:
            self.crash(w, f"exited with code {w.proc.wait()}")
            return
        self.finish(json.loads(line))
        if self.more():
            self.give(w)
        else:
            self.retire(w)

    def loop(self, tick) -> None:
        for _ in range(min(self.c.workers, self.c.max_seeds or self.c.workers)):
            self.spawn()
        while self.workers:
            if tick is not None:
                tick(self.elapsed(), self.progress)
            for key, _ in self.sel.select(timeout=1.0):
                self.answer(key.data)
            for w in list(self.workers):
                if time.monotonic() - w.started > self.c.seed_timeout_s:
                    self.crash(w, f"hung past {self.c.seed_timeout_s:g} s")


def run(c: Campaign, tick=None, progress: Progress | None = None) -> Progress:
    """Run the campaign; returns what it saw (also written to ``c.out``).

    progress: from :func:`prepare` (called here when None).  tick(elapsed_s,
    progress) is called right away and then about once a second (elapsed_s:
    this run's wall time).  Ctrl-C stops
    the run: workers are killed, the reports cover the finished seeds, and
    ``interrupted`` is set (re-running with the same DIR resumes).
    """
    progress = prepare(c) if progress is None else progress
    pool = _Pool(c, progress)
    try:
        pool.loop(tick)
    except KeyboardInterrupt:
        progress.interrupted = True
    finally:
        for w in pool.workers:
            w.kill()
    progress.elapsed = pool.before + pool.elapsed()
    if c.releases and not progress.interrupted:
        judge_releases(c, progress)
    write_reports(c, progress)
    return progress


def judge_releases(c: Campaign, p: Progress, measure=None) -> None:
    """Replay each finding's trace on every older release of ``c.releases``.

    Sets, per finding with a trace: ``by_release`` (release -> verdict dict;
    the newest is the finding itself) and ``new_in_newest`` (True: every older
    release that ran it passed — a regression of the newest; False: an older
    one fails it too; None: no older release could run it).  measure(python,
    paths) -> one verdict per path (default: a ``_verdicts`` subprocess).
    A release whose measurement fails marks its verdicts ``error``.
    """
    import functools

    from harness.tools.bisect import ENGINES, BisectError, measure_in

    measure = measure or functools.partial(
        measure_in, engine=c.target if c.target in ENGINES else "vllm")
    *older, newest = c.releases
    found = [f for f in p.findings.values() if f.get("trace")]
    if not found:
        return
    paths = [f["trace"] for f in found]
    measured = {}
    for release in older:
        try:
            measured[release] = measure(c.release_pythons[release], paths)
        except BisectError as e:
            measured[release] = [{"verdict": "error", "reason": str(e)}] * len(paths)
    for i, f in enumerate(found):
        by = {r: measured[r][i] for r in older}
        by[newest] = {"verdict": "fail", "violation": f.get("violation", "")}
        ran = [v for r, v in by.items() if r != newest and v["verdict"] in ("pass", "fail")]
        f["by_release"] = by
        f["new_in_newest"] = None if not ran else all(v["verdict"] == "pass" for v in ran)


# -- reports -----------------------------------------------------------------------
def _versions() -> dict:
    from importlib import metadata

    out = {"python": platform.python_version()}
    for pkg in ("blockfuzz", "torch", "triton", "hypothesis", "numpy", "vllm", "sglang"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def _git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parent, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def write_reports(c: Campaign, p: Progress) -> None:
    """report.json, junit.xml and the GitHub step summary."""
    elapsed = p.elapsed
    report = {
        "campaign": {"time_budget_s": c.time_budget_s, "workers": c.workers,
                     "shard": f"{c.shard[0]}/{c.shard[1]}", "device": c.device,
                     "runner": c.runner or "drawn", "faults": list(c.faults),
                     "examples_per_seed": c.examples_per_seed, "target": c.target,
                     "max_seeds": c.max_seeds, "releases": c.releases or None},
        "interrupted": p.interrupted, "resumed_seeds": p.resumed,
        "versions": _versions(), "git_commit": _git_commit(),
        "seeds_run": sorted(p.seeds), "steps": p.steps, "examples": p.examples,
        "seconds": round(elapsed, 3), "steps_per_s": round(p.steps / elapsed, 2) if elapsed else 0,
        "crashes": p.crashes,
        "findings": [p.findings[k] for k in sorted(p.findings)],
        "harness_errors": [p.harness_errors[k] for k in sorted(p.harness_errors)],
        "coverage": {f: {"ops": p.coverage.get(f, 0), "examples": p.coverage_examples.get(f, 0)}
                     for f in features_of(c.runner)},
        "coverage_unhit": unhit(p.coverage, c.runner),
        "seed_corpus": str(c.corpus_snapshot) if c.corpus_snapshot else None,
        "learned": _write_learned(c, p),
    }
    write_atomic(c.out / "report.json", json.dumps(report, indent=1, sort_keys=True) + "\n")
    # JUnit tells them apart: an engine finding is a <failure>, a harness error an <error>.
    suite = ET.Element("testsuite", name="blockfuzz-nightly",
                       tests=str(len(p.findings) + len(p.harness_errors) + 1),
                       failures=str(len(p.findings)), errors=str(len(p.harness_errors)),
                       time=f"{elapsed:.3f}")
    case = ET.SubElement(suite, "testcase", classname="blockfuzz.nightly", name="campaign")
    if p.findings:
        ET.SubElement(case, "failure", message=f"{len(p.findings)} finding(s)")
    for sig in sorted(p.findings):
        f = p.findings[sig]
        tc = ET.SubElement(suite, "testcase", classname="blockfuzz.findings", name=sig)
        ET.SubElement(tc, "failure", message=release_note(c, f) + f.get("violation", sig)) \
            .text = _commands(f)
    for sig in sorted(p.harness_errors):
        e = p.harness_errors[sig]
        tc = ET.SubElement(suite, "testcase", classname="blockfuzz.harness_errors", name=sig)
        ET.SubElement(tc, "error", message=e.get("violation", sig)).text = _commands(e)
    write_atomic(c.out / "junit.xml", ET.tostring(suite, encoding="unicode") + "\n")
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        _append_summary(summary, c, p, elapsed)


def release_note(c: Campaign, finding: dict) -> str:
    """``"NEW in R: "`` / ``"also on R1, R2: "`` / ``""`` for a finding of a
    campaign across releases (what :func:`judge_releases` decided)."""
    if not c.releases or "new_in_newest" not in finding:
        return ""
    if finding["new_in_newest"]:
        return f"NEW in {c.releases[-1]}: "
    if finding["new_in_newest"] is None:
        return f"no older release could replay it ({', '.join(c.releases[:-1])}): "
    also = [r for r, v in finding["by_release"].items() if v["verdict"] == "fail"
            and r != c.releases[-1]]
    return f"also fails on {', '.join(also)}: "


def _commands(finding: dict) -> str:
    """The replay (of the shrunk trace) and rerun (of the seed) lines of a finding."""
    return "\n".join(f"{k}: {finding[k]}" for k in ("replay", "rerun") if finding.get(k))


def _append_summary(summary: str, c: Campaign, p: Progress, elapsed: float) -> None:
    """Markdown for the GitHub job page; a failure to write it only warns."""
    lines = [f"## blockfuzz nightly: {len(p.findings)} finding(s)", "",
             f"{len(p.seeds)} seeds, {p.steps} steps in {elapsed:.0f} s", "",
             "| signature | violation | replay |", "|---|---|---|"]
    lines += [f"| {s} | {release_note(c, p.findings[s])}{p.findings[s].get('violation', '')} | "
              f"`{p.findings[s].get('replay') or p.findings[s]['rerun']}` |"
              for s in sorted(p.findings)]
    try:
        with open(summary, "a", encoding="utf-8") as fh:
            fh.write("\n".join(lines) + "\n")
    except OSError as e:
        print(f"warning: cannot append to $GITHUB_STEP_SUMMARY ({summary}): "
              f"{e.strerror or e}", file=sys.stderr)
