"""The ``blockfuzz`` command line (also ``python -m harness``).

Exit codes everywhere: 0 clean, 1 violation found or reproduced, 2 bad input or
usage (one line on stderr naming the file, field or flag; nothing written),
3 an internal error of blockfuzz itself (never a finding: one line naming it
and where its traceback was saved), 130 interrupted (Ctrl-C; what was done is
kept and printed).

- :mod:`harness.cli.parser`: the sub-commands and their flags;
- :mod:`harness.cli.common`: exit codes and the checks every verb runs first;
- :mod:`harness.cli.search`: ``fuzz``, ``repro``, ``nightly``;
- :mod:`harness.cli.traces`: ``shrink``, ``explain``, ``replay`` and the listings.
"""

from __future__ import annotations

import os
import sys
import tempfile

from harness.cli.common import (  # noqa: F401
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    EXIT_VIOLATION,
    UsageError,
)
from harness.cli.bisect import cmd_bisect
from harness.cli.parser import build_parser
from harness.cli.search import cmd_fuzz, cmd_nightly
from harness.cli.traces import (
    cmd_explain,
    cmd_faults,
    cmd_invariants,
    cmd_ops,
    cmd_replay,
    cmd_shrink,
)
from harness.core import interrupt

VERBS = {"fuzz": cmd_fuzz, "repro": cmd_fuzz, "shrink": cmd_shrink, "explain": cmd_explain,
         "replay": cmd_replay, "faults": cmd_faults, "ops": cmd_ops,
         "invariants": cmd_invariants, "nightly": cmd_nightly, "bisect": cmd_bisect}


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
    if argv and argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
        raise UsageError(f"blockfuzz: {argv[0]}: a verb comes first "
                         f"({', '.join(VERBS)}; blockfuzz --help)")
    args, extra = parser.parse_known_args(argv)
    if extra:
        raise UsageError(f"blockfuzz {args.verb}: unrecognized arguments: {' '.join(extra)}")
    return args


def internal_error(error: BaseException, argv: list[str]) -> str:
    """One line for an unexpected exception of blockfuzz itself: what failed,
    where (the innermost frame), and the file its whole traceback was saved to
    (a temporary file named ``blockfuzz-crash-*.txt``)."""
    import traceback

    frames = traceback.extract_tb(error.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    text = f"blockfuzz {' '.join(argv)}\n" + "".join(traceback.format_exception(error))
    try:
        fd, path = tempfile.mkstemp(prefix="blockfuzz-crash-", suffix=".txt")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        saved = f"traceback saved to {path}"
    except OSError as e:
        saved = f"traceback not saved ({e.strerror or e})"
    head = (str(error).splitlines() or [""])[0][:300]
    return f"{type(error).__name__}: {head}{where}; {saved}"


def main(argv: list[str] | None = None) -> int:
    """Run one verb; returns its exit code (0 clean, 1 violation, 2 usage, 3 internal
    error, 130 Ctrl-C)."""
    # Hypothesis keeps a small cache of constants; keep it out of the user's tree.
    os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY",
                          os.path.join(tempfile.gettempdir(), "blockfuzz-hypothesis"))
    from gpu_impl.device import DeviceError
    from harness.core.trace import TraceError

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_verdicts"]:  # a bisect measurement in a release's environment
        from harness.tools.bisect import verdicts_main

        return verdicts_main(argv[1:])
    if argv[:1] == ["_worker"]:  # a nightly worker subprocess
        from harness.search.nightly import worker_main

        return worker_main(argv[1:])
    stdout, sys.stdout = sys.stdout, _PipeSafeStdout(sys.stdout)
    previous = interrupt.install()  # Ctrl-C is recorded, so it cannot be swallowed
    try:
        args = _parse(argv)
        return VERBS[args.verb](args)
    except (UsageError, TraceError, DeviceError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:  # noqa: BLE001 - blockfuzz's own failure, never a finding
        print(f"internal error: {internal_error(e, argv)}", file=sys.stderr)
        return EXIT_INTERNAL
    finally:
        interrupt.restore(previous)
        sys.stdout.flush()
        sys.stdout = stdout


if __name__ == "__main__":
    raise SystemExit(main())
