"""blockfuzz bisect without installing anything: the search over a fake
per-release verdict function, release parsing, and the CLI (table, exit
codes, --json, --write) with measurement stubbed."""

import json
import shutil
from pathlib import Path

import pytest

from harness.cli import main
from harness.tools import bisect as b

NINE = list(b.KNOWN_RELEASES)
FAIL = [{"verdict": "fail", "invariant": "VACATED_ROWS_ZERO", "op_index": 3, "op": "step"}]
PASS = [{"verdict": "pass"}]
TRACE = Path(__file__).resolve().parents[2] / "corpora" / "vllm" / \
    "v1-vacated-row-stale-after-condense.json"


def _fixed_at(first_fixed: str, runs: list):
    def measure(release):
        runs.append(release)
        return PASS if NINE.index(release) >= NINE.index(first_fixed) else FAIL
    return measure


@pytest.mark.parametrize("first_fixed", NINE[1:])
def test_bisect_finds_the_first_changed_release_within_five_runs(first_fixed):
    runs = []
    result = b.bisect(NINE, _fixed_at(first_fixed, runs))
    assert result.first_changed == first_fixed
    assert result.change[0] == NINE[NINE.index(first_fixed) - 1]
    assert len(runs) == len(set(runs)) <= 5  # both ends + log2(8) probes, none twice
    assert runs[:2] == [NINE[0], NINE[-1]]


def test_same_verdict_at_both_ends_runs_only_the_ends():
    runs = []
    result = b.bisect(NINE, lambda r: runs.append(r) or FAIL)
    assert result.change is None and runs == [NINE[0], NINE[-1]]


def test_verdicts_differ_by_invariant_too():
    other = [dict(FAIL[0], invariant="NO_STALE_WRITE")]
    result = b.bisect(["1.0", "2.0"], lambda r: FAIL if r == "1.0" else other)
    assert result.change == ("1.0", "2.0")


def test_release_lists():
    assert b.parse_releases("0.26.0..0.33.0") == NINE
    assert b.parse_releases("0.28.0..0.30.0") == ["0.28.0", "0.29.0", "0.30.0"]
    assert b.parse_releases("0.33.0, 0.26.0,0.30.0") == ["0.26.0", "0.30.0", "0.33.0"]
    for bad, says in (("0.26.0..0.25.0", "not a known release"),
                      ("0.30.0..0.26.0", "not older"), ("0.26.0", "at least two"),
                      ("0.26.0,0.26.0", "twice"), ("0.26.0,banana", "not a version")):
        with pytest.raises(b.BisectError, match=says):
            b.parse_releases(bad)


@pytest.fixture
def stubbed(monkeypatch, tmp_path):
    """Measurement without environments: 0.30.0 and later pass."""
    runs = []
    monkeypatch.setattr(b, "active_release", lambda engine="vllm": "0.26.0")
    monkeypatch.setattr(b.ReleaseEnvs, "python", lambda self, r: r)
    monkeypatch.setattr(b, "measure_in", lambda python, paths, engine="vllm":
                        _fixed_at("0.30.0", runs)(python) * len(paths))
    trace = tmp_path / "t.json"
    shutil.copy(TRACE, trace)
    return runs, trace


def test_cli_prints_the_change_point_and_exits_0(stubbed, capsys):
    runs, trace = stubbed
    assert main(["bisect", str(trace), "--releases", "0.26.0..0.33.0"]) == 0
    out = capsys.readouterr().out
    assert "first release where the verdict changes: 0.30.0 (after 0.29.0;" in out
    assert "(not run)" in out and len(runs) <= 5


