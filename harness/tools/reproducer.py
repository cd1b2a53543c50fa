"""Standalone reproducer scripts: a short Python file that replays one trace.

The script imports only this package's replay API (no Hypothesis), embeds the
trace, prints what it checks and what it saw, and exits 1 while the violation
is present, 0 once it is gone — something to paste into an upstream bug report.
Run bare, it switches on the faults the trace was found with (``meta.faults``)
and says so; ``--no-faults`` runs the fixed implementation.  Exit codes: 0
pass, 1 the violation reproduces, 2 bad flags, 3 a different invariant fails,
4 blockfuzz is not importable (one line says what to install).
"""

from __future__ import annotations

from harness.core.trace import Trace

TEMPLATE = '''#!/usr/bin/env python3
"""blockfuzz reproducer: {title}

Found by: {found_by} (seed {seed}).  Expected with the bug present:
  {expect_line}

Run:   python {name} [--no-faults | --fault ID ...] [--device auto|cpu|cuda] [--target T]
       Bare, it switches on the faults it was found with ({faults_flag}) and
       prints them; --no-faults runs the fixed implementation; --fault ID
       (repeatable) switches on these faults instead.  Target: {target}.
Exit:  1 while the violation reproduces, 0 once the implementation is fixed
       (and with --no-faults), 2 on bad flags, 3 when a different invariant
       fails (not this bug: look), 4 when blockfuzz is not importable.
Needs: the blockfuzz package (pip install -e <blockfuzz checkout>); not Hypothesis.
"""

import argparse
import json
import sys

EXIT_NOT_INSTALLED = 4
try:
    from harness.core.session import replay
    from harness.core.trace import parse
except ImportError as e:
    print(f"blockfuzz is not importable ({{e}}); install it: pip install -e <blockfuzz checkout> "
          f"(exit {{EXIT_NOT_INSTALLED}})", file=sys.stderr)
    sys.exit(EXIT_NOT_INSTALLED)

TRACE = json.loads(r"""
{trace_json}""")


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line on stderr, exit 2
        print(f"error: {{self.prog}}: {{message}}", file=sys.stderr)
        sys.exit(2)


def main() -> int:
    from gpu_impl.faults import CATALOGUE
    from harness.targets import TARGETS, TargetUnavailable, target_spec

    ap = _Parser(description="replay one blockfuzz trace")
    ap.add_argument("--fault", action="append", default=None, choices=sorted(CATALOGUE),
                    help="gpu_impl fault to switch on instead of the trace's (repeatable)")
    ap.add_argument("--no-faults", action="store_true",
                    help="switch no fault on: the fixed implementation (exit 0 there)")
    ap.add_argument("--device", default=None, choices=["auto", "cpu", "cuda"])
    ap.add_argument("--target", default="{target}", choices=TARGETS,
                    help="implementation to check (default: the one it was found on)")
    args = ap.parse_args()  # bad flags: exit 2
    spec = target_spec(args.target)
    if args.no_faults and args.fault:
        ap.error("--no-faults and --fault exclude each other")
    if args.fault is None:  # default: the faults recorded in the trace (targets that take them)
        args.fault = [] if args.no_faults or not spec.takes_faults else \
            list(TRACE["meta"].get("faults", []))
    if args.fault and not spec.takes_faults:
        ap.error("--fault: faults live in gpu_impl; use --target gpu_impl")
    trace = parse(TRACE, "{name}")
    for fault in args.fault:
        if trace.config.runner not in CATALOGUE[fault].runners:
            ap.error(f"fault {{fault}} does not apply to runner {{trace.config.runner}}")
    try:
        device = spec.select_device(args.device)
    except TargetUnavailable as e:
        ap.error(str(e))
    refused = spec.refusal(trace.config)
    if refused is not None:
        ap.error(f"config.{{refused}}")
    version = spec.version()
    engine = f" ({{version}})" if version else ""
    print(f"faults switched on: {{','.join(args.fault) or 'none'}}"
          + (" (recorded in the trace; --no-faults runs without)" if args.fault and
             not args.no_faults and args.fault == TRACE["meta"].get("faults") else ""))
    print(f"checking {{len(trace.ops)}} ops on runner {{trace.config.runner}}, target "
          f"{{args.target}}{{engine}}; expecting with the bug: "
          f"{{trace.expect.get('invariant')}} at op {{trace.expect.get('op_index')}}")
    verdict = replay(trace, args.fault, args.target, device)
    if verdict.violation is None:
        print(f"PASS: all {{verdict.ops_run}} ops hold every invariant")
        return 0
    print(f"FAIL: {{verdict.violation.line()}}")
    want = trace.expect.get("invariant")
    if want is not None and verdict.violation.invariant != want:
        print(f"DIFFERENT: expected {{want}}; this is another failure, not this bug")
        return 3
    return 1


if __name__ == "__main__":
    sys.exit(main())
'''


def reproducer_source(trace: Trace, name: str) -> str:
    """Source of the standalone script for ``trace`` (saved as ``name``)."""
    e = trace.expect
    expect_line = (f"{e.get('invariant')} at op {e.get('op_index')}"
                   if e.get("verdict") == "fail" else "pass")
    faults = trace.faults
    text = TEMPLATE.format(
        title=expect_line, found_by=trace.meta.get("found_by", "?"),
        seed=trace.meta.get("seed", "?"), expect_line=expect_line, name=name,
        faults_flag=" ".join(f"--fault {f}" for f in faults) or "none",
        target=trace.meta.get("target", "gpu_impl"),
        trace_json=trace.dumps())
    assert '"""' not in trace.dumps()
    return text
