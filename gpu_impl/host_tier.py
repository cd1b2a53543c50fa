"""gpu_impl's host (CPU) tier: the scheduler side's manager of host blocks.

Written as vLLM's offloading connector keeps its CPU tier
(``vllm/v1/kv_offload/cpu/manager.py``, ``CPUOffloadingManager`` with its
``LRUCachePolicy`` in ``cpu/policies/lru.py``): a dict from block hash to a
host block (its slot and a reference count: -1 while its store is in
flight, else the loads reading it) and an ordered list of the evictable
ones (count 0), least recently used first.

- ``prepare_store(keys)``: skips hashes held already; to make room evicts
  the least recently used evictable blocks that are not among ``keys``;
  returns None (store nothing) when too few can go; the new blocks' slots
  are the copy's destination.
- ``prepare_load(keys)``: returns the slots and counts one more reader of
  each (a block read by a load is not evictable); ``complete_load`` one
  fewer, evictable again (most recent) at 0.
- ``complete_store``: ready, evictable (most recent).
- ``touch(keys)``: refreshes the evictable ones, the first key most recent.

One manager for every attention group (``host_blocks`` slots; a key names
its group, as vLLM's ``make_offload_key`` packs the group index into it).  The worker
copies (:class:`gpu_impl.runner_shell.RunnerShell`'s ``offload_*`` /
``onboard_*``) go by the slots returned here.  Faults (``family: async``)
live at the lines their upstream bugs did.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass
class HostBlock:
    slot: int
    ref_cnt: int = -1  # -1: its store is in flight (not ready); else loads reading it

    @property
    def is_ready(self) -> bool:
        return self.ref_cnt >= 0


class LRUHostManager:
    """Host blocks of every attention group, keyed by (group, block hash).

    The adapter interface a target's host tier offers (``prepare_store``,
    ``complete_store``, ``prepare_load``, ``complete_load``, ``touch``,
    ``view``); vLLM's own manager is wrapped to it by the vllm target."""

    def __init__(self, num_blocks: int, faults):
        self.faults = faults
        self.blocks: dict[tuple, HostBlock] = {}
        self.evictable: OrderedDict[tuple, None] = OrderedDict()
        self.free_slots = list(range(num_blocks))[::-1]  # popped from the end

    def prepare_load(self, keys: list[tuple]) -> list[int]:
        slots = []
        for key in keys:
            b = self.blocks[key]
            assert b.is_ready, key
            if b.ref_cnt == 0 and "onboard-leaves-host-blocks-evictable" not in self.faults:
                # A block a load reads is not evictable until the load ends.  The
                # historical bug: the load-back pinned only the device side, so
                # the host block stayed in the eviction walk while it was read.
                del self.evictable[key]
            b.ref_cnt += 1
            slots.append(b.slot)
        return slots

    def complete_load(self, keys: list[tuple]) -> None:
        for key in keys:
            b = self.blocks.get(key)
            if b is None or b.ref_cnt <= 0:  # evicted under the load (a fault's effect)
                continue
            b.ref_cnt -= 1
            if b.ref_cnt == 0:
                self.evictable[key] = None

    def touch(self, keys: list[tuple]) -> None:
        for key in reversed(list(keys)):
            if key in self.evictable:
                self.evictable.move_to_end(key)

    def prepare_store(self, keys: list[tuple]) -> tuple[list[tuple], list[int], list[tuple]] | None:
        """Room for the hashes of ``keys`` not held: (those hashes, their new slots,
        the hashes evicted), or None when too few blocks can be evicted."""
        new = [k for k in dict.fromkeys(keys) if k not in self.blocks]
        need = len(new) - len(self.free_slots)
        evict = []
        if need > 0:
            protected = set() if "host-store-evicts-its-own-blocks" in self.faults else set(keys)
            evict = [k for k in self.evictable if k not in protected][:need]
            if len(evict) < need:
                return None
        for key in evict:
            del self.evictable[key]
            self.free_slots.append(self.blocks.pop(key).slot)
        slots = [self.free_slots.pop() for _ in new]
        for key, slot in zip(new, slots):
            self.blocks[key] = HostBlock(slot)
        return new, slots, evict

    def complete_store(self, keys: list[tuple]) -> None:
        for key in keys:
            b = self.blocks.get(key)
            if b is not None and not b.is_ready:
                b.ref_cnt = 0
                self.evictable[key] = None

    def view(self) -> dict[tuple, tuple[int, bool]]:
        """{hash: (slot, ready)}."""
        return {k: (b.slot, b.is_ready) for k, b in self.blocks.items()}
