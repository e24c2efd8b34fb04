"""`xlnet embed`: features of every text of a file, the frozen model's mean-pooled and <cls> states (of the last
layer, or of the embedding and every layer), long texts read in windows (through XLNet's memory with
``document="memory"``), written as NumPy arrays with an index, or as JSON Lines.

    res = embed("runs/tiny", "texts.tsv", "runs/tiny-emb", EmbedSettings(layers="all", document="memory"))
    mean = np.load("runs/tiny-emb/mean.npy")        # [N, n_layer + 1, d] float32, row i: the file's i-th text

The texts: a TSV / CSV / JSONL table read as finetuning reads one (``labelled.read_table``: its text column, and a
second text when the file has a pair's columns; labels not needed, an id column kept when there is one), or a
``.txt`` file, one text per line (blank lines skipped). Each is encoded exactly as finetuning encodes it
(``labelled.Reading``: ``[A <sep> B <sep> <cls>]`` in windows of ``max_seq_length`` tokens) and read as
``probe.extract_features`` reads it (model/documents.py: ``first``, ``window-mean`` or ``memory``), in batches of
similar length, the rows put back in file order. The settings left out are the checkpoint's finetune section's.

The output folder (written beside and renamed into place; nothing is written on a refusal):
- ``npy``: ``mean.npy`` / ``cls.npy`` (one per pool), float32 [N, d], or [N, n_layer + 1, d] with ``layers="all"``;
  ``index.tsv``: row, line (of the file), id (when the file has an id column), tokens (the model's input tokens,
  special ones included), windows (read), truncated (whether the text was cut to fit);
- ``jsonl``: ``embeddings.jsonl``, one object per row: the index's fields and each pool's vector (or list of vectors);
- ``meta.json`` in both: the checkpoint, the file, the settings used, the arrays' shapes and the counts.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from xlnetcli.checkpoint import lm
from xlnetcli.checkpoint.load import checkpoint_inputs
from xlnetcli.core import dist
from xlnetcli.core.console import CountProgress, print0
from xlnetcli.core.errors import DataError, XLNetError
from xlnetcli.core.files import atomic_output_dir, atomic_write_json, atomic_write_text, check_output_dir
from xlnetcli.core.shapes import dumps_strict
from xlnetcli.data import labelled
from xlnetcli.evaluate.checkpoint_eval import PRECISION_FIX, TSV_BREAKS
from xlnetcli.evaluate.probe import (
    FEATURES,
    LINEAR_MEMORY_IMPLS,
    LOWER_ALSO,
    check_features_fit,
    checkpoint_tokenizer,
    document_reading,
    extract_features,
)
from xlnetcli.model.kernels import resolve_impl

POOLS = FEATURES  # mean, cls
LAYERS = ("last", "all")
FORMATS = ("npy", "jsonl")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
JSONL_FILE = "embeddings.jsonl"
INDEX_FILE = "index.tsv"
META_FILE = "meta.json"


@dataclass(frozen=True)
class EmbedSettings:
    """How `xlnet embed` reads and writes (its options). None: the checkpoint's finetune section."""

    pool: Sequence[str] = POOLS  # mean (over the text's real tokens) and/or cls (the last <cls>)
    layers: str = "last"  # last: the last layer's states; all: the embedding, then every layer
    format: str = "npy"  # npy (an array per pool + index.tsv) or jsonl (one object per text)
    max_seq_length: int | None = None  # tokens per window
    document: str | None = None  # first, window-mean or memory (finetune.document)
    max_windows: int | None = None  # windows read per text (document != first)
    mem_len: int | None = None  # memory: states kept from earlier windows
    batch_size: int = 64  # texts per forward pass
    device: str | None = "auto"  # auto, cpu, cuda or cuda:N
    precision: str = "auto"  # auto (bf16 on a CUDA GPU with bf16, else fp32), fp32, bf16 or fp16


def check_settings(s: EmbedSettings) -> None:
    """Refuse settings that cannot work before any file is read (the options' names in the message)."""
    bad_pool = [p for p in s.pool if p not in POOLS]
    if not s.pool or bad_pool or len(set(s.pool)) != len(s.pool):
        raise XLNetError(f"--pool takes one or both of {', '.join(POOLS)}, comma-separated; got {','.join(s.pool)!r}")
    if s.layers not in LAYERS:
        raise XLNetError(f"--layers takes {' or '.join(LAYERS)}, got {s.layers!r}")
    if s.format not in FORMATS:
        raise XLNetError(f"--format takes {' or '.join(FORMATS)}, got {s.format!r}")
    if s.precision not in PRECISIONS:
        raise XLNetError(f"--precision takes {', '.join(PRECISIONS)}, got {s.precision!r}")
    if s.batch_size < 1:
        raise XLNetError(f"--batch-size must be >= 1, got {s.batch_size}")
    if s.max_seq_length is not None and s.max_seq_length < 5:
        raise XLNetError(f"--max-seq-length must be >= 5, got {s.max_seq_length}")


