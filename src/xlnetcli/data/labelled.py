"""Finetuning data: reading labelled files and building model inputs exactly as the original XLNet (docs/xlnet.md §9).

Readers
- ``read_table``: TSV / CSV / JSONL with named columns (text_a, optional text_b, label). Defaults find the columns
  of the GLUE files as they are (SST-2 ``sentence``, MNLI ``sentence1/sentence2/gold_label``, STS-B ``score``,
  QQP ``question1/question2/is_duplicate``, QNLI ``question/sentence``, MRPC ``#1 String/#2 String/Quality``).
- ``read_choices``: JSONL multiple choice, one question per line: {"context" (or "article"), "question", "options":
  [...], "answer": index | letter "A".. | option text}.
- ``read_squad``: SQuAD v1.1 / v2.0 JSON.

Encoders
- classification / regression: ``[A <sep> B <sep> <cls>]`` (``[A <sep> <cls>]`` without B), the longer text trimmed
  first (B on ties), segment ids A=0 B=1 <cls>=2, LEFT padding so <cls> is always the last position.
- multiple choice: per option ``[context <sep> question+option <sep> <cls>]`` (a "_" blank in the question is filled
  with the option), left padded; each option is built from a fresh copy of the context (original bug #204).
- SQuAD: ``[paragraph window <sep> question <sep> <cls>]``, RIGHT padding, question cut to max_query_length,
  windows every doc_stride tokens, answers located through per-piece character offsets.
"""

from __future__ import annotations

import csv
import json
import math
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from xlnetcli.core.errors import DataError
from xlnetcli.core.shapes import describe, json_field, loads_strict
from xlnetcli.data.corpus.inputs import JSONL_SUFFIXES
from xlnetcli.data.special import CLS_ID, PAD_ID, SEG_ID_A, SEG_ID_B, SEG_ID_CLS, SEG_ID_PAD, SEP_ID

TASKS = ("classification", "regression", "multiple-choice", "squad")


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
# Examples


@dataclass
class TextExample:
    text_a: str
    text_b: str | None
    label: Any  # str (classification), float (regression) or None (unlabelled)
    line: int = 0


@dataclass
class ChoiceExample:
    id: str
    context: str
    question: str
    options: list[str]
    label: int | None
    line: int = 0


@dataclass
class SquadExample:
    qid: str
    question: str
    context: str
    answers: list[str]  # gold texts (empty for unanswerable)
    answer_starts: list[int]
    is_impossible: bool


@dataclass
class Columns:
    text_a: str | None = None  # None = find a known name (text_a, text, sentence, sentence1, question1, ...)
    text_b: str | None = None  # None = find a known name; "" = no second text
    label: str | None = None  # None = find a known name (label, gold_label, score, is_duplicate, Quality)


_PAIR_NAMES = [
    ("text_a", "text_b"),
    ("sentence1", "sentence2"),
    ("question1", "question2"),
    ("#1 String", "#2 String"),
    ("question", "sentence"),
    ("premise", "hypothesis"),
]
_SINGLE_NAMES = ["text_a", "text", "sentence", "sentence1", "question", "content", "review"]
_LABEL_NAMES = ["label", "gold_label", "score", "is_duplicate", "Quality", "target", "y"]


# One row of a labelled file: a list of cells (TSV / CSV) or a JSON object (JSONL).
Row = list[str] | dict[str, Any]


def _read_text(path: Path) -> str:
    if not path.is_file():
        raise DataError(f"file not found: {path}")
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text (byte {e.start})") from None


