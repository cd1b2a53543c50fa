"""blockfuzz reference: the pure-NumPy oracle of block tables, slot mapping,
KV / Mamba state writes and dummy runs (fixed semantics, never faults).

Imports NumPy and the standard library only.
"""

from .config import (ATTENTION, CUDAGRAPH_MODES, FULL, MAMBA, NONE, PIECEWISE,
                     ConfigError, GroupSpec, RunnerConfig)
from .ledger import FREE, RESERVED, Ledger, OpError
from .payload import NULL_BLOCK_ID, PAD_SLOT_ID, SENTINEL, payload, payload_sum
from .runner import ForwardInfo, ReferenceV1Runner, dispatch

__all__ = [
    "ATTENTION", "CUDAGRAPH_MODES", "FULL", "MAMBA", "NONE", "PIECEWISE", "ConfigError",
    "GroupSpec", "RunnerConfig", "FREE", "RESERVED", "Ledger", "OpError", "NULL_BLOCK_ID",
    "PAD_SLOT_ID", "SENTINEL", "payload", "payload_sum", "ForwardInfo", "ReferenceV1Runner",
    "dispatch",
]
