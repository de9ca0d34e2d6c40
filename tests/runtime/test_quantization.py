"""Quantised embeddings against sentence-transformers' quantize_embeddings, the definition users compare with."""

import asyncio

import numpy as np
import pytest
from sentence_transformers.util.quantization import quantize_embeddings

from encoderrt import Engine
from encoderrt.runtime import InvalidRequest
from encoderrt.runtime.quantization import quantize, ranges_of
from encoderrt.runtime.texts import calibration_texts

TEXTS = ["the quick brown fox", "a river runs through it", "café 東京", "x"]


@pytest.fixture(scope="module")
def engine(tiny_artifacts):
    with Engine.load(tiny_artifacts["st-cls"], max_batch_tokens=512) as engine:
        yield engine


@pytest.mark.parametrize("precision", ["int8", "uint8", "binary", "ubinary"])
def test_engine_precisions_match_sentence_transformers(tiny_artifacts, precision):
    with Engine.load(tiny_artifacts["st-cls"], max_batch_tokens=512) as engine:  # uncalibrated: the first use calibrates
        floats = engine.embed(TEXTS)
        calibration = engine.embed(calibration_texts())
        expected = quantize_embeddings(floats, precision=precision, calibration_embeddings=calibration)
        # the async verb first, so that int8 and uint8 calibrate inside it, off the event loop
        from_async = asyncio.run(engine.aembed(TEXTS, precision=precision))
        got = engine.embed(TEXTS, precision=precision)
    assert got.dtype == expected.dtype == from_async.dtype
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(from_async, expected)


def test_an_unknown_precision_names_the_known_ones(engine):
    with pytest.raises(InvalidRequest, match="precision must be one of float32, int8, uint8, binary, ubinary; got 'int4'"):
        engine.embed(TEXTS, precision="int4")


def test_values_beyond_the_calibrated_range_clip_and_ranges_are_kept(engine):
    rng = np.random.default_rng(0)
    calibration = rng.normal(size=(50, 16)).astype(np.float32)
    wide = rng.normal(scale=3, size=(20, 16)).astype(np.float32)  # many values outside the calibration's range
    ranges = ranges_of(calibration)
    for precision in ("int8", "uint8"):
        np.testing.assert_array_equal(quantize(wide, precision, ranges),
                                      quantize_embeddings(wide, precision=precision, ranges=ranges))
    assert quantize(wide, "int8", ranges).min() == -128 and quantize(wide, "int8", ranges).max() == 127
    first = engine.quantizer.ranges()
    assert engine.quantizer.ranges() is first  # calibrated once per (normalize, dimensions)
    assert engine.quantizer.ranges(dimensions=8).shape == (2, 8)
    with pytest.raises(ValueError, match="unknown embedding precision 'int4'"):
        quantize(wide, "int4")