def _json_rows(path: Path, text: str) -> list[tuple[int, dict[str, Any]]]:
    """[(line number, object)] of a JSONL file's text (blank lines skipped)."""
    rows: list[tuple[int, dict[str, Any]]] = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = loads_strict(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{i}: not valid JSON ({e.msg})") from None
        except (ValueError, RecursionError) as e:  # NaN/Infinity, nesting deeper than Python's stack
            raise DataError(f"{path}:{i}: not valid JSON ({type(e).__name__})") from None
        if not isinstance(obj, dict):
            raise DataError(f"{path}:{i}: expected a JSON object per line")
        rows.append((i, obj))
    return rows


def _rows(path: Path, header: bool) -> tuple[list[str] | None, list[tuple[int, Row]]]:
    """(column names, [(line number, row)]) for a TSV/CSV (rows are lists) or JSONL (rows are dicts) file."""
    text = _read_text(path)
    suffix = path.suffix.lower()
    if suffix in JSONL_SUFFIXES:
        json_rows = _json_rows(path, text)
        names = list(json_rows[0][1].keys()) if json_rows else None
        return names, list(json_rows)
    if suffix == ".csv":
        reader = csv.reader(text.splitlines())
    else:  # .tsv, .txt and anything else: tab separated, no quoting (GLUE files contain bare quotes)
        reader = csv.reader(text.splitlines(), delimiter="\t", quoting=csv.QUOTE_NONE)
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1))
    try:
        all_rows: list[tuple[int, Row]] = [(i, r) for i, r in enumerate(reader, 1) if r and any(c.strip() for c in r)]
    except csv.Error as e:
        raise DataError(f"{path}: cannot parse as {suffix or 'TSV'} ({e})") from None
    if not header:
        return None, all_rows
    if not all_rows:
        return None, []
    names = [c.strip() for c in all_rows[0][1]]
    return names, all_rows[1:]


def _pick(names: Sequence[str], want: str | None, candidates: Sequence[str]) -> str | None:
    if want is not None:
        return want
    for c in candidates:
        if c in names:
            return c
    return None


def read_table(
    path: str | Path,
    task: str = "classification",
    columns: Columns | None = None,
    header: bool = True,
    require_label: bool = True,
) -> list[TextExample]:
    """Read a classification/regression file. Columns are names, or 0-based indices with ``header=False``."""
    path = Path(path)
    columns = columns or Columns()
    names, rows = _rows(path, header)
    if not rows:
        raise DataError(f"{path}: no examples (the file is empty or has only a header)")
    is_json = isinstance(rows[0][1], dict)
    names, col_a, col_b, col_l = _choose_columns(names, rows, header, is_json, columns)
    _check_columns(path, names, col_a, col_b, col_l, require_label)
    assert col_a is not None  # _check_columns refused a file without a text_a column
    label_col = col_l if col_l is not None and col_l in names else None
    index = {n: i for i, n in enumerate(names)}
    out = []
    for line, row in rows:
        if not isinstance(row, dict) and len(row) != len(names):  # all rows are dicts (JSONL) or all lists
            _refuse_width(path, line, len(row), len(names), header)

        def get(name: str, _row: Row = row) -> Any:
            return _row.get(name) if isinstance(_row, dict) else _row[index[name]]

        a = _text_cell(get(col_a), path, line, col_a)
        if a is None:
            raise DataError(f"{path}:{line}: no {col_a!r} field")
        b = _text_cell(get(col_b), path, line, col_b) if col_b else None
        label = (
            _parse_label(get(label_col), f"{path}:{line}", label_col, task, require_label)
            if label_col is not None
            else None
        )
        out.append(TextExample(str(a), None if b is None else str(b), label, line))
    return out


