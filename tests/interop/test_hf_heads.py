"""Finetuned checkpoints export with their heads: transformers' XLNetForSequenceClassification (classification and
regression), XLNetForMultipleChoice and XLNetForQuestionAnswering give what `xlnet eval --predict` gives on the same
token ids; `finetune --init EXPORT` keeps the head when task and labels match; `xlnet import` brings it back; heads
transformers has no class for are refused (or exported without the head with --backbone-only).

Data: data/pydocs/task_{train,valid}.tsv (Python docstrings -> 4 areas), as in test_finetune.py; tiny models
finetuned for a few steps (the comparisons are of numbers, not of quality).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from clitools import SQUAD, TRAIN_TSV, VALID_TSV, assert_one_line_error, code_blocks, run_main
from finetunetools import LABELS, ft_cfg, pydocs_rows, random_init_checkpoint

pytestmark = pytest.mark.slow  # every test here trains, runs subprocesses or builds large inputs

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def work(builds, tmp_path_factory):
    """init/: a random-init pretraining checkpoint (finetunetools.MODEL_SETS)."""
    return random_init_checkpoint(builds, tmp_path_factory.mktemp("finetune"))


@pytest.fixture(autouse=True)
def _no_progress(monkeypatch):
    monkeypatch.setenv("XLNET_NO_PROGRESS", "1")


def small_tsv(path: Path, src: Path, n: int | None, labels: set[str] | None = None) -> Path:
    rows = [(t, lab) for t, lab in pydocs_rows(src) if labels is None or lab in labels][:n]
    path.write_text("\n".join(["sentence\tlabel"] + [f"{t}\t{lab}" for t, lab in rows]) + "\n")
    return path


@pytest.fixture(scope="module")
def cls_run(work, tmp_path_factory):
    """A 4-label classifier: 60 steps on the docstrings (5 s; 0.60 accuracy on 48 validation rows, 3 labels
    predicted)."""
    from xlnetcli.train.finetune import FinetuneArgs, finetune

    d = tmp_path_factory.mktemp("cls")
    train, valid = small_tsv(d / "train.tsv", TRAIN_TSV, None), small_tsv(d / "valid.tsv", VALID_TSV, 48)
    finetune(
        ft_cfg("finetune.max_steps=60", "finetune.eval_every=60"),
        FinetuneArgs("classification", train, valid, work / "init", d / "run", quiet=True),
    )
    return d


def encoded(run: Path, file: Path):
    """The rows `xlnet eval` feeds the model for ``file``: our tokenizer, our input layout."""
    from xlnetcli.checkpoint.folders import tokenizer_dir_of
    from xlnetcli.data.tokenizer import Tokenizer
    from xlnetcli.evaluate.finetuned import load_finetuned, load_task_data

    model, cfg, meta = load_finetuned(run)
    tok = Tokenizer.load(tokenizer_dir_of(Path(meta["path"])))
    data = load_task_data(meta["task"], file, tok, cfg, meta.get("labels"), require_label=False)
    return model, data


def hf_inputs(data, keys=("input_ids", "token_type_ids", "attention_mask")) -> dict[str, torch.Tensor]:
    a = data.enc.arrays
    return {k: torch.from_numpy(a[k]) for k in keys}


def predictions(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_classifier_export_gives_eval_predictions_in_transformers(cls_run, tmp_path, capsys):
    run, valid, hf_dir = cls_run / "run", cls_run / "valid.tsv", tmp_path / "hf"
    code, _out, err = run_main(capsys, "export", run, "--out", hf_dir)
    assert code == 0, err
    assert "as XLNetForSequenceClassification, 4 labels: concurrency, gui, internet, testing" in err
    hc = json.loads((hf_dir / "config.json").read_text())
    assert hc["architectures"] == ["XLNetForSequenceClassification"]
    assert hc["id2label"] == {str(i): lab for i, lab in enumerate(LABELS)}
    assert hc["label2id"] == {lab: i for i, lab in enumerate(LABELS)}
    assert hc["problem_type"] == "single_label_classification"
    assert (hc["summary_type"], hc["summary_use_proj"], hc["summary_activation"]) == ("last", True, "tanh")
    assert hc["summary_last_dropout"] == 0.1 and not hc["summary_proj_to_labels"]
    rec = json.loads((hf_dir / "xlnet_finetune.json").read_text())
    assert rec["task"] == "classification" and rec["labels"] == LABELS and rec["finetune"]["max_seq_length"] == 64

    assert run_main(capsys, "eval", run, "--file", valid, "--predict", tmp_path / "ours.jsonl")[0] == 0
    ours = predictions(tmp_path / "ours.jsonl")
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(hf_dir).eval()
    assert type(hf).__name__ == "XLNetForSequenceClassification" and hf.config.num_labels == 4
    model, data = encoded(run, valid)
    with torch.no_grad():
        logits = hf(**hf_inputs(data)).logits
    probs = torch.softmax(logits, -1).numpy()
    assert [hf.config.id2label[i] for i in probs.argmax(-1)] == [r["prediction"] for r in ours]
    want = np.array([[r["probabilities"][lab] for lab in LABELS] for r in ours])
    assert np.abs(probs - want).max() < 1e-4
    from xlnetcli.evaluate.finetuned import predict

    mine = predict(model, data, 16, torch.device("cpu"))["logits"]
    assert np.abs(logits.numpy() - mine).max() < 1e-4
    assert len({r["prediction"] for r in ours}) >= 2  # a trained head, not a constant answer
    # a batch of one, unpadded (no attention mask), gives the same scores as the padded batch
    row = data.enc.arrays["attention_mask"][0] > 0
    with torch.no_grad():
        one = hf(
            input_ids=torch.from_numpy(data.enc.arrays["input_ids"][0][row])[None],
            token_type_ids=torch.from_numpy(data.enc.arrays["token_type_ids"][0][row])[None],
        ).logits
    assert torch.allclose(one[0], logits[0], atol=1e-4)

    # `xlnet eval` reads the export itself, with its head
    assert run_main(capsys, "eval", hf_dir, "--file", valid, "--predict", tmp_path / "hf.jsonl")[0] == 0
    again = predictions(tmp_path / "hf.jsonl")
    assert [r["prediction"] for r in again] == [r["prediction"] for r in ours]
    assert all(
        abs(a["probabilities"][k] - b["probabilities"][k]) < 1e-5
        for a, b in zip(again, ours, strict=True)
        for k in LABELS
    )


def test_import_brings_the_head_back_and_init_keeps_it(cls_run, tmp_path, capsys):
    run, valid, hf_dir = cls_run / "run", cls_run / "valid.tsv", tmp_path / "hf"
    assert run_main(capsys, "export", run, "--out", hf_dir)[0] == 0
    code, _out, err = run_main(capsys, "import", "--from-hf", hf_dir, "--out", tmp_path / "back")
    assert code == 0, err
    assert "finetuned classification checkpoint with its XLNetForSequenceClassification head" in err
    from xlnetcli.checkpoint.load import load_model_dir

    cfg0, s0, m0 = load_model_dir(run)
    cfg1, s1, m1 = load_model_dir(tmp_path / "back")
    assert m1["kind"] == "finetune" and m1["task"] == "classification" and m1["labels"] == LABELS
    assert m1["step"] == m0["step"] and m1["value"] == m0["value"]
    assert s0.keys() == s1.keys() and all(torch.equal(s0[k], s1[k]) for k in s0)  # bit-exact, head included
    assert cfg1.finetune == cfg0.finetune

    assert run_main(capsys, "eval", run, "--file", valid, "--predict", tmp_path / "ours.jsonl")[0] == 0
    ours = predictions(tmp_path / "ours.jsonl")
    # --init from the export, same task and labels: the head is kept (one step at a negligible lr changes nothing)
    code, _out, err = run_main(
        capsys,
        "finetune",
        "--task",
        "classification",
        "--train",
        cls_run / "train.tsv",
        "--init",
        hf_dir,
        "--out",
        tmp_path / "again",
        "--set",
        "finetune.max_steps=1",
        "--set",
        "finetune.lr=1e-12",
        "--set",
        "finetune.max_seq_length=64",
    )
    assert code == 0, err
    assert f"classification head kept from {hf_dir} (labels concurrency, gui, internet, testing)" in err
    assert run_main(capsys, "eval", tmp_path / "again", "--file", valid, "--predict", tmp_path / "again.jsonl")[0] == 0
    again = predictions(tmp_path / "again.jsonl")
    assert [r["prediction"] for r in again] == [r["prediction"] for r in ours]
    assert all(
        abs(a["probabilities"][k] - b["probabilities"][k]) < 1e-4
        for a, b in zip(again, ours, strict=True)
        for k in LABELS
    )

    # other labels: a new head, and the log says why
    three = small_tsv(tmp_path / "three.tsv", TRAIN_TSV, 96, {"concurrency", "gui", "internet"})
    code, _out, err = run_main(
        capsys,
        "finetune",
        "--task",
        "classification",
        "--train",
        three,
        "--init",
        hf_dir,
        "--out",
        tmp_path / "other",
        "--set",
        "finetune.max_steps=1",
    )
    assert code == 0, err
    assert (
        "new classification head (random init): the head of " in err
        and "its labels (concurrency, gui, internet, testing) differ from the training file's "
        "(concurrency, gui, internet)"
        in err
    )
    # another task: a new head too
    code, _out, err = run_main(
        capsys,
        "finetune",
        "--task",
        "regression",
        "--train",
        regression_tsv(tmp_path / "r.tsv"),
        "--init",
        hf_dir,
        "--out",
        tmp_path / "reg",
        "--set",
        "finetune.max_steps=1",
    )
    assert code == 0, err
    assert "it was trained for classification, this run is regression" in err


def regression_tsv(path: Path, src: Path = TRAIN_TSV, n: int = 128) -> Path:
    """The docstrings with a real numeric target read off the text: min(words, 40) / 10 (as test_finetune.py)."""
    rows = pydocs_rows(src, n)
    path.write_text(
        "\n".join(["sentence\tscore"] + [f"{t}\t{min(len(t.split()), 40) / 10:.1f}" for t, _ in rows]) + "\n"
    )
    return path


def test_regression_export(work, tmp_path, capsys):
    from xlnetcli.train.finetune import FinetuneArgs, finetune

    train, valid = regression_tsv(tmp_path / "train.tsv"), regression_tsv(tmp_path / "valid.tsv", VALID_TSV, 32)
    finetune(
        ft_cfg("finetune.max_steps=8", "finetune.summary_type=first", "finetune.summary_use_proj=false"),
        FinetuneArgs("regression", train, valid, work / "init", tmp_path / "run", quiet=True),
    )
    assert run_main(capsys, "export", tmp_path / "run", "--out", tmp_path / "hf")[0] == 0
    hc = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert hc["problem_type"] == "regression" and hc["id2label"] == {"0": "LABEL_0"}
    assert (hc["summary_type"], hc["summary_use_proj"], hc["summary_activation"]) == ("first", False, "linear")
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "hf").eval()
    assert hf.config.num_labels == 1
    assert run_main(capsys, "eval", tmp_path / "run", "--file", valid, "--predict", tmp_path / "p.jsonl")[0] == 0
    ours = np.array([r["prediction"] for r in predictions(tmp_path / "p.jsonl")])
    _, data = encoded(tmp_path / "run", valid)
    with torch.no_grad():
        got = hf(**hf_inputs(data)).logits[:, 0].numpy()
    assert np.abs(got - ours).max() < 1e-4 and ours.std() > 1e-3


def test_multiple_choice_export(work, tmp_path, capsys):
    from xlnetcli.train.finetune import FinetuneArgs, finetune

    rng = random.Random(0)
    rows = pydocs_rows(TRAIN_TSV)
    pos = [t for t, lab in rows if lab == "concurrency"]
    neg = [t for t, lab in rows if lab != "concurrency"]
    file = tmp_path / "mc.jsonl"
    with file.open("w") as f:
        for i in range(24):
            opts = [pos[i], *rng.sample(neg, 3)]
            rng.shuffle(opts)
            f.write(
                json.dumps(
                    {
                        "id": str(i),
                        "context": "Python standard library documentation.",
                        "question": "Which paragraph documents concurrency?",
                        "options": opts,
                        "answer": opts.index(pos[i]),
                    }
                )
                + "\n"
            )
    finetune(
        ft_cfg(
            "finetune.max_seq_length=48", "finetune.batch_size=8", "finetune.micro_batch_size=8", "finetune.max_steps=4"
        ),
        FinetuneArgs("multiple-choice", file, file, work / "init", tmp_path / "run", quiet=True),
    )
    assert run_main(capsys, "export", tmp_path / "run", "--out", tmp_path / "hf")[0] == 0
    hf = transformers.AutoModelForMultipleChoice.from_pretrained(tmp_path / "hf").eval()
    assert type(hf).__name__ == "XLNetForMultipleChoice"
    assert run_main(capsys, "eval", tmp_path / "run", "--file", file, "--predict", tmp_path / "p.jsonl")[0] == 0
    ours = predictions(tmp_path / "p.jsonl")
    _, data = encoded(tmp_path / "run", file)
    with torch.no_grad():
        probs = torch.softmax(hf(**hf_inputs(data)).logits, -1).numpy()  # [questions, 4 options]
    assert probs.argmax(-1).tolist() == [r["prediction"] for r in ours]
    assert np.abs(probs - np.array([r["probabilities"] for r in ours])).max() < 1e-4


def same_beam(idx_a: np.ndarray, p_a: np.ndarray, idx_b: np.ndarray, p_b: np.ndarray) -> None:
    """The same top-k positions with the same probabilities (1e-4) in each beam; positions whose probabilities tie
    to 1e-7 may come in either order."""
    assert idx_a.shape == idx_b.shape
    for ia, pa, ib, pb in zip(
        idx_a.reshape(-1, idx_a.shape[-1]),
        p_a.reshape(-1, idx_a.shape[-1]),
        idx_b.reshape(-1, idx_a.shape[-1]),
        p_b.reshape(-1, idx_a.shape[-1]),
        strict=True,
    ):
        a, b = dict(zip(ia.tolist(), pa.tolist(), strict=True)), dict(zip(ib.tolist(), pb.tolist(), strict=True))
        assert a.keys() == b.keys() and all(abs(a[k] - b[k]) < 1e-4 for k in a), (a, b)
        assert np.all(np.diff(pa) <= 1e-7) and np.all(np.diff(pb) <= 1e-7)  # each sorted best first


def test_squad_export_gives_our_beam_in_transformers(work, tmp_path, capsys):
    """SquadHead is XLNetForQuestionAnswering's head parameter for parameter: the top-5 starts, their top-5 ends and
    the answerability logit agree, and so do the answers `xlnet eval` reads off them."""
    from xlnetcli.evaluate.finetuned import predict
    from xlnetcli.train.finetune import FinetuneArgs, finetune

    cfg = ft_cfg(
        "finetune.max_seq_length=96",
        "finetune.batch_size=8",
        "finetune.micro_batch_size=8",
        "finetune.max_steps=6",
        "finetune.doc_stride=32",
        "finetune.max_query_length=24",
        "finetune.max_answer_length=16",
        "finetune.lr=2e-3",
    )
    finetune(cfg, FinetuneArgs("squad", SQUAD, SQUAD, work / "init", tmp_path / "run", quiet=True))
    code, _, err = run_main(capsys, "export", tmp_path / "run", "--out", tmp_path / "hf")
    assert code == 0 and "as XLNetForQuestionAnswering" in err
    hf = transformers.XLNetForQuestionAnswering.from_pretrained(tmp_path / "hf").eval()
    assert hf.start_n_top == hf.end_n_top == 5
    model, data = encoded(tmp_path / "run", SQUAD)
    ours = predict(model, data, 16, torch.device("cpu"))
    a = data.enc.arrays
    with torch.no_grad():
        h = hf(
            **hf_inputs(data), p_mask=torch.from_numpy(a["p_mask"]).float(), cls_index=torch.from_numpy(a["cls_index"])
        )
    n = len(a["input_ids"])
    same_beam(
        h.start_top_index.numpy(),
        h.start_top_log_probs.numpy(),  # HF's "log probs" are probabilities
        ours["start_top_index"],
        np.exp(ours["start_top_log_probs"]),
    )
    # HF's end beam is [B, end, start] flattened; ours [B, start, end]
    same_beam(
        h.end_top_index.numpy().reshape(n, 5, 5).transpose(0, 2, 1),
        h.end_top_log_probs.numpy().reshape(n, 5, 5).transpose(0, 2, 1),
        ours["end_top_index"],
        np.exp(ours["end_top_log_probs"]),
    )
    assert np.abs(h.cls_logits.numpy() - ours["cls_logits"]).max() < 1e-4
    # `xlnet eval` of the export (head and null-odds threshold from the export) scores as the run does
    res = [json.loads(run_main(capsys, "eval", p, "--file", SQUAD)[1]) for p in (tmp_path / "run", tmp_path / "hf")]
    assert res[0]["metrics"] == res[1]["metrics"] and res[0]["null_odds_threshold"] == res[1]["null_odds_threshold"]


def test_heads_transformers_cannot_represent(work, tmp_path, capsys):
    """summary_type mean (ours averages real tokens, transformers' the padding too) is refused with one line;
    --backbone-only exports the transformer as XLNetModel, which gives our hidden states."""
    from xlnetcli.train.finetune import FinetuneArgs, finetune

    train = small_tsv(tmp_path / "t.tsv", TRAIN_TSV, 64)
    finetune(
        ft_cfg("finetune.max_steps=1", "finetune.summary_type=mean"),
        FinetuneArgs("classification", train, None, work / "init", tmp_path / "run", quiet=True),
    )
    code, _, err = run_main(capsys, "export", tmp_path / "run", "--out", tmp_path / "hf")
    assert_one_line_error(code, err, "summary_type 'mean'", "--backbone-only")
    assert not (tmp_path / "hf").exists()
    code, _, err = run_main(capsys, "export", tmp_path / "run", "--out", tmp_path / "hf", "--backbone-only")
    assert code == 0 and "as XLNetModel" in err, err
    hf = transformers.AutoModel.from_pretrained(tmp_path / "hf").eval()
    assert type(hf).__name__ == "XLNetModel"
    model, data = encoded(tmp_path / "run", train)
    x = hf_inputs(data)
    with torch.no_grad():
        want = model.encode(x["input_ids"][:8], x["token_type_ids"][:8], x["attention_mask"][:8])
        got = hf(**{k: v[:8] for k, v in x.items()}).last_hidden_state
    assert torch.allclose(got, want, atol=1e-4)
    # the backbone imports back as a pretrained model (LM head tied to the embedding, zero bias)
    code, _, err = run_main(capsys, "import", "--from-hf", tmp_path / "hf", "--out", tmp_path / "back")
    assert code == 0 and "a pretrained checkpoint" in err


def test_transformers_heads_import(work, tmp_path, capsys):
    """A classifier saved by transformers itself, its labels in another order: `xlnet eval` on it and on its import
    gives transformers' probabilities per label, and --init keeps its head with the rows put in our label order.
    A head with no xlnet task (XLNetForQuestionAnsweringSimple) is dropped on import, and the message says so."""
    from xlnetcli import api
    from xlnetcli.checkpoint.folders import tokenizer_dir_of

    order = ["testing", "internet", "gui", "concurrency"]
    hc = transformers.XLNetConfig(
        vocab_size=2000,
        d_model=64,
        n_layer=2,
        n_head=2,
        d_inner=128,
        mem_len=None,
        id2label=dict(enumerate(order)),
        label2id={lab: i for i, lab in enumerate(order)},
    )
    torch.manual_seed(0)
    hf = transformers.XLNetForSequenceClassification(hc).eval()
    with torch.no_grad():
        hf.logits_proj.weight.normal_(0, 1.0)  # decisive scores
    hf_dir = tmp_path / "hf"
    hf.save_pretrained(hf_dir)
    (hf_dir / "spiece.model").write_bytes((tokenizer_dir_of(work / "init") / "spiece.model").read_bytes())
    valid = small_tsv(tmp_path / "valid.tsv", VALID_TSV, 32)
    _, data = encoded(hf_dir, valid)
    with torch.no_grad():
        probs = torch.softmax(hf(**hf_inputs(data)).logits, -1).numpy()
    want = [{lab: probs[i, j] for j, lab in enumerate(order)} for i in range(len(probs))]

    def same(path: Path) -> None:
        got = predictions(path)
        assert all(
            abs(g["probabilities"][lab] - w[lab]) < 1e-4 for g, w in zip(got, want, strict=True) for lab in order
        )
        assert [g["prediction"] for g in got] == [max(w, key=w.get) for w in want]

    assert run_main(capsys, "eval", hf_dir, "--file", valid, "--predict", tmp_path / "a.jsonl")[0] == 0
    same(tmp_path / "a.jsonl")
    assert run_main(capsys, "import", "--from-hf", hf_dir, "--out", tmp_path / "ck")[0] == 0
    assert run_main(capsys, "eval", tmp_path / "ck", "--file", valid, "--predict", tmp_path / "b.jsonl")[0] == 0
    same(tmp_path / "b.jsonl")
    code, _out, err = run_main(
        capsys,
        "finetune",
        "--task",
        "classification",
        "--train",
        valid,
        "--init",
        hf_dir,
        "--out",
        tmp_path / "ft",
        "--set",
        "finetune.max_steps=1",
        "--set",
        "finetune.lr=1e-12",
        "--set",
        "finetune.dropout=0",
        "--set",
        "finetune.dropatt=0",
    )
    assert code == 0 and "classification head kept" in err, err
    assert json.loads((next((tmp_path / "ft").glob("step_*")) / "meta.json").read_text())["labels"] == LABELS
    assert run_main(capsys, "eval", tmp_path / "ft", "--file", valid, "--predict", tmp_path / "c.jsonl")[0] == 0
    same(tmp_path / "c.jsonl")
    # the encoder of a classifier still loads as an LM for features
    with torch.no_grad():
        ids = torch.from_numpy(data.enc.arrays["input_ids"][:2])
        assert torch.allclose(api.load(hf_dir)(ids).hidden, hf.transformer(ids).last_hidden_state, atol=1e-4)

    simple = tmp_path / "simple"
    transformers.XLNetForQuestionAnsweringSimple(hc).save_pretrained(simple)
    code, _, err = run_main(capsys, "import", "--from-hf", simple, "--out", tmp_path / "ck2")
    assert code == 0 and "the transformer only; head dropped (XLNetForQuestionAnsweringSimple: " in err


def test_readme_transformers_example_runs(cls_run, tmp_path, monkeypatch, capsys):
    """The README's transformers block, run against a real export of a finetuned classifier."""
    assert run_main(capsys, "export", cls_run / "run", "--out", tmp_path / "runs" / "pydocs-cls-hf")[0] == 0
    monkeypatch.chdir(tmp_path)
    block = next(b for b in code_blocks("python") if "AutoModelForSequenceClassification" in b)
    scope: dict = {}
    exec(compile(block, "README.md", "exec"), scope)
    assert scope["probs"].shape == (2, 4)
    assert capsys.readouterr().out.strip().strip("[]").replace("'", "").split(", ")[0] in LABELS
