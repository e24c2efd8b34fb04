"""Reading raw text corpora: path expansion, .gz, binary detection, invalid UTF-8 accounting, document chunks.

Corpus format (docs/xlnet.md §2): one sentence (or paragraph) per line; a blank (or whitespace-only) line ends a
document; the end of a file also ends a document.

Invalid UTF-8 policy: bad bytes are replaced by U+FFFD and counted; a warning line names the file and the count. A file
where more than 1% of the bytes are invalid is refused (it is almost certainly not UTF-8 text: re-encode it first).
A NUL byte in the first 64 KiB marks a file as binary and it is refused.
"""

from __future__ import annotations

import codecs
import glob
import gzip
import os
import re
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from .errors import DataError

TEXT_SUFFIXES = (".txt", ".text", ".txt.gz", ".text.gz", ".gz")
MAX_BAD_FRACTION = 0.01  # refuse a file when more than this share of its bytes is invalid UTF-8
BINARY_PROBE = 1 << 16  # bytes inspected for NUL
READ_BLOCK = 1 << 20
# A blank line: newline, optional non-newline whitespace, newline. Chunks are cut right after it.
_BLANK_LINE = re.compile(r"\n[^\S\n]*\n")


def _is_text_name(p: Path) -> bool:
    name = p.name.lower()
    return not name.startswith(".") and name.endswith(TEXT_SUFFIXES)


def expand_inputs(inputs: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """Files, directories (recursive: *.txt, *.text, *.gz) and glob patterns -> a sorted, de-duplicated file list.

    The order is: inputs in the order given; within a directory or glob, sorted by path. Raises DataError for a path
    that does not exist, a glob that matches nothing, or a directory with no text files.
    """
    files: list[Path] = []
    seen: set[Path] = set()

    def add(p: Path) -> None:
        rp = p.resolve()
        if rp not in seen:
            seen.add(rp)
            files.append(p)

    inputs = list(inputs)
    if not inputs:
        raise DataError("no input files given; pass text files, directories or glob patterns")
    for raw in inputs:
        s = str(raw)
        p = Path(s)
        if p.is_dir():
            found = sorted(q for q in p.rglob("*") if q.is_file() and _is_text_name(q)
                           and not any(part.startswith(".") for part in q.relative_to(p).parts))
            if not found:
                raise DataError(f"directory {p} holds no text files ({', '.join('*' + x for x in TEXT_SUFFIXES)})")
            for q in found:
                add(q)
        elif p.exists():
            if not p.is_file():
                raise DataError(f"input {p} is not a regular file")
            add(p)
        elif glob.has_magic(s):
            matches = sorted(Path(m) for m in glob.glob(s, recursive=True))
            matches = [m for m in matches if m.is_file()]
            if not matches:
                raise DataError(f"glob {s!r} matches no files")
            for m in matches:
                add(m)
        else:
            raise DataError(f"input {p} does not exist")
    return files


def total_size(files: Iterable[Path]) -> int:
    return sum(f.stat().st_size for f in files)


def _open_raw(path: Path) -> BinaryIO:
    try:
        return open(path, "rb")  # noqa: SIM115
    except PermissionError:
        raise DataError(f"cannot read {path}: permission denied") from None
    except FileNotFoundError:
        raise DataError(f"input {path} does not exist") from None
    except IsADirectoryError:
        raise DataError(f"input {path} is a directory, expected a text file") from None
    except OSError as e:
        raise DataError(f"cannot read {path}: {e.strerror or e}") from None


@dataclass
class FileStats:
    path: Path
    bytes_read: int = 0  # decoded (uncompressed) bytes
    bad_bytes: int = 0  # invalid UTF-8 bytes replaced by U+FFFD


@dataclass
class ReadStats:
    files: list[FileStats] = field(default_factory=list)

    @property
    def bad_bytes(self) -> int:
        return sum(f.bad_bytes for f in self.files)

    def warnings(self) -> list[str]:
        return [f"warning: {f.path}: replaced {f.bad_bytes} invalid UTF-8 byte(s) with U+FFFD"
                for f in self.files if f.bad_bytes]


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
                out.append(buf[pos:pos + e.start].decode("utf-8"))
                out.append("\ufffd")
                self.bad += e.end - e.start
                pos += e.end
                self._dec.reset()
        return "".join(out)


def iter_file_text(path: Path, stats: FileStats, on_bytes=None, block: int = READ_BLOCK) -> Iterator[str]:
    """Yield decoded text blocks of one file (.gz transparently). Calls on_bytes(n) with on-disk bytes consumed."""
    raw = _open_raw(path)
    try:
        gz = path.name.lower().endswith(".gz")
        if gz:
            with open(path, "rb") as probe:
                if probe.read(2) != b"\x1f\x8b":
                    raise DataError(f"{path} has a .gz name but is not gzip data")
        stream: BinaryIO = gzip.GzipFile(fileobj=raw, mode="rb") if gz else raw  # type: ignore[assignment]
        dec = _CountingDecoder()
        first = True
        last_pos = 0
        while True:
            try:
                data = stream.read(block)
            except (OSError, EOFError, zlib.error) as e:
                if gz:
                    raise DataError(f"{path} is a corrupt or truncated gzip file ({e})") from None
                raise DataError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
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
                f"(over {MAX_BAD_FRACTION:.0%}); convert it to UTF-8 first (e.g. iconv -f latin1 -t utf-8)")
    finally:
        raw.close()


def iter_chunks(path: Path, stats: FileStats, chunk_chars: int, max_chunk_chars: int | None = None,
                on_bytes=None) -> Iterator[str]:
    """Yield text chunks of one file, each ending at a document boundary (a blank line) or the end of the file.

    Chunk boundaries depend only on the file's content and ``chunk_chars``: never on worker counts. A document longer
    than ``max_chunk_chars`` (default 16 x chunk_chars) is cut at a line boundary (it then counts as two documents).
    """
    max_chunk_chars = max_chunk_chars or 16 * chunk_chars
    buf, start = "", 0
    for text in iter_file_text(path, stats, on_bytes):
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


def iter_lines(files: Iterable[Path], stats: ReadStats | None = None, on_bytes=None) -> Iterator[str]:
    """Yield raw lines (without the newline) of all files in order, for tokenizer training."""
    for path in files:
        fs = FileStats(path)
        if stats is not None:
            stats.files.append(fs)
        tail = ""
        for text in iter_file_text(path, fs, on_bytes):
            lines = (tail + text).split("\n")
            tail = lines.pop()
            yield from lines
        if tail:
            yield tail
