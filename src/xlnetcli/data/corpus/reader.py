"""Reading corpora: path expansion, format detection, decompression, invalid UTF-8 accounting, document chunks.

Corpus format (docs/xlnet.md §2): one sentence (or paragraph) per line; a blank (or whitespace-only) line ends a
document; the end of a file also ends a document.

Inputs, detected once here (detect_format) so that every command reads the same:
  text      *.txt, *.text and any other file: the format above
  JSONL     *.jsonl, *.ndjson, *.json (JSON Lines: one object per line, C4 / `Dataset.to_json` style): the string
            field ``text_field`` of each object is one document
  Parquet   *.parquet (needs pyarrow: the `parquet` extra): the ``text_field`` column, one row = one document
  datasets  a folder written by `datasets`' save_to_disk (the `datasets` extra): the ``text_field`` column
Text and JSONL may be compressed: .gz (gzip) or .zst (zstandard: the `zstd` extra below Python 3.14); the magic
bytes decide, the name must agree. Within a record, each non-blank line is a sentence and blank lines are dropped, so
a record reads exactly as its lines followed by a blank line would in a text file. Records are streamed (JSONL by
blocks, Parquet by record batches, datasets by Arrow batches): memory stays bounded whatever the corpus size.
Text and JSONL may also be URLs (s3://, https://, ...: data/corpus/remote.py), streamed the same way; an input is then a
RemoteFile instead of a Path (``Source``).

Invalid UTF-8 policy: bad bytes are replaced by U+FFFD and counted; a warning line names the file and the count. A file
where more than 1% of the bytes are invalid is refused (it is almost certainly not UTF-8 text: re-encode it first).
A NUL byte in the first 64 KiB marks a file as binary and it is refused.
"""

from __future__ import annotations

import codecs
import gzip
import json
import re
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from xlnetcli.core.errors import DataError
from xlnetcli.data.corpus.inputs import (
    InputFormat,
    Source,
    detect_format,
    import_datasets,
    import_pyarrow_parquet,
    open_raw,
    require_reader,
    total_size,
    zstd_module,
)
from xlnetcli.data.corpus.remote import RemoteFile

ZSTD_FEED = 1 << 14  # compressed bytes per zstd decompress call
MAX_BAD_FRACTION = 0.01  # refuse a file when more than this share of its bytes is invalid UTF-8
BINARY_PROBE = 1 << 16  # bytes inspected for NUL
READ_BLOCK = 1 << 20
RECORD_BATCH = 1024  # rows per Parquet / datasets batch
_BLANK_LINE = re.compile(r"\n[^\S\n]*\n")


@dataclass
class FileStats:
    path: Source
    bytes_read: int = 0  # decoded (uncompressed) bytes
    bad_bytes: int = 0  # invalid UTF-8 bytes replaced by U+FFFD
    null_records: int = 0  # JSONL / Parquet / datasets records whose text is null (skipped)


@dataclass
class ReadStats:
    files: list[FileStats] = field(default_factory=list)

    @property
    def bad_bytes(self) -> int:
        return sum(f.bad_bytes for f in self.files)

    def warnings(self) -> list[str]:
        return [
            f"warning: {f.path}: replaced {f.bad_bytes} invalid UTF-8 byte(s) with U+FFFD"
            for f in self.files
            if f.bad_bytes
        ] + [
            f"warning: {f.path}: skipped {f.null_records} record(s) whose text is null"
            for f in self.files
            if f.null_records
        ]


class _CountingDecoder:
    """Incremental UTF-8 decoder that replaces invalid bytes with U+FFFD and counts them."""

    def __init__(self) -> None:
        self.bad = 0
        self._dec = codecs.getincrementaldecoder("utf-8")("strict")

    def decode(self, data: bytes, final: bool = False) -> str:
        try:
            return self._dec.decode(data, final)
        except UnicodeDecodeError:
            pass
        # Slow path only for blocks with errors: decode the pending state + block with replacement, count bad spans.
        pending, _ = self._dec.getstate()
        buf = pending + data
        self._dec.reset()
        out: list[str] = []
        pos = 0
        while True:
            try:
                out.append(self._dec.decode(buf[pos:], final))
                break
            except UnicodeDecodeError as e:
                out.append(buf[pos : pos + e.start].decode("utf-8"))
                out.append("\ufffd")
                self.bad += e.end - e.start
                pos += e.end
                self._dec.reset()
        return "".join(out)


