"""bench/find_rate.py's comparison of two find-rate tables (``--against``): what
the search-power criterion of a change is read from."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def find_rate():
    sys.path.insert(0, str(BENCH))  # find_rate imports its sibling _args
    try:
        spec = importlib.util.spec_from_file_location("find_rate", BENCH / "find_rate.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(BENCH))


def _row(fault, seed, examples=None):
    return {"fault": fault, "seed": seed, "found": examples is not None,
            "examples": 200 if examples is None else examples}


def test_compare_pairs_seeds_and_counts_what_moved(find_rate):
    old = [_row("a", 0, 5), _row("a", 1, 10), _row("b", 0, 3), _row("b", 1, 4),
           _row("c", 0, 7), _row("d", 0), _row("d", 1, 6)]
    now = [_row("a", 0, 5), _row("a", 1), _row("b", 0, 3), _row("b", 1, 2),
           _row("b", 2, 9), _row("d", 0, 50), _row("d", 1, 156)]
    # (b's seed 2 and c's seed 0 have no partner; d: a miss found, a find lost, same median)
    moved, counts = find_rate.compare(now, old, examples=200)
    by = {m["fault"]: m for m in moved}
    assert set(by) == {"a", "b", "d"}
    assert (by["a"]["found_before"], by["a"]["found_now"]) == (2, 1)
    assert (by["a"]["median_before"], by["a"]["median_now"]) == (7.5, 102.5)  # a miss: 200
    assert (by["b"]["median_before"], by["b"]["median_now"]) == (3.5, 2.5)
    assert (by["d"]["found_before"], by["d"]["found_now"]) == (1, 2)
    assert by["d"]["median_before"] == by["d"]["median_now"] == 103
    assert counts == {"fewer": 1, "more": 1, "higher": 1, "lower": 1, "faults": 3,
                      "unpaired": 2}


def test_bad_tables_are_one_line_errors(find_rate, tmp_path):
    (tmp_path / "ok.json").write_text(json.dumps({"rows": [_row("a", 0, 5)]}))
    (tmp_path / "other.json").write_text(json.dumps({"summary": []}))
    (tmp_path / "broken.json").write_text("{")
    assert find_rate.load_rows(str(tmp_path / "ok.json"), "--rows") == [_row("a", 0, 5)]
    for name, says in (("missing.json", "missing.json"), ("other.json", "no rows"),
                       ("broken.json", "not JSON")):
        with pytest.raises(ValueError, match=says) as e:
            find_rate.load_rows(f"{tmp_path / 'ok.json'},{tmp_path / name}", "--against")
        assert "\n" not in str(e.value) and str(e.value).startswith("--against: ")
    assert find_rate.main(["--rows", str(tmp_path / "broken.json")]) == 2
