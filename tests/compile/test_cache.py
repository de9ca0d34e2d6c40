"""The compile cache: keyed by content (never a name), listed and cleared by `encoderrt cache`."""

import os
import shutil
import subprocess
import sys

import pytest

from encoderrt.cli import main
from encoderrt.compile.cache import artifact_for, content_key
from encoderrt.runtime.manifest import read_manifest


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("ENCODERRT_CACHE", str(root))
    return root


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _bytes(folder) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(folder) for f in files)


def test_same_content_under_another_name_is_one_artifact(cache, tiny_models, tmp_path):
    renamed = shutil.copytree(tiny_models["st-cls"], tmp_path / "my-embedder")
    first, name = artifact_for(tiny_models["st-cls"])
    again, renamed_name = artifact_for(renamed)
    assert again == first and first.parent == cache and first.name == content_key(renamed)
    assert (name, renamed_name) == ("st-cls", "my-embedder")
    assert read_manifest(first).source["name"] == "st-cls"
    (renamed / "config.json").write_text((renamed / "config.json").read_text().replace("}", ', "note": 1}', 1))
    assert content_key(renamed) != first.name  # a changed config is another model


def test_a_folder_compiled_at_another_precision_is_another_artifact(cache, tiny_models):
    auto, _ = artifact_for(tiny_models["st-cls"])
    int8, _ = artifact_for(tiny_models["st-cls"], precision="int8")
    assert int8 != auto and int8.name == content_key(tiny_models["st-cls"], "int8")
    assert content_key(tiny_models["st-cls"], "int8") != content_key(tiny_models["st-cls"])
    assert read_manifest(int8).precision == "int8" and read_manifest(auto).precision in ("fp32", "bf16")
    assert artifact_for(tiny_models["st-cls"], precision="int8")[0] == int8  # compiled once
    assert sorted(p.name for p in cache.iterdir()) == sorted([auto.name, int8.name])


def test_cache_list_and_clear(cache, tiny_models, capsys):
    embedder, _ = artifact_for(tiny_models["st-cls"])
    reranker, _ = artifact_for(tiny_models["bert-cross-encoder"])
    dead = cache / f".{embedder.name}.partial-{_dead_pid()}-x1"
    live = cache / f".{embedder.name}.partial-{os.getpid()}-x2"  # a compile under way in a live process
    for leftover in (dead, live):
        leftover.mkdir()
        (leftover / "model.onnx").write_bytes(b"0" * 1000)

    assert main(["cache", "list"]) == 0
    listing = capsys.readouterr().out.splitlines()
    assert listing[0] == f"cache {cache}: 2 artifacts, {(_bytes(embedder) + _bytes(reranker)) / 1e6:.1f} MB"
    rows = {line.split()[0]: line.split() for line in listing[1:]}
    assert rows[embedder.name][1] == "st-cls" and rows[reranker.name][1] == "bert-ce"
    assert "score," in rows[reranker.name] and "embed," in rows[embedder.name]

    assert main(["cache", "clear", "no-such-model"]) == 2
    assert "not in the cache: no-such-model" in capsys.readouterr().err
    reranker_bytes = _bytes(reranker)
    assert main(["cache", "clear", "bert-ce"]) == 0
    assert capsys.readouterr().out.strip() == f"removed 1 artifacts, {reranker_bytes / 1e6:.1f} MB reclaimed"
    assert not reranker.exists() and embedder.exists() and dead.exists()

    expected = _bytes(embedder) + 1000
    assert main(["cache", "clear"]) == 0
    assert capsys.readouterr().out.strip() == f"removed 1 artifacts, {expected / 1e6:.1f} MB reclaimed"
    assert sorted(p.name for p in cache.iterdir()) == [live.name]  # the live compile's folder is left alone


def test_finding_a_cached_artifact_loads_no_openvino(tiny_models):
    """A restart that finds its artifact (onnxruntime's, here) keys the cache by the CPU's bf16 instructions from its
    flags, which say what OpenVINO's own capability says, without OpenVINO's 40 MB and its import."""
    from encoderrt.runtime.backends.openvino import native_bf16
    from encoderrt.runtime.cpu import bf16_instructions

    assert bf16_instructions() == native_bf16()
    check = ("import sys; from encoderrt.compile.cache import content_key; "
             f"content_key(__import__('pathlib').Path({str(tiny_models['st-cls'])!r})); "
             "print('openvino' in sys.modules)")
    loaded = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, check=True, timeout=120)
    assert loaded.stdout.strip() == "False"
