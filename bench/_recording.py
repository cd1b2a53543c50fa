"""Bench helper: the fuzz machine, recording the ops of every example.

The benches replay the recorded workload through each layer alone; recording
is injected here (a subclass), so production code has no bench branch.
"""

from __future__ import annotations


def recording_machine() -> type:
    """A :class:`harness.search.machine.BlockFuzzMachine` subclass whose teardown
    appends the example's ops to ``stats["traces"]`` (a list the caller puts in
    the stats dict it passes to ``make_machine``), then does what the machine's
    own does (coverage per example, steering), so the loop timed is the search's."""
    from harness.search.machine import BlockFuzzMachine

    class Recording(BlockFuzzMachine):
        def teardown(self):
            self.stats["traces"].append(list(self.ops))
            super().teardown()

    return Recording
