"""Reading labelled files into examples (docs/xlnet.md §9): ``read_table`` (TSV / CSV / JSONL with named columns:
text_a, optional text_b, label; the defaults find the GLUE files' columns as they are), ``read_choices`` (JSONL
multiple choice) and ``read_squad`` (SQuAD v1.1 / v2.0 JSON); the label list and its checks."""

from __future__ import annotations

import csv
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xlnetcli.core.errors import DataError
from xlnetcli.core.shapes import describe, json_field, loads_strict
from xlnetcli.data.corpus.inputs import JSONL_SUFFIXES

TASKS = ("classification", "regression", "multiple-choice", "squad")
# A regression label at most this large in magnitude: its square (the squared error the regression head trains on) must
# fit in float32, else the loss is inf at the first step and the run "diverges" for a reason no learning rate fixes
MAX_REGRESSION_LABEL = math.sqrt((2 - 2**-23) * 2.0**127)  # float32's largest is (2 - 2^-23) * 2^127: ~1.8e19
# Options of one multiple-choice question at most: each option is a sequence of its own, and every question of a file
# is padded to its largest count (RACE, SWAG and ARC have 4 or 5; thousands are a malformed file)
MAX_OPTIONS = 64


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


def _check_regular(path: Path) -> None:
    """A labelled file must be a regular file: a pipe (``<(cat x.tsv)``) or a device can be read only once, and a
    labelled file is read more than once (finetuning records its sha256 to check it on --resume)."""
    if path.is_file():
        return
    if not path.exists():
        raise DataError(f"file not found: {path}")
    kind = "a folder" if path.is_dir() else "not a regular file (a pipe or a device)"
    raise DataError(f"{path} is {kind}; labelled data is read more than once: save it to a file and pass that")


def _read_text(path: Path) -> str:
    _check_regular(path)
    try:
        return path.read_bytes().decode("utf-8-sig")  # no newline translation: a lone \r stays in its cell
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text (byte {e.start})") from None


def _json_rows(path: Path, text: str) -> list[tuple[int, dict[str, Any]]]:
    """[(line number, object)] of a JSONL file's text (blank lines skipped). Lines end at \n only, as JSON Lines
    say: a raw U+2028 or \x1c inside a string (valid JSON, and what ``ensure_ascii=False`` writes) is no line end."""
    rows: list[tuple[int, dict[str, Any]]] = []
    for i, line in enumerate(text.split("\n"), 1):
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


