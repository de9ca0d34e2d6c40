"""Bad input: one clear line, the right exit code, and nothing written."""

import json
import os
import shutil
import stat
import subprocess

import pytest

from encoderrt.cli import compile_model_main
from encoderrt.compile import CompileOptions, FusionError, ParityError, compile_model
from encoderrt.compile.optimize import check_fusion


def _compile_cli(capsys, *argv):
    code = compile_model_main([str(a) for a in argv] + ["--quiet"])
    return code, capsys.readouterr().err


def _leftovers(folder):
    return sorted(p.name for p in folder.iterdir())


def test_missing_folder(tmp_path, capsys):
    code, err = _compile_cli(capsys, tmp_path / "nope", "--output", tmp_path / "out")
    assert code == 2 and "model folder not found" in err and "nope" in err
    assert _leftovers(tmp_path) == []


def test_folder_without_config(tmp_path, capsys):
    (tmp_path / "model").mkdir()
    code, err = _compile_cli(capsys, tmp_path / "model", "--output", tmp_path / "out")
    assert code == 2 and "no config.json" in err
    assert _leftovers(tmp_path) == ["model"]


def test_unknown_architecture(tmp_path, capsys):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    code, err = _compile_cli(capsys, tmp_path / "model", "--output", tmp_path / "out")
    assert code == 2 and "unsupported architecture" in err and "gpt2" in err
    assert "bert" in err and "roberta" in err and "xlm-roberta" in err  # names what is supported
    assert "Traceback" not in err


def test_missing_weights(tiny_models, tmp_path, capsys):
    model = tmp_path / "model"
    shutil.copytree(tiny_models["bert-cross-encoder"], model)
    (model / "model.safetensors").unlink()
    code, err = _compile_cli(capsys, model, "--output", tmp_path / "out")
    assert code == 2 and "no weights" in err and "model.safetensors" in err
    assert not (tmp_path / "out").exists()


def test_corrupt_weights(tiny_models, tmp_path, capsys):
    model = tmp_path / "model"
    shutil.copytree(tiny_models["bert-cross-encoder"], model)
    (model / "model.safetensors").write_bytes(b"\x00\x01 definitely not safetensors")
    code, err = _compile_cli(capsys, model, "--output", tmp_path / "out")
    assert code == 2 and "corrupt weights" in err
    assert _leftovers(tmp_path) == ["model"]


