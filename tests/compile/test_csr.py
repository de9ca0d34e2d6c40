"""CSR sparse models (an embedding model's modules, then a SparseAutoEncoder), as sentence-transformers'
SparseEncoder saves them: the same latents and weights as SparseEncoder.encode (its k kept, or a request's top_k as
max_active_dims keeps them), and its similarity, on onnxruntime and OpenVINO."""

import json
import shutil

import numpy as np
import pytest

import tiny_models as tm
from encoderrt import Engine

TEXTS = ["sparse latents", "a lazy dog under the quick brown fox", "мир", "y", " ".join(["score rank"] * 70)]
VARIANTS = {
    "normalized": {},  # Transformer -> Pooling -> Normalize -> SparseAutoEncoder
    # a Dense module before it, no Normalize, and the autoencoder standardising its input itself
    "dense-standardised": {"dense": ((48, "Tanh"),), "normalize": False, "layer_norm": True, "hidden_dim": 160,
                           "k": 20},
}


@pytest.fixture(scope="module", params=list(VARIANTS))
def csr(request, tiny_dir):
    from sentence_transformers import SparseEncoder

    folder = tm.csr_folder(tiny_dir / f"csr-{request.param}", **VARIANTS[request.param])
    return folder, SparseEncoder(str(folder), device="cpu")


def _rows_match(rows, expected: np.ndarray) -> None:
    """The same non-zero latents as sentence-transformers' dense rows, their weights close, heaviest first."""
    assert len(rows) == len(expected)
    for row, reference in zip(rows, expected):
        ids, weights = [i for i, _ in row], [w for _, w in row]
        assert sorted(ids) == np.flatnonzero(reference > 0).tolist()
        np.testing.assert_allclose(weights, reference[ids], rtol=1e-4, atol=1e-6)
        assert weights == sorted(weights, reverse=True)


@pytest.mark.parametrize("target", ["cpu", "openvino"])
def test_latents_match_sparse_encoder(csr, target, compile_artifact, tmp_path):
    folder, reference = csr
    result = compile_artifact(folder, tmp_path / "artifact", target=target)
    manifest = result.manifest
    autoencoder = json.loads(next(folder.glob("*_SparseAutoEncoder/config.json")).read_text())
    assert manifest.task == "sparse" and manifest.shape.output_dim == autoencoder["hidden_dim"]
    assert manifest.max_active_dims == autoencoder["k"] and manifest.pooling == "mean"
    assert manifest.parity["reference"] == "sentence-transformers SparseEncoder.encode"
    expected = reference.encode(TEXTS, convert_to_tensor=True).to_dense().numpy()
    assert ((expected > 0).sum(axis=1) == autoencoder["k"]).all()  # about half the latents are positive: k of them
    with Engine.load(result.path) as engine:
        _rows_match(engine.embed_sparse(TEXTS), expected)
        _rows_match([engine.embed_sparse(text)[0] for text in TEXTS], expected)
        more = reference.encode(TEXTS, convert_to_tensor=True, max_active_dims=autoencoder["k"] + 7)
        _rows_match(engine.embed_sparse(TEXTS, top_k=autoencoder["k"] + 7), more.to_dense().numpy())
        query, documents = TEXTS[1], TEXTS
        scores = reference.similarity(reference.encode_query([query]), reference.encode_document(documents))
        np.testing.assert_allclose(engine.score(query, documents), scores.to_dense().numpy()[0], rtol=1e-4, atol=1e-6)


def test_layouts_it_does_not_compile_are_refused_by_name(csr, compile_artifact, tmp_path):
    """An autoencoder that is not last, or with no pooled embedding to read, or a TensorRT target: one line naming the
    problem, and nothing written."""
    from encoderrt.compile import CompileOptions, InputError, compile_model

    folder = shutil.copytree(csr[0], tmp_path / "reordered")
    modules = json.loads((folder / "modules.json").read_text())
    (folder / "modules.json").write_text(json.dumps([*modules[:1], modules[-1], *modules[1:-1]]))
    with pytest.raises(InputError, match="sentence-transformers module 'SparseAutoEncoder' .* is not supported"):
        compile_artifact(folder, tmp_path / "out")
    (folder / "modules.json").write_text(json.dumps([modules[0], modules[-1]]))
    with pytest.raises(InputError, match="has no Pooling module before its SparseAutoEncoder"):
        compile_artifact(folder, tmp_path / "out")
    (folder / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(InputError, match="the tensorrt target does not compile CSR sparse models"):
        compile_model(CompileOptions(model_dir=folder, output_dir=tmp_path / "out", target="tensorrt", quiet=True))
    assert not (tmp_path / "out").exists()


def test_compile_judges_the_weights_it_serves(csr, compile_artifact, tmp_path):
    """Compile's parity figure is that of the k heaviest latents, which is what is served and what encode returns:
    a small error near the cut moves latents across it, which every latent's cosine hides (bf16 on the normalised
    folder: 0.99997 over every latent, 0.956 served). So bf16 is refused where its served rows miss the tier, and
    where it is taken its recorded figure does not overstate what a user measures (on a CPU without native bf16 it
    runs fp32)."""
    from encoderrt.compile.errors import ParityError
    from encoderrt.compile.parity import artifact_tokenizer, probe_texts

    folder, reference = csr
    try:
        result = compile_artifact(folder, tmp_path / "bf16", target="openvino", precision="bf16")
    except ParityError as error:
        assert "'weights_kept': " in str(error) and "min cosine" in str(error), error
        return
    texts = probe_texts(artifact_tokenizer(result.manifest, result.path))
    expected = reference.encode(texts, convert_to_tensor=True).to_dense().numpy()
    with Engine.load(result.path) as engine:
        served = np.zeros_like(expected)
        for row, pairs in zip(served, engine.embed_sparse(texts)):
            for latent, weight in pairs:
                row[latent] = weight
    cosines = (served * expected).sum(1) / np.linalg.norm(served, axis=1) / np.linalg.norm(expected, axis=1)
    recorded = result.manifest.parity["min_cosine"]
    assert recorded <= cosines.min() + 5e-3, (recorded, cosines.min())  # batches of other shapes round otherwise
