"""harness/cli/: the stable interface — first/last lines, exit codes, one-line
errors with nothing written, byte-identical traces across processes."""

import json
import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli import build_parser, main
from harness.core.trace import load
from harness.search import fuzz as search
from tests.conftest import corpus_traces

ROOT = Path(__file__).resolve().parents[2]
SEED_TRACE = ROOT / "corpora" / "seeds" / "full-replay-not-restaged.json"


def test_fuzz_clean_run_prints_seed_first_and_exits_0(capsys, tmp_path):
    rc = main(["fuzz", "--runner", "v1", "--seed", "3", "--examples", "5",
               "--out", str(tmp_path / "o")])
    out = capsys.readouterr().out.splitlines()
    assert rc == 0
    assert out[0].startswith("blockfuzz fuzz: seed=3 runner=v1 target=gpu_impl")
    assert out[1].startswith("config: drawn per example")
    assert out[-1].startswith("PASS: 5 examples")  # as many as asked, run to completion
    assert not (tmp_path / "o").exists()


def test_fuzz_violation_writes_trace_and_ends_with_replay_command(capsys, tmp_path):
    out_dir = tmp_path / "o"
    rc = main(["fuzz", "--seed", "0", "--examples", "50", "--fault", "removed-row-not-cleared",
               "--out", str(out_dir)])  # a V1-only fault pins runner v1
    lines = capsys.readouterr().out.splitlines()
    assert rc == 1
    assert any(line.startswith("FAIL: VACATED_ROWS_ZERO") for line in lines)
    last = lines[-1]
    assert last.startswith("replay: blockfuzz replay ") and "--fault removed-row-not-cleared" in last
    explain = lines[-2]
    assert explain.startswith("explain: blockfuzz explain ") and "--fault removed" in explain
    found = next(x for x in lines if x.startswith("found within "))
    assert "s of search (" in found and "steps/s); shrunk " in found and " replays (" in found
    (trace_path,) = out_dir.glob("*.json")
    assert main(shlex.split(last)[2:]) == 1  # the printed command reproduces it
    assert main(shlex.split(explain)[2:] + ["--format", "json"]) == 1
    capsys.readouterr()
    assert main(["replay", str(trace_path)]) == 0  # and passes without the fault
    assert capsys.readouterr().out.startswith("note: ")  # ...and says the fault is off


def test_no_shrink_prints_no_shrink_line(capsys, tmp_path):
    rc = main(["fuzz", "--seed", "0", "--examples", "50", "--fault", "removed-row-not-cleared",
               "--out", str(tmp_path), "--no-shrink"])
    out = capsys.readouterr().out
    assert rc == 1 and "found within " in out and "shrunk" not in out


def test_replay_exit_codes(capsys):
    assert main(["replay", str(SEED_TRACE)]) == 0
    assert main(["replay", str(SEED_TRACE), "--fault", "full-replay-not-restaged"]) == 1
    assert main(["replay", str(SEED_TRACE), "--faults-from-trace"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "NO_STALE_WRITE" in out
    seeds = [str(p) for p in corpus_traces()]
    assert main(["replay", "--check-expect", *seeds]) == 0  # every verdict matches its expect
    assert capsys.readouterr().out.rstrip().endswith(f"{len(seeds)} matched, 0 mismatched")


@pytest.mark.parametrize("argv, needle", [
    (["fuzz", "--fault", "nope"], "--fault nope: unknown fault"),
    (["fuzz", "--examples", "0"], "--examples"),
    (["fuzz", "--runner", "v9"], "invalid choice: 'v9'"),
    (["fuzz", "--time-budget", "nan"], "--time-budget"),
    (["fuzz", "--fault", "dummy-tables-not-zeroed", "--runner", "v1"], "not v1"),
    (["fuzz", "--examples", "x"], "invalid int value"),
    (["replay"], "the following arguments are required"),
    (["frobnicate"], "invalid choice"),
    (["--bogus"], "--bogus: a verb comes first"),
    (["fuzz", "--bogus"], "blockfuzz fuzz: unrecognized arguments: --bogus"),
    (["fuzz", "--config", "/nonexistent.json"], "/nonexistent.json: cannot read"),
])
def test_usage_errors_are_one_line_exit_2(capsys, tmp_path, argv, needle):
    rc = main(argv + (["--out", str(tmp_path / "o")] if argv[0] == "fuzz" else []))
    captured = capsys.readouterr()
    assert rc == 2 and needle in captured.err and captured.err.count("\n") == 1
    assert captured.out == ""  # no header before an argument error
    assert not (tmp_path / "o").exists()


def test_help_is_plain_text_and_lists_exit_codes(capsys):
    parser = build_parser()
    texts = [parser.format_help()]
    sub = next(a for a in parser._actions if a.dest == "verb")
    texts += [p.format_help() for p in sub.choices.values()]
    for text in texts:
        assert "``" not in text and "`" not in text
        assert "exit codes:" in text and "130" in text


def test_bad_trace_among_good_runs_nothing(capsys, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "blockfuzz-trace", "version": 1, "config": {},
                               "ops": [{"op": "remove", "req": 4}]}))
    rc = main(["replay", str(SEED_TRACE), str(bad)])
    captured = capsys.readouterr()
    assert rc == 2 and captured.out == ""  # the good trace did not run either
    assert captured.err.strip() == (f"error: {bad}: ops[0] (remove).req: request 4 is not live")


