"""Issue 22, class 3: labelled data is validated, not taken at face value. A TSV row with a field too many (a stray
tab) is refused like one with too few; NaN/inf regression labels, one column chosen for two roles, a header naming a
column twice, JSON values of the wrong type (JSONL fields, multiple-choice fields, SQuAD entries) are refused naming
the file, line or entry and the fix; every JSON the tool writes is strict (a NaN metric is null) and the best step is
never chosen on a NaN."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch
from clitools import assert_one_line_error, run_main, set_args
from conftest import tree_digest
from finetunetools import MODEL_SETS, ft_cfg, random_init_checkpoint

from xlnetcli.checkpoint.folders import save_model_dir
from xlnetcli.core.errors import DataError
from xlnetcli.core.files import atomic_write_json
from xlnetcli.core.shapes import loads_strict
from xlnetcli.data.labelled import Columns, read_choices, read_squad, read_table
from xlnetcli.evaluate.finetuned import build_finetune_model
from xlnetcli.train.finetune_workload import BestSoFar

GOOD_TSV = "sentence\tlabel\nthe cat sat\tpos\na dog ran\tneg\n"
GOOD_REG = "sentence\tscore\nthe cat sat\t0.5\na dog ran\t1.5\n"


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# ---- field counts ----------------------------------------------------------------------------------------------


def test_a_stray_tab_is_refused_like_a_missing_field(tmp_path):
    extra = _write(tmp_path, "extra.tsv", GOOD_TSV + "a stray\ttab\tpos\n")
    with pytest.raises(DataError, match=r"extra\.tsv:4: 3 fields, the header has 2 \(a tab .* quoted\)"):
        read_table(extra)
    short = _write(tmp_path, "short.tsv", GOOD_TSV + "no label here\n")
    with pytest.raises(DataError, match=r"short\.tsv:4: 1 fields, the header has 2 \(a missing field"):
        read_table(short)
    csv_extra = _write(tmp_path, "extra.csv", "sentence,label\nthe cat sat,pos\nhello, world,neg\n")
    with pytest.raises(DataError, match=r"extra\.csv:3: 3 fields"):
        read_table(csv_extra)
    assert [e.text_a for e in read_table(_write(tmp_path, "q.csv", 'sentence,label\n"hello, world",neg\n'))] == [
        "hello, world"
    ]


@pytest.mark.parametrize("ch", ["\u2028", "\u2029", "\x85", "\x1c", "\x1e", "\x0b", "\x0c", "\r"])
@pytest.mark.parametrize("name", ["u.tsv", "u.csv"])
def test_only_newlines_end_rows_not_unicode_line_separators(tmp_path, ch, name):
    """A cell holding U+2028/U+2029 (or another character str.splitlines breaks at) stays one row: only \n and \r\n
    end a row of a TSV/CSV; \r\n files read as \n ones."""
    sep = "," if name.endswith(".csv") else "\t"
    # a bare CR in an unquoted CSV field is csv's own error; quoted, it is text
    cell = f'"one{ch}two"' if ch == "\r" and name.endswith(".csv") else f"one{ch}two"
    text = f"sentence{sep}label\r\n{cell}{sep}pos\r\nthree{sep}neg\n"
    rows = read_table(_write(tmp_path, name, text))
    assert [(e.text_a, e.label, e.line) for e in rows] == [(f"one{ch}two", "pos", 2), ("three", "neg", 3)]


def test_metrics_rows_holding_a_raw_line_separator_read_whole(tmp_path):
    from xlnetcli.report.metrics_log import read_metrics

    (tmp_path / "metrics.jsonl").write_text(
        '{"step": 1, "split": "note", "text": "a\u2028b"}\n{"step": 2, "split": "train", "loss": 1.0}\n',
        encoding="utf-8",
    )
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]


def test_rows_without_a_header_must_all_be_as_wide_as_the_first(tmp_path):
    path = _write(tmp_path, "nohead.tsv", "the cat sat\tpos\na dog\tran\tneg\n")
    with pytest.raises(DataError, match=r"nohead\.tsv:2: 3 fields, the first row has 2"):
        read_table(path, header=False)


# ---- labels ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("label", ["nan", "NaN", "inf", "-inf", "Infinity", "1e999"])
def test_non_finite_regression_labels_are_refused(tmp_path, label):
    path = _write(tmp_path, "reg.tsv", GOOD_REG + f"odd one\t{label}\n")
    with pytest.raises(DataError, match=r"reg\.tsv:4: regression label .* not a finite number"):
        read_table(path, task="regression")


@pytest.mark.parametrize("label", ["1e308", "-1e308", "3e38", "1e20"])
def test_regression_labels_whose_square_overflows_float32_are_refused(tmp_path, label):
    """Issue 35: 1e308 passed the finite check, became inf in float32 and the run "diverged", blamed on the learning
    rate; a label whose square (the squared error) overflows float32 does the same at the first step."""
    path = _write(tmp_path, "reg.tsv", GOOD_REG + f"odd one\t{label}\n")
    with pytest.raises(DataError, match=r"reg\.tsv:4: regression label .* beyond 1\.8e\+19, .* rescale the labels"):
        read_table(path, task="regression")
    assert read_table(_write(tmp_path, "ok.tsv", GOOD_REG + "big\t-1e18\n"), task="regression")[-1].label == -1e18


def test_a_nan_token_in_jsonl_is_not_json(tmp_path):
    path = _write(tmp_path, "reg.jsonl", '{"text": "a", "label": 0.5}\n{"text": "b", "label": NaN}\n')
    with pytest.raises(DataError, match=r"reg\.jsonl:2: not valid JSON"):
        read_table(path, task="regression")


@pytest.mark.parametrize(
    ("row", "needle"),
    [
        ({"text": ["a", "b"], "label": "pos"}, "field 'text' must be text"),
        ({"text": {"x": 1}, "label": "pos"}, "field 'text' must be text"),
        ({"text": True, "label": "pos"}, "field 'text' must be text"),
        ({"text": "a", "label": {"x": 1}}, "label in column 'label' must be text or a number"),
        ({"text": "a", "label": [1]}, "label in column 'label' must be text or a number"),
        ({"text": "a", "label": False}, "label in column 'label' must be text or a number"),
    ],
)
def test_jsonl_fields_of_the_wrong_type_are_refused(tmp_path, row, needle):
    path = _write(tmp_path, "d.jsonl", json.dumps({"text": "ok", "label": "neg"}) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(DataError, match=rf"d\.jsonl:2: {needle}"):
        read_table(path)


# ---- columns ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("columns", "needle"),
    [
        (Columns(label="sentence"), "'sentence' is chosen as both text_a and label"),
        (Columns(text_a="sentence", text_b="sentence"), "'sentence' is chosen as both text_a and text_b"),
        (Columns(text_b="label"), "'label' is chosen as both text_b and label"),
    ],
)
def test_one_column_for_two_roles_is_refused(tmp_path, columns, needle):
    path = _write(tmp_path, "t.tsv", GOOD_TSV)
    with pytest.raises(DataError, match=needle):
        read_table(path, columns=columns)


def test_a_header_naming_a_column_twice_is_refused(tmp_path):
    path = _write(tmp_path, "dup.tsv", "sentence\tlabel\tlabel\nthe cat\tpos\tneg\n")
    with pytest.raises(DataError, match=r"dup\.tsv: the header names column 'label' twice"):
        read_table(path)


# ---- multiple choice and SQuAD ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "needle"),
    [({"context": {"a": 1}}, "field 'context' must be text"), ({"question": ["q"]}, "field 'question' must be text")],
)
def test_multiple_choice_fields_of_the_wrong_type_are_refused(tmp_path, change, needle):
    row = {"context": "c", "question": "q", "options": ["a", "b"], "answer": 0}
    path = _write(tmp_path, "mc.jsonl", json.dumps(row) + "\n" + json.dumps({**row, **change}) + "\n")
    with pytest.raises(DataError, match=rf"mc\.jsonl:2: {needle}"):
        read_choices(path)


def _squad(qa_change: dict | None = None, para_change: dict | None = None, answer: dict | None = None) -> dict:
    ans = {"text": "cat", "answer_start": 4, **(answer or {})}
    qa = {"id": "q1", "question": "who?", "answers": [ans], **(qa_change or {})}
    para = {"context": "the cat sat", "qas": [qa], **(para_change or {})}
    return {"version": "v2.0", "data": [{"title": "t", "paragraphs": [para]}]}


@pytest.mark.parametrize(
    ("doc", "needle"),
    [
        (_squad(qa_change={"question": 5}), "question 'q1': field 'question' must be a string"),
        (_squad(qa_change={"id": ["x"]}), "field 'id' must be a string or an integer"),
        (_squad(qa_change={"is_impossible": "false"}), "field 'is_impossible' must be true or false"),
        (_squad(qa_change={"answers": {"text": "cat"}}), "field 'answers' must be a list of objects"),
        (_squad(para_change={"context": ["the cat"]}), r"data\[0\]\.paragraphs\[0\]: field 'context' must be"),
        (_squad(para_change={"qas": None}), "field 'qas' must be a list of objects"),
        (_squad(answer={"text": 7}), "field 'text' must be a string"),
        (_squad(answer={"answer_start": "4"}), "field 'answer_start' must be an integer"),
        (_squad(answer={"answer_start": 4.5}), "field 'answer_start' must be an integer"),
        (_squad(answer={"answer_start": -1}), "field 'answer_start' is -1, out of range"),
        (_squad(answer={"answer_start": 99}), "field 'answer_start' is 99, out of range"),
        ({"data": [1, 2]}, "field 'data' must be a list of objects"),
        ({"data": [{"paragraphs": "p"}]}, r"data\[0\]: field 'paragraphs' must be a list of objects"),
    ],
)
def test_squad_entries_of_the_wrong_shape_are_refused(tmp_path, doc, needle):
    path = _write(tmp_path, "sq.json", json.dumps(doc))
    with pytest.raises(DataError, match=needle):
        read_squad(path)


def test_a_deeply_nested_squad_file_is_refused_not_a_recursion_error(tmp_path):
    path = _write(tmp_path, "deep.json", "[" * 100_000 + "]" * 100_000)
    with pytest.raises(DataError, match="not a SQuAD JSON file"):
        read_squad(path)


def test_a_squad_question_id_given_twice_is_refused(tmp_path):
    """Issue 35: the metric is keyed by id (as the official evaluator's), so a repeated id silently lost a question."""
    doc = _squad()
    para = doc["data"][0]["paragraphs"][0]
    doc["data"].append({"title": "u", "paragraphs": [{"context": "a dog ran", "qas": [dict(para["qas"][0])]}]})
    with pytest.raises(DataError, match=r"sq\.json: question id 'q1' appears twice \(data\[1\]\.paragraphs\[0\] and "):
        read_squad(_write(tmp_path, "sq.json", json.dumps(doc)))


def test_a_good_squad_file_still_reads(tmp_path):
    (ex,) = read_squad(_write(tmp_path, "sq.json", json.dumps(_squad())))
    assert (ex.answers, ex.answer_starts, ex.is_impossible) == (["cat"], [4], False)


# ---- strict JSON out, NaN never the best -----------------------------------------------------------------------


def test_every_json_written_is_strict_and_a_nan_metric_is_null(tmp_path):
    atomic_write_json(tmp_path / "r.json", {"pearson": math.nan, "mse": math.inf, "rows": [1.0, -math.inf]})
    assert loads_strict((tmp_path / "r.json").read_text()) == {"pearson": None, "mse": None, "rows": [1.0, None]}


def test_metrics_rows_are_strict_json(tmp_path):
    from xlnetcli.report.metrics_log import MetricsLogger, read_metrics

    log = MetricsLogger(tmp_path, report_to="none")
    log.log(1, "train", loss=math.nan, lr=0.1)
    log.close()
    loads_strict((tmp_path / "metrics.jsonl").read_text())
    assert read_metrics(tmp_path)[0]["loss"] is None


def test_the_best_step_is_never_chosen_on_a_nan():
    best = BestSoFar(patience=0)
    assert best.update(1, "pearson", math.nan, {})  # the first evaluation is kept until a number comes
    assert best.update(2, "pearson", 0.1, {})
    assert not best.update(3, "pearson", math.nan, {})
    assert best.update(4, "pearson", 0.2, {})
    assert not best.update(5, "pearson", math.nan, {})
    assert best.best["step"] == 4


# ---- the CLI: one line, exit 2, nothing written, inputs untouched ----------------------------------------------


def _choice(n_options: int) -> str:
    return json.dumps({"context": "c", "question": "q", "options": [f"o{i}" for i in range(n_options)], "answer": 0})


BAD_FILES = {  # name: (task, the training file's text, what the one line says); "empty.tsv" is test_bad_inputs'
    "stray-tab.tsv": ("classification", GOOD_TSV + "x\ty\tpos\n", "3 fields, the header has 2"),
    "nan-label.tsv": ("regression", GOOD_REG + "x\tnan\n", "not a finite number"),
    "inf-label.tsv": ("regression", GOOD_REG + "x\t-inf\n", "not a finite number"),
    "dup-header.tsv": ("classification", "sentence\tlabel\tsentence\na\tpos\tb\n", "names column 'sentence' twice"),
    "list-text.jsonl": ("classification", '{"text": ["a"], "label": "x"}\n', "must be text"),
    "nan-token.jsonl": ("regression", '{"text": "a", "label": Infinity}\n', "not valid JSON"),
    "header-only.tsv": ("classification", "sentence\tlabel\n", "no examples (the file is empty or has only a header)"),
    "one-label.tsv": ("classification", GOOD_TSV.replace("neg", "pos"), "needs at least 2 distinct labels"),
    "empty.jsonl": ("multiple-choice", "", "no examples (the file is empty)"),
    "no-options.jsonl": ("multiple-choice", _choice(0) + "\n", "options must be a list of at least 2 strings"),
    "one-option.jsonl": ("multiple-choice", _choice(1) + "\n", "options must be a list of at least 2 strings"),
    "many-options.jsonl": (
        "multiple-choice",
        _choice(4) + "\n" + _choice(5000) + "\n",
        ":2: 5000 options, more than 64",
    ),
    "no-data.json": ("squad", '{"version": "v2.0", "data": []}', "no questions"),
    "no-qas.json": ("squad", json.dumps(_squad(para_change={"qas": []})), "no questions"),
    "no-answer-found.json": ("squad", json.dumps(_squad(answer={"text": "dog"})), "every answer was missing"),
    "huge-label.tsv": ("regression", GOOD_REG + "x\t1e308\n", ":4: regression label '1e308' is beyond"),
    "dup-ids.json": (
        "squad",
        json.dumps({"data": [{"paragraphs": [_squad()["data"][0]["paragraphs"][0]] * 2}]}),
        "question id 'q1' appears twice",
    ),
}


@pytest.fixture(scope="module")
def init(builds, tmp_path_factory) -> Path:
    return random_init_checkpoint(builds, tmp_path_factory.mktemp("labelled")) / "init"


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_cli_refuses_bad_labelled_files_in_one_line(init, tmp_path, capsys, name):
    task, text, needle = BAD_FILES[name]
    bad = _write(tmp_path, name, text)
    before, init_before = bad.read_bytes(), tree_digest(init)
    args = ["finetune", "--task", task, "--init", init, "--train", bad, "--out", tmp_path / "ft"]
    code, _, err = run_main(capsys, *args)
    assert_one_line_error(code, err, needle, name)
    assert bad.read_bytes() == before and tree_digest(init) == init_before
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]


