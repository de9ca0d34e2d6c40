"""A job's output folder: numbered shards, each written whole under a hidden name and renamed into place, and
job.json, which lists the finished shards and is itself replaced whole after each one.

What a killed job leaves is therefore always consistent: a shard is in job.json only once its files are in place,
a shard file not (yet) in job.json is written again on resume, and hidden partial files are removed. job.json
also records what produced the output (model, the artifact's manifest hash, the output settings, the inputs'
sizes and times), so a rerun with anything changed is refused rather than mixed into the same folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from encoderrt.jobs.inputs import Position

JOB_FILE = "job.json"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class ShardRecord:
    index: int
    start: Position
    end: Position
    rows: int
    """Input rows in the shard, rejected ones included."""
    written: int
    rejected: int
    tokens: int
    seconds: float
    files: tuple[str, ...]


def identity_of(*, kind: dict[str, Any], model: str, artifact_sha256: str, inputs: list[dict[str, Any]],
                shard_rows: int, output_format: str, include_text: bool, fields: dict[str, Any]) -> dict[str, Any]:
    return {"format_version": FORMAT_VERSION, "kind": kind, "model": model, "artifact_sha256": artifact_sha256,
            "inputs": inputs, "shard_rows": shard_rows, "output_format": output_format, "include_text": include_text,
            "fields": fields}


def manifest_hash(artifact: Path) -> str:
    """The artifact's identity: its manifest hashes every other file."""
    return hashlib.sha256((artifact / "manifest.json").read_bytes()).hexdigest()


class OutputFolder:
    def __init__(self, root: Path, identity: dict[str, Any], overwrite: bool = False):
        """Opens (or starts) the job in `root`: a folder holding another job's output is refused, unless
        `overwrite`, and a folder holding anything else is never touched."""
        self.root, self.identity = root, json.loads(json.dumps(identity))  # as job.json holds it: lists, not tuples
        self.shards: dict[int, ShardRecord] = {}
        self.complete = False
        job = root / JOB_FILE
        if job.is_file():
            try:
                recorded = json.loads(job.read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError) as exc:
                raise ValueError(f"{job} is not readable ({exc}): remove the folder or choose another") from None
            if recorded.get("identity") != self.identity:
                if not overwrite and recorded.get("shards"):  # a job that wrote nothing yet has nothing to lose
                    difference = _difference(recorded.get("identity"), self.identity)
                    raise ValueError(f"{root} holds the output of a different job ({difference}): "
                                     "rerun the same command to resume it, give --overwrite to start again, or "
                                     "choose another --output")
                self._clear()
            else:
                self.complete = bool(recorded.get("complete"))
                for entry in recorded.get("shards", []):
                    record = ShardRecord(**{**entry, "start": Position(*entry["start"]), "end": Position(*entry["end"]),
                                            "files": tuple(entry["files"])})
                    missing = [name for name in record.files if not (root / name).is_file()]
                    if missing:
                        raise ValueError(f"{root}: finished shard {record.index}'s {missing[0]} is gone; give "
                                         "--overwrite to start again")
                    self.shards[record.index] = record
        elif root.exists() and (not root.is_dir() or any(root.iterdir())):
            raise ValueError(f"--output {root} exists and is not a job's output folder (no {JOB_FILE}): choose an "
                             "empty or new folder")
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # a read-only or missing place, no permission: the job's error, named, before any row
            raise ValueError(f"--output {root} cannot be made: {exc.strerror}") from None
        for stale in root.glob(".*.partial"):  # a killed run's half-written file
            stale.unlink()
        self._save()

    def resume_position(self) -> tuple[int, Position]:
        """The first shard not finished in a row from the start, and where its rows begin."""
        index = 0
        while index in self.shards:
            index += 1
        return index, self.shards[index - 1].end if index else Position(0, 0, 0)

    @property
    def done_rows(self) -> int:
        return sum(r.rows for r in self.shards.values())

    def write(self, record: ShardRecord, contents: Iterable[tuple[str, Any]]) -> None:
        """Each (name, writer) pair's file under a hidden name, renamed into place; then the shard is recorded.
        A writer is called with the path to write."""
        for name, write in contents:
            partial = self.root / f".{name}.partial"
            try:
                write(partial)
                with open(partial, "rb") as file:
                    os.fsync(file.fileno())
            except BaseException:  # a full disk, say: no half-written file is left behind
                partial.unlink(missing_ok=True)
                raise
            os.replace(partial, self.root / name)
        self.shards[record.index] = record
        self._save()

    def finish(self, total_rows: int) -> None:
        self.complete = True
        self._save(total_rows)

    def rejected_files(self) -> list[Path]:
        return [self.root / name for r in sorted(self.shards.values(), key=lambda r: r.index)
                for name in r.files if name.endswith(".rejected.jsonl")]

    def _save(self, total_rows: int | None = None) -> None:
        body = {"identity": self.identity, "complete": self.complete,
                "shards": [asdict(r) for r in sorted(self.shards.values(), key=lambda r: r.index)]}
        if total_rows is not None:
            body["rows"] = total_rows
        partial = self.root / f".{JOB_FILE}.partial"
        partial.write_text(json.dumps(body, indent=1), encoding="utf-8")
        os.replace(partial, self.root / JOB_FILE)

    def _clear(self) -> None:
        """Removes what a job writes (shards, rejected rows, job.json) and nothing else."""
        for path in self.root.iterdir():
            if path.name == JOB_FILE or path.name.startswith("part-") or path.name.endswith(".partial"):
                shutil.rmtree(path) if path.is_dir() else path.unlink()


def shard_name(index: int, suffix: str) -> str:
    return f"part-{index:05d}{suffix}"


def _difference(recorded: Any, wanted: dict[str, Any]) -> str:
    if not isinstance(recorded, dict):
        return "its job.json is not one this version writes"
    changed = [key for key in wanted if recorded.get(key) != wanted[key]]
    return "a different " + ", ".join(changed) if changed else "different settings"
