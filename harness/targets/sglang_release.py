"""The installed SGLang release: found without importing it, loaded once per
process with the environment and the one import stub its memory-pool modules
need on a CPU-only machine.

The base of the sglang target (:mod:`harness.targets.sglang`), which imports
from here; this module imports none of the target's.

What is loaded is SGLang's own code, unchanged: the request → token map
(``ReqToTokenPool``), the token-to-KV pool (``MHATokenToKVPool``), the token and
paged allocators, the radix prefix cache, the scheduler's allocation paths
(``sglang/srt/mem_cache/allocation.py``: ``alloc_for_extend`` /
``alloc_for_decode``), its release path (``sglang/srt/mem_cache/common.py``:
``match_kv_cache`` / ``release_kv_cache``) and the decode CUDA graph's padding
registry (``sglang/srt/model_executor/cuda_graph_buffer_registry.py``).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import inspect
import os
import sys
import types
from types import SimpleNamespace

from harness.targets.registry import TargetUnavailable


def installed_version() -> str | None:
    """The installed SGLang distribution's version, without importing it (None if absent)."""
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


# -- the import stub ------------------------------------------------------------------
# SGLang's config package imports torchvision at module level (a multimodal
# model's utils, through ``sglang.srt.configs``); nothing the memory pools run
# calls it. It is stubbed only when it is not installed.
STUBBED = ("torchvision",)


class _Placeholder:
    """An inert value: any call, attribute or base-class use gives another."""

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        return _Placeholder()

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder()

    def __mro_entries__(self, bases):
        return (object,)


class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        # transformers reads enum members off torchvision at import: instances, not classes
        return _Placeholder()


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, names):
        self.names = frozenset(names)

    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] in self.names:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        module.__version__ = "0.0.0+blockfuzz-stub"  # transformers parses a version
        return module

    def exec_module(self, module):
        pass


