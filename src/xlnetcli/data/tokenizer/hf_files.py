"""The tokenizer for Hugging Face: ``tokenizer.json`` (the `tokenizers` library's format, written as JSON without
depending on it) and ``tokenizer_config.json``, so that ``AutoTokenizer.from_pretrained(folder)`` gives our ids."""

from __future__ import annotations

import base64
import json
import os
import sys
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from xlnetcli.core.errors import DataError
from xlnetcli.core.files import atomic_write_json, atomic_write_text
from xlnetcli.data.special import BOS_ID, CLS_ID, EOD_ID, EOS_ID, MASK_ID, PAD_ID, SEP_ID, SPECIAL_PIECES, UNK_ID
from xlnetcli.data.tokenizer.normalize import combining_table
from xlnetcli.data.tokenizer.spm_model import (
    BYTE,
    CONTROL,
    NORMAL,
    SPIECE_UNDERLINE,
    UNKNOWN,
    UNUSED,
    USER_DEFINED,
    ModelInfo,
    read_model_info,
)

if TYPE_CHECKING:  # tokenizer.py imports this module to save these files
    from xlnetcli.data.tokenizer.tokenizer import Tokenizer

HF_FILE = "tokenizer.json"  # the `tokenizers` library's format, read by transformers' AutoTokenizer
HF_CONFIG_FILE = "tokenizer_config.json"
HF_SPM_FILE = "tokenizer.model"  # the SentencePiece model as transformers 5's save_vocabulary names it
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
_FINAL_SIGMA = (
    "(?<="
    + "|".join(_CASED + r"\p{Case_Ignorable}" * k for k in range(4))
    + ")\u03a3"
    + r"(?!\p{Case_Ignorable}*"
    + _CASED
    + ")"
)


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
    _check_expressible(tok, info)
    vocab = _unigram_vocab(info)
    space = {
        "type": "Metaspace",
        "replacement": SPIECE_UNDERLINE,
        "prepend_scheme": "always" if info.add_dummy_prefix else "never",
        "split": info.split_by_whitespace,
    }
    pre = _pre_tokenizer(tok, space)
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": _added_tokens(info),
        "normalizer": {"type": "Sequence", "normalizers": _normalizers(tok, info)},
        "pre_tokenizer": pre,
        "post_processor": _post_processor(info),
        "decoder": dict(space),
        "model": {"type": "Unigram", "unk_id": tok.sp.unk_id(), "vocab": vocab, "byte_fallback": False},
    }


def _check_expressible(tok: Tokenizer, info: ModelInfo) -> None:
    """Refuse a SentencePiece model whose settings (byte fallback, whitespace as suffix or unescaped, unused or byte
    pieces) have no equivalent in the tokenizers library."""
    if (
        info.byte_fallback
        or info.treat_whitespace_as_suffix
        or not info.escape_whitespaces
        or any(t in (UNUSED, BYTE) for _, _, t in info.pieces)
    ):
        raise DataError(f"{tok.where}: this SentencePiece model uses settings the tokenizers library cannot express")


def _unigram_vocab(info: ModelInfo) -> list[list[Any]]:
    """[piece, score] of every piece, user-defined ones with the score SentencePiece gives them."""
    normal = [s for _, s, t in info.pieces if t == NORMAL]
    # unigram_model.cc: a user-defined piece scores (length in bytes) * max(FLT_MIN, highest piece score) - 0.1
    top = max(max(normal, default=0.0), FLT_MIN)
    return [[p, len(p.encode("utf-8")) * top - 0.1 if t == USER_DEFINED else s] for p, s, t in info.pieces]


def _pre_tokenizer(tok: Tokenizer, space: dict[str, Any]) -> dict[str, Any]:
    """The Metaspace pre-tokenizer ``space``, followed, with the digit-comma fix, by a split isolating a comma after
    one of the digits the fix applies to."""
    digits = sorted({ord(tok.id_to_piece(int(i))[-2]) for i in np.flatnonzero(tok.fix_mask)})
    if not digits:
        return space
    comma = {
        "type": "Split",
        "pattern": {"Regex": f"(?<={_char_class(digits)}),"},
        "behavior": "Isolated",
        "invert": False,
    }
    return {"type": "Sequence", "pretokenizers": [space, comma]}


