"""harness/search/nightly.py on the CPU: a short campaign on the fixed
implementation, resume after an interrupt, a fault's finding, and a worker
crash that does not stop the campaign.  Campaigns are bounded by seeds
(--max-seeds / Campaign.max_seeds), never by how fast this machine is."""

import json
import shlex
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from harness.cli import EXIT_INTERNAL, main
from harness.search import nightly
from harness.search.nightly import Campaign, run

from tests.unit.crashing_worker import crash_call

CRASHING_WORKER = Path(__file__).with_name("crashing_worker.py")


def _report(out):
    return json.loads((out / "report.json").read_text())


def test_clean_campaign_then_resume(tmp_path, capsys):
    out = tmp_path / "n"
    argv = ["nightly", "--time-budget", "600", "--max-seeds", "2", "--workers", "2",
            "--out", str(out), "--corpus", "", "--runner", "v1", "--examples-per-seed", "3"]
    assert main(argv) == 0
    first = _report(out)
    assert first["findings"] == [] and len(first["seeds_run"]) == 2 and first["steps"] > 0
    assert first["examples"] == 2 * 3  # completed examples, as asked
    assert first["versions"]["torch"] and first["campaign"]["shard"] == "0/1"
    suite = ET.parse(out / "junit.xml").getroot()
    assert suite.get("tests") == "1" and suite.get("failures") == "0"
    first_out = capsys.readouterr().out.splitlines()
    assert "resuming" not in first_out[0]
    assert first_out[1].startswith("[    0s] seeds 0")  # progress from the first second
    # A re-run with the same DIR continues after the seeds already finished.
    assert main(argv[:4] + ["1"] + argv[5:]) == 0
    second = _report(out)
    assert sorted(second["seeds_run"]) == [0, 1, 2]
    assert second["examples"] == 3 * 3 and second["steps"] > first["steps"]  # both runs
    assert second["seconds"] >= first["seconds"] and second["resumed_seeds"] == 2
    text = capsys.readouterr().out
    assert text.splitlines()[0].startswith("blockfuzz nightly: resuming (2 seeds done) ")
    assert "3 seeds, 9 examples" in text and "totals include 2 seeds of earlier runs" in text
    log = [json.loads(x) for x in (out / "seeds.log").read_text().splitlines()]
    assert len({r["seed"] for r in log}) == len(log)  # no seed ran twice


