"""Target ``vllm``: the installed vLLM's own block-table classes under test.

The V1 target drives ``vllm.v1.worker.block_table.MultiGroupBlockTable`` (one
``BlockTable`` per KV-cache group), the V2 target
``vllm.v1.worker.gpu.block_table.BlockTables``, from the same model-runner code
as gpu_impl — its fault-free shells, :mod:`gpu_impl.runner_shell_v1` /
:mod:`gpu_impl.runner_shell_v2`, subclassed in :mod:`harness.targets.vllm_runners`
— and every block-table call a model runner makes goes to vLLM's class —

- V1: ``add_row`` / ``append_row`` / ``clear_row`` (request removal) /
  ``move_row`` (condense) / ``swap_row`` on the host rows,
  ``commit_block_table`` before every forward (the V1 dummy run commits the
  rows past the live requests it reads), ``compute_slot_mapping`` (vLLM's
  Triton kernel, into vLLM's own slot-mapping buffer, PAD tail included);
- V2: ``append_block_ids`` (add with ``overwrite``, append),
  ``apply_staged_writes`` + ``gather_block_tables`` every step,
  ``compute_slot_mappings``, ``get_dummy_block_tables`` and
  ``get_dummy_slot_mappings`` on dummy runs;

while the KV writes, Mamba state updates and the paged-attention read are
gpu_impl's kernels, run on vLLM's tables and slot mappings, so the invariants
see what a model would have written through them.

Environment (set here, before vLLM is first imported): ``TRITON_INTERPRET=1``
and ``CUDA_VISIBLE_DEVICES=`` (set, empty — otherwise vLLM decides Triton is
unusable and swaps its kernels for placeholders).  Shims, ours: the
module-level ``PIN_MEMORY`` flags and ``is_pin_memory_available()`` are
switched off (CPU torch refuses pinned memory), and V2's ``UvaBuffer`` gets a plain host tensor as its "device view"
(vLLM's CUDA-only op cannot load without libcuda).

Release differences are found by inspecting signatures, never by version
numbers: whether ``BlockTable`` / ``BlockTables`` take kernel block sizes,
``slot_mapping_modes`` (V1) and ``slot_mapping_enabled`` / ``dcp_sharded``
(V2).  A geometry a release's classes cannot express is refused
(:class:`TargetRefused`), never emulated: releases whose block tables do not
split allocation blocks into kernel blocks refuse ``kernel_block_size !=
block_size``.  docs/writing-a-target.md walks through this module.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import os
import sys
from types import SimpleNamespace

import numpy as np
import torch

from harness.targets.registry import TargetRefused, TargetSpec, TargetUnavailable

__all__ = ["SPEC", "TargetRefused", "TargetUnavailable", "load", "make_vllm_runner", "refusal"]


BUILDER_SITES = ("vllm/v1/attention/backends/mamba_attn.py",
                 "vllm/v1/attention/backends/mamba2_attn.py",
                 "vllm/v1/attention/backends/triton_attn.py",
                 "vllm/v1/spec_decode/utils.py")  # the EAGLE step kernel (drafter slots)
ENGINE_SITES = {
    "v1": ("vllm/v1/worker/block_table.py", "vllm/v1/worker/gpu_input_batch.py")
    + BUILDER_SITES,
    "v2": ("vllm/v1/worker/gpu/block_table.py", "vllm/v1/worker/gpu/states.py")
    + BUILDER_SITES,
}
"""Per runner, the upstream files whose code this target runs as vLLM's own: the
block tables, the persistent batch / request states, the Mamba2 and Triton
attention metadata builders (:mod:`harness.targets.vllm_builders`) and, with a
drafter, the EAGLE step kernel that computes its slots.  The rest of a model runner —
dummy runs, the drafter's passes and buffers, the runner side of metadata (counters, ``is_prefilling``, padded
rows), graph buffers, attention backends' own slot buffers — is gpu_impl's
fault-free shell.  A catalogue fault lives at ``Fault.sites``."""


RUNNER_SITES = ("vllm/v1/worker/gpu_model_runner.py",)
"""What runner mode adds to :data:`ENGINE_SITES` (V1): the model runner itself —
``_update_states``, ``_prepare_inputs``, ``_dummy_run``, graph dispatch."""


def unexercised(trace) -> str | None:
    """Why a passing replay of ``trace`` here says nothing about the bug it was
    recorded for: every one of its faults lived in engine code this target does
    not run (None when some fault's site is driven, or the trace has none)."""
    from gpu_impl.faults import CATALOGUE

    from harness.targets.vllm_kv_cache import DRIVER_RULES, MANAGER_SITES

    driven = ENGINE_SITES[trace.config.runner]
    if target_mode(trace.config)[0] == "runner":
        driven = driven + RUNNER_SITES
    if trace.config.allocator == "engine":
        driven = driven + MANAGER_SITES
    faults = [CATALOGUE[f] for f in trace.faults if f in CATALOGUE]
    if faults and trace.config.allocator == "engine" and all(
            f.id in DRIVER_RULES for f in faults):
        return "; ".join(DRIVER_RULES[f.id] for f in faults)
    if not faults or any(set(f.sites) & set(driven) for f in faults):
        return None
    sites = sorted({s for f in faults for s in f.sites})
    return (f"the recorded fault's code path ({', '.join(sites)}) is blockfuzz's own code in "
            f"the vllm adapter (runner shell, layers, backends), not vLLM's; only "
            f"{', '.join(driven)} run as vLLM's")


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


def page_size_refusal(config, vllm: SimpleNamespace) -> str | None:
    """With ``kv_sharing``: does the release's own page-size unification agree
    with the config's layout?  None when it does; else why not, one line.

    Each attention group becomes a ``FullAttentionSpec`` (one KV head whose K
    and V halves make the model's ``head_size`` floats per token), each Mamba
    group a ``MambaSpec`` with its conv and SSM shapes, and vLLM's
    ``unify_kv_cache_spec_page_size`` (``vllm/v1/core/kv_cache_utils.py``;
    ``kv_cache_planning.py`` in later releases)
    unifies them as the hybrid allocator does before it lays one pool: every
    attention block size must come back unchanged (vLLM grows a smaller page's
    block size to the largest page) and every Mamba page must be padded to the
    page its attention partner's tensor has."""
    if not config.kv_sharing:
        return None
    try:
        import importlib

        import torch
        from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

        for where in ("vllm.v1.core.kv_cache_utils", "vllm.v1.core.kv_cache_planning"):
            unify_kv_cache_spec_page_size = getattr(importlib.import_module(where),
                                                    "unify_kv_cache_spec_page_size", None)
            if unify_kv_cache_spec_page_size is not None:  # moved in later releases
                break
        else:
            raise ImportError("unify_kv_cache_spec_page_size")
    except Exception as e:  # noqa: BLE001 - the release lays pages otherwise
        return (f"vLLM {vllm.version} has no unify_kv_cache_spec_page_size / MambaSpec to "
                f"check a shared layout against ({type(e).__name__})")
    if config.head_size % 2:
        return (f"head_size {config.head_size}: vLLM's attention page holds a K and a V half "
                "per token; use an even head_size")
    head = config.head_size
    specs = {}
    for g in config.attention_groups:
        specs[f"attn.{g}"] = FullAttentionSpec(block_size=config.groups[g].block_size,
                                               num_kv_heads=1, head_size=head // 2,
                                               dtype=torch.float32)
    for g in config.mamba_groups:
        conv = config.groups[g].conv_size
        shapes = ((conv, head), (head,)) if conv else ((head,),)
        specs[f"mamba.{g}"] = MambaSpec(block_size=config.groups[g].block_size, shapes=shapes,
                                        dtypes=(torch.float32,) * len(shapes))
    try:
        unified = unify_kv_cache_spec_page_size(specs)
    except (NotImplementedError, AssertionError) as e:
        return (f"vLLM {vllm.version}'s unify_kv_cache_spec_page_size cannot unify these pages "
                f"({str(e).splitlines()[0] if str(e) else type(e).__name__})")
    for g in config.attention_groups:
        got = unified[f"attn.{g}"].block_size
        if got != config.groups[g].block_size:
            return (f"vLLM {vllm.version}'s page-size unification gives attention group {g} "
                    f"{got}-token blocks, not {config.groups[g].block_size}: one pool needs one "
                    "page size for every group (make the attention pages equal)")
    for a, m in config.shared_pages().items():
        if unified[f"mamba.{m}"].page_size_bytes != unified[f"attn.{a}"].page_size_bytes:
            return (f"vLLM {vllm.version} pads group {m}'s Mamba page to "
                    f"{unified[f'mamba.{m}'].page_size_bytes} bytes, not the "
                    f"{unified[f'attn.{a}'].page_size_bytes}-byte page of attention group {a}")
    return None


def refusal(config, vllm: SimpleNamespace | None = None) -> TargetRefused | None:
    """Why the installed release cannot run ``config`` here (None when it can)."""
    vllm = vllm or load()
    if config.mamba_padding != "null":
        return TargetRefused("mamba_padding", f"{config.mamba_padding!r} is not driven on the "
                             "vllm target (vLLM's block tables fill empty entries with the "
                             "null block and its Mamba builders pad rows themselves); use "
                             "'null' or --target gpu_impl")
    why = page_size_refusal(config, vllm)
    if why is not None:
        return TargetRefused("kv_sharing", why)
    if config.allocator == "engine":
        from harness.targets.vllm_kv_cache import refusal as manager_refusal

        why = manager_refusal(config)
        if why is not None:
            return TargetRefused("allocator", why)
    if config.num_speculative_tokens:
        error = spec_decode_missing(vllm)
        if error is not None:
            return TargetRefused("num_speculative_tokens", error)
        if config.dcp_world_size > 1:
            return TargetRefused(
                "num_speculative_tokens",
                f"vLLM {vllm.version}'s EAGLE step kernel (eagle_step_update_slot_mapping_"
                "and_metadata) computes slots without decode context parallelism; use "
                "dcp_world_size 1 with a drafter")
    if config.runner == "v2" and config.dcp_world_size > 1:
        error = v2_dcp_runs(vllm)
        if error is not None:
            return TargetRefused(
                "dcp_world_size",
                f"vLLM {vllm.version}'s V2 compute_slot_mappings fails with decode context "
                f"parallelism under the Triton interpreter ({error}); a limit of the "
                "interpreter, not of the engine: use dcp_world_size 1 on a CPU")
    if config.reorder_batch_threshold and vllm.reorder_batch is None:
        return TargetRefused("reorder_batch_threshold",
                             f"vLLM {vllm.version} has no reorder_batch_to_split_decodes_and_"
                             "prefills to reorder its persistent batch with; use 0")
    splits = vllm.v1_kernel_blocks if config.runner == "v1" else vllm.v2_kernel_blocks
    if not splits:
        for g, spec in enumerate(config.groups):
            if spec.kernel_block_size != spec.block_size:
                cls = "BlockTable" if config.runner == "v1" else "BlockTables"
                return TargetRefused(
                    f"groups[{g}].kernel_block_size",
                    f"vLLM {vllm.version}'s {cls} takes no kernel block size (its attention "
                    f"backends map kernel blocks themselves), so it cannot split "
                    f"{spec.block_size}-token blocks into {spec.kernel_block_size}-token "
                    "kernel blocks; use a trace or --config with kernel_block_size == "
                    "block_size for this release")
    return None


def geometry_limits() -> dict:
    """What :func:`harness.geometry.runner_configs` may draw for this release (with
    ``$BLOCKFUZZ_VLLM_MODE=runner``: only what runner mode drives)."""
    vllm = load()
    if mode_setting() == "runner":
        return {"kernel_split": {"v1": False, "v2": False}, "dcp": {"v1": False, "v2": False},
                "spec": False, "spec_dcp": False, "engine": False, "sharing_ok": False,
                "padding_ok": False, "plain": True}
    return {"kernel_split": {"v1": vllm.v1_kernel_blocks, "v2": vllm.v2_kernel_blocks},
            "dcp": {"v1": True, "v2": v2_dcp_runs(vllm) is None},
            "spec": spec_decode_missing(vllm) is None, "spec_dcp": False,
            # vLLM's KV-cache manager: one group (vllm_kv_cache.refusal)
            "engine": "single", "padding_ok": False,
            # kv_sharing only where vLLM's page-size unification keeps the layout
            "uniform_pages": True}


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


def select_device(requested: str | None) -> str:
    """The vllm target's device policy: the CPU, under the Triton interpreter; loads
    vLLM now (its environment must precede Triton's import).  Raises
    :class:`TargetUnavailable` for ``cuda`` or without a usable vLLM."""
    if requested == "cuda":
        raise TargetUnavailable("--device cuda: the vllm target runs vLLM's classes on the "
                                "CPU under the Triton interpreter; use --device cpu or auto")
    try:
        load()
    except TargetUnavailable as e:
        raise TargetUnavailable(f"--target vllm: {e}") from None
    return "cpu"


def version_string() -> str | None:
    """``vLLM <release>`` of the installed release, None without one."""
    version = installed_version()
    return None if version is None else f"vLLM {version}"


MODE_ENV = "BLOCKFUZZ_VLLM_MODE"
"""``auto`` (default): runner mode wherever the release and config allow it, the
component adapter elsewhere; ``runner``: refuse what runner mode cannot run;
``adapter``: the component adapter always."""

MODE_NAMES = {"runner": "vLLM's GPUModelRunner",
              "adapter": "the component adapter (vLLM's block tables, batch and "
                         "builders in blockfuzz's runner shell)"}


def mode_setting() -> str:
    setting = os.environ.get(MODE_ENV, "auto") or "auto"
    if setting not in ("auto", "runner", "adapter"):
        raise TargetUnavailable(f"${MODE_ENV}={setting!r}: use auto, runner or adapter")
    return setting


def target_mode(config) -> tuple[str, str | None]:
    """How the vllm target runs ``config`` here: (``"runner"`` | ``"adapter"``,
    why not runner mode — None when runner mode runs it, or when ``$BLOCKFUZZ_VLLM_MODE``
    is ``adapter``).  Raises :class:`TargetRefused` when the setting is ``runner``
    and runner mode cannot run the config, :class:`TargetUnavailable` for a bad
    setting."""
    setting = mode_setting()
    if setting == "adapter":
        return "adapter", None
    from harness.targets.vllm_model_runner import runner_refusal

    refused = runner_refusal(config, load())
    if refused is None:
        from harness.targets.vllm_engine import runner_missing

        missing = runner_missing()
        if missing is not None:
            refused = TargetRefused("vllm", missing)
    if refused is not None and setting == "runner":
        raise refused
    return ("adapter", str(refused)) if refused is not None else ("runner", None)


def mode_line(config) -> str:
    """One line naming the code a run of ``config`` drives (runs print it first)."""
    mode, why = target_mode(config)
    version = installed_version()
    return f"vLLM {version}: {MODE_NAMES[mode]}" + (f" — runner mode: {why}" if why else "")


def recorded_verdict(trace, version: str, mode: str) -> dict | None:
    """The verdict ``trace.meta.expect_by_release`` records for ``version`` measured
    in ``mode`` (an entry without ``mode`` was measured by the component adapter);
    None when there is none for that release and mode."""
    entry = trace.meta.get("expect_by_release", {}).get(version)
    if entry is None or entry.get("mode", "adapter") != mode:
        return None
    return {k: v for k, v in entry.items() if k != "mode"}


def make_target(config, faults=(), device: str | None = None):
    """The ``vllm`` target for ``config`` (faults are refused by the registry first):
    vLLM's own model runner where :func:`target_mode` says so, else the component
    adapter."""
    from harness.targets.runner_target import RunnerTarget

    assert not faults, "faults live in gpu_impl"
    if device not in (None, "auto", "cpu"):
        raise TargetUnavailable("the vllm target runs vLLM's code on the CPU under the "
                                "Triton interpreter; use --device cpu or auto")
    if target_mode(config)[0] == "runner":
        refused = refusal(config)
        if refused is not None:
            raise refused
        from harness.targets.vllm_model_runner import VllmModelRunnerTarget

        try:
            return VllmModelRunnerTarget(config)
        except TargetRefused:  # vLLM's set-up refused the pool: remembered for the config
            if mode_setting() == "runner":
                raise
    runner = make_vllm_runner(config, device)
    manager = None
    if config.allocator == "engine":
        from harness.targets.vllm_kv_cache import VllmKVCacheManager

        manager = VllmKVCacheManager(config)
    return RunnerTarget("vllm", runner, manager)


def make_vllm_runner(config, device: str | None = None):
    """A model runner over the installed vLLM's block tables for ``config``.

    Raises :class:`TargetUnavailable` (no usable vLLM, or ``device`` cuda) and
    :class:`TargetRefused` (geometry the release cannot express).
    """
    if device not in (None, "auto", "cpu"):
        raise TargetUnavailable("the vllm target runs vLLM's classes on the CPU under the "
                                "Triton interpreter; use --device cpu or auto")
    vllm = load()
    refused = refusal(config, vllm)
    if refused is not None:
        raise refused
    from harness.targets.vllm_runners import VllmV1Runner, VllmV2Runner

    cls = VllmV2Runner if config.runner == "v2" else VllmV1Runner
    return cls(config, torch.device("cpu"))


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


SPEC = TargetSpec(
    name="vllm", description="the installed vLLM's own block-table classes",
    factory=make_target, select_device=select_device, takes_faults=False,
    refusal=refusal, limits=geometry_limits,
    version=version_string, variant=lambda config: _variant(config))


def _variant(config) -> str:
    """``runner`` / ``adapter`` as :func:`target_mode` says, ``refused`` where the
    ``runner`` setting refuses the config (TargetSpec.variant never raises)."""
    try:
        return target_mode(config)[0]
    except TargetRefused:
        return "refused"
