"""Writes that are valid in shape, under partial failure and races: every acknowledged write is stored, every
refused one changes nothing, and the reply says which is which. (The MCP batch's in test_bounds, the stores'
races in test_stores.)"""

from __future__ import annotations

import pytest

import solos_rank


def test_a_vector_index_keeps_the_newest_write_of_a_row_whatever_order_writers_report_in():
    # Two writes of one short key commit in order (generations 5, then 7) and then report their vectors to the
    # index in the other order, as their threads happen to run: the row's text is the second write's, so must be
    # its vector. The first's was kept, and recall ranked the new text by the old text's vector until a reload;
    # one reported after a snapshot that holds the newer one stayed over it until the generation moved again.
    np = pytest.importorskip("numpy")
    old, new = np.array([1.0, 0.0], dtype="<f4"), np.array([0.0, 1.0], dtype="<f4")
    index = solos_rank.VectorIndex("m", ["short"])
    index.add(None, "short", 1, "atlas", None, new, 7)
    index.add(None, "short", 1, "atlas", None, old, 5)
    assert index.snapshot("short")[1][1][2] is new
    index.generation = 9  # a snapshot at generation 9 holds the row as its write at 7 left it, or newer
    index.recent["short"].clear()
    index.add(None, "short", 1, "atlas", None, old, 8)
    assert index.snapshot("short")[1] == {}
