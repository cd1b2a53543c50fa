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


def reference_runner(config: RunnerConfig) -> ReferenceRunnerBase:
    """The oracle for ``config.runner`` (``v1`` or ``v2``)."""
    return (ReferenceV2Runner if config.runner == "v2" else ReferenceV1Runner)(config)


__all__ = [
    "ATTENTION", "CUDAGRAPH_MODES", "FULL", "MAMBA", "NONE", "PIECEWISE", "ConfigError",
    "GroupSpec", "RunnerConfig", "FREE", "RESERVED", "Ledger", "OpError", "NULL_BLOCK_ID",
    "PAD_SLOT_ID", "SENTINEL", "draft_payload", "payload", "payload_sum", "ForwardInfo", "ReferenceRunnerBase", "ReferenceV1Runner", "ReferenceV2Runner",
    "reference_runner",
    "dispatch",
    "is_uniform_decode",
]