def _choose_columns(
    names: list[str] | None, rows: Sequence[tuple[int, Row]], header: bool, is_json: bool, columns: Columns
) -> tuple[list[str], str | None, str, str | None]:
    """(column names, text_a, text_b, label): the columns asked for, else the usual names (``_PAIR_NAMES``,
    ``_SINGLE_NAMES``, ``_LABEL_NAMES``); without a header, indices: text_a 0, label the last."""
    if not header and not is_json:
        width = len(rows[0][1])
        return (
            [str(i) for i in range(width)],
            columns.text_a if columns.text_a is not None else "0",
            columns.text_b if columns.text_b is not None else "",
            columns.label if columns.label is not None else (str(width - 1) if width > 1 else None),
        )
    assert names is not None
    if is_json:
        names = sorted({k for _, r in rows for k in r})
    col_a, col_b = columns.text_a, columns.text_b
    if col_a is None:
        for a, b in _PAIR_NAMES:
            if a in names and b in names:
                col_a, col_b = a, (b if col_b is None else col_b)
                break
        else:
            col_a = _pick(names, None, _SINGLE_NAMES)
    if col_b is None:
        col_b = next((b for a, b in _PAIR_NAMES if a == col_a and b in names), "")
    return names, col_a, col_b, _pick(names, columns.label, _LABEL_NAMES)


def _refuse_width(path: Path, line: int, found: int, want: int, header: bool) -> None:
    """A TSV/CSV row whose field count differs from the header's (or, without one, the first row's)."""
    than = "the header has" if header else "the first row has"
    why = (
        "a tab (or, in CSV, a comma) inside a text? remove it, or write the file as CSV with that text quoted"
        if found > want
        else "a missing field or a line break inside a text? fix the row"
    )
    raise DataError(f"{path}:{line}: {found} fields, {than} {want} ({why})")


def _text_cell(value: Any, path: Path, line: int, column: str) -> str | None:
    """A text field as a string (a JSON number is its text); a JSON list, object or boolean is refused."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise DataError(f"{path}:{line}: field {column!r} must be text, found {describe(value)}")


def _check_columns(
    path: Path, names: list[str], col_a: str | None, col_b: str, col_l: str | None, require_label: bool
) -> None:
    """Refuse, in one line naming the file's columns, a text or (required) label column the file lacks, a column
    chosen for two roles and a header naming a column twice (which one would be read?)."""
    dup = sorted({n for n in names if n and names.count(n) > 1})
    if dup:
        raise DataError(f"{path}: the header names column {dup[0]!r} twice; rename one of them")
    roles = [("text_a", col_a), ("text_b", col_b or None), ("label", col_l if col_l in names else None)]
    for i, (role, col) in enumerate(roles):
        other = next((r for r, c in roles[i + 1 :] if col is not None and c == col), None)
        if other:
            raise DataError(
                f"{path}: column {col!r} is chosen as both {role} and {other}; choose different columns with "
                "--text-a-column / --text-b-column / --label-column"
            )
    missing = []
    if col_a is None:
        missing.append("text_a (none of: " + ", ".join(_SINGLE_NAMES) + ")")
    elif col_a not in names:
        missing.append(repr(col_a))
    if col_b and col_b not in names:
        missing.append(repr(col_b))
    if require_label and (col_l is None or col_l not in names):
        missing.append(repr(col_l) if col_l else "label (none of: " + ", ".join(_LABEL_NAMES) + ")")
    if missing:
        raise DataError(
            f"{path}: missing column(s) {', '.join(missing)}; columns are: {', '.join(names)} "
            "(choose with --text-a-column / --text-b-column / --label-column)"
        )


def _parse_label(raw: Any, where: str, col_l: str, task: str, require_label: bool) -> Any:
    """A label cell: a float for regression, else the stripped string; None if empty (refused if required)."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        if require_label:
            raise DataError(f"{where}: empty label in column {col_l!r}")
        return None
    if isinstance(raw, (bool, list, dict)):
        raise DataError(f"{where}: label in column {col_l!r} must be text or a number, found {describe(raw)}")
    if task == "regression":
        try:
            value = float(raw)
        except (TypeError, ValueError):
            raise DataError(f"{where}: regression label {raw!r} is not a number") from None
        if not math.isfinite(value):
            raise DataError(f"{where}: regression label {raw!r} is not a finite number; fix or drop the row")
        return value
    return str(raw).strip()


def build_label_list(train: Sequence[TextExample]) -> list[str]:
    labels = {ex.label for ex in train if ex.label is not None}
    try:
        return sorted(labels, key=lambda s: (0, float(s), s))
    except ValueError:
        return sorted(labels)


