"""A job's input: files of rows (JSON lines, CSV/TSV, Parquet or text lines), read as a stream from any position.

A `Position` (which file, where in it, how many rows came before) marks where a shard starts, so a shard can be
read again without the rows before it: byte offsets for the line formats, row offsets for Parquet. The local job
reads straight through; the Ray job plans shards from one pass on the driver and each actor reads the ones it runs.
A row that cannot be embedded (missing field, not a string, empty, invalid UTF-8 or JSON) is still a row, with its
problem, so ids and shard boundaries never depend on which rows were bad.
"""

from __future__ import annotations

import codecs
import csv
import glob
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple

InputFormat = Literal["auto", "jsonl", "csv", "tsv", "parquet", "text"]
_SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".csv": "csv", ".tsv": "tsv",
             ".parquet": "parquet", ".txt": "text", ".text": "text"}


class Position(NamedTuple):
    file: int
    """Index into the job's input files."""
    offset: int
    """Bytes into the file (line formats) or rows into it (Parquet)."""
    row: int
    """Rows before this one, across every file: the default id."""


START = Position(0, 0, 0)


class Row(NamedTuple):
    row: int
    id: Any
    values: tuple[str, ...]
    """The fields the job reads (one text, or a query and a document), in order; empty when `problem` is set."""
    problem: str | None = None
    file: int = 0
    """Index into the job's input files."""


@dataclass(frozen=True)
class Fields:
    """Which fields a row's values come from, and which one is its id (None: the row's number, from 0)."""

    values: tuple[str, ...] = ("text",)
    id: str | None = None


def resolve(patterns: list[str | Path]) -> list[Path]:
    """Input files for paths, folders (every file in it with a known suffix, by name, recursively) and globs, in the
    order given; a pattern that names nothing is an error."""
    files: list[Path] = []
    for pattern in map(str, patterns):
        path = Path(pattern)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in _SUFFIXES)
            if not found:
                raise ValueError(f"{path} holds no input files ({', '.join(sorted(_SUFFIXES))})")
            files += found
        elif path.is_file():
            files.append(path)
        elif glob.has_magic(pattern):
            found = sorted(Path(p) for p in glob.glob(pattern, recursive=True) if Path(p).is_file())
            if not found:
                raise ValueError(f"no input file matches {pattern}")
            files += found
        else:
            raise ValueError(f"input not found: {pattern}")
    if not files:
        raise ValueError("no input given")
    return files


def format_of(path: Path, given: InputFormat = "auto") -> str:
    if given != "auto":
        return given
    return _SUFFIXES.get(path.suffix.lower(), "text")


class Corpus:
    """The input files and how to read them."""

    def __init__(self, files: list[Path], fields: Fields, input_format: InputFormat = "auto"):
        self.files, self.fields = tuple(files), fields
        self.formats = tuple(format_of(f, input_format) for f in files)
        check_readable(files)  # before any is opened: a file without read permission is named as such
        for path, kind in zip(self.files, self.formats):
            if kind == "text" and (fields.id is not None or len(fields.values) > 1):
                raise ValueError(f"{path} is read as text lines (one text a line): it has no fields for "
                                 f"{'--id-field' if fields.id else 'a query and a document'}; give JSON lines, "
                                 "CSV or Parquet")
            if kind == "parquet":  # its footer: a file that is not Parquet, or lacks a field, is told before a compile
                _parquet_columns(path, fields)
            elif compression := _compression(path):
                name, tool = compression
                raise ValueError(f"{path} is {name}-compressed: inputs are read as they are stored; decompress it "
                                 f"first ({tool} {path.name})")

    def fingerprint(self) -> list[dict[str, Any]]:
        """What a resumed job checks its inputs against: each file's path, size and modification time."""
        return [{"path": str(p.absolute()), "bytes": p.stat().st_size, "modified_ns": p.stat().st_mtime_ns}
                for p in self.files]

    def count(self) -> int:
        """Rows in every file (for progress): lines or Parquet metadata, without parsing the rows."""
        return sum(_count(path, kind) for path, kind in zip(self.files, self.formats))

    def rows(self, start: Position = START) -> Iterator[tuple[Row, Position]]:
        """Every row from `start` on, each with the position after it."""
        row = start.row
        for index in range(start.file, len(self.files)):
            offset = start.offset if index == start.file else 0
            reader = _READERS[self.formats[index]]
            for record, offset in reader(self.files[index], offset, self.fields):
                yield self._row(row, record)._replace(file=index), Position(index, offset, row + 1)
                row += 1

    def _row(self, number: int, record: dict[str, Any] | str) -> Row:
        if isinstance(record, str):  # the reader's problem with the row (not JSON, invalid UTF-8)
            return Row(number, number, (), record)
        identity = number if self.fields.id is None else record.get(self.fields.id)
        if self.fields.id is not None and (not isinstance(identity, (str, int)) or isinstance(identity, bool)):
            return Row(number, number, (), f"its {self.fields.id} field is missing or not a string or an integer")
        values = []
        for name in self.fields.values:
            value = record.get(name)
            if not isinstance(value, str):
                kind = ("null" if name in record else "missing") if value is None else \
                    f"a {type(value).__name__}, not a string"
                return Row(number, identity, (), f"its {name} field is {kind}")
            if not value.strip():
                return Row(number, identity, (), f"its {name} field is empty")
            if _has_surrogates(value):
                return Row(number, identity, (), f"its {name} field is not valid UTF-8")
            values.append(value)
        return Row(number, identity, tuple(values))


