"""Admission by queued seconds of work, counted by hand."""

import pytest

from encoderrt.runtime.admission import Admission
from encoderrt.runtime.errors import Overloaded


def test_work_is_refused_once_the_queue_holds_more_than_its_seconds():
    admission = Admission(max_items=1000, max_seconds=2.0, budget=512, workers=1, tokens_per_second=1000.0)
    admission.check(queued_items=10, queued_tokens=2000, new_items=5)  # exactly 2 s queued: admitted
    with pytest.raises(Overloaded, match=r"2\.5 s of work.*2 s") as refused:
        admission.check(queued_items=10, queued_tokens=2500, new_items=5)
    assert refused.value.retry_after_s == 1  # 0.5 s over, rounded up to whole seconds
    with pytest.raises(Overloaded) as refused:
        admission.check(queued_items=10, queued_tokens=9600, new_items=5)
    assert refused.value.retry_after_s == 8  # 9.6 s queued, back under 2 s after 7.6


def test_an_empty_queue_admits_a_request_however_long_it_takes():
    admission = Admission(max_items=1000, max_seconds=1.0, budget=512, workers=1, tokens_per_second=10.0)
    admission.check(queued_items=0, queued_tokens=0, new_items=900)


def test_the_item_limit_holds_whatever_the_rate():
    admission = Admission(max_items=10, max_seconds=60.0, budget=512, workers=1, tokens_per_second=None)
    admission.check(queued_items=6, queued_tokens=60, new_items=4)
    with pytest.raises(Overloaded, match="queue is full"):
        admission.check(queued_items=6, queued_tokens=60, new_items=5)


def test_only_full_batches_move_the_rate():
    admission = Admission(max_items=1000, max_seconds=1.0, budget=1000, workers=2, tokens_per_second=None)
    assert admission.wait_seconds(5000) is None  # no estimate before a measurement: only the item limit applies
    admission.observe(real_tokens=20, padded_tokens=20, seconds=0.01)  # a lone short query: fixed cost
    assert admission.wait_seconds(5000) is None
    admission.observe(real_tokens=900, padded_tokens=1000, seconds=0.5)  # 1800 tokens/s per worker, two workers
    assert admission.wait_seconds(3600) == pytest.approx(1.0)
    admission.observe(real_tokens=900, padded_tokens=1000, seconds=0.25)  # twice as fast: the estimate follows
    assert admission.wait_seconds(3600) == pytest.approx(3600 / (0.8 * 3600 + 0.2 * 7200))
