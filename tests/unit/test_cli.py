"""harness/cli.py: the stable interface — first/last lines, exit codes, one-line
errors with nothing written, byte-identical traces across processes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli import main

ROOT = Path(__file__).resolve().parents[2]
SEED_TRACE = ROOT / "corpora" / "seeds" / "full-replay-not-restaged.json"


def test_fuzz_clean_run_prints_seed_first_and_exits_0(capsys, tmp_path):
    rc = main(["fuzz", "--runner", "v1", "--seed", "3", "--examples", "5",
               "--out", str(tmp_path / "o")])
    out = capsys.readouterr().out.splitlines()
    assert rc == 0
    assert out[0].startswith("blockfuzz fuzz: seed=3 runner=v1 target=gpu_impl")
    assert out[1].startswith("config: drawn per example")
    assert out[-1].startswith("PASS: ")
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
    (trace_path,) = out_dir.glob("*.json")
    assert main(last.split()[2:]) == 1  # the printed command reproduces it
    assert main(["replay", str(trace_path)]) == 0  # and passes without the fault


def test_replay_exit_codes(capsys):
    assert main(["replay", str(SEED_TRACE)]) == 0
    assert main(["replay", str(SEED_TRACE), "--fault", "full-replay-not-restaged"]) == 1
    assert main(["replay", str(SEED_TRACE), "--faults-from-trace"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "NO_STALE_WRITE" in out
    seeds = sorted(str(p) for p in (ROOT / "corpora").rglob("*.json"))
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
])
def test_usage_errors_are_one_line_exit_2(capsys, tmp_path, argv, needle):
    rc = main(argv + (["--out", str(tmp_path / "o")] if argv[0] == "fuzz" else []))
    err = capsys.readouterr().err
    assert rc == 2 and needle in err and err.count("\n") == 1
    assert not (tmp_path / "o").exists()


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
             "--examples", "200", "--fault", "full-replay-not-restaged", "--out", str(out_dir)],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 1, proc.stderr
        (path,) = out_dir.glob("*.json")
        outs.append((path.name, path.read_bytes()))
    assert outs[0] == outs[1]


def test_repro_writes_trace_and_standalone_script(tmp_path, capsys):
    out_dir = tmp_path / "found"
    rc = main(["repro", "--runner", "v1", "--seed", "0", "--fault", "full-replay-not-restaged",
               "--out", str(out_dir)])
    assert rc == 1
    (trace_path,) = out_dir.glob("*.json")
    (script,) = out_dir.glob("*.py")
    assert script.stem == trace_path.stem
    check = ("import runpy, sys; sys.argv = [sys.argv[1]] + sys.argv[2:]\n"
             "try:\n    runpy.run_path(sys.argv[0], run_name='__main__')\n"
             "except SystemExit as e:\n    code = e.code\n"
             "assert 'hypothesis' not in sys.modules, 'reproducer imported hypothesis'\n"
             "sys.exit(code)\n")
    for extra, want in (([], 0), (["--fault", "full-replay-not-restaged"], 1)):
        proc = subprocess.run([sys.executable, "-c", check, str(script)] + extra, cwd=tmp_path,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == want, proc.stdout + proc.stderr
        assert ("FAIL: NO_STALE_WRITE" in proc.stdout) == bool(want)


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
    assert main(["explain", str(path)]) == 0  # the fixed implementation
    assert "ok" in capsys.readouterr().out


def test_shrink_verb_on_a_hand_made_trace(tmp_path, capsys):
    src = json.loads((ROOT / "corpora" / "seeds" /
                      "seed000-stale-row-mamba-into-loading-request.json").read_text())
    path = tmp_path / "long.json"
    path.write_text(json.dumps(src))
    assert main(["shrink", str(path), "--faults-from-trace"]) == 1
    small = json.loads((tmp_path / "long.shrunk.json").read_text())
    assert len(small["ops"]) < len(src["ops"]) and small["expect"]["verdict"] == "fail"
    assert main(["shrink", str(path)]) == 0  # passes without its fault: nothing to shrink


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
