from pathlib import Path

import pytest
import yaml

from xlnetcli.config import Config, config_to_dict, load_config, save_config
from xlnetcli.errors import ConfigError

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").rglob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_yaml_loads_and_round_trips(path, tmp_path):
    cfg = load_config(path)
    assert isinstance(cfg, Config)
    saved = save_config(cfg, tmp_path)
    assert load_config(saved) == cfg
    # every key written in the file is taken literally (no silent defaults hide a typo)
    raw = yaml.safe_load(path.read_text())
    resolved = config_to_dict(cfg)
    for section, values in raw.items():
        for key, value in (values or {}).items():
            got = resolved[section][key]
            assert got == (list(value) if isinstance(value, tuple) else value), f"{section}.{key}"


def test_paper_sizes():
    base, large = load_config(CONFIGS[0].parent / "base.yaml"), load_config(CONFIGS[0].parent / "large.yaml")
    assert (base.model.n_layer, base.model.d_model, base.model.n_head, base.model.d_inner) == (12, 768, 12, 3072)
    assert (large.model.n_layer, large.model.d_model, large.model.n_head, large.model.d_inner) == (24, 1024, 16, 4096)
    for c in (base, large):
        assert (c.data.seq_len, c.model.reuse_len, c.model.mem_len, c.data.num_predict) == (512, 256, 384, 85)
        assert c.train.lr == 4e-4 and c.train.adam_eps == 1e-6 and c.train.warmup_steps == 40_000


def test_overrides_are_typed():
    cfg = load_config(None, ["train.lr=1e-3", "model.bi_data=false", "train.adam_betas=[0.9, 0.98]",
                             "data.perm_size=128", "model.reuse_len=256"])
    assert cfg.train.lr == 1e-3 and cfg.model.bi_data is False and cfg.train.adam_betas == (0.9, 0.98)
    assert cfg.perm_size == 128


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["model.d_model=abc"], "model.d_model: expected an integer"),
        (["model.nope=1"], "unknown key model.nope"),
        (["nosection.x=1"], "unknown section 'nosection'"),
        (["model.reuse_len=1000"], "model.reuse_len (1000) must be <= data.seq_len"),
        (["model.bi_data=maybe"], "model.bi_data: expected true or false"),
        (["train.precision=fp8"], "train.precision: expected one of"),
        (["train.micro_batch_size=3", "train.global_batch_size=9"], "must be even with model.bi_data"),
        (["train.global_batch_size=10", "train.micro_batch_size=4"], "must be a multiple"),
        (["data.perm_size=100"], "data.perm_size (100) must divide"),
        (["model.dropout=1.5"], "model.dropout must be in [0, 1)"),
        (["lr=1"], "expected section.key=value"),
    ],
)
def test_bad_values_name_the_key_and_file(overrides, message, tmp_path):
    path = tmp_path / "my.yaml"
    path.write_text("model:\n  d_model: 768\n")
    with pytest.raises(ConfigError) as e:
        load_config(path, overrides)
    assert message in str(e.value)
    assert "\n" not in str(e.value)
    if overrides[0] != "lr=1":
        assert str(path) in str(e.value)


def test_bad_yaml_files(tmp_path):
    (tmp_path / "a.yaml").write_text("model: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(tmp_path / "a.yaml")
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "missing.yaml")
    (tmp_path / "b.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(tmp_path / "b.yaml")