def test_cli_refuses_one_column_for_text_and_label(init, tmp_path, capsys):
    good = _write(tmp_path, "t.tsv", GOOD_TSV)
    args = ["--init", init, "--train", good, "--out", tmp_path / "ft", "--label-column", "sentence"]
    code, _, err = run_main(capsys, "finetune", "--task", "classification", *args)
    assert_one_line_error(code, err, "chosen as both text_a and label")
    assert not (tmp_path / "ft").exists()


def test_blank_and_long_texts_are_kept_and_noted(init, tmp_path, capsys):
    """A row whose text is empty is kept as ``<sep> <cls>`` (no row is ever all padding) and counted; a text longer than
    finetune.max_seq_length is cut and counted (the header's warnings, results.json's and `xlnet eval`'s notes)."""
    long = " ".join(["the socket module provides access to the interface"] * 20)
    train = _write(tmp_path, "t.tsv", GOOD_TSV + f"\tpos\n \tneg\n{long}\tneg\n")
    out = tmp_path / "ft"
    sets = set_args(["finetune.max_seq_length=16", "finetune.max_steps=2", "finetune.batch_size=5"])
    sets += ["--set", "finetune.micro_batch_size=5"]
    args = ["--init", init, "--train", train, "--valid", train, "--out", out, "--device", "cpu", *sets]
    code, _, err = run_main(capsys, "finetune", "--task", "classification", *args)
    assert code == 0, err
    blank = "2 of 5 examples have no text (special tokens only); kept"
    cut = (
        "1 of 5 examples truncated to 16 tokens (finetune.max_seq_length); the longer text is cut first "
        "(finetune.document=memory reads more)"
    )
    assert err.count(blank) == err.count(cut) == 2, err  # a warning line for each file
    res = json.loads((out / "results.json").read_text())
    assert math.isfinite(res["final_train_loss"]) and res["notes"] == [blank, cut] * 2
    code, stdout, err = run_main(capsys, "eval", out, "--file", train, "--device", "cpu")
    assert code == 0 and json.loads(stdout)["notes"] == [blank, cut], err


