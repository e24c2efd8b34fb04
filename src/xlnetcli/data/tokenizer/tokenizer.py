"""The tokenizer: an XLNet SentencePiece unigram model with its normalisation options (docs/xlnet.md §1).

A tokenizer folder holds
- ``spiece.model``: the SentencePiece model, its normalisation options inside (spm_model.py);
- ``xlnet_tokenizer.json``: the same options, the sha256 of ``spiece.model``, a hash of the options and how the model
  was trained. A model swapped or an option edited by hand is refused on load;
- ``tokenizer.json`` + ``tokenizer_config.json``: the same tokenizer for Hugging Face (hf_files.py).

Text is normalised (normalize.py), then encoded by SentencePiece; after encoding, the original's digit-comma fix
re-encodes a piece such as ``▁2000,`` as ``▁2000`` + ``,``.
"""

from __future__ import annotations

import hashlib
import json
import os
import string
from collections.abc import Iterable, Sequence
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
import sentencepiece as spm

from xlnetcli.core.errors import DataError
from xlnetcli.core.files import atomic_write_bytes, atomic_write_json
from xlnetcli.data.special import SPECIAL_PIECES
from xlnetcli.data.tokenizer.hf_files import HF_CONFIG_FILE, HF_FILE, save_hf_files
from xlnetcli.data.tokenizer.normalize import NORMALIZER, normalize_text
from xlnetcli.data.tokenizer.spm_model import OPTION_KEYS, SPIECE_UNDERLINE, read_model_info

FORMAT_VERSION = 1
SPIECE_FILE = "spiece.model"
META_FILE = "xlnet_tokenizer.json"


