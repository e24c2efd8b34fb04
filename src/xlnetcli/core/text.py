"""Bounded text for one-line messages: a value of any size (a YAML alias bomb, a 100 KB ``--set``) is cut before it
reaches the terminal."""

from __future__ import annotations

import reprlib
from typing import Any

_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxtuple, _REPR.maxdict, _REPR.maxstring, _REPR.maxother = 2, 4, 4, 4, 40, 40


def short(value: Any, limit: int = 60) -> str:
    """A bounded repr for messages: a huge or deeply nested value (an alias bomb) never reaches the terminal."""
    return clip(_REPR.repr(value), limit)


def clip(text: Any, limit: int = 60) -> str:
    """``text`` as a string of at most ``limit`` characters, "..." marking a cut."""
    text = str(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def printable(text: str) -> str:
    """``text`` with every character that would break a one-line message (newlines, tabs, other controls, lone
    surrogates) written as its escape, the rest as is: ``a\\nb`` for ``a<newline>b``."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """'1 thread', '2,048 steps': a count with thousands separators and its noun, singular for one."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"
