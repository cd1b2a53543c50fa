"""blockfuzz reference: the pure-NumPy oracle of block tables, slot mapping,
KV / Mamba state writes and dummy runs (fixed semantics, never faults).

Imports NumPy and the standard library only.
"""

from .config import (ATTENTION, CUDAGRAPH_MODES, FULL, MAMBA, NONE, PIECEWISE,
                     ConfigError, GroupSpec, RunnerConfig)
from .ledger import FREE, RESERVED, Ledger, OpError
from .payload import NULL_BLOCK_ID, PAD_SLOT_ID, SENTINEL, draft_payload, payload, payload_sum
from .runner import ForwardInfo, ReferenceRunnerBase, ReferenceV1Runner, dispatch, is_uniform_decode
from .runner_v2 import ReferenceV2Runner
from .token_slots import TokenSlotConfig, TokenSlotReference


def reference_runner(config):
    """The oracle for ``config.runner``: ``v1`` / ``v2`` (a block-table
    :class:`RunnerConfig`) or ``sglang`` (a :class:`TokenSlotConfig`)."""
    if config.runner == "sglang":
        return TokenSlotReference(config)
    return (ReferenceV2Runner if config.runner == "v2" else ReferenceV1Runner)(config)


def config_from_json(d: dict):
    """A trace's ``config`` object: a :class:`TokenSlotConfig` when its runner is
    ``sglang``, else a :class:`RunnerConfig`.  Raises :class:`ConfigError`."""
    if isinstance(d, dict) and d.get("runner") == "sglang":
        return TokenSlotConfig.from_json(d)
    return RunnerConfig.from_json(d)


__all__ = [
    "ATTENTION", "CUDAGRAPH_MODES", "FULL", "MAMBA", "NONE", "PIECEWISE", "ConfigError",
    "GroupSpec", "RunnerConfig", "FREE", "RESERVED", "Ledger", "OpError", "NULL_BLOCK_ID",
    "PAD_SLOT_ID", "SENTINEL", "draft_payload", "payload", "payload_sum", "ForwardInfo", "ReferenceRunnerBase", "ReferenceV1Runner", "ReferenceV2Runner",
    "reference_runner", "config_from_json", "TokenSlotConfig", "TokenSlotReference",
    "dispatch",
    "is_uniform_decode",
]
