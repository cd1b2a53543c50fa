"""blockfuzz harness: what drives an implementation and judges it.

- :mod:`harness.core`: traces, the op registry (:mod:`harness.core.ops`), the
  invariant registry, the differential session and the observation types;
- :mod:`harness.search`: the Hypothesis state machine, fuzz, shrink, nightly
  campaigns, drawn geometry, settings profiles;
- :mod:`harness.targets`: the target registry (reference, gpu_impl, vllm);
- :mod:`harness.tools`: ``explain`` and the standalone reproducer template;
- :mod:`harness.cli`: the ``blockfuzz`` command line.

Module paths from before this layout (``harness.session``, ``harness.trace``,
``harness.vllm_target``, ...) still import — reproducer scripts written by
older releases use them — through :class:`_MovedModules`.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

MOVED = {
    "harness.trace": "harness.core.trace",
    "harness.session": "harness.core.session",
    "harness.invariants": "harness.core.invariants",
    "harness.machine": "harness.search.machine",
    "harness.fuzz": "harness.search.fuzz",
    "harness.shrink": "harness.search.shrink",
    "harness.nightly": "harness.search.nightly",
    "harness.geometry": "harness.search.geometry",
    "harness.profiles": "harness.search.profiles",
    "harness.vllm_target": "harness.targets.vllm",
    "harness.explain": "harness.tools.explain",
    "harness.reproducer": "harness.tools.reproducer",
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Old module path -> the module at its new path (one object, not a copy)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname in MOVED:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        module = importlib.import_module(MOVED[spec.name])
        spec.loader_state = (module.__spec__, getattr(module, "__loader__", None))
        return module

    def exec_module(self, module):
        # The import system stamped the alias's spec on the module: put its own back.
        spec = module.__spec__
        module.__spec__, module.__loader__ = spec.loader_state


if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
    sys.meta_path.append(_MovedModules())
