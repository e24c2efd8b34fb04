"""A corpus's inputs: paths, globs, folders and URLs expanded to files, and each file's format detected once (magic
bytes and name), so that every command reads the same. The formats and how they are read: reader.py.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from xlnetcli.core.errors import DataError, XLNetError
from xlnetcli.data.corpus.remote import RemoteFile, expand_url, url_protocol

Source = Path | RemoteFile  # a local file or folder, or a file at a URL (data/corpus/remote.py)

TEXT_SUFFIXES = (".txt", ".text", ".txt.gz", ".text.gz", ".gz")
# Names a directory scan picks up (besides datasets folders given directly): text, JSONL, Parquet, compressed.
CORPUS_SUFFIXES = (*TEXT_SUFFIXES, ".zst", ".jsonl", ".ndjson", ".parquet")
JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
COMPRESSED_SUFFIXES = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
PARQUET_MAGIC = b"PAR1"
# A blank line: newline, optional non-newline whitespace, newline. Chunks are cut right after it.


def _is_text_name(p: Path) -> bool:
    return _is_corpus_name(p.name)


def _is_corpus_name(name: str) -> bool:
    name = name.lower()
    return not name.startswith(".") and name.endswith(CORPUS_SUFFIXES)


def source_key(p: Source) -> Path | str:
    """The same for two spellings of one input: the real path of a local one, the full URL of a remote one."""
    return p.key if isinstance(p, RemoteFile) else p.resolve()


def local_paths(files: Iterable[Source | None]) -> list[Path]:
    """The local inputs among ``files`` (remote ones can never be an output)."""
    return [p for p in files if isinstance(p, Path)]


def is_datasets_dir(p: Path) -> bool:
    """A folder written by `datasets`' Dataset.save_to_disk."""
    return (p / "state.json").is_file() and (p / "dataset_info.json").is_file()


def _is_dataset_dict_dir(p: Path) -> bool:
    return (p / "dataset_dict.json").is_file()


def expand_inputs(inputs: Iterable[str | os.PathLike[str]]) -> list[Source]:
    """Files, directories (recursive: *.txt, *.text, *.gz) and glob patterns -> a sorted, de-duplicated file list.

    The order is: inputs in the order given; within a directory or glob, sorted by path. Raises DataError for a path
    that does not exist, a glob that matches nothing, or a directory with no text files. URLs (s3://, https://, ...)
    expand the same way through fsspec (data/corpus/remote.py).
    """
    files: list[Source] = []
    seen: set[Path | str] = set()

    def add(p: Source) -> None:
        rp = source_key(p)
        if rp not in seen:
            seen.add(rp)
            files.append(p)

    inputs = list(inputs)
    if not inputs:
        raise DataError("no input files given; pass text files, directories or glob patterns")
    for raw in inputs:
        s = str(raw)
        p = Path(s)
        if isinstance(raw, str) and url_protocol(s):
            for f in _expand_url(s):
                add(f)
        elif p.is_dir() and is_datasets_dir(p):
            add(p)
        elif p.is_dir() and _is_dataset_dict_dir(p):
            splits = sorted(q.name for q in p.iterdir() if q.is_dir() and is_datasets_dir(q))
            raise DataError(
                f"{p} is a datasets DatasetDict (splits: {', '.join(splits) or 'none'}); pass one "
                f"split's folder, e.g. {p / (splits[0] if splits else 'train')}"
            )
        elif p.is_dir():
            found = sorted(
                q
                for q in p.rglob("*")
                if q.is_file() and _is_text_name(q) and not any(part.startswith(".") for part in q.relative_to(p).parts)
            )
            if not found:
                raise DataError(
                    f"directory {p} holds no text files ({', '.join('*' + x for x in CORPUS_SUFFIXES)}"
                    "; or pass a datasets save_to_disk folder)"
                )
            for q in found:
                add(q)
        elif p.exists():
            if not p.is_file():
                raise DataError(f"input {p} is not a regular file")
            add(p)
        elif glob.has_magic(s):
            matches = sorted(Path(m) for m in glob.glob(s, recursive=True))
            matches = [m for m in matches if m.is_file() or (m.is_dir() and is_datasets_dir(m))]
            if not matches:
                raise DataError(f"glob {s!r} matches no files")
            for m in matches:
                add(m)
        else:
            raise DataError(f"input {p} does not exist")
    for src in files:  # a missing optional reader fails now, not after hours of work on the files before it
        require_reader(detect_format(src))
    return files


def _expand_url(url: str) -> list[RemoteFile]:
    kind, files = expand_url(url, _is_corpus_name)
    if not files and kind == "glob":
        raise DataError(f"glob {url!r} matches no files")
    if not files:
        raise DataError(f"directory {url} holds no text files ({', '.join('*' + x for x in CORPUS_SUFFIXES)})")
    return files


