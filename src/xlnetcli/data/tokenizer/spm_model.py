"""The SentencePiece model file, read and extended through its protobuf wire format (sentencepiece_model.proto).

sentencepiece's Python API exposes neither the piece types nor the normaliser's settings that the Hugging Face files
need (hf_files.py), and has no place for our normalisation options. Models trained here carry those options inside
the model file itself, in an extension field of its normalizer spec (SentencePiece reserves field numbers >= 200 for
third parties; SentencePiece and transformers ignore it), so the options cannot be separated from the model.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any

SPIECE_UNDERLINE = "\u2581"  # SentencePiece's whitespace symbol, at the start of a word's first piece
OPTIONS_FIELD = 9601  # NormalizerSpec extension field (>= 200: left to third parties) holding our options as JSON
OPTION_KEYS = ("normalizer", "uncased", "keep_accents", "digit_comma_fix")
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6  # ModelProto.SentencePiece.Type


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
        value: int | bytes
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 2:
            size, i = _varint(buf, i)
            value, i = buf[i : i + size], i + size
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            value, i = buf[i : i + size], i + size
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
    split_by_whitespace: bool = True  # trainer_spec 22
    treat_whitespace_as_suffix: bool = False  # trainer_spec 24
    byte_fallback: bool = False  # trainer_spec 35
    charsmap: bytes = b""  # normalizer_spec.precompiled_charsmap (3.2): SentencePiece's NFKC rules
    add_dummy_prefix: bool = True  # normalizer_spec 3
    remove_extra_whitespaces: bool = True  # normalizer_spec 4
    escape_whitespaces: bool = True  # normalizer_spec 5
    options: dict[str, Any] | None = None  # normalizer_spec OPTIONS_FIELD: ours, for models trained here


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
                    if n in (22, 24, 35):
                        setattr(
                            info,
                            {22: "split_by_whitespace", 24: "treat_whitespace_as_suffix", 35: "byte_fallback"}[n],
                            bool(v),
                        )
            elif number == 3:
                for n, _, _, v in _fields(value):
                    if n == 2:
                        info.charsmap = bytes(v)
                    elif n in (3, 4, 5):
                        setattr(
                            info,
                            {3: "add_dummy_prefix", 4: "remove_extra_whitespaces", 5: "escape_whitespaces"}[n],
                            bool(v),
                        )
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


def set_trainer_strings(model_bytes: bytes, values: dict[int, str]) -> bytes:
    """``model_bytes`` with string fields of its trainer spec (field 2) replaced: {field number: value}, a repeated
    field becoming that one value (1 = input, 2 = model_prefix: the trainer records its temporary paths there, so
    fixing them makes the model's bytes reproducible). Every other byte of the model is kept as it is."""

    def message(number: int, body: bytes) -> bytes:
        return _encode_varint(number << 3 | 2) + _encode_varint(len(body)) + body

    out = bytearray()
    for number, start, end, value in _fields(model_bytes):
        if number != 2:
            out += model_bytes[start:end]
            continue
        body, seen = bytearray(), set()
        for n, s, e, _ in _fields(value):
            if n not in values:
                body += value[s:e]
            elif n not in seen:
                body += message(n, values[n].encode("utf-8"))
                seen.add(n)
        out += message(2, bytes(body))
    return bytes(out)
