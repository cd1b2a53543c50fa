"""The reference's host (CPU) tier: which block hashes it holds, and its LRU eviction.

Modelled on vLLM 0.26's offloading connector (the scheduler side in
``vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py``)
with its CPU tier (``vllm/v1/kv_offload/cpu/manager.py``,
``CPUOffloadingManager``, and its ``LRUCachePolicy`` in
``cpu/policies/lru.py``):

- one tier of ``capacity`` host blocks for every attention group; a key is
  (group, block hash), the hash naming every token up to the block's end
  (:meth:`reference.ledger.Ledger.host_key`);
- a block is evictable when it is ready (its store completed) and no load
  reads it; evictable blocks are kept least recently used first, and a
  block becomes most recently used when it becomes evictable (its store or
  its last load completes) or is touched while evictable;
- ``prepare_store(keys)``, one call for an offload's keys of every group:
  keys held already are skipped; the rest need room: the least recently
  used evictable blocks are evicted, never one of ``keys`` (vLLM PR #35846
  protects them); with too few, nothing is stored (None); new blocks are
  not ready until ``complete_store``;
- ``prepare_load(keys)`` pins ready blocks (a reference count) until
  ``complete_load``; ``touch(keys)`` refreshes the evictable ones, the
  first key most recent.  The connector touches all of a request's keys,
  group by group, when it looks a new request up and after a store that
  stored something.

Contents live in the reference runner (``host_kv``); this class is the
scheduler's knowledge only.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass
class HostBlock:
    """One host block's status: ``ready`` once its store completed; ``pins``: loads
    in flight reading it."""

    ready: bool = False
    pins: int = 0


class HostTier:
    """The host blocks of every attention group, and their LRU order."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.blocks: dict[tuple, HostBlock] = {}
        self.evictable: OrderedDict[tuple, None] = OrderedDict()  # least recently used first
        self.last_evicted: list[tuple] = []  # what the latest prepare_store evicted

    def is_ready(self, key: tuple) -> bool:
        b = self.blocks.get(key)
        return b is not None and b.ready

    def prepare_store(self, keys: list[tuple]) -> list[tuple] | None:
        """Room for ``keys`` (every group's, one tier): returns the keys to store
        (those not held yet), or None — nothing stored — when too few blocks
        can be evicted."""
        new = [k for k in dict.fromkeys(keys) if k not in self.blocks]
        self.last_evicted = []
        need = len(new) - (self.capacity - len(self.blocks))
        if need > 0:
            protected = set(keys)
            victims = [k for k in self.evictable if k not in protected][:need]
            if len(victims) < need:
                return None
            for k in victims:
                del self.blocks[k]
                del self.evictable[k]
            self.last_evicted = victims
        for k in new:
            self.blocks[k] = HostBlock()
        return new

    def complete_store(self, keys: list[tuple]) -> None:
        for k in keys:
            if not self.blocks[k].ready:
                self.blocks[k].ready = True
                self.evictable[k] = None

    def prepare_load(self, keys: list[tuple]) -> None:
        for k in keys:
            b = self.blocks[k]
            assert b.ready, k
            if b.pins == 0:
                del self.evictable[k]
            b.pins += 1

    def complete_load(self, keys: list[tuple]) -> None:
        for k in keys:
            b = self.blocks[k]
            b.pins -= 1
            if b.pins == 0:
                self.evictable[k] = None

    def touch(self, keys: list[tuple]) -> None:
        """Refresh the evictable ones of ``keys``, the first most recent (vLLM
        touches a request's blocks from its end back to its first)."""
        for k in reversed(list(keys)):
            if k in self.evictable:
                self.evictable.move_to_end(k)