def read_texts(
    path: str | Path, columns: labelled.Columns | None = None, header: bool = True, id_column: str | None = None
) -> tuple[list[labelled.TextExample], tuple[str, list[str]] | None]:
    """(texts, (id column, ids) or None) of a file: a ``.txt`` file holds one text per line, any other name is a
    TSV / CSV / JSONL table (``labelled.read_table``, labels not needed)."""
    path = Path(path)
    if path.suffix.lower() == ".txt":
        asked = [c for c in astuple(columns or labelled.Columns()) if c is not None]
        if asked or id_column is not None or not header:
            raise XLNetError(
                f"{path}: a .txt file holds one text per line, no columns; --text-a-column, --text-b-column, "
                "--id-column and --no-header are for TSV / CSV / JSONL tables"
            )
        return labelled.read_lines(path), None
    parsed = labelled.parse_table(path, header)  # one read of the file for the texts and the ids
    rows = labelled.read_table(
        path, "classification", columns, header, require_label=False, labels=False, parsed=parsed
    )
    return rows, labelled.read_ids(path, header, id_column, parsed=parsed)


def row_index(
    rows: Sequence[labelled.TextExample], ids: tuple[str, list[str]] | None, enc: labelled.Encoded, window: int
) -> dict[str, np.ndarray | list[Any]]:
    """The index of the outputs, one entry per row: row, line, id (when the file has an id column), tokens (the
    model's input, special tokens included), windows read, truncated."""
    mask = enc.arrays["attention_mask"]
    windows = (mask.reshape(len(mask), -1, window) != 0).any(-1).sum(-1)
    index: dict[str, np.ndarray | list[Any]] = {
        "row": np.arange(len(rows)),
        "line": [r.line for r in rows],
    }
    if ids is not None:
        index["id"] = ids[1]
    index["tokens"] = enc.real_tokens()
    index["windows"] = windows
    index["truncated"] = enc.extra["cut"]
    return index


def _check_tsv_ids(ids: tuple[str, list[str]] | None, rows: Sequence[labelled.TextExample], path: Path) -> None:
    """An id that index.tsv would split (a tab or line break in it) is refused before any work."""
    if ids is None:
        return
    for value, row in zip(ids[1], rows, strict=True):
        if TSV_BREAKS.search(value):
            raise DataError(
                f"{path}:{row.line}: id {value!r} holds a tab or line break, which would split index.tsv; pass "
                "--format jsonl (ids kept exactly) or fix the id"
            )


