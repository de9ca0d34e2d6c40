"""Writing the artifact folder all at once or not at all.

Everything is written into a hidden sibling folder and renamed into place at the end, so a
failed, refused or interrupted compile leaves no half-written artifact behind.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path
from types import TracebackType

from encoderrt.compile import leftovers
from encoderrt.compile.errors import InputError
from encoderrt.runtime.manifest import MANIFEST_NAME, Manifest, sha256_file


def check_output_dir(output_dir: Path, force: bool) -> None:
    if output_dir.exists() and not output_dir.is_dir():
        raise InputError(f"output path exists and is not a folder: {output_dir}")
    if output_dir.is_dir() and any(output_dir.iterdir()) and not force:
        raise InputError(f"output folder {output_dir} exists and is not empty (use --force to replace it)")
    parent = output_dir.absolute().parent
    if not parent.is_dir():
        raise InputError(f"the output folder's parent does not exist: {parent}")
    if not os.access(parent, os.W_OK):
        raise InputError(f"cannot write into {parent}")


class ArtifactWriter:
    def __init__(self, output_dir: Path, force: bool):
        self.output_dir = output_dir.absolute()
        self.force = force
        self.staging: Path | None = None

    def __enter__(self) -> "ArtifactWriter":
        leftovers.remove_dead(self.output_dir.parent)  # a killed compile's staging folder, at the next compile
        self.staging = Path(tempfile.mkdtemp(prefix=leftovers.staging_prefix(self.output_dir.name), dir=self.output_dir.parent))
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self.staging is not None and self.staging.exists():
            shutil.rmtree(self.staging, ignore_errors=True)

    def commit(self, manifest: Manifest) -> Manifest:
        """Hash every file, write the manifest, and move the folder into place; returns the final manifest."""
        assert self.staging is not None
        files = {
            path.relative_to(self.staging).as_posix(): sha256_file(path)
            for path in sorted(self.staging.rglob("*"))
            if path.is_file() and path.name != MANIFEST_NAME
        }
        manifest = replace(manifest, files=files)
        (self.staging / MANIFEST_NAME).write_text(manifest.to_json(), encoding="utf-8")
        previous = None
        if self.output_dir.exists():
            check_output_dir(self.output_dir, self.force)  # it may have filled up while we compiled
            previous = self.output_dir.with_name(leftovers.replaced_name(self.output_dir.name))
            self.output_dir.rename(previous)
        self.staging.chmod(0o777 & ~_umask())  # mkdtemp's 0700 would keep the artifact from any other user
        self.staging.rename(self.output_dir)
        self.staging = None
        if previous is not None:
            shutil.rmtree(previous, ignore_errors=True)
        return manifest


def _umask() -> int:
    """The process's umask, read without setting it (os.umask would change it for every thread meanwhile)."""
    try:
        status = Path("/proc/self/status").read_text()
        return int(next(line.split()[1] for line in status.splitlines() if line.startswith("Umask:")), 8)
    except (OSError, StopIteration):
        return 0o022
