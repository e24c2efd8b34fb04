"""Training a tokenizer with the original recipe (docs/xlnet.md §1): a SentencePiece unigram model on normalised
lines, XLNet's special pieces at fixed ids (unk/bos/eos 0-2, control symbols 3-7, user-defined symbols from 8)."""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import TextIO

import sentencepiece as spm

from xlnetcli.config import Config, TokenizerConfig, save_config
from xlnetcli.core.console import byte_progress, console
from xlnetcli.core.errors import ConfigError, DataError
from xlnetcli.core.files import atomic_output_dir, check_output_dir, check_output_not_input
from xlnetcli.core.signals import sigterm_as_interrupt
from xlnetcli.data.corpus import ReadStats, expand_inputs, iter_lines, total_size
from xlnetcli.data.special import SPECIAL_PIECES
from xlnetcli.data.tokenizer.normalize import NORMALIZER, normalize_lines
from xlnetcli.data.tokenizer.spm_model import embed_options
from xlnetcli.data.tokenizer.tokenizer import SPIECE_FILE, Tokenizer, default_meta, options_hash

CONTROL_SYMBOLS = ("<cls>", "<sep>", "<pad>", "<mask>", "<eod>")
USER_DEFINED_SYMBOLS = ("<eop>", ".", "(", ")", '"', "-", "\u2013", "\u00a3", "\u20ac")
MAX_SENTENCE_BYTES = 1 << 15  # lines longer than this are skipped by the SentencePiece trainer (default 4192)


def train_tokenizer(
    cfg: Config,
    inputs: Iterable[str | os.PathLike[str]],
    out_dir: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    quiet: bool = False,
    text_field: str = "text",
) -> Tokenizer:
    """Train a SentencePiece unigram model on normalised lines of ``inputs`` into ``out_dir`` (atomic), with the
    settings of ``cfg.tokenizer`` (vocab_size, character_coverage, input_sentence_size, uncased, keep_accents,
    threads); ``cfg`` is written next to the model as config.yaml. Inputs may be text, JSONL, Parquet or datasets
    folders (data/corpus.py); ``text_field`` names their text field.
    """
    out = Path(out_dir)
    check_output_dir(out, overwrite, "a tokenizer")
    files = expand_inputs(inputs)
    check_output_not_input(out, files)
    tcfg = cfg.tokenizer
    _check_vocab_size(tcfg)
    threads = tcfg.threads or (os.cpu_count() or 1)
    stats = ReadStats()
    with sigterm_as_interrupt(), atomic_output_dir(out, overwrite, "a tokenizer") as tmp:
        model_bytes, n_lines, n_bytes = _normalize_and_train(files, Path(tmp), tcfg, stats, quiet, text_field, threads)
        options = {
            "normalizer": NORMALIZER,
            "uncased": bool(tcfg.uncased),
            "keep_accents": bool(tcfg.keep_accents),
            "digit_comma_fix": True,
        }
        model_bytes = embed_options(model_bytes, options)  # the model file carries its own normalisation
        meta = _tokenizer_meta(model_bytes, options, tcfg, n_lines, n_bytes, files, stats)
        tok = Tokenizer(model_bytes, meta, out / SPIECE_FILE)
        tok.save(tmp)
        save_config(cfg, tmp)
    return Tokenizer.load(out_dir)


def _check_vocab_size(tcfg: TokenizerConfig) -> None:
    """The vocabulary must leave SentencePiece room to learn pieces beside XLNet's fixed ones."""
    if tcfg.vocab_size <= len(SPECIAL_PIECES) + len(USER_DEFINED_SYMBOLS):  # SentencePiece needs room to learn
        raise ConfigError(
            f"tokenizer.vocab_size must be > {len(SPECIAL_PIECES) + len(USER_DEFINED_SYMBOLS)}, got {tcfg.vocab_size}"
        )


def _normalize_and_train(
    files: list[Path], tmp: Path, tcfg: TokenizerConfig, stats: ReadStats, quiet: bool, text_field: str, threads: int
) -> tuple[bytes, int, int]:
    """Pass 1 normalises every line into a temporary text file in ``tmp`` (the trainer reads it; errors surface
    here), pass 2 trains the unigram model on it; (model bytes, lines, bytes). The text file is always removed."""
    fd, norm_path = tempfile.mkstemp(prefix=".normalized.", suffix=".txt", dir=tmp)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            n_lines, n_bytes = _write_normalized(files, f, tcfg, stats, quiet, text_field)
        for w in stats.warnings():
            console.print(w)
        if n_lines == 0:
            raise DataError(f"the corpus ({len(files)} file(s)) holds no text after normalisation")
        if not quiet:
            console.print(
                f"training SentencePiece unigram: vocab {tcfg.vocab_size}, {n_lines} lines "
                f"({n_bytes / 1e6:.1f} MB), {threads} thread(s)"
            )
        model_bytes = _train_unigram(norm_path, tmp / "spiece", tcfg, threads)
    finally:
        if os.path.exists(norm_path):
            os.unlink(norm_path)
    return model_bytes, n_lines, n_bytes