def _added_tokens(info: ModelInfo) -> list[dict[str, Any]]:
    """The unknown and control pieces as special added tokens (``<mask>`` takes the space before it)."""
    specials = [(i, p) for i, (p, _, t) in enumerate(info.pieces) if t in (UNKNOWN, CONTROL)]
    return [
        {
            "id": i,
            "content": p,
            "single_word": False,
            "lstrip": i == MASK_ID,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, p in specials
    ]


def _normalizers(tok: Tokenizer, info: ModelInfo) -> list[dict[str, Any]]:
    """normalize_text's steps, then SentencePiece's own, as `tokenizers` normalizers."""
    norm = [
        _replace(_char_class(_whitespace_chars()) + "+", " "),
        _replace(r"\A | \z", ""),
        _replace("``", '"', regex=False),
        _replace("''", '"', regex=False),
    ]
    if not tok.keep_accents:
        norm += [{"type": "NFKD"}, _replace(_char_class(combining_table()), "")]
    if tok.uncased:
        norm += [_replace(_FINAL_SIGMA, "\u03c2"), {"type": "Lowercase"}]
    if info.charsmap:
        # SentencePiece's charsmap composes sequences (Hangul jamo, Indic vowel parts) that the tokenizers library's
        # Precompiled step, which maps short graphemes only, leaves apart: NFC composes them first
        norm += [
            {"type": "NFC"},
            {"type": "Precompiled", "precompiled_charsmap": base64.b64encode(info.charsmap).decode("ascii")},
        ]
    if info.remove_extra_whitespaces:
        norm += [_replace(" {2,}", " "), _replace(r"\A +| +\z", "")]
    return norm


def _post_processor(info: ModelInfo) -> dict[str, Any]:
    """XLNet's input layout: ``A <sep> <cls>`` and ``A <sep> B <sep> <cls>``, segment ids 0, 1, and 2 for <cls>."""
    sep, cls = info.pieces[SEP_ID][0], info.pieces[CLS_ID][0]

    def seq(name: str, type_id: int) -> dict[str, Any]:
        return {"Sequence": {"id": name, "type_id": type_id}}

    def special(piece: str, type_id: int) -> dict[str, Any]:
        return {"SpecialToken": {"id": piece, "type_id": type_id}}

    return {
        "type": "TemplateProcessing",
        "single": [seq("A", 0), special(sep, 0), special(cls, 2)],
        "pair": [seq("A", 0), special(sep, 0), seq("B", 1), special(sep, 1), special(cls, 2)],
        "special_tokens": {
            p: {"id": p, "ids": [i], "tokens": [p]} for p, i in sorted({cls: CLS_ID, sep: SEP_ID}.items())
        },
    }


def hf_tokenizer_config(tok: Tokenizer) -> dict[str, Any]:
    """tokenizer_config.json: which class loads tokenizer.json, XLNet's special tokens, left padding (so <cls> stays
    last), segment ids returned; do_lower_case/keep_accents for transformers' XLNetTokenizer."""
    name = SPECIAL_PIECES
    return {
        "tokenizer_class": HF_TOKENIZER_CLASS,
        "model_input_names": ["input_ids", "token_type_ids", "attention_mask"],
        "padding_side": "left",
        "unk_token": name[UNK_ID],
        "bos_token": name[BOS_ID],
        "eos_token": name[EOS_ID],
        "cls_token": name[CLS_ID],
        "sep_token": name[SEP_ID],
        "pad_token": name[PAD_ID],
        "mask_token": name[MASK_ID],
        "additional_special_tokens": [name[EOD_ID]],
        "clean_up_tokenization_spaces": False,
        "do_lower_case": tok.uncased,
        "keep_accents": tok.keep_accents,
        "remove_space": True,
    }


def save_hf_files(tok: Tokenizer, out_dir: str | os.PathLike[str]) -> None:
    """Write tokenizer.json and tokenizer_config.json into out_dir: ``AutoTokenizer.from_pretrained(out_dir)`` then
    gives ``tok``'s ids (hf_tokenizer_json says where it cannot). DataError for a model it cannot express."""
    out = Path(out_dir)
    data = hf_tokenizer_json(tok)
    atomic_write_text(out / HF_FILE, json.dumps(data, ensure_ascii=False, indent=2) + "\n")
    atomic_write_json(out / HF_CONFIG_FILE, hf_tokenizer_config(tok))
