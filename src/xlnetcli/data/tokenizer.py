"""SentencePiece unigram tokenizer with XLNet's fixed ids and the original text normalisation (docs/xlnet.md §1).

A tokenizer folder holds
- ``spiece.model``: the SentencePiece model. Models trained here carry their normalisation options (uncased,
  keep_accents, digit-comma fix) inside the model file itself, in an extension field of its normalizer spec
  (SentencePiece reserves field numbers >= 200 for third parties; SentencePiece and transformers ignore it), so the
  options cannot be separated from the model.
- ``xlnet_tokenizer.json``: the same options, the sha256 of ``spiece.model``, a hash of the options and how the model
  was trained. A model swapped or an option edited by hand is refused on load. (Folders written before used the name
  ``tokenizer.json`` for this file; it is still read.)
- ``tokenizer.json`` + ``tokenizer_config.json``: the same tokenizer for Hugging Face (`tokenizers` format, loaded by
  ``AutoTokenizer.from_pretrained(folder)``), built here to give our ids (``hf_tokenizer_json``).

Normalisation (the original ``preprocess_text``), applied to every line before training and before encoding:
collapse whitespace (strip, split, join with one space); ``\u0060\u0060`` and ``''`` become ``"``; unless keep_accents:
NFKD and drop combining marks; if uncased: lowercase. SentencePiece's own NFKC rule (stored inside the model) follows.
After encoding, the digit-comma fix re-encodes a piece such as ``▁2000,`` as ``▁2000`` + ``,``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import string
import struct
import sys
import tempfile
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np

from xlnetcli.config import Config, save_config
from xlnetcli.core.errors import ConfigError, DataError
from xlnetcli.data.special import BOS_ID, CLS_ID, EOD_ID, EOS_ID, MASK_ID, PAD_ID, SEP_ID, SPECIAL_PIECES, UNK_ID

FORMAT_VERSION = 1
NORMALIZER = "xlnet-preprocess-text-v1"
SPIECE_UNDERLINE = "\u2581"
MODEL_FILE = "spiece.model"
META_FILE = "xlnet_tokenizer.json"
LEGACY_META_FILE = "tokenizer.json"  # our metadata's former name, still read; transformers reserves it (HF_FILE)
HF_FILE = "tokenizer.json"  # the `tokenizers` library's format, read by transformers' AutoTokenizer
HF_CONFIG_FILE = "tokenizer_config.json"
# The original recipe (docs/xlnet.md §1). unk/bos/eos take ids 0-2, control symbols 3-7, user-defined symbols from 8.
CONTROL_SYMBOLS = ("<cls>", "<sep>", "<pad>", "<mask>", "<eod>")
USER_DEFINED_SYMBOLS = ("<eop>", ".", "(", ")", '"', "-", "\u2013", "\u00a3", "\u20ac")
MAX_SENTENCE_BYTES = 1 << 15  # lines longer than this are skipped by the SentencePiece trainer (default 4192)


# ---------------------------------------------------------------------------------------------------------------------
# normalisation


@lru_cache(maxsize=1)
def _combining_table() -> dict[int, None]:
    """str.translate table deleting every combining mark (unicodedata.combining(c) != 0)."""
    # Combining marks live in planes 0-1 (U+0300..U+1E94A in Unicode 15); planes 0-2 are scanned to be safe.
    return dict.fromkeys(c for c in range(min(sys.maxunicode + 1, 0x30000)) if unicodedata.combining(chr(c)))


def normalize_text(text: str, uncased: bool = False, keep_accents: bool = False) -> str:
    """The original preprocess_text for one line (or one text: newlines count as whitespace)."""
    out = " ".join(text.split())
    if "`" in out or "''" in out:
        out = out.replace("``", '"').replace("''", '"')
    if not keep_accents and not out.isascii():
        out = unicodedata.normalize("NFKD", out).translate(_combining_table())
    if uncased:
        out = out.lower()
    return out


def normalize_lines(lines: Sequence[str], uncased: bool = False, keep_accents: bool = False) -> list[str]:
    """normalize_text for each line (lines must not contain newlines); same results, much less Python per line."""
    if not lines:
        return []
    text = "\n".join(lines)
    if text.count("\n") != len(lines) - 1:  # a "line" holding a newline: no fast path
        return [normalize_text(line, uncased, keep_accents) for line in lines]
    return normalize_block(text, uncased, keep_accents)


def normalize_block(text: str, uncased: bool = False, keep_accents: bool = False) -> list[str]:
    """Normalise every line of ``text`` (split on "\n"); returns the lines, "" for blank ones.

    Identical to ``[normalize_text(l) for l in text.split("\n")]`` (a property test checks it) but fast: numpy flags
    the few lines that need work (non-ASCII, whitespace other than single inner spaces, quote pairs); only those go
    through normalize_text, the others are already normalised (up to lowercasing).
    """
    ascii_only = text.isascii()
    if uncased and ascii_only:
        text = text.lower()  # ASCII lowercasing commutes with every other step
    lines = text.split("\n")
    b = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
    if b.size == 0:
        return lines
    sp = b == 32
    nl = b == 10
    # Control characters (includes tab, CR, VT, FF, FS..US: whitespace for str.split()) other than newline.
    flag = (b < 32) & ~nl
    if not ascii_only:
        flag |= b >= 0x80  # non-ASCII: Unicode whitespace, NFKD, accents
    flag[:-1] |= sp[:-1] & (sp[1:] | nl[1:])  # double space or space before a newline
    flag[1:] |= nl[:-1] & sp[1:]  # space after a newline
    flag[0] |= sp[0]
    flag[-1] |= sp[-1]
    q = (b == 96) | (b == 39)
    qpair = q[:-1] & q[1:]  # `` or '' (and harmless look-alikes such as `')
    pos = np.flatnonzero(flag)
    qpos = np.flatnonzero(qpair)
    if pos.size or qpos.size:
        nl_pos = np.flatnonzero(nl)
        full = np.unique(np.searchsorted(nl_pos, pos, side="left"))
        for i in full.tolist():
            lines[i] = normalize_text(lines[i], uncased, keep_accents)
        # Lines whose only issue is a quote pair: ASCII, whitespace already normal, so normalize_text reduces to the
        # two replacements (lowercasing is done above for ASCII text, below otherwise).
        quote_only = np.setdiff1d(np.searchsorted(nl_pos, qpos, side="left"), full)
        for i in quote_only.tolist():
            lines[i] = lines[i].replace("``", '"').replace("''", '"')
    if uncased and not ascii_only:
        lines = [line.lower() for line in lines]  # flagged lines are lowercase already; lower() is idempotent
    return lines


# ---------------------------------------------------------------------------------------------------------------------
# the model file: SentencePiece's ModelProto, read (and extended with our options) through its protobuf wire format

OPTIONS_FIELD = 9601  # NormalizerSpec extension field (>= 200: left to third parties) holding our options as JSON
OPTION_KEYS = ("normalizer", "uncased", "keep_accents", "digit_comma_fix")
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6  # ModelProto.SentencePiece.Type
TRAINING_FILE_PREFIX = ".normalized."  # train_tokenizer's input file; SentencePiece records its path in the model


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _fields(buf: bytes) -> list[tuple[int, int, int, Any]]:
    """The fields of one protobuf message: (number, start, end, value); value is an int (varint), bytes
    (length-delimited: strings and sub-messages) or the raw little-endian bytes of a fixed-width field."""
    out: list[tuple[int, int, int, Any]] = []
    i, n = 0, len(buf)
    while i < n:
        start = i
        tag, i = _varint(buf, i)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 2:
            size, i = _varint(buf, i)
            value, i = buf[i:i + size], i + size
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            value, i = buf[i:i + size], i + size
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        if i > n:
            raise ValueError("truncated protobuf message")
        out.append((number, start, i, value))
    return out


@dataclass
class ModelInfo:
    """The parts of a SentencePiece model that sentencepiece's Python API does not expose (sentencepiece_model.proto
    field numbers in comments)."""

    pieces: list[tuple[str, float, int]] = field(default_factory=list)  # 1: (piece, score, type) by id
    inputs: list[str] = field(default_factory=list)  # trainer_spec.input (2.1): the files it was trained on
    split_by_whitespace: bool = True  # trainer_spec 22
    treat_whitespace_as_suffix: bool = False  # trainer_spec 24
    byte_fallback: bool = False  # trainer_spec 35
    charsmap: bytes = b""  # normalizer_spec.precompiled_charsmap (3.2): SentencePiece's NFKC rules
    add_dummy_prefix: bool = True  # normalizer_spec 3
    remove_extra_whitespaces: bool = True  # normalizer_spec 4
    escape_whitespaces: bool = True  # normalizer_spec 5
    options: dict[str, Any] | None = None  # normalizer_spec OPTIONS_FIELD: ours, for models trained here

    @property
    def trained_here(self) -> bool:
        """True for a model made by train_tokenizer (embedded options, or the name of its training file)."""
        return self.options is not None or any(Path(f).name.startswith(TRAINING_FILE_PREFIX) for f in self.inputs)


def read_model_info(model_bytes: bytes, pieces: bool = True) -> ModelInfo:
    """Parse a serialized ModelProto (ValueError if it is not one)."""
    info = ModelInfo()
    try:
        for number, _, _, value in _fields(model_bytes):
            if number == 1 and pieces:
                piece, score, kind = "", 0.0, NORMAL
                for n, _, _, v in _fields(value):
                    if n == 1:
                        piece = bytes(v).decode("utf-8")
                    elif n == 2:
                        score = struct.unpack("<f", v)[0]
                    elif n == 3:
                        kind = v
                info.pieces.append((piece, score, kind))
            elif number == 2:
                for n, _, _, v in _fields(value):
                    if n == 1:
                        info.inputs.append(bytes(v).decode("utf-8", "replace"))
                    elif n in (22, 24, 35):
                        setattr(info, {22: "split_by_whitespace", 24: "treat_whitespace_as_suffix",
                                       35: "byte_fallback"}[n], bool(v))
            elif number == 3:
                for n, _, _, v in _fields(value):
                    if n == 2:
                        info.charsmap = bytes(v)
                    elif n in (3, 4, 5):
                        setattr(info, {3: "add_dummy_prefix", 4: "remove_extra_whitespaces",
                                       5: "escape_whitespaces"}[n], bool(v))
                    elif n == OPTIONS_FIELD:
                        opts = json.loads(bytes(v).decode("utf-8"))
                        if not isinstance(opts, dict) or set(opts) != set(OPTION_KEYS):
                            raise ValueError("unexpected options record")
                        info.options = opts
    except (IndexError, TypeError, struct.error, UnicodeDecodeError) as e:
        raise ValueError(f"not a SentencePiece model ({type(e).__name__})") from None
    return info


def embed_options(model_bytes: bytes, options: dict[str, Any]) -> bytes:
    """``model_bytes`` with the normalisation ``options`` stored in its normalizer spec (OPTIONS_FIELD), replacing an
    earlier record. Every other byte of the model is kept as it is."""
    payload = json.dumps({k: options[k] for k in OPTION_KEYS}, sort_keys=True).encode("utf-8")
    record = _encode_varint(OPTIONS_FIELD << 3 | 2) + _encode_varint(len(payload)) + payload

    def message(number: int, body: bytes) -> bytes:
        return _encode_varint(number << 3 | 2) + _encode_varint(len(body)) + body

    out, done = bytearray(), False
    for number, start, end, value in _fields(model_bytes):
        if number == 3 and not done:
            body = b"".join(value[s:e] for n, s, e, _ in _fields(value) if n != OPTIONS_FIELD)
            out += message(3, body + record)
            done = True
        else:
            out += model_bytes[start:end]
    if not done:
        out += message(3, record)
    return bytes(out)


# ---------------------------------------------------------------------------------------------------------------------
# the tokenizer


def _options_hash(meta: dict[str, Any]) -> str:
    keys = ("normalizer", "uncased", "keep_accents", "digit_comma_fix", "sha256")
    blob = json.dumps({k: meta.get(k) for k in keys}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()


def _load_processor(model_bytes: bytes, where: Path):
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor()
    try:
        sp.LoadFromSerializedProto(model_bytes)
    except Exception:  # noqa: BLE001 - sentencepiece raises RuntimeError/OSError variants
        raise DataError(f"{where} is not a valid SentencePiece model (corrupt or truncated); retrain or recopy it")
    if sp.get_piece_size() < len(SPECIAL_PIECES):
        raise DataError(f"{where}: vocabulary too small to be an XLNet tokenizer")
    got = tuple(sp.id_to_piece(i) for i in range(len(SPECIAL_PIECES)))
    if got != SPECIAL_PIECES:
        raise DataError(f"{where}: ids 0-8 are {list(got)}, expected XLNet's {list(SPECIAL_PIECES)}; "
                        "train it with `xlnet tokenize train`")
    return sp


class Tokenizer:
    """An XLNet SentencePiece tokenizer plus its normalisation options. Create with Tokenizer.load()."""

    def __init__(self, model_bytes: bytes, meta: dict[str, Any], where: Path | None = None) -> None:
        self.model_bytes = model_bytes
        self.meta = dict(meta)
        self.where = where
        self.sp = _load_processor(model_bytes, where or Path(MODEL_FILE))
        self.sha256: str = meta["sha256"]
        self.vocab_size: int = self.sp.get_piece_size()
        self.uncased: bool = bool(meta.get("uncased", False))
        self.keep_accents: bool = bool(meta.get("keep_accents", False))
        self.digit_comma_fix: bool = bool(meta.get("digit_comma_fix", True))
        self._buffer_ok: bool | None = None  # encode_normalized_batch's buffer fast path: untried / works / not
        self._fix_mask: np.ndarray | None = None
        self._fix_cache: dict[int, list[int]] = {}
        self._comma_id = self.sp.piece_to_id(",")

    # -- loading and saving -------------------------------------------------------------------------------------------

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Tokenizer:
        """Load a tokenizer folder (or its spiece.model). DataError if missing, corrupt or inconsistent.

        The options come from the metadata file (xlnet_tokenizer.json, or its former name tokenizer.json), else from
        the model file itself (models trained here carry them). A model trained here whose options are nowhere is
        refused. Any other model (e.g. Hugging Face's xlnet-base-cased spiece.model) gets transformers' settings:
        ``do_lower_case`` and ``keep_accents`` from a tokenizer_config.json beside it, else cased with accents
        stripped; the digit-comma fix is on."""
        p = Path(path)
        if p.is_dir():
            model_path = p / MODEL_FILE
        elif p.exists():
            model_path = p
        else:
            raise DataError(f"tokenizer {p} does not exist; train one with `xlnet tokenize train`")
        if not model_path.is_file():
            raise DataError(f"tokenizer directory {p} has no {MODEL_FILE}; train one with `xlnet tokenize train`")
        try:
            model_bytes = model_path.read_bytes()
        except OSError as e:
            raise DataError(f"cannot read {model_path}: {e.strerror or e}") from None
        sha = hashlib.sha256(model_bytes).hexdigest()
        meta_path = _meta_path(model_path)
        meta = _read_meta(meta_path, model_path, sha) if meta_path is not None else None
        try:
            info = read_model_info(model_bytes, pieces=False)
        except ValueError:
            raise DataError(f"{model_path} is not a valid SentencePiece model (corrupt or truncated); retrain or "
                            "recopy it") from None
        if meta is not None:
            if info.options is not None and any(info.options[k] != meta.get(k) for k in OPTION_KEYS):
                raise DataError(f"{meta_path} disagrees with the normalisation options stored in {model_path}; "
                                "recopy the whole tokenizer directory")
        elif info.options is not None:
            meta = _default_meta(sha, info.options)
        elif info.trained_here:
            raise DataError(f"{model_path.parent} has no {META_FILE} ({LEGACY_META_FILE} in older folders), which "
                            "holds this model's normalisation (uncased, accents); recopy the whole tokenizer directory")
        else:
            meta = _default_meta(sha, _hf_options(model_path.parent))
        tok = cls(model_bytes, meta, model_path)
        if "vocab_size" in meta and meta["vocab_size"] != tok.vocab_size:
            raise DataError(f"{meta_path}: vocab_size {meta['vocab_size']} but the model has {tok.vocab_size} pieces")
        return tok

    def save(self, out_dir: str | os.PathLike[str]) -> Path:
        """Write the tokenizer folder into out_dir (created if needed): spiece.model, xlnet_tokenizer.json and, for
        Hugging Face, tokenizer.json + tokenizer_config.json (see save_hf_files)."""
        from xlnetcli.core.files import atomic_write_bytes, atomic_write_json

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(out / MODEL_FILE, self.model_bytes)
        meta = dict(self.meta)
        meta.setdefault("vocab_size", self.vocab_size)
        meta["options_sha256"] = _options_hash(meta)
        atomic_write_json(out / META_FILE, meta)
        try:
            save_hf_files(self, out)
        except DataError:  # a model transformers' tokenizers cannot express (not one of XLNet's): no HF files
            for name in (HF_FILE, HF_CONFIG_FILE):
                if (out / name).is_file():
                    (out / name).unlink()
        return out

    def options(self) -> dict[str, Any]:
        return {"uncased": self.uncased, "keep_accents": self.keep_accents, "digit_comma_fix": self.digit_comma_fix,
                "normalizer": self.meta.get("normalizer", NORMALIZER)}

    def __getstate__(self) -> dict[str, Any]:
        return {"model_bytes": self.model_bytes, "meta": self.meta, "where": self.where}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["model_bytes"], state["meta"], state["where"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return (f"Tokenizer(vocab_size={self.vocab_size}, uncased={self.uncased}, keep_accents={self.keep_accents}, "
                f"sha256={self.sha256[:12]})")

    # -- encoding -----------------------------------------------------------------------------------------------------

    def normalize(self, text: str) -> str:
        return normalize_text(text, self.uncased, self.keep_accents)

    @property
    def fix_mask(self) -> np.ndarray:
        """bool [vocab]: pieces the digit-comma fix rewrites (length > 1, end in ',', digit before it)."""
        if self._fix_mask is None:
            mask = np.zeros(self.vocab_size, dtype=bool)
            if self.digit_comma_fix:
                for i in range(self.vocab_size):
                    p = self.sp.id_to_piece(i)
                    if len(p) > 1 and p[-1] == "," and p[-2].isdigit():
                        mask[i] = True
            self._fix_mask = mask
        return self._fix_mask

    def _fix_piece(self, i: int) -> list[int]:
        """Replacement ids of one digit-comma piece (the original rule; it depends on the piece alone, so cached).
        Pieces not in the vocabulary map to <unk>, as in the original."""
        rep = self._fix_cache.get(i)
        if rep is None:
            piece = self.sp.id_to_piece(int(i))
            sub = self.sp.encode(piece[:-1].replace(SPIECE_UNDERLINE, ""), out_type=str)
            if piece[0] != SPIECE_UNDERLINE and sub and sub[0][0] == SPIECE_UNDERLINE:
                sub = sub[1:] if len(sub[0]) == 1 else [sub[0][1:], *sub[1:]]
            rep = [self.sp.piece_to_id(s) for s in sub] + [self._comma_id]
            self._fix_cache[i] = rep
        return rep

    def _fix_ids(self, ids: Sequence[int]) -> list[int]:
        """The original digit-comma fix on a list of ids."""
        mask = self.fix_mask
        out: list[int] = []
        for i in ids:
            if mask[i]:
                out.extend(self._fix_piece(int(i)))
            else:
                out.append(i)
        return out

    def encode_ids(self, text: str) -> list[int]:
        ids = self.sp.encode(self.normalize(text), out_type=int)
        if self.digit_comma_fix and self.fix_mask[ids].any():
            ids = self._fix_ids(ids)
        return ids

    def encode_pieces(self, text: str) -> list[str]:
        return [self.sp.id_to_piece(i) for i in self.encode_ids(text)]

    def encode_normalized_batch(self, lines: list[str], num_threads: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """Encode already-normalised lines in one SentencePiece batch call: (flat int32 ids, int64 length per line).

        The fast path used by shard: SentencePiece's int lists are flattened at C speed (its numpy output is slower
        in sentencepiece 0.2.x), and the digit-comma fix touches only the lines that need it."""
        if not lines:
            return np.zeros(0, np.int32), np.zeros(0, np.int64)
        flat = lens = None
        raw_batch = getattr(getattr(self.sp, "_processor", None), "_EncodeAsBufferBatch", None)
        if raw_batch is not None and self._buffer_ok is not False:
            # sentencepiece >= 0.2.1 can return each line's ids as an int32 buffer (what out_type="numpy" wraps one
            # numpy array at a time): joined at C speed, no Python int per token. Same arguments as sp.encode; any
            # mismatch of that private signature falls back to the public int lists below for good.
            sp = self.sp
            try:
                bufs = raw_batch(lines, num_threads, None, sp._enable_sampling, sp._nbest_size, sp._alpha,
                                 sp._add_bos, sp._add_eos, sp._reverse)
                views = list(map(memoryview, bufs))
                if views and (views[0].format != "i" or views[0].itemsize != 4):
                    raise TypeError("unexpected buffer format")
                lens = np.fromiter(map(len, views), dtype=np.int64, count=len(views))
                flat = np.frombuffer(b"".join(views), dtype=np.int32).copy()
                if flat.size != int(lens.sum()):
                    raise TypeError("buffer sizes disagree")
                self._buffer_ok = True
            except (TypeError, ValueError, AttributeError):
                self._buffer_ok = False
                flat = lens = None
        if flat is None or lens is None:
            enc = self.sp.encode(lines, out_type=int, num_threads=num_threads)
            lens = np.fromiter(map(len, enc), dtype=np.int64, count=len(enc))
            flat = np.fromiter(chain.from_iterable(enc), dtype=np.int32, count=int(lens.sum()))
        if self.digit_comma_fix:
            bad = np.flatnonzero(self.fix_mask[flat])
            if bad.size:  # splice each digit-comma piece's replacement in (vectorised); fix the lines' lengths
                uniq, which = np.unique(flat[bad], return_inverse=True)
                reps = [self._fix_piece(t) for t in uniq.tolist()]
                rep_len = np.fromiter(map(len, reps), dtype=np.int64, count=len(reps))
                rep_start = np.cumsum(rep_len) - rep_len
                rep_ids = np.fromiter(chain.from_iterable(reps), dtype=np.int32, count=int(rep_len.sum()))
                out_len = np.ones(flat.size, dtype=np.int64)
                rl = rep_len[which]
                out_len[bad] = rl
                dest = np.cumsum(out_len) - out_len
                out = np.empty(int(dest[-1] + out_len[-1]), dtype=np.int32)
                keep = np.ones(flat.size, dtype=bool)
                keep[bad] = False
                out[dest[keep]] = flat[keep]
                inner = np.arange(int(rl.sum()), dtype=np.int64) - np.repeat(np.cumsum(rl) - rl, rl)
                out[np.repeat(dest[bad], rl) + inner] = rep_ids[np.repeat(rep_start[which], rl) + inner]
                line_of_bad = np.searchsorted(np.cumsum(lens), bad, side="right")
                lens = lens + np.bincount(line_of_bad, weights=rl - 1, minlength=lens.size).astype(np.int64)
                flat = out
        return flat, lens

    def decode(self, ids: Iterable[int]) -> str:
        return self.sp.decode([int(i) for i in ids])

    def id_to_piece(self, i: int) -> str:
        return self.sp.id_to_piece(int(i))

    def piece_to_id(self, piece: str) -> int:
        return self.sp.piece_to_id(piece)

    def word_start_mask(self) -> np.ndarray:
        """bool [vocab_size]: True for pieces that start a word (docs/xlnet.md §4): a piece starting with '▁', a
        control/special/unknown piece, or a lone ASCII punctuation piece."""
        punct = set(string.punctuation)
        mask = np.zeros(self.vocab_size, dtype=bool)
        for i in range(self.vocab_size):
            p = self.sp.id_to_piece(i)
            mask[i] = (i < len(SPECIAL_PIECES) or self.sp.is_control(i) or self.sp.is_unknown(i)
                       or p.startswith(SPIECE_UNDERLINE) or (len(p) == 1 and p in punct))
        return mask


def _default_meta(sha: str, options: dict[str, Any] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"format_version": FORMAT_VERSION, "normalizer": NORMALIZER, "uncased": False,
                            "keep_accents": False, "digit_comma_fix": True}
    meta.update({k: v for k, v in (options or {}).items() if k in OPTION_KEYS})
    meta["sha256"] = sha
    meta["options_sha256"] = _options_hash(meta)
    return meta


def _is_our_meta(obj: Any) -> bool:
    """Our metadata (xlnet_tokenizer.json, formerly tokenizer.json), not a `tokenizers` file of the same name."""
    return isinstance(obj, dict) and "sha256" in obj and "format_version" in obj and "model" not in obj


def _meta_path(model_path: Path) -> Path | None:
    """The metadata file that belongs to a model file, or None."""
    if model_path.name != MODEL_FILE:  # a model file under another name: its metadata is NAME.json
        cand = model_path.with_suffix(".json")
        return cand if cand.is_file() else None
    folder = model_path.parent
    if (folder / META_FILE).is_file():
        return folder / META_FILE
    legacy = folder / LEGACY_META_FILE
    if legacy.is_file():
        try:
            if _is_our_meta(json.loads(legacy.read_text(encoding="utf-8"))):
                return legacy
        except (OSError, ValueError, UnicodeDecodeError):
            return legacy  # unreadable: _read_meta reports it
    return None


def _read_meta(meta_path: Path, model_path: Path, sha: str) -> dict[str, Any]:
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        if not isinstance(meta, dict):
            raise ValueError("not an object")
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise DataError(f"{meta_path} is corrupt ({e}); retrain the tokenizer") from None
    if meta.get("format_version") != FORMAT_VERSION:
        raise DataError(f"{meta_path}: unsupported format_version {meta.get('format_version')!r}")
    if meta.get("sha256") != sha:
        raise DataError(f"{model_path} does not match {meta_path} (sha256 differs): the model was replaced "
                        "or corrupted; recopy the whole tokenizer directory")
    if meta.get("options_sha256") != _options_hash(meta):
        raise DataError(f"{meta_path}: normalisation options were edited by hand (options hash differs); "
                        "retrain the tokenizer to change them")
    return meta


def _hf_options(folder: Path) -> dict[str, Any]:
    """uncased/keep_accents of a model without our metadata, as transformers' XLNetTokenizer reads them
    (tokenizer_config.json's do_lower_case and keep_accents; both False by default)."""
    try:
        cfg = json.loads((folder / HF_CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    if not isinstance(cfg, dict):
        return {}
    return {"uncased": bool(cfg.get("do_lower_case", False)), "keep_accents": bool(cfg.get("keep_accents", False))}


# ---------------------------------------------------------------------------------------------------------------------
# Hugging Face files: the same tokenizer in the `tokenizers` library's format (written as JSON, no dependency)

HF_TOKENIZER_CLASS = "PreTrainedTokenizerFast"  # transformers loads tokenizer.json as it is (v4; v5 TokenizersBackend)
FLT_MIN = 1.1754943508222875e-38


@lru_cache(maxsize=1)
def _whitespace_chars() -> tuple[int, ...]:
    """The code points str.split() splits on (normalize_text collapses them)."""
    return tuple(c for c in range(sys.maxunicode + 1) if chr(c).isspace())


def _char_class(codepoints: Iterable[int]) -> str:
    """A regex character class (Oniguruma syntax, as the tokenizers library uses) of exactly these code points."""
    ranges: list[list[int]] = []
    for c in sorted(codepoints):
        if ranges and c == ranges[-1][1] + 1:
            ranges[-1][1] = c
        else:
            ranges.append([c, c])
    return "[" + "".join(f"\\x{{{a:X}}}" if a == b else f"\\x{{{a:X}}}-\\x{{{b:X}}}" for a, b in ranges) + "]"


# str.lower() turns a capital sigma that ends a word into a final sigma (Unicode's Final_Sigma context: a cased letter
# before it, possibly across case-ignorable characters, and none after); the tokenizers library lowercases character
# by character, so the rule is applied first (up to 3 case-ignorable characters between the letter and the sigma).
_CASED = r"[\p{Cased}&&[^\p{Case_Ignorable}]]"
_FINAL_SIGMA = ("(?<=" + "|".join(_CASED + r"\p{Case_Ignorable}" * k for k in range(4)) + ")\u03a3"
                + r"(?!\p{Case_Ignorable}*" + _CASED + ")")


def _replace(pattern: str, content: str, regex: bool = True) -> dict[str, Any]:
    return {"type": "Replace", "pattern": {"Regex" if regex else "String": pattern}, "content": content}


def hf_tokenizer_json(tok: Tokenizer) -> dict[str, Any]:
    """tokenizer.json (the `tokenizers` library's format) giving ``tok``'s ids, for transformers' AutoTokenizer.

    - normalizer: normalize_text's steps (whitespace, quotes, NFKD without combining marks, lowercasing with the final
      sigma), then SentencePiece's own (its NFKC charsmap; extra spaces removed);
    - pre_tokenizer: words with '▁' in front (SentencePiece's dummy prefix and whitespace split); with the digit-comma
      fix, a comma after a digit on its own;
    - model: the unigram pieces and scores; user-defined pieces get SentencePiece's bonus score, so they always win;
    - post_processor: XLNet's layout, ``A <sep> <cls>`` and ``A <sep> B <sep> <cls>``, segment ids 0, 1, and 2 for
      ``<cls>``; decoder: '▁' back to spaces.

    Known differences from ``tok.encode_ids`` (pinned by tests/data/test_hf_tokenizer.py): the digit-comma fix rewrites
    pieces after SentencePiece has chosen them, which no `tokenizers` pipeline can do, so where a comma follows a
    digit the digits may be cut differently (never into a piece our pipeline does not produce); segmentations whose
    scores tie exactly may break the tie the other way (SentencePiece adds float32 scores); a control symbol spelled
    out in text (``<sep>``, ``<cls>``, ...) becomes that symbol, as in every transformers tokenizer.
    """
    info = read_model_info(tok.model_bytes)
    if (info.byte_fallback or info.treat_whitespace_as_suffix or not info.escape_whitespaces
            or any(t in (UNUSED, BYTE) for _, _, t in info.pieces)):
        raise DataError(f"{tok.where}: this SentencePiece model uses settings the tokenizers library cannot express")
    normal = [s for _, s, t in info.pieces if t == NORMAL]
    # unigram_model.cc: a user-defined piece scores (length in bytes) * max(FLT_MIN, highest piece score) - 0.1
    top = max(max(normal, default=0.0), FLT_MIN)
    vocab = [[p, len(p.encode("utf-8")) * top - 0.1 if t == USER_DEFINED else s] for p, s, t in info.pieces]
    norm = [_replace(_char_class(_whitespace_chars()) + "+", " "), _replace(r"\A | \z", ""),
            _replace("``", '"', regex=False), _replace("''", '"', regex=False)]
    if not tok.keep_accents:
        norm += [{"type": "NFKD"}, _replace(_char_class(_combining_table()), "")]
    if tok.uncased:
        norm += [_replace(_FINAL_SIGMA, "\u03c2"), {"type": "Lowercase"}]
    if info.charsmap:
        # SentencePiece's charsmap composes sequences (Hangul jamo, Indic vowel parts) that the tokenizers library's
        # Precompiled step, which maps short graphemes only, leaves apart: NFC composes them first
        norm += [{"type": "NFC"},
                 {"type": "Precompiled", "precompiled_charsmap": base64.b64encode(info.charsmap).decode("ascii")}]
    if info.remove_extra_whitespaces:
        norm += [_replace(" {2,}", " "), _replace(r"\A +| +\z", "")]
    space = {"type": "Metaspace", "replacement": SPIECE_UNDERLINE,
             "prepend_scheme": "always" if info.add_dummy_prefix else "never", "split": info.split_by_whitespace}
    pre: dict[str, Any] = space
    digits = sorted({ord(tok.id_to_piece(int(i))[-2]) for i in np.flatnonzero(tok.fix_mask)})
    if digits:
        comma = {"type": "Split", "pattern": {"Regex": f"(?<={_char_class(digits)}),"}, "behavior": "Isolated",
                 "invert": False}
        pre = {"type": "Sequence", "pretokenizers": [space, comma]}
    specials = [(i, p) for i, (p, _, t) in enumerate(info.pieces) if t in (UNKNOWN, CONTROL)]
    sep, cls = info.pieces[SEP_ID][0], info.pieces[CLS_ID][0]

    def seq(name: str, type_id: int) -> dict[str, Any]:
        return {"Sequence": {"id": name, "type_id": type_id}}

    def special(piece: str, type_id: int) -> dict[str, Any]:
        return {"SpecialToken": {"id": piece, "type_id": type_id}}

    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": i, "content": p, "single_word": False, "lstrip": i == MASK_ID, "rstrip": False,
                          "normalized": False, "special": True} for i, p in specials],
        "normalizer": {"type": "Sequence", "normalizers": norm},
        "pre_tokenizer": pre,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [seq("A", 0), special(sep, 0), special(cls, 2)],
            "pair": [seq("A", 0), special(sep, 0), seq("B", 1), special(sep, 1), special(cls, 2)],
            "special_tokens": {p: {"id": p, "ids": [i], "tokens": [p]}
                               for p, i in sorted({cls: CLS_ID, sep: SEP_ID}.items())},
        },
        "decoder": dict(space),
        "model": {"type": "Unigram", "unk_id": tok.sp.unk_id(), "vocab": vocab, "byte_fallback": False},
    }