def check_labels(
    examples: Sequence[TextExample], label_list: Sequence[str], path: str | Path, train_path: str | Path | None = None
) -> None:
    known = set(label_list)
    unseen: dict[str, int] = {}
    for ex in examples:
        if ex.label is not None and ex.label not in known:
            unseen[ex.label] = unseen.get(ex.label, 0) + 1
    if unseen:
        shown = ", ".join(f"{k!r} ({v}x)" for k, v in sorted(unseen.items())[:5])
        where = f"the training file {train_path}" if train_path else "the training data"
        raise DataError(f"{path}: label(s) never seen in {where}: {shown}; known labels: {', '.join(label_list)}")


def _answer_index(raw: Any, options: list[str], path: Path, line: int) -> int:
    if isinstance(raw, bool):
        raise DataError(f"{path}:{line}: answer {raw!r} is not an option index, letter or text")
    if isinstance(raw, int):
        idx = raw
    elif isinstance(raw, str) and len(raw.strip()) == 1 and raw.strip().upper().isalpha():
        idx = ord(raw.strip().upper()) - ord("A")
    elif isinstance(raw, str) and raw.strip().isdigit():
        idx = int(raw.strip())
    elif isinstance(raw, str) and raw in options:
        idx = options.index(raw)
    else:
        raise DataError(f"{path}:{line}: answer {raw!r} is not an option index, letter or text")
    if not 0 <= idx < len(options):
        raise DataError(f"{path}:{line}: answer {raw!r} out of range for {len(options)} options")
    return idx


def read_choices(path: str | Path, require_label: bool = True) -> list[ChoiceExample]:
    path = Path(path)
    if path.suffix.lower() not in JSONL_SUFFIXES:
        raise DataError(f"{path}: multiple choice data must be JSONL (context, question, options, answer)")
    rows = _json_rows(path, _read_text(path))
    if not rows:
        raise DataError(f"{path}: no examples (the file is empty)")
    out = []
    for line, row in rows:
        context = row.get("context", row.get("article"))
        missing = [
            k
            for k, v in (("context", context), ("question", row.get("question")), ("options", row.get("options")))
            if v is None
        ]
        if require_label and row.get("answer") is None:
            missing.append("answer")
        if missing:
            raise DataError(
                f"{path}:{line}: missing field(s) {', '.join(missing)} "
                "(each line needs context, question, options, answer)"
            )
        options = row["options"]
        if not isinstance(options, list) or len(options) < 2 or not all(isinstance(o, str) for o in options):
            raise DataError(f"{path}:{line}: options must be a list of at least 2 strings")
        label = None if row.get("answer") is None else _answer_index(row["answer"], options, path, line)
        context = _text_cell(context, path, line, "context")
        question = _text_cell(row["question"], path, line, "question")
        qid = _text_cell(row.get("id", line), path, line, "id")
        out.append(ChoiceExample(str(qid), str(context), str(question), options, label, line))
    return out


def _squad_json(path: Path) -> list[Any]:
    """The ``data`` list of a SQuAD JSON file; DataError naming the file otherwise."""
    if not path.is_file():
        raise DataError(f"file not found: {path}")
    try:
        raw = loads_strict(path.read_text(encoding="utf-8-sig"))
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise DataError(f"{path}: not a SQuAD JSON file ({str(e).splitlines()[0][:100]})") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("data"), list):
        raise DataError(f'{path}: not a SQuAD JSON file (expected {{"data": [{{"paragraphs": ...}}]}})')
    return raw["data"]


def _squad_objects(items: Any, key: str, where: str) -> list[dict[str, Any]]:
    """``items`` (the value of ``key``) as a list of objects, else DataError naming ``where`` and the field."""
    if not isinstance(items, list) or not all(isinstance(x, dict) for x in items):
        raise DataError(f"{where}: field {key!r} must be a list of objects, found {describe(items)}")
    return items


