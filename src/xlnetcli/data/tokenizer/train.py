"""Training a tokenizer with the original recipe (docs/xlnet.md §1): a SentencePiece unigram model on normalised
lines, XLNet's special pieces at fixed ids (unk/bos/eos 0-2, control symbols 3-7, user-defined symbols from 8)."""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path

import sentencepiece as spm

from xlnetcli.config import Config, TokenizerConfig, save_config
from xlnetcli.core.console import byte_progress, console
from xlnetcli.core.errors import ConfigError, DataError
from xlnetcli.core.files import atomic_output_dir, check_output_dir, check_output_not_input
from xlnetcli.core.signals import sigterm_as_interrupt
from xlnetcli.data.corpus.inputs import Source, expand_inputs, local_paths, total_size
from xlnetcli.data.corpus.reader import ReadStats
from xlnetcli.data.special import SPECIAL_PIECES
from xlnetcli.data.tokenizer.normalize import NORMALIZER
from xlnetcli.data.tokenizer.sample import Sample, SampleLimits, iter_line_blocks, sample_corpus
from xlnetcli.data.tokenizer.spm_model import embed_options, set_trainer_strings
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
    workers: int = 1,
) -> Tokenizer:
    """Train a SentencePiece unigram model on normalised lines of ``inputs`` into ``out_dir`` (atomic), with the
    settings of ``cfg.tokenizer`` (vocab_size, character_coverage, input_sentence_size, uncased, keep_accents,
    input_sentence_bytes, seed, uncased, keep_accents, threads); ``cfg`` is written next to the model as config.yaml.
    Inputs may be text, JSONL, Parquet or datasets folders (data/corpus/reader.py); ``text_field`` names their
    text field.
    The corpus is normalised in ``workers`` processes and sampled while it is read (sample.py): only the sample is
    written to disk, and the model is the same for any ``workers``.
    """
    out = Path(out_dir)
    check_output_dir(out, overwrite, "a tokenizer")
    files = expand_inputs(inputs)
    check_output_not_input(out, local_paths(files))
    tcfg = cfg.tokenizer
    _check_vocab_size(tcfg)
    stats = ReadStats()
    with sigterm_as_interrupt(), atomic_output_dir(out, overwrite, "a tokenizer") as tmp:
        model_bytes, sample = _sample_and_train(files, Path(tmp), tcfg, stats, quiet, text_field, workers)
        options = {
            "normalizer": NORMALIZER,
            "uncased": bool(tcfg.uncased),
            "keep_accents": bool(tcfg.keep_accents),
            "digit_comma_fix": True,
        }
        model_bytes = embed_options(model_bytes, options)  # the model file carries its own normalisation
        meta = _tokenizer_meta(model_bytes, options, tcfg, sample, files, stats)
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


def _sample_and_train(
    files: list[Source], tmp: Path, tcfg: TokenizerConfig, stats: ReadStats, quiet: bool, text_field: str, workers: int
) -> tuple[bytes, Sample]:
    """Normalise the corpus in ``workers`` processes while drawing the sample (sample.py), write only the sample to
    a temporary file in ``tmp`` and train the unigram model on it; (model bytes, sample). The file is removed."""
    lim = SampleLimits(tcfg.input_sentence_size, tcfg.input_sentence_bytes, tcfg.seed, MAX_SENTENCE_BYTES)
    with byte_progress(quiet) as prog:
        task = prog.add_task("normalising", total=total_size(files), info="")
        blocks = iter_line_blocks(files, stats, lambda n: prog.advance(task, n), text_field)
        sample = sample_corpus(blocks, lim, tcfg.uncased, tcfg.keep_accents, workers)
    for w in stats.warnings():
        console.print(w)
    if sample.corpus_lines == 0:
        raise DataError(f"the corpus ({len(files)} file(s)) holds no text after normalisation")
    if not sample.lines:  # every line was too long for SentencePiece
        raise DataError(
            f"no usable line for SentencePiece: every line is longer than {MAX_SENTENCE_BYTES} bytes, which "
            "SentencePiece skips; split the text into lines (sentences or paragraphs)"
        )
    threads = tcfg.threads or (os.cpu_count() or 1)
    if not quiet:
        console.print(
            f"training SentencePiece unigram: vocab {tcfg.vocab_size}, sample of {len(sample.lines)} of "
            f"{sample.corpus_lines} lines ({sample.nbytes / 1e6:.1f} MB), {threads} thread(s)"
        )
    fd, path = tempfile.mkstemp(prefix=".sample.", suffix=".txt", dir=tmp)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write("\n".join(sample.lines) + "\n")
        sample.lines = []  # the trainer's copy is the only one from here
        model_bytes = _train_unigram(path, tmp / "spiece", tcfg, threads)
    finally:
        os.unlink(path)
    return model_bytes, sample


