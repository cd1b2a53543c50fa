"""The installed vLLM release: found without importing it, loaded once per
process with the environment and shims its block-table modules need on a
CPU-only machine, and the helpers every module of the vllm target shares
(signature-driven keyword arguments, the row sizes vLLM is handed, probes of
what the release can run).

The base of the vllm target's modules: :mod:`harness.targets.vllm` (the
target), :mod:`harness.targets.vllm_runners` / :mod:`harness.targets.vllm_builders`
(the component adapter) and :mod:`harness.targets.vllm_engine` (runner mode)
import from here, and this module imports none of them.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import os
import sys
from types import SimpleNamespace

import numpy as np
import torch

from harness.targets.registry import TargetUnavailable


def installed_version() -> str | None:
    """The installed vLLM distribution's version, without importing it (None if absent)."""
    try:
        return importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return None


_LOADED: SimpleNamespace | None = None


def load() -> SimpleNamespace:
    """Import vLLM's block-table modules once per process, with the environment and
    shims they need on a CPU-only machine.

    Returns a namespace: ``version``, ``MultiGroupBlockTable``, ``BlockTables``,
    ``SlotMappingMode`` (None where the release has none), V1's ``InputBatch``,
    ``CachedRequestState`` and ``SamplingParams``, V2's ``RequestState``, the
    decode-first reorder ``reorder_batch`` (None where absent), and the capability
    flags read off the signatures (``v1_kernel_blocks``, ``v2_kernel_blocks``,
    ``v1_slot_mapping_modes``, ``v2_slot_mapping_enabled``, ``v2_dcp_sharded``).
    Raises :class:`TargetUnavailable`.
    """
    global _LOADED
    if _LOADED is not None:
        return _LOADED
    version = installed_version()
    if version is None:
        raise TargetUnavailable("vLLM is not installed; run scripts/install-vllm-target.sh "
                                "RELEASE (e.g. 0.33.0) in this environment")
    if "vllm" not in sys.modules:
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            raise TargetUnavailable("Triton was imported without TRITON_INTERPRET=1 before "
                                    "the vllm target could set it; start a fresh process")
        os.environ["TRITON_INTERPRET"] = "1"
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        # vLLM logs, per process and per config, what a CPU run without vllm._C
        # always triggers (no vllm._C, Inductor off, FULL lowered to
        # FULL_DECODE_ONLY for Mamba2: docs/vllm-target.md says so once); errors
        # still show. VLLM_LOGGING_LEVEL=WARNING brings the rest back.
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        # Some releases log these before configuring their handler, through
        # Python's last-resort handler (WARNING and up): the level goes on the
        # "vllm" logger itself too.
        import logging

        logging.getLogger("vllm").setLevel(os.environ["VLLM_LOGGING_LEVEL"].upper())
    from gpu_impl.device import DeviceError, select_device

    try:
        select_device("cpu")  # gpu_impl's kernels run beside vLLM's, in the interpreter
    except DeviceError as e:
        raise TargetUnavailable(str(e)) from None
    try:
        import vllm.utils.torch_utils as torch_utils

        _shim_pin_memory(torch_utils)  # before the worker modules read the flag
        import vllm.v1.utils as v1_utils
        from vllm.v1.worker import block_table as v1_block_table
        from vllm.v1.worker.gpu import block_table as v2_block_table
        from vllm.v1.worker.gpu import buffer_utils, states as v2_states
        from vllm.v1.worker import gpu_input_batch
        from vllm.sampling_params import SamplingParams
        from vllm.v1.attention.backends import utils as backend_utils
    except Exception as e:  # noqa: BLE001 - any import failure means "cannot use"
        raise TargetUnavailable(f"vLLM {version} failed to import ({type(e).__name__}: {e}); "
                                "reinstall with scripts/install-vllm-target.sh") from None
    from gpu_impl.interpret import hold_language_patch

    hold_language_patch()  # vLLM's kernels launch in the interpreter too
    for module in (torch_utils, v1_utils, buffer_utils, v1_block_table, gpu_input_batch,
                   backend_utils):
        if hasattr(module, "PIN_MEMORY"):
            module.PIN_MEMORY = False
    _shim_uva_buffer(buffer_utils.UvaBuffer)
    v1_params = inspect.signature(v1_block_table.BlockTable.__init__).parameters
    mg_params = inspect.signature(v1_block_table.MultiGroupBlockTable.__init__).parameters
    v2_params = inspect.signature(v2_block_table.BlockTables.__init__).parameters
    _LOADED = SimpleNamespace(
        version=version,
        MultiGroupBlockTable=v1_block_table.MultiGroupBlockTable,
        BlockTables=v2_block_table.BlockTables,
        SlotMappingMode=getattr(v1_block_table, "SlotMappingMode", None),
        InputBatch=gpu_input_batch.InputBatch,
        reorder_batch=getattr(backend_utils, "reorder_batch_to_split_decodes_and_prefills",
                              None),
        RequestState=v2_states.RequestState,
        CachedRequestState=gpu_input_batch.CachedRequestState,
        SamplingParams=SamplingParams,
        v1_kernel_blocks="kernel_block_size" in v1_params,
        v1_slot_mapping_modes="slot_mapping_modes" in mg_params,
        v2_kernel_blocks="kernel_block_sizes" in v2_params,
        v2_slot_mapping_enabled="slot_mapping_enabled" in v2_params,
        v2_dcp_sharded="dcp_sharded" in v2_params,
        v2_gather_params=set(inspect.signature(
            v2_block_table.BlockTables.gather_block_tables).parameters),
    )
    return _LOADED


