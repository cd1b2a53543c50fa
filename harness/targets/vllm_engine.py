"""Process set-up for driving the installed vLLM's own model runner on a CPU.

Runner mode of the ``vllm`` target (:mod:`harness.targets.vllm_model_runner`)
constructs vLLM's V1 ``GPUModelRunner`` (``vllm/v1/worker/gpu_model_runner.py``)
from a ``VllmConfig`` derived from the trace's config, with a model of ours
(:mod:`harness.targets.vllm_model`) whose layers are vLLM's own layer classes.
Everything between a ``SchedulerOutput`` and the model's forward — request
states, the persistent batch, block tables, metadata builders, ``_dummy_run``,
CUDA-graph dispatch — is vLLM's code.

What this module changes in the process, once (:func:`prepare`), and why —
each prevents an error a CPU-only machine raises; none touches the runner's
logic, ``InputBatch``, the block tables or the metadata builders:

- pinned host memory off (platform, module flags, ``CpuGpuBuffer``'s default):
  CPU torch refuses ``pin_memory=True``;
- the platform's attention backend is :class:`~harness.targets.vllm_model.`
  ``BlockfuzzTritonBackend`` (vLLM's Triton backend and builder; it declares
  any kernel block size, because the kernels that read and write the caches
  are gpu_impl's); ``get_current_memory_usage`` 0, ``support_hybrid_kv_cache``
  and ``support_static_graph_mode`` True (as CUDA's), ``num_compute_units`` 1;
- ``torch.accelerator.synchronize`` / ``empty_cache`` no-ops and host
  placeholders for ``torch.cuda.Event`` / ``Stream`` / ``current_stream`` (as vLLM's own
  ``CPUModelRunner`` does), ``get_memory_info`` (0, 0);
- ``gpu_model_runner.CUDAGraphWrapper`` is :class:`EmulatedCUDAGraphWrapper`
  and ``graph_capture`` a null context: a FULL graph is emulated by re-running
  the model on the metadata objects kept at capture (persistent buffers with
  their current contents, capture-time scalars), as a replayed graph reads;
- the full garbage collections of vLLM's device-memory profiling and of
  capture's GC freeze are skipped (no device memory to measure; each costs
  about 0.6 s of a run's set-up).

The platform's ``device_type`` is ``cpu`` (V2's buffers allocate on it once
pinned memory is off).  V2's ``ModelRunner`` (``vllm/v1/worker/gpu/model_runner.py``)
needs a few more, applied once by :func:`prepare_v2`: a graph-pool placeholder,
``Tensor.pin_memory`` the identity (0.26 pins every staged copy), and its graph manager's
``torch.cuda.CUDAGraph`` / ``torch.cuda.graph`` emulated by
:class:`EmulatedCUDAGraph` (the model records what its forward ran at capture;
``replay`` runs it again on the captured objects).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import tempfile
from types import SimpleNamespace

import torch

SHIMS: list[str] = []
_PREPARED: SimpleNamespace | None = None


def _kw(fn, candidates: dict) -> dict:
    params = inspect.signature(fn).parameters
    return {k: v for k, v in candidates.items() if k in params}


class _Event:
    """A host placeholder for ``torch.cuda.Event`` (no device to record on)."""

    def __init__(self, *a, **k):
        pass

    def record(self, *a, **k):
        pass

    def synchronize(self):
        pass

    def wait(self, *a, **k):
        pass

    def query(self):
        return True


class _NoCollect:
    """The ``gc`` module as vLLM's memory profiling sees it: ``collect`` does
    nothing (it measures device memory, which a CPU run has none of); every
    other attribute is the real module's."""

    def collect(self, *a, **k) -> int:
        return 0

    def __getattr__(self, name):
        import gc

        return getattr(gc, name)


