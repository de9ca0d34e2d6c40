"""A killed compile's folders are removed by the next compile; a live compile's are not."""

import os
import subprocess
import sys
import tempfile

from encoderrt.compile import CompileOptions, compile_model


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_the_next_compile_removes_a_killed_compiles_folders(tiny_models, tmp_path, monkeypatch):
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # the system temp folder, for this test only
    out = tmp_path / "out"
    dead, live = _dead_pid(), os.getppid()  # the parent (pytest's runner or a shell) outlives this test
    litter = [temp / f"encoderrt-compile-{dead}-abc", out.parent / f".model.partial-{dead}-xyz",
              out.parent / f".other.replaced-{dead}"]
    kept = [temp / f"encoderrt-compile-{live}-def", out.parent / f".model.partial-{live}-uvw",
            temp / "someone-elses-folder", out.parent / f".model.partial-{dead}-a-file"]
    for folder in litter + kept[:-1]:
        folder.mkdir()
        (folder / "model.onnx").write_bytes(b"0" * 100)
    kept[-1].write_bytes(b"a file, not a compile's folder")

    compile_model(CompileOptions(model_dir=tiny_models["st-cls"], output_dir=out, quiet=True, target="cpu",
                                 precision="fp32"))
    assert not any(folder.exists() for folder in litter)
    assert all(path.exists() for path in kept)
    assert (out / "manifest.json").is_file()
    assert sorted(p.name for p in temp.iterdir()) == sorted(p.name for p in kept if p.parent == temp)
