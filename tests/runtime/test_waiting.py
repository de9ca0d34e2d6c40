"""The waiting rows' cut against the plain definition: sort every waiting row by length (ties by arrival), cut the
sorted rows greedily under the budget from the shortest (a run's width: its longest row, up to the backend's width
multiple), and take the run that holds the oldest row."""

import math
import random

import pytest

from encoderrt.runtime.tokenizer import Tokens
from encoderrt.runtime.waiting import WaitingRows


def reference_cut(waiting: list[tuple[int, int]], budget: int, multiple: int = 1) -> list[tuple[int, int]]:
    """(arrival, length) pairs in arrival order -> the batch, sorted by length."""
    ordered = sorted(waiting, key=lambda row: row[1])
    oldest = waiting[0]
    runs, run = [], []
    for row in ordered:
        width = math.ceil(row[1] / multiple) * multiple
        if run and (len(run) + 1) * width > budget:
            runs.append(run)
            run = []
        run.append(row)
    runs.append(run)
    return next(run for run in runs if oldest in run)


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("multiple", [1, 16])
def test_every_cut_is_the_sorted_definitions(seed, multiple):
    rng = random.Random(seed)
    budget = rng.choice([16, 64, 100, 512, 2048])
    longest = rng.choice([4, 40, 300, 3000])  # rows longer than the budget run alone
    waiting_rows, reference, arrival = WaitingRows(multiple), [], 0
    while arrival < 400 or reference:
        for _ in range(rng.choice([0, 1, 3, 50]) if arrival < 400 else 0):  # new rows arrive between cuts
            length = rng.randint(1, longest)
            waiting_rows.add(Tokens([arrival] * length, [0] * length), arrival)
            reference.append((arrival, length))
            arrival += 1
        if not reference:
            continue
        expected = reference_cut(reference, budget, multiple)
        taken = waiting_rows.take(budget)
        assert [(row.key, len(row.tokens.ids)) for row in taken] == expected
        reference = [row for row in reference if row not in expected]
        assert len(waiting_rows) == len(reference)
    assert not waiting_rows.clear()


def test_identical_rows_wait_once_and_the_oldest_leads():
    rows = WaitingRows()
    first = rows.add(Tokens([1, 2, 3], [0, 0, 0]), "a")
    rows.add(Tokens([1, 2], [0, 0]), "b")
    assert rows.get("a") is first and rows.get("c") is None
    assert rows.oldest() is first
    assert [row.key for row in rows.take(4)] == ["a"]  # 2 rows x 3 tokens would pass 4
    assert rows.oldest().key == "b"


def test_rows_count_at_the_width_the_backend_pads_to():
    """Rows of 17-32 tokens run 32 wide on a backend that pads to multiples of 16: a 256-token budget holds 8 of
    them, whatever their own lengths, so full batches of one width have one shape."""
    plain, bucketed = WaitingRows(), WaitingRows(16)
    for index, length in enumerate([17, 20, 25, 30] * 4):
        for rows in (plain, bucketed):
            rows.add(Tokens([index] * length, [0] * length), index)
    assert [len(bucketed.take(256)) for _ in range(2)] == [8, 8]
    assert len(plain.take(256)) == 10  # 10 x 25 tokens; the backend would run them 10 x 32
