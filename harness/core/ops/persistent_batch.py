"""V1 persistent-batch ops: ``condense`` and ``swap``.

Modelled on ``InputBatch.condense`` / ``InputBatch.swap_states``
(``vllm/v1/worker/gpu_input_batch.py``) and the block table's ``move_row`` /
``swap_row`` (``vllm/v1/worker/block_table.py``): condense moves the last
live rows into the holes removal left; swap reorders two rows (as batch
reordering for attention backends does).  V2 has no persistent batch: its rows
are indexed by a request's stable state index, so these ops are V1 only.
"""

from __future__ import annotations

import numpy as np

from harness.core.ops import INT, OpSpec, register
from reference.block_table import EMPTY_ROW

register(OpSpec(
    name="condense", summary="move the last live rows into the holes (V1 persistent batch)",
    fields={}, example={"op": "condense"},
    apply=lambda t, op: t.condense(),
    draw=lambda m: {"op": "condense"}, draws_data=False,
    enabled=lambda m: m.cfg.runner == "v1", runners=("v1",), keeps_ledger=True))


def _occupied_rows(m) -> list[int]:
    return [int(i) for i, r in enumerate(m.session.reference.rows.req_ids) if r != EMPTY_ROW]


def _can_swap(m) -> bool:
    """Two rows hold requests (evaluated every step: ``reads_rows``; counted in
    NumPy, not walked row by row as the draw's list is)."""
    return m.cfg.runner == "v1" and np.count_nonzero(
        m.session.reference.rows.req_ids != EMPTY_ROW) >= 2


def _draw_swap(m, data) -> dict:
    i, j = data.unique_sample(_occupied_rows(m), 2, 2)
    return {"op": "swap", "i": i, "j": j}


register(OpSpec(
    name="swap", summary="swap two persistent-batch rows (V1 batch reordering)",
    fields={"i": INT, "j": INT}, example={"op": "swap", "i": 0, "j": 1},
    apply=lambda t, op: t.swap(op["i"], op["j"]),
    draw=_draw_swap, enabled=_can_swap,
    runners=("v1",), keeps_ledger=True, reads_rows=True))
