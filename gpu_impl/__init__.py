"""blockfuzz gpu_impl: the implementation under test, written as an engine writes
it (torch + Triton kernels + CUDA graphs), with switchable faults.

The device is chosen before Triton is first imported: ``gpu_impl.faults`` and
``gpu_impl.device`` import no kernels; the runners (``GPUModelRunnerV1``,
``GPUModelRunnerV2``) are loaded on first access, after selecting the device
(``$BLOCKFUZZ_DEVICE``, default ``auto``; without CUDA Triton runs in
interpreter mode).  Call :func:`gpu_impl.device.select_device` first to pick one.
"""

from .device import select_device
from .faults import CATALOGUE, Fault, FaultSet

__all__ = ["CATALOGUE", "DEVICE", "Fault", "FaultSet", "GPUModelRunnerV1", "GPUModelRunnerV2",
           "select_device"]


def __getattr__(name):
    if name == "DEVICE":
        from .device import current_device

        return current_device()
    if name in ("GPUModelRunnerV1", "GPUModelRunnerV2"):
        from .device import current_device

        current_device()  # TRITON_INTERPRET must be set before triton is imported
        from .model_runner import GPUModelRunnerV1
        from .model_runner_v2 import GPUModelRunnerV2

        return {"GPUModelRunnerV1": GPUModelRunnerV1, "GPUModelRunnerV2": GPUModelRunnerV2}[name]
    raise AttributeError(f"module 'gpu_impl' has no attribute {name!r}")