def options_hash(meta: dict[str, Any]) -> str:
    """xlnet_tokenizer.json's options_sha256: a hash of the normalisation options and the model's sha256."""
    keys = ("normalizer", "uncased", "keep_accents", "digit_comma_fix", "sha256")
    blob = json.dumps({k: meta.get(k) for k in keys}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()


def _load_processor(model_bytes: bytes, where: Path) -> spm.SentencePieceProcessor:
    sp = spm.SentencePieceProcessor()
    try:
        sp.LoadFromSerializedProto(model_bytes)
    except (RuntimeError, OSError):  # sentencepiece's load errors (its C++ status as RuntimeError / OSError)
        raise DataError(
            f"{where} is not a valid SentencePiece model (corrupt or truncated); retrain or recopy it"
        ) from None
    if sp.get_piece_size() < len(SPECIAL_PIECES):
        raise DataError(f"{where}: vocabulary too small to be an XLNet tokenizer")
    got = tuple(sp.id_to_piece(i) for i in range(len(SPECIAL_PIECES)))
    if got != SPECIAL_PIECES:
        raise DataError(
            f"{where}: ids 0-8 are {list(got)}, expected XLNet's {list(SPECIAL_PIECES)}; "
            "train it with `xlnet tokenize train`"
        )
    return sp


def word_start_mask(sp: Any) -> np.ndarray:
    """bool [vocab]: True for the pieces of SentencePiece processor ``sp`` that start a word (docs/xlnet.md §4, the
    original's ``_is_start_piece``): a piece starting with '▁', a control/special/unknown piece, or a lone ASCII
    punctuation piece."""
    punct = set(string.punctuation)
    mask = np.zeros(sp.get_piece_size(), dtype=bool)
    for i in range(sp.get_piece_size()):
        p = sp.id_to_piece(i)
        mask[i] = (
            i < len(SPECIAL_PIECES)
            or sp.is_control(i)
            or sp.is_unknown(i)
            or p.startswith(SPIECE_UNDERLINE)
            or (len(p) == 1 and p in punct)
        )
    return mask


class Tokenizer:
    """An XLNet SentencePiece tokenizer plus its normalisation options. Create with Tokenizer.load()."""

    def __init__(self, model_bytes: bytes, meta: dict[str, Any], where: Path | None = None) -> None:
        self.model_bytes = model_bytes
        self.meta = dict(meta)
        self.where = where
        self.sp = _load_processor(model_bytes, where or Path(SPIECE_FILE))
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

        The options come from the metadata file (xlnet_tokenizer.json), else from the model file itself (models
        trained here carry them). Any other model (e.g. Hugging Face's xlnet-base-cased spiece.model) gets
        transformers' settings: ``do_lower_case`` and ``keep_accents`` from a tokenizer_config.json beside it, else
        cased with accents stripped; the digit-comma fix is on."""
        p = Path(path)
        if p.is_dir():
            model_path = p / SPIECE_FILE
        elif p.exists():
            model_path = p
        else:
            raise DataError(f"tokenizer {p} does not exist; train one with `xlnet tokenize train`")
        if not model_path.is_file():
            raise DataError(f"tokenizer directory {p} has no {SPIECE_FILE}; train one with `xlnet tokenize train`")
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
            raise DataError(
                f"{model_path} is not a valid SentencePiece model (corrupt or truncated); retrain or recopy it"
            ) from None
        if meta is not None:
            if info.options is not None and any(info.options[k] != meta.get(k) for k in OPTION_KEYS):
                raise DataError(
                    f"{meta_path} disagrees with the normalisation options stored in {model_path}; "
                    "recopy the whole tokenizer directory"
                )
        elif info.options is not None:
            meta = default_meta(sha, info.options)
        else:
            meta = default_meta(sha, _hf_options(model_path.parent))
        tok = cls(model_bytes, meta, model_path)
        if "vocab_size" in meta and meta["vocab_size"] != tok.vocab_size:
            raise DataError(f"{meta_path}: vocab_size {meta['vocab_size']} but the model has {tok.vocab_size} pieces")
        return tok

    def save(self, out_dir: str | os.PathLike[str]) -> Path:
        """Write the tokenizer folder into out_dir (created if needed): spiece.model, xlnet_tokenizer.json and, for
        Hugging Face, tokenizer.json + tokenizer_config.json (see save_hf_files)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(out / SPIECE_FILE, self.model_bytes)
        meta = dict(self.meta)
        meta.setdefault("vocab_size", self.vocab_size)
        meta["options_sha256"] = options_hash(meta)
        atomic_write_json(out / META_FILE, meta)
        try:
            save_hf_files(self, out)
        except DataError:  # a model transformers' tokenizers cannot express (not one of XLNet's): no HF files
            for name in (HF_FILE, HF_CONFIG_FILE):
                if (out / name).is_file():
                    (out / name).unlink()
        return out

    def options(self) -> dict[str, Any]:
        return {
            "uncased": self.uncased,
            "keep_accents": self.keep_accents,
            "digit_comma_fix": self.digit_comma_fix,
            "normalizer": self.meta.get("normalizer", NORMALIZER),
        }

    def __getstate__(self) -> dict[str, Any]:
        return {"model_bytes": self.model_bytes, "meta": self.meta, "where": self.where}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["model_bytes"], state["meta"], state["where"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return (
            f"Tokenizer(vocab_size={self.vocab_size}, uncased={self.uncased}, keep_accents={self.keep_accents}, "
            f"sha256={self.sha256[:12]})"
        )

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
        got = self._encode_buffers(lines, num_threads)
        if got is None:
            enc = self.sp.encode(lines, out_type=int, num_threads=num_threads)
            lens = np.fromiter(map(len, enc), dtype=np.int64, count=len(enc))
            flat = np.fromiter(chain.from_iterable(enc), dtype=np.int32, count=int(lens.sum()))
        else:
            flat, lens = got
        if self.digit_comma_fix:
            bad = np.flatnonzero(self.fix_mask[flat])
            if bad.size:
                flat, lens = self._splice_fixes(flat, lens, bad)
        return flat, lens

    def _encode_buffers(self, lines: list[str], num_threads: int) -> tuple[np.ndarray, np.ndarray] | None:
        """(flat ids, lengths) from SentencePiece's int32 buffers, or None where that private API is missing or has
        failed once (``encode_normalized_batch`` then uses the public int lists)."""
        raw_batch = getattr(getattr(self.sp, "_processor", None), "_EncodeAsBufferBatch", None)
        if raw_batch is None or self._buffer_ok is False:
            return None
        # sentencepiece >= 0.2.1 can return each line's ids as an int32 buffer (what out_type="numpy" wraps one
        # numpy array at a time): joined at C speed, no Python int per token. Same arguments as sp.encode; any
        # mismatch of that private signature falls back to the public int lists for good.
        sp: Any = self.sp  # its private settings (_enable_sampling, ...) are not in sentencepiece's type stubs
        try:
            bufs = raw_batch(
                lines,
                num_threads,
                None,
                sp._enable_sampling,
                sp._nbest_size,
                sp._alpha,
                sp._add_bos,
                sp._add_eos,
                sp._reverse,
            )
            views = [memoryview(b) for b in bufs]
            if views and (views[0].format != "i" or views[0].itemsize != 4):
                raise TypeError("unexpected buffer format")
            lens = np.fromiter(map(len, views), dtype=np.int64, count=len(views))
            flat = np.frombuffer(b"".join(views), dtype=np.int32).copy()
            if flat.size != int(lens.sum()):
                raise TypeError("buffer sizes disagree")
            self._buffer_ok = True
        except (TypeError, ValueError, AttributeError):
            self._buffer_ok = False
            return None
        return flat, lens

    def _splice_fixes(self, flat: np.ndarray, lens: np.ndarray, bad: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Splice each digit-comma piece's replacement (at positions ``bad`` of ``flat``) in, vectorised, and fix the
        lines' lengths: the new (flat ids, lengths)."""
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
        return out, lens

    def decode(self, ids: Iterable[int]) -> str:
        return self.sp.decode([int(i) for i in ids])

    def id_to_piece(self, i: int) -> str:
        return self.sp.id_to_piece(int(i))

    def piece_to_id(self, piece: str) -> int:
        return self.sp.piece_to_id(piece)

    def word_start_mask(self) -> np.ndarray:
        """bool [vocab_size]: True for pieces that start a word (``word_start_mask``)."""
        return word_start_mask(self.sp)


def default_meta(sha: str, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """xlnet_tokenizer.json's content for the model with sha256 ``sha`` and these normalisation options (the
    others at their defaults)."""
    meta: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "normalizer": NORMALIZER,
        "uncased": False,
        "keep_accents": False,
        "digit_comma_fix": True,
    }
    meta.update({k: v for k, v in (options or {}).items() if k in OPTION_KEYS})
    meta["sha256"] = sha
    meta["options_sha256"] = options_hash(meta)
    return meta


def _meta_path(model_path: Path) -> Path | None:
    """The metadata file that belongs to a model file, or None."""
    if model_path.name != SPIECE_FILE:  # a model file under another name: its metadata is NAME.json
        cand = model_path.with_suffix(".json")  # (not transformers' tokenizer.json beside its tokenizer.model)
        return cand if cand.is_file() and cand.name != HF_FILE else None
    meta = model_path.parent / META_FILE
    return meta if meta.is_file() else None


def _read_meta(meta_path: Path, model_path: Path, sha: str) -> dict[str, Any]:
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        if not isinstance(meta, dict):
            raise ValueError("not an object")
    except (OSError, ValueError, UnicodeDecodeError, RecursionError) as e:
        raise DataError(f"{meta_path} is corrupt ({type(e).__name__}); retrain the tokenizer") from None
    if meta.get("format_version") != FORMAT_VERSION:
        raise DataError(f"{meta_path}: unsupported format_version {meta.get('format_version')!r}")
    if meta.get("sha256") != sha:
        raise DataError(
            f"{model_path} does not match {meta_path} (sha256 differs): the model was replaced "
            "or corrupted; recopy the whole tokenizer directory"
        )
    if meta.get("options_sha256") != options_hash(meta):
        raise DataError(
            f"{meta_path}: normalisation options were edited by hand (options hash differs); "
            "retrain the tokenizer to change them"
        )
    return meta


def _hf_options(folder: Path) -> dict[str, Any]:
    """uncased/keep_accents of a model without our metadata, as transformers' XLNetTokenizer reads them
    (tokenizer_config.json's do_lower_case and keep_accents; both False by default)."""
    try:
        cfg = json.loads((folder / HF_CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):
        return {}
    if not isinstance(cfg, dict):
        return {}
    return {"uncased": bool(cfg.get("do_lower_case", False)), "keep_accents": bool(cfg.get("keep_accents", False))}