def test_findings_and_crash_print_commands_that_reproduce_them(tmp_path, capsys, monkeypatch):
    """A fault's finding and a worker crash: the campaign goes on, and each printed
    command, run as printed, reproduces what was found."""
    out, corpus, call = tmp_path / "n", tmp_path / "corpus", tmp_path / "call.json"
    c = Campaign(out, 600.0, workers=2, device="cpu", runner="v1",
                 faults=("vacated-row-not-cleared",), corpus=corpus, examples_per_seed=10,
                 max_seeds=3,
                 worker_command=(sys.executable, str(CRASHING_WORKER), "1", str(call)))
    progress = run(c)
    report = _report(out)
    assert sorted(report["seeds_run"]) == [0, 1, 2] and report["crashes"] == 1
    by_sig = {f["signature"]: f for f in report["findings"]}
    # The crash is a harness error, apart from the engine findings.
    assert "CRASH-seed1" not in by_sig
    crash = {e["signature"]: e for e in report["harness_errors"]}["CRASH-seed1"]
    assert "exited with code" in crash["violation"]
    # The worker's last words are in the finding (and its log is named).
    assert crash["violation"].endswith("CUDA error: an illegal memory access was encountered")
    assert crash["stderr_tail"][-1].startswith("RuntimeError: CUDA error")
    assert Path(crash["worker_log"]).parent == out / "workers"
    found = [f for s, f in by_sig.items() if s.startswith("VACATED_ROWS_ZERO")]
    assert found and set(by_sig) == {f["signature"] for f in found}
    root = ET.parse(out / "junit.xml").getroot()
    junit = ET.tostring(root, encoding="unicode")
    assert root.get("errors") == "1" and root.get("failures") == str(len(found))
    errors = [tc for tc in root.iter("testcase") if tc.find("error") is not None]
    assert [tc.get("name") for tc in errors] == ["CRASH-seed1"]
    for f in found:
        trace = json.loads(Path(f["trace"]).read_text())
        # Shrunk: since the drafter's uniform batches took 1 + k tokens (2026-12-03)
        # one finding is a 6-op local minimum (a preempt / resume pair puts its
        # request in row 1; dropping either makes the other illegal).
        assert len(trace["ops"]) <= 6 and trace["expect"]["verdict"] == "fail"
        assert (corpus / Path(f["trace"]).name).exists()
        assert f["replay"] in junit and f == progress.findings[f["signature"]]
        capsys.readouterr()
        assert main(shlex.split(f["replay"])[1:]) == 1  # the printed replay reproduces it
        assert f"FAIL {f['trace']}" in capsys.readouterr().out
        assert "--profile nightly" in f["rerun"] and "--examples 10" in f["rerun"]
    # The crash's rerun command makes the very fuzz call that crashed the worker.
    crashed = json.loads(call.read_text())
    seen = []

    def fake_fuzz(*args, **kw):
        seen.append(crash_call(*args, **kw))
        raise RuntimeError("crash")

    fake_fuzz.__wrapped__ = crash_call.__globals__["inspect"].unwrap(
        __import__("harness.search.fuzz", fromlist=["fuzz"]).fuzz)

    monkeypatch.setattr("harness.search.fuzz.fuzz", fake_fuzz)
    argv = shlex.split(crash["rerun"])
    assert argv[:2] == ["blockfuzz", "fuzz"] and crash["rerun"] in junit
    capsys.readouterr()
    assert main(argv[1:] + ["--out", str(tmp_path / "rerun")]) == EXIT_INTERNAL  # not 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("internal error: RuntimeError: crash") and "\n" not in err, err
    assert seen == [crashed]


def test_production_code_has_no_test_crash_switch():
    source = Path(nightly.__file__).read_text()
    assert "BLOCKFUZZ_TEST" not in source and "os.abort" not in source


def test_interrupt_keeps_reports_and_says_how_to_resume(tmp_path, capsys, monkeypatch):
    out = tmp_path / "n"

    def ticker(budget):
        def tick(elapsed, p):
            if p.seeds:
                raise KeyboardInterrupt
        return tick

    monkeypatch.setattr("harness.cli.search._nightly_ticker", ticker)
    argv = ["nightly", "--time-budget", "600", "--workers", "1", "--out", str(out),
            "--corpus", "", "--runner", "v1", "--examples-per-seed", "2"]
    assert main(argv) == 130
    text = capsys.readouterr().out
    report = _report(out)
    assert report["interrupted"] and len(report["seeds_run"]) >= 1
    assert ET.parse(out / "junit.xml").getroot().get("tests") == "1"
    resume = next(x for x in text.splitlines() if x.startswith("resume: "))
    logs = list((out / "workers").glob("worker-*.log"))
    assert logs and not any("Traceback" in log.read_text() for log in logs)
    monkeypatch.undo()
    done = len(report["seeds_run"])
    assert main(shlex.split(resume)[2:] + ["--max-seeds", "1"]) == 0  # as printed
    assert capsys.readouterr().out.startswith(f"blockfuzz nightly: resuming ({done} seeds done)")
    assert len(_report(out)["seeds_run"]) == done + 1


def test_worker_ends_quietly_on_ctrl_c(monkeypatch, capsys):
    def interrupted(spec, seed, device, seed_corpus=()):
        raise KeyboardInterrupt

    monkeypatch.setattr(nightly, "run_seed", interrupted)
    monkeypatch.setattr(sys, "stdin", iter(['{"seed": 0}\n']))
    spec = {"device": "cpu", "examples": 1, "faults": [], "runner": "v1"}
    assert nightly.worker_main([json.dumps(spec)]) == 130
    assert capsys.readouterr().err == ""


