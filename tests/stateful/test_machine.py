"""The state machine under the ``ci`` profile: the fixed implementation holds
every invariant over derandomized op sequences (reference vs gpu_impl).

Hypothesis's shrinker is off here (through the interpreter it takes minutes);
a failure prints the violation and the ops of the failing example, and
``blockfuzz fuzz`` turns the same bug into a shrunk trace in seconds.
"""

from hypothesis import Phase, settings

from harness.search.machine import make_machine
from reference import RunnerConfig

NO_SHRINK = [Phase.explicit, Phase.reuse, Phase.generate]

FixedV1 = make_machine(RunnerConfig(), faults=())
TestFixedV1 = FixedV1.TestCase
TestFixedV1.settings = settings(settings.default, phases=NO_SHRINK, max_examples=40)

# The oracle against itself: catches harness bugs (legality, observation) cheaply.
ReferenceSelfCheck = make_machine(RunnerConfig(), target="reference")
TestReferenceSelfCheck = ReferenceSelfCheck.TestCase
TestReferenceSelfCheck.settings = settings(settings.default, phases=NO_SHRINK, max_examples=60)

# A second geometry: one block per request at most, a single capture size.
NarrowConfig = RunnerConfig(num_blocks=6, max_num_reqs=2, max_num_blocks_per_req=2,
                            max_num_batched_tokens=8, cudagraph_capture_sizes=(2,))
TestFixedNarrow = make_machine(NarrowConfig).TestCase
TestFixedNarrow.settings = settings(settings.default, phases=NO_SHRINK, max_examples=25)

# Fixed V2 runner, geometry drawn per example (groups, kernel block sizes, limits).
TestFixedV2Geometry = make_machine(None, runner="v2").TestCase
TestFixedV2Geometry.settings = settings(settings.default, phases=NO_SHRINK, max_examples=40)

# Fixed V1 runner, geometry drawn per example.
TestFixedV1Geometry = make_machine(None, runner="v1").TestCase
TestFixedV1Geometry.settings = settings(settings.default, phases=NO_SHRINK, max_examples=40)
