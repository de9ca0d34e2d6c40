"""A serving process's start-up heap is moved out of the cyclic collector's scans, and garbage made after it still
goes."""

import gc
import weakref

import pytest

from encoderrt import Engine
from encoderrt.runtime.heap import SERVING_GEN0_THRESHOLD, freeze_startup_heap


@pytest.fixture
def thawed():
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()  # the test's process is pytest's, not a server's: give its objects back to the collector
    gc.set_threshold(*threshold)


@pytest.fixture
def collections():
    """The generations of the collections that start while the test runs."""
    started: list[int] = []

    def count(phase, info):
        if phase == "start":
            started.append(info["generation"])

    gc.callbacks.append(count)
    yield started
    gc.callbacks.remove(count)


def _requests_in_flight(rounds: int = 20, objects: int = 2_000) -> None:
    """What requests in flight do to the collector's count: thousands of tracked objects made, then freed by
    reference counting, none in a cycle."""
    for _ in range(rounds):
        in_flight = [[index] for index in range(objects)]
        del in_flight


class _Node:
    pass


def test_freezing_takes_a_loaded_engine_out_of_every_collection_and_leaves_later_garbage_collectable(minilm_fp32, thawed):
    with Engine.load(minilm_fp32.path, max_batch_tokens=512) as engine:
        scanned_before = len(gc.get_objects())  # every object a full collection walks
        frozen = freeze_startup_heap()
        scanned_after = len(gc.get_objects())
        assert frozen >= scanned_before * 0.9  # (frozen objects still die by reference counting: no equality later)
        assert scanned_after < scanned_before / 20

        # a request's cyclic garbage, made after the freeze, is still found and freed
        first, second = _Node(), _Node()
        first.other, second.other = second, first
        gone = weakref.ref(first)
        del first, second
        gc.collect()
        assert gone() is None
        assert engine.embed(["still serving"]).shape == (1, 384)


def test_a_serving_process_leaves_requests_garbage_without_cycles_alone_and_still_frees_a_cycle(thawed, collections):
    gc.set_threshold(700, 10, 10)  # Python's own (a server loaded earlier in this process raised it; thawed restores)
    gc.collect()
    collections.clear()
    _requests_in_flight()
    assert len(collections) >= 20  # Python's own threshold: a young collection in every round

    freeze_startup_heap()
    collections.clear()
    _requests_in_flight()
    assert collections == []

    first, second = _Node(), _Node()
    first.other, second.other = second, first
    gone = weakref.ref(first)
    del first, second
    young = [[index] for index in range(SERVING_GEN0_THRESHOLD + 100)]  # the young generation fills up
    assert collections and gone() is None  # and its collection frees the cycle, with no gc.collect() of ours
    del young
