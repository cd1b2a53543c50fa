"""reference/dcp.py and the DCP layout in both implementations."""

import numpy as np
import pytest

from harness.targets import GpuImplTarget, ReferenceTarget
from reference import GroupSpec, RunnerConfig
from reference.dcp import global_position, local_slots


@pytest.mark.parametrize("world, interleave", [(1, 1), (2, 1), (2, 2), (4, 1), (4, 4)])
def test_every_position_has_exactly_one_owner_and_round_trips(world, interleave):
    bs = 8
    pos = np.arange(4 * bs * world)
    owners = np.zeros(pos.size, int)
    for rank in range(world):
        local, col, off = local_slots(pos, bs, world, rank, interleave)
        owners += local
        assert ((off >= 0) & (off < bs)).all()
        assert np.array_equal(global_position(col[local], off[local], bs, world, rank,
                                              interleave), pos[local])
        # a rank's cells are packed: each (column, offset) used once
        assert len(set(zip(col[local].tolist(), off[local].tolist()))) == int(local.sum())
    assert (owners == 1).all()


def test_slot_mapping_pads_other_ranks_tokens_in_both_implementations():
    config = RunnerConfig(groups=(GroupSpec("attention", 4, 2), GroupSpec("mamba", 16, 16)),
                          dcp_world_size=2, dcp_rank=1, cp_kv_cache_interleave_size=2)
    seen = []
    for target in (ReferenceTarget(config), GpuImplTarget(config, ())):
        target.add(0, [[1, 2], [3]], 12)
        target.step([[0, 12]], "NONE")
        seen.append(target.observe().slot_mapping[0][:12].tolist())
    assert seen[0] == seen[1] == [-1, -1, 4, 5, -1, -1, 6, 7, -1, -1, 8, 9]