def hf_tokenizer_config(tok: Tokenizer) -> dict[str, Any]:
    """tokenizer_config.json: which class loads tokenizer.json, XLNet's special tokens, left padding (so <cls> stays
    last), segment ids returned; do_lower_case/keep_accents for transformers' XLNetTokenizer."""
    name = SPECIAL_PIECES
    return {
        "tokenizer_class": HF_TOKENIZER_CLASS,
        "model_input_names": ["input_ids", "token_type_ids", "attention_mask"],
        "padding_side": "left",
        "unk_token": name[UNK_ID], "bos_token": name[BOS_ID], "eos_token": name[EOS_ID], "cls_token": name[CLS_ID],
        "sep_token": name[SEP_ID], "pad_token": name[PAD_ID], "mask_token": name[MASK_ID],
        "additional_special_tokens": [name[EOD_ID]],
        "clean_up_tokenization_spaces": False,
        "do_lower_case": tok.uncased,
        "keep_accents": tok.keep_accents,
        "remove_space": True,
    }


def save_hf_files(tok: Tokenizer, out_dir: str | os.PathLike[str]) -> None:
    """Write tokenizer.json and tokenizer_config.json into out_dir: ``AutoTokenizer.from_pretrained(out_dir)`` then
    gives ``tok``'s ids (hf_tokenizer_json says where it cannot). DataError for a model it cannot express."""
    from xlnetcli.core.files import atomic_write_json, atomic_write_text

    out = Path(out_dir)
    data = hf_tokenizer_json(tok)
    atomic_write_text(out / HF_FILE, json.dumps(data, ensure_ascii=False, indent=2) + "\n")
    atomic_write_json(out / HF_CONFIG_FILE, hf_tokenizer_config(tok))