def _shim_pin_memory(torch_utils) -> None:
    """No pinned memory on a CPU torch: releases whose ``torch_utils`` asks
    ``is_pin_memory_available()`` at call time (0.32: ``async_tensor_h2d`` and
    the lazily computed ``PIN_MEMORY``) are told False there, like the flags
    below.  Only there: the platform's own answer also decides whether V2's
    UVA buffers exist, and those get the shim below."""
    if callable(getattr(torch_utils, "is_pin_memory_available", None)):
        torch_utils.is_pin_memory_available = lambda: False


def _shim_uva_buffer(cls) -> None:
    """UVA on a CPU: the host tensor is its own device view.

    Older releases read the view as the attribute ``uva``; newer ones through a
    method ``uva(n)`` that slices ``_uva`` — set whichever the class uses.
    """
    if getattr(cls, "_blockfuzz_shim", False):
        return
    has_method = callable(getattr(cls, "uva", None))

    def __init__(self, size, dtype):  # noqa: N807 - replaces the class's initialiser
        self.cpu = torch.zeros(size, dtype=dtype, device="cpu")
        self.np = self.cpu.numpy()
        self._uva = self.cpu
        if not has_method:
            self.uva = self.cpu

    cls.__init__ = __init__
    cls._blockfuzz_shim = True


def max_model_len(config) -> int:
    """Longest request the config admits, in tokens (Mamba groups' block size in vLLM:
    one block holds a whole request's state)."""
    if config.model_len:  # vLLM sizes each group's row from it, as the model does
        return config.model_len
    return max(config.max_num_blocks_per_req * config.tokens_per_block(g)
               for g in config.attention_groups)


