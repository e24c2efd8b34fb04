"""Corpus sharding: text files -> N balanced, memory-mappable shards of token ids + sentence ids (docs/xlnet.md §2).

Pipeline (streaming, memory bounded by a few chunks whatever the corpus size):
  parent: read files in order -> decode UTF-8 (replace-and-count) -> cut ~256 KiB chunks at blank lines
  workers (the parent + workers-1 helper processes; the parent encodes a chunk when the helpers are busy):
           normalise + batch-encode a chunk -> flat token ids with one <eod> per document, sentence parity, doc sizes
  parent: takes results in chunk order; assigns each document to valid (hash of (seed, document index) <
          valid_fraction, or every document of a --valid file) or to the train shard with the fewest tokens so far;
          appends it to that shard's .npy files.
Chunk boundaries, document indices and the assignment depend only on the inputs, the tokenizer and the seed, never on
the number of workers: the output is byte-identical for any --workers.

Output directory (the shard format, read back by shard_format.py; atomic: written to a temporary sibling, renamed into
place on success):
  manifest.json, config.yaml, tokenizer/, train/shard_NNNNN.{tokens,sentid}.npy, valid/shard_00000.{tokens,sentid}.npy
Sentence ids (uint8 0/1) flip at every input line, continuing across documents within a shard; a document's <eod>
shares the id of its last line.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import compress
from pathlib import Path
from typing import Any

import numpy as np

from xlnetcli.config import Config, replace, save_config
from xlnetcli.core.console import byte_progress, console
from xlnetcli.core.errors import DataError, XLNetError
from xlnetcli.core.files import (
    atomic_output_dir,
    atomic_write_json,
    check_output_dir,
    check_output_not_input,
    ensure_open_files,
    is_disk_full,
    sha256_file,
)
from xlnetcli.core.signals import sigterm_as_interrupt
from xlnetcli.core.workers import ordered_map
from xlnetcli.data.corpus.inputs import Source, expand_inputs, local_paths, source_key, total_size
from xlnetcli.data.corpus.reader import FileStats, ReadStats, iter_chunks
from xlnetcli.data.shards.format import FORMAT_VERSION, NpyStreamWriter
from xlnetcli.data.special import EOD_ID
from xlnetcli.data.tokenizer import Tokenizer, combining_table, normalize_block

CHUNK_CHARS = 1 << 18  # ~256 KiB of text per work item: thousands of lines per SentencePiece batch, little IPC


# ---------------------------------------------------------------------------------------------------------------------
# worker side


@dataclass
class ChunkResult:
    tokens: np.ndarray  # output dtype, <eod> after each document
    sentid: np.ndarray  # uint8 line parity within each document (document's first line = 0)
    doc_tokens: np.ndarray  # int64 tokens per document (incl. <eod>)
    doc_lines: np.ndarray  # int64 lines (sentences) per document
    n_chars: int


def encode_chunk(tok: Tokenizer, text: str, dtype: np.dtype) -> ChunkResult:
    """Normalise and encode one chunk of corpus text (documents separated by blank lines)."""
    lines = normalize_block(text, tok.uncased, tok.keep_accents)
    line_len = np.fromiter(map(len, lines), dtype=np.int64, count=len(lines))
    nonempty = line_len > 0
    n = int(nonempty.sum())
    if n == 0:
        z = np.zeros(0, np.int64)
        return ChunkResult(np.zeros(0, dtype), np.zeros(0, np.uint8), z, z, len(text))
    # A document starts at a non-empty line preceded by a blank line (or the chunk start).
    starts = nonempty.copy()
    starts[1:] &= ~nonempty[:-1]
    starts = starts[nonempty]  # per non-empty line
    doc_of_line = np.cumsum(starts) - 1
    first_line = np.flatnonzero(starts)
    n_docs = first_line.size
    parity = ((np.arange(n) - first_line[doc_of_line]) & 1).astype(np.uint8)

    flat, tok_len = tok.encode_normalized_batch(list(compress(lines, nonempty.tolist())))
    doc_lines = np.bincount(doc_of_line, minlength=n_docs).astype(np.int64)
    last_line = np.cumsum(doc_lines) - 1
    line_end = np.cumsum(tok_len)  # token offset just past each line
    doc_end = line_end[last_line]  # where each document's <eod> goes (before the insertion)
    tokens = np.insert(flat.astype(dtype, copy=False), doc_end, EOD_ID)
    sentid = np.insert(np.repeat(parity, tok_len), doc_end, parity[last_line])
    doc_tokens = np.diff(doc_end, prepend=0) + 1
    return ChunkResult(tokens, sentid, doc_tokens, doc_lines, len(text))


_WORKER: tuple[Tokenizer, np.dtype] | None = None


def _init_worker(model_bytes: bytes, meta: dict[str, Any], dtype: str) -> None:
    global _WORKER
    _WORKER = (Tokenizer(model_bytes, meta), np.dtype(dtype))
    _WORKER[0].fix_mask  # noqa: B018 - build the lookup once per worker


def _work(chunk: tuple[str, bool]) -> tuple[ChunkResult, bool]:
    assert _WORKER is not None
    return encode_chunk(_WORKER[0], chunk[0], _WORKER[1]), chunk[1]


# ---------------------------------------------------------------------------------------------------------------------
# output


class _Shard:
    """One output shard: tokens + sentid writers, counters and the running sentence parity."""

    def __init__(self, directory: Path, split: str, index: int, dtype: np.dtype) -> None:
        self.rel_tokens = f"{split}/shard_{index:05d}.tokens.npy"
        self.rel_sentid = f"{split}/shard_{index:05d}.sentid.npy"
        self.tokens = NpyStreamWriter(directory / self.rel_tokens, dtype)
        self.sentid = NpyStreamWriter(directory / self.rel_sentid, np.uint8)
        self.n_tokens = 0
        self.n_sentences = 0
        self.n_documents = 0
        self.last_sent = 1  # so that the first line of the shard gets sentence id 0

    def close(self) -> None:
        self.tokens.close()
        self.sentid.close()

    def entry(self, directory: Path) -> dict[str, Any]:
        return {
            "tokens_file": self.rel_tokens,
            "sentid_file": self.rel_sentid,
            "tokens": self.n_tokens,
            "sentences": self.n_sentences,
            "documents": self.n_documents,
            "sha256": {
                "tokens": sha256_file(directory / self.rel_tokens),
                "sentid": sha256_file(directory / self.rel_sentid),
            },
        }


def _uniform_hash(seed: int, index: np.ndarray) -> np.ndarray:
    """splitmix64 of (seed, document index) -> float64 in [0, 1). Deterministic across platforms."""
    with np.errstate(over="ignore"):
        x = index.astype(np.uint64) + np.uint64((seed * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF)
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return (x >> np.uint64(11)).astype(np.float64) / float(1 << 53)


class _Assigner:
    """Routes documents of each chunk result to shards, in order; keeps the shards balanced by tokens."""

    def __init__(self, train: list[_Shard], valid: _Shard, seed: int, valid_fraction: float) -> None:
        self.train = train
        self.valid = valid
        self.seed = seed
        self.valid_fraction = valid_fraction
        self.doc_index = 0  # global document counter over the whole input, in input order
        self.lines_total = 0

    def add(self, res: ChunkResult, force_valid: bool) -> None:
        nd = res.doc_tokens.size
        if nd == 0:
            return
        to_valid = self._to_valid(nd, force_valid)
        self.doc_index += nd
        self.lines_total += int(res.doc_lines.sum())
        target = self._targets(to_valid, res.doc_tokens)
        order = np.argsort(target, kind="stable")  # documents grouped by shard, input order within each
        per_docs = np.bincount(target, minlength=len(self.train) + 1)
        per_tok = np.bincount(target, weights=res.doc_tokens, minlength=len(self.train) + 1).astype(np.int64).tolist()
        sentid = self._continue_sentences(res, target, order, per_docs, per_tok)
        self._write(res, sentid, order, per_docs, per_tok)

    def _shard(self, t: int) -> _Shard:
        """Target index -> shard: the train shards, then the valid one (index len(train))."""
        return self.valid if t == len(self.train) else self.train[t]

    def _to_valid(self, nd: int, force_valid: bool) -> np.ndarray:
        """Which of the next ``nd`` documents go to the valid split: all of a --valid file's, else a seeded hash of the
        document index below valid_fraction."""
        if force_valid:
            return np.ones(nd, dtype=bool)
        if self.valid_fraction > 0:
            return _uniform_hash(self.seed, np.arange(self.doc_index, self.doc_index + nd)) < self.valid_fraction
        return np.zeros(nd, dtype=bool)

    def _targets(self, to_valid: np.ndarray, doc_tokens: np.ndarray) -> np.ndarray:
        """Target shard per document. Greedy balance: each train document goes to the shard with the fewest tokens so
        far (the first such shard). Sequential by nature; the loop does only that, the rest is vectorised per shard."""
        n_train = len(self.train)
        if n_train == 1:
            return np.where(to_valid, 1, 0).astype(np.int64)
        tl: list[int] = [0] * to_valid.size
        loads = [s.n_tokens for s in self.train]
        index, mn = loads.index, min
        for d, (v, n) in enumerate(zip(to_valid.tolist(), doc_tokens.tolist(), strict=True)):
            if v:
                tl[d] = n_train
            else:
                m = mn(loads)
                t = index(m)
                loads[t] = m + n
                tl[d] = t
        return np.asarray(tl, dtype=np.int64)

    def _continue_sentences(
        self, res: ChunkResult, target: np.ndarray, order: np.ndarray, per_docs: np.ndarray, per_tok: list[int]
    ) -> np.ndarray:
        """The chunk's sentence ids as they continue in each shard, and the shards' counters advanced.

        Sentence ids continue across documents within a shard: a document's first line differs from the shard's
        previous token. flip[d] = 1 - (shard's last id before d) = XOR over the shard's earlier documents."""
        n_train = len(self.train)
        # last-line parity within each document = parity of its <eod> (relative ids, first line 0)
        last_rel = res.sentid[res.doc_tokens.cumsum() - 1].astype(np.int64)
        gb = np.concatenate([[0], np.cumsum(per_docs)]).tolist()
        per_lines = np.bincount(target, weights=res.doc_lines, minlength=n_train + 1).astype(np.int64).tolist()
        flip = np.empty(res.doc_tokens.size, dtype=np.uint8)
        for t in np.flatnonzero(per_docs).tolist():
            sh = self._shard(t)
            idx = order[gb[t] : gb[t + 1]]
            g = 1 ^ last_rel[idx]
            f = ((1 - sh.last_sent) ^ (np.cumsum(g) - g)) & 1
            flip[idx] = f
            sh.last_sent = int(last_rel[idx[-1]] ^ f[-1])
            sh.n_tokens += per_tok[t]
            sh.n_sentences += per_lines[t]
            sh.n_documents += gb[t + 1] - gb[t]
        return res.sentid ^ np.repeat(flip, res.doc_tokens)

    def _write(
        self, res: ChunkResult, sentid: np.ndarray, order: np.ndarray, per_docs: np.ndarray, per_tok: list[int]
    ) -> None:
        """Append each shard's documents (in input order) to its files."""
        used = np.flatnonzero(per_docs).tolist()
        if len(used) == 1:
            parts = {used[0]: (res.tokens, sentid)}
        else:  # one gather puts each shard's documents (in order) next to each other
            doc_off = np.concatenate([[0], np.cumsum(res.doc_tokens)]).tolist()
            lens = res.doc_tokens[order]
            starts = np.asarray(doc_off[:-1], dtype=np.int64)[order]
            idx = np.arange(int(lens.sum()), dtype=np.int64) + np.repeat(starts - (np.cumsum(lens) - lens), lens)
            toks, sids = res.tokens[idx], sentid[idx]
            bounds = np.concatenate([[0], np.cumsum(per_tok)]).tolist()
            parts = {t: (toks[bounds[t] : bounds[t + 1]], sids[bounds[t] : bounds[t + 1]]) for t in used}
        for t, (tk, sd) in parts.items():
            sh = self._shard(t)
            sh.tokens.write(tk)
            sh.sentid.write(sd)


# ---------------------------------------------------------------------------------------------------------------------
# the command


@dataclass
class ShardSummary:
    out_dir: Path
    files: int
    bytes: int
    seconds: float
    tokens: dict[str, int]
    documents: dict[str, int]
    invalid_utf8_bytes: int

    @property
    def mb_per_s(self) -> float:
        return self.bytes / 1e6 / max(self.seconds, 1e-9)

    @property
    def tokens_per_s(self) -> float:
        return sum(self.tokens.values()) / max(self.seconds, 1e-9)


def _chunk_stream(
    files: list[tuple[Source, bool]], stats: ReadStats, chunk_chars: int, on_bytes, text_field: str = "text"
) -> Iterator[tuple[str, bool]]:
    for path, is_valid in files:
        fs = FileStats(path)
        stats.files.append(fs)
        for text in iter_chunks(path, fs, chunk_chars, on_bytes=on_bytes, text_field=text_field):
            yield text, is_valid


def prepare_inputs(
    cfg: Config,
    inputs: Iterable[str | os.PathLike[str]],
    out_dir: str | os.PathLike[str],
    tokenizer: str | os.PathLike[str] | Tokenizer,
    options: ShardOptions,
    what: str = "shards",
) -> tuple[Config, Path, Tokenizer, list[Source], list[Source]]:
    """Checks and inputs of a sharding run (whole or a part): (cfg, the output folder, the tokenizer, train files,
    valid files); with --valid files, valid_fraction is 0 (they are the validation split)."""
    _check_counts(options.shards, options.workers)
    out = Path(out_dir)
    check_output_dir(out, options.overwrite, what)
    tok = tokenizer if isinstance(tokenizer, Tokenizer) else Tokenizer.load(tokenizer)
    tok_path = None if isinstance(tokenizer, Tokenizer) else Path(tokenizer)
    train_files, valid_files = _input_files(inputs, options.valid_inputs, out, tok_path)
    if valid_files:
        cfg = replace(cfg, data={"valid_fraction": 0.0})
    return cfg, out, tok, train_files, valid_files


@contextlib.contextmanager
def shard_output(out: Path, options: ShardOptions, what: str) -> Iterator[tuple[Path, Any]]:
    """(the temporary folder renamed to ``out`` when the block succeeds, the progress bar); SIGTERM as an interrupt,
    a full disk or a folder we may not write to as one line."""
    with (
        _write_errors(out),
        sigterm_as_interrupt(),
        atomic_output_dir(out, options.overwrite, what) as tmp,
        byte_progress(options.quiet) as prog,
    ):
        yield tmp, prog


def token_dtype(tok: Tokenizer) -> np.dtype:
    """uint16 ids when the vocabulary fits, else uint32."""
    return np.dtype(np.uint16) if tok.vocab_size <= 1 << 16 else np.dtype(np.uint32)


@dataclass(frozen=True)
class ShardOptions:
    """How `xlnet shard` runs, besides its config and paths (the command's options)."""

    shards: int = 1  # train shards written (the valid split is one more)
    workers: int = 1  # tokenisation processes
    valid_inputs: Iterable[str | os.PathLike[str]] = ()  # the validation split's files, instead of data.valid_fraction
    text_field: str = "text"  # the field (JSONL) or column (Parquet, datasets) holding each document's text
    overwrite: bool = False  # replace an existing output folder
    quiet: bool = False  # no progress bar
    chunk_chars: int = CHUNK_CHARS  # characters of text per work item (tests make it small)


def shard_corpus(
    cfg: Config,
    inputs: Iterable[str | os.PathLike[str]],
    out_dir: str | os.PathLike[str],
    tokenizer: str | os.PathLike[str] | Tokenizer,
    options: ShardOptions = ShardOptions(),
) -> ShardSummary:
    """Tokenise ``inputs`` into ``shards`` train shards (+ a valid shard) under ``out_dir``; see the module doc.

    ``cfg.data.valid_fraction`` of the documents are held out for validation (none with ``options.valid_inputs``,
    which are the validation split instead), chosen by ``cfg.data.seed``; ``cfg`` is saved as config.yaml. Inputs may
    be text, JSONL, Parquet or datasets folders (data/corpus/reader.py); ``options.text_field`` names their text
    field."""
    o = options
    cfg, out, tok, train_files, valid_files = prepare_inputs(cfg, inputs, out_dir, tokenizer, o)
    all_files = [(p, False) for p in train_files] + [(p, True) for p in valid_files]
    dtype = token_dtype(tok)
    nbytes = total_size(p for p, _ in all_files)
    stats = ReadStats()
    t0 = time.perf_counter()
    with shard_output(out, o, "shards") as (tmp, prog):
        (tmp / "train").mkdir()
        (tmp / "valid").mkdir()
        train = [_Shard(tmp, "train", i, dtype) for i in range(o.shards)]
        valid = _Shard(tmp, "valid", 0, dtype)
        assigner = _Assigner(train, valid, cfg.data.seed, cfg.data.valid_fraction)
        _shard_pass(all_files, stats, o, tok, assigner, prog, nbytes)
        for s in [*train, valid]:
            s.close()
        for w in stats.warnings():
            console.print(w)
        _check_split(assigner, len(all_files), o.quiet)
        _finish_output(tmp, cfg, tok, dtype, assigner, {"train": train_files, "valid": valid_files}, nbytes, stats)
    return _summary(out, len(all_files), nbytes, time.perf_counter() - t0, train, valid, stats)


def _check_counts(shards: int, workers: int) -> None:
    """Reject shard and worker counts below 1, and raise the open-file limit the shards and workers need."""
    if shards < 1:
        raise XLNetError(f"--shards must be >= 1, got {shards}")
    if workers < 1:
        raise XLNetError(f"--workers must be >= 1, got {workers}")
    ensure_open_files(2 * (shards + 1) + 4 * workers + 64, f"--shards {shards}")  # each shard: 2 files open


def _shard_pass(
    all_files: list[tuple[Source, bool]],
    stats: ReadStats,
    options: ShardOptions,
    tok: Tokenizer,
    assigner: _Assigner,
    prog: Any,
    nbytes: int,
) -> None:
    """Read, tokenise and assign every chunk of the inputs to the shards, in order, updating the progress bar."""
    task = prog.add_task("sharding", total=nbytes, info="")
    n_tok = 0

    def assign(res: ChunkResult, is_valid: bool) -> None:
        nonlocal n_tok
        assigner.add(res, is_valid)
        n_tok += res.tokens.size
        prog.update(task, info=f"{n_tok / 1e6:.2f}M tokens")

    chunks = _chunk_stream(all_files, stats, options.chunk_chars, lambda n: prog.advance(task, n), options.text_field)
    _encode_in_order(chunks, tok, token_dtype(tok), options.workers, assign)


def _summary(
    out: Path, n_files: int, nbytes: int, seconds: float, train: list[_Shard], valid: _Shard, stats: ReadStats
) -> ShardSummary:
    """What ``shard_corpus`` returns: files, bytes, time, then tokens and documents per split."""
    return ShardSummary(
        out,
        n_files,
        nbytes,
        seconds,
        {"train": sum(s.n_tokens for s in train), "valid": valid.n_tokens},
        {"train": sum(s.n_documents for s in train), "valid": valid.n_documents},
        stats.bad_bytes,
    )


def _input_files(
    inputs: Iterable[str | os.PathLike[str]],
    valid_inputs: Iterable[str | os.PathLike[str]],
    out_dir: Path,
    tok_path: Path | None,
) -> tuple[list[Source], list[Source]]:
    """(train files, --valid files), expanded; refuses an output among the inputs and a file in both lists."""
    valid_inputs = list(valid_inputs)
    train_files = expand_inputs(inputs)
    valid_files = expand_inputs(valid_inputs) if valid_inputs else []
    check_output_not_input(out_dir, local_paths([*train_files, *valid_files, tok_path]))
    valid_set = {source_key(p) for p in valid_files}
    overlap = [p for p in train_files if source_key(p) in valid_set]
    if overlap:
        raise DataError(f"{overlap[0]} is both a training input and a --valid file")
    return train_files, valid_files


def _encode_in_order(
    chunks: Iterable[tuple[str, bool]],
    tok: Tokenizer,
    dtype: np.dtype,
    workers: int,
    assign: Callable[[ChunkResult, bool], None],
) -> None:
    """Encode every chunk with ``workers`` encoders (this process and ``workers - 1`` helpers, core/workers.py) and
    pass each result to ``assign`` in input order."""
    tok.fix_mask  # noqa: B018 - built once here, inherited by forked helpers
    combining_table()

    def here(chunk: tuple[str, bool]) -> tuple[ChunkResult, bool]:
        return encode_chunk(tok, chunk[0], dtype), chunk[1]

    init = (tok.model_bytes, tok.meta, dtype.str)
    for res, is_valid in ordered_map(
        _work, chunks, helpers=workers - 1, local=here, initializer=_init_worker, initargs=init
    ):
        assign(res, is_valid)


def _check_split(assigner: _Assigner, n_files: int, quiet: bool) -> None:
    """Refuse a corpus without text, an empty train split or an empty train shard; warn of an empty valid split."""
    n_docs = assigner.doc_index
    if n_docs == 0:
        raise DataError(f"the corpus ({n_files} file(s)) holds no text: nothing to shard")
    if sum(s.n_tokens for s in assigner.train) == 0:
        raise DataError("every document went to the validation split; lower --valid-fraction")
    if any(s.n_documents == 0 for s in assigner.train):
        raise DataError(f"only {n_docs} document(s) for {len(assigner.train)} shards; use fewer --shards")
    if assigner.valid_fraction > 0 and assigner.valid.n_documents == 0 and not quiet:
        console.print(
            f"warning: no document fell into the validation split (valid_fraction "
            f"{assigner.valid_fraction}, {n_docs} documents)"
        )


def _finish_output(
    tmp: Path,
    cfg: Config,
    tok: Tokenizer,
    dtype: np.dtype,
    assigner: _Assigner,
    inputs: dict[str, list[Source]],
    nbytes: int,
    stats: ReadStats,
) -> None:
    """Write manifest.json, the tokenizer and config.yaml beside the closed shards (no valid files if none)."""
    tok.save(tmp / "tokenizer")
    save_config(cfg, tmp)
    write_manifest(tmp, tok.sha256, tok.vocab_size, dtype, assigner, inputs, nbytes, stats.bad_bytes)


def write_manifest(
    tmp: Path,
    tokenizer_sha256: str,
    vocab_size: int,
    dtype: np.dtype,
    assigner: _Assigner,
    inputs: dict[str, list[Source]] | dict[str, list[str]],
    nbytes: int,
    bad_bytes: int,
) -> None:
    """manifest.json of the closed shards (and the empty valid files removed if no document went there); the same
    bytes whether one host sharded or `xlnet shard-merge` combined parts (data/shards/parts.py)."""
    train, valid = assigner.train, assigner.valid
    manifest = {
        "format_version": FORMAT_VERSION,
        "tokenizer_sha256": tokenizer_sha256,
        "vocab_size": vocab_size,
        "dtype": dtype.name,
        "seed": assigner.seed,
        "valid_fraction": assigner.valid_fraction,
        "splits": {"train": [s.entry(tmp) for s in train], "valid": [valid.entry(tmp)] if valid.n_documents else []},
        "inputs": {split: [str(p) for p in files] for split, files in inputs.items()},
        "bytes": nbytes,
        "invalid_utf8_bytes": bad_bytes,
    }
    if not valid.n_documents:
        for rel in (valid.rel_tokens, valid.rel_sentid):
            (tmp / rel).unlink()
    atomic_write_json(tmp / "manifest.json", manifest)


@contextlib.contextmanager
def _write_errors(out: Path) -> Iterator[None]:
    """A full disk or a folder we may not write to, as one line."""
    try:
        yield
    except OSError as e:
        if is_disk_full(e):
            raise XLNetError(
                f"disk full while writing shards to {out}; free space and rerun (nothing was written)"
            ) from None
        if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise XLNetError(f"cannot write to {out}: {e.strerror}") from None
        raise


__all__ = ["CHUNK_CHARS", "ShardSummary", "encode_chunk", "shard_corpus"]