class _Stream:
    """A host placeholder for ``torch.cuda.Stream``."""

    def __init__(self, *a, **k):
        self.device = torch.device("cpu")

    def wait_stream(self, *a, **k):
        pass

    def synchronize(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


RUNNER_PACKAGES = ("einops", "compressed_tensors", "loguru")
"""Imported on the model runner's import chain beyond the block-table modules'
(``scripts/install-vllm-target.sh`` installs them)."""


def runner_missing() -> str | None:
    """Why vLLM's model runner cannot be imported here (a package missing), or None."""
    import importlib.util

    missing = [p for p in RUNNER_PACKAGES if importlib.util.find_spec(p) is None]
    if missing:
        return (f"the model runner's import chain needs {', '.join(missing)}; "
                "scripts/install-vllm-target.sh installs them")
    return None


def prepare() -> SimpleNamespace:
    """Apply the shims (module docstring) once per process, after
    :func:`harness.targets.vllm_release.load`; returns the namespace of vLLM modules
    runner mode uses.  Raises :class:`~harness.targets.registry.TargetUnavailable`
    when the runner's import chain cannot load (a package missing)."""
    global _PREPARED
    if _PREPARED is not None:
        return _PREPARED
    from harness.targets.registry import TargetUnavailable
    from harness.targets.vllm_release import load

    load()  # environment + pinned-memory flags of the block-table modules
    try:
        _PREPARED = _prepare()
    except ImportError as e:
        raise TargetUnavailable(
            f"vLLM's model runner cannot be imported here ({e}); install the runner's "
            "extra packages: scripts/install-vllm-target.sh installs them") from None
    return _PREPARED


def _prepare() -> SimpleNamespace:
    import vllm.platforms.interface as platform_interface

    platform_interface.Platform.is_pin_memory_available = classmethod(lambda cls: False)
    import vllm.utils.torch_utils as torch_utils

    if callable(getattr(torch_utils, "is_pin_memory_available", None)):
        torch_utils.is_pin_memory_available = lambda: False
    import vllm.v1.attention.backends.utils as backend_utils
    import vllm.v1.utils as v1_utils
    import vllm.v1.worker.block_table as block_table
    import vllm.v1.worker.gpu_input_batch as input_batch
    import vllm.v1.worker.gpu_model_runner as gmr

    for module in (torch_utils, gmr, input_batch, block_table, v1_utils, backend_utils):
        if getattr(module, "PIN_MEMORY", False):
            module.PIN_MEMORY = False
    defaults = v1_utils.CpuGpuBuffer.__init__.__kwdefaults__ or {}
    if defaults.get("pin_memory"):
        defaults["pin_memory"] = False
    SHIMS.append("pinned host memory off (CPU torch refuses it)")

    from vllm.platforms import current_platform

    platform = type(current_platform)
    platform.get_attn_backend_cls = classmethod(
        lambda cls, *a, **k: "harness.targets.vllm_model.BlockfuzzTritonBackend")
    platform.get_current_memory_usage = classmethod(lambda cls, device=None: 0)
    platform.support_hybrid_kv_cache = classmethod(lambda cls: True)
    platform.support_static_graph_mode = classmethod(lambda cls: True)
    if not current_platform.device_type:
        # V2's buffers (the adapter's too, 0.32) allocate on it once pinned memory is off
        platform.device_type = "cpu"
    if hasattr(platform, "num_compute_units"):
        try:
            platform.num_compute_units(0)
        except NotImplementedError:
            platform.num_compute_units = classmethod(lambda cls, device_id=0: 1)
    SHIMS.append("platform: vLLM's Triton attention backend declaring any kernel block size; "
                 "memory usage 0; hybrid KV cache and static graphs as on CUDA")

    torch.accelerator.synchronize = lambda *a, **k: None
    torch.accelerator.empty_cache = lambda *a, **k: None
    if hasattr(torch.accelerator, "get_memory_info"):
        torch.accelerator.get_memory_info = lambda *a, **k: (0, 0)
    torch.Event = torch.cuda.Event = _Event
    torch.cuda.Stream = _Stream
    main = _Stream()  # V2's sample_tokens, V1's draft-token copy
    torch.cuda.current_stream = lambda device=None: main
    torch.cuda.stream = lambda stream=None: contextlib.nullcontext()
    torch.cuda.set_stream = lambda stream=None: None
    SHIMS.append("torch.accelerator synchronize / empty_cache no-ops, CUDA events and streams "
                 "host placeholders (as vLLM's CPUModelRunner)")

    import importlib

    for name in ("vllm.utils.mem_utils", "vllm.utils.gc_utils",
                 "vllm.model_executor.model_loader.base_loader"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if getattr(module, "gc", None) is not None:
            module.gc = _NoCollect()
    gmr.gc = _NoCollect()
    SHIMS.append("full garbage collections of vLLM's device-memory profiling and graph "
                 "capture skipped (no device memory to measure; ~0.6 s each)")

    gmr.CUDAGraphWrapper = EmulatedCUDAGraphWrapper
    gmr.graph_capture = lambda device=None: contextlib.nullcontext()
    SHIMS.append("CUDA graphs emulated (EmulatedCUDAGraphWrapper)")

    from vllm.v1.worker.workspace import init_workspace_manager

    init_workspace_manager(torch.device("cpu"))  # what Worker.init_device does
    from harness.targets import vllm_model

    vllm_model.register()
    import vllm

    return SimpleNamespace(version=vllm.__version__, gmr=gmr, backend_utils=backend_utils)


_PREPARED_V2 = False


def prepare_v2() -> None:
    """The shims V2's ``ModelRunner`` needs beyond :func:`prepare` (module
    docstring), once per process; called before one is constructed."""
    global _PREPARED_V2
    prepare()
    if _PREPARED_V2:
        return
    from vllm.platforms import current_platform

    platform = type(current_platform)
    if not callable(getattr(current_platform, "graph_pool_handle", None)):
        platform.graph_pool_handle = staticmethod(lambda: object())
    torch.Tensor.pin_memory = lambda self, *a, **k: self
    torch.cuda.CUDAGraph = EmulatedCUDAGraph
    torch.cuda.graph = _capture_into
    import vllm.v1.worker.gpu.cudagraph_utils as cudagraph_utils

    cudagraph_utils.graph_capture = lambda device=None: contextlib.nullcontext()
    cudagraph_utils.tqdm = lambda items, *a, **k: items  # no capture bars (V1 has none either)
    SHIMS.append("V2: a graph-pool placeholder, pin_memory the identity, CUDA graphs emulated "
                 "(EmulatedCUDAGraph)")
    _PREPARED_V2 = True


class EmulatedCUDAGraph:
    """``torch.cuda.CUDAGraph`` as V2's graph manager (``vllm/v1/worker/gpu/
    cudagraph_utils.py``) uses it, on the CPU.  While a graph is captured
    (:func:`_capture_into`), each model forward records a launch — the forward
    re-run on the forward context's metadata and slot mappings and the input
    tensors it was handed, kept as they were at capture (views of persistent
    buffers; what a replay reads) —; :meth:`replay` runs the launches."""

    capturing: list["EmulatedCUDAGraph"] = []

    def __init__(self, *args, **kwargs):
        self.launches: list = []

    def replay(self) -> None:
        for launch in self.launches:
            launch()

    @classmethod
    def current(cls) -> "EmulatedCUDAGraph | None":
        """The graph being captured now, or None."""
        return cls.capturing[-1] if cls.capturing else None


@contextlib.contextmanager
def _capture_into(graph, pool=None, stream=None, **kwargs):
    """``torch.cuda.graph(graph, pool, stream=…)``: forwards inside record into ``graph``."""
    EmulatedCUDAGraph.capturing.append(graph)
    try:
        yield graph
    finally:
        EmulatedCUDAGraph.capturing.pop()


def init_distributed(vc) -> None:
    """World size 1 over gloo, as a single worker's ``init_device`` sets it up
    (once per process; ``vc`` the first runner's ``VllmConfig``)."""
    from vllm.config import set_current_vllm_config
    from vllm.distributed.parallel_state import (init_distributed_environment,
                                                 initialize_model_parallel,
                                                 model_parallel_is_initialized)

    if model_parallel_is_initialized():
        return
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 20000))
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
    import sys

    # vLLM silences gloo through the process's stdout file descriptor: a captured
    # sys.stdout (pytest's capsys, a CLI test) has none.
    with set_current_vllm_config(vc), contextlib.redirect_stdout(sys.__stdout__):
        init_distributed_environment(**_kw(init_distributed_environment, dict(
            world_size=1, rank=0, local_rank=0, distributed_init_method="env://",
            backend="gloo")))
        initialize_model_parallel(1, 1)


