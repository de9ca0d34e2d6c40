"""Folders a killed compile leaves behind, and removing them at the next compile.

A compile stages its artifact beside the output (compile/artifact.py) and works in the system temp
folder (compile/pipeline.py); each such folder carries its process id. A folder whose process is gone
(SIGKILL, a power cut) is litter; one whose process lives is a concurrent compile's, and stays.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

WORK_PREFIX = "encoderrt-compile-"
_OWNED = re.compile(r"^(?:\..+\.(?:partial|replaced)|encoderrt-compile)-(\d+)(?:-|$)")


def work_prefix() -> str:
    return f"{WORK_PREFIX}{os.getpid()}-"


def staging_prefix(output_name: str) -> str:
    return f".{output_name}.partial-{os.getpid()}-"


def replaced_name(output_name: str) -> str:
    return f".{output_name}.replaced-{os.getpid()}"


def remove_dead(folder: Path) -> int:
    """Remove the compile folders in `folder` whose process is gone; returns the bytes reclaimed."""
    reclaimed = 0
    try:
        entries = list(folder.iterdir())
    except OSError:
        return 0
    for entry in entries:
        match = _OWNED.match(entry.name)
        if match and entry.is_dir() and not entry.is_symlink() and not _alive(int(match.group(1))):
            reclaimed += folder_size(entry)
            shutil.rmtree(entry, ignore_errors=True)
    return reclaimed


def folder_size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True
