"""blockfuzz gpu_impl: the implementation under test, written as an engine writes
it (torch + Triton kernels + CUDA graphs), with switchable faults.

Importing this package selects the device (``$BLOCKFUZZ_DEVICE``, default
``auto``) and, without CUDA, switches Triton to interpreter mode before Triton
is imported.  Set the device first with :func:`gpu_impl.device.select_device`
if you need a specific one.
"""

from .device import select_device

DEVICE = select_device()

from .faults import CATALOGUE, Fault, FaultSet  # noqa: E402
from .model_runner import GPUModelRunnerV1  # noqa: E402
from .model_runner_v2 import GPUModelRunnerV2  # noqa: E402

__all__ = ["CATALOGUE", "DEVICE", "Fault", "FaultSet", "GPUModelRunnerV1", "GPUModelRunnerV2",
           "select_device"]
