"""vLLM's own scheduler-side KV-cache manager as the vllm target's allocator
(``config.allocator == "engine"``).

Drives the release's ``vllm/v1/core/kv_cache_manager.py`` (``KVCacheManager``
with its coordinator, ``FullAttentionManager`` and ``BlockPool``) in the
scheduler's call order: ``get_computed_blocks`` then ``allocate_slots`` for a
new request (the hit passed back in, as ``Scheduler.schedule`` does),
``allocate_slots`` for a running one, ``free`` when it finishes.  The block
ids it returns are what the vllm target's block tables receive.

Driver rules (ours, stated where vLLM's scheduler would differ):

- Blocks are registered in the prefix cache once their tokens are computed:
  ``allocate_slots(..., delay_cache_blocks=True)`` (vLLM's path for KV that
  arrives later) and ``cache_blocks(request, num_computed_tokens)`` after each
  step or KV load.  vLLM's scheduler registers at allocation, which is sound
  only when every request hitting those blocks runs in the same forward as
  their writer; a trace's admit and step are separate ops.
- A request's output tokens are the model's (``req * 256 + pos``), appended to
  vLLM's ``Request`` as they are computed so its block hashes cover them.
- ``use_eagle`` is set when the config has a drafter (vLLM drops the last
  matched block so the drafter recomputes its hidden states); the model's
  hit rule does the same.

Configs this adapter refuses (``refusal``): more than one KV-cache group
(vLLM's coordinator over several groups is not driven yet; the model's one
shared pool, ``kv_sharing``, is issue #12's first part) and DCP.
"""

from __future__ import annotations

import dataclasses
import inspect

import numpy as np


MANAGER_SITES = ("vllm/v1/core/kv_cache_manager.py", "vllm/v1/core/block_pool.py",
                 "vllm/v1/core/single_type_kv_cache_manager.py",
                 "vllm/v1/core/kv_cache_coordinator.py", "vllm/v1/core/kv_cache_utils.py")
"""The upstream files that run as vLLM's own when a config's allocator is ``engine``."""

DRIVER_RULES = {
    "cache-blocks-before-compute": (
        "the fault's behaviour (blocks registered at allocation) is replaced by this "
        "adapter's driver rule (allocate_slots with delay_cache_blocks, cache_blocks once "
        "computed), so vLLM's own registration timing is not what runs"),
}
"""Faults whose code path the adapter's driver rules replace: their traces read n/a."""


def _kw(fn, **kw):
    params = inspect.signature(fn).parameters
    return {k: v for k, v in kw.items() if k in params}


def refusal(config) -> str | None:
    """Why vLLM's KV-cache manager cannot back ``config`` here, or None."""
    if len(config.groups) != 1:
        return ("the vllm target drives vLLM's KVCacheManager for configs with one "
                "attention group only (its hybrid coordinator over several groups, one "
                "shared pool, is not driven yet)")
    if config.dcp_world_size != 1:
        return "the vllm target drives vLLM's KVCacheManager with dcp_world_size 1 only"
    return None


