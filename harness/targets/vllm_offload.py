"""The vllm target's host tier: the installed vLLM's own CPU offloading manager.

vLLM's offloading connector keeps its CPU tier in an ``OffloadingManager``
(``vllm/v1/kv_offload/cpu/manager.py``: ``CPUOffloadingManager`` with its
LRU ``CachePolicy``), pure Python on the scheduler side.  This module wraps
it to the interface :class:`harness.targets.runner_target.RunnerTarget`
drives (:class:`gpu_impl.host_tier.LRUHostManager`'s): ``prepare_store``,
``complete_store``, ``prepare_load``, ``complete_load``, ``touch``,
``view``.  The worker side's copies stay the runner shell's.  Releases
without that manager (its constructor, ``ReqContext``, the policy's block
dict) have no host tier here: :func:`missing` says why in one line, and the
target refuses ``host_blocks`` configs with it.
"""

from __future__ import annotations

SITE = "vllm/v1/kv_offload/cpu/manager.py"


def _classes():
    from vllm.v1.kv_offload.base import ReqContext
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    return CPUOffloadingManager, ReqContext


def missing() -> str | None:
    """Why this release's CPU offloading manager cannot be driven, or None."""
    try:
        manager_cls, context_cls = _classes()
        m = manager_cls(num_blocks=1, cache_policy="lru")
        context_cls(req_id="probe")
        m._policy.blocks  # noqa: B018 (the block statuses view() reads)
    except Exception as e:  # an older or newer layout: one line
        return (f"this vLLM release has no CPUOffloadingManager as 0.26 lays it out "
                f"({type(e).__name__}: {e}); host_blocks needs one")
    return None


class VllmHostManager:
    """The host blocks of every attention group in vLLM's own
    ``CPUOffloadingManager`` (LRU policy), one for all groups as vLLM's
    offloading scheduler keeps it; keys are blockfuzz's (group, token ids)
    hashes (vLLM packs the group index into its keys the same way)."""

    def __init__(self, num_blocks: int):
        manager_cls, context_cls = _classes()
        self.manager = manager_cls(num_blocks=num_blocks, cache_policy="lru")
        self.context = context_cls(req_id="blockfuzz")

    def prepare_store(self, keys):
        out = self.manager.prepare_store(list(keys), self.context)
        if out is None:
            return None
        new = list(out.keys_to_store)
        return new, [int(b) for b in out.store_spec.block_ids], list(out.evicted_keys)

    def complete_store(self, keys) -> None:
        self.manager.complete_store(list(keys), self.context)

    def prepare_load(self, keys) -> list[int]:
        return [int(b) for b in self.manager.prepare_load(list(keys), self.context).block_ids]

    def complete_load(self, keys) -> None:
        self.manager.complete_load(list(keys), self.context)

    def touch(self, keys) -> None:
        self.manager.touch(list(keys), self.context)

    def view(self) -> dict:
        return {k: (int(b.block_id), bool(b.is_ready))
                for k, b in self.manager._policy.blocks.items()}