class EmulatedCUDAGraphWrapper:
    """vLLM's ``CUDAGraphWrapper`` dispatch on the CPU (``vllm/compilation/cuda_graph.py``).

    Modes other than the wrapper's own pass through.  The first call in its
    mode per batch descriptor is the capture: vLLM's capture check, then the
    model runs and the forward context's attention metadata and slot mappings
    are kept.  Later calls are replays: the model runs again on the kept
    objects — capture-time scalars, and tensors that view the runner's and
    builders' persistent buffers with whatever those hold now, as a replayed
    graph reads.
    """

    def __init__(self, runnable, vllm_config, runtime_mode, cudagraph_options=None):
        self.runnable = runnable
        self.vllm_config = vllm_config
        self.runtime_mode = runtime_mode
        self.entries: dict = {}

    def __getattr__(self, key):
        if key == "runnable":
            raise AttributeError(key)
        return getattr(self.runnable, key)

    def unwrap(self):
        inner = self.runnable
        return inner.unwrap() if hasattr(inner, "unwrap") else inner

    @property
    def cudagraph_wrapper(self):
        return self

    def clear_graphs(self) -> None:
        self.entries.clear()

    def __call__(self, *args, **kwargs):
        from vllm.compilation import cuda_graph
        from vllm.config import CUDAGraphMode
        from vllm.forward_context import get_forward_context, is_forward_context_available

        if not is_forward_context_available():
            return self.runnable(*args, **kwargs)
        ctx = get_forward_context()
        mode, desc = ctx.cudagraph_runtime_mode, ctx.batch_descriptor
        if mode == CUDAGraphMode.NONE or mode != self.runtime_mode:
            return self.runnable(*args, **kwargs)
        if desc not in self.entries:
            if hasattr(cuda_graph, "validate_cudagraph_capturing_enabled"):
                cuda_graph.validate_cudagraph_capturing_enabled()
            out = self.runnable(*args, **kwargs)
            self.entries[desc] = (ctx.attn_metadata, getattr(ctx, "slot_mapping", None),
                                  args, kwargs)
            return out
        attn_metadata, slot_mapping, cap_args, cap_kwargs = self.entries[desc]
        live = (ctx.attn_metadata, getattr(ctx, "slot_mapping", None))
        ctx.attn_metadata = attn_metadata
        if live[1] is not None:
            ctx.slot_mapping = slot_mapping
        try:
            return self.runnable(*cap_args, **cap_kwargs)
        finally:
            ctx.attn_metadata = live[0]
            if live[1] is not None:
                ctx.slot_mapping = live[1]


