"""One meaning per setting: eval_every, save_every and max_steps spell their special cases as words that mean the same
in train.* and finetune.*; 0 is refused naming the word, except in a config an earlier version wrote (no
config_version), which is read in today's spelling with one line saying so."""

from __future__ import annotations

import pytest
import yaml

from xlnetcli.config import CONFIG_VERSION, config_from_dict, config_to_dict, dump_config, load_config, upgrade_config
from xlnetcli.core.errors import ConfigError


def test_defaults_keep_each_sections_cadence():
    cfg = load_config(None)
    assert (cfg.train.eval_every, cfg.train.save_every, cfg.train.max_steps) == (10_000, 10_000, 500_000)
    assert (cfg.finetune.eval_every, cfg.finetune.save_every, cfg.finetune.max_steps) == ("epoch", "eval", None)


@pytest.mark.parametrize("section", ["train", "finetune"])
def test_both_sections_accept_the_words(section):
    cfg = load_config(None, [f"{section}.eval_every=never", f"{section}.save_every=end"])
    assert getattr(cfg, section).eval_every == "never" and getattr(cfg, section).save_every == "end"
    cfg = load_config(None, [f"{section}.eval_every=25", f"{section}.save_every=eval"])
    assert getattr(cfg, section).eval_every == 25 and getattr(cfg, section).save_every == "eval"
    assert load_config(None, ["finetune.eval_every=epoch", "finetune.max_steps=null"]).finetune.max_steps is None


@pytest.mark.parametrize(
    "item, said",
    [
        ("train.eval_every=0", "write train.eval_every=never (no evaluation)"),
        ("train.save_every=0", "write train.save_every=end (only at the end) or eval"),
        ("finetune.eval_every=0", "write finetune.eval_every=epoch (every epoch) or never"),
        ("finetune.save_every=0", "write finetune.save_every=eval (at every evaluation) or end"),
        ("finetune.max_steps=0", "write finetune.max_steps=null (derive from finetune.epochs)"),
    ],
)
def test_zero_is_refused_naming_the_new_spelling(item, said, tmp_path):
    key = item.split("=")[0]
    with pytest.raises(ConfigError) as e:
        load_config(None, [item])
    assert str(e.value) == f"--set {item}: {key}=0 is no longer accepted: {said}"
    section, name = key.split(".")
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump({section: {name: 0}}))  # a user's file (or a preset)
    with pytest.raises(ConfigError, match=rf"^{tmp_path / 'mine.yaml'}: {key}=0 is no longer accepted: "):
        load_config(tmp_path / "mine.yaml")


def test_train_refuses_epoch_and_words_are_checked():
    with pytest.raises(ConfigError, match=r"^--set train.eval_every=epoch: .*pretraining has no epochs"):
        load_config(None, ["train.eval_every=epoch"])
    with pytest.raises(ConfigError, match=r"finetune.save_every: expected an integer or one of 'end', 'eval', got"):
        load_config(None, ["finetune.save_every=epoch"])
    with pytest.raises(ConfigError, match=r"train.max_steps: expected an integer"):
        load_config(None, ["train.max_steps=null"])


def _old_config(tmp_path, **sections):
    """A config.yaml as an earlier version wrote it: every section, 0 for the special cases, no config_version."""
    raw = config_to_dict(load_config(None))
    raw["train"].update(eval_every=0, save_every=0)
    raw["finetune"].update(eval_every=0, save_every=0, max_steps=0)
    for name, values in sections.items():
        raw[name].update(values)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def test_an_earlier_versions_config_is_upgraded_with_one_line(tmp_path, capsys):
    path = _old_config(tmp_path)
    cfg = load_config(path, upgrade=True)
    assert (cfg.train.eval_every, cfg.train.save_every) == ("never", "end")
    assert (cfg.finetune.eval_every, cfg.finetune.save_every, cfg.finetune.max_steps) == ("epoch", "eval", None)
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"xlnet: {path} was written by an earlier version; read train.eval_every=0 as never, train.save_every=0 as "
        "end, finetune.max_steps=0 as null, finetune.eval_every=0 as epoch, finetune.save_every=0 as eval"
    ]
    load_config(path, upgrade=True)
    assert capsys.readouterr().err == ""  # once per file
    # the same file given with --config is a user's file: refused, naming the new spelling
    with pytest.raises(ConfigError, match=r"train.eval_every=0 is no longer accepted: write train.eval_every=never"):
        load_config(path)


def test_config_version_is_written_and_checked(tmp_path, capsys):
    text = dump_config(load_config("tiny"))
    assert text.startswith(f"config_version: {CONFIG_VERSION}\n")
    (tmp_path / "config.yaml").write_text(text)
    assert load_config(tmp_path / "config.yaml", upgrade=True) == load_config("tiny")
    assert config_from_dict(yaml.safe_load(text)) == load_config("tiny")
    # a file of this version with 0 is not an earlier version's: refused even where outputs are read
    raw = yaml.safe_load(text)
    raw["train"]["save_every"] = 0
    with pytest.raises(ConfigError, match=r"train.save_every=0 is no longer accepted"):
        config_from_dict(upgrade_config(raw, "x"))
    raw["config_version"] = CONFIG_VERSION + 1
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=r"written by a newer xlnet \(config_version 3; this one reads up to 2\)"):
        load_config(tmp_path / "config.yaml", upgrade=True)
    assert capsys.readouterr().err == ""
