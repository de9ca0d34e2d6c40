import json
import shutil

import pytest

from encoderrt.runtime.manifest import SCHEMA_VERSION, ManifestError, read_manifest


def _copy(artifact, tmp_path):
    return shutil.copytree(artifact, tmp_path / "artifact")


def test_reads_compiled_manifest(tiny_artifacts):
    manifest = read_manifest(tiny_artifacts["bert-cross-encoder"])
    assert manifest.task == "score" and manifest.schema_version == SCHEMA_VERSION == 2


def test_the_manifest_lists_the_fields_it_sets_that_a_reader_must_know(tiny_artifacts):
    """A one-label cross-encoder reports sigmoid(logit): a reader that skipped `activation` would serve raw logits.
    What only records how the artifact was made (its parity, the versions that made it) is not listed."""
    data = json.loads((tiny_artifacts["bert-cross-encoder"] / "manifest.json").read_text())
    assert data["activation"] == "sigmoid" and "activation" in data["requires"]
    assert "files" in data["requires"] and data["parity"] and data["versions"]
    assert not {"parity", "versions", "source", "selection", "fused_ops", "prompts"} & set(data["requires"])
    assert all(data[name] not in (None, False, [], {}) for name in data["requires"])


def test_altered_file_is_refused(tiny_artifacts, tmp_path):
    artifact = _copy(tiny_artifacts["bert-cross-encoder"], tmp_path)
    with open(artifact / "model.onnx", "ab") as handle:
        handle.write(b"\0")
    with pytest.raises(ManifestError, match="model.onnx does not match its sha256"):
        read_manifest(artifact)


def test_missing_file_is_refused(tiny_artifacts, tmp_path):
    artifact = _copy(tiny_artifacts["bert-cross-encoder"], tmp_path)
    (artifact / "tokenizer.json").unlink()
    with pytest.raises(ManifestError, match="tokenizer.json is missing"):
        read_manifest(artifact)


def test_unknown_schema_version_is_refused(tiny_artifacts, tmp_path):
    artifact = _copy(tiny_artifacts["bert-cross-encoder"], tmp_path)
    data = json.loads((artifact / "manifest.json").read_text())
    data["schema_version"] = 99
    (artifact / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ManifestError, match="schema_version 99"):
        read_manifest(artifact)


def test_a_field_this_encoderrt_does_not_know_is_refused_by_name_where_the_artifact_needs_it(tiny_artifacts,
                                                                                             tmp_path):
    """An artifact compiled by a newer encoderrt with a rule this one does not know (here a made-up one) is refused,
    naming the rule, instead of being served without it; one it only records is read."""
    artifact = _copy(tiny_artifacts["bert-cross-encoder"], tmp_path)
    _edit(artifact, lambda data: data.update(compiled_on="a newer machine"))
    assert read_manifest(artifact).task == "score"
    _edit(artifact, lambda data: data.update(query_rule={"lowercase": True},
                                             requires=[*data["requires"], "query_rule"]))
    with pytest.raises(ManifestError, match=r"fields this encoderrt does not know \(query_rule\).*upgrade encoderrt"):
        read_manifest(artifact)
    _edit(artifact, lambda data: (data.update(requires=[name for name in data["requires"] if name != "query_rule"]),
                                  data["shape"].update(attention_window=16)))  # a rule inside a field it requires
    with pytest.raises(ManifestError, match="manifest shape holds attention_window, which this encoderrt does not"):
        read_manifest(artifact)
    _edit(artifact, lambda data: data.update(requires="query_rule"))
    with pytest.raises(ManifestError, match="requires 'query_rule' is not a list of field names"):
        read_manifest(artifact)


def test_a_manifest_of_version_1_still_reads(tiny_artifacts, tmp_path):
    """Artifacts compiled before `requires` came (version 1) load as they did: no recompiling after an upgrade."""
    artifact = _copy(tiny_artifacts["bert-cross-encoder"], tmp_path)
    _edit(artifact, lambda data: (data.pop("requires"), data.update(schema_version=1)))
    manifest = read_manifest(artifact)
    assert manifest.schema_version == 1 and manifest.activation == "sigmoid"


def test_not_an_artifact(tmp_path):
    with pytest.raises(ManifestError, match="no manifest.json"):
        read_manifest(tmp_path)
    with pytest.raises(ManifestError, match="not found"):
        read_manifest(tmp_path / "missing")