def test_bad_shard_is_usage_error(tmp_path, capsys):
    assert main(["nightly", "--time-budget", "5", "--out", str(tmp_path), "--shard", "3/2"]) == 2
    assert "--shard" in capsys.readouterr().err


def test_resume_with_other_settings_is_refused_before_the_header(tmp_path, capsys):
    out = tmp_path / "n"
    assert main(["nightly", "--time-budget", "600", "--max-seeds", "1", "--out", str(out),
                 "--corpus", "", "--runner", "v1", "--examples-per-seed", "2"]) == 0
    capsys.readouterr()
    assert main(["nightly", "--time-budget", "600", "--max-seeds", "1", "--out", str(out),
                 "--corpus", "", "--runner", "v2", "--examples-per-seed", "2"]) == 2
    captured = capsys.readouterr()
    assert "was started with" in captured.err and captured.out == ""


def test_campaign_across_releases_marks_findings_new_in_the_newest(tmp_path, monkeypatch):
    """--releases: every finding's trace is replayed on each older release (here a
    stub per environment) and marked new in the newest only when all of them
    pass it; report.json, JUnit and the printed commands say so."""
    from harness.tools import bisect

    verdicts = {"py-0.1": {"verdict": "pass"}, "py-0.2": {"verdict": "pass"}}
    asked = []

    def measure(python, paths, engine="vllm"):
        assert engine == "vllm"  # the campaign's target (gpu_impl here: vLLM's tooling)
        asked.append((python, tuple(paths)))
        return [verdicts[python]] * len(paths)

    monkeypatch.setattr(bisect, "measure_in", measure)
    out = tmp_path / "n"
    c = Campaign(out, 600.0, device="cpu", runner="v1", faults=("vacated-row-not-cleared",),
                 corpus=None, examples_per_seed=10, max_seeds=1,
                 release_pythons={"0.1": "py-0.1", "0.2": "py-0.2", "0.3": "py-0.3"})
    progress = run(c)
    found = [f for f in _report(out)["findings"] if f.get("trace")]
    assert found and all(f["new_in_newest"] is True for f in found)
    assert [p for p, _ in asked] == ["py-0.1", "py-0.2"]  # the newest is the search itself
    assert set(found[0]["by_release"]) == {"0.1", "0.2", "0.3"}
    assert _report(out)["campaign"]["releases"] == ["0.1", "0.2", "0.3"]
    junit = ET.tostring(ET.parse(out / "junit.xml").getroot(), encoding="unicode")
    assert "NEW in 0.3: " in junit
    assert found[0]["replay"].startswith("env PYTHONPATH=") and " py-0.3 -m harness replay " \
        in found[0]["replay"]  # the newest release's environment replays it
    # An older release that fails it too: not new; none could run it: unknown.
    verdicts["py-0.2"] = {"verdict": "fail", "invariant": "VACATED_ROWS_ZERO", "op_index": 1}
    nightly.judge_releases(c, progress)
    f = next(iter(progress.findings.values()))
    assert f["new_in_newest"] is False
    assert nightly.release_note(c, f) == "also fails on 0.2: "
    verdicts.update({"py-0.1": {"verdict": "n/a", "reason": "refused"},
                     "py-0.2": {"verdict": "n/a", "reason": "refused"}})
    nightly.judge_releases(c, progress)
    assert f["new_in_newest"] is None and "no older release" in nightly.release_note(c, f)


def test_releases_need_the_vllm_target(tmp_path, capsys):
    argv = ["nightly", "--time-budget", "60", "--out", str(tmp_path / "n"),
            "--releases", "0.26.0..0.33.0"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--target vllm" in err
    assert main(argv[:-1] + ["0.26.0..9.9.9", "--target", "vllm"]) == 2
    assert "9.9.9" in capsys.readouterr().err