def embed(
    checkpoint: str | Path,
    file: str | Path,
    out: str | Path,
    settings: EmbedSettings = EmbedSettings(),
    columns: labelled.Columns | None = None,
    header: bool = True,
    id_column: str | None = None,
    overwrite: bool = False,
    quiet: bool = False,
) -> dict[str, Any]:
    """Write the features of every text of ``file`` into the folder ``out`` (see the module's docstring); returns
    meta.json's record with ``seconds`` (the forward passes) and ``texts_per_s``. Everything is checked (settings,
    output against inputs, the file, the checkpoint, its tokenizer, the memory the attention needs) before anything
    is written; the folder appears whole or not at all. Progress goes to stderr unless ``quiet``."""
    s = settings
    check_settings(s)
    file, out = Path(file), Path(out)
    inputs = [*checkpoint_inputs(checkpoint), checkpoint, file]  # a run given whole: nothing written inside it
    check_output_dir(out, overwrite, "embeddings", inputs)
    rows, ids = read_texts(file, columns, header, id_column)
    if s.format == "npy":
        _check_tsv_ids(ids, rows, file)
    dev = dist.resolve_device(s.device)
    precision = dist.checked_precision(s.precision, dev, "--precision", print0, PRECISION_FIX)
    xl = lm.load(checkpoint, device=dev)
    tok = checkpoint_tokenizer(xl)
    reading, mem_len = document_reading(xl.config.finetune, s.max_seq_length, s.document, s.max_windows, s.mem_len)
    if resolve_impl(xl.config.model.attn_impl, dev) not in LINEAR_MEMORY_IMPLS:  # kernels that write the scores
        batch = min(s.batch_size, len(rows))
        keys = f"--max-seq-length {reading.window} or --batch-size {batch}" + LOWER_ALSO[reading.document]
        check_features_fit(xl.config.model, batch, reading, mem_len, dev, keys)
    enc = labelled.encode_texts(tok, rows, reading, "classification")
    per_layer = s.layers == "all"
    with atomic_output_dir(out, overwrite, "embeddings", inputs) as tmp:
        start = time.perf_counter()
        try:
            with CountProgress("embed", len(enc), "texts", quiet) as bar, dist.autocast_ctx(dev, precision):
                feats = extract_features(xl.model, enc, s.batch_size, bar.advance, reading, mem_len, per_layer)
        except torch.OutOfMemoryError:
            raise XLNetError(f"out of memory embedding with batch {s.batch_size}; pass --batch-size smaller") from None
        seconds = time.perf_counter() - start
        arrays = {p: feats[p].astype(np.float32) for p in s.pool}
        index = row_index(rows, ids, enc, reading.window)
        meta = {
            "kind": "embed",
            "checkpoint": str(xl.path),
            "checkpoint_kind": xl.meta.get("kind", "pretrain"),
            "step": xl.meta.get("step"),
            "file": str(file),
            "rows": len(rows),
            "id_column": None if ids is None else ids[0],
            "format": s.format,
            "files": [*(f"{p}.npy" for p in s.pool), INDEX_FILE] if s.format == "npy" else [JSONL_FILE],
            "pool": list(s.pool),
            "layers": s.layers,
            "layer_names": ["embedding", *(f"layer_{i + 1}" for i in range(xl.config.model.n_layer))]
            if per_layer
            else [f"layer_{xl.config.model.n_layer}"],
            "shape": {p: list(a.shape) for p, a in arrays.items()},
            "d_model": xl.config.model.d_model,
            "max_seq_length": reading.window,
            "document": reading.document,
            "max_windows": reading.max_windows,
            "mem_len": mem_len if reading.document == "memory" else None,
            "precision": precision,
            "batch_size": s.batch_size,
            "truncated": enc.n_truncated,
            "blank": enc.extra["blank"],
        }
        if s.format == "npy":
            for p, a in arrays.items():
                np.save(tmp / f"{p}.npy", a)
            atomic_write_text(tmp / INDEX_FILE, _index_tsv(index))
        else:
            atomic_write_text(tmp / JSONL_FILE, _jsonl(index, arrays))
        atomic_write_json(tmp / META_FILE, meta)
    return {**meta, "out": str(out), "seconds": seconds, "texts_per_s": len(rows) / max(seconds, 1e-9)}


def _cell(value: Any) -> Any:
    """A numpy scalar as the plain Python value JSON and TSV write."""
    return value.item() if isinstance(value, np.generic) else value


def _tsv_cell(value: Any) -> str:
    value = _cell(value)
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _index_tsv(index: dict[str, np.ndarray | list[Any]]) -> str:
    """index.tsv: a header, then one line per row (truncated as true / false)."""
    lines = ["\t".join(index)]
    lines += ["\t".join(_tsv_cell(v[i]) for v in index.values()) for i in range(len(index["row"]))]
    return "\n".join(lines) + "\n"


def _jsonl(index: dict[str, np.ndarray | list[Any]], arrays: dict[str, np.ndarray]) -> str:
    """One object per row: the index's fields, then each pool's vector (float32 values, written exactly)."""
    out = []
    for i in range(len(index["row"])):
        obj = {k: _cell(v[i]) for k, v in index.items()}
        obj.update({p: a[i].tolist() for p, a in arrays.items()})
        out.append(dumps_strict(obj, ensure_ascii=False) + "\n")
    return "".join(out)


def format_summary(res: dict[str, Any]) -> str:
    """The line `xlnet embed` ends with."""
    shapes = ", ".join(f"{name} [{', '.join(map(str, shape))}]" for name, shape in res["shape"].items())
    cut = f", {res['truncated']} truncated" if res["truncated"] else ""
    return (
        f"embedded {res['rows']:,} texts ({res['document']}, {res['max_seq_length']}-token windows{cut}) -> "
        f"{res['out']} ({res['format']}: {shapes}) in {res['seconds']:.1f}s, {res['texts_per_s']:,.1f} texts/s"
    )
