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


def _train_steps(capsys, init, out, *sets: str) -> list[int]:
    args = set_args([*FT_SETS, *sets])
    code, _, err = run_main(
        capsys,
        "finetune",
        "--task",
        "classification",
        "--train",
        init / "train.tsv",
        "--init",
        init / "init",
        "--out",
        out,
        "--quiet",
        *args,
    )
    assert code == 0, err
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in rows if r["split"] == "train"]


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
