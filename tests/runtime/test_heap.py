"""A serving process's start-up heap is moved out of the cyclic collector's scans, and garbage made after it still
goes."""

import gc
import weakref

import pytest

from encoderrt import Engine
from encoderrt.runtime.heap import freeze_startup_heap


@pytest.fixture
def thawed():
    yield
    gc.unfreeze()  # the test's process is pytest's, not a server's: give its objects back to the collector


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