def _raw_blocks(path: Source, raw: BinaryIO, compression: str | None, block: int) -> Iterator[bytes]:
    """Decompressed bytes of one file, block by block (b"" never yielded)."""
    if compression == "zstd":
        new, zstd_error = zstd_module()
        dec = None  # one decompressor per frame: multi-frame files (pzstd, concatenations) read whole
        while buf := raw.read(block):
            for i in range(0, len(buf), ZSTD_FEED):  # small feeds bound each output (~ compression ratio x feed)
                data = buf[i : i + ZSTD_FEED]
                while data:
                    if dec is None:
                        dec = new()
                    try:
                        out = dec.decompress(data)
                    except zstd_error as e:  # zstandard.ZstdError / compression.zstd.ZstdError
                        raise DataError(f"{path} is a corrupt zstd file ({e})") from None
                    if out:
                        yield out
                    if dec.eof:
                        data, dec = dec.unused_data, None
                    else:
                        data = b""
        if dec is not None:
            raise DataError(f"{path} is a corrupt or truncated zstd file (the last frame does not end)")
        return
    stream: BinaryIO = gzip.GzipFile(fileobj=raw, mode="rb") if compression == "gzip" else raw  # type: ignore
    while True:
        try:
            data = stream.read(block)
        except (OSError, EOFError, zlib.error) as e:
            if compression == "gzip":
                raise DataError(f"{path} is a corrupt or truncated gzip file ({e})") from None
            raise DataError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
        if not data:
            return
        yield data


def _iter_decoded(path: Source, fmt: InputFormat, stats: FileStats, on_bytes, block: int) -> Iterator[str]:
    """Decoded text blocks of a text or JSONL file (compressed or not); counts invalid UTF-8; refuses binaries."""
    raw = open_raw(path)
    try:
        dec = _CountingDecoder()
        first = True
        last_pos = 0
        blocks = _raw_blocks(path, raw, fmt.compression, block)
        while True:
            data = next(blocks, b"")
            if first:
                first = False
                if b"\x00" in data[:BINARY_PROBE]:
                    raise DataError(f"{path} looks like a binary file (NUL bytes); pass UTF-8 text files")
            if on_bytes is not None:
                pos = raw.tell()
                on_bytes(pos - last_pos)
                last_pos = pos
            stats.bytes_read += len(data)
            text = dec.decode(data, final=not data)
            stats.bad_bytes = dec.bad
            if text:
                yield text
            if not data:
                break
        if stats.bytes_read and stats.bad_bytes > MAX_BAD_FRACTION * stats.bytes_read:
            raise DataError(
                f"{path}: {stats.bad_bytes} of {stats.bytes_read} bytes are invalid UTF-8 "
                f"(over {MAX_BAD_FRACTION:.0%}); convert it to UTF-8 first (e.g. iconv -f latin1 -t utf-8)"
            )
    finally:
        raw.close()


def _record_text(text: str) -> str:
    """One record as text-format lines: non-blank lines, then the blank line that ends the document."""
    lines = [ln for ln in text.split("\n") if ln.strip()]
    return "\n".join(lines) + "\n\n" if lines else ""


def _field_error(path: Source, where: str, field: str, keys: Iterable[str], noun: str = "field") -> DataError:
    keys = [str(k) for k in keys]
    shown = ", ".join(keys[:12]) + (", ..." if len(keys) > 12 else "")
    return DataError(f"{path} {where}: no {noun} {field!r} ({noun}s: {shown or 'none'}); pass --text-field NAME")


def _check_value(path: Source, where: str, field: str, value: Any, stats: FileStats) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        stats.null_records += 1
        return ""
    raise DataError(f"{path} {where}: field {field!r} is {type(value).__name__}, expected a string")


