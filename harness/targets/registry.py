"""The target registry: one :class:`TargetSpec` per implementation the harness can
put under test, and the one refusal type every target raises.

The session, state machine, shrinker, reproducer scripts and CLI look a target
up here by name (:func:`target_spec`) and never name one themselves: the spec
says how to build it, which devices it runs on, what it refuses, which
geometry the fuzzer may draw for it and which engine release it is.  The
registered entries are listed in ``harness/targets/__init__.py`` (``REGISTRY``),
the one place a new target is added (docs/writing-a-target.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable


class TargetUnavailable(RuntimeError):
    """The target cannot run in this process (engine not installed or not
    importable, device it cannot use); the message says what to do."""


class TargetRefused(ValueError):
    """The target cannot express this configuration; ``field`` names the config
    field (``groups[0].kernel_block_size``), the message why and what to use."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


def _no_refusal(config) -> TargetRefused | None:
    return None


def _no_limits() -> dict:
    return {}


def _no_version() -> str | None:
    return None


@dataclass(frozen=True)
class TargetSpec:
    """One registered target.

    - ``name``: what ``--target`` takes; ``description``: one line for ``--help``;
    - ``factory(config, faults, device)``: the target object (the ``Target``
      protocol); faults is a tuple of fault ids, empty unless ``takes_faults``;
    - ``takes_faults``: whether gpu_impl faults (``--fault``, ``$BLOCKFUZZ_FAULTS``)
      apply — they are refused for any other target;
    - ``select_device(requested)``: the device policy — ``requested`` is
      ``auto``/``cpu``/``cuda`` or None (``$BLOCKFUZZ_DEVICE``); returns the device
      kind it will run on, raises :class:`TargetUnavailable` (one line) when it
      cannot; also the place to prepare the process (environment before imports);
    - ``refusal(config)``: a :class:`TargetRefused` for a config it cannot express,
      else None (the factory raises the same);
    - ``limits()``: keyword arguments for ``harness.search.geometry.runner_configs``
      (``token_slot_configs`` for a token-slot target: ``mamba``) that keep drawn
      geometry expressible;
    - ``version()``: the engine release under test for reports (``"vLLM 0.26.0"``),
      None for the in-repo targets;
    - ``snapshots(device_kind)``: whether a session on that device kind may be
      copied with ``copy.deepcopy`` and the copy goes on exactly as the
      original would (the shrinker's replay cache,
      :class:`harness.core.session.SnapshotCache`); False unless checked;
    - ``variant(config)``: which of the target's implementations runs ``config``
      (the vllm target: ``runner`` — vLLM's own model runner — or ``adapter``),
      None for a target with one; the shrinker never trades one for another
      while it simplifies a config;
    - ``runners``: the config runners it runs — ``v1`` / ``v2`` (block-table
      configs) or ``sglang`` (token-slot configs); a fuzz run for a target of
      one runner draws that runner's configs.
    """

    name: str
    description: str
    factory: Callable
    select_device: Callable[[str | None], str]
    takes_faults: bool = False
    refusal: Callable = field(default=_no_refusal)
    limits: Callable[[], dict] = field(default=_no_limits)
    version: Callable[[], str | None] = field(default=_no_version)
    snapshots: Callable[[str], bool] = field(default=lambda device_kind: False)
    variant: Callable = field(default=lambda config: None)
    runners: tuple = ("v1", "v2")


def registry_of(*specs: TargetSpec) -> dict[str, TargetSpec]:
    """{name: spec}, in the order given; duplicate names raise ``ValueError``."""
    out: dict[str, TargetSpec] = {}
    for spec in specs:
        if spec.name in out:
            raise ValueError(f"target {spec.name!r} registered twice")
        out[spec.name] = spec
    return out
