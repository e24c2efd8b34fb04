"""The finetuning run's own settings: finetune.log_every and finetune.peak_tflops (not the checkpoint's train.*)."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from clitools import TRAIN_TSV, run_main, set_args
from finetunetools import pydocs_rows

from xlnetcli.cli import check_override_sections
from xlnetcli.config import config_to_dict, load_config
from xlnetcli.core.errors import ConfigError

# a small model; its checkpoint logs pretraining every step (train.log_every=1), which finetuning must not inherit
INIT_SETS = [
    "tokenizer.vocab_size=2000",
    "model.vocab_size=2000",
    "model.d_model=32",
    "model.n_layer=1",
    "model.n_head=2",
    "model.d_head=16",
    "model.d_inner=64",
    "model.mem_len=0",
    "model.reuse_len=0",
    "model.bi_data=false",
    "data.seq_len=32",
    "data.num_predict=5",
    "data.perm_size=16",
    "tokenizer.character_coverage=0.9999",
    "tokenizer.threads=1",
    "train.log_every=1",
]
FT_SETS = [
    "finetune.max_seq_length=32",
    "finetune.batch_size=8",
    "finetune.micro_batch_size=8",
    "finetune.max_steps=7",
    "finetune.precision=fp32",
    "finetune.report_to=none",
]


@pytest.fixture(scope="module")
def init(builds, tmp_path_factory):
    """A random-init pretraining checkpoint (its config.yaml has train.log_every=1) and a small labelled file."""
    from xlnetcli.checkpoint.folders import save_model_dir
    from xlnetcli.model import XLNetLMHeadModel

    root = tmp_path_factory.mktemp("ftcfg")
    cfg = load_config(None, INIT_SETS)
    torch.manual_seed(0)
    save_model_dir(
        root / "init",
        XLNetLMHeadModel(cfg.model),
        cfg,
        builds.tokenizer(cfg.tokenizer),
        meta={"kind": "pretrain", "step": 0},
    )
    rows = pydocs_rows(TRAIN_TSV, 64)
    (root / "train.tsv").write_text("\n".join(["text\tlabel"] + [f"{t}\t{lab}" for t, lab in rows]) + "\n")
    return root


def _finetune(capsys, init, out, *extra: str) -> tuple[int, str]:
    """`xlnet finetune` of the classification rows of ``init`` into ``out``, quiet; ``extra``: more arguments."""
    cmd = ["finetune", "--task", "classification", "--train", init / "train.tsv", "--init", init / "init"]
    code, _, err = run_main(capsys, *cmd, "--out", out, "--quiet", *extra)
    return code, err


def _train_steps(capsys, init, out, *sets: str) -> list[int]:
    code, err = _finetune(capsys, init, out, *set_args([*FT_SETS, *sets]))
    assert code == 0, err
    return [r["step"] for r in _rows(out) if r["split"] == "train"]


def test_finetune_log_every_sets_the_log_interval(init, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("XLNET_NO_PROGRESS", "1")
    # a metric line every 3 steps, and at the last one
    assert _train_steps(capsys, init, tmp_path / "every3", "finetune.log_every=3") == [3, 6, 7]
    saved = yaml.safe_load((tmp_path / "every3" / "config.yaml").read_text())
    assert saved["finetune"]["log_every"] == 3
    # unset: finetune.log_every's default (10), not the checkpoint's train.log_every (1)
    assert _train_steps(capsys, init, tmp_path / "default") == [7]


def test_finetune_reads_its_own_section_for_the_train_keys_it_uses():
    defaults = load_config(None)
    assert defaults.finetune.log_every == defaults.train.log_every == 10
    assert defaults.finetune.peak_tflops == defaults.train.peak_tflops == 0.0
    check_override_sections(["finetune.log_every=5", "finetune.peak_tflops=989.4"], "finetune")
    with pytest.raises(ConfigError, match=r"train\.log_every is not used; did you mean finetune\.log_every\?$"):
        check_override_sections(["train.log_every=5"], "finetune")
    with pytest.raises(ConfigError, match=r"finetune\.log_every must be >= 1"):
        load_config(None, ["finetune.log_every=0"])


def test_a_config_saved_before_the_finetune_keys_still_loads(tmp_path):
    """Run folders written before finetune.log_every/peak_tflops existed: the missing keys take their defaults."""
    raw = config_to_dict(load_config("tiny"))
    del raw["finetune"]["log_every"], raw["finetune"]["peak_tflops"]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    assert load_config(tmp_path / "config.yaml") == load_config("tiny")


def _rows(out) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _as_earlier_version(folder) -> None:
    """Rewrite ``folder``'s config.yaml as an earlier version wrote it (0 for the special cadences, no
    config_version), keeping a step folder's meta.json checksum true."""
    from xlnetcli.core.files import sha256_file

    path = folder / "config.yaml"
    raw = yaml.safe_load(path.read_text())
    del raw["config_version"]
    raw["train"].update(eval_every=0, save_every=0)
    raw["finetune"].update(eval_every=0, save_every=0, max_steps=raw["finetune"]["max_steps"] or 0)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    if (folder / "meta.json").is_file():
        meta = json.loads((folder / "meta.json").read_text())
        meta["sha256"]["config.yaml"] = sha256_file(path)
        (folder / "meta.json").write_text(json.dumps(meta))


