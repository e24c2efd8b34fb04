"""Progress of `xlnet eval` (--file, --predict, --data) and `xlnet probe` (issue 33): with stderr redirected, plain
lines with counts (the first item, each further tenth, the end); --quiet prints none; the results are the same."""

from __future__ import annotations

import json

import pytest
import torch
from clitools import FAST_PRETRAIN, TINY, TRAIN_TSV, VALID_TSV, run_main
from finetunetools import LABELS, MODEL_SETS, ft_cfg, random_init_checkpoint

from xlnetcli.checkpoint.folders import save_model_dir
from xlnetcli.config import load_config
from xlnetcli.core.console import CountProgress
from xlnetcli.evaluate.finetuned import build_finetune_model
from xlnetcli.model import XLNetLMHeadModel


@pytest.fixture(autouse=True)
def _progress_on(monkeypatch):
    monkeypatch.delenv("XLNET_NO_PROGRESS", raising=False)
    monkeypatch.delenv("RANK", raising=False)


def _progress(err: str, label: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith(f"{label}: ")]


def test_plain_lines_at_the_first_item_each_tenth_and_the_end(capsys, monkeypatch):
    with CountProgress("eval", 95, "examples") as bar:
        for _ in range(19):
            bar.advance(5)
    lines = _progress(capsys.readouterr().err, "eval")
    counts = [int(ln.split()[1].split("/")[0]) for ln in lines]
    assert counts == [5, 10, 20, 30, 40, 50, 60, 70, 80, 90, 95], lines
    assert lines[0].startswith("eval: 5/95 examples (5%), ") and "examples/s, ETA " in lines[0]
    assert lines[-1].startswith("eval: 95/95 examples (100%), ") and ", in " in lines[-1]
    # a loop that stops short still ends with a line; quiet, another rank or XLNET_NO_PROGRESS=1: none
    with CountProgress("eval", 1000, "sequences") as bar:
        bar.advance(3)
        bar.advance(4)
    assert [ln.split("), ")[0] + ")" for ln in _progress(capsys.readouterr().err, "eval")] == [
        "eval: 3/1,000 sequences (0%)",
        "eval: 7/1,000 sequences (0%)",
    ]
    for env in ({"RANK": "1"}, {"XLNET_NO_PROGRESS": "1"}, {}):
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        with CountProgress("eval", 10, quiet=not env) as bar:
            bar.advance(10)
        monkeypatch.delenv("RANK", raising=False)
        monkeypatch.delenv("XLNET_NO_PROGRESS", raising=False)
    assert capsys.readouterr().err == ""


@pytest.fixture(scope="module")
def finetuned(builds, tmp_path_factory):
    """A finetuned classification checkpoint (random weights) of the bundled task's labels."""
    d = tmp_path_factory.mktemp("progress")
    cfg = ft_cfg(*MODEL_SETS, "finetune.micro_batch_size=8")
    torch.manual_seed(0)
    model = build_finetune_model(cfg, "classification", len(LABELS))
    meta = {"kind": "finetune", "task": "classification", "labels": LABELS, "step": 1}
    return save_model_dir(d / "cls", model, cfg, builds.tokenizer(cfg.tokenizer), meta=meta)


def test_eval_file_and_predict_print_progress_unless_quiet(finetuned, tmp_path, capsys):
    n = len(VALID_TSV.read_text(encoding="utf-8").splitlines()) - 1
    code, out, err = run_main(capsys, "eval", finetuned, "--file", VALID_TSV, "--predict", tmp_path / "p.jsonl")
    assert code == 0, err
    lines = _progress(err, "eval")
    assert 2 <= len(lines) <= 12, err  # the first batch, each tenth, the end (16 examples per batch)
    assert lines[0].startswith(f"eval: 16/{n} examples (") and lines[-1].startswith(f"eval: {n}/{n} examples (100%)")
    preds = (tmp_path / "p.jsonl").read_text()
    code, out_quiet, err = run_main(
        capsys, "eval", finetuned, "--file", VALID_TSV, "--predict", tmp_path / "q.jsonl", "--quiet"
    )
    assert code == 0 and _progress(err, "eval") == [], err
    assert json.loads(out_quiet)["metrics"] == json.loads(out)["metrics"]
    assert (tmp_path / "q.jsonl").read_text() == preds


def test_plm_eval_counts_sequences(builds, tmp_path, capsys):
    rec = builds.pipeline(FAST_PRETRAIN).records
    cfg = load_config(TINY, FAST_PRETRAIN)
    torch.manual_seed(0)
    save_model_dir(tmp_path / "run" / "step_0000001", XLNetLMHeadModel(cfg.model), cfg, rec / "tokenizer", meta={})
    code, out, err = run_main(capsys, "eval", tmp_path / "run", "--data", rec, "--batches", "3")
    assert code == 0, err
    lines = _progress(err, "eval")
    assert [ln.split(" (")[0] for ln in lines] == ["eval: 2/6 sequences", "eval: 4/6 sequences", "eval: 6/6 sequences"]
    code, out_quiet, err = run_main(capsys, "eval", tmp_path / "run", "--data", rec, "--batches", "3", "--quiet")
    assert code == 0 and _progress(err, "eval") == [] and json.loads(out_quiet) == json.loads(out)


def test_probe_prints_the_progress_of_features_and_fits(builds, tmp_path, capsys):
    run = random_init_checkpoint(builds, tmp_path) / "init"
    rows = TRAIN_TSV.read_text(encoding="utf-8").splitlines()
    (tmp_path / "train.tsv").write_text("\n".join(rows[:61]) + "\n", encoding="utf-8")
    (tmp_path / "valid.tsv").write_text("\n".join(rows[:1] + rows[61:101]) + "\n", encoding="utf-8")
    args = ["probe", run, "--train", tmp_path / "train.tsv", "--valid", tmp_path / "valid.tsv"]
    args += ["--max-seq-length", "32", "--batch-size", "20", "--train-sizes", "20"]
    code, out, err = run_main(capsys, *args)
    assert code == 0, err
    feats, fits = _progress(err, "pretrained features"), _progress(err, "pretrained fits")
    assert feats[0].startswith("pretrained features: 20/100 examples (20%)"), err
    assert feats[-1].startswith("pretrained features: 100/100 examples (100%)"), err
    # 2 kinds of features x (6 L2 strengths + the refit) x (the whole file + 3 draws of 20 rows)
    assert fits[0].startswith("pretrained fits: 1/56 fits") and fits[-1].startswith("pretrained fits: 56/56 fits")
    assert len(fits) <= 12, err
    code, out_quiet, err = run_main(capsys, *args, "--quiet")
    assert code == 0 and err == "" and out_quiet == out
