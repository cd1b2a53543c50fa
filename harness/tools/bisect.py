"""``blockfuzz bisect``: which engine release changed a trace's verdict.

A trace that fails on one release and passes on another raises an engine
developer's next question: which release changed it?  :func:`bisect` answers
it by binary search over an ordered list of releases, measuring only the
releases it needs: both ends, then the middle of the interval whose ends
disagree, until two neighbours disagree.  Nine releases take at most five
measurements (both ends and three probes), and none is measured twice.

A measurement replays every trace on one release (``--target vllm``, no
faults) and gives one verdict per trace: ``pass``, ``fail`` (invariant, op)
or ``n/a`` (the release refuses the trace's geometry, or the trace passes but
the fault it was recorded for lived in code the vllm target does not run as
vLLM's: :func:`harness.targets.vllm.unexercised`).  Releases are compared
by (verdict, invariant) of every trace.

Each release runs in its own environment (:class:`ReleaseEnvs`): the
interpreter running blockfuzz when its installed vLLM is that release,
otherwise a virtual environment under the cache directory, made once and
reused.  It is an *overlay* on the current environment: its ``.pth`` puts
the current environment's packages (torch, Triton, blockfuzz's
dependencies) behind its own, so installing a release
(``scripts/install-vllm-target.sh``) adds vLLM itself and little else.
Measurements run in a subprocess with this checkout on ``PYTHONPATH``
(``python -m harness _verdicts TRACE...``, one JSON line of verdicts).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

# vLLM releases on the package index between 0.26.0 and 0.33.0 (all pin the same
# torch); ``A..B`` ranges are taken from this list.
KNOWN_RELEASES = ("0.26.0", "0.27.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0",
                  "0.32.0", "0.33.0")
ROOT = Path(__file__).resolve().parents[2]
INSTALL_SCRIPT = ROOT / "scripts" / "install-vllm-target.sh"


@dataclass(frozen=True)
class Engine:
    """An engine whose releases blockfuzz installs and replays: ``name`` is its
    target and its package's name, ``known`` the releases ``A..B`` ranges are
    taken from, ``script`` its install script, ``default`` the range ``bisect``
    searches without ``--releases``."""

    name: str
    title: str
    known: tuple
    script: Path
    default: str


ENGINES = {
    "vllm": Engine("vllm", "vLLM", KNOWN_RELEASES, INSTALL_SCRIPT, "0.26.0..0.33.0"),
    # SGLang releases the sglang target drives (the scheduler's allocation and
    # release paths of 0.5.20 and later; measured on 0.5.20 and 0.5.23).
    "sglang": Engine("sglang", "SGLang", ("0.5.20", "0.5.21", "0.5.22", "0.5.23"),
                     ROOT / "scripts" / "install-sglang-target.sh", "0.5.20..0.5.23"),
}


def engine_of(traces) -> Engine:
    """The engine a set of traces is replayed on: SGLang for token-slot traces
    (runner ``sglang``), vLLM for block-table ones; mixing them is a
    :class:`BisectError`."""
    kinds = {t.config.runner == "sglang" for t in traces}
    if len(kinds) > 1:
        raise BisectError("traces: token-slot (SGLang) and block-table (vLLM) traces mixed; "
                          "bisect them separately")
    return ENGINES["sglang" if kinds == {True} else "vllm"]


class BisectError(ValueError):
    """Bad releases or an environment that could not be made: one line."""


def _version(text: str):
    """``text`` as a Version; a release must be spelled as the package index
    spells it (``0.26.0``: three components, no ``v``)."""
    from packaging.version import InvalidVersion, Version

    try:
        version = Version(text)
    except InvalidVersion:
        raise BisectError(f"--releases: {text!r} is not a version") from None
    if str(version) != text or len(version.release) < 3:
        raise BisectError(f"--releases: {text!r} is not a release as the package index "
                          "spells it (X.Y.Z, e.g. 0.26.0)")
    return version


def parse_releases(text: str, known=KNOWN_RELEASES) -> list[str]:
    """``A..B`` (the known releases from A to B, both known) or ``X,Y,Z`` (any
    versions); returned in version order, at least two, no repeats."""
    if ".." in text:
        lo, hi = (part.strip() for part in text.split("..", 1))
        for end in (lo, hi):
            if end not in known:
                raise BisectError(f"--releases {text}: {end} is not a known release "
                                  f"({', '.join(known)}); list releases as X,Y,Z instead")
        if _version(lo) >= _version(hi):
            raise BisectError(f"--releases {text}: {lo} is not older than {hi}")
        chosen = [r for r in known if _version(lo) <= _version(r) <= _version(hi)]
    else:
        chosen = [r.strip() for r in text.split(",") if r.strip()]
        for r in chosen:
            _version(r)
        if len({_version(r) for r in chosen}) != len(chosen):
            raise BisectError(f"--releases {text}: a release is listed twice")
    chosen = sorted(chosen, key=_version)
    if len(chosen) < 2:
        raise BisectError(f"--releases {text}: need at least two releases")
    return chosen


def verdict_key(verdicts: list[dict]) -> tuple:
    """What two releases are compared by: (verdict, invariant) per trace."""
    return tuple((v["verdict"], v.get("invariant")) for v in verdicts)


@dataclass
class BisectResult:
    """``measured``: release -> per-trace verdicts, for the releases run (in
    the order run); ``change``: (last release with the old verdict, first
    with the new one), None when both ends agree."""

    releases: list
    measured: dict = field(default_factory=dict)
    change: tuple | None = None

    @property
    def first_changed(self) -> str | None:
        return None if self.change is None else self.change[1]


def bisect(releases: list[str], measure, every: bool = False) -> BisectResult:
    """Binary search for the first release whose verdicts differ from the
    oldest's.  measure(release) -> list of per-trace verdict dicts.

    Assumes one change between the ends (the usual fix or regression); when
    the verdict flips more than once, the change found is one of them and
    the releases measured show it.  ``every``: measure every release, oldest
    first, and report the first change between neighbours (no assumption).
    """
    result = BisectResult(list(releases))

    def key(i: int) -> tuple:
        r = releases[i]
        if r not in result.measured:
            result.measured[r] = measure(r)
        return verdict_key(result.measured[r])

    if every:
        keys = [key(i) for i in range(len(releases))]
        changed = [i for i in range(1, len(keys)) if keys[i] != keys[i - 1]]
        if changed:
            result.change = (releases[changed[0] - 1], releases[changed[0]])
        return result
    lo, hi = 0, len(releases) - 1
    if key(lo) == key(hi):
        return result
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if key(mid) == key(lo):
            lo = mid
        else:
            hi = mid
    result.change = (releases[lo], releases[hi])
    return result


# -- environments ----------------------------------------------------------------
def active_release(engine: str = "vllm") -> str | None:
    """The release of ``engine`` installed where blockfuzz runs, or None."""
    from importlib import metadata

    try:
        return metadata.version(engine)
    except metadata.PackageNotFoundError:
        return None


@dataclass
class ReleaseEnvs:
    """One Python per release of ``engine``: the running one when it has that
    release, else a cached overlay venv ``cache/ENGINE-RELEASE`` (made on first
    use; ``installed`` lists the releases installed by this run)."""

    cache: Path
    installed: list = field(default_factory=list)
    engine: str = "vllm"

    def python(self, release: str) -> str:
        if active_release(self.engine) == release:
            return sys.executable
        env = self.cache / f"{self.engine}-{release}"
        python = env / "bin" / "python"
        if (env / ".ready").exists():
            return str(python)
        self._make(env, release)
        return str(python)

    def ready(self, release: str) -> bool:
        """Is ``release`` usable without installing (active, or cached)?"""
        return active_release(self.engine) == release or (
            self.cache / f"{self.engine}-{release}" / ".ready").exists()

    def where(self, release: str) -> str:
        """How a release's environment was had: active, cached or installed."""
        if active_release(self.engine) == release:
            return "active environment"
        return "installed now" if release in self.installed else "cached"

    def _make(self, env: Path, release: str) -> None:
        eng = ENGINES[self.engine]
        print(f"blockfuzz: installing {eng.title} {release} into {env} (once; reused after)",
              file=sys.stderr, flush=True)
        python = str(env / "bin" / "python")
        try:
            _run([sys.executable, "-m", "venv", "--clear", str(env)])
            site = Path(_run([python, "-c", "import sysconfig; "
                              "print(sysconfig.get_paths()['purelib'])"]).strip())
            base = sysconfig.get_paths()["purelib"]
            (site / "_blockfuzz_base.pth").write_text(
                f"import site; site.addsitedir({base!r})\n")
            ready = _run(["bash", str(eng.script), release],
                         {"PYTHON": python, "PYTHONPATH": str(ROOT)})
        except BisectError as e:
            import shutil

            shutil.rmtree(env, ignore_errors=True)  # no half-made environment is left
            raise BisectError(f"{eng.title} {release}: the environment {env} could not be "
                              f"made: {e}") from None
        print("blockfuzz: " + (ready.strip().splitlines() or ["ready"])[-1], file=sys.stderr,
              flush=True)
        (env / ".ready").write_text(release + "\n")
        self.installed.append(release)


