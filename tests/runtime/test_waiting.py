"""The waiting rows' cut against the plain definition: sort every waiting row by length (ties by arrival), cut the
sorted rows greedily under the budget from the shortest, and take the run that holds the oldest row."""

import random

import pytest

from encoderrt.runtime.tokenizer import Tokens
from encoderrt.runtime.waiting import WaitingRows


def reference_cut(waiting: list[tuple[int, int]], budget: int) -> list[tuple[int, int]]:
    """(arrival, length) pairs in arrival order -> the batch, sorted by length."""
    ordered = sorted(waiting, key=lambda row: row[1])
    oldest = waiting[0]
    runs, run = [], []
    for row in ordered:
        if run and (len(run) + 1) * row[1] > budget:
            runs.append(run)
            run = []
        run.append(row)
    runs.append(run)
    return next(run for run in runs if oldest in run)


@pytest.mark.parametrize("seed", range(40))
def test_every_cut_is_the_sorted_definitions(seed):
    rng = random.Random(seed)
    budget = rng.choice([16, 64, 100, 512, 2048])
    longest = rng.choice([4, 40, 300, 3000])  # rows longer than the budget run alone
    waiting_rows, reference, arrival = WaitingRows(), [], 0
    while arrival < 400 or reference:
        for _ in range(rng.choice([0, 1, 3, 50]) if arrival < 400 else 0):  # new rows arrive between cuts
            length = rng.randint(1, longest)
            waiting_rows.add(Tokens([arrival] * length, [0] * length), arrival)
            reference.append((arrival, length))
            arrival += 1
        if not reference:
            continue
        expected = reference_cut(reference, budget)
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
