"""harness/trace.py: canonical bytes, and one-line errors for every kind of bad input."""

import json
import re

import pytest

from harness.core.trace import Trace, TraceError, canonical_json, load, parse
from reference import RunnerConfig

GOOD_OPS = [
    {"op": "add", "req": 0, "blocks": [[1, 2], [3]], "prompt_len": 5},
    {"op": "step", "scheduled": [[0, 5]], "cudagraph_mode": "PIECEWISE"},
    {"op": "remove", "req": 0},
]


def _good():
    return json.loads(Trace(RunnerConfig(), [dict(o) for o in GOOD_OPS]).dumps())


def test_canonical_json_is_stable_and_round_trips():
    text = Trace(RunnerConfig(), GOOD_OPS).dumps()
    assert text.endswith("}\n") and text == canonical_json(json.loads(text))
    again = parse(json.loads(text))
    assert again.dumps() == text


def _mutated(path, value):
    obj = _good()
    *head, last = path
    target = obj
    for key in head:
        target = target[key]
    if value is KeyError:
        del target[last]
    else:
        target[last] = value
    return obj


BAD = [
    (("format",), "nope", "format"),
    (("version",), 2, "newer"),
    (("version",), "1", "version"),
    (("ops", 0, "op"), "explode", "ops[0].op"),
    (("ops", 0, "blocks", 0, 0), 0, "ops[0] (add).blocks[0][0]"),
    (("ops", 0, "blocks", 0, 0), 99, "out of range"),
    (("ops", 1, "scheduled", 0, 0), 5, "ops[1] (step).scheduled[0][0]"),
    (("ops", 1, "cudagraph_mode"), "EAGER", "ops[1].cudagraph_mode"),
    (("ops", 2, "req"), KeyError, "ops[2]"),
    (("config", "num_blocks"), 1, "config.num_blocks"),
    (("config", "groups", 0, "kind"), "ssm", "config.groups[0].kind"),
    (("config", "bogus"), 1, "config.bogus"),
    (("expect", "verdict"), "maybe", "expect.verdict"),
]


@pytest.mark.parametrize("path, value, where", BAD)
def test_bad_trace_is_one_line_naming_the_field(path, value, where):
    with pytest.raises(TraceError) as e:
        parse(_mutated(path, value), "t.json")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("t.json: ") and where in msg


def test_block_owned_twice_and_removed_request(tmp_path):
    obj = _good()
    obj["ops"].insert(1, {"op": "add", "req": 1, "blocks": [[2], [4]], "prompt_len": 1})
    with pytest.raises(TraceError, match=r"ops\[1\] \(add\)\.blocks\[0\]\[0\]: block 2 is not free"):
        parse(obj, "t.json")
    obj = _good()
    obj["ops"].append({"op": "kv_load", "req": 0})
    with pytest.raises(TraceError, match=r"ops\[3\] \(kv_load\)\.req: request 0 is not live"):
        parse(obj, "t.json")


def test_not_json_and_missing_file(tmp_path):
    p = tmp_path / "x.json"
    p.write_text("{nope")
    with pytest.raises(TraceError, match="not JSON"):
        load(p)
    with pytest.raises(TraceError, match="cannot read"):
        load(tmp_path / "missing.json")


@pytest.mark.parametrize("by_release, field", [
    ([1], "meta.expect_by_release"),
    ({"0.26.0": "fail"}, "meta.expect_by_release.0.26.0"),
    ({"0.26.0": {"verdict": "maybe"}}, "meta.expect_by_release.0.26.0"),
    ({"0.26.0": {"verdict": ["fail"]}}, "meta.expect_by_release.0.26.0"),
    ({"0.26.0": {"verdict": "fail", "invariant": "NOPE", "op_index": 0}},
     "meta.expect_by_release.0.26.0.invariant"),
    ({"0.26.0": {"verdict": "fail", "invariant": "NO_STALE_WRITE", "op_index": "0"}},
     "meta.expect_by_release.0.26.0.op_index"),
    ({"0.26.0": {"verdict": "pass", "invariant": "NO_STALE_WRITE"}},
     "meta.expect_by_release.0.26.0.invariant"),
    ({"banana": {"verdict": "pass"}}, "meta.expect_by_release.banana"),
])
def test_expect_by_release_is_validated(by_release, field):
    """What bisect --write and fuzz --target vllm record is checked on load: a
    malformed record is one line naming the field, not a crash or a MISMATCH."""
    obj = json.loads(Trace(RunnerConfig(), [{"op": "add", "req": 0, "blocks": [[1], [2]],
                                             "prompt_len": 1}]).dumps())
    obj["meta"] = {"expect_by_release": by_release}
    with pytest.raises(TraceError, match=re.escape(field)):
        parse(obj)