def _iter_jsonl(
    path: Source, fmt: InputFormat, stats: FileStats, on_bytes, block: int, text_field: str
) -> Iterator[str]:
    tail = ""
    lineno = 0
    out: list[str] = []
    size = 0

    def record(line: str) -> str:
        if not line.strip():
            return ""
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError) as e:
            why = getattr(e, "msg", e) if isinstance(e, ValueError) else "nested too deeply"
            raise DataError(
                f"{path} line {lineno} is not JSON ({why}); JSON Lines expected: one object per line"
            ) from None
        if not isinstance(obj, dict):
            raise DataError(f"{path} line {lineno} is a JSON {type(obj).__name__}, expected an object")
        if text_field not in obj:
            raise _field_error(path, f"line {lineno}", text_field, obj)
        return _record_text(_check_value(path, f"line {lineno}", text_field, obj[text_field], stats))

    for text in _iter_decoded(path, fmt, stats, on_bytes, block):
        lines = (tail + text).split("\n")
        tail = lines.pop()
        for line in lines:
            lineno += 1
            r = record(line)
            if r:
                out.append(r)
                size += len(r)
        if size >= block:
            yield "".join(out)
            out, size = [], 0
    if tail:
        lineno += 1
        out.append(record(tail))
    if out:
        yield "".join(out)


def _iter_columns(
    path: Path,
    what: str,
    batches: Iterator[Any],
    total_rows: int,
    nbytes: int,
    stats: FileStats,
    on_bytes,
    text_field: str,
) -> Iterator[str]:
    """Text of the one column of Arrow batches (Parquet, datasets); progress in proportion to rows read."""
    import pyarrow as pa  # noqa: PLC0415 - heavy and optional (the `parquet` / `datasets` extras)

    is_text = (pa.types.is_string, pa.types.is_large_string, getattr(pa.types, "is_string_view", lambda t: False))
    is_binary = (pa.types.is_binary, pa.types.is_large_binary)
    row, done = 0, 0
    for batch in batches:
        col = batch.column(0)
        if any(f(col.type) for f in is_binary):  # bytes: decoded as UTF-8 with replacement, counted
            dec = _CountingDecoder()
            values = []
            for v in col.to_pylist():
                if v is not None:
                    stats.bytes_read += len(v)
                    v = dec.decode(v, final=True)
                values.append(v)
            stats.bad_bytes += dec.bad
        elif any(f(col.type) for f in is_text):
            values = col.to_pylist()
        else:
            raise DataError(f"{path} ({what}): column {text_field!r} holds {col.type}, expected text")
        parts = []
        for v in values:
            if v is None:
                stats.null_records += 1
            else:
                parts.append(_record_text(v))
        row += len(values)
        if on_bytes is not None and total_rows:
            now = nbytes * min(row, total_rows) // total_rows
            on_bytes(now - done)
            done = now
        text = "".join(parts)
        if text:
            yield text
    if stats.bytes_read and stats.bad_bytes > MAX_BAD_FRACTION * stats.bytes_read:
        raise DataError(
            f"{path}: {stats.bad_bytes} of {stats.bytes_read} bytes of column {text_field!r} are invalid "
            f"UTF-8 (over {MAX_BAD_FRACTION:.0%})"
        )


def _iter_parquet(path: Path, stats: FileStats, on_bytes, text_field: str) -> Iterator[str]:
    pq = import_pyarrow_parquet()
    import pyarrow as pa  # noqa: PLC0415 - heavy and optional (the `parquet` extra)

    try:
        pf = pq.ParquetFile(path)
    except (OSError, pa.lib.ArrowException) as e:  # pyarrow.ArrowInvalid and friends
        raise DataError(f"{path} is not a readable Parquet file ({' '.join(str(e).split())[:300]})") from None
    names = pf.schema_arrow.names
    if text_field not in names:
        raise _field_error(path, "(Parquet)", text_field, names, "column")
    # one column, batch by batch within row groups: memory is one batch of one column
    batches = pf.iter_batches(batch_size=RECORD_BATCH, columns=[text_field])
    try:
        yield from _iter_columns(
            path, "Parquet", batches, pf.metadata.num_rows, path.stat().st_size, stats, on_bytes, text_field
        )
    except (OSError, pa.lib.ArrowException) as e:
        raise DataError(f"{path} is a corrupt Parquet file ({' '.join(str(e).split())[:300]})") from None