def _tokenizer_meta(
    model_bytes: bytes,
    options: dict,
    tcfg: TokenizerConfig,
    sample: Sample,
    files: list[Source],
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
        "input_sentence_bytes": tcfg.input_sentence_bytes,
        "seed": tcfg.seed,
        "lines": sample.corpus_lines,  # non-empty normalised lines of the corpus
        "bytes": sample.corpus_chars,  # their characters, a newline each
        "sample_lines": sample.n_sample_lines,
        "sample_bytes": sample.nbytes,  # UTF-8
        "too_long_lines": sample.too_long,
        "inputs": [str(p) for p in files],
        "invalid_utf8_bytes": stats.bad_bytes,
        "control_symbols": list(CONTROL_SYMBOLS),
        "user_defined_symbols": list(USER_DEFINED_SYMBOLS),
    }
    meta["options_sha256"] = options_hash(meta)
    return meta


# SentencePiece's refusals of a vocabulary size: fewer pieces than the characters it must keep ("... 500 vs 3004"),
# or more than the corpus can give ("Vocabulary size too high (N). Please set it to a value <= M.")
_TOO_SMALL = re.compile(r"Vocabulary size is smaller than required_chars\. (\d+) vs (\d+)")
_TOO_HIGH = re.compile(r"Please set it to a value <= (\d+)")


def _train_unigram(norm_path: str, prefix: Path, tcfg: TokenizerConfig, threads: int) -> bytes:
    """SentencePiece's unigram trainer on the sample file (all of it: it holds at most input_sentence_size lines),
    XLNet's pieces at their ids: the model's bytes (the files it writes at ``prefix`` are removed). Its failures become
    one-line errors saying what to change."""
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
        small = _TOO_SMALL.search(msg)
        if small:  # every character kept at character_coverage is a piece of its own: CJK text has thousands
            raise ConfigError(
                f"tokenizer.vocab_size {tcfg.vocab_size} is too small for the characters of this corpus: at "
                f"character_coverage {tcfg.character_coverage} each character kept is a piece, {small[2]} pieces at "
                "least (CJK text has thousands of characters); raise --vocab-size to more than that, or lower "
                "--character-coverage (e.g. 0.9995: the rarest characters become <unk>)"
            ) from None
        if "Vocabulary size is too high" in msg or "vocab_size" in msg.lower():
            most = _TOO_HIGH.search(msg)
            limit = f"at most {most[1]} pieces" if most else msg.split(":")[-1].strip()
            raise ConfigError(
                f"tokenizer.vocab_size {tcfg.vocab_size} is too large for this corpus ({limit}); lower --vocab-size "
                "or add text"
            ) from None
        if "sentences_.empty()" in msg:  # every line was skipped, most often for being too long
            raise DataError(
                f"no usable line for SentencePiece: every line is empty after normalisation or "
                f"longer than {MAX_SENTENCE_BYTES} bytes, which SentencePiece skips; split the "
                "text into lines (sentences or paragraphs)"
            ) from None
        raise DataError(f"SentencePiece training failed: {msg}") from None
    # the temporary paths recorded in the model would make its bytes differ from run to run
    model_bytes = set_trainer_strings(prefix.with_suffix(".model").read_bytes(), {1: "sample.txt", 2: "spiece"})
    os.unlink(prefix.with_suffix(".model"))
    vocab = prefix.with_suffix(".vocab")
    if vocab.exists():
        os.unlink(vocab)
    return model_bytes


def copy_tokenizer(src: Tokenizer | str | os.PathLike[str], dst_dir: str | os.PathLike[str]) -> Path:
    """Copy a tokenizer (object, folder or model file) into dst_dir as a complete tokenizer folder (Tokenizer.save)."""
    tok = src if isinstance(src, Tokenizer) else Tokenizer.load(src)
    return tok.save(dst_dir)