# -- configuration ----------------------------------------------------------------

MODEL_HIDDEN = 16
"""Hidden size of the registered model (its layers' shapes only; the payload
written into the caches has the trace's ``head_size``)."""


def model_dir(config, vocab_size: int) -> str:
    """A directory holding the registered model's ``config.json`` for ``config``
    (one per process and geometry; HF config fields of a tiny Bamba-shaped
    hybrid, plus ``blockfuzz_config``: the trace config's JSON)."""
    from harness.targets.vllm_model import architecture

    hybrid = bool(config.mamba_groups)
    layers = len(config.groups)
    body = {
        "architectures": [architecture(hybrid)], "model_type": "bamba",
        "vocab_size": vocab_size, "hidden_size": MODEL_HIDDEN, "intermediate_size": 32,
        "num_hidden_layers": layers,
        "attn_layer_indices": list(config.attention_groups),
        "num_attention_heads": 2, "num_key_value_heads": 1,
        # The smallest Mamba2 state vLLM's shape calculators accept: its page
        # must fit in an attention page of the trace's block size.
        "mamba_n_heads": 2, "mamba_d_head": 8, "mamba_n_groups": 1, "mamba_d_state": 2,
        "mamba_d_conv": 2, "mamba_expand": 1, "mamba_chunk_size": 4,
        "max_position_embeddings": max(256, config.max_model_len),
        "torch_dtype": "float32", "tie_word_embeddings": False,
        "blockfuzz_config": config.to_json(),
    }
    path = os.path.join(tempfile.gettempdir(), f"blockfuzz-vllm-model-{os.getpid()}",
                        _digest(body))
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(body, f)
    return path