def _squad_question(qa: dict[str, Any], context: str, where: str) -> SquadExample:
    qid = json_field(qa, "id", (str, int), where)
    where = f"{where} question {qid!r}"
    impossible = json_field(qa, "is_impossible", bool, where, default=False)
    answers = [] if impossible else _squad_objects(qa.get("answers", []), "answers", where)
    texts = [json_field(a, "text", str, where) for a in answers]
    starts = [json_field(a, "answer_start", int, where, lo=0, hi=len(context)) for a in answers]
    question = json_field(qa, "question", str, where)
    return SquadExample(str(qid), question, context, texts, starts, impossible or not answers)


def read_squad(path: str | Path) -> list[SquadExample]:
    """SQuAD v1.1 / v2.0 JSON; an entry of the wrong shape (a missing field, a number where text belongs, an
    answer_start outside its paragraph) is refused naming the article, paragraph, question and field."""
    path = Path(path)
    out = []
    for i, article in enumerate(_squad_objects(_squad_json(path), "data", str(path))):
        for j, para in enumerate(_squad_objects(article.get("paragraphs"), "paragraphs", f"{path}: data[{i}]")):
            where = f"{path}: data[{i}].paragraphs[{j}]"
            context = json_field(para, "context", str, where)
            out += [_squad_question(qa, context, where) for qa in _squad_objects(para.get("qas"), "qas", where)]
    if not out:
        raise DataError(f"{path}: no questions")
    return out


def squad_is_v2(path: str | Path) -> bool:
    """Whether a SQuAD file (read by ``read_squad`` first) has SQuAD 2.0's is_impossible flags."""
    data = _squad_json(Path(path))
    return any("is_impossible" in qa for a in data for p in a["paragraphs"] for qa in p["qas"])


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


def left_pad(ids: list[int], seg: list[int], max_len: int) -> tuple[list[int], list[int], list[int]]:
    n = max_len - len(ids)
    return [PAD_ID] * n + ids, [SEG_ID_PAD] * n + seg, [0] * n + [1] * len(ids)


@dataclass
class Encoded:
    arrays: dict[str, np.ndarray]
    n_truncated: int = 0
    n_examples: int = 0
    n_skipped: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(next(iter(self.arrays.values())))


def encode_texts(
    tok: Any, examples: Sequence[TextExample], max_len: int, task: str, label_list: Sequence[str] | None = None
) -> Encoded:
    if max_len < 4:
        raise DataError(f"finetune.max_seq_length must be >= 4, got {max_len}")
    enc = _Cache(tok)
    label_index = {lab: i for i, lab in enumerate(label_list or [])}
    n = len(examples)
    ids_arr = np.full((n, max_len), PAD_ID, dtype=np.int64)
    seg_arr = np.full((n, max_len), SEG_ID_PAD, dtype=np.int64)
    mask_arr = np.zeros((n, max_len), dtype=np.float32)
    labels = np.zeros(n, dtype=np.float32 if task == "regression" else np.int64)
    has_label = np.zeros(n, dtype=bool)
    n_cut = 0
    for i, ex in enumerate(examples):
        ids, seg, cut = build_pair(enc(ex.text_a), None if ex.text_b is None else enc(ex.text_b), max_len)
        n_cut += cut
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
    return Encoded(arrays, n_truncated=n_cut, n_examples=n, extra={"has_label": has_label})


def encode_choices(tok: Any, examples: Sequence[ChoiceExample], max_len: int) -> Encoded:
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
            ids, seg, cut = build_pair(context, enc(qa), max_len)  # build_pair copies: no leak across options
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
    tok: Any, examples: Sequence[SquadExample], max_len: int, doc_stride: int, max_query_length: int, training: bool
) -> Encoded:
    """Features (one per paragraph window) plus what post-processing needs (``extra``)."""
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
        raise DataError("no SQuAD features: every answer was missing from its context")
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