def table_lines(text: str) -> list[str]:
    """The rows of a TSV/CSV text: lines end at \n or \r\n only. ``str.splitlines`` also breaks at U+2028/U+2029,
    \x1c-\x1e, \x85, \v, \f and a lone \r, characters a cell may hold (text pasted from a web page or a PDF); a
    row split there would shift every later column."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [ln[:-1] if ln.endswith("\r") else ln for ln in lines]


Parsed = tuple[list[str] | None, list[tuple[int, Row]]]  # (column names, [(line number, row)]) of one table


def parse_table(path: str | Path, header: bool = True) -> Parsed:
    """A table parsed once, for ``read_table`` and ``read_ids`` both (``parsed=``)."""
    return _rows(Path(path), header)


def _rows(path: Path, header: bool) -> Parsed:
    """(column names, [(line number, row)]) for a TSV/CSV (rows are lists) or JSONL (rows are dicts) file."""
    text = _read_text(path)
    suffix = path.suffix.lower()
    if suffix in JSONL_SUFFIXES:
        json_rows = _json_rows(path, text)
        names = list(json_rows[0][1].keys()) if json_rows else None
        return names, list(json_rows)
    lines = table_lines(text)
    all_rows: list[tuple[int, Row]]
    if suffix == ".csv":
        csv.field_size_limit(min(sys.maxsize, 2**31 - 1))
        try:
            all_rows = [(i, r) for i, r in enumerate(csv.reader(lines), 1) if r and any(c.strip() for c in r)]
        except csv.Error as e:
            raise DataError(f"{path}: cannot parse as {suffix} ({e})") from None
    else:  # .tsv, .txt and anything else: tab separated, no quoting (GLUE files contain bare quotes)
        all_rows = [(i, r) for i, r in enumerate((ln.split("\t") for ln in lines), 1) if any(c.strip() for c in r)]
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
    labels: bool = True,
    parsed: Parsed | None = None,
) -> list[TextExample]:
    """Read a classification/regression file. Columns are names, or 0-based indices with ``header=False``.
    ``labels=False``: the texts alone (`xlnet embed`), every label None and no label column read. ``parsed``: the
    file already parsed (``parse_table``)."""
    path = Path(path)
    columns = columns or Columns()
    names, rows = parsed or _rows(path, header)
    if not rows:
        raise DataError(f"{path}: no examples (the file is empty or has only a header)")
    is_json = isinstance(rows[0][1], dict)
    names, col_a, col_b, col_l = _choose_columns(names, rows, header, is_json, columns)
    if not labels:
        col_l, require_label = None, False
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
        if abs(value) > MAX_REGRESSION_LABEL:
            raise DataError(
                f"{where}: regression label {raw!r} is beyond {MAX_REGRESSION_LABEL:.2g}, whose square (the squared "
                "error) overflows float32; rescale the labels or drop the row"
            )
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
        if len(options) > MAX_OPTIONS:
            raise DataError(
                f"{path}:{line}: {len(options)} options, more than {MAX_OPTIONS} (each option is a sequence of its own "
                "and every question is padded to the most options in the file)"
            )
        label = None if row.get("answer") is None else _answer_index(row["answer"], options, path, line)
        context = _text_cell(context, path, line, "context")
        question = _text_cell(row["question"], path, line, "question")
        qid = _text_cell(row.get("id", line), path, line, "id")
        out.append(ChoiceExample(str(qid), str(context), str(question), options, label, line))
    return out


def _squad_json(path: Path) -> list[Any]:
    """The ``data`` list of a SQuAD JSON file; DataError naming the file otherwise."""
    _check_regular(path)
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
    answer_start outside its paragraph) is refused naming the article, paragraph, question and field; so is a
    question id given twice (the metric is keyed by id, as the official evaluator's: one of the two would be lost)."""
    path = Path(path)
    out = []
    seen: dict[str, str] = {}
    for i, article in enumerate(_squad_objects(_squad_json(path), "data", str(path))):
        for j, para in enumerate(_squad_objects(article.get("paragraphs"), "paragraphs", f"{path}: data[{i}]")):
            where = f"{path}: data[{i}].paragraphs[{j}]"
            context = json_field(para, "context", str, where)
            for qa in _squad_objects(para.get("qas"), "qas", where):
                ex = _squad_question(qa, context, where)
                if ex.qid in seen:
                    raise DataError(
                        f"{path}: question id {ex.qid!r} appears twice (data[{i}].paragraphs[{j}] and "
                        f"{seen[ex.qid]}); ids must be unique: scores are kept by id"
                    )
                seen[ex.qid] = f"data[{i}].paragraphs[{j}]"
                out.append(ex)
    if not out:
        raise DataError(f"{path}: no questions")
    return out


def squad_is_v2(path: str | Path) -> bool:
    """Whether a SQuAD file (read by ``read_squad`` first) has SQuAD 2.0's is_impossible flags."""
    data = _squad_json(Path(path))
    return any("is_impossible" in qa for a in data for p in a["paragraphs"] for qa in p["qas"])


# ---------------------------------------------------------------------------------------------------------------
# Texts without labels (`xlnet embed`)

ID_NAMES = ("id", "idx", "index", "guid")  # the id column `xlnet embed` keeps when a table has one


def read_lines(path: str | Path) -> list[TextExample]:
    """A plain text file, one text per line (lines end at \\n; a trailing \\r is dropped); blank lines are skipped,
    each example keeps its line number."""
    path = Path(path)
    out = [
        TextExample(line.rstrip("\r"), None, None, i)
        for i, line in enumerate(_read_text(path).split("\n"), 1)
        if line.strip()
    ]
    if not out:
        raise DataError(f"{path}: no texts (the file is empty or holds only blank lines)")
    return out


def read_ids(
    path: str | Path, header: bool = True, column: str | None = None, parsed: Parsed | None = None
) -> tuple[str, list[str]] | None:
    """(column, ids) of a table ``read_table`` reads, one per row in its order: ``column``, else the first of
    ``ID_NAMES`` the file has; None when it has none. A missing or empty cell is ''. ``parsed``: as read_table's."""
    path = Path(path)
    names, rows = parsed or _rows(path, header)
    is_json = bool(rows) and isinstance(rows[0][1], dict)
    if is_json:
        names = sorted({k for _, r in rows for k in r})
    elif not header:
        names = [str(i) for i in range(len(rows[0][1]))] if rows else []
    names = names or []
    if column is None:
        column = _pick(names, None, ID_NAMES if header or is_json else ())
        if column is None:
            return None
    elif column not in names:
        raise DataError(f"{path}: missing id column {column!r}; columns are: {', '.join(names)}")
    index = {n: i for i, n in enumerate(names)}
    ids = []
    for line, row in rows:
        value = row.get(column) if isinstance(row, dict) else row[index[column]] if index[column] < len(row) else None
        ids.append(_text_cell(value, path, line, column) or "")
    return column, ids
