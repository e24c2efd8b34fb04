"""Precision by device (issue 33): ``auto`` is bf16 on a CUDA GPU with bf16 and fp32 elsewhere, resolved once at the
start of a run and recorded in its config.yaml; bf16 asked for on a CPU without bf16 instructions is honoured with
one warning line; fp16 on a CPU is refused; configs written before ``auto`` load as they did."""

from __future__ import annotations

import json
from contextlib import nullcontext

import pytest
import torch
import yaml
from clitools import FAST_PRETRAIN, TINY, VALID_TSV, run_main
from finetunetools import LABELS, MODEL_SETS, ft_cfg

from xlnetcli.checkpoint.folders import save_model_dir
from xlnetcli.config import config_to_dict, load_config
from xlnetcli.core import dist
from xlnetcli.core.errors import ConfigError
from xlnetcli.evaluate.finetuned import build_finetune_model
from xlnetcli.train.plan import run_precision
from xlnetcli.train.pretrain import pretrain

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
SLOW = "on a CPU runs about 2x slower than fp32 here"


@pytest.fixture(autouse=True)
def _no_cpu_bf16(monkeypatch):
    """This CPU, whatever the test machine's: no bf16 instructions (where it has them, bf16 is faster: no warning)."""
    monkeypatch.setattr(dist, "cpu_has_bf16", lambda: False)


def test_auto_is_bf16_on_a_cuda_gpu_with_bf16_and_fp32_elsewhere(monkeypatch):
    assert dist.resolve_precision("auto", CPU) == "fp32"
    assert isinstance(dist.autocast_ctx(CPU, "auto"), nullcontext)
    assert [dist.resolve_precision(p, CPU) for p in ("fp32", "bf16", "fp16")] == ["fp32", "bf16", "fp16"]
    said: list[str] = []
    for supported, want in ((True, "bf16"), (False, "fp32")):  # an Ampere-or-later GPU; a V100
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda supported=supported: supported)
        assert dist.resolve_precision("auto", CUDA) == want
        cfg = run_precision(load_config("glue"), "finetune", CUDA, said.append)
        assert (cfg.finetune.precision, cfg.train.precision) == (want, "auto")  # only the run's section
    assert said == []
    assert run_precision(load_config("glue"), "finetune", CPU, said.append).finetune.precision == "fp32"
    assert (
        run_precision(
            load_config("glue", ["finetune.precision=bf16"]), "finetune", CUDA, said.append
        ).finetune.precision
        == "bf16"
    )
    assert said == []  # bf16 on a GPU, auto anywhere: nothing to say
    with pytest.raises(ConfigError, match=r"^finetune.precision=fp16 needs a CUDA device \(use auto or fp32 on CPU\)$"):
        run_precision(load_config("glue", ["finetune.precision=fp16"]), "finetune", CPU, said.append)


def test_a_run_records_the_precision_it_used_and_warns_once_for_bf16_on_a_cpu(builds, tmp_path, capsys):
    records = builds.pipeline(FAST_PRETRAIN).records
    over = [*FAST_PRETRAIN, "train.max_steps=2", "train.warmup_steps=1", "train.save_every=1", "train.eval_every=never"]
    pretrain(load_config(TINY, [*over, "train.precision=bf16"]), records, tmp_path / "bf16", device="cpu")
    err = capsys.readouterr().err
    assert [ln for ln in err.splitlines() if SLOW in ln] == [
        f"warning: train.precision=bf16 {SLOW} (no bf16 instructions); use train.precision=auto or fp32"
    ]
    assert ", precision bf16," in err  # honoured, and the header says so
    assert yaml.safe_load((tmp_path / "bf16" / "config.yaml").read_text())["train"]["precision"] == "bf16"

    auto = load_config(TINY, [*over, "train.precision=auto"])
    pretrain(auto, records, tmp_path / "auto", device="cpu")
    err = capsys.readouterr().err
    assert SLOW not in err and ", precision fp32," in err
    assert yaml.safe_load((tmp_path / "auto" / "config.yaml").read_text())["train"]["precision"] == "fp32"
    # a resume with the same config resolves it the same way: accepted as the run's own
    res = pretrain(
        load_config(TINY, [*over, "train.precision=auto", "train.max_steps=3"]),
        records,
        tmp_path / "auto",
        resume="latest",
        device="cpu",
        quiet=True,
    )
    assert res["step"] == 3
    with pytest.raises(ConfigError, match=r"train.precision=fp16 needs a CUDA device"):
        pretrain(load_config(TINY, [*over, "train.precision=fp16"]), records, tmp_path / "fp16", device="cpu")


def test_eval_uses_the_runs_precision_and_says_what_bf16_costs_on_a_cpu(builds, tmp_path, capsys):
    cfg = ft_cfg(*MODEL_SETS, "finetune.precision=bf16")
    torch.manual_seed(0)
    meta = {"kind": "finetune", "task": "classification", "labels": LABELS, "step": 1}
    model = build_finetune_model(cfg, "classification", len(LABELS))
    run = save_model_dir(tmp_path / "cls", model, cfg, builds.tokenizer(cfg.tokenizer), meta=meta)
    code, out, err = run_main(capsys, "eval", run, "--file", VALID_TSV, "--quiet")
    assert code == 0 and err.splitlines() == [
        f"warning: the run's finetune.precision=bf16 {SLOW} (no bf16 instructions); use --precision auto or fp32"
    ]
    code, fp32, err = run_main(capsys, "eval", run, "--file", VALID_TSV, "--quiet", "--precision", "auto")
    assert code == 0 and err == ""
    assert json.loads(fp32)["examples"] == json.loads(out)["examples"]
    code, again, err = run_main(capsys, "eval", run, "--file", VALID_TSV, "--quiet", "--precision", "fp32")
    assert code == 0 and err == "" and again == fp32


def test_configs_written_before_auto_load_as_they_did(tmp_path):
    """A new choice needs no upgrade (loading.upgrade_config reads the 0s of config_version 1): an old file's bf16
    stays bf16; the GPU presets now say auto in the sections they are for."""
    raw = config_to_dict(load_config(None))
    raw["train"].update(precision="bf16", eval_every=0, save_every=0)  # config_version 1 (no key): an old run's
    raw["finetune"].update(precision="bf16", eval_every=0, save_every=0, max_steps=0)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(raw))
    old = load_config(tmp_path / "config.yaml", upgrade=True)
    assert (old.train.precision, old.finetune.precision) == ("bf16", "bf16")
    for name in ("base", "large", "continue-base", "continue-large", "glue", "squad", "race"):
        cfg = load_config(name)
        assert (cfg.train.precision, cfg.finetune.precision) == ("auto", "auto"), name
    assert load_config(None).train.precision == "auto" and load_config(None).finetune.precision == "fp32"
    assert all(load_config(n).train.precision == "fp32" for n in ("tiny", "demo", "continue-tiny"))