def _digest(body: dict) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


def vllm_config(config, vocab_size: int):
    """The ``VllmConfig`` of ``config`` (a ``reference.RunnerConfig``): its block
    size, ``max_model_len`` (+ 1: the token sampled after a request's last
    position), ``max_num_seqs``, token budget, KV blocks and
    capture sizes; ``cudagraph_mode`` FULL (vLLM lowers it to what the model's
    builders support: FULL_DECODE_ONLY with a Mamba group; PIECEWISE needs
    ``torch.compile``, which is not driven, and vLLM turns FULL_AND_PIECEWISE
    into NONE without it), no prefix caching, Mamba cache mode ``none``."""
    from vllm.config import (CacheConfig, CompilationConfig, DeviceConfig, LoadConfig,
                             ModelConfig, ParallelConfig, SchedulerConfig, VllmConfig)

    attn = config.groups[config.attention_groups[0]]
    sizes = sorted(config.cudagraph_capture_sizes)
    # One position more than the trace's: a trace may compute a request's KV at
    # every position below max_model_len, and vLLM's runner then samples a token
    # past it (its scheduler would have finished the request a step earlier).
    length = config.max_model_len + 1
    model = ModelConfig(**_kw(ModelConfig, dict(
        model=model_dir(config, vocab_size), skip_tokenizer_init=True, dtype="float32",
        max_model_len=length, seed=0, enforce_eager=not sizes)))
    sched = SchedulerConfig(**_kw(SchedulerConfig, dict(
        max_num_seqs=config.max_num_reqs, max_num_batched_tokens=config.max_num_batched_tokens,
        max_model_len=length, is_encoder_decoder=False,
        enable_chunked_prefill=True, async_scheduling=False)))
    cache = CacheConfig(**_kw(CacheConfig, dict(
        block_size=attn.block_size, mamba_cache_mode="none", enable_prefix_caching=False,
        num_gpu_blocks_override=config.num_blocks, cache_dtype="auto")))
    mode = "FULL" if sizes else "NONE"
    graphs = dict(cudagraph_capture_sizes=sizes, max_cudagraph_capture_size=max(sizes)) \
        if sizes else {}
    comp = CompilationConfig(**_kw(CompilationConfig, dict(mode=0, cudagraph_mode=mode,
                                                           **graphs)))
    spec = None
    if config.num_speculative_tokens:
        from vllm.config import SpeculativeConfig

        from harness.targets.vllm_model import PROPOSER

        spec = SpeculativeConfig(**_kw(SpeculativeConfig, dict(
            method="custom_class", model=PROPOSER,
            num_speculative_tokens=config.num_speculative_tokens,
            target_model_config=model, target_parallel_config=ParallelConfig())))
    out = VllmConfig(model_config=model, cache_config=cache, scheduler_config=sched,
                     speculative_config=spec,
                     device_config=DeviceConfig(device="cpu"),
                     # no progress bars (capture_model's, once per runner)
                     load_config=LoadConfig(**_kw(LoadConfig, dict(load_format="dummy",
                                                                   use_tqdm_on_load=False))),
                     parallel_config=ParallelConfig(), compilation_config=comp)
    return out