def _iter_datasets(path: Path, stats: FileStats, on_bytes, text_field: str) -> Iterator[str]:
    datasets = import_datasets()
    try:
        ds = datasets.Dataset.load_from_disk(str(path))  # memory-mapped Arrow files
    # a damaged folder fails in many unrelated types (OSError, JSON errors, KeyError, Arrow errors): all mean unreadable
    except Exception as e:  # noqa: BLE001 - load_from_disk has no error base class; any failure = unreadable folder
        raise DataError(f"{path} is not a readable datasets folder ({' '.join(str(e).split())[:300]})") from None
    names = list(ds.column_names)
    if text_field not in names:
        raise _field_error(path, "(datasets folder)", text_field, names, "column")
    ds = ds.select_columns([text_field])
    batches = ds.with_format("arrow").iter(batch_size=RECORD_BATCH)
    yield from _iter_columns(
        path, "datasets folder", batches, ds.num_rows, total_size([path]), stats, on_bytes, text_field
    )


def iter_file_text(
    path: Source, stats: FileStats, on_bytes=None, block: int = READ_BLOCK, text_field: str = "text"
) -> Iterator[str]:
    """Yield text blocks of one input in the text format (see the module doc), whatever its format.

    Calls on_bytes(n) with on-disk bytes consumed. ``text_field`` names the field or column of record formats.
    """
    fmt = detect_format(path)
    require_reader(fmt)
    if fmt.kind == "text":
        yield from _iter_decoded(path, fmt, stats, on_bytes, block)
    elif fmt.kind == "jsonl":
        yield from _iter_jsonl(path, fmt, stats, on_bytes, block, text_field)
    elif isinstance(path, RemoteFile):  # detect_format refuses remote Parquet; datasets folders are local only
        raise DataError(f"{path}: {fmt.kind} inputs must be local")
    elif fmt.kind == "parquet":
        yield from _iter_parquet(path, stats, on_bytes, text_field)
    else:
        yield from _iter_datasets(path, stats, on_bytes, text_field)


def iter_chunks(
    path: Source,
    stats: FileStats,
    chunk_chars: int,
    max_chunk_chars: int | None = None,
    on_bytes=None,
    text_field: str = "text",
) -> Iterator[str]:
    """Yield text chunks of one file, each ending at a document boundary (a blank line) or the end of the file.

    Chunk boundaries depend only on the file's content and ``chunk_chars``: never on worker counts. A document longer
    than ``max_chunk_chars`` (default 16 x chunk_chars) is cut at a line boundary (it then counts as two documents).
    """
    max_chunk_chars = max_chunk_chars or 16 * chunk_chars
    buf, start = "", 0
    for text in iter_file_text(path, stats, on_bytes, text_field=text_field):
        buf = buf[start:] + text if start < len(buf) else text
        start = 0
        while len(buf) - start >= chunk_chars:
            # Only blank lines inside [chunk_chars, max_chunk_chars) count: the cut never depends on read sizes.
            m = _BLANK_LINE.search(buf, start + chunk_chars - 1, start + max_chunk_chars)
            if m is not None:
                cut = m.end()
            elif len(buf) - start >= max_chunk_chars:
                nl = buf.rfind("\n", start, start + max_chunk_chars)
                cut = nl + 1 if nl >= 0 else start + max_chunk_chars
            else:
                break
            yield buf[start:cut]
            start = cut
    if start < len(buf):
        yield buf[start:]


def iter_lines(
    files: Iterable[Source], stats: ReadStats | None = None, on_bytes=None, text_field: str = "text"
) -> Iterator[str]:
    """Yield raw lines (without the newline) of all files in order, for tokenizer training."""
    for path in files:
        fs = FileStats(path)
        if stats is not None:
            stats.files.append(fs)
        tail = ""
        for text in iter_file_text(path, fs, on_bytes, text_field=text_field):
            lines = (tail + text).split("\n")
            tail = lines.pop()
            yield from lines
        if tail:
            yield tail