def test_cli_json_and_write(stubbed, capsys):
    runs, trace = stubbed
    before = json.loads(trace.read_text())["meta"]["expect_by_release"]
    assert main(["bisect", str(trace), "--releases", "0.26.0,0.33.0", "--json",
                 "--write"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)  # stdout is the one JSON document
    assert "first release where the verdict changes" in captured.err
    assert report["change"] == ["0.26.0", "0.33.0"]
    assert [r["release"] for r in report["releases"] if r["measured"]] == ["0.26.0", "0.33.0"]
    recorded = json.loads(trace.read_text())["meta"]["expect_by_release"]
    assert recorded["0.33.0"] == {"verdict": "pass"}
    assert recorded["0.26.0"] == {"verdict": "fail", "invariant": "VACATED_ROWS_ZERO",
                                  "op_index": 3}
    assert recorded["0.30.0"] == before["0.30.0"]  # not measured: left as it was


def test_cli_no_change_exits_1_and_bad_releases_exit_2(stubbed, capsys):
    runs, trace = stubbed
    assert main(["bisect", str(trace), "--releases", "0.30.0..0.33.0"]) == 1
    assert "no change" in capsys.readouterr().out
    assert main(["bisect", str(trace), "--releases", "0.26.0..9.9.9"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "9.9.9" in err


def test_every_measures_all_releases_and_sees_a_flip_back():
    runs = []
    flips = {"0.27.0": FAIL, "0.28.0": FAIL}  # broken in two releases only

    def measure(release):
        runs.append(release)
        return flips.get(release, PASS)
    assert b.bisect(NINE, measure).change is None  # the ends agree: search stops
    runs.clear()
    result = b.bisect(NINE, measure, every=True)
    assert runs == NINE and result.change == ("0.26.0", "0.27.0")


def test_cli_every_runs_every_release(stubbed, capsys):
    runs, trace = stubbed
    assert main(["bisect", str(trace), "--releases", "0.26.0..0.33.0", "--every"]) == 0
    assert runs == NINE and "(not run)" not in capsys.readouterr().out
    assert main(["bisect", str(trace), "--releases", "0.30.0..0.33.0", "--every"]) == 1
    assert "every release listed gives the same verdicts" in capsys.readouterr().out


def test_release_spelling_and_equal_versions_are_refused():
    for bad, says in (("0.26.0,0.26", "as the package index spells it"),
                      ("v0.26.0,0.27.0", "as the package index spells it"),
                      ("0.26.0,0.26.00", "as the package index spells it")):
        with pytest.raises(b.BisectError, match=says):
            b.parse_releases(bad)


def test_unwritable_cache_is_refused_before_anything_runs(stubbed, capsys, tmp_path):
    runs, trace = stubbed
    afile = tmp_path / "afile"
    afile.write_text("")
    assert main(["bisect", str(trace), "--releases", "0.26.0,0.27.0", "--cache",
                 str(afile)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and runs == [] and "--cache" in err and err.count("\n") == 1


def test_token_slot_traces_bisect_sglang_releases(monkeypatch, tmp_path, capsys):
    """A token-slot trace is bisected over SGLang releases (its default range, its
    environments, the sglang target measuring); mixing kinds is one line, exit 2."""
    asked = []
    monkeypatch.setattr(b, "active_release", lambda engine="vllm": None)
    monkeypatch.setattr(b.ReleaseEnvs, "python",
                        lambda self, r: asked.append((self.engine, r)) or r)
    monkeypatch.setattr(b, "measure_in", lambda python, paths, engine="vllm": (
        asked.append(("measure", engine)) or [{"verdict": "pass"}] * len(paths)))
    sgl = TRACE.parents[1] / "sglang" / "prefix-hit-padding-and-eviction.json"
    assert main(["bisect", str(sgl), "--cache", str(tmp_path)]) == 1  # no change
    out = capsys.readouterr().out
    assert "SGLang 0.5.20, 0.5.21, 0.5.22, 0.5.23" in out and "sglang target" in out
    assert ("sglang", "0.5.20") in asked and ("measure", "sglang") in asked
    assert main(["bisect", str(sgl), str(TRACE), "--cache", str(tmp_path)]) == 2
    assert "mixed" in capsys.readouterr().err