def total_size(files: Iterable[Source]) -> int:
    """On-disk bytes of the inputs (a datasets folder counts its files; a URL whose size is unknown counts 0)."""
    return sum(
        (f.size or 0)
        if isinstance(f, RemoteFile)
        else sum(q.stat().st_size for q in f.rglob("*") if q.is_file())
        if f.is_dir()
        else f.stat().st_size
        for f in files
    )


# ---------------------------------------------------------------------------------------------------------------------
# format detection


@dataclass(frozen=True)
class InputFormat:
    kind: str  # "text", "jsonl", "parquet" or "datasets"
    compression: str | None = None  # None, "gzip" or "zstd"


def detect_format(path: Source) -> InputFormat:
    """The format of one input, from its magic bytes and its name (they must agree for compressed files)."""
    if isinstance(path, Path) and path.is_dir():
        if not is_datasets_dir(path):
            raise DataError(f"input {path} is a directory, expected a text file or a datasets save_to_disk folder")
        return InputFormat("datasets")
    with open_raw(path) as f:
        try:
            magic = f.read(4)
        except OSError as e:
            raise DataError(f"cannot read {path}: {e.strerror or e}") from None
    name = path.name.lower()
    stem, suffix = os.path.splitext(name)
    named = COMPRESSED_SUFFIXES.get(suffix)
    if named is not None:
        name = stem
    compression = "gzip" if magic[:2] == GZIP_MAGIC else "zstd" if magic == ZSTD_MAGIC else None
    if named is not None and compression != named:
        raise DataError(f"{path} has a {suffix} name but is not {named} data")
    if name.endswith(".parquet"):
        if magic != PARQUET_MAGIC:
            what = f"{compression}-compressed" if compression else "not a Parquet file (no PAR1 magic)"
            raise DataError(f"{path} is {what}; Parquet files compress internally, pass the .parquet file itself")
        if isinstance(path, RemoteFile):  # pyarrow reads by seeking: not a stream
            raise DataError(f"{path}: Parquet inputs must be local files; copy it here first, or pass JSONL")
        return InputFormat("parquet")
    kind = "jsonl" if name.endswith(JSONL_SUFFIXES) else "text"
    return InputFormat(kind, compression)


def open_raw(path: Source) -> BinaryIO:
    if isinstance(path, RemoteFile):
        return path.open()  # type: ignore[return-value]  # read, tell and close: all a reader here uses
    try:
        return open(path, "rb")
    except PermissionError:
        raise DataError(f"cannot read {path}: permission denied") from None
    except FileNotFoundError:
        raise DataError(f"input {path} does not exist") from None
    except IsADirectoryError:
        raise DataError(f"input {path} is a directory, expected a text file") from None
    except OSError as e:
        raise DataError(f"cannot read {path}: {e.strerror or e}") from None


_EXTRAS = {"parquet": ("pyarrow", "parquet"), "datasets": ("datasets", "datasets"), "zstd": ("zstandard", "zstd")}


def missing_extra(what: str, module: str, extra: str) -> XLNetError:
    return XLNetError(f"reading {what} needs the {module} package: pip install 'xlnetcli[{extra}]'")


def require_reader(fmt: InputFormat) -> None:
    if fmt.kind == "parquet":
        import_pyarrow_parquet()
    elif fmt.kind == "datasets":
        import_datasets()
    if fmt.compression == "zstd":
        zstd_module()


# Optional formats import their package on first use (here and in the readers below): pyarrow, datasets and zstandard
# are heavy, and each is an extra.
def import_pyarrow_parquet():
    try:
        import pyarrow.parquet as pq  # noqa: PLC0415 - heavy and optional (the `parquet` extra)
    except ImportError:
        raise missing_extra("Parquet files", "pyarrow", "parquet") from None
    return pq


def import_datasets():
    try:
        import datasets  # noqa: PLC0415 - heavy and optional (the `datasets` extra)
    except ImportError:
        raise missing_extra("datasets folders", "datasets", "datasets") from None
    return datasets


def zstd_module() -> tuple[Callable[[], Any], type[Exception]]:
    """(decompressor factory, the error it raises on bad data): the standard library's (Python 3.14+) or zstandard's."""
    try:
        # Python 3.14+ only; mypy checks against 3.10, where the module does not exist
        from compression import zstd  # type: ignore[import-not-found]  # noqa: PLC0415 - optional, per Python version

        return zstd.ZstdDecompressor, zstd.ZstdError
    except ImportError:
        pass
    try:
        import zstandard  # noqa: PLC0415 - optional (the `zstd` extra)
    except ImportError:
        raise missing_extra(".zst files", "zstandard", "zstd") from None
    return lambda: zstandard.ZstdDecompressor().decompressobj(), zstandard.ZstdError