def _install_stubs() -> tuple[str, ...]:
    """Stub the modules of :data:`STUBBED` that are not installed; returns their names."""
    missing = tuple(n for n in STUBBED if n not in sys.modules
                    and importlib.util.find_spec(n) is None)
    if missing and not any(isinstance(f, _StubFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _StubFinder(missing))
    return missing


_LOADED: SimpleNamespace | None = None


def load() -> SimpleNamespace:
    """Import SGLang's memory-pool modules once per process, with the environment
    they need on a CPU-only machine (``TRITON_INTERPRET=1``,
    ``CUDA_VISIBLE_DEVICES`` empty, torchvision stubbed when absent).

    Returns a namespace: ``version``; the classes ``ReqToTokenPool``,
    ``MHATokenToKVPool``, ``TokenToKVPoolAllocator``,
    ``PagedTokenToKVPoolAllocator``, ``RadixCache``, ``CacheInitParams``,
    ``ReqKvInfo``; the functions ``alloc_for_extend``, ``alloc_for_decode``,
    ``release_kv_cache``, ``publish_prefill`` (``checkpoint_kv_cache``, or
    before it ``maybe_cache_unfinished_req``), ``build_decode_registry``; what
    differs by release: ``release_insert_kw`` (``checkpoint`` / ``is_insert``),
    ``tree_lock`` (the tree has ``lock`` / ``unlock``, else ``inc_lock_ref``),
    ``create_tree_cache`` / ``TreeCacheBuildContext`` (the release's default
    tree factory, None where it has none); and
    what was read off the release: ``page_sizes`` (the allocator page sizes
    the target drives), ``radix_cache_name``, ``padding_source`` (where the
    decode graph's padding lives), ``stubbed`` (modules stubbed at import).
    Raises :class:`TargetUnavailable` (one line: what to install, or what this
    release lacks).
    """
    global _LOADED
    if _LOADED is not None:
        return _LOADED
    version = installed_version()
    if version is None:
        raise TargetUnavailable("SGLang is not installed; run scripts/install-sglang-target.sh "
                                "RELEASE (e.g. 0.5.23) in this environment")
    if "sglang" not in sys.modules:
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            raise TargetUnavailable("Triton was imported without TRITON_INTERPRET=1 before "
                                    "the sglang target could set it; start a fresh process")
        os.environ["TRITON_INTERPRET"] = "1"
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        # SGLang's CPU engine imports sgl_kernel; the pools run without it.
        os.environ.pop("SGLANG_USE_CPU_ENGINE", None)
    stubbed = _install_stubs()
    try:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from sglang.srt.managers.schedule_batch import ReqKvInfo
            from sglang.srt.mem_cache import allocation, common
            from sglang.srt.mem_cache.allocator import (PagedTokenToKVPoolAllocator,
                                                        TokenToKVPoolAllocator)
            from sglang.srt.mem_cache.cache_init_params import CacheInitParams
            from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
            from sglang.srt.mem_cache.radix_cache import RadixCache
    except Exception as e:  # noqa: BLE001 (any import-time failure: this install cannot run)
        raise TargetUnavailable(
            f"SGLang {version} does not import here ({type(e).__name__}: {e}); "
            "reinstall it with scripts/install-sglang-target.sh RELEASE (its pinned "
            "requirements are measured on 0.5.23)") from None
    missing = [name for name, mod in (("alloc_for_extend", allocation),
                                      ("alloc_for_decode", allocation),
                                      ("release_kv_cache", common))
               if not hasattr(mod, name)]
    # Publishing a prefilled request's KV: checkpoint_kv_cache (0.5.23), earlier
    # maybe_cache_unfinished_req (cache_unfinished_req); read off the release.
    publish = getattr(common, "checkpoint_kv_cache", None) or getattr(
        common, "maybe_cache_unfinished_req", None)
    if publish is None:
        missing.append("checkpoint_kv_cache / maybe_cache_unfinished_req")
    if missing:
        raise TargetUnavailable(f"SGLang {version} has no {', '.join(missing)} in "
                                "sglang.srt.mem_cache (the sglang target drives the "
                                "scheduler's allocation and release paths of 0.5.20 and later)")
    release_params = inspect.signature(common.release_kv_cache).parameters
    try:  # the release's default tree factory (0.5.20 on: a UnifiedRadixCache)
        from sglang.srt.mem_cache.registry import TreeCacheBuildContext, create_tree_cache
    except ImportError:
        TreeCacheBuildContext = create_tree_cache = None
    try:
        from sglang.srt.model_executor.cuda_graph_buffer_registry import build_decode_registry
        padding_source = "cuda_graph_buffer_registry.fill_from"
    except ImportError:
        raise TargetUnavailable(
            f"SGLang {version} has no decode padding registry (build_decode_registry); "
            "its padding is inline in the graph runner, which needs a GPU") from None
    _LOADED = SimpleNamespace(
        version=version, ReqToTokenPool=ReqToTokenPool, MHATokenToKVPool=MHATokenToKVPool,
        TokenToKVPoolAllocator=TokenToKVPoolAllocator,
        PagedTokenToKVPoolAllocator=PagedTokenToKVPoolAllocator, RadixCache=RadixCache,
        CacheInitParams=CacheInitParams, ReqKvInfo=ReqKvInfo,
        alloc_for_extend=allocation.alloc_for_extend,
        alloc_for_decode=allocation.alloc_for_decode,
        release_kv_cache=common.release_kv_cache, publish_prefill=publish,
        # how the release path is told to insert into the tree (checkpoint=, is_insert=)
        release_insert_kw="checkpoint" if "checkpoint" in release_params else "is_insert",
        # how the prefill adder locks a hit: tree_cache.lock (0.5.23) or inc_lock_ref
        tree_lock=hasattr(RadixCache, "lock"),
        build_decode_registry=build_decode_registry, page_sizes=(1, 4),
        create_tree_cache=create_tree_cache, TreeCacheBuildContext=TreeCacheBuildContext,
        radix_cache_name=("the default tree factory (create_tree_cache)"
                          if create_tree_cache is not None else
                          f"{RadixCache.__module__}.{RadixCache.__name__}"),
        padding_source=padding_source, stubbed=stubbed,
        decode_registry_kwargs=frozenset(inspect.signature(build_decode_registry).parameters))
    return _LOADED


_MAMBA: SimpleNamespace | TargetUnavailable | None = None


def load_mamba() -> SimpleNamespace:
    """SGLang's hybrid-model (Mamba) code beside :func:`load`'s, imported once:
    ``HybridReqToTokenPool`` (its ``clear_slots`` / ``copy_mamba_state``: the
    model runner's deferred clear and copy-on-write of a prefix hit's state),
    the Mamba2 state shapes and dtypes, the Mamba attention backend whose graph replay turns padded rows into state indices
    (``Mamba2AttnBackend``: ``init_cuda_graph_state`` / ``_replay_metadata``),
    ``ForwardMode`` and ``PAD_SLOT_ID``.  Raises :class:`TargetUnavailable`
    (one line) where the release lacks any of them."""
    global _MAMBA
    if isinstance(_MAMBA, TargetUnavailable):
        # asked once per drawn example: the failed import is not retried
        raise TargetUnavailable(str(_MAMBA))
    if _MAMBA is not None:
        return _MAMBA
    try:
        _MAMBA = _load_mamba()
    except TargetUnavailable as e:
        _MAMBA = e
        raise
    return _MAMBA


def _load_mamba() -> SimpleNamespace:
    s = load()
    try:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from sglang.srt.configs.mamba_utils import (Mamba2CacheParams, Mamba2StateDType,
                                                        Mamba2StateShape)
            from sglang.srt.layers.attention.hybrid_linear_attn_backend import (
                PAD_SLOT_ID, Mamba2AttnBackend)
            from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool
            from sglang.srt.model_executor.forward_batch_info import ForwardMode
    except Exception as e:  # noqa: BLE001 (any import failure: no hybrid model here)
        raise TargetUnavailable(f"SGLang {s.version}: its hybrid-model (Mamba) code does not "
                                f"import here ({type(e).__name__}: {e})") from None
    replay = getattr(Mamba2AttnBackend, "_replay_metadata", None)
    missing = [n for n, v in (("Mamba2AttnBackend._replay_metadata", replay),
                              ("HybridReqToTokenPool.copy_mamba_state",
                               getattr(HybridReqToTokenPool, "copy_mamba_state", None)))
               if v is None]
    if missing:
        raise TargetUnavailable(f"SGLang {s.version} has no {', '.join(missing)} (the sglang "
                                "target drives a hybrid model's Mamba pool through them)")
    return SimpleNamespace(
        HybridReqToTokenPool=HybridReqToTokenPool, Mamba2CacheParams=Mamba2CacheParams,
        Mamba2StateDType=Mamba2StateDType, Mamba2StateShape=Mamba2StateShape,
        Mamba2AttnBackend=Mamba2AttnBackend, ForwardMode=ForwardMode, PAD_SLOT_ID=PAD_SLOT_ID,
        pool_kwargs=frozenset(inspect.signature(HybridReqToTokenPool.__init__).parameters))

