import json
import shutil

import pytest

from encoderrt.runtime.manifest import ManifestError, read_manifest


def _copy(artifact, tmp_path):
    return shutil.copytree(artifact, tmp_path / "artifact")


def test_reads_compiled_manifest(tiny_artifacts):
    manifest = read_manifest(tiny_artifacts["bert-cross-encoder"])
    assert manifest.task == "score" and manifest.schema_version == 1


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


def test_not_an_artifact(tmp_path):
    with pytest.raises(ManifestError, match="no manifest.json"):
        read_manifest(tmp_path)
    with pytest.raises(ManifestError, match="not found"):
        read_manifest(tmp_path / "missing")
