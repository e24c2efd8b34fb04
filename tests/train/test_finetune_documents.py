"""Issue 34: finetuning, evaluating and predicting on documents longer than one window (finetune.document).

The documents: the bundled task's rows of one label joined four at a time, about 4-8 windows of 24 tokens each."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch
from clitools import SQUAD, TRAIN_TSV, VALID_TSV, run_main
from finetunetools import ft_cfg, pydocs_rows, random_init_checkpoint

from xlnetcli.core.errors import ConfigError, Preempted
from xlnetcli.train.finetune import finetune
from xlnetcli.train.finetune_workload import FinetuneArgs, FinetuneWorkload

WINDOW = 24


@pytest.fixture(scope="module")
def work(builds, tmp_path_factory):
    root = random_init_checkpoint(builds, tmp_path_factory.mktemp("documents"))
    for name, src, n in (("train", TRAIN_TSV, 160), ("valid", VALID_TSV, 60)):
        rows = pydocs_rows(src, n)
        by_label: dict[str, list[str]] = {}
        for text, label in rows:
            by_label.setdefault(label, []).append(text)
        docs = [
            (" ".join(texts[i : i + 4]), label) for label, texts in by_label.items() for i in range(0, len(texts), 4)
        ]
        (root / f"{name}.tsv").write_text("\n".join(["text\tlabel"] + [f"{t}\t{lab}" for t, lab in docs]) + "\n")
    return root


def _cfg(*sets: str):
    return ft_cfg(
        f"finetune.max_seq_length={WINDOW}",
        "finetune.max_windows=6",
        "finetune.batch_size=8",
        "finetune.micro_batch_size=4",
        "finetune.max_steps=12",
        "finetune.eval_every=6",
        "finetune.save_every=2",
        "finetune.report_to=none",
        *sets,
    )


def _run(work: Path, cfg, out: Path, resume: bool = False) -> dict:
    args = FinetuneArgs("classification", work / "train.tsv", work / "valid.tsv", work / "init", out, quiet=True)
    if resume:
        args = FinetuneArgs(**{**args.__dict__, "resume": True})
    return finetune(cfg, args)


@pytest.mark.slow
def test_memory_finetune_resumes_bit_exact(work, tmp_path, monkeypatch):
    """document=memory with gradient through 2 windows and dropout on: SIGTERM at step 7, resumed, ends with the
    metric rows and weights of an uninterrupted run, bit for bit."""
    from safetensors.torch import load_file

    monkeypatch.setenv("XLNET_NO_PROGRESS", "1")
    cfg = _cfg("finetune.document=memory", "finetune.grad_windows=2", "finetune.mem_len=32")

    def comparable(out: Path, res: dict) -> tuple:
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        weights = load_file(str(Path(res["checkpoint"]) / "model.safetensors"))
        return [(r["step"], r["split"], r.get("loss")) for r in rows], weights, res["value"]

    with torch.random.fork_rng():
        a = comparable(tmp_path / "a", _run(work, cfg, tmp_path / "a"))
    real_loss = FinetuneWorkload.loss

    def sigterm_at_step_7(self, model, batch, micro):
        if self.examples.steps == 7 and micro == 0:
            os.kill(os.getpid(), signal.SIGTERM)
        return real_loss(self, model, batch, micro)

    monkeypatch.setattr(FinetuneWorkload, "loss", sigterm_at_step_7)
    with torch.random.fork_rng(), pytest.raises(Preempted):
        _run(work, cfg, tmp_path / "b")
    monkeypatch.setattr(FinetuneWorkload, "loss", real_loss)
    b = comparable(tmp_path / "b", _run(work, cfg, tmp_path / "b", resume=True))
    assert a[0] == b[0] and a[2] == b[2]
    assert a[1].keys() == b[1].keys() and all(torch.equal(a[1][k], b[1][k]) for k in a[1])


@pytest.mark.parametrize("document", ["memory", "window-mean"])
def test_eval_and_predict_read_documents_as_the_run_did(work, tmp_path, monkeypatch, capsys, document):
    """`xlnet eval --file` scores the validation file exactly as the run's own validation did (same reading), and
    --predict writes one row per document."""
    monkeypatch.setenv("XLNET_NO_PROGRESS", "1")
    res = _run(work, _cfg(f"finetune.document={document}", "finetune.max_steps=6"), tmp_path / "run")
    assert res["steps"] == 6
    assert f"document: {document}" in (tmp_path / "run" / "config.yaml").read_text()
    out = tmp_path / "eval.json"
    code, _, _ = run_main(capsys, "eval", tmp_path / "run", "--file", work / "valid.tsv", "--output", out)
    assert code == 0
    assert json.loads(out.read_text())["value"] == pytest.approx(res["value"], abs=1e-9)
    pred = tmp_path / "pred.tsv"
    code, _, _ = run_main(capsys, "eval", tmp_path / "run", "--file", work / "valid.tsv", "--predict", pred)
    n_docs = len((work / "valid.tsv").read_text().splitlines()) - 1
    assert code == 0 and len(pred.read_text().splitlines()) == n_docs + 1


def test_settings_a_task_cannot_take_are_refused_before_anything_is_written(work, tmp_path, capsys):
    with pytest.raises(ConfigError, match="does not apply to squad"):
        finetune(
            _cfg("finetune.document=memory"),
            FinetuneArgs("squad", SQUAD, None, work / "init", tmp_path / "sq", quiet=True),
        )
    assert not (tmp_path / "sq").exists() and not list(tmp_path.glob(".sq*"))
    code, _, err = run_main(
        capsys,
        *("finetune", "--task", "classification", "--train", work / "train.tsv", "--init", work / "init"),
        *("--out", tmp_path / "x", "--set", "finetune.document=memory", "--set", "finetune.max_windows=2"),
        *("--set", "finetune.grad_windows=3"),
    )
    assert code == 2 and "grad_windows" in err and "Traceback" not in err
    assert not (tmp_path / "x").exists()
