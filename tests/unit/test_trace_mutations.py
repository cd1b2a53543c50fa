"""Bad input never escapes as a traceback: Hypothesis mutates valid traces and
``parse`` either accepts them or raises TraceError with one line — never anything
else.  The CLI verbs that read traces turn that into exit 2."""

import copy
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.cli import main
from harness.core.trace import TraceError, load, parse

SEEDS = sorted((Path(__file__).resolve().parents[2] / "corpora" / "seeds").glob("*.json"))
VALID = [json.loads(p.read_text()) for p in SEEDS]

JUNK = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(),
                 st.text(max_size=5), st.lists(st.integers(-3, 100), max_size=3),
                 st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k in sorted(obj):
            yield from _paths(obj[k], prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


@st.composite
def mutated_traces(draw):
    obj = copy.deepcopy(draw(st.sampled_from(VALID)))
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(obj) if p]
        path = draw(st.sampled_from(paths))
        parent = obj
        for key in path[:-1]:
            parent = parent[key]
        action = draw(st.sampled_from(["replace", "delete", "duplicate"]))
        if action == "replace":
            parent[path[-1]] = draw(JUNK)
        elif action == "delete":
            del parent[path[-1]]
        elif isinstance(parent, list):
            parent.insert(path[-1], copy.deepcopy(parent[path[-1]]))
    return obj


@settings(max_examples=300)
@given(mutated_traces())
def test_mutated_trace_is_accepted_or_one_line_error(obj):
    try:
        parse(obj, "m.json")
    except TraceError as e:
        assert "\n" not in str(e) and str(e).startswith("m.json: ")


MALFORMED = {
    "not-json.json": "{ nope",
    "wrong-format.json": json.dumps({"format": "other", "version": 1, "config": {}, "ops": []}),
    "newer.json": json.dumps({"format": "blockfuzz-trace", "version": 9, "config": {}, "ops": []}),
    "unknown-op.json": json.dumps({"format": "blockfuzz-trace", "version": 1, "config": {},
                                   "ops": [{"op": "teleport"}]}),
    "removed-req.json": json.dumps({"format": "blockfuzz-trace", "version": 1, "config": {},
                                    "ops": [{"op": "remove", "req": 3}]}),
    "out-of-range.json": json.dumps({"format": "blockfuzz-trace", "version": 1, "config": {},
                                     "ops": [{"op": "add", "req": 0, "blocks": [[99], [1]],
                                              "prompt_len": 1}]}),
    "owned-twice.json": json.dumps({"format": "blockfuzz-trace", "version": 1, "config": {},
                                    "ops": [{"op": "add", "req": 0, "blocks": [[1], [1]],
                                             "prompt_len": 1},
                                            {"op": "add", "req": 1, "blocks": [[1], [2]],
                                             "prompt_len": 1}]}),
    "config-bounds.json": json.dumps({"format": "blockfuzz-trace", "version": 1,
                                      "config": {"max_num_reqs": 999}, "ops": []}),
    "float-version.json": json.dumps({"format": "blockfuzz-trace", "version": 1.0,
                                      "config": {}, "ops": []}),
    "unknown-invariant.json": json.dumps({"format": "blockfuzz-trace", "version": 1,
                                          "config": {}, "ops": [],
                                          "expect": {"verdict": "fail", "invariant": "NOPE"}}),
    "deep.json": "[" * 100000 + "]" * 100000,
    "huge-int.json": '{"format": "blockfuzz-trace", "version": ' + "9" * 5000 + "}",
}


@pytest.mark.parametrize("verb", ["replay", "explain", "shrink"])
@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_inputs_exit_2_one_line(verb, name, tmp_path, capsys):
    path = tmp_path / name
    path.write_text(MALFORMED[name])
    before = sorted(tmp_path.iterdir())
    assert main([verb, str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(path) in err
    assert sorted(tmp_path.iterdir()) == before  # nothing written


def test_a_directory_is_not_a_trace(tmp_path, capsys):
    assert main(["replay", str(tmp_path)]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_seeds_load():
    """Every seed loads; only a start-up finding (op_index -1) has no ops."""
    for trace in map(load, SEEDS):
        assert trace.ops or trace.expect.get("op_index") == -1, trace.meta.get("story")


def test_binary_file_is_not_a_trace(tmp_path, capsys):
    path = tmp_path / "binary.bin"
    path.write_bytes(bytes(range(256)) * 4)
    assert main(["replay", str(path)]) == 2
    assert "not UTF-8" in capsys.readouterr().err
