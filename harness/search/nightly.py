"""``blockfuzz nightly``: a time-budgeted, crash-isolated, sharded fuzz campaign.

- **Seed schedule.** Shard K of N runs seeds K, K+N, K+2N, ... (disjoint across
  shards), each seed one fuzz run of :data:`EXAMPLES_PER_SEED` examples with the
  geometry drawn per example.  Every finished seed is appended to
  ``DIR/seeds.log``; a re-run with the same DIR skips the seeds already there
  (resume after an interrupt).
- **Isolation.** Seeds run in long-lived worker subprocesses (``python -m
  harness _worker``) fed one seed at a time over a pipe.  A worker that dies
  (segfault, CUDA error, abort) or passes the per-seed timeout is killed and
  replaced; its seed becomes a ``crash`` finding and the campaign goes on.
- **Findings** are deduplicated by signature, already shrunk by the worker,
  and written atomically to ``DIR/findings/`` and the corpus directory.
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

EXAMPLES_PER_SEED = 25
SEED_TIMEOUT_S = 300.0
CRASH_SEED_ENV = "BLOCKFUZZ_TEST_CRASH_SEED"  # test-only: a worker aborts on this seed


@dataclass
class Campaign:
    """Parameters of one campaign (see :func:`run`)."""

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


@dataclass
class Progress:
    seeds: list = field(default_factory=list)
    findings: dict = field(default_factory=dict)  # signature -> finding record
    steps: int = 0
    examples: int = 0
    crashes: int = 0
    elapsed: float = 0.0


# -- worker side -------------------------------------------------------------------
def worker_main(argv: list[str]) -> int:
    """Run seeds read from stdin (one JSON object a line); answer one JSON line each."""
    spec = json.loads(argv[0])
    target = spec.get("target", "gpu_impl")
    if target == "vllm":
        from harness.targets.vllm import load

        load()  # its environment must be set before Triton is imported
        device = "cpu"
    else:
        from gpu_impl.device import select_device

        device = select_device(spec["device"]).type
    from harness.search.fuzz import fuzz, signature

    crash_seed = os.environ.get(CRASH_SEED_ENV)
    for line in sys.stdin:
        seed = json.loads(line)["seed"]
        if crash_seed is not None and int(crash_seed) == seed:
            os.abort()  # the test-only crash switch
        result = fuzz(None, seed, spec["examples"], spec["faults"], target, device,
                      profile="nightly", found_by=f"blockfuzz nightly seed {seed}",
                      runner=spec["runner"])
        record = {"seed": seed, "examples": result.examples, "steps": result.steps,
                  "seconds": result.seconds, "verdict": "pass"}
        if result.violation is not None:
            record.update(verdict="fail", signature=signature(result.trace),
                          violation=result.violation.line(), trace=result.trace.to_json())
        print(json.dumps(record, sort_keys=True), flush=True)
    return 0


class CampaignMismatch(ValueError):
    """An existing campaign directory was started with other settings."""


class _Worker:
    def __init__(self, spec: dict, stderr_path: Path):
        with stderr_path.open("a", encoding="utf-8") as err:  # crash output lands here
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "harness", "_worker", json.dumps(spec)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True, bufsize=1)
        self.seed: int | None = None
        self.started = 0.0

    def give(self, seed: int) -> None:
        self.seed, self.started = seed, time.monotonic()
        self.proc.stdin.write(json.dumps({"seed": seed}) + "\n")
        self.proc.stdin.flush()

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
    finding = {k: record[k] for k in ("signature", "violation") if k in record}
    finding["seeds"] = [record["seed"]]
    written = c.out / "findings" / f"{sig}.json"
    if "trace" not in record and written.exists():  # resumed: the trace is on disk
        record = dict(record, trace=json.loads(written.read_text(encoding="utf-8")))
    if "trace" in record:
        from harness.core.trace import canonical_json

        text = canonical_json(record["trace"])
        for d in filter(None, (c.out / "findings", c.corpus)):
            write_atomic(Path(d) / f"{sig}.json", text)
        path = c.out / "findings" / f"{sig}.json"
        faults = record["trace"]["meta"].get("faults", [])
        finding["trace"] = str(path)
        target = record["trace"]["meta"].get("target", "gpu_impl")
        finding["replay"] = " ".join(["blockfuzz", "replay", str(path)]
                                     + [a for f in faults for a in ("--fault", f)]
                                     + (["--target", target] if target != "gpu_impl" else []))
    progress.findings[sig] = finding


def _settings(c: Campaign) -> dict:
    return {"shard": list(c.shard), "runner": c.runner, "faults": sorted(c.faults),
            "examples_per_seed": c.examples_per_seed, "target": c.target}


def run(c: Campaign, tick=None) -> Progress:
    """Run the campaign; returns what it saw (also written to ``c.out``).

    tick(elapsed_s, progress) is called about once a second (progress display).
    Raises :class:`CampaignMismatch` when ``c.out`` holds a campaign started with
    other settings (resuming it would mix them).
    """
    c.out.mkdir(parents=True, exist_ok=True)
    settings_path = c.out / "campaign.json"
    if settings_path.exists():
        before = json.loads(settings_path.read_text(encoding="utf-8"))
        before.setdefault("target", "gpu_impl")  # campaigns from before targets were named
        if before != _settings(c):
            raise CampaignMismatch(f"was started with {json.dumps(before, sort_keys=True)}; "
                                   "resume with the same settings or use a new directory")
    else:
        write_atomic(settings_path, json.dumps(_settings(c), sort_keys=True) + "\n")
    log = c.out / "seeds.log"
    progress = Progress()
    for rec in _read_log(log):  # resume: earlier findings and seeds count
        progress.seeds.append(rec["seed"])
        if rec.get("verdict") in ("fail", "crash"):
            _record_finding(c, progress, rec)
    schedule = _seed_schedule(c.shard, set(progress.seeds))
    spec = {"device": c.device, "examples": c.examples_per_seed, "faults": list(c.faults),
            "runner": c.runner, "target": c.target}
    start = time.monotonic()
    sel = selectors.DefaultSelector()
    workers = []

    def spawn():
        w = _Worker(spec, c.out / "workers.log")
        w.give(next(schedule))
        sel.register(w.proc.stdout, selectors.EVENT_READ, w)
        workers.append(w)

    def finish(w, rec):
        progress.seeds.append(rec["seed"])
        progress.steps += rec.get("steps", 0)
        progress.examples += rec.get("examples", 0)
        if rec["verdict"] in ("fail", "crash"):
            _record_finding(c, progress, rec)
        light = {k: v for k, v in rec.items() if k != "trace"}
        with log.open("a", encoding="utf-8") as f:
            f.write(json.dumps(light, sort_keys=True) + "\n")

    def crash(w, why):
        sel.unregister(w.proc.stdout)
        w.kill()
        workers.remove(w)
        progress.crashes += 1
        finish(w, {"seed": w.seed, "verdict": "crash", "signature": f"CRASH-seed{w.seed}",
                   "violation": f"worker {why} on seed {w.seed}; rerun: blockfuzz fuzz --seed "
                                f"{w.seed} --examples {c.examples_per_seed}"
                                + "".join(f" --fault {f}" for f in c.faults)})

    for _ in range(c.workers):
        spawn()
    try:
        while workers:
            remaining = c.time_budget_s - (time.monotonic() - start)
            for key, _ in sel.select(timeout=1.0):
                w = key.data
                line = w.proc.stdout.readline()
                if not line:
                    crash(w, f"exited with code {w.proc.wait()}")
                    if remaining > 0:
                        spawn()
                    continue
                finish(w, json.loads(line))
                if remaining > 0:
                    w.give(next(schedule))
                else:
                    sel.unregister(w.proc.stdout)
                    w.kill()
                    workers.remove(w)
            for w in list(workers):
                if time.monotonic() - w.started > c.seed_timeout_s:
                    crash(w, f"hung past {c.seed_timeout_s:g} s")
                    if c.time_budget_s - (time.monotonic() - start) > 0:
                        spawn()
            if tick is not None:
                tick(time.monotonic() - start, progress)
    finally:
        for w in workers:
            w.kill()
    progress.elapsed = time.monotonic() - start
    write_reports(c, progress)
    return progress


# -- reports -----------------------------------------------------------------------
def _versions() -> dict:
    from importlib import metadata

    out = {"python": platform.python_version()}
    for pkg in ("blockfuzz", "torch", "triton", "hypothesis", "numpy", "vllm"):
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
                     "examples_per_seed": c.examples_per_seed, "target": c.target},
        "versions": _versions(), "git_commit": _git_commit(),
        "seeds_run": sorted(p.seeds), "steps": p.steps, "examples": p.examples,
        "seconds": round(elapsed, 3), "steps_per_s": round(p.steps / elapsed, 2) if elapsed else 0,
        "crashes": p.crashes,
        "findings": [p.findings[k] for k in sorted(p.findings)],
    }
    write_atomic(c.out / "report.json", json.dumps(report, indent=1, sort_keys=True) + "\n")
    suite = ET.Element("testsuite", name="blockfuzz-nightly", tests=str(len(p.findings) + 1),
                       failures=str(len(p.findings)), time=f"{elapsed:.3f}")
    case = ET.SubElement(suite, "testcase", classname="blockfuzz.nightly", name="campaign")
    if p.findings:
        ET.SubElement(case, "failure", message=f"{len(p.findings)} finding(s)")
    for sig in sorted(p.findings):
        f = p.findings[sig]
        tc = ET.SubElement(suite, "testcase", classname="blockfuzz.findings", name=sig)
        ET.SubElement(tc, "failure", message=f.get("violation", sig)).text = f.get("replay", "")
    write_atomic(c.out / "junit.xml", ET.tostring(suite, encoding="unicode") + "\n")
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        _append_summary(summary, p, elapsed)


def _append_summary(summary: str, p: Progress, elapsed: float) -> None:
    """Markdown for the GitHub job page; a failure to write it only warns."""
    lines = [f"## blockfuzz nightly: {len(p.findings)} finding(s)", "",
             f"{len(p.seeds)} seeds, {p.steps} steps in {elapsed:.0f} s", "",
             "| signature | violation | replay |", "|---|---|---|"]
    lines += [f"| {s} | {p.findings[s].get('violation', '')} | "
              f"`{p.findings[s].get('replay', '')}` |" for s in sorted(p.findings)]
    try:
        with open(summary, "a", encoding="utf-8") as fh:
            fh.write("\n".join(lines) + "\n")
    except OSError as e:
        print(f"warning: cannot append to $GITHUB_STEP_SUMMARY ({summary}): "
              f"{e.strerror or e}", file=sys.stderr)
