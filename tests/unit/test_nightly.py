"""harness/nightly.py on the CPU: a short campaign on the fixed implementation,
resume after an interrupt, a fault's finding, and a worker crash that does not
stop the campaign."""

import json
import os
import xml.etree.ElementTree as ET

from harness.cli import main


def _report(out):
    return json.loads((out / "report.json").read_text())


def test_clean_campaign_then_resume(tmp_path, capsys):
    out = tmp_path / "n"
    argv = ["nightly", "--time-budget", "8", "--workers", "2", "--out", str(out),
            "--corpus", "", "--runner", "v1", "--examples-per-seed", "4"]
    assert main(argv) == 0
    first = _report(out)
    assert first["findings"] == [] and first["seeds_run"] and first["steps"] > 0
    assert first["versions"]["torch"] and first["campaign"]["shard"] == "0/1"
    suite = ET.parse(out / "junit.xml").getroot()
    assert suite.get("tests") == "1" and suite.get("failures") == "0"
    # A re-run with the same DIR continues after the seeds already finished.
    assert main(argv) == 0
    second = _report(out)
    assert set(first["seeds_run"]) < set(second["seeds_run"])
    log = [json.loads(x) for x in (out / "seeds.log").read_text().splitlines()]
    assert len({r["seed"] for r in log}) == len(log)  # no seed ran twice


def test_fault_finding_and_crash_switch(tmp_path, capsys, monkeypatch):
    out, corpus = tmp_path / "n", tmp_path / "corpus"
    monkeypatch.setenv("BLOCKFUZZ_TEST_CRASH_SEED", "1")
    rc = main(["nightly", "--time-budget", "6", "--workers", "2", "--out", str(out),
               "--corpus", str(corpus), "--fault", "vacated-row-not-cleared",
               "--examples-per-seed", "10"])
    assert rc == 1
    report = _report(out)
    sigs = {f["signature"] for f in report["findings"]}
    assert "CRASH-seed1" in sigs  # the crashed worker's seed is recorded...
    assert report["crashes"] == 1 and len(report["seeds_run"]) > 2  # ...and the campaign went on
    found = [f for f in report["findings"] if f["signature"].startswith("VACATED_ROWS_ZERO")]
    assert found and all(f["replay"].startswith("blockfuzz replay ") for f in found)
    for f in found:
        trace = json.loads(open(f["trace"]).read())
        assert len(trace["ops"]) <= 5 and trace["expect"]["verdict"] == "fail"  # shrunk
        assert (corpus / os.path.basename(f["trace"])).exists()
    suite = ET.parse(out / "junit.xml").getroot()
    assert int(suite.get("failures")) == len(report["findings"])


def test_bad_shard_is_usage_error(tmp_path, capsys):
    assert main(["nightly", "--time-budget", "5", "--out", str(tmp_path), "--shard", "3/2"]) == 2
    assert "--shard" in capsys.readouterr().err


def test_resume_with_other_settings_is_refused(tmp_path, capsys):
    out = tmp_path / "n"
    assert main(["nightly", "--time-budget", "2", "--out", str(out), "--corpus", "",
                 "--runner", "v1", "--examples-per-seed", "2"]) == 0
    capsys.readouterr()
    assert main(["nightly", "--time-budget", "2", "--out", str(out), "--corpus", "",
                 "--runner", "v2", "--examples-per-seed", "2"]) == 2
    assert "was started with" in capsys.readouterr().err
