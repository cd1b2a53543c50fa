"""reference/block_table.py: the fixed V1 row semantics, positive and negative space."""

import numpy as np

from reference import RunnerConfig
from reference.block_table import EMPTY_ROW, PersistentBatchRows


def _rows():
    rows = PersistentBatchRows(RunnerConfig())
    rows.add_row(0, 10, [[7, 8, 9], [3]], 0, 5)
    rows.add_row(1, 11, [[4, 5], [6]], 2, 2)
    return rows


def test_move_row_zeroes_vacated_row():
    """The stale-row fix (seed 000): after move_row the source row is all zero."""
    rows = _rows()
    rows.clear_row(0)
    rows.move_row(1, 0)
    assert rows.block_table[0][0, :2].tolist() == [4, 5]
    assert rows.num_blocks_per_row[0].tolist() == [2, 0, 0, 0]
    assert not rows.block_table[0][1].any() and not rows.block_table[1][1].any()
    assert rows.req_ids.tolist() == [11, EMPTY_ROW, EMPTY_ROW, EMPTY_ROW]
    assert rows.num_computed_tokens.tolist() == [2, 0, 0, 0]


def test_condense_makes_live_rows_contiguous_lowest_first():
    rows = PersistentBatchRows(RunnerConfig())
    for row, req in enumerate([1, 2, 3, 4]):
        rows.add_row(row, req, [[row + 1], [row + 5]], 0, 1)
    rows.clear_row(0)
    rows.clear_row(2)
    rows.condense()
    assert rows.req_ids.tolist() == [4, 2, EMPTY_ROW, EMPTY_ROW]
    assert rows.block_table[0][:, 0].tolist() == [4, 2, 0, 0]
    assert rows.num_blocks_per_row[1].tolist() == [1, 1, 0, 0]


def test_swap_row_swaps_everything_a_row_carries():
    rows = _rows()
    rows.swap_row(0, 1)
    assert rows.req_ids[:2].tolist() == [11, 10]
    assert rows.num_computed_tokens[:2].tolist() == [2, 0]
    assert rows.num_prompt_tokens[:2].tolist() == [2, 5]
    assert rows.block_table[0][1, :3].tolist() == [7, 8, 9]
    assert rows.num_blocks_per_row[0][:2].tolist() == [2, 3]


def test_clear_row_routes_to_null_block():
    rows = _rows()
    rows.clear_row(0)
    assert rows.row_of(10) is None and rows.lowest_free_row() == 0
    assert all(not np.any(t[0]) for t in rows.block_table)
