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

import os
from types import SimpleNamespace

import torch

from harness.targets.registry import TargetRefused, TargetSpec, TargetUnavailable
from harness.targets.vllm_release import (  # noqa: F401 - the target's names, re-exported
    _group_sizes, _kwargs_for, installed_version, load, max_model_len, spec_decode_missing,
    staged_rows, v2_dcp_runs, version_string)

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
    if trace.config.host_blocks:
        from harness.targets.vllm_offload import SITE

        driven = driven + (SITE,)
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
    if config.runner == "sglang":
        return TargetRefused("runner", "the vllm target runs block-table configs (v1 / v2); a "
                             "token-slot trace (runner sglang) runs on --target sglang")
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
    if config.host_blocks:
        from harness.targets.vllm_offload import missing

        why = missing()
        if why is not None:
            return TargetRefused("host_blocks", why)
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
        from harness.targets.vllm_model_runner import custom_drafter_hook

        return {"kernel_split": {"v1": False, "v2": False}, "dcp": {"v1": False, "v2": False},
                "spec": {"v1": custom_drafter_hook(), "v2": False},
                "spec_dcp": False, "engine": False, "sharing_ok": False,
                "padding_ok": False, "plain": True, "mamba_needed": {"v2": True},
                "spec_fits_graphs": True, "host_ok": False, "narrow_ok": False}
    return {"kernel_split": {"v1": vllm.v1_kernel_blocks, "v2": vllm.v2_kernel_blocks},
            "dcp": {"v1": True, "v2": v2_dcp_runs(vllm) is None},
            "spec": spec_decode_missing(vllm) is None, "spec_dcp": False,
            # vLLM's KV-cache manager: one group (vllm_kv_cache.refusal)
            "engine": "single", "padding_ok": False,
            # kv_sharing only where vLLM's page-size unification keeps the layout
            "uniform_pages": True,
            # a host tier where vLLM's own CPU offloading manager runs
            "host_ok": _host_tier_missing() is None,
            # Rows narrower than a request are not drawn here: vLLM's slot-mapping
            # kernels give the positions past such a row a slot (V1: the null block
            # through the row's alignment columns, then the next row; V2: an
            # unmasked load past the row, memory the interpreter may not hold), the
            # open upstream issue vllm#53982 that every narrow config would find
            # again. Traces with one run (corpora/vllm/v1-narrow-row-*.json).
            "narrow_ok": False}


def _host_tier_missing() -> str | None:
    from harness.targets.vllm_offload import missing

    return missing()


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


MODE_ENV = "BLOCKFUZZ_VLLM_MODE"
"""``auto`` (default): runner mode wherever the release and config allow it, the
component adapter elsewhere; ``runner``: refuse what runner mode cannot run;
``adapter``: the component adapter always."""

MODE_NAMES = {"runner": "vLLM's own model runner (V1 GPUModelRunner, V2 ModelRunner)",
              "adapter": "the component adapter (vLLM's block tables, batch and "
                         "builders in blockfuzz's runner shell)"}


def mode_name(mode: str, runner: str | None = None) -> str:
    """What ``mode`` drives for ``runner`` (``v1`` / ``v2``; None: either)."""
    if mode == "runner" and runner is not None:
        from harness.targets.vllm_model_runner import MODE, MODE_V2

        return MODE_V2 if runner == "v2" else MODE
    return MODE_NAMES[mode]


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
    return f"vLLM {version}: {mode_name(mode, config.runner)}" + (
        f" — runner mode: {why}" if why else "")


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
        from harness.targets.vllm_model_runner import runner_target

        try:
            return runner_target(config)
        except TargetRefused:  # vLLM's set-up refused the pool: remembered for the config
            if mode_setting() == "runner":
                raise
    runner = make_vllm_runner(config, device)
    manager = None
    if config.allocator == "engine":
        from harness.targets.vllm_kv_cache import VllmKVCacheManager

        manager = VllmKVCacheManager(config)
    host = None
    if config.host_blocks:
        from harness.targets.vllm_offload import VllmHostManager

        host = VllmHostManager
    return RunnerTarget("vllm", runner, manager, host_manager=host)


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


SPEC = TargetSpec(
    name="vllm", description="the installed vLLM: its own GPUModelRunner where it can "
    "(runner mode), else its block tables, batch and builders (the adapter)",
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