# ---- pipes, predictions as TSV, --file with --data ---------------------------------------------------------------


def test_a_pipe_is_refused_as_not_a_regular_file_not_as_missing(init, tmp_path, capsys):
    """Issue 35: `--train <(cat x.tsv)` was "file not found". A labelled file is read more than once (finetuning
    records its sha256), so a pipe is refused for what it is, without being opened (opening a FIFO would block)."""
    for read, name in ((read_table, "train.tsv"), (read_choices, "train.jsonl"), (read_squad, "train.json")):
        os.mkfifo(tmp_path / name)
        with pytest.raises(DataError, match=rf"{name} is not a regular file \(a pipe or a device\); .* save it"):
            read(tmp_path / name)
    with pytest.raises(DataError, match="is a folder"):
        read_table(tmp_path)
    fifo = tmp_path / "train.tsv"
    args = ["--task", "classification", "--init", init, "--train", fifo, "--out", tmp_path / "ft"]
    code, _, err = run_main(capsys, "finetune", *args)
    assert_one_line_error(code, err, "train.tsv is not a regular file")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.json", "train.jsonl", "train.tsv"]


@pytest.fixture(scope="module")
def choice_run(builds, tmp_path_factory) -> Path:
    """A finetuned multiple-choice checkpoint (random weights): what `xlnet eval --predict` reads ids for."""
    cfg = ft_cfg(*MODEL_SETS)
    torch.manual_seed(0)
    model = build_finetune_model(cfg, "multiple-choice", 1)
    meta = {"kind": "finetune", "task": "multiple-choice", "step": 1}
    d = tmp_path_factory.mktemp("mc")
    return save_model_dir(d / "mc", model, cfg, builds.tokenizer(cfg.tokenizer), meta=meta)


