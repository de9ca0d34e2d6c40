"""int8 on text compile never saw: tables, code, repeated words, markup, lists, five more scripts, short queries
and 450-word passages, none of them a calibration text or a parity probe. all-MiniLM-L6-v2 int8 that compile had
verified at min cosine 0.991 once gave 0.977 on such text; the floor users are promised (min cosine 0.98, mean
0.995) must hold on it, on both CPU targets."""

import heldout_texts
import pytest

from artifact_runner import cosine_rows, run_artifact
from encoderrt.bench import workloads
from encoderrt.compile import parity
from encoderrt.runtime import texts as calibration

HELD_OUT = [*heldout_texts.TEXTS, *workloads.passages(3, seed=404, mean_words=450, max_words=600)]


def test_held_out_text_is_neither_calibration_nor_probe():
    probes = {*parity.PROBE_TEXTS, *parity.PROBE_QUERIES, parity.PROBE_PASSAGE}
    seen = set(calibration.calibration_texts()) | probes
    assert not seen & set(HELD_OUT)
    assert not set(calibration.calibration_texts()) & probes


@pytest.fixture(scope="module")
def reference(minilm_dir):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_dir), device="cpu").encode(HELD_OUT)


@pytest.mark.parametrize("target", ["cpu", "openvino"])
def test_minilm_int8_holds_the_floor_on_held_out_text(target, minilm_dir, reference, compile_artifact, tmp_path_factory):
    result = compile_artifact(minilm_dir, tmp_path_factory.mktemp("int8") / target, target=target, precision="int8")
    cosines = cosine_rows(run_artifact(result.path, texts=HELD_OUT), reference)
    worst = HELD_OUT[int(cosines.argmin())][:60]
    assert cosines.min() >= 0.98 and cosines.mean() >= 0.995, (cosines.min(), cosines.mean(), worst)
