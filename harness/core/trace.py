"""Traces: the op vocabulary, canonical JSON, loading with one-line errors.

A trace is ``{"format": "blockfuzz-trace", "version": 1, "config": {...},
"ops": [...], "expect": {...}, "meta": {...}}`` (docs/traces.md).
``expect`` is the verdict when the trace is replayed with ``meta.faults``
switched on; with no fault, every committed trace must pass.

Ops are JSON objects whose field ``op`` names the kind; the vocabulary, each
op's fields and an example live in the op registry (:mod:`harness.core.ops`;
``blockfuzz ops`` lists it).  ``expect.op_index`` -1 means the violation
happens at start-up (graph capture), before the first op.

``blocks`` lists block ids per KV-cache group, in config group order.
Structure is checked with JSON Schema; legality (free blocks, live requests,
sizes) by a dry run through the reference, so a bad trace is refused before
anything runs or is written.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import jsonschema

from reference import ConfigError, OpError, RunnerConfig, config_from_json, reference_runner

from harness.core.ops import REGISTRY as OPS
from harness.core.ops import apply_op

FORMAT = "blockfuzz-trace"
VERSION = 1
VERDICTS = ("pass", "fail")
_TOP_SCHEMA = {
    "type": "object",
    "required": ["format", "version", "config", "ops"],
    "additionalProperties": False,
    "properties": {
        "format": {"const": FORMAT},
        "version": {"type": "integer"},
        "config": {"type": "object"},
        "ops": {"type": "array", "items": {"type": "object"}},
        "expect": {"type": "object", "additionalProperties": False,
                   "required": ["verdict"],
                   "properties": {"verdict": {"enum": list(VERDICTS)},
                                  "invariant": {"type": ["string", "null"]},
                                  "op_index": {"type": ["integer", "null"]}}},
        "meta": {"type": "object"},
    },
}


class TraceError(ValueError):
    """A trace cannot be used. ``str()`` is one line: file, where, what."""

    def __init__(self, source: str, where: str, message: str):
        super().__init__(f"{source}: {where}: {message}" if where else f"{source}: {message}")
        self.source, self.where = source, where


@dataclass
class Trace:
    """A parsed trace. ops are plain dicts as in the JSON."""

    config: RunnerConfig
    ops: list[dict]
    expect: dict = field(default_factory=lambda: {"verdict": "pass"})
    meta: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "config": self.config.to_json(),
                "ops": self.ops, "expect": self.expect, "meta": self.meta}

    def dumps(self) -> str:
        return canonical_json(self.to_json())

    @property
    def faults(self) -> list[str]:
        return list(self.meta.get("faults", []))


def canonical_json(obj) -> str:
    """Sorted keys, one op per line, trailing newline: same trace, same bytes."""
    if isinstance(obj, dict) and "ops" in obj:
        head = {k: v for k, v in obj.items() if k != "ops"}
        body = json.dumps(head, sort_keys=True, indent=1)
        ops = ",\n".join("  " + json.dumps(op, sort_keys=True) for op in obj["ops"])
        return body[:-2] + ',\n "ops": [\n' + ops + "\n ]\n}\n"
    return json.dumps(obj, sort_keys=True, indent=1) + "\n"


def _path(error: jsonschema.ValidationError, prefix: str) -> str:
    parts = [prefix] if prefix else []
    for p in error.absolute_path:
        parts.append(f"[{p}]" if isinstance(p, int) else ("." if parts else "") + str(p))
    return "".join(parts) or "(top level)"


def _schema_check(instance, schema, source: str, prefix: str) -> None:
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(instance), key=lambda e: list(e.absolute_path))
    if errors:
        raise TraceError(source, _path(errors[0], prefix), errors[0].message)


def check_op_shape(op, where: str, source: str, runner: str | None = None) -> None:
    """Structural check of one op; raises :class:`TraceError` (an unknown op's
    message lists the ops of ``runner``'s model, or every op)."""
    if not isinstance(op, dict):
        raise TraceError(source, where, "op must be an object")
    kind = op.get("op")
    if not isinstance(kind, str) or kind not in OPS:
        known = [n for n, s in OPS.items() if runner is None or runner in s.runners]
        raise TraceError(source, f"{where}.op", f"unknown op {kind!r}; known"
                         f"{f' for runner {runner}' if runner else ''}: {', '.join(known)}")
    _schema_check(op, OPS[kind].schema(), source, where)


def parse(obj, source: str = "<trace>") -> Trace:
    """Validate structure and legality; raises :class:`TraceError`."""
    if not isinstance(obj, dict):
        raise TraceError(source, "", "a trace must be a JSON object")
    if obj.get("format") != FORMAT:
        raise TraceError(source, "format", f"expected {FORMAT!r}, got {obj.get('format')!r}")
    version = obj.get("version")
    if isinstance(version, int) and not isinstance(version, bool) and version > VERSION:
        raise TraceError(source, "version", f"trace version {version} is newer than this "
                         f"blockfuzz understands ({VERSION}); upgrade blockfuzz")
    _schema_check(obj, _TOP_SCHEMA, source, "")
    _reject_floats({k: obj.get(k) for k in ("version", "config", "ops", "expect")}, source, "")
    if version != VERSION:
        raise TraceError(source, "version", f"unsupported version {version}; expected {VERSION}")
    try:
        config = config_from_json(obj["config"])
    except ConfigError as e:
        where = f"config.{e.field}" if e.field else "config"
        raise TraceError(source, where, str(e).split(": ", 1)[1]) from None
    ops = obj["ops"]
    for i, op in enumerate(ops):
        check_op_shape(op, f"ops[{i}]", source, config.runner)
        token_slots = "sglang" in OPS[op["op"]].runners
        if token_slots != (config.runner == "sglang"):
            raise TraceError(source, f"ops[{i}].op", f"{op['op']} is a "
                             f"{'token-slot' if token_slots else 'block-table'} op; this "
                             f"trace's config is runner {config.runner!r}")
    trace = Trace(config, ops, obj.get("expect", {"verdict": "pass"}), obj.get("meta", {}))
    _check_meta(trace, source)
    dry_run(trace, source)
    return trace


def _reject_floats(obj, source: str, where: str) -> None:
    """JSON Schema counts 1.0 as an integer; a trace must not (it would not round-trip)."""
    if isinstance(obj, float):
        raise TraceError(source, where or "(top level)", f"must be an integer, got {obj!r}")
    if isinstance(obj, dict):
        for k in sorted(obj, key=str):
            _reject_floats(obj[k], source, f"{where}.{k}" if where else str(k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            _reject_floats(v, source, f"{where}[{i}]")


def _reject_nonfinite(obj, source: str, where: str) -> None:
    """NaN / Infinity are not JSON: a trace that holds them could not be written back."""
    if isinstance(obj, float) and not math.isfinite(obj):
        raise TraceError(source, where, f"{obj!r} is not a JSON number")
    if isinstance(obj, dict):
        for k in sorted(obj, key=str):
            _reject_nonfinite(obj[k], source, f"{where}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            _reject_nonfinite(v, source, f"{where}[{i}]")


def _check_meta(trace: Trace, source: str) -> None:
    from gpu_impl.faults import CATALOGUE  # catalogue only; no kernels imported

    _reject_nonfinite(trace.meta, source, "meta")
    faults = trace.meta.get("faults", [])
    if not isinstance(faults, list):
        raise TraceError(source, "meta.faults", "must be a list of fault ids")
    for i, f in enumerate(faults):
        if not isinstance(f, str) or f not in CATALOGUE:
            raise TraceError(source, f"meta.faults[{i}]", f"unknown fault {f!r}")
    from harness.core.invariants import IMPL_CRASH, START_OP_INDEX, ids

    invariant = trace.expect.get("invariant")
    if invariant is not None and invariant not in (*ids(), IMPL_CRASH):
        raise TraceError(source, "expect.invariant", f"unknown invariant {invariant!r}; "
                         f"known: {', '.join(ids())}")
    from harness.core.invariants import REGISTRY as INVARIANTS

    if invariant in INVARIANTS and trace.config.runner not in INVARIANTS[invariant].runners:
        raise TraceError(source, "expect.invariant", f"{invariant} judges runner(s) "
                         f"{', '.join(INVARIANTS[invariant].runners)}; this trace's config is "
                         f"runner {trace.config.runner}")
    op_index = trace.expect.get("op_index")
    if op_index is not None and not (START_OP_INDEX <= op_index < len(trace.ops)):
        raise TraceError(source, "expect.op_index", f"{op_index} is not an op index "
                         f"(0..{len(trace.ops) - 1}, or -1 for start-up)")
    _check_expect_by_release(trace, source, (*ids(), IMPL_CRASH))


RELEASE_VERDICT_KEYS = {"pass": {"mode"}, "n/a": {"reason", "mode"},
                        "fail": {"invariant", "op_index", "op", "mode"}}
VLLM_MODES = ("runner", "adapter")
"""How the vllm target ran a trace (:func:`harness.targets.vllm.target_mode`): a
verdict's optional ``mode``; absent means ``adapter``, the only mode before
runner mode existed."""


def _check_expect_by_release(trace: Trace, source: str, known: tuple) -> None:
    """``meta.expect_by_release``: {release "X.Y.Z": {"verdict": "pass"} |
    {"verdict": "fail", "invariant": ID, "op_index": N} | {"verdict": "n/a",
    "reason": TEXT}} — what was measured on each vLLM release, each with an
    optional ``"mode"`` (:data:`VLLM_MODES`) saying which code ran it."""
    import re

    from harness.core.invariants import START_OP_INDEX

    by_release = trace.meta.get("expect_by_release")
    if by_release is None:
        return
    where = "meta.expect_by_release"
    if not isinstance(by_release, dict):
        raise TraceError(source, where, "must be an object {release: verdict}")
    for release, v in by_release.items():
        at = f"{where}.{release}"
        if not re.fullmatch(r"\d+\.\d+\.\d+\S*", release):
            raise TraceError(source, at, "not a release version (X.Y.Z, e.g. 0.26.0)")
        if not isinstance(v, dict) or not isinstance(v.get("verdict"), str) \
                or v["verdict"] not in RELEASE_VERDICT_KEYS:
            raise TraceError(source, at, 'must be {"verdict": "pass" | "fail" | "n/a", ...}')
        extra = set(v) - {"verdict"} - RELEASE_VERDICT_KEYS[v["verdict"]]
        if extra:
            raise TraceError(source, f"{at}.{sorted(extra)[0]}",
                             f"not a field of a {v['verdict']!r} verdict")
        if v["verdict"] == "fail":
            if v.get("invariant") not in known:
                raise TraceError(source, f"{at}.invariant",
                                 f"unknown invariant {v.get('invariant')!r}")
            index = v.get("op_index")
            if isinstance(index, bool) or not isinstance(index, int) or \
                    not START_OP_INDEX <= index < len(trace.ops):
                raise TraceError(source, f"{at}.op_index", f"{index!r} is not an op index "
                                 f"(0..{len(trace.ops) - 1}, or -1 for start-up)")
        if v.get("mode", "adapter") not in VLLM_MODES:
            raise TraceError(source, f"{at}.mode", f"must be one of {', '.join(VLLM_MODES)}")
        if v["verdict"] == "n/a" and not isinstance(v.get("reason", ""), str):
            raise TraceError(source, f"{at}.reason", "must be a string")


def apply_as_recorded(runner, config, op: dict) -> None:
    """Apply ``op`` to a reference runner alone, as a replay mirrors it: an op
    whose target chooses (``admit`` / ``allocate``) with its recorded choice
    where the reference can tell that choice was open to a KV-cache manager
    (:func:`_choice_open`: the prefix hit and window frees the reference
    expects, new blocks that were free) — the manager's policy may differ
    from the reference's own, and later ops name the blocks it chose;
    otherwise (no record, or one no manager could have made) the reference
    chooses, and a replay judges the target's choice.  Raises
    :class:`reference.OpError` when the op is illegal."""
    from harness.core.ops import spec_of
    from harness.core.ops.scheduler import without_recorded

    spec = spec_of(op)
    mirrored = False
    if spec.records and op.get("blocks") is not None:
        if spec.check is not None:  # the op's own fields first, as a replay does
            spec.check(runner, op)
        mirrored = _choice_open(runner.ledger, config, op)
    apply_op(runner, op if mirrored else without_recorded(op))


def _choice_open(ledger, config, op: dict) -> bool:
    """Could a KV-cache manager have made ``op``'s recorded choice?  The same
    prefix hit (hit blocks, null pads) and window frees as the reference's own
    choice, as many new blocks per group, each free (unheld; a cached block may
    be evicted) and none twice."""
    from harness.core.invariants.scheduler import malformed
    from reference.kv_cache_manager import choose_admit, choose_allocate, choose_skipped

    if malformed(config, ledger, op) is not None:
        return False
    if op["op"] == "admit":
        tokens = ledger.prompt_tokens(op["req"], op["prompt_len"], op["prefix"])
        own, hit = choose_admit(ledger, tokens, op["num_new_tokens"])
        if own is None or op.get("num_cached_tokens") != hit:
            return False
        fixed = [len(ids) - len([b for b in ids[config.hit_columns(g, hit):]
                                 if b != config.null_block(g)])
                 for g, ids in enumerate(own)]  # hit blocks and null pads, in front
    else:
        if any(op.get("freed") or []) or any(choose_skipped(ledger, op["req"])):
            return False  # window frees: the reference's own choice decides
        own = choose_allocate(ledger, op["req"], op["num_new_tokens"])
        if own is None:
            return False
        fixed = [len(ids) - len([b for b in ids if b != config.null_block(g)])
                 for g, ids in enumerate(own)]
    taken = set()
    for g, (mine, theirs) in enumerate(zip(own, op["blocks"])):
        if len(mine) != len(theirs) or mine[:fixed[g]] != theirs[:fixed[g]]:
            return False
        for b in theirs[fixed[g]:]:
            pool_key = (ledger.pool_of(g) if config.kv_sharing else g, b)
            if b == config.null_block(g) or pool_key in taken or ledger.ref_count[g][b] != 0:
                return False
            taken.add(pool_key)
    return True


def dry_run(trace: Trace, source: str = "<trace>") -> None:
    """Run the ops through the reference to prove each one legal
    (:func:`apply_as_recorded`)."""
    runner = reference_runner(trace.config)
    for i, op in enumerate(trace.ops):
        try:
            apply_as_recorded(runner, trace.config, op)
        except OpError as e:
            where = f"ops[{i}] ({op['op']})" + (f".{e.field}" if e.field else "")
            raise TraceError(source, where, str(e).split(": ", 1)[-1]) from None


def load(path: str | Path) -> Trace:
    """Read and validate a trace file; raises :class:`TraceError` (one line)."""
    source = str(path)
    return parse(read_json(path), source)


def read_json(path: str | Path):
    """JSON from ``path``; every way it can fail is a one-line :class:`TraceError`."""
    source = str(path) or "''"
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise TraceError(source, "", f"cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise TraceError(source, f"byte {e.start}", "not UTF-8 text") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise TraceError(source, f"line {e.lineno} column {e.colno}",
                         f"not JSON: {e.msg}") from None
    except RecursionError:
        raise TraceError(source, "", "JSON nested too deeply") from None
    except ValueError as e:  # e.g. integers beyond Python's digit limit
        raise TraceError(source, "", f"not usable JSON: {e}") from None


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` so that no half-written file is ever visible at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