def _has_surrogates(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


COMPRESSED = {b"\x1f\x8b": ("gzip", "gunzip"), b"BZh": ("bzip2", "bunzip2"), b"\xfd7zXZ\x00": ("xz", "unxz"),
              b"\x28\xb5\x2f\xfd": ("zstd", "unzstd"), b"PK\x03\x04": ("zip", "unzip")}
"""Magic bytes of compressed files, which the line formats would read as rows of invalid UTF-8."""

CSV_FIELD_LIMIT = 2**31 - 1
"""The csv module refuses a field past 131,072 characters, and a corpus may hold a longer document (the model
truncates it, or chunks it): the job raises that limit, the csv module's one setting for the whole process."""


def _compression(path: Path) -> tuple[str, str] | None:
    """The compression of `path` by its first bytes (COMPRESSED), with the command that undoes it; None: none."""
    with path.open("rb") as file:
        start = file.read(6)
    return next((found for magic, found in COMPRESSED.items() if start.startswith(magic)), None)


BOM = codecs.BOM_UTF8
"""What Windows tools (PowerShell, Excel's "CSV UTF-8", Notepad) write at the start of UTF-8 text: not part of the
first row."""


def _lines(path: Path, offset: int, keep_ends: bool = False) -> Iterator[tuple[bytes, int]]:
    """Each line's bytes (without its end, unless `keep_ends`) and the offset after it; a file's BOM is skipped."""
    with path.open("rb") as file:
        if offset == 0 and file.read(len(BOM)) == BOM:
            offset = len(BOM)
        file.seek(offset)
        for line in file:
            offset += len(line)
            yield line if keep_ends else line.rstrip(b"\r\n"), offset


def _text(path: Path, offset: int, fields: Fields) -> Iterator[tuple[dict[str, Any] | str, int]]:
    for line, after in _lines(path, offset):
        try:
            yield {fields.values[0]: line.decode("utf-8")}, after
        except UnicodeDecodeError as exc:
            yield f"not valid UTF-8 ({exc.reason} at byte {exc.start})", after


def _jsonl(path: Path, offset: int, fields: Fields) -> Iterator[tuple[dict[str, Any] | str, int]]:
    for line, after in _lines(path, offset):
        if not line.strip():
            continue  # a blank line (often the last) is no row
        try:
            record = json.loads(line.decode("utf-8"))
        except UnicodeDecodeError as exc:
            yield f"not valid UTF-8 ({exc.reason} at byte {exc.start})", after
            continue
        except json.JSONDecodeError as exc:
            yield f"not valid JSON ({exc.msg} at column {exc.colno})", after
            continue
        yield (record if isinstance(record, dict) else f"a JSON {type(record).__name__}, not an object"), after


def _delimited(delimiter: str):
    def read(path: Path, offset: int, fields: Fields) -> Iterator[tuple[dict[str, Any] | str, int]]:
        header = _header(path, delimiter)
        missing = [name for name in (*fields.values, *([fields.id] if fields.id else [])) if name not in header]
        if missing:
            raise ValueError(f"{path} has no column {', '.join(missing)} (its columns: {', '.join(header)})")
        position = [offset]

        def lines() -> Iterator[str]:  # csv pulls lines; a quoted field may span several, its line ends kept
            for line, after in _lines(path, offset, keep_ends=True):
                position[0] = after
                yield line.decode("utf-8", "surrogateescape")

        records = _csv_reader(lines(), delimiter)
        try:
            if offset == 0:
                next(records, None)
            for values in records:
                if not values:
                    continue
                if len(values) != len(header):
                    yield f"{len(values)} columns where the header has {len(header)}", position[0]
                    continue
                yield dict(zip(header, values)), position[0]
        except csv.Error as error:  # nothing a row alone could be blamed for: where the reading stopped is named
            raise UnreadableInput(f"{path}: the record after byte {position[0]:,} cannot be read: {error}") from None

    return read


def _header(path: Path, delimiter: str) -> list[str]:
    """The first record, read from the lines the rows are read from (past a BOM, as they are)."""
    lines = (line.decode("utf-8", "surrogateescape") for line, _ in _lines(path, 0, keep_ends=True))
    return next(_csv_reader(lines, delimiter), [])


def _csv_reader(lines: Iterator[str], delimiter: str) -> Iterator[list[str]]:
    csv.field_size_limit(CSV_FIELD_LIMIT)
    return csv.reader(lines, delimiter=delimiter)


class UnreadableInput(ValueError):
    """Part of an input file that cannot be read, found as the job reads it (a Parquet row group that does not
    decode): the rows before it are good, and the job stops there."""


def _parquet_file(path: Path) -> Any:
    """`path` opened as Parquet; a file that is not one is the input's error, named (pyarrow's own says which file
    nowhere)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as error:
        raise ValueError(f"{path} is not a Parquet file pyarrow can read: {_one_line(error)}") from None


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())


def _parquet_columns(path: Path, fields: Fields) -> tuple[Any, list[str]]:
    """`path` opened as Parquet, and the columns the job reads from it; ValueErrors name a file that is not Parquet
    and the fields it lacks."""
    file = _parquet_file(path)
    columns = [*fields.values, *([fields.id] if fields.id else [])]
    missing = [name for name in columns if name not in file.schema_arrow.names]
    if missing:
        raise ValueError(f"{path} has no column {', '.join(missing)} "
                         f"(its columns: {', '.join(file.schema_arrow.names)})")
    return file, columns


def _parquet(path: Path, offset: int, fields: Fields) -> Iterator[tuple[dict[str, Any] | str, int]]:
    import pyarrow as pa

    file, columns = _parquet_columns(path, fields)
    row = 0
    for group in range(file.num_row_groups):
        rows = file.metadata.row_group(group).num_rows
        if row + rows <= offset:  # a resumed read skips whole row groups unread
            row += rows
            continue
        first = row  # counted from 0, as the job's rows are
        try:
            for batch in file.iter_batches(row_groups=[group], columns=columns, batch_size=4096):
                for record in batch.to_pylist():
                    row += 1
                    if row > offset:
                        yield record, row
        except (pa.ArrowException, OSError) as error:  # the footer read, this group's pages do not decode
            raise UnreadableInput(f"{path}: rows {first:,}-{first + rows - 1:,} of the file (row group {group + 1} "
                                  f"of {file.num_row_groups}) cannot be read: {_one_line(error)}") from None


_READERS = {"text": _text, "jsonl": _jsonl, "csv": _delimited(","), "tsv": _delimited("\t"), "parquet": _parquet}


def _count(path: Path, kind: str) -> int:
    if kind == "parquet":
        return _parquet_file(path).metadata.num_rows
    if kind in ("csv", "tsv"):  # quoted fields may hold line ends: parse
        return sum(1 for _ in _READERS[kind](path, 0, Fields((), None)))
    count, blank = 0, kind == "jsonl"
    with path.open("rb") as file:
        for line in file:
            count += not (blank and not line.strip())
    return count


def check_readable(files: list[Path]) -> None:
    for path in files:
        if not os.access(path, os.R_OK):
            raise ValueError(f"cannot read {path}: permission denied")