def v2_dcp_runs(vllm: SimpleNamespace | None = None) -> str | None:
    """None when the release's V2 slot-mapping kernel runs with decode context
    parallelism under the Triton interpreter; else the error it raised.

    Probed once, on a one-request table (some releases' DCP path masks with a
    value loaded from a bool tensor, which Triton 3.9's interpreter rejects:
    ``mask has unsupported dtype``; compiled on a GPU the same kernel runs).
    """
    vllm = vllm or load()
    if not hasattr(vllm, "v2_dcp_error"):
        cand = dict(block_sizes=[4], max_num_reqs=1, max_num_batched_tokens=2,
                    max_num_blocks_per_group=[1], device=torch.device("cpu"),
                    kernel_block_sizes=[4], slot_mapping_enabled=[True], dcp_sharded=[True],
                    cp_size=2, cp_rank=0, cp_interleave=1)
        try:
            tables = vllm.BlockTables(**_kwargs_for(vllm.BlockTables.__init__, cand))
            tables.append_block_ids(0, ([1],), overwrite=True)
            tables.apply_staged_writes()
            idx = torch.zeros(1, dtype=torch.int32)
            tables.compute_slot_mappings(idx, torch.tensor([0, 2], dtype=torch.int32),
                                         torch.arange(2, dtype=torch.int64), 2)
            vllm.v2_dcp_error = None
        except Exception as e:  # noqa: BLE001 - any failure means "cannot run here"
            vllm.v2_dcp_error = f"{type(e).__name__}: {e}"
    return vllm.v2_dcp_error


def spec_decode_missing(vllm: SimpleNamespace | None = None) -> str | None:
    """None when the release has what the target drives for speculative decoding
    (the EAGLE step kernel, a Mamba metadata builder taking accepted counts);
    else why not, one line."""
    vllm = vllm or load()
    try:
        from vllm.v1.spec_decode.utils import (  # noqa: F401
            eagle_step_update_slot_mapping_and_metadata)
    except Exception as e:  # noqa: BLE001 - the release does not have it
        return (f"vLLM {vllm.version} has no eagle_step_update_slot_mapping_and_metadata "
                f"to compute the drafter's slots with ({type(e).__name__}); use 0")
    try:
        import inspect

        from vllm.v1.attention.backends.mamba_attn import BaseMambaAttentionMetadataBuilder
        params = inspect.signature(
            BaseMambaAttentionMetadataBuilder._compute_common_metadata).parameters
    except Exception as e:  # noqa: BLE001
        return f"vLLM {vllm.version}'s Mamba builder cannot be inspected ({e}); use 0"
    if "num_accepted_tokens" not in params:
        return (f"vLLM {vllm.version}'s Mamba metadata builder takes no accepted counts "
                "(no spec-decode state columns); use 0")
    return None


def _group_sizes(config) -> tuple[list[int], list[int]]:
    """(block sizes, kernel block sizes) as vLLM is handed them per KV-cache group."""
    long = max_model_len(config)
    sizes = [s.block_size if s.kind == "attention" else long for s in config.groups]
    kernel = [s.kernel_block_size if s.kind == "attention" else long for s in config.groups]
    return sizes, kernel


def _kwargs_for(fn, candidates: dict) -> dict:
    params = inspect.signature(fn).parameters
    return {k: v for k, v in candidates.items() if k in params}


def version_string() -> str | None:
    """``vLLM <release>`` of the installed release, None without one."""
    version = installed_version()
    return None if version is None else f"vLLM {version}"


def staged_rows(tables, max_num_reqs: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """V2 staged rows and counts as they will be after ``apply_staged_writes``:
    the device copy plus the writes still staged (read, not applied)."""
    rows, counts = [], []
    for g, t in enumerate(tables.block_tables):
        host = t.gpu.detach().cpu().numpy().copy()
        if not hasattr(t, "_staged_write_contents"):
            raise TargetUnavailable("this vLLM release's StagedWriteTensor keeps its staged "
                                    "writes elsewhere; the V2 observation must learn it")
        contents, start_of = t._staged_write_contents, 0
        for index, start, end in zip(t._staged_write_indices, t._staged_write_starts,
                                     t._staged_write_cu_lens):
            host[index, start:start + end - start_of] = contents[start_of:end]
            start_of = end
        rows.append(host)
        counts.append(np.asarray(tables.num_blocks.np[g, :max_num_reqs], np.int32).copy())
    return rows, counts