def _validated(capsys, init, out, *extra: str) -> tuple[int, str]:
    """``_finetune`` at batch 8, validated on its training rows."""
    sets = set_args(["finetune.batch_size=8", "finetune.micro_batch_size=8", "finetune.report_to=none"])
    return _finetune(capsys, init, out, "--valid", init / "train.tsv", *sets, *extra)


def test_default_cadence_is_every_epoch_and_never_keeps_the_last(init, tmp_path, capsys, monkeypatch):
    """finetune.eval_every=epoch and save_every=eval (the defaults): an evaluation at each epoch's end (64 rows, 8
    per step: steps 8 and 16 of 2 epochs, max_steps null); never: no evaluation, the last model kept."""
    monkeypatch.setenv("XLNET_NO_PROGRESS", "1")
    code, err = _validated(capsys, init, tmp_path / "epochs", "--set", "finetune.epochs=2")
    assert code == 0, err
    assert [r["step"] for r in _rows(tmp_path / "epochs") if r["split"] == "eval"] == [8, 16]
    code, err = _validated(
        capsys, init, tmp_path / "never", "--set", "finetune.epochs=2", "--set", "finetune.eval_every=never"
    )
    assert code == 0, err
    assert [r for r in _rows(tmp_path / "never") if r["split"] == "eval"] == []
    results = json.loads((tmp_path / "never" / "results.json").read_text())
    assert results["best_step"] == 16 and results["metric"] is None


def test_an_earlier_versions_run_folders_still_load(init, tmp_path, capsys, monkeypatch):
    """Checkpoints written before config_version 2 (0 for the cadences): finetuning from one without --config reads
    its config in today's spelling with one line naming the file; an interrupted run of that version resumes, and its
    result evaluates."""
    import os
    import shutil
    import signal

    from xlnetcli.train.finetune import partial_dir
    from xlnetcli.train.finetune_workload import FinetuneWorkload

    monkeypatch.setenv("XLNET_NO_PROGRESS", "1")
    old_init = tmp_path / "old"
    shutil.copytree(init, old_init)
    _as_earlier_version(old_init / "init")
    out = tmp_path / "run"
    real_loss = FinetuneWorkload.loss

    def sigterm_at_step_3(self, model, batch, micro):
        if self.examples.steps == 3 and micro == 0:
            os.kill(os.getpid(), signal.SIGTERM)
        return real_loss(self, model, batch, micro)

    monkeypatch.setattr(FinetuneWorkload, "loss", sigterm_at_step_3)
    code, err = _validated(capsys, old_init, out, "--set", "finetune.max_steps=5")
    assert code == 75, err
    upgraded = [ln for ln in err.splitlines() if "earlier version" in ln]
    assert upgraded == [
        f"xlnet: {old_init / 'init' / 'config.yaml'} was written by an earlier version; read train.eval_every=0 as "
        "never, train.save_every=0 as end, finetune.max_steps=0 as null, finetune.eval_every=0 as epoch, "
        "finetune.save_every=0 as eval"
    ]
    partial = partial_dir(out)
    _as_earlier_version(partial)
    _as_earlier_version(partial / "step_0000003")
    monkeypatch.setattr(FinetuneWorkload, "loss", real_loss)
    code, err = _validated(capsys, old_init, out, "--set", "finetune.max_steps=5", "--resume")
    assert code == 0, err
    assert f"{partial / 'config.yaml'} was written by an earlier version" in err
    assert [r["step"] for r in _rows(out) if r["split"] == "eval"] == [5]
    _as_earlier_version(out / "step_0000005")
    code, _, err = run_main(capsys, "eval", out, "--file", init / "train.tsv")
    assert code == 0, err
    assert "earlier version" in err
