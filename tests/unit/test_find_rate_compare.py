"""bench/find_rate.py's find-rate tables read back and compared (``--rows``,
``--against``: bench/_find_rate_tables.py): what the search-power criterion of
a change is read from."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def tables():
    # The helper alone: find_rate.py itself sets TRITON_INTERPRET on import.
    spec = importlib.util.spec_from_file_location("_find_rate_tables",
                                                  BENCH / "_find_rate_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row(fault, seed, examples=None):
    return {"fault": fault, "seed": seed, "found": examples is not None,
            "examples": 200 if examples is None else examples, "search_s": 1.0,
            "shrink_s": 0.0, "shrink_replays": 0}


def test_compare_pairs_seeds_and_counts_what_moved(tables):
    old = [_row("a", 0, 5), _row("a", 1, 10), _row("b", 0, 3), _row("b", 1, 4),
           _row("c", 0, 7), _row("d", 0), _row("d", 1, 6)]
    now = [_row("a", 0, 5), _row("a", 1), _row("b", 0, 3), _row("b", 1, 2),
           _row("b", 2, 9), _row("d", 0, 50), _row("d", 1, 156)]
    # (b's seed 2 and c's seed 0 have no partner; d: a miss found, a find lost, same median)
    moved, counts = tables.compare(now, old, examples=200)
    by = {m["fault"]: m for m in moved}
    assert set(by) == {"a", "b", "d"}
    assert (by["a"]["found_before"], by["a"]["found_now"]) == (2, 1)
    assert (by["a"]["median_before"], by["a"]["median_now"]) == (7.5, 102.5)  # a miss: 200
    assert (by["b"]["median_before"], by["b"]["median_now"]) == (3.5, 2.5)
    assert (by["d"]["found_before"], by["d"]["found_now"]) == (1, 2)
    assert by["d"]["median_before"] == by["d"]["median_now"] == 103
    assert counts == {"fewer": 1, "more": 1, "higher": 1, "lower": 1, "faults": 3,
                      "unpaired": 2}


def test_bad_tables_are_one_line_errors(tables, tmp_path):
    def write(name, rows):
        (tmp_path / name).write_text(json.dumps({"rows": rows}))
        return str(tmp_path / name)

    ok = write("ok.json", [_row("a", 0, 5)])
    assert tables.load_rows(ok, "--rows") == [_row("a", 0, 5)]
    (tmp_path / "broken.json").write_text("{")
    (tmp_path / "latin1.json").write_bytes(b"\xff\xfe{")
    cases = {
        str(tmp_path / "missing.json"): "missing.json",
        write("other.json", None): "no rows",
        write("empty.json", []): "no rows",
        str(tmp_path / "broken.json"): "not JSON",
        str(tmp_path / "latin1.json"): "not UTF-8",
        write("short.json", [{"fault": "a", "seed": 0, "found": True, "examples": 5}]):
            r"rows\[0\]: search_s",
        write("typed.json", [dict(_row("a", 1, 5), seed="1")]): r"rows\[0\]: seed",
        write("again.json", [_row("b", 0, 5), _row("a", 0, 7)]): "fault a seed 0 again",
        "": "an empty file name",
    }
    for path, says in cases.items():
        with pytest.raises(ValueError, match=says) as e:
            tables.load_rows(f"{ok},{path}", "--against")
        assert "\n" not in str(e.value) and str(e.value).startswith("--against: ")