def _run(command: list[str], extra_env: dict | None = None) -> str:
    """Run ``command``; its stdout, or BisectError with the last line it printed."""
    try:
        done = subprocess.run(command, capture_output=True, text=True,
                              env=dict(os.environ, **(extra_env or {})))
    except OSError as e:
        raise BisectError(f"{command[0]}: {e.strerror or e}") from None
    if done.returncode != 0:
        last = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-1]
        raise BisectError(f"{' '.join(command[:3])} ... exited {done.returncode}: {last}")
    return done.stdout


def measure_in(python: str, traces: list[str], engine: str = "vllm") -> list[dict]:
    """Per-trace verdicts of ``traces`` replayed by ``python`` (the engine's target)."""
    done = subprocess.run([python, "-m", "harness", "_verdicts", "--engine", engine, *traces],
                          capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    if done.returncode != 0:
        raise BisectError(f"{python}: measuring failed (exit {done.returncode}): "
                          + (done.stderr.strip().splitlines() or ["no output"])[-1])
    return json.loads(done.stdout.strip().splitlines()[-1])


def verdicts_main(argv: list[str]) -> int:
    """``python -m harness _verdicts [--engine vllm|sglang] TRACE...``: one JSON
    line, a verdict per trace on the installed engine (no faults): ``pass``,
    ``fail`` (invariant, op), or ``n/a`` (the release refuses the trace, cannot
    be driven at all, or — vLLM — the trace passes but its fault lived in code
    the vllm target does not run as vLLM's)."""
    engine = "vllm"
    if argv[:1] == ["--engine"]:
        engine, argv = argv[1], argv[2:]
    from harness.targets import TargetRefused, TargetUnavailable, target_spec

    if engine == "vllm":
        from harness.targets.vllm import load, target_mode, unexercised

        def extra(trace) -> dict:
            try:  # after the run: a runner vLLM's set-up refused ran on the adapter
                return {"mode": target_mode(trace.config)[0]}
            except TargetRefused:
                return {}
    else:
        from harness.targets.sglang_release import load

        def extra(trace) -> dict:
            return {}

        def unexercised(trace):
            return None
    try:
        load()  # its environment must be set before Triton is imported
    except TargetUnavailable as e:
        if engine == "vllm":
            raise  # measuring failed: bisect reports it (an environment that is broken)
        # an SGLang release whose scheduler paths the target cannot drive: n/a
        print(json.dumps([{"verdict": "n/a", "reason": str(e)}] * len(argv)))
        return 0
    from harness.core.session import replay
    from harness.core.trace import load as load_trace

    out = []
    for path in argv:
        trace = load_trace(path)
        refused = target_spec(engine).refusal(trace.config)
        if refused is not None:
            out.append({"verdict": "n/a", "reason": str(refused)})
            continue
        try:
            v = replay(trace, (), engine, "cpu")
        except TargetRefused as e:
            out.append({"verdict": "n/a", "reason": str(e)})
            continue
        more = extra(trace)
        if v.violation is None:
            reason = unexercised(trace)
            out.append({"verdict": "pass", **more} if reason is None else
                       {"verdict": "n/a", "reason": reason, **more})
        else:
            out.append({"verdict": "fail", "invariant": v.violation.invariant,
                        "op_index": v.violation.op_index, "op": v.violation.op, **more})
    print(json.dumps(out))
    return 0
