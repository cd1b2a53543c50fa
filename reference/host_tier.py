"""The reference's host (CPU) tier: which block hashes it holds, and its LRU eviction.

Modelled on vLLM's offloading connector's scheduler side with the CPU
``LRUOffloadingManager`` (``vllm/v1/kv_offload/lru_manager.py``; the
connector in ``vllm/distributed/kv_transfer/kv_connector/v1/offloading_connector.py``):

- one host block per (attention group, block hash); the hash names every
  token up to the block's end (:meth:`reference.ledger.Ledger.block_key`);
- a block is evictable when it is ready (its store completed) and no load
  reads it; evictable blocks are kept least recently used first, and a
  block becomes most recently used when it becomes evictable (its store or
  its last load completes) or is touched while evictable (vLLM's
  ``CPUOffloadingManager`` with its ``LRUCachePolicy``);
- ``prepare_store(keys)``: keys held already are skipped; the rest need
  room: the least recently used evictable blocks are evicted, never one of
  ``keys`` (vLLM PR #35846 protects them); a group with too few stores
  nothing; new blocks are not ready until ``complete_store``;
- ``prepare_load(keys)`` pins ready blocks (a reference count) until
  ``complete_load``; ``touch(keys)`` refreshes the evictable ones, the first
  key most recent.

A key is ``(group, block hash)``; each attention group has ``capacity`` host
blocks.  Contents live in the reference runner (``host_kv``); this class is
the scheduler's knowledge only.
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
    """Host blocks per attention group and their LRU order."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.blocks: dict[tuple, HostBlock] = {}
        self.evictable: OrderedDict[tuple, None] = OrderedDict()  # least recently used first
        self.last_evicted: list[tuple] = []  # what the latest prepare_store evicted

    def used(self, group: int) -> int:
        return sum(1 for k in self.blocks if k[0] == group)

    def is_ready(self, key: tuple) -> bool:
        b = self.blocks.get(key)
        return b is not None and b.ready

    def prepare_store(self, keys: list[tuple]) -> list[tuple]:
        """Room for ``keys``, each group's on its own: returns the keys to store
        (not held yet) of the groups that have room; a group that lacks it
        stores nothing."""
        new = [k for k in dict.fromkeys(keys) if k not in self.blocks]
        protected = set(keys)
        self.last_evicted = []
        stored = []
        for g in sorted({k[0] for k in new}):
            mine = [k for k in new if k[0] == g]
            need = len(mine) - (self.capacity - self.used(g))
            victims = [k for k in self.evictable if k[0] == g
                       and k not in protected][:max(need, 0)]
            if len(victims) < need:
                continue
            for k in victims:
                del self.blocks[k]
                del self.evictable[k]
            self.last_evicted += victims
            stored += mine
        for k in stored:
            self.blocks[k] = HostBlock()
        return stored

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
