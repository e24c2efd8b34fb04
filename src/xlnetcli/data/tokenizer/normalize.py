"""XLNet's text normalisation: the original ``preprocess_text`` (docs/xlnet.md §1), applied to every line before
training and before encoding.

Collapse whitespace (strip, split, join with one space); ``\u0060\u0060`` and ``''`` become ``"``; unless keep_accents:
NFKD and drop combining marks; if uncased: lowercase. SentencePiece's own NFKC rule (stored inside the model) follows.
"""

from __future__ import annotations

import sys
import unicodedata
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

NORMALIZER = "xlnet-preprocess-text-v1"  # the name of this normalisation, recorded with every tokenizer


@lru_cache(maxsize=1)
def combining_table() -> dict[int, None]:
    """str.translate table deleting every combining mark (unicodedata.combining(c) != 0)."""
    # Combining marks live in planes 0-1 (U+0300..U+1E94A in Unicode 15); planes 0-2 are scanned to be safe.
    return dict.fromkeys(c for c in range(min(sys.maxunicode + 1, 0x30000)) if unicodedata.combining(chr(c)))


def normalize_text(text: str, uncased: bool = False, keep_accents: bool = False) -> str:
    """The original preprocess_text for one line (or one text: newlines count as whitespace)."""
    out = " ".join(text.split())
    if "`" in out or "''" in out:
        out = out.replace("``", '"').replace("''", '"')
    if not keep_accents and not out.isascii():
        out = unicodedata.normalize("NFKD", out).translate(combining_table())
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