class VllmKVCacheManager:
    """The target-side manager protocol of :class:`harness.targets.runner_target.
    RunnerTarget` over vLLM's ``KVCacheManager`` (one full-attention group)."""

    def __init__(self, config):
        import torch
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import sha256
        from vllm.v1.core import kv_cache_utils
        from vllm.v1.core.kv_cache_manager import KVCacheManager
        from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig,
                                                KVCacheGroupSpec, KVCacheTensor)
        from vllm.v1.request import Request

        self.config = config
        self._Request, self._SamplingParams = Request, SamplingParams
        from vllm.v1.kv_cache_interface import SlidingWindowSpec

        bs = config.groups[0].block_size
        window = config.groups[0].sliding_window
        spec = SlidingWindowSpec(block_size=bs, num_kv_heads=1, head_size=config.head_size,
                                 dtype=torch.float32, sliding_window=window) if window else \
            FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=config.head_size,
                              dtype=torch.float32)
        layer = "layers.0.attn"
        fields = {f.name for f in dataclasses.fields(KVCacheTensor)}
        size = spec.page_size_bytes * config.num_blocks
        tensor = KVCacheTensor(size=size, shared_by=[layer]) if "shared_by" in fields else \
            KVCacheTensor(**_kw(KVCacheTensor, size=size, layers=[layer], layer_stride=0,
                                block_stride=0))
        kv_config = KVCacheConfig(num_blocks=config.num_blocks, kv_cache_tensors=[tensor],
                                  kv_cache_groups=[KVCacheGroupSpec([layer], spec)])
        kv_cache_utils.init_none_hash(sha256)
        self.hasher = kv_cache_utils.get_request_block_hasher(bs, sha256)
        self.kv = KVCacheManager(**_kw(
            KVCacheManager.__init__, kv_cache_config=kv_config,
            max_model_len=config.max_model_len, scheduler_block_size=bs, hash_block_size=bs,
            enable_caching=config.enable_prefix_caching,
            use_eagle=bool(config.num_speculative_tokens), log_stats=False))
        self.pool = self.kv.block_pool
        self.requests: dict[int, object] = {}

    def _new_step(self) -> None:
        if hasattr(self.kv, "new_step_starts"):
            self.kv.new_step_starts()

    def _ids(self, blocks) -> list[list[int]]:
        return [list(ids) for ids in blocks.get_block_ids()]

    def admit(self, req: int, tokens: np.ndarray, num_new_tokens: int):
        self._new_step()
        request = self._Request(**_kw(
            self._Request.__init__, request_id=str(req), prompt_token_ids=[int(t) for t in tokens],
            sampling_params=self._SamplingParams(max_tokens=self.config.max_model_len,
                                                 ignore_eos=True),
            pooling_params=None, arrival_time=float(req), block_hasher=self.hasher,
            eos_token_id=None))
        computed = self.kv.get_computed_blocks(request)
        blocks, hit = computed[0], computed[1]
        new = self.kv.allocate_slots(**_kw(
            self.kv.allocate_slots, request=request, num_new_tokens=num_new_tokens,
            num_new_computed_tokens=hit, new_computed_blocks=blocks,
            num_lookahead_tokens=self.config.num_speculative_tokens, delay_cache_blocks=True))
        if new is None:
            return None, hit
        request.num_computed_tokens = hit
        self.requests[req] = request
        return [list(ids) for ids in self.kv.get_block_ids(str(req))], hit

    def allocate(self, req: int, num_new_tokens: int):
        """(new block ids or None, ids vLLM freed from the sliding window: entries
        its ``remove_skipped_blocks`` turned into the null block)."""
        self._new_step()
        before = [list(ids) for ids in self.kv.get_block_ids(str(req))]
        new = self.kv.allocate_slots(**_kw(
            self.kv.allocate_slots, request=self.requests[req], num_new_tokens=num_new_tokens,
            num_lookahead_tokens=self.config.num_speculative_tokens, delay_cache_blocks=True))
        after = [list(ids) for ids in self.kv.get_block_ids(str(req))]
        null = self.pool.null_block.block_id
        freed = [[b for i, b in enumerate(was) if b != null and i < len(now) and now[i] == null]
                 for was, now in zip(before, after)]
        return (None if new is None else self._ids(new)), freed

    def computed(self, req: int, num_computed: int) -> None:
        request = self.requests[req]
        request.num_computed_tokens = num_computed
        for pos in range(request.num_tokens, num_computed):  # the model's output tokens
            request.append_output_token_ids(req * 256 + pos)
        self.kv.cache_blocks(request, num_computed)

    def rolled_back(self, req: int, num_computed: int) -> None:
        self.requests[req].num_computed_tokens = num_computed

    def free(self, req: int) -> list[list[int]]:
        null = self.pool.null_block.block_id
        ids = [[b for b in group if b != null] for group in self.kv.get_block_ids(str(req))]
        self.kv.free(self.requests.pop(req))
        blocks = self.pool.blocks
        return [[b for b in group if blocks[b].ref_cnt == 0 and blocks[b].block_hash is None]
                for group in ids]

    def is_free(self, group: int, block: int) -> bool:
        b = self.pool.blocks[block]
        return b.ref_cnt == 0 and b.block_hash is None

    def pool_view(self) -> dict:
        return {0: {"ref_count": np.array([b.ref_cnt for b in self.pool.blocks], np.int64),
                    "num_free": self.pool.get_num_free_blocks()}}
