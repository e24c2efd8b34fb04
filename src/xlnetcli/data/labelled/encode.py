"""Building model inputs from labelled examples exactly as the original XLNet (docs/xlnet.md §9).

- classification / regression: ``[A <sep> B <sep> <cls>]`` (``[A <sep> <cls>]`` without B), the longer text trimmed
  first (B on ties), segment ids A=0 B=1 <cls>=2, LEFT padding so <cls> is always the last position.
- multiple choice: per option ``[context <sep> question+option <sep> <cls>]`` (a "_" blank in the question is filled
  with the option), left padded; each option is built from a fresh copy of the context (original bug #204).
- SQuAD: ``[paragraph window <sep> question <sep> <cls>]``, RIGHT padding, question cut to max_query_length,
  windows every doc_stride tokens, answers located through per-piece character offsets.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from xlnetcli.core.errors import DataError
from xlnetcli.data.labelled.read import ChoiceExample, SquadExample, TextExample
from xlnetcli.data.special import CLS_ID, PAD_ID, SEG_ID_A, SEG_ID_B, SEG_ID_CLS, SEG_ID_PAD, SEP_ID


class _Cache:
    """Encode each distinct text once (contexts repeat across options and questions)."""

    def __init__(self, tok: Any) -> None:
        self.tok = tok
        self.ids: dict[str, list[int]] = {}

    def __call__(self, text: str) -> list[int]:
        got = self.ids.get(text)
        if got is None:
            got = self.ids[text] = list(self.tok.encode_ids(text))
        return got


# ---------------------------------------------------------------------------------------------------------------
# Encoding: classification, regression, multiple choice


def truncate_pair(a: list[int], b: list[int], max_total: int) -> bool:
    """Trim the longer list from its end (b on ties) until len(a) + len(b) <= max_total. True if anything was cut."""
    cut = False
    while len(a) + len(b) > max_total:
        cut = True
        if len(a) > len(b):
            a.pop()
        else:
            b.pop()
    return cut


def build_pair(a: list[int], b: list[int] | None, max_len: int) -> tuple[list[int], list[int], bool]:
    """[A <sep> B <sep> <cls>] (or [A <sep> <cls>]) ids and segment ids, unpadded. Copies its inputs."""
    a = list(a)
    if b is None:
        cut = len(a) > max_len - 2
        a = a[: max_len - 2]
        return [*a, SEP_ID, CLS_ID], [SEG_ID_A] * (len(a) + 1) + [SEG_ID_CLS], cut
    b = list(b)
    cut = truncate_pair(a, b, max_len - 3)
    ids = [*a, SEP_ID, *b, SEP_ID, CLS_ID]
    seg = [SEG_ID_A] * (len(a) + 1) + [SEG_ID_B] * (len(b) + 1) + [SEG_ID_CLS]
    return ids, seg, cut


@dataclass(frozen=True)
class Reading:
    """How a text becomes the model's input row: windows of ``window`` tokens (finetune.max_seq_length) and, for a
    text longer than one window, ``document`` (finetune.document) with at most ``max_windows`` windows
    (docs/long-documents.md). A row is ``width`` tokens, left padded; its windows are counted from its end, so the
    last one ends with <cls> and only the first holds padding.

    - ``first``: [A <sep> B <sep> <cls>] in one window, the longer text cut first (the original XLNet);
    - ``memory``: the same sequence over up to ``max_windows`` windows, read in order through the memory;
    - ``window-mean``: A cut into chunks, each its own window [chunk <sep> B <sep> <cls>] (B repeated, cut to half a
      window when A spills over), read independently."""

    window: int
    document: str = "first"
    max_windows: int = 1

    @classmethod
    def of(cls, ft: Any) -> Reading:
        """The reading a FinetuneConfig asks for."""
        return cls(ft.max_seq_length, ft.document, 1 if ft.document == "first" else ft.max_windows)

    @property
    def width(self) -> int:
        return self.window * self.max_windows

    def describe(self, mem_len: int) -> str:
        """How texts are read, in words (a header's or a report's line); ``mem_len``: the memory's states."""
        w = f"{self.window} tokens"
        if self.document == "first":
            return f"the first window of {w} (longer texts cut)"
        if self.document == "window-mean":
            return f"up to {self.max_windows} windows of {w}, each read apart, averaged"
        return f"up to {self.max_windows} windows of {w} in order through a memory of {mem_len} states"

    def pair(self, a: list[int], b: list[int] | None) -> tuple[list[int], list[int], bool]:
        """ids, segment ids (unpadded, at most ``width``) and whether anything was cut. Copies its inputs."""
        if self.document != "window-mean":
            return build_pair(a, b, self.width)
        room = self.window - (2 if b is None else 3)
        cut = False
        if b is not None and len(a) + len(b) > room:
            keep = max(room - len(a), room // 2)
            cut, b = len(b) > keep, list(b[:keep])
        chunk = max(1, room - (0 if b is None else len(b)))
        cut |= len(a) > chunk * self.max_windows
        a = list(a[: chunk * self.max_windows])
        first = len(a) - chunk * max(0, -(-len(a) // chunk) - 1)  # the first chunk takes the remainder
        ids: list[int] = []
        seg: list[int] = []
        for lo, hi in [(0, first)] + [(s, s + chunk) for s in range(first, len(a), chunk)]:
            w_ids, w_seg, _ = build_pair(a[lo:hi], b, self.window)
            ids += w_ids
            seg += w_seg
        return ids, seg, cut


def left_pad(ids: list[int], seg: list[int], max_len: int) -> tuple[list[int], list[int], list[int]]:
    n = max_len - len(ids)
    return [PAD_ID] * n + ids, [SEG_ID_PAD] * n + seg, [0] * n + [1] * len(ids)


# The arrays whose last axis is the sequence: a batch keeps only the columns where some row has a real token.
SEQUENCE_KEYS = ("input_ids", "token_type_ids", "attention_mask", "p_mask")
# Token positions within a sequence (SQuAD's labels and <cls>): they move when leading columns are cut.
POSITION_KEYS = ("start_positions", "end_positions", "cls_index")


@dataclass
class Encoded:
    arrays: dict[str, np.ndarray]
    n_truncated: int = 0
    n_examples: int = 0
    n_skipped: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(next(iter(self.arrays.values())))

    def _real(self) -> np.ndarray:
        """[rows, sequences per row (a choice's options), L]: which positions hold a real token."""
        mask = self.arrays["attention_mask"]
        return (mask != 0).reshape(len(mask), -1, mask.shape[-1])

    def sequence_lengths(self) -> np.ndarray:
        """[rows, sequences per row]: the real tokens of each sequence (each option of a choice)."""
        return self._real().sum(-1)

    def lengths(self) -> np.ndarray:
        """Per row, the real tokens of its longest sequence (a choice's longest option): the width ``batch`` pads the
        row to (real tokens are contiguous: left-padded texts and choices, right-padded SQuAD windows)."""
        return self.sequence_lengths().max(-1)

    def real_tokens(self) -> np.ndarray:
        """Per row, its real tokens (every option of a choice): the work a row asks for, padding left out."""
        return self._real().sum((1, 2))

    def by_length(self, batch_size: int) -> list[np.ndarray]:
        """Row indices in batches of ``batch_size`` for inference, shortest examples first (a stable sort by
        ``lengths``): each batch is then padded to little more than its own rows. The caller puts the outputs back in
        row order (``np.concatenate(batches)`` is the permutation)."""
        order = np.argsort(self.lengths(), kind="stable")
        return [order[s : s + batch_size] for s in range(0, len(order), batch_size)]

    def batch(self, idx: np.ndarray, keys: Sequence[str]) -> dict[str, np.ndarray]:
        """Rows ``idx`` of ``keys``, padded only to the batch's longest example: the leading (left padding: texts,
        choices) or trailing (right padding: SQuAD windows) columns that hold no real token in any row are cut. The
        model's outputs for the real tokens are the same (relative positions and masked keys do not see padding);
        only the compute on padding goes. Positions (``POSITION_KEYS``) move with a leading cut; SQuAD windows are
        right padded, so their positions never move."""
        out = {k: self.arrays[k][idx] for k in keys}
        mask = out["attention_mask"] if "attention_mask" in out else self.arrays["attention_mask"][idx]
        real = (mask != 0).reshape(-1, mask.shape[-1]).any(0)
        if not real.any():
            return out
        lo, hi = int(real.argmax()), len(real) - int(real[::-1].argmax())
        if lo and any(k in out for k in POSITION_KEYS):
            lo = 0  # positions are read against the full window (squad_predictions): keep them where they are
        for k in SEQUENCE_KEYS:
            if k in out:
                out[k] = np.ascontiguousarray(out[k][..., lo:hi])
        return out


def in_row_order(outputs: Sequence[np.ndarray], batches: Sequence[np.ndarray]) -> np.ndarray:
    """The outputs of ``batches`` (Encoded.by_length: ``outputs[b][i]`` belongs to row ``batches[b][i]``), indexed by
    row."""
    values = np.concatenate(outputs)
    out = np.empty_like(values)
    out[np.concatenate(batches)] = values
    return out


def encode_texts(
    tok: Any,
    examples: Sequence[TextExample],
    max_len: int | Reading,
    task: str,
    label_list: Sequence[str] | None = None,
) -> Encoded:
    """``max_len``: tokens per example (one window), or a Reading (texts over several windows)."""
    reading = max_len if isinstance(max_len, Reading) else Reading(max_len)
    if reading.window < 4:
        raise DataError(f"finetune.max_seq_length must be >= 4, got {reading.window}")
    max_len = reading.width
    enc = _Cache(tok)
    label_index = {lab: i for i, lab in enumerate(label_list or [])}
    n = len(examples)
    ids_arr = np.full((n, max_len), PAD_ID, dtype=np.int64)
    seg_arr = np.full((n, max_len), SEG_ID_PAD, dtype=np.int64)
    mask_arr = np.zeros((n, max_len), dtype=np.float32)
    labels = np.zeros(n, dtype=np.float32 if task == "regression" else np.int64)
    has_label = np.zeros(n, dtype=bool)
    cut_rows = np.zeros(n, dtype=bool)
    n_cut = n_blank = 0
    for i, ex in enumerate(examples):
        ids, seg, cut = reading.pair(enc(ex.text_a), None if ex.text_b is None else enc(ex.text_b))
        n_cut += cut
        cut_rows[i] = cut
        n_blank += len(ids) == (2 if ex.text_b is None else 3)  # no piece of text: <sep> (<sep>) <cls> only
        ids, seg, mask = left_pad(ids, seg, max_len)
        ids_arr[i], seg_arr[i], mask_arr[i] = ids, seg, mask
        if ex.label is not None:
            has_label[i] = True
            labels[i] = ex.label if task == "regression" else label_index.get(ex.label, -1)
    arrays: dict[str, np.ndarray] = {
        "input_ids": ids_arr,
        "token_type_ids": seg_arr,
        "attention_mask": mask_arr,
        "labels": labels,
    }
    extra = {"has_label": has_label, "blank": n_blank, "cut": cut_rows}  # cut: which rows lost tokens
    return Encoded(arrays, n_truncated=n_cut, n_examples=n, extra=extra)


def encode_choices(tok: Any, examples: Sequence[ChoiceExample], max_len: int | Reading) -> Encoded:
    """``max_len``: tokens per option (one window), or a Reading (contexts over several windows)."""
    reading = max_len if isinstance(max_len, Reading) else Reading(max_len)
    max_len = reading.width
    enc = _Cache(tok)
    n = len(examples)
    k = max(len(ex.options) for ex in examples)
    ids_arr = np.full((n, k, max_len), PAD_ID, dtype=np.int64)
    seg_arr = np.full((n, k, max_len), SEG_ID_PAD, dtype=np.int64)
    mask_arr = np.zeros((n, k, max_len), dtype=np.float32)
    option_mask = np.zeros((n, k), dtype=np.float32)
    labels = np.zeros(n, dtype=np.int64)
    n_cut = 0
    for i, ex in enumerate(examples):
        context = enc(ex.context)
        cut_any = False
        for j, option in enumerate(ex.options):
            qa = ex.question.replace("_", option) if "_" in ex.question else f"{ex.question} {option}"
            ids, seg, cut = reading.pair(context, enc(qa))  # pair copies: no leak across options
            cut_any |= cut
            ids, seg, mask = left_pad(ids, seg, max_len)
            ids_arr[i, j], seg_arr[i, j], mask_arr[i, j] = ids, seg, mask
            option_mask[i, j] = 1.0
        n_cut += cut_any
        labels[i] = -1 if ex.label is None else ex.label
    arrays: dict[str, np.ndarray] = {
        "input_ids": ids_arr,
        "token_type_ids": seg_arr,
        "attention_mask": mask_arr,
        "option_mask": option_mask,
        "labels": labels,
    }
    return Encoded(arrays, n_truncated=n_cut, n_examples=n)


# ---------------------------------------------------------------------------------------------------------------
# SQuAD

_WORD = re.compile(r"\S+")


def tokenize_with_offsets(tok: Any, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """Token ids of ``text`` and the character span [start, end) of each token in ``text``.

    SentencePiece never lets a piece cross whitespace, so encoding word by word gives the same pieces as encoding the
    whole text. Within a word, piece offsets are exact when normalisation kept the word's length (the usual case);
    otherwise every piece of that word maps to the whole word.
    """
    ids: list[int] = []
    offsets: list[tuple[int, int]] = []
    normalize = getattr(tok, "normalize", None)
    for m in _WORD.finditer(text):
        word, w0 = m.group(), m.start()
        wids = list(tok.encode_ids(word))
        if not wids:
            continue
        pieces = list(tok.encode_pieces(word))
        norm = normalize(word) if normalize else word
        stripped = [p.replace("\u2581", "") for p in pieces]
        exact = len(pieces) == len(wids) and len(norm) == len(word) and "".join(stripped).lower() == norm.lower()
        pos = w0
        for j, tid in enumerate(wids):
            if exact:
                offsets.append((pos, pos + len(stripped[j])))
                pos += len(stripped[j])
            else:
                offsets.append((w0, w0 + len(word)))
            ids.append(tid)
    return ids, offsets


def _find_answer(context: str, text: str, start: int) -> tuple[int, int] | None:
    """Character span of ``text`` in ``context``: at the given start if it matches, else the nearest occurrence."""
    text = text.strip()
    if not text:
        return None
    if context[start : start + len(text)] == text:
        return start, start + len(text)
    hits = [m.start() for m in re.finditer(re.escape(text), context)]
    if not hits:
        return None
    h = min(hits, key=lambda h: abs(h - start))
    return h, h + len(text)


def _max_context(spans: list[tuple[int, int]], span_index: int, pos: int) -> bool:
    """Is span ``span_index`` the one where token ``pos`` has the most context (min of left/right, +0.01*length)?"""
    best, best_i = None, None
    for i, (s, length) in enumerate(spans):
        if not s <= pos < s + length:
            continue
        score = min(pos - s, s + length - 1 - pos) + 0.01 * length
        if best is None or score > best:
            best, best_i = score, i
    return best_i == span_index


# The features of a SQuAD window: what the model's QA head reads, then the answer labels training adds.
SQUAD_INPUTS = ("input_ids", "token_type_ids", "attention_mask", "p_mask", "cls_index")
SQUAD_LABELS = ("start_positions", "end_positions", "is_impossible")
SQUAD_FEATURES = SQUAD_INPUTS + SQUAD_LABELS


def encode_squad(
    tok: Any,
    examples: Sequence[SquadExample],
    max_len: int,
    doc_stride: int,
    max_query_length: int,
    training: bool,
    where: str = "SQuAD data",
) -> Encoded:
    """Features (one per paragraph window) plus what post-processing needs (``extra``); ``where`` names the file in
    messages."""
    if max_len < max_query_length + 8:
        raise DataError(f"finetune.max_seq_length ({max_len}) must exceed max_query_length ({max_query_length}) + 8")
    feats: dict[str, list] = {k: [] for k in SQUAD_FEATURES}
    meta: list[dict] = []  # per feature: example index, token -> char offsets, max-context flags
    n_skipped = n_query_cut = n_windows_extra = 0
    para_cache: dict[str, tuple[list[int], list[tuple[int, int]]]] = {}
    for ei, ex in enumerate(examples):
        if ex.context not in para_cache:
            para_cache[ex.context] = tokenize_with_offsets(tok, ex.context)
        doc_ids, doc_offsets = para_cache[ex.context]
        q_ids = list(tok.encode_ids(ex.question))
        if len(q_ids) > max_query_length:
            q_ids = q_ids[:max_query_length]
            n_query_cut += 1
        answer = None
        if training and not ex.is_impossible:
            answer = _answer_tokens(ex, doc_offsets)
            if answer is None:
                n_skipped += 1  # answer not found in its context: skip the question (counted, reported)
                continue
        spans = _doc_spans(len(doc_ids), max_len - len(q_ids) - 3, doc_stride)
        n_windows_extra += len(spans) - 1
        for si, (s, length) in enumerate(spans):
            _add_window(feats, doc_ids[s : s + length], q_ids, max_len, answer, s)
            meta.append(
                {
                    "example": ei,
                    "offsets": doc_offsets[s : s + length],
                    "max_context": [_max_context(spans, si, s + t) for t in range(length)],
                }
            )
    if not meta:
        raise DataError(f"{where}: no SQuAD features: every answer was missing from its context")
    dtypes = {"attention_mask": np.float32, "p_mask": np.float32, "is_impossible": np.float32}
    arrays = {k: np.asarray(v, dtype=dtypes.get(k, np.int64)) for k, v in feats.items()}
    arrays["feature_index"] = np.arange(len(meta), dtype=np.int64)
    return Encoded(
        arrays,
        n_truncated=n_query_cut,
        n_examples=len(examples),
        n_skipped=n_skipped,
        extra={"meta": meta, "windows_extra": n_windows_extra},
    )


def _answer_tokens(ex: SquadExample, doc_offsets: list[tuple[int, int]]) -> tuple[int, int] | None:
    """(first, last) context token of the first answer, or None if it is not found in its context."""
    found = _find_answer(ex.context, ex.answers[0], ex.answer_starts[0])
    if found is None:
        return None
    c0, c1 = found
    inside = [i for i, (s, e) in enumerate(doc_offsets) if s < c1 and e > c0]
    return (inside[0], inside[-1]) if inside else None


def _doc_spans(n_doc: int, max_doc: int, doc_stride: int) -> list[tuple[int, int]]:
    """(start, length) windows of at most ``max_doc`` context tokens, ``doc_stride`` apart, covering the context."""
    spans: list[tuple[int, int]] = []
    s = 0
    while True:
        length = min(n_doc - s, max_doc)
        spans.append((s, length))
        if s + length >= n_doc:
            return spans
        s += min(length, doc_stride)


def _add_window(
    feats: dict[str, list], doc: list[int], q_ids: list[int], max_len: int, answer: tuple[int, int] | None, s: int
) -> None:
    """Append one window's feature: [context | <sep> | question | <sep> | <cls>] padded to ``max_len`` (XLNet puts
    <cls> last); the answer's positions in the window, or <cls>'s when it is not inside (impossible)."""
    length = len(doc)
    ids = [*doc, SEP_ID, *q_ids, SEP_ID, CLS_ID]
    seg = [SEG_ID_A] * (length + 1) + [SEG_ID_B] * (len(q_ids) + 1) + [SEG_ID_CLS]
    p_mask = [0] * length + [1] * (len(q_ids) + 2) + [0]
    cls_index = len(ids) - 1
    pad = max_len - len(ids)
    feats["input_ids"].append(ids + [PAD_ID] * pad)
    feats["token_type_ids"].append(seg + [SEG_ID_PAD] * pad)
    feats["attention_mask"].append([1] * len(ids) + [0] * pad)
    feats["p_mask"].append(p_mask + [1] * pad)
    feats["cls_index"].append(cls_index)
    impossible = True
    start = end = cls_index
    if answer is not None and s <= answer[0] and answer[1] < s + length:
        impossible, start, end = False, answer[0] - s, answer[1] - s
    feats["start_positions"].append(start)
    feats["end_positions"].append(end)
    feats["is_impossible"].append(float(impossible))


def squad_predictions(
    examples: Sequence[SquadExample], enc: Encoded, outputs: dict[str, np.ndarray], max_answer_length: int
) -> tuple[dict[str, str], dict[str, float]]:
    """Best non-null answer text and null odds (min over windows of the answerability logit) per question.

    outputs (per feature): start_top_log_probs / start_top_index [N, k], end_top_log_probs / end_top_index [N, k, k]
    (end candidates for each start candidate), cls_logits [N].
    """
    meta = enc.extra["meta"]
    best: dict[int, tuple[float, str]] = {}
    null: dict[int, float] = {}
    for f, m in enumerate(meta):
        ei = m["example"]
        ctx = examples[ei].context
        null[ei] = min(null.get(ei, float("inf")), float(outputs["cls_logits"][f]))
        n_doc = len(m["offsets"])
        for i in range(outputs["start_top_index"].shape[1]):
            s = int(outputs["start_top_index"][f, i])
            if s >= n_doc or not m["max_context"][s]:
                continue
            for j in range(outputs["end_top_index"].shape[2]):
                e = int(outputs["end_top_index"][f, i, j])
                if e >= n_doc or e < s or e - s + 1 > max_answer_length:
                    continue
                score = float(outputs["start_top_log_probs"][f, i]) + float(outputs["end_top_log_probs"][f, i, j])
                if ei not in best or score > best[ei][0]:
                    best[ei] = (score, ctx[m["offsets"][s][0] : m["offsets"][e][1]])
    preds = {ex.qid: best.get(i, (0.0, ""))[1] for i, ex in enumerate(examples)}
    odds = {ex.qid: null.get(i, 0.0) for i, ex in enumerate(examples)}
    return preds, odds