def test_truncated_weights(tiny_models, tmp_path, capsys):
    model = tmp_path / "model"
    shutil.copytree(tiny_models["bert-cross-encoder"], model)
    data = (model / "model.safetensors").read_bytes()
    (model / "model.safetensors").write_bytes(data[: len(data) // 2])
    code, err = _compile_cli(capsys, model, "--output", tmp_path / "out")
    assert code == 2 and "weights" in err and "Traceback" not in err
    assert _leftovers(tmp_path) == ["model"]


def test_a_tokenizer_that_cuts_from_the_left_is_refused_by_name(tiny_models, tmp_path, capsys):
    """sentence-transformers cuts long texts where the tokenizer says; encoderrt would cut them from the right, and
    parity failed on every long probe with nothing said about why."""
    from transformers import AutoTokenizer

    model = shutil.copytree(tiny_models["bert-cross-encoder"], tmp_path / "model")
    settings = model / "tokenizer_config.json"
    settings.write_text(json.dumps({**json.loads(settings.read_text()), "truncation_side": "left"}))
    assert AutoTokenizer.from_pretrained(model).truncation_side == "left"  # as sentence-transformers would load it
    code, err = _compile_cli(capsys, model, "--output", tmp_path / "out")
    assert code == 2 and "cuts long inputs from the left (truncation_side in tokenizer_config.json)" in err
    assert _leftovers(tmp_path) == ["model"]


def test_non_empty_output_needs_force(tiny_models, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("user data")
    code, err = _compile_cli(capsys, tiny_models["bert-classifier"], "--output", out)
    assert code == 2 and "exists and is not empty" in err and "--force" in err
    assert (out / "keep.txt").read_text() == "user data"
    code, err = _compile_cli(capsys, tiny_models["bert-classifier"], "--output", out, "--force")
    assert code == 0, err
    assert (out / "manifest.json").is_file() and not (out / "keep.txt").exists()
    assert _leftovers(tmp_path) == ["out"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--task", "score"], "needs a *ForSequenceClassification checkpoint"),
        (["--max-length", "4096"], "outside 2..64"),
        # TensorRT's profile size: a CPU compile took it and ignored it
        (["--target", "cpu", "--max-batch-tokens", "4096"], "--max-batch-tokens applies to --target tensorrt"),
        (["--max-batch-tokens", "4096"], "--max-batch-tokens applies to --target tensorrt (its optimisation "
                                         "profiles), not auto"),
        (["--target", "tensorrt", "--max-batch-tokens", "0"], "--max-batch-tokens must be positive, got 0"),
    ],
)
def test_flags_that_do_not_fit_the_model(tiny_models, tmp_path, capsys, argv, message):
    code, err = _compile_cli(capsys, tiny_models["xlm-roberta-encoder"], "--output", tmp_path / "out", *argv)
    assert code == 2 and message in err


def test_score_needs_one_label(tiny_models, tmp_path, capsys):
    code, err = _compile_cli(capsys, tiny_models["bert-classifier"], "--output", tmp_path / "out", "--task", "score")
    assert code == 2 and "3 labels" in err and "--task classify" in err


def test_pooling_flag_on_a_cross_encoder(tiny_models, tmp_path, capsys):
    code, err = _compile_cli(capsys, tiny_models["bert-cross-encoder"], "--output", tmp_path / "out", "--pooling", "cls")
    assert code == 2 and "--pooling applies to embedding models" in err


def test_parity_failure_exits_1_and_writes_nothing(tiny_models, tmp_path, monkeypatch, capsys):
    from encoderrt.compile import parity

    impossible = parity.Tolerance(max_abs_logit_diff=-1.0)
    monkeypatch.setitem(parity.TOLERANCES, ("logits", "fp32"), impossible)
    code, err = _compile_cli(capsys, tiny_models["bert-cross-encoder"], "--output", tmp_path / "out")
    assert code == 1 and "parity check failed" in err and "max |logit difference|" in err
    assert _leftovers(tmp_path) == []
    with pytest.raises(ParityError):
        compile_model(CompileOptions(model_dir=tiny_models["bert-cross-encoder"], output_dir=tmp_path / "out", quiet=True))


def test_interrupted_compile_leaves_nothing(tiny_models, tmp_path, monkeypatch):
    from encoderrt.compile import parity

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(parity, "check_parity", interrupt)
    with pytest.raises(KeyboardInterrupt):
        compile_model(CompileOptions(model_dir=tiny_models["bert-cross-encoder"], output_dir=tmp_path / "out", quiet=True))
    assert _leftovers(tmp_path) == []


def test_a_full_disk_is_one_line_and_leaves_nothing(tiny_models, tmp_path, monkeypatch, capsys):
    """A disk that fills up mid-compile (a 2.3 GB model writes ~7 GB) is named, with where space is needed."""
    import errno
    import tempfile

    from encoderrt.compile import cpu

    work = tmp_path / "tmp"
    work.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(work))

    def disk_full(graph, destination):
        destination.write_bytes(b"half a graph")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(cpu, "save_with_weights_beside", disk_full)
    code, err = _compile_cli(capsys, tiny_models["bert-classifier"], "--output", tmp_path / "out", "--target", "cpu")
    assert code == 1 and "the disk filled up while compiling" in err and "No space left on device" in err
    assert f"work folder ({work}; set TMPDIR to move it)" in err and "Traceback" not in err
    assert _leftovers(tmp_path) == ["tmp"] and _leftovers(work) == []

    # a disk with less free than a compile may write is said before the work starts
    from encoderrt.compile import pipeline

    monkeypatch.setattr(pipeline.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(100, 100, 0))
    code = compile_model_main([str(tiny_models["bert-classifier"]), "--output", str(tmp_path / "out"),
                               "--target", "cpu"])
    printed = " ".join((capsys.readouterr().err).split())  # the terminal's line breaks undone
    assert code == 1 and f"the work folder ({work}) has 1 MB free; this compile may write up to" in printed


def test_running_out_of_memory_is_one_line_naming_the_length_and_leaves_nothing(tiny_models, tmp_path, monkeypatch,
                                                                                   capsys):
    """Verification runs probes as long as the model's limit; a model whose table allows more than fits (EmbeddingGemma
    2's 262,144 positions ask a 512 GiB window mask of torch) is told to pass --max-length, not shown a traceback.
    Other RuntimeErrors stay what they are."""
    from encoderrt.compile import parity

    def allocation_fails(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: you tried "
                           "to allocate 549755813888 bytes.")

    monkeypatch.setattr(parity, "reference_outputs", allocation_fails)
    code, err = _compile_cli(capsys, tiny_models["bert-classifier"], "--output", tmp_path / "out", "--target", "cpu")
    assert code == 1 and "compiling ran out of memory at max length 64" in err and "pass --max-length" in err
    assert "can't allocate memory" in err and "Traceback" not in err and not (tmp_path / "out").exists()

    monkeypatch.setattr(parity, "reference_outputs", lambda *args: (_ for _ in ()).throw(RuntimeError("a bug")))
    with pytest.raises(RuntimeError, match="a bug"):
        compile_model(CompileOptions(model_dir=tiny_models["bert-classifier"], output_dir=tmp_path / "out",
                                     target="cpu", quiet=True))


def test_unfused_layers_are_refused():
    fused = {"Attention": 6, "BiasGelu": 6, "LayerNormalization": 12}
    check_fusion(fused, num_layers=6)
    with pytest.raises(FusionError, match="5 fused attention ops for 6 layers"):
        check_fusion({**fused, "Attention": 5}, num_layers=6)
    with pytest.raises(FusionError, match="GELU"):
        check_fusion({**fused, "BiasGelu": 0}, num_layers=6)
    with pytest.raises(FusionError, match="11 fused LayerNorms for 6 layers"):
        check_fusion({**fused, "LayerNormalization": 11}, num_layers=6)


def test_console_script_reports_steps(tiny_models, tmp_path, capsys):
    out = tmp_path / "out"
    # one candidate in both: choosing by measurement is tests/compile/test_selection.py's
    from encoderrt.cli import main

    code = main(["compile", str(tiny_models["bert-classifier"]), "-o", str(out), "--target", "cpu",
                 "--precision", "fp32"])
    loud = capsys.readouterr()
    assert code == 0, loud.err
    for step in ("export", "optimise", "verify"):
        assert step in loud.err
    assert "task       classify" in loud.out and "Attention 2" in loud.out
    umask = os.umask(0o022)
    os.umask(umask)
    # readable by others as any folder made under this umask (a root-owned copy in an image is served by a user)
    assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~umask
    quiet = subprocess.run(["compile-model", str(tiny_models["bert-classifier"]), "-o", str(out), "--force", "--quiet",
                            "--target", "cpu", "--precision", "fp32"],
                           capture_output=True, text=True, timeout=300)
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stdout == "" and "export" not in quiet.stderr


def test_a_transformers_release_outside_the_declared_range_is_one_line(tiny_models, tmp_path, capsys, monkeypatch):
    """transformers 5.5.4 ended an OpenVINO compile in a tracing traceback; a release outside the compile extra's
    range (read from the installed package's own metadata) is named before any work, with the range."""
    from importlib import metadata

    declared = next(r for r in metadata.requires("encoderrt") if r.startswith("transformers"))
    installed = metadata.version

    monkeypatch.setattr(metadata, "version", lambda name: "5.5.4" if name == "transformers" else installed(name))
    code, err = _compile_cli(capsys, tiny_models["st-cls"], "--output", tmp_path / "out", "--target", "openvino")
    assert code != 0 and "Traceback" not in err
    said = " ".join(err.split())
    assert "transformers 5.5.4 is installed" in said and declared.split(";")[0] in said
    assert _leftovers(tmp_path) == []
