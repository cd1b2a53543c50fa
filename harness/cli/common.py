"""What every verb shares: exit codes, one-line usage errors, and the checks
that run before anything is printed or written (faults, output paths, device,
what a target can express)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

EXIT_OK, EXIT_VIOLATION, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
EXIT_INTERNAL = 3  # blockfuzz itself failed: never a finding


EPILOG = """exit codes:
  0    clean: no invariant violated (replay --check-expect: every verdict matched)
  1    a violation was found or reproduced (--check-expect: a verdict mismatched)
  2    bad input or usage: one line on stderr naming the file, field or flag;
       nothing written (--check-expect: nothing could be checked)
  3    blockfuzz itself failed (an internal error, not a finding): one line
       on stderr naming it and the file its traceback was saved to
  130  interrupted (Ctrl-C): what was done is kept and printed"""


BISECT_EPILOG = """exit codes:
  0    a release where the verdicts change was found (printed last)
  1    no change: both ends agree (--every: every release listed agrees)
  2    bad input or usage: one line on stderr naming the file, field or flag;
       nothing run, nothing written (or an environment could not be made)
  3    blockfuzz itself failed (an internal error): one line on stderr naming
       it and the file its traceback was saved to
  130  interrupted (Ctrl-C)"""


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


# -- verbs ---------------------------------------------------------------------
def _load_config(path: str | None, runner: str | None, default_runner: str | None = None):
    """The ``--config`` file (None without one): ``runner`` (the flag) overrides its
    runner; ``default_runner`` fills it only where the file names none."""
    from harness.core.trace import read_json
    from reference import ConfigError, config_from_json

    if path is None:
        return None
    obj = read_json(path)
    if isinstance(obj, dict) and "config" in obj:
        obj = obj["config"]
    if isinstance(obj, dict) and runner:
        obj = dict(obj, runner=runner)
    elif isinstance(obj, dict) and default_runner and "runner" not in obj:
        obj = dict(obj, runner=default_runner)
    try:
        return config_from_json(obj)
    except ConfigError as e:
        raise UsageError(f"{path}: {e}") from None


def _print_consequence(trace, invariant: str, faults, target: str, device: str) -> None:
    """For a structural finding (stale ids or counters in a row), replay without the
    structural checks and say what the bug did to memory — what a maintainer asks
    first: a write where none may land (the first invariant that still fires), else
    a write that went missing or into scratch (caches and outputs compared with
    the reference op by op), else nothing."""
    from harness.core.invariants import structural_ids
    from harness.core.invariants.differential import effects_differ
    from harness.core.session import Session, replay

    if invariant not in structural_ids():
        return
    skip = set(structural_ids()) | {"MATCHES_REFERENCE"}
    seen = replay(trace, faults, target, device, skip=skip)
    if seen.violation is not None:
        print(f"consequence (with the structural checks unchecked): {seen.violation.line()}")
        return
    if trace.config.runner == "sglang":  # SGL_KV_MATCHES compared every op's KV already
        states = " and Mamba states" if getattr(trace.config, "mamba_slots", 0) else ""
        print(f"consequence: none in this trace (structural only: every live request's and "
              f"the radix tree's KV{states} still match the oracle)")
        return
    session = Session(trace.config, faults, target, device, skip)
    for index, op in enumerate(trace.ops):
        session.apply(op)
        lost = effects_differ(session.target.observe(), session.reference.observe(copy=False),
                              index, op["op"], trace.config)
        if lost:
            v = lost[0]
            print(f"consequence: no write lands where it may not, but after op {v.op_index} "
                  f"({v.op}) {v.detail} — a kernel wrote elsewhere (scratch) or not at all")
            return
    print("consequence: none in this trace (structural only: every cache and output still "
          "matches the reference)")


def _takes_faults(target: str) -> bool:
    from harness.targets import target_spec

    return target_spec(target).takes_faults


def _check_fault_target(faults: list[str], target: str, flag_ids: list[str]) -> None:
    """Faults on a target that has none, or of another runner than the target's:
    one line naming the flag (exit 2)."""
    if not faults:
        return
    from gpu_impl.faults import CATALOGUE
    from harness.targets import target_spec

    spec = target_spec(target)
    if not spec.takes_faults:
        raise UsageError(f"{_fault_source(flag_ids)}: the {target} target has no faults; "
                         "faults live in gpu_impl (runners v1, v2) and the sglang target "
                         "(runner sglang)")
    for fid in faults:
        if not set(CATALOGUE[fid].runners) & set(spec.runners):
            raise UsageError(f"{_fault_source(flag_ids)} {fid}: a fault of runner(s) "
                             f"{', '.join(CATALOGUE[fid].runners)}; the {target} target runs "
                             f"{', '.join(spec.runners)}")


def _check_fault_needs(faults: list[str], config, source: str) -> None:
    """A fault whose code path ``config`` never runs (``Fault.needs``: a Mamba
    pool's fault on a config without one): one line naming the field (exit 2),
    rather than a pass that proves nothing."""
    if config is None:
        return
    from gpu_impl.faults import CATALOGUE

    for fid in faults:
        for name in CATALOGUE[fid].needs:
            if not getattr(config, name, None):
                raise UsageError(f"{source}: config.{name} is {getattr(config, name, None)!r}: "
                                 f"fault {fid} runs only where it is set")


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

    common = {"v1", "v2", "sglang"}
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
            _probe_write(out if (is_dir and out.is_dir()) else parent, flag, path)
            break
    return out


def _probe_write(folder: Path, flag: str, path: str) -> None:
    """Create and remove a scratch entry in ``folder``: permission bits do not say
    everything (root ignores them; /proc, read-only mounts and full disks refuse
    anyway).  Leaves nothing behind."""
    import tempfile

    try:
        os.rmdir(tempfile.mkdtemp(prefix=".blockfuzz-probe-", dir=folder))
    except OSError as e:
        raise UsageError(f"{flag} {path}: cannot write in {folder} "
                         f"({e.strerror or e})") from None


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


def _trace_faults(args, trace, source: str = "trace", note: str | None = "stdout") -> list[str]:
    """The faults to replay ``trace`` with; prints one note (to ``note``: "stdout",
    "stderr" or None for none) when the trace records faults (meta.faults) that
    stay off."""
    faults = _check_faults(args.fault)
    if args.faults_from_trace:
        faults = sorted(set(faults) | set(trace.faults))
    _check_fault_target(faults, args.target, args.fault)
    _check_trace_faults(faults, trace.config.runner, source)
    _check_fault_needs(faults, trace.config, source)
    off = [f for f in trace.faults if f not in faults]
    if off and note is not None and _takes_faults(args.target):
        print(f"note: {source} was found with fault(s) {','.join(off)} (meta.faults), off "
              "here; --faults-from-trace switches them on",
              file=sys.stdout if note == "stdout" else sys.stderr)
    return faults
