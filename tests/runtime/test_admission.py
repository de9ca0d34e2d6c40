"""Admission by queued seconds of work, counted by hand."""

import pytest

from encoderrt.runtime.admission import Admission
from encoderrt.runtime.errors import Overloaded


def test_work_is_refused_once_the_queue_holds_more_than_its_seconds():
    admission = Admission(max_items=1000, max_seconds=2.0, budget=512, tokens_per_second=1000.0)
    admission.check(queued_items=10, queued_tokens=2000, new_items=5)  # exactly 2 s queued: admitted
    with pytest.raises(Overloaded, match=r"2\.5 s of work.*2 s") as refused:
        admission.check(queued_items=10, queued_tokens=2500, new_items=5)
    assert refused.value.retry_after_s == 1  # 0.5 s over, rounded up to whole seconds
    with pytest.raises(Overloaded) as refused:
        admission.check(queued_items=10, queued_tokens=9600, new_items=5)
    assert refused.value.retry_after_s == 8  # 9.6 s queued, back under 2 s after 7.6


def test_an_empty_queue_admits_a_request_however_long_it_takes():
    admission = Admission(max_items=1000, max_seconds=1.0, budget=512, tokens_per_second=10.0)
    admission.check(queued_items=0, queued_tokens=0, new_items=900)


def test_the_item_limit_holds_whatever_the_rate():
    admission = Admission(max_items=10, max_seconds=60.0, budget=512, tokens_per_second=None)
    admission.check(queued_items=6, queued_tokens=60, new_items=4)
    with pytest.raises(Overloaded, match="queue is full"):
        admission.check(queued_items=6, queued_tokens=60, new_items=5)


def test_the_rate_is_what_a_busy_queue_drains_in_wall_time():
    admission = Admission(max_items=1000, max_seconds=1.0, budget=1000, tokens_per_second=None)
    assert admission.wait_seconds(5000) is None  # no estimate before a measurement: only the item limit applies
    admission.observe(real_tokens=900, padded_tokens=1000, finished_at=10.0, more_queued=True)
    assert admission.wait_seconds(5000) is None  # one completion is no interval
    admission.observe(real_tokens=900, padded_tokens=1000, finished_at=10.5, more_queued=True)
    assert admission.wait_seconds(1800) == pytest.approx(1.0)  # 900 tokens in the 0.5 s since the last batch
    admission.observe(real_tokens=20, padded_tokens=20, finished_at=10.6, more_queued=False)  # a lone short query
    admission.observe(real_tokens=900, padded_tokens=1000, finished_at=30.0, more_queued=True)  # after an idle spell
    assert admission.wait_seconds(1800) == pytest.approx(1.0)  # neither moved the rate
    admission.observe(real_tokens=900, padded_tokens=1000, finished_at=30.25, more_queued=True)  # twice as fast
    assert admission.wait_seconds(900) == pytest.approx((0.8 * 0.5 + 0.2 * 0.25) / 900 * 900)


def test_the_load_time_figure_is_the_rate_until_the_queue_says_otherwise():
    admission = Admission(max_items=1000, max_seconds=1.0, budget=1000, tokens_per_second=4000.0)
    assert admission.wait_seconds(2000) == pytest.approx(0.5)