def _tokenizer_meta(
    model_bytes: bytes,
    options: dict,
    tcfg: TokenizerConfig,
    n_lines: int,
    n_bytes: int,
    files: list[Path],
    stats: ReadStats,
) -> dict:
    """The tokenizer's metadata (xlnet_tokenizer.json): hash and options of the model, its vocabulary size and how
    it was trained."""
    meta = default_meta(hashlib.sha256(model_bytes).hexdigest(), options)
    meta["vocab_size"] = tcfg.vocab_size
    meta["train"] = {
        "model_type": "unigram",
        "character_coverage": tcfg.character_coverage,
        "input_sentence_size": tcfg.input_sentence_size,
        "lines": n_lines,
        "bytes": n_bytes,
        "inputs": [str(p) for p in files],
        "invalid_utf8_bytes": stats.bad_bytes,
        "control_symbols": list(CONTROL_SYMBOLS),
        "user_defined_symbols": list(USER_DEFINED_SYMBOLS),
    }
    meta["options_sha256"] = options_hash(meta)
    return meta


def _write_normalized(
    files: list[Path], f: TextIO, tcfg: TokenizerConfig, stats: ReadStats, quiet: bool, text_field: str
) -> tuple[int, int]:
    """Write the non-empty normalised lines of ``files`` to ``f`` in batches; (lines, bytes) written."""
    n_lines = n_bytes = 0
    batch: list[str] = []

    def flush() -> None:
        nonlocal n_lines, n_bytes
        norm = [s for s in normalize_lines(batch, tcfg.uncased, tcfg.keep_accents) if s]
        if norm:
            text = "\n".join(norm) + "\n"
            f.write(text)
            n_lines += len(norm)
            n_bytes += len(text)
        batch.clear()

    with byte_progress(quiet) as prog:
        task = prog.add_task("normalising", total=total_size(files), info="")
        for line in iter_lines(files, stats, on_bytes=lambda n: prog.advance(task, n), text_field=text_field):
            batch.append(line)
            if len(batch) >= 10000:
                flush()
        flush()
    return n_lines, n_bytes


def _train_unigram(norm_path: str, prefix: Path, tcfg: TokenizerConfig, threads: int) -> bytes:
    """SentencePiece's unigram trainer on the normalised text file, XLNet's pieces at their ids: the model's bytes
    (the files it writes at ``prefix`` are removed). Its failures become one-line errors saying what to change."""
    try:
        spm.SentencePieceTrainer.train(
            input=norm_path,
            model_prefix=str(prefix),
            model_type="unigram",
            vocab_size=tcfg.vocab_size,
            character_coverage=tcfg.character_coverage,
            input_sentence_size=tcfg.input_sentence_size,
            shuffle_input_sentence=True,
            control_symbols=list(CONTROL_SYMBOLS),
            user_defined_symbols=list(USER_DEFINED_SYMBOLS),
            unk_id=0,
            bos_id=1,
            eos_id=2,
            pad_id=-1,
            num_threads=threads,
            max_sentence_length=MAX_SENTENCE_BYTES,
            minloglevel=2,
        )
    except RuntimeError as e:
        msg = " ".join(str(e).split())
        if "Vocabulary size is too high" in msg or "vocab_size" in msg.lower():
            raise ConfigError(
                f"tokenizer.vocab_size {tcfg.vocab_size} is too large for this corpus "
                f"({msg.split(':')[-1].strip()}); lower --vocab-size or add text"
            ) from None
        if "sentences_.empty()" in msg:  # every line was skipped, most often for being too long
            raise DataError(
                f"no usable line for SentencePiece: every line is empty after normalisation or "
                f"longer than {MAX_SENTENCE_BYTES} bytes, which SentencePiece skips; split the "
                "text into lines (sentences or paragraphs)"
            ) from None
        raise DataError(f"SentencePiece training failed: {msg}") from None
    model_bytes = prefix.with_suffix(".model").read_bytes()
    os.unlink(prefix.with_suffix(".model"))
    vocab = prefix.with_suffix(".vocab")
    if vocab.exists():
        os.unlink(vocab)
    return model_bytes


def copy_tokenizer(src: Tokenizer | str | os.PathLike[str], dst_dir: str | os.PathLike[str]) -> Path:
    """Copy a tokenizer (object, folder or model file) into dst_dir as a complete tokenizer folder (Tokenizer.save)."""
    tok = src if isinstance(src, Tokenizer) else Tokenizer.load(src)
    return tok.save(dst_dir)
