"""Verbs that read traces and registries: ``shrink``, ``explain``, ``replay``,
``faults``, ``ops``, ``invariants``."""

from __future__ import annotations

import sys

from pathlib import Path

from harness.cli.common import (
    EXIT_OK,
    EXIT_VIOLATION,
    UsageError,
    _check_out,
    _check_target,
    _print_consequence,
    _select_device,
    _trace_faults,
)


def cmd_shrink(args) -> int:
    """Shrink a failing trace to TRACE.shrunk.json (or --out)."""
    from harness.core.session import replay
    from harness.core.trace import write_atomic
    from harness.search.shrink import shrink
    from harness.tools.commands import RunSettings

    trace = _load_trace(args.trace, args.target)
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
    final = replay(small, faults, args.target, device, record=True)
    small.ops = final.ops
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
    from harness.tools.explain import explain, layout_note, render

    trace = _load_trace(args.trace, args.target)
    faults = _trace_faults(args, trace, args.trace, note=None)
    device = _select_device(args.device, args.target)
    _check_target(trace.config, args.target, args.trace)
    _trace_faults(args, trace, args.trace, note="stderr")
    if args.target == "vllm":  # what ran it (stdout is the document)
        from harness.targets.vllm import mode_line

        print(mode_line(trace.config), file=sys.stderr)
    records = explain(trace, faults, device, args.target, stop_at_first=not args.all)
    text = render(records, args.format, caption=layout_note(trace.config))
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


def _replay_one(args, path, trace, use, device, expect) -> tuple[bool, bool | None]:
    """Replay one trace and print its lines; returns (violated, mismatched) —
    mismatched None when ``--check-expect --target vllm`` finds no verdict
    recorded for the mode that ran the trace (the mode is known after the run:
    a runner vLLM's own set-up refuses runs on the adapter)."""
    from harness.core.session import replay

    found_on = trace.meta.get("target", "gpu_impl")  # traces without one: gpu_impl's verdicts
    line = None
    if args.target == "vllm":
        from harness.targets.vllm import mode_line

        line = mode_line(trace.config)
        print(f"{path}: {line}")
    if "target" in trace.meta and found_on != args.target and not args.check_expect:
        # Only where a search recorded it: a hand-written trace was found on no target.
        print(f"note: {path} was found on target {found_on}; replaying on {args.target} "
              f"(--target {found_on} replays it there)")
    verdict = replay(trace, use, args.target, device)
    if line is not None and mode_line(trace.config) != line:
        # vLLM's own set-up refused runner mode when the runner was built: the
        # adapter ran it
        print(f"{path}: {mode_line(trace.config)}")
    if line is not None and args.check_expect:  # the release verdict of the mode that ran
        from harness.targets.vllm import installed_version, recorded_verdict, target_mode

        mode = target_mode(trace.config)[0]
        expect = recorded_verdict(trace, installed_version(), mode)
        if expect is None:
            print(f"SKIP {path}: no verdict recorded for vLLM {installed_version()} in {mode} "
                  "mode (meta.expect_by_release; bisect --write records it)")
            return verdict.violation is not None, None
    tag = f" (faults: {','.join(use)})" if use else ""
    if verdict.violation is None:
        print(f"PASS {path}: {verdict.ops_run} op{'' if verdict.ops_run == 1 else 's'}{tag}")
    else:
        print(f"FAIL {path}{tag}: {verdict.violation.line()}")
    for line in verdict.diverged:  # the KV-cache manager's policy differs from the record's
        print(f"  note: {line}")
    if not args.check_expect:
        return verdict.violation is not None, False
    got = ("pass" if verdict.violation is None else
           f"fail {verdict.violation.invariant} at op {verdict.violation.op_index}")
    ok = verdict.matches(expect)
    print(f"  expect {_want_text(expect)}: {'matches' if ok else 'MISMATCH, got ' + got}")
    if not ok and args.target != "vllm" and found_on != args.target:
        print(f"  (expect is its verdict on target {found_on}: add --target {found_on})")
    return verdict.violation is not None, not ok


def _refused_config_first(path, target) -> None:
    """A trace whose ops the oracle refuses may have a config the target refuses
    outright (a page size it does not drive, whose pages the oracle then finds
    no room in): that is the one line to give.  Raises :class:`UsageError`
    naming the config field when the target refuses the config; else nothing."""
    import json

    from reference import config_from_json

    if target is None:
        return
    try:
        config = config_from_json(json.loads(open(path).read())["config"])
    except Exception:  # noqa: BLE001 (the config itself is bad: the load's error says so)
        return
    _check_target(config, target, str(path))


def _load_trace(path, target):
    """:func:`harness.core.trace.load`, with a config ``target`` refuses reported
    first (:func:`_refused_config_first`)."""
    from harness.core.trace import TraceError, load

    try:
        return load(path)
    except TraceError:
        _refused_config_first(path, target)
        raise


def _load_any(path, args):
    """A trace file, or a scenario file turned into the trace of ``--target``'s
    model (``--runner`` for block tables); one-line errors (exit 2)."""
    from harness.core.scenario import ScenarioError, is_scenario
    from harness.core.scenario import load as load_scenario

    if not is_scenario(path):
        if getattr(args, "runner", None):
            raise UsageError(f"{path}: --runner applies to scenarios; a trace names its runner")
        return _load_trace(path, getattr(args, "target", None))
    from harness.targets import target_spec

    if args.runner and target_spec(args.target).runners == ("sglang",):
        raise UsageError(f"--runner {args.runner}: the {args.target} target runs token-slot "
                         "traces; --runner picks a block-table runner")
    try:
        return load_scenario(path).trace_for(args.target, args.runner)
    except ScenarioError as e:
        raise UsageError(str(e)) from None


def cmd_replay(args) -> int:
    """Replay traces; --check-expect compares each verdict with the trace's expect."""
    by_release = args.check_expect and args.target == "vllm"
    if args.check_expect and not by_release:
        args.faults_from_trace = True
    traces = [(p, _load_any(p, args)) for p in args.traces]  # all validated before anything runs
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
                      "(meta.expect_by_release; bisect --write records it)")
                unchecked += 1
                continue
            if expect.get("verdict") == "n/a":  # the bug's code path is ours, not vLLM's
                print(f"N/A {path}: not applicable to vLLM {version}: "
                      f"{expect.get('reason', 'the code path is not the engine’s')}")
                not_applicable += 1
                continue
        _trace_faults(args, trace, str(path))  # the recorded-faults note, if any
        violated, mismatched = _replay_one(args, path, trace, use, device, expect)
        if mismatched is None:  # no verdict recorded for the mode that ran it
            unchecked += 1
            continue
        violations += violated
        mismatches += mismatched
    if not args.check_expect:
        if len(traces) > 1:  # many traces: the outcome in one line at the end
            ran = len(traces) - unchecked
            print(f"{len(traces)} traces: {ran - violations} passed, {violations} failed"
                  + (f", {unchecked} skipped (SKIP)" if unchecked else ""))
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

    print_faults(args.json, args.long)
    return EXIT_OK


def cmd_ops(args) -> int:
    from harness.tools.catalogues import print_ops

    print_ops(args.json)
    return EXIT_OK


def cmd_invariants(args) -> int:
    from harness.tools.catalogues import print_invariants

    print_invariants(args.json)
    return EXIT_OK