def _edit(artifact, change):
    data = json.loads((artifact / "manifest.json").read_text())
    change(data)
    (artifact / "manifest.json").write_text(json.dumps(data))


def test_a_tampered_model_whose_entry_was_removed_is_refused(tiny_artifacts, tmp_path):
    artifact = _copy(tiny_artifacts["bert-cross-encoder"], tmp_path)
    with open(artifact / "model.onnx", "ab") as handle:
        handle.write(b"\0")
    _edit(artifact, lambda data: data["files"].pop("model.onnx"))
    with pytest.raises(ManifestError, match="does not hash its model file model.onnx"):
        read_manifest(artifact)


def test_an_unhashed_file_in_the_folder_is_refused(tiny_artifacts, tmp_path):
    artifact = _copy(tiny_artifacts["bert-cross-encoder"], tmp_path)
    (artifact / "extra.onnx.data").write_bytes(b"weights nobody hashed")
    with pytest.raises(ManifestError, match="extra.onnx.data is not hashed by the manifest"):
        read_manifest(artifact)


def test_the_weights_beside_the_graph_are_hashed(tiny_artifacts, tmp_path):
    """onnxruntime artifacts keep their weights in model.onnx.data, which the runtime maps: a changed byte there is
    a changed model."""
    artifact = _copy(tiny_artifacts["bert-cross-encoder"], tmp_path)
    weights = artifact / "model.onnx.data"
    assert "model.onnx.data" in read_manifest(artifact).files
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(ManifestError, match="model.onnx.data does not match its sha256"):
        read_manifest(artifact)


@pytest.mark.parametrize("name", ["../../../../etc/passwd", "/etc/passwd", "sub/../../outside.onnx"])
def test_names_that_leave_the_artifact_are_refused(tiny_artifacts, tmp_path, name):
    artifact = _copy(tiny_artifacts["bert-cross-encoder"], tmp_path)
    _edit(artifact, lambda data: data["files"].update({name: "0" * 64}))
    with pytest.raises(ManifestError, match="leaves the artifact folder"):
        read_manifest(artifact)
    _edit(artifact, lambda data: (data["files"].pop(name), data.update(model_file=name)))
    with pytest.raises(ManifestError, match="leaves the artifact folder"):
        read_manifest(artifact)


def test_a_symlink_out_of_the_artifact_is_refused(tiny_artifacts, tmp_path):
    artifact = _copy(tiny_artifacts["bert-cross-encoder"], tmp_path)
    outside = tmp_path / "elsewhere.onnx"
    shutil.move(artifact / "model.onnx", outside)
    (artifact / "model.onnx").symlink_to(outside)
    with pytest.raises(ManifestError, match="'model.onnx' leaves the artifact folder"):
        read_manifest(artifact)


def test_manifest_facts_are_checked_against_the_graph(tiny_artifacts, tmp_path):
    from encoderrt import Engine

    artifact = _copy(tiny_artifacts["st-cls"], tmp_path)
    _edit(artifact, lambda data: data.update(max_length=100_000))
    with pytest.raises(ManifestError, match="cannot run the manifest's max_length of 100000 tokens"):
        Engine.load(artifact, max_batch_tokens=256)
    _edit(artifact, lambda data: (data.update(max_length=32), data["shape"].update(output_dim=7)))
    with pytest.raises(ManifestError, match="output has width 32, the manifest says 7"):
        Engine.load(artifact, max_batch_tokens=256)


def test_an_artifact_with_its_weights_inside_the_graph_still_serves(tiny_artifacts, tmp_path):
    """Artifacts compiled before the weights moved beside the graph hold them inside it; they load as they did and
    score the same."""
    import onnx

    from encoderrt import Engine
    from encoderrt.runtime.manifest import sha256_file

    compiled = tiny_artifacts["bert-cross-encoder"]
    artifact = _copy(compiled, tmp_path)
    onnx.save_model(onnx.load(str(artifact / "model.onnx")), str(artifact / "model.onnx"))
    (artifact / "model.onnx.data").unlink()
    _edit(artifact, lambda data: (data["files"].pop("model.onnx.data"),
                                  data["files"].update({"model.onnx": sha256_file(artifact / "model.onnx")})))
    documents = ["Rivers form when water flows downhill.", "b" * 40]
    with Engine.load(artifact) as inside, Engine.load(compiled) as beside:
        assert inside.score("how do rivers form", documents) == beside.score("how do rivers form", documents)
