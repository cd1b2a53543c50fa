"""Scenarios: one hand-written story that runs on every engine.

A trace belongs to one model (block tables, or SGLang's token slots), because
the ops name what that model's engine is given.  A *scenario* names only what
a user of any engine does — requests arrive (sharing a prefix of an earlier
prompt), the running batch decodes, an idle rank replays a padded graph,
requests finish, the prefix cache evicts — and :meth:`Scenario.trace_for`
turns it into the trace of the model a target runs, so ``blockfuzz replay
SCENARIO --target sglang`` and ``--target vllm`` run one story on two engines
(corpus: ``corpora/scenarios/``).

File format (JSON)::

    {"format": "blockfuzz-scenario", "version": 1,
     "geometry": {"page_size": 4, "num_tokens": 64, "max_num_reqs": 4,
                  "max_len": 32, "capture_sizes": [1, 2, 4], "prefix_caching": true},
     "steps": [{"op": "arrive", "req": 0, "prompt_len": 9},
               {"op": "arrive", "req": 1, "prompt_len": 12, "prefix": [0, 8]},
               {"op": "decode"}, {"op": "idle", "bs": 4},
               {"op": "finish", "req": 0}, {"op": "evict"}],
     "meta": {"story": "..."}}

How each step becomes ops:

| step | token slots (SGLang) | block tables (vLLM, gpu_impl; the engine's KV-cache manager) |
| --- | --- | --- |
| ``arrive`` | ``sgl_admit`` | ``admit`` (its prefix hit as the oracle expects it), then a ``step`` of the rest of the prompt (``NONE``) |
| ``decode`` | ``sgl_decode`` | an ``allocate`` of one token per running request, then a one-token ``step`` of all of them (``FULL``) |
| ``idle`` | ``sgl_idle`` | ``dummy_run`` of ``bs`` rows and tokens (``FULL``) |
| ``finish`` | ``sgl_finish`` | ``remove`` |
| ``evict`` | ``sgl_evict`` of the whole pool | nothing: vLLM's manager evicts when it allocates |

``prefix: [src, n]`` shares the first ``n`` tokens of request ``src``'s
prompt (both models read it so when ``n`` is at most that prompt).
Geometry: a page (SGLang) is a block (vLLM) of ``page_size`` tokens; the
block-table engine gets one attention group and a null block beside the
``num_tokens / page_size`` blocks.  Errors are :class:`ScenarioError`, one
line naming the file and field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

FORMAT = "blockfuzz-scenario"
VERSION = 1
GEOMETRY = {"page_size": 4, "num_tokens": 64, "max_num_reqs": 4, "max_len": 32,
            "capture_sizes": [1, 2, 4], "prefix_caching": True}
STEP_FIELDS = {"arrive": {"req", "prompt_len", "prefix"}, "decode": set(),
               "idle": {"bs"}, "finish": {"req"}, "evict": set()}


class ScenarioError(ValueError):
    """A scenario that cannot be read or run: ``source: where: why``."""

    def __init__(self, source: str, where: str, message: str):
        super().__init__(f"{source}: {where}: {message}" if where else f"{source}: {message}")


def is_scenario(path) -> bool:
    """Does the JSON file at ``path`` say it is a scenario (a cheap look, no validation)?"""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8")).get("format") == FORMAT
    except (OSError, ValueError, AttributeError, RecursionError):
        return False  # not a scenario: the trace loader says what is wrong with it


@dataclass
class Scenario:
    """A validated scenario: ``geometry`` (every field of :data:`GEOMETRY`),
    ``steps`` (dicts), ``meta``, ``source`` (for messages)."""

    geometry: dict
    steps: list
    meta: dict
    source: str = "<scenario>"

    def trace_for(self, target: str, runner: str | None = None):
        """The :class:`~harness.core.trace.Trace` of this scenario for ``target``
        (its model: token slots for a target of runner ``sglang``, else block
        tables on ``runner``, v1 by default).  Raises :class:`ScenarioError`
        when a step cannot run there (the oracle refuses it: the geometry is
        too small for the story)."""
        from harness.targets import target_spec

        runners = target_spec(target).runners
        if runners == ("sglang",):
            return self._token_slot_trace()
        return self._block_table_trace(runner or "v1")

    # -- token slots ------------------------------------------------------------------
    def _token_slot_trace(self):
        from reference.config import ConfigError
        from reference.token_slots import TokenSlotConfig

        g = self.geometry
        try:
            config = TokenSlotConfig(num_slots=g["num_tokens"], page_size=g["page_size"],
                                     max_num_reqs=g["max_num_reqs"],
                                     max_context_len=g["max_len"],
                                     capture_bs=tuple(g["capture_sizes"]),
                                     radix_cache=g["prefix_caching"])
        except ConfigError as e:
            names = {"num_slots": "num_tokens", "max_context_len": "max_len",
                     "capture_bs": "capture_sizes", "radix_cache": "prefix_caching"}
            raise ScenarioError(self.source, f"geometry.{names.get(e.field, e.field)} (as a "
                                "token-slot config)", str(e).split(": ", 1)[-1]) from None
        ops = []
        for s in self.steps:
            kind = s["op"]
            if kind == "arrive":
                op = {"op": "sgl_admit", "req": s["req"], "prompt_len": s["prompt_len"]}
                if s.get("prefix"):
                    op["prefix"] = list(s["prefix"])
                ops.append(op)
            elif kind == "decode":
                ops.append({"op": "sgl_decode"})
            elif kind == "idle":
                ops.append({"op": "sgl_idle", "bs": s["bs"]})
            elif kind == "finish":
                ops.append({"op": "sgl_finish", "req": s["req"]})
            else:
                ops.append({"op": "sgl_evict", "num_tokens": g["num_tokens"]})
        return self._checked(config, ops, [[op] for op in ops])

    # -- block tables -----------------------------------------------------------------
    def _block_table_trace(self, runner: str):
        from reference import ATTENTION, GroupSpec, OpError, RunnerConfig, reference_runner
        from reference.config import ConfigError

        from harness.core.trace import apply_as_recorded

        g = self.geometry
        per_req = -(-g["max_len"] // g["page_size"])
        try:
            config = RunnerConfig(
                runner=runner, groups=(GroupSpec(ATTENTION, g["page_size"], g["page_size"]),),
                num_blocks=g["num_tokens"] // g["page_size"] + 1,
                max_num_reqs=g["max_num_reqs"], max_num_blocks_per_req=per_req,
                max_num_batched_tokens=max(g["max_len"], g["max_num_reqs"]),
                cudagraph_capture_sizes=tuple(g["capture_sizes"]), allocator="engine",
                enable_prefix_caching=g["prefix_caching"])
        except (ConfigError, TypeError) as e:
            raise ScenarioError(self.source, f"geometry (as a {runner} config"
                                + (f": {e.field})" if getattr(e, "field", None) else ")"),
                                str(e).split(": ", 1)[-1]) from None
        ref = reference_runner(config)
        running: list[int] = []
        groups = []
        for i, s in enumerate(self.steps):
            kind, ops = s["op"], []
            if kind == "arrive":
                prefix = list(s.get("prefix") or [])
                tokens = ref.ledger.prompt_tokens(s["req"], s["prompt_len"], prefix)
                hit = ref.ledger.expected_hit(tokens)[0]
                ops = [{"op": "admit", "req": s["req"], "prompt_len": s["prompt_len"],
                        "prefix": prefix, "num_new_tokens": s["prompt_len"] - hit},
                       {"op": "step", "scheduled": [[s["req"], s["prompt_len"] - hit]],
                        "cudagraph_mode": "NONE"}]
            elif kind == "decode":
                ops = [{"op": "allocate", "req": r, "num_new_tokens": 1} for r in running]
                ops.append({"op": "step", "scheduled": [[r, 1] for r in running],
                            "cudagraph_mode": "FULL"})
            elif kind == "idle":
                ops = [{"op": "dummy_run", "num_reqs": s["bs"], "num_tokens": s["bs"],
                        "cudagraph_mode": "FULL"}]
            elif kind == "finish":
                ops = [{"op": "remove", "req": s["req"]}]
            for op in ops:  # the oracle takes each op as the search would: legal, or refused
                try:
                    chosen = apply_as_recorded(ref, config, op)
                except OpError as e:
                    raise ScenarioError(self.source, f"steps[{i}] ({kind})",
                                        f"cannot run on a {runner} engine: {op['op']}: {e}"
                                        ) from None
                if op["op"] == "admit" and (chosen or {}).get("blocks") is None \
                        and op.get("blocks") is None and not _admitted(ref, op["req"]):
                    raise ScenarioError(self.source, f"steps[{i}] ({kind})",
                                        "the block pool is too small for this request")
            if kind == "arrive":
                running.append(s["req"])
            elif kind == "finish":
                running.remove(s["req"])
            groups.append(ops)
        return self._checked(config, [op for ops in groups for op in ops], groups,
                             dry_run=False)

    def _checked(self, config, ops, groups, dry_run: bool = True):
        from harness.core.trace import Trace, TraceError, dry_run as check

        meta = dict(self.meta, scenario=self.source,
                    scenario_steps=[len(g) for g in groups])
        trace = Trace(config, ops, {"verdict": "pass"}, meta)
        if dry_run:
            try:
                check(trace, self.source)
            except TraceError as e:
                raise ScenarioError(self.source, "", f"cannot run on a token-slot engine: "
                                    f"{str(e).split(': ', 1)[-1]}") from None
        return trace


def _admitted(ref, req: int) -> bool:
    return req in ref.ledger.requests


def parse(obj, source: str = "<scenario>") -> Scenario:
    """Validate a scenario object; raises :class:`ScenarioError` naming the field."""
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise ScenarioError(source, "format", f"expected {FORMAT!r}")
    if obj.get("version") != VERSION:
        raise ScenarioError(source, "version", f"expected {VERSION}, got {obj.get('version')!r}")
    unknown = sorted(set(obj) - {"format", "version", "geometry", "steps", "meta"})
    if unknown:
        raise ScenarioError(source, unknown[0], "not a scenario field")
    geometry = dict(GEOMETRY)
    given = obj.get("geometry", {})
    if not isinstance(given, dict):
        raise ScenarioError(source, "geometry", "must be an object")
    for k, v in given.items():
        if k not in GEOMETRY:
            raise ScenarioError(source, f"geometry.{k}", f"unknown; known: {', '.join(GEOMETRY)}")
        want = type(GEOMETRY[k])
        kind = {int: "a positive integer", bool: "true or false",
                list: "a list of positive integers"}[want]
        if type(v) is not want or (want is int and v < 1) or (want is list and any(
                type(x) is not int or x < 1 for x in v)):
            raise ScenarioError(source, f"geometry.{k}", f"must be {kind}, got {v!r}")
        geometry[k] = v
    if not isinstance(obj.get("meta", {}), dict):
        raise ScenarioError(source, "meta", "must be an object")
    steps = obj.get("steps")
    if not isinstance(steps, list) or not steps:
        raise ScenarioError(source, "steps", "must be a non-empty list")
    prompts: dict[int, int] = {}
    for i, s in enumerate(steps):
        where = f"steps[{i}]"
        if not isinstance(s, dict) or s.get("op") not in STEP_FIELDS:
            raise ScenarioError(source, f"{where}.op", f"one of {', '.join(STEP_FIELDS)}")
        extra = sorted(set(s) - {"op"} - STEP_FIELDS[s["op"]])
        if extra:
            raise ScenarioError(source, f"{where}.{extra[0]}", f"not a field of {s['op']}")
        for k in sorted(STEP_FIELDS[s["op"]] - {"prefix"}):
            if type(s.get(k)) is not int or s[k] < (0 if k == "req" else 1):
                raise ScenarioError(source, f"{where}.{k}", "must be an integer"
                                    + (" >= 0" if k == "req" else " >= 1"))
        if s["op"] == "arrive":
            if s["req"] in prompts:
                raise ScenarioError(source, f"{where}.req", f"request {s['req']} arrived before")
            prefix = s.get("prefix")
            if prefix is not None:
                if not (isinstance(prefix, list) and len(prefix) == 2
                        and all(type(x) is int for x in prefix)):
                    raise ScenarioError(source, f"{where}.prefix", "must be [src, n]")
                src, n = prefix
                if src not in prompts or not 1 <= n <= min(prompts[src], s["prompt_len"]):
                    raise ScenarioError(source, f"{where}.prefix", "must name an earlier "
                                        "request and at most its prompt's and this prompt's "
                                        "length")
            prompts[s["req"]] = s["prompt_len"]
    return Scenario(geometry, steps, obj.get("meta", {}), source)


def load(path) -> Scenario:
    """Read and validate a scenario file; raises :class:`ScenarioError` (one line)."""
    source = str(path)
    try:
        obj = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise ScenarioError(source, "", f"cannot read: {e.strerror or e}") from None
    except ValueError as e:
        raise ScenarioError(source, "", f"not JSON: {e}") from None
    return parse(obj, source)