def test_faults_json_lists_the_catalogue(capsys):
    assert main(["faults", "--json"]) == 0
    faults = json.loads(capsys.readouterr().out)
    ids = {f["id"] for f in faults}
    assert {"vacated-row-not-cleared", "removed-row-not-cleared", "full-replay-not-restaged",
            "dummy-slots-not-padded", "dummy-slots-unpadded-count"} <= ids
    assert all(f["source"] and f["invariant"] and f["runners"] for f in faults)


def test_same_command_same_bytes_across_processes(tmp_path):
    """Two processes with different hash seeds write byte-identical traces."""
    outs = []
    for hash_seed in ("1", "2"):
        out_dir = tmp_path / hash_seed
        env = dict(os.environ, PYTHONHASHSEED=hash_seed)
        proc = subprocess.run(
            [sys.executable, "-m", "harness", "fuzz", "--runner", "v1", "--seed", "0",
             "--examples", "200", "--fault", "vacated-row-not-cleared", "--out", str(out_dir)],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 1, proc.stderr
        (path,) = out_dir.glob("*.json")
        outs.append((path.name, path.read_bytes()))
    assert outs[0] == outs[1]


def test_repro_writes_trace_and_standalone_script(tmp_path, capsys):
    out_dir = tmp_path / "found"
    rc = main(["repro", "--runner", "v1", "--seed", "0", "--fault", "dummy-slots-not-padded",
               "--out", str(out_dir)])
    assert rc == 1
    (trace_path,) = out_dir.glob("*.json")
    (script,) = out_dir.glob("*.py")
    assert script.stem == trace_path.stem
    assert script.stat().st_mode & stat.S_IXUSR  # ./script works
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("reproducer: "))
    assert shlex.split(line.split(" (")[0])[1:3] == ["python", str(script)]
    check = ("import runpy, sys; sys.argv = [sys.argv[1]] + sys.argv[2:]\n"
             "try:\n    runpy.run_path(sys.argv[0], run_name='__main__')\n"
             "except SystemExit as e:\n    code = e.code\n"
             "assert 'hypothesis' not in sys.modules, 'reproducer imported hypothesis'\n"
             "sys.exit(code)\n")
    for extra, want in (([], 1), (["--no-faults"], 0),
                        (["--fault", "dummy-slots-not-padded"], 1)):
        proc = subprocess.run([sys.executable, "-c", check, str(script)] + extra, cwd=tmp_path,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == want, proc.stdout + proc.stderr
        assert ("FAIL: NULL_BLOCK_FINITE" in proc.stdout) == bool(want)
        switched = "none" if want == 0 else "dummy-slots-not-padded"
        assert proc.stdout.startswith(f"faults switched on: {switched}")


def test_reproducer_without_blockfuzz_says_what_to_install(tmp_path):
    from harness.tools.reproducer import reproducer_source

    trace = load(SEED_TRACE)
    script = tmp_path / "r.py"
    script.write_text(reproducer_source(trace, script.name))
    # -I: no PYTHONPATH, no user site; -S: no site-packages, so no blockfuzz install.
    proc = subprocess.run([sys.executable, "-I", "-S", str(script)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 4 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "pip install" in proc.stderr
    assert "4 when blockfuzz is not importable" in script.read_text()


def test_explain_names_offending_op_row_and_block(capsys):
    path = ROOT / "corpora" / "seeds" / "seed000-stale-row-mamba-into-loading-request.json"
    assert main(["explain", str(path), "--faults-from-trace", "--format", "json"]) == 1
    records = json.loads(capsys.readouterr().out)
    last = records[-1]
    assert last["op"]["op"] == "condense" and last["violations"][0]["row"] == 1
    assert any(r["stale"] for r in last["rows"])
    assert main(["explain", str(path), "--faults-from-trace", "--all", "--format", "json"]) == 1
    records = json.loads(capsys.readouterr().out)
    dummy = next(r for r in records if r["op"]["op"] == "dummy_run")
    assert any(w["offending"] and w["value"] == "NaN" and w["group"] == 1 for w in dummy["writes"])
    assert main(["explain", str(path), "--format", "json"]) == 0  # the fixed implementation
    captured = capsys.readouterr()
    records = json.loads(captured.out)  # the note went to stderr, not into the document
    assert len(records) == len(json.loads(path.read_text())["ops"])
    assert all(r["violations"] == [] for r in records)
    assert captured.err.startswith(f"note: {path} was found with fault(s) ")
    assert "--faults-from-trace" in captured.err and captured.err.count("\n") == 1


def test_shrink_verb_on_a_hand_made_trace(tmp_path, capsys):
    src = json.loads((ROOT / "corpora" / "seeds" /
                      "seed000-stale-row-mamba-into-loading-request.json").read_text())
    path = tmp_path / "long.json"
    path.write_text(json.dumps(src))
    assert main(["shrink", str(path), "--faults-from-trace"]) == 1
    small = json.loads((tmp_path / "long.shrunk.json").read_text())
    assert len(small["ops"]) < len(src["ops"]) and small["expect"]["verdict"] == "fail"
    capsys.readouterr()
    assert main(["shrink", str(path)]) == 0  # passes without its fault: nothing to shrink
    out = capsys.readouterr().out
    assert out.startswith("note: ") and "vacated-row-not-cleared" in out.splitlines()[0]


def test_out_that_is_a_file_is_refused_before_searching(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert main(["fuzz", "--examples", "5", "--out", str(afile)]) == 2
    assert "not a directory" in capsys.readouterr().err


def test_env_faults_are_reported_and_recorded(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("BLOCKFUZZ_FAULTS", "removed-row-not-cleared")
    assert main(["fuzz", "--runner", "v1", "--examples", "50", "--out", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "faults=removed-row-not-cleared" in out.splitlines()[0]
    (trace,) = tmp_path.glob("*.json")
    assert json.loads(trace.read_text())["meta"]["faults"] == ["removed-row-not-cleared"]
    monkeypatch.setenv("BLOCKFUZZ_FAULTS", "nope")
    assert main(["replay", str(trace)]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_output_paths_and_runner_mismatches_are_refused(tmp_path, capsys):
    trace = str(ROOT / "corpora" / "seeds" / "vacated-row-not-cleared.json")  # a v1 trace
    afile = tmp_path / "afile"
    afile.write_text("x")
    cases = [
        (["shrink", trace, "--faults-from-trace", "--out", str(tmp_path)], "is a directory"),
        (["shrink", trace, "--faults-from-trace", "--out", str(afile / "x.json")],
         "is not a directory"),
        (["nightly", "--time-budget", "1", "--out", str(afile / "sub")], "is not a directory"),
        (["nightly", "--time-budget", "1", "--out", ""], "must not be empty"),
        (["nightly", "--time-budget", "1", "--out", str(tmp_path / "n"),
          "--seed-timeout", "nan"], "positive and finite"),
        (["fuzz", "--out", str(afile / "sub")], "is not a directory"),
        (["replay", trace, "--fault", "dummy-tables-not-zeroed"], "the trace is v1"),
        (["explain", trace, "--fault", "dummy-tables-not-zeroed"], "the trace is v1"),
    ]
    for argv, needle in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert needle in err and err.count("\n") == 1, (argv, err)
    cfg = tmp_path / "cfg.json"
    cfg.write_text('{"runner": "v1"}')
    assert main(["fuzz", "--config", str(cfg), "--fault", "dummy-tables-not-zeroed"]) == 2
    assert "not v1" in capsys.readouterr().err


def test_blockfuzz_device_env_is_read(monkeypatch, capsys):
    monkeypatch.setenv("BLOCKFUZZ_DEVICE", "bogus")
    assert main(["replay", str(SEED_TRACE)]) == 2
    assert "BLOCKFUZZ_DEVICE" in capsys.readouterr().err


def _unwritable_dir(tmp_path: Path) -> Path:
    """A folder this process cannot write into: read-only, or (as root, which
    chmod does not stop) a path under a regular file."""
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    if not os.access(ro, os.W_OK):
        return ro
    afile = tmp_path / "afile"
    afile.write_text("x")
    return afile / "sub"


def test_verbs_that_write_fail_before_the_work(tmp_path, capsys, monkeypatch):
    bad = _unwritable_dir(tmp_path)
    trace = bad / "t.json"
    if bad.name == "ro":
        bad.chmod(0o755)
        trace.write_text(SEED_TRACE.read_text())
        bad.chmod(0o555)
    else:
        trace = SEED_TRACE  # its folder is writable; --out is the unwritable one
    def no_replay(*a, **k):
        raise AssertionError("ran before refusing")

    monkeypatch.setattr("harness.core.session.replay", no_replay)
    monkeypatch.setattr(search, "fuzz", no_replay)
    cases = [["fuzz", "--out", str(bad / "o")], ["repro", "--out", str(bad / "o")],
             ["nightly", "--time-budget", "1", "--out", str(bad / "n")],
             ["nightly", "--time-budget", "1", "--out", str(tmp_path / "n"),
              "--corpus", str(bad / "c")],
             ["shrink", str(trace), "--faults-from-trace", "--out", str(bad / "s.json")]]
    if bad.name == "ro":
        cases.append(["shrink", str(trace), "--faults-from-trace"])  # TRACE.shrunk.json
    for argv in cases:
        assert main(argv) == 2, argv
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.count("\n") == 1, (argv, captured)
        assert "not writable" in captured.err or "not a directory" in captured.err
    assert not (tmp_path / "n").exists()


def test_interrupted_time_budget_prints_the_chunks_run(tmp_path, capsys, monkeypatch):
    real, calls = search._search, []

    def search_then_ctrl_c(*args):
        calls.append(args[1])
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(search, "_search", search_then_ctrl_c)
    assert main(["fuzz", "--runner", "v1", "--time-budget", "600", "--out", str(tmp_path)]) == 130
    out = capsys.readouterr().out
    assert f"chunk seeds run: {calls[0]}, {calls[1]} (the last one was cut short)" in out


def test_interrupted_shrink_keeps_the_unshrunk_trace(tmp_path, capsys, monkeypatch):
    def ctrl_c(*args, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(search, "shrink", ctrl_c)
    assert main(["fuzz", "--seed", "0", "--examples", "50", "--fault",
                 "removed-row-not-cleared", "--out", str(tmp_path)]) == 130
    lines = capsys.readouterr().out.splitlines()
    (path,) = tmp_path.glob("*-unshrunk.json")
    assert any(x == f"unshrunk trace ({len(load(path).ops)} ops): {path}" for x in lines)
    monkeypatch.undo()
    shrink_cmd = next(x for x in lines if x.startswith("shrink: "))
    assert main(shlex.split(shrink_cmd)[2:]) == 1  # the printed command finishes the job


class _ClosedPipe:
    def write(self, text):
        raise BrokenPipeError

    def flush(self):
        raise BrokenPipeError

    def isatty(self):
        return False


def test_exit_code_survives_a_closed_stdout(monkeypatch):
    path = ROOT / "corpora" / "seeds" / "seed000-stale-row-mamba-into-loading-request.json"
    monkeypatch.setattr(sys, "stdout", _ClosedPipe())
    assert main(["explain", str(path), "--faults-from-trace", "--all"]) == 1
    assert main(["replay", str(SEED_TRACE), "--faults-from-trace"]) == 1
    assert main(["replay", str(SEED_TRACE)]) == 0


def test_check_expect_with_nothing_checked_is_not_a_pass(capsys, monkeypatch):
    import dataclasses

    import harness.targets as targets
    import harness.targets.vllm as vllm_target

    # A vllm target that needs no vLLM: no refusal, the CPU, a release no trace records.
    spec = dataclasses.replace(targets.REGISTRY["vllm"], refusal=lambda config: None,
                               select_device=lambda device: "cpu")
    monkeypatch.setitem(targets.REGISTRY, "vllm", spec)
    monkeypatch.setattr(vllm_target, "installed_version", lambda: "0.0.0-none", raising=False)
    traces = sorted(str(p) for p in (ROOT / "corpora" / "vllm").glob("*.json"))
    assert main(["replay", "--check-expect", "--target", "vllm", *traces]) == 2
    captured = capsys.readouterr()
    assert "nothing was checked" in captured.err and captured.err.count("\n") == 1
    assert captured.out.count("SKIP ") == len(traces)


def test_signature_never_merges_different_shrunk_traces():
    trace = load(ROOT / "corpora" / "seeds" / "vacated-row-not-cleared.json")
    same = load(ROOT / "corpora" / "seeds" / "vacated-row-not-cleared.json")
    assert search.signature(trace) == search.signature(same)
    # Same op kinds and length, another op: another finding.
    other = load(ROOT / "corpora" / "seeds" / "vacated-row-not-cleared.json")
    other.ops[0] = dict(other.ops[0], prompt_len=other.ops[0]["prompt_len"] + 1)
    assert [o["op"] for o in other.ops] == [o["op"] for o in trace.ops]
    assert search.signature(other) != search.signature(trace)


def test_a_swallowed_ctrl_c_still_stops_the_run(monkeypatch, capsys):
    """Python ignores a KeyboardInterrupt raised inside a GC callback (Hypothesis has
    one), so the SIGINT handler also records the request and the next op re-raises
    it: the run stops with 130 instead of finishing clean.  Simulated: the request
    is recorded as a swallowed SIGINT would leave it, before the first op."""
    from harness.core import interrupt
    from harness.core.session import Session

    real_apply = Session.apply

    def swallowed_then_apply(self, op):
        interrupt.REQUESTED.set()  # the handler ran; its exception was ignored
        return real_apply(self, op)
    monkeypatch.setattr(Session, "apply", swallowed_then_apply)
    rc = main(["fuzz", "--runner", "v1", "--seed", "0", "--examples", "5", "--out",
               str(ROOT / "fuzz-out-never-written")])
    assert rc == 130 and not interrupt.REQUESTED.is_set()  # cleared for the next command
    captured = capsys.readouterr()
    assert "interrupted" in captured.out + captured.err


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs Linux /proc")
def test_out_where_nothing_can_be_created_is_refused_before_the_work(capsys):
    """Permission bits say nothing to root; /proc refuses every new entry anyway.
    The probe (create and remove a scratch folder) refuses it before any search."""
    assert main(["fuzz", "--examples", "5", "--out", "/proc/blockfuzz-out"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert "--out /proc/blockfuzz-out: cannot write in /proc" in captured.err


def test_consequence_names_a_lost_state_update(capsys):
    """A structural finding whose damage is a write that went missing (the Mamba
    state update of a FULL decode sent to the null block) says so, rather than
    "none"; one whose damage is a write into a freed block names that."""
    from harness.cli.common import _print_consequence
    from harness.core.trace import Trace, load
    from reference import GroupSpec, RunnerConfig

    seed = load(Path(__file__).resolve().parents[2] / "corpora" / "seeds" /
                "padded-rows-classified-as-prefill.json")
    _print_consequence(seed, "PADDED_ROWS_NEUTRAL", seed.faults, "gpu_impl", "cpu")
    assert "NO_STALE_WRITE" in capsys.readouterr().out
    config = RunnerConfig(cudagraph_capture_sizes=(2,), max_num_batched_tokens=2,
                          max_num_reqs=2, num_blocks=3, max_num_blocks_per_req=1,
                          groups=(GroupSpec("attention", 2, 2), GroupSpec("mamba", 16, 16)))
    lost = [{"op": "add", "req": 0, "blocks": [[1], [1]], "prompt_len": 1},
            {"op": "add", "req": 1, "blocks": [[2], [2]], "prompt_len": 1},
            {"op": "step", "scheduled": [[0, 1]], "cudagraph_mode": "NONE"},  # 1 waits
            {"op": "step", "scheduled": [[0, 1]], "cudagraph_mode": "FULL"}]  # row 1 padding
    _print_consequence(Trace(config, lost), "PADDED_ROWS_NEUTRAL",
                       ["padded-rows-classified-as-prefill"], "gpu_impl", "cpu")
    out = capsys.readouterr().out
    assert "no write lands where it may not" in out and "mamba_state[1]" in out, out


def test_a_target_that_raises_is_an_internal_error_never_a_finding(monkeypatch, capsys):
    """A crash of blockfuzz itself — here the target refuses an op mid-run, as the
    vllm target once did on a geometry it had let be drawn — exits 3 with one
    line naming it and the saved traceback; exit 1 means the engine broke an
    invariant, and only that (an exception *inside* the engine on a legal op
    stays the IMPL_CRASH finding)."""
    from harness.cli import EXIT_INTERNAL
    from harness.targets import TargetRefused
    from harness.targets.runner_target import RunnerTarget

    def refuses(self, *args, **kwargs):
        raise TargetRefused("groups[0].kernel_block_size", "cannot split blocks here")

    monkeypatch.setattr(RunnerTarget, "condense", refuses)
    trace = str(Path(__file__).resolve().parents[2] / "corpora" / "seeds"
                / "vacated-row-not-cleared.json")
    rc = main(["replay", trace])
    err = capsys.readouterr().err.strip()
    assert rc == EXIT_INTERNAL, (rc, err)
    assert err.startswith("internal error: TargetRefused: groups[0].kernel_block_size: ")
    assert "\n" not in err and " at " in err and "traceback saved to " in err
    saved = Path(err.rsplit("traceback saved to ", 1)[1])
    assert "cannot split blocks here" in saved.read_text()
    saved.unlink()
    for verb in ("fuzz", "replay", "nightly", "bisect"):
        assert "3    blockfuzz itself failed" in _verb_help(verb), verb


def _verb_help(verb: str) -> str:
    import argparse

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[verb].format_help()


def test_replay_names_a_trace_s_origin_only_where_one_was_recorded(capsys, tmp_path):
    """A hand-written trace (no ``meta.target``) gets no "found on target" note;
    one a search recorded on another target does."""
    root = Path(__file__).resolve().parents[2]
    hand = root / "corpora" / "seeds" / "vacated-row-not-cleared.json"
    assert "target" not in load(hand).meta
    main(["replay", str(hand), "--target", "reference"])
    assert "was found on target" not in capsys.readouterr().out
    found = json.loads(hand.read_text())
    found["meta"]["target"] = "gpu_impl"
    (tmp_path / "found.json").write_text(json.dumps(found))
    main(["replay", str(tmp_path / "found.json"), "--target", "reference"])
    assert "was found on target gpu_impl" in capsys.readouterr().out


def test_replay_of_many_traces_ends_with_a_one_line_count(capsys):
    root = Path(__file__).resolve().parents[2] / "corpora"
    traces = [str(root / "seeds" / "vacated-row-not-cleared.json"),
              str(root / "canary" / "null-block-nan.json")]
    rc = main(["replay", *traces, "--target", "reference"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert rc == 0 and last == "2 traces: 2 passed, 0 failed", last


def test_faults_is_a_compact_list_by_default(capsys):
    """One line per fault, at most 100 columns; --long keeps the full table."""
    from gpu_impl.faults import CATALOGUE

    assert main(["faults"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(CATALOGUE) + 1 and max(map(len, lines)) <= 100
    assert all(line.split()[0] in CATALOGUE for line in lines[1:])
    assert main(["faults", "--long"]) == 0
    assert "source" in capsys.readouterr().out


def test_fuzz_progress_prints_plain_lines_when_piped(monkeypatch, capsys, tmp_path):
    """Piped (a CI log), a running search prints a progress line to stderr every
    FuzzProgress.PLAIN_EVERY_S seconds; stdout keeps only the report."""
    from harness.cli import search as search_cli

    monkeypatch.setattr(search_cli.FuzzProgress, "PLAIN_EVERY_S", 0.05)
    trace = str(Path(__file__).resolve().parents[2] / "corpora" / "seeds"
                / "vacated-row-not-cleared.json")
    assert main(["fuzz", "--config", trace, "--seed", "0", "--examples", "3",
                 "--no-shrink", "--out", str(tmp_path)]) in (0, 1)
    captured = capsys.readouterr()
    assert "fuzz: " in captured.err and "/3 examples" in captured.err
    assert "/3 examples" not in captured.out


def test_fuzz_with_a_target_that_raises_exits_with_the_internal_error_code(monkeypatch, capsys,
                                                                          tmp_path):
    """The same through a search: a target refusing mid-run is blockfuzz's failure
    (exit 3, one line), not a finding (1)."""
    from harness.cli import EXIT_INTERNAL
    from harness.targets import TargetRefused
    from harness.targets.runner_target import RunnerTarget

    def refuses(self, *args, **kwargs):
        raise TargetRefused("groups[0].kernel_block_size", "cannot split blocks here")

    monkeypatch.setattr(RunnerTarget, "step", refuses)
    rc = main(["fuzz", "--runner", "v1", "--seed", "0", "--examples", "5", "--out",
               str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == EXIT_INTERNAL, (rc, err)
    assert err[-1].startswith("internal error: TargetRefused: groups[0].kernel_block_size")
    assert not list(tmp_path.iterdir())  # no finding written
