"""Issue 22, class 6: sizes are checked before allocating. Every value that sizes memory (layers, width, vocabulary,
sequence and memory length, batch) goes into a lower-bound estimate of parameters and memory, compared with the
machine's (host RAM, or the CUDA device's): a one-line refusal naming the estimate, never a hang or a terabyte
allocation."""

from __future__ import annotations

import time

import pytest
import torch
from clitools import FAST_PRETRAIN, TINY, assert_one_line_error, run_main, set_args

from xlnetcli.config import load_config
from xlnetcli.config import sizes as sizes_mod
from xlnetcli.config.checks import check_config
from xlnetcli.config.sizes import check_fits, check_weights_size, estimate, model_params
from xlnetcli.core.errors import CheckpointError, ConfigError
from xlnetcli.core.machine import host_ram, memory_bytes
from xlnetcli.model import XLNetLMHeadModel


@pytest.mark.parametrize("preset", ["tiny", "base"])
def test_the_parameter_count_is_the_models(preset):
    cfg = load_config(preset)
    with torch.device("meta"):
        model = XLNetLMHeadModel(cfg.model)
    assert model_params(cfg.model) == sum(p.numel() for p in model.parameters())


def test_the_machine_says_how_much_memory_it_has():
    ram = host_ram()
    assert ram is None or ram > 2**28
    assert memory_bytes("cpu") == (ram, "this machine's RAM")


@pytest.mark.parametrize(
    ("stage", "override", "needle"),
    [
        ("pretrain", "model.d_model=1000000", "model.d_model"),
        ("pretrain", "model.n_layer=100000", "model.n_layer"),
        ("pretrain", "model.vocab_size=2000000000", "model.vocab_size"),
        ("pretrain", "model.d_inner=1000000000", "model.d_inner"),
        ("pretrain", "train.micro_batch_size=4000000", "train.micro_batch_size"),
        ("pretrain", "model.mem_len=100000000", "model.mem_len"),
        ("finetune", "finetune.max_seq_length=10000000", "finetune.max_seq_length"),
        ("finetune", "finetune.micro_batch_size=100000000", "finetune.micro_batch_size"),
    ],
)
def test_configs_beyond_the_machine_are_refused_in_one_line(stage, override, needle):
    extra = ["tokenizer.vocab_size=2000000000"] if "vocab_size" in override else []
    sets = [*FAST_PRETRAIN, override, *extra]
    if "micro_batch_size=4000000" in override:
        sets.append("train.global_batch_size=4000000")
    if "finetune.micro_batch_size" in override:
        sets.append("finetune.batch_size=100000000")
    cfg = load_config(TINY, sets)  # building a config checks no sizes: `xlnet config` prints any
    start = time.monotonic()
    with pytest.raises(ConfigError, match=rf"does not fit in memory: .*{needle}") as e:
        check_config(cfg, stage=stage)
    assert "\n" not in str(e.value) and time.monotonic() - start < 1


def test_a_huge_sequence_length_is_refused_when_preprocessing():
    cfg = load_config(TINY, [*FAST_PRETRAIN, "data.seq_len=10000000", "model.reuse_len=5000000"])
    check_config(cfg, stage="preprocess")  # 4 rows of 10M tokens: a GB, fine for preprocessing...
    with pytest.raises(ConfigError, match="does not fit in memory"):
        check_config(cfg, stage="pretrain")  # ...but its attention masks alone are 10^14 bytes
    sets = ["data.seq_len=1000000000", "model.reuse_len=500000000", "train.global_batch_size=2048"]
    cfg = load_config(TINY, [*FAST_PRETRAIN, *sets])
    with pytest.raises(ConfigError, match=r"does not fit in memory: .* of activations.*data\.seq_len"):
        check_config(cfg, stage="preprocess")


def test_presets_fit_a_machine_with_memory_for_them(monkeypatch):
    monkeypatch.setattr(sizes_mod, "memory_bytes", lambda device=None: (80 * 10**9, "GPU cuda:0"))
    for preset in ("tiny", "base", "large"):
        cfg = load_config(preset)
        check_config(cfg, stage="pretrain", device="cuda:0")
        check_config(cfg, stage="finetune", device="cuda:0")


def test_the_gpu_memory_is_the_limit_on_a_cuda_device(monkeypatch):
    monkeypatch.setattr(sizes_mod, "memory_bytes", lambda device=None: (2 * 10**9, f"GPU {device}"))
    with pytest.raises(ConfigError, match=r"GPU cuda:0 has 2\.0 GB"):
        check_fits(load_config("large"), "pretrain", "cuda:0")


def test_a_machine_that_does_not_say_checks_nothing(monkeypatch):
    monkeypatch.setattr(sizes_mod, "memory_bytes", lambda device=None: (None, "?"))
    check_fits(load_config(TINY, [*FAST_PRETRAIN, "model.d_model=1000000"]), "pretrain")


def test_the_estimate_grows_with_every_size():
    base = load_config(TINY, FAST_PRETRAIN)
    p0, _, a0 = estimate(base, "pretrain")
    for o in ("model.n_layer=4", "model.d_model=128", "data.seq_len=64", "train.micro_batch_size=4"):
        cfg = load_config(TINY, [*FAST_PRETRAIN, o, "train.global_batch_size=8"])
        p, _, a = estimate(cfg, "pretrain")
        assert p + a > p0 + a0, o


def test_a_checkpoint_config_far_larger_than_its_weights_is_refused():
    cfg = load_config(TINY, [*FAST_PRETRAIN, "model.d_model=1000000"])
    with pytest.raises(CheckpointError, match=r"describes a model of ~.* parameters .* does not belong"):
        check_weights_size(cfg.model, 10_000, "ckpt/config.json")
    small = load_config(TINY, FAST_PRETRAIN).model
    check_weights_size(small, model_params(small), "x")


def test_xlnet_config_still_prints_any_size(capsys):
    code, out, err = run_main(capsys, "config", "show", "tiny", "--set", "model.d_model=1000000")
    assert code == 0 and "1000000" in out, err


@pytest.mark.slow  # builds records
@pytest.mark.parametrize("override", ["model.d_model=1000000", "model.n_layer=100000"])
def test_pretrain_refuses_in_one_line_within_seconds(builds, tmp_path, capsys, override):
    records = builds.pipeline(FAST_PRETRAIN).records
    start = time.monotonic()
    args = ["--config", TINY, *set_args([*FAST_PRETRAIN, override]), "--data", records, "--out", tmp_path / "run"]
    code, _, err = run_main(capsys, "pretrain", *args)
    assert_one_line_error(code, err, "does not fit in memory")
    assert time.monotonic() - start < 20
    assert not (tmp_path / "run" / "step_0000001").exists()