# ---------------------------------------------------------------------------------------------------------------------
# training


def train_tokenizer(cfg: Config, inputs: Iterable[str | os.PathLike[str]], out_dir: str | os.PathLike[str], *,
                    overwrite: bool = False, quiet: bool = False, text_field: str = "text") -> Tokenizer:
    """Train a SentencePiece unigram model on normalised lines of ``inputs`` into ``out_dir`` (atomic), with the
    settings of ``cfg.tokenizer`` (vocab_size, character_coverage, input_sentence_size, uncased, keep_accents,
    threads); ``cfg`` is written next to the model as config.yaml. Inputs may be text, JSONL, Parquet or datasets
    folders (corpus.py); ``text_field`` names their text field.
    """
    import sentencepiece as spm

    from xlnetcli.data.corpus import ReadStats, expand_inputs, iter_lines, total_size
    from xlnetcli.core.files import atomic_output_dir, check_output_dir, check_output_not_input, sigterm_as_interrupt
    from xlnetcli.core.console import byte_progress, console

    check_output_dir(out_dir, overwrite, "a tokenizer")
    files = expand_inputs(inputs)
    check_output_not_input(out_dir, files)
    tcfg = cfg.tokenizer
    if tcfg.vocab_size <= len(SPECIAL_PIECES) + len(USER_DEFINED_SYMBOLS):  # SentencePiece needs room to learn
        raise ConfigError(f"tokenizer.vocab_size must be > {len(SPECIAL_PIECES) + len(USER_DEFINED_SYMBOLS)}, "
                          f"got {tcfg.vocab_size}")
    threads = tcfg.threads or (os.cpu_count() or 1)
    stats = ReadStats()
    with sigterm_as_interrupt(), atomic_output_dir(out_dir, overwrite, "a tokenizer") as tmp:
        # Pass 1: normalise every line into a temporary text file (the trainer reads it; errors surface here).
        fd, norm_path = tempfile.mkstemp(prefix=".normalized.", suffix=".txt", dir=tmp)
        n_lines = 0
        n_bytes = 0
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f, byte_progress(quiet) as prog:
                task = prog.add_task("normalising", total=total_size(files), info="")
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

                for line in iter_lines(files, stats, on_bytes=lambda n: prog.advance(task, n), text_field=text_field):
                    batch.append(line)
                    if len(batch) >= 10000:
                        flush()
                flush()
            for w in stats.warnings():
                console.print(w)
            if n_lines == 0:
                raise DataError(f"the corpus ({len(files)} file(s)) holds no text after normalisation")
            if not quiet:
                console.print(f"training SentencePiece unigram: vocab {tcfg.vocab_size}, {n_lines} lines "
                              f"({n_bytes / 1e6:.1f} MB), {threads} thread(s)")
            prefix = Path(tmp) / "spiece"
            try:
                spm.SentencePieceTrainer.train(
                    input=norm_path, model_prefix=str(prefix), model_type="unigram", vocab_size=tcfg.vocab_size,
                    character_coverage=tcfg.character_coverage, input_sentence_size=tcfg.input_sentence_size,
                    shuffle_input_sentence=True, control_symbols=list(CONTROL_SYMBOLS),
                    user_defined_symbols=list(USER_DEFINED_SYMBOLS), unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
                    num_threads=threads, max_sentence_length=MAX_SENTENCE_BYTES, minloglevel=2,
                )
            except RuntimeError as e:
                msg = " ".join(str(e).split())
                if "Vocabulary size is too high" in msg or "vocab_size" in msg.lower():
                    raise ConfigError(f"tokenizer.vocab_size {tcfg.vocab_size} is too large for this corpus "
                                      f"({msg.split(':')[-1].strip()}); lower --vocab-size or add text") from None
                if "sentences_.empty()" in msg:  # every line was skipped, most often for being too long
                    raise DataError(f"no usable line for SentencePiece: every line is empty after normalisation or "
                                    f"longer than {MAX_SENTENCE_BYTES} bytes, which SentencePiece skips; split the "
                                    "text into lines (sentences or paragraphs)") from None
                raise DataError(f"SentencePiece training failed: {msg}") from None
        finally:
            if os.path.exists(norm_path):
                os.unlink(norm_path)
        model_bytes = (prefix.with_suffix(".model")).read_bytes()
        os.unlink(prefix.with_suffix(".model"))
        vocab = prefix.with_suffix(".vocab")
        if vocab.exists():
            os.unlink(vocab)
        options = {"normalizer": NORMALIZER, "uncased": bool(tcfg.uncased), "keep_accents": bool(tcfg.keep_accents),
                   "digit_comma_fix": True}
        model_bytes = embed_options(model_bytes, options)  # the model file carries its own normalisation
        meta = _default_meta(hashlib.sha256(model_bytes).hexdigest(), options)
        meta["vocab_size"] = tcfg.vocab_size
        meta["train"] = {
            "model_type": "unigram", "character_coverage": tcfg.character_coverage,
            "input_sentence_size": tcfg.input_sentence_size, "lines": n_lines, "bytes": n_bytes,
            "inputs": [str(p) for p in files], "invalid_utf8_bytes": stats.bad_bytes,
            "control_symbols": list(CONTROL_SYMBOLS), "user_defined_symbols": list(USER_DEFINED_SYMBOLS),
        }
        meta["options_sha256"] = _options_hash(meta)
        tok = Tokenizer(model_bytes, meta, Path(out_dir) / MODEL_FILE)
        tok.save(tmp)
        save_config(cfg, tmp)
    return Tokenizer.load(out_dir)


def copy_tokenizer(src: Tokenizer | str | os.PathLike[str], dst_dir: str | os.PathLike[str]) -> Path:
    """Copy a tokenizer (object, folder or model file) into dst_dir as a complete tokenizer folder (Tokenizer.save)."""
    tok = src if isinstance(src, Tokenizer) else Tokenizer.load(src)
    return tok.save(dst_dir)


__all__ = ["Tokenizer", "train_tokenizer", "normalize_text", "normalize_lines", "copy_tokenizer", "save_hf_files",
           "hf_tokenizer_json", "hf_tokenizer_config", "read_model_info", "embed_options",
           "CONTROL_SYMBOLS", "USER_DEFINED_SYMBOLS"]
