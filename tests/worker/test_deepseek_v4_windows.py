"""The compression windows a DeepSeek-V4 step closes, exactly, for a step of three
sequences at once: a chunk across a window boundary, a decode closing window 0 (no window
before it), and a prefix hit's replayed tokens (whose window is the prefix's); each
window's entry id from the page table (page size 1: the closing token's slot) or from the
request row's entry table."""

import pytest
import torch

from runtime.worker.models.deepseek_v4_arch import DeepseekV4Arch
from runtime.worker.models.deepseek_v4_entries import EntryStore
from runtime.worker.models.deepseek_v4_partial import InputRing
from runtime.worker.models.deepseek_v4_state import V4Step
from runtime.worker.models.deepseek_v4_windows import closing_of
from tests.worker.dsv4_checkpoints import tiny_v4_config


def store(table: bool) -> EntryStore:
    """Entry pools of the tiny model (rates 4, 8) over 200 slots and 3 request rows; in
    the table scheme, window w of row r has id 100 + 10 * r + w."""
    arch = DeepseekV4Arch.from_hf(tiny_v4_config())
    entries = EntryStore(arch, 3, 64, table, torch.float32, "cpu")
    entries.allocate(200, 1)
    if table:
        entries.write([(m, r, 0, [100 + 10 * r + w for w in range(8)])
                       for m in (4, 8) for r in range(3)])
    return entries


@pytest.mark.parametrize("table", [False, True])
def test_closing_lists_of_a_step(table):
    # (row, p0, p1, start): positions 5..9 on row 2; 3 on row 0; a hit replaying 4..8 on row 1
    seqs = [(2, 5, 10, 0), (0, 3, 4, 0), (1, 4, 9, 4)]
    per_token = [(b, *s) for b, s in enumerate(seqs) for _ in range(s[2] - s[1])]
    b, rows, p0, p1, start = (torch.tensor(v) for v in zip(*per_token))
    positions = torch.cat([torch.arange(s[1], s[2]) for s in seqs])
    T = positions.shape[0]  # 11
    step = V4Step(positions, (b, None, None, 1), rows, p0, p1, start, 100 + torch.arange(T),
                  torch.empty(T, 0), len(seqs), store(table), 10)
    ring = InputRing(3, 8, 2, torch.float32, "cpu")  # CSA rate 4: 8 positions a row
    closing = closing_of(step, 4, True, ring)
    assert closing_of(step, 4, True, ring) is closing  # built once a step
    # bound min(11, 11 // 4 + 3) = 5 rows: position 7 of seq 0 closes window 1 (ring cells
    # 16..20 of row 2 for positions 0..4, then its new tokens 0..2), position 3 of seq 1
    # window 0 (nothing before position 0, ring cells 0..2, itself); the replayed
    # position 7 of seq 2 closes the prefix's window 1: nothing; then padding
    assert closing.sources.tolist() == [
        [T + 16, T + 17, T + 18, T + 19, T + 20, 0, 1, 2],
        [-1, -1, -1, -1, T + 0, T + 1, T + 2, 5],
    ] + [[-1] * 8] * 3
    assert closing.series.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert closing.starts[:2].tolist() == [4, 0]
    # the ids: slots 102 and 105 (page size 1), or window 1 of row 2 and window 0 of row 0
    assert closing.ids.tolist() == ([121, 100] if table else [102, 105]) + [0, 0, 0]
    # every sequence is within the ring's 8 positions: row * 8 + position % 8
    assert closing.cells.tolist() == [21, 22, 23, 16, 17, 3, 12, 13, 14, 15, 8]


def test_inputs_before_the_last_ring_positions_go_to_the_sink():
    # HCA rate 4, one sequence at positions 0..9 on row 1: windows 0 and 1 close, and the
    # inputs of its last 4 positions (6..9: the ring's length) are kept, at row * 4 +
    # position % 4; the others go to the sink, 3 * 4
    positions = torch.arange(10)
    ones = torch.ones(10, dtype=torch.int64)
    step = V4Step(positions, (0 * ones, None, None, 1), ones, 0 * ones, 10 * ones, 0 * ones,
                  positions + 50, torch.empty(10, 0), 1, store(False), 10)
    ring = InputRing(3, 4, 2, torch.float32, "cpu")
    closing = closing_of(step, 4, False, ring)
    assert closing.sources.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7], [-1] * 4]
    assert closing.ids.tolist() == [53, 57, 0]
    assert closing.cells.tolist() == [12] * 6 + [6, 7, 4, 5]