@pytest.mark.parametrize("qid", ["a\tb", "a\u2028b", "x\r"])
def test_an_id_that_would_split_the_tsv_of_predictions_is_refused(choice_run, tmp_path, capsys, qid):
    """Issue 35: an id with a tab or line break split `--predict out.tsv`'s rows. Refused before predicting, naming
    the line and the way out (.jsonl keeps every id exactly, as the second run shows)."""
    rows = [{"id": "q0", "context": "c", "question": "q", "options": ["a", "b"], "answer": 0}]
    rows.append({**rows[0], "id": qid})
    mc = _write(tmp_path, "mc.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    code, _, err = run_main(capsys, "eval", choice_run, "--file", mc, "--predict", tmp_path / "p.tsv")
    assert_one_line_error(code, err, "mc.jsonl:2: id ", "would split the TSV --predict", ".jsonl")
    assert not (tmp_path / "p.tsv").exists()
    code, _, err = run_main(capsys, "eval", choice_run, "--file", mc, "--predict", tmp_path / "p.jsonl", "--quiet")
    assert code == 0, err
    lines = (tmp_path / "p.jsonl").read_text(encoding="utf-8").split("\n")  # JSON Lines end at \n only
    assert [json.loads(line)["id"] for line in lines if line] == ["q0", qid]


def test_jsonl_lines_end_at_newline_only(tmp_path):
    """A raw U+2028 or \\x1c inside a JSON string (what ensure_ascii=False writes) is not a line end, though
    str.splitlines breaks there: the row was "not valid JSON"."""
    row = {"context": "one\u2028two\x1cthree", "question": "q", "options": ["a", "b"], "answer": 1}
    path = _write(tmp_path, "mc.jsonl", json.dumps(row, ensure_ascii=False) + "\n")
    assert [ex.context for ex in read_choices(path)] == [row["context"]]


def test_eval_refuses_file_and_data_together(choice_run, tmp_path, capsys):
    """Issue 35: `xlnet eval --data R --file F` silently ignored one of them."""
    out = tmp_path / "r.json"
    code, _, err = run_main(capsys, "eval", choice_run, "--file", "f.jsonl", "--data", "recs", "--output", out)
    assert_one_line_error(code, err, "--file f.jsonl and --data recs cannot be combined")
    assert not out.exists()
