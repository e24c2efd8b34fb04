import dataclasses
import re
import time
import typing

import pytest
import yaml
from clitools import PRESET_DIR, ROOT, assert_one_line_error, run_main

from xlnetcli.cli import COMMAND_SECTIONS, check_override_sections
from xlnetcli.config import (
    PRESETS,
    SECTIONS,
    Config,
    batch_maths,
    check_config,
    config_to_dict,
    load_config,
    preset_path,
    save_config,
)
from xlnetcli.core.errors import ConfigError

SHIPPED = sorted(PRESET_DIR.rglob("*.yaml"))


def test_every_shipped_yaml_is_a_named_preset():
    assert {p.relative_to(PRESET_DIR).as_posix() for p in SHIPPED} == set(PRESETS.values())
    for name in PRESETS:
        assert preset_path(name).resolve() in {p.resolve() for p in SHIPPED}
    # configs/ in the repository is the same folder (a link), not a second copy that could drift
    assert (ROOT / "configs").resolve() == PRESET_DIR.resolve()


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_shipped_yaml_loads_and_round_trips(name, tmp_path):
    path = preset_path(name)
    cfg = load_config(name)
    assert isinstance(cfg, Config) and cfg == load_config(path) == load_config(ROOT / "configs" / PRESETS[name])
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
    base, large = load_config("base"), load_config("large")
    assert (base.model.n_layer, base.model.d_model, base.model.n_head, base.model.d_inner) == (12, 768, 12, 3072)
    assert (large.model.n_layer, large.model.d_model, large.model.n_head, large.model.d_inner) == (24, 1024, 16, 4096)
    for c in (base, large):
        assert (c.data.seq_len, c.model.reuse_len, c.model.mem_len, c.data.num_predict) == (512, 256, 384, 85)
        assert c.train.lr == 4e-4 and c.train.adam_eps == 1e-6 and c.train.warmup_steps == 40_000
    assert load_config("squad").finetune.layer_decay == 0.75


def test_overrides_are_typed():
    cfg = load_config(
        None,
        [
            "train.lr=1e-3",
            "model.bi_data=false",
            "train.adam_betas=[0.9, 0.98]",
            "data.perm_size=128",
            "model.reuse_len=256",
        ],
    )
    assert cfg.train.lr == 1e-3 and cfg.model.bi_data is False and cfg.train.adam_betas == (0.9, 0.98)
    assert cfg.perm_size == 128


def test_one_vocabulary_override_sets_both():
    assert load_config("tiny", ["tokenizer.vocab_size=1000"]).model.vocab_size == 1000
    assert load_config("tiny", ["model.vocab_size=900"]).tokenizer.vocab_size == 900
    with pytest.raises(ConfigError, match=r"must equal model.vocab_size"):
        load_config("tiny", ["tokenizer.vocab_size=1000", "model.vocab_size=900"])


# ---- every number has a declared range --------------------------------------------------------------------------


def _numeric_fields():
    for section, cls in SECTIONS.items():
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            tp = hints[f.name]
            args = typing.get_args(tp)
            if tp in (int, float) or int in args or float in args:
                yield section, f


@pytest.mark.parametrize("section, f", list(_numeric_fields()), ids=lambda x: getattr(x, "name", x))
def test_every_numeric_field_declares_a_range_that_holds_its_default(section, f):
    rng = f.metadata.get("range")
    assert rng is not None, f"{section}.{f.name} has no declared range"
    default = f.default
    for v in default if isinstance(default, tuple) else [default]:
        assert v is None or isinstance(v, str) or v in rng, f"{section}.{f.name}: default {v} outside {rng}"
    # the range is enforced at load, with the key and the range in the message
    bad = rng.lo - 1 if rng.lo_closed else rng.lo
    tp = typing.get_type_hints(SECTIONS[section])[f.name]
    text = str(int(bad)) if int in (tp, *typing.get_args(tp)) else repr(float(bad))
    text = f"[{text}, {text}]" if isinstance(default, tuple) else text
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"{section}.{f.name}={text}"])
    # 0 in a cadence key (eval_every, save_every, finetune.max_steps) meant a section's special case: its word is named
    said = "is no longer accepted: write" if "spelled" in f.metadata else "must be"
    assert f"{section}.{f.name}" in str(e.value) and said in str(e.value)


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.lr=.nan", "train.lr must be a finite number > 0, got nan"),
        ("train.lr=inf", "train.lr must be a finite number > 0, got inf"),
        ("train.lr=-1e-4", "train.lr must be a finite number > 0"),
        ("train.adam_betas=[0.9, 1.0]", "train.adam_betas[1] must be in [0, 1), got 1.0"),
        ("train.adam_betas=[-0.1, 0.99]", "train.adam_betas[0] must be in [0, 1)"),
        ("train.adam_eps=-1e-8", "train.adam_eps must be a finite number > 0"),
        ("model.layer_norm_eps=-1e-12", "model.layer_norm_eps must be in (0, 1)"),
        ("train.seed=-1", "train.seed must be in [0, 4294967295], got -1"),
        ("data.seed=4294967296", "data.seed must be in [0, 4294967295]"),
        ("finetune.seed=-3", "finetune.seed must be in [0, 4294967295]"),
        ("tokenizer.vocab_size=3000000000", "tokenizer.vocab_size must be in [9, 2147483647]"),
        ("tokenizer.input_sentence_size=-1", "tokenizer.input_sentence_size must be in [0, 2147483647]"),
        ("tokenizer.threads=-1", "tokenizer.threads must be in [0, 1024]"),
        ("tokenizer.character_coverage=0.5", "tokenizer.character_coverage must be in [0.98, 1]"),
        ("finetune.max_steps=-1", "finetune.max_steps must be >= 1"),
        ("train.weight_decay=-0.01", "train.weight_decay must be a finite number >= 0"),
        ("finetune.weight_decay=-0.01", "finetune.weight_decay must be a finite number >= 0"),
        ("train.save_every=-1", "train.save_every must be >= 1"),
        ("train.eval_every=-5", "train.eval_every must be >= 1"),
        ("train.clip_norm=.inf", "train.clip_norm must be a finite number >= 0"),
        ("model.clamp_len=-2", "model.clamp_len must be >= -1"),
        ("model.initializer_range=0", "model.initializer_range must be a finite number > 0"),
        ("finetune.layer_decay=0", "finetune.layer_decay must be in (0, 1]"),
        ("finetune.epochs=0", "finetune.epochs must be a finite number > 0"),
        ("finetune.warmup_ratio=1", "finetune.warmup_ratio must be in [0, 1)"),
        ("train.min_lr_ratio=1.5", "train.min_lr_ratio must be in [0, 1]"),
        ("data.valid_fraction=-0.1", "data.valid_fraction must be in [0, 1)"),
        ("train.peak_tflops=-1", "train.peak_tflops must be a finite number >= 0"),
        ("model.dropout=1.5", "model.dropout must be in [0, 1)"),
    ],
)
def test_out_of_range_values_name_the_key_and_the_range(override, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert str(e.value) == f"--set {override}: {message}" or str(e.value).startswith(f"--set {override}: {message}")


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
def test_a_bad_override_is_reported_as_the_override(overrides, message, tmp_path):
    """The file is fine: the message blames the --set item (never the file), and names the file it was applied to."""
    path = tmp_path / "my.yaml"
    path.write_text("model:\n  d_model: 768\n")
    with pytest.raises(ConfigError) as e:
        load_config(path, overrides)
    msg = str(e.value)
    assert message in msg and "\n" not in msg
    assert msg.startswith("--set "), msg
    assert any(o in msg.split(":")[0] for o in overrides), msg
    assert not msg.startswith(str(path))


@pytest.mark.parametrize(
    "content, message",
    [
        ("train:\n  lr: .nan\n", "train.lr must be a finite number > 0"),
        ("train:\n  adam_betas: [0.9, 1.5]\n", "train.adam_betas[1] must be in [0, 1)"),
        ("model:\n  reuse_len: 1000\n", "model.reuse_len (1000) must be <= data.seq_len"),
        ("model:\n  nope: 1\n", "unknown key model.nope"),
        ("- 1\n- 2\n", "mapping"),
    ],
)
def test_a_bad_file_value_is_reported_against_the_file(content, message, tmp_path):
    path = tmp_path / "my.yaml"
    path.write_text(content)
    with pytest.raises(ConfigError) as e:
        load_config(path, ["train.lr=1e-3"])  # a valid override does not take the blame
    assert str(e.value).startswith(f"{path}: ") and message in str(e.value)


def test_bad_yaml_files(tmp_path):
    (tmp_path / "a.yaml").write_text("model: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(tmp_path / "a.yaml")
    with pytest.raises(ConfigError, match="config file not found") as e:
        load_config(tmp_path / "missing.yaml")
    assert all(name in str(e.value) for name in PRESETS)  # the names it could have been
    with pytest.raises(ConfigError, match="is a folder") as e:
        load_config(tmp_path)
    assert "tiny" in str(e.value)
    (tmp_path / "b.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(tmp_path / "b.yaml")


# ---- hostile YAML -------------------------------------------------------------------------------------------------

BOMB = """train:
  lr: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
  b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
  c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
  d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
  e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
  f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
  g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
  h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
  i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
  seed: [*i,*i,*i,*i,*i,*i,*i,*i,*i]
"""


def test_a_yaml_alias_bomb_is_refused_at_once(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMB)
    t0 = time.perf_counter()
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert time.perf_counter() - t0 < 1.0
    assert "aliases" in str(e.value) and "line 2" in str(e.value) and len(str(e.value)) < 300
    with pytest.raises(ConfigError, match="aliases"):
        load_config(None, ["train.adam_betas=[&x 0.9, *x]"])


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("train:\n  lr: 1e-3\n  seed: 3\n  lr: 1e-4\n", "key 'lr' is given twice (lines 2 and 4); keep one"),
        ("train:\n  lr: 1e-3\nmodel: {}\ntrain:\n  seed: 3\n", "key 'train' is given twice (lines 1 and 4)"),
    ],
)
def test_a_key_given_twice_in_a_config_is_refused(tmp_path, capsys, text, needle):
    """Issue 35: YAML's last value won silently, so the first was a setting the user believed in and never got."""
    path = tmp_path / "dup.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: {re.escape(needle)}"):
        load_config(path)
    with pytest.raises(ConfigError, match=r"--set train.adam_betas=\{a: 1, a: 2\}: key 'a' is given twice"):
        load_config(None, ["train.adam_betas={a: 1, a: 2}"])
    assert load_config(None, ["train.adam_betas=[0.9, 0.9]"]).train.adam_betas == (0.9, 0.9)  # values may repeat


def test_a_deeply_nested_config_or_set_value_is_one_line(tmp_path, capsys):
    """Issue 35: nesting deeper than Python's stack gave a RecursionError traceback (a config file, a --set value)."""
    path = tmp_path / "deep.yaml"
    path.write_text("train:\n  lr: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: not valid YAML \(nested too deeply"):
        load_config(path)
    with pytest.raises(ConfigError, match=r"^--set train\.lr=\[\[\[.*: nested too deeply"):
        load_config(None, ["train.lr=" + "[" * 5000 + "]" * 5000])
    out = tmp_path / "tok"
    code, _, err = run_main(capsys, "tokenize", "train", ROOT / "README.md", "--out", out, "--config", path)
    assert_one_line_error(code, err, "deep.yaml: not valid YAML (nested too deeply")
    assert not out.exists()


def test_unbounded_values_are_cut_in_messages():
    nested: list = ["lol"] * 9
    for _ in range(8):  # 9**9 leaves if printed in full
        nested = [nested] * 9
    from xlnetcli.config import config_from_dict

    t0 = time.perf_counter()
    with pytest.raises(ConfigError) as e:
        config_from_dict({"train": {"seed": nested}})
    assert time.perf_counter() - t0 < 1.0 and len(str(e.value)) < 200
    with pytest.raises(ConfigError) as e:
        load_config(None, ["train.lr=" + "x" * 100_000])
    assert len(str(e.value)) < 300


# ---- --set keys a command does not read --------------------------------------------------------------------------


def test_override_of_an_unused_section_is_refused_with_a_hint():
    with pytest.raises(ConfigError) as e:
        check_override_sections(["finetune.lr=1e-5", "train.lr=1e-3"], "finetune")
    assert str(e.value) == (
        "--set train.lr=1e-3: xlnet finetune reads finetune.*; train.lr is not used; did you mean finetune.lr?"
    )
    with pytest.raises(ConfigError, match=r"xlnet shard reads data\.\*; model\.d_model is not used$"):
        check_override_sections(["model.d_model=64"], "shard")
    with pytest.raises(ConfigError, match=r"tokenize train reads tokenizer\.\*; train\.lr is not used$"):
        check_override_sections(["train.lr=1"], "tokenize train")
    with pytest.raises(ConfigError, match=r"train\.seed is not used; did you mean tokenizer\.seed\?$"):
        check_override_sections(["train.seed=1"], "tokenize train")
    check_override_sections(["model.d_model=64", "train.lr=1", "data.seed=1", "tokenizer.threads=1"], "pretrain")
    assert set(COMMAND_SECTIONS["config show"]) == set(SECTIONS)


def test_check_config_adds_what_each_stage_needs():
    """One function holds the cross-key checks: a config valid for one process may not be for a stage's world."""
    cfg = load_config(
        "tiny",
        [
            "train.global_batch_size=16",
            "train.micro_batch_size=8",
            "finetune.batch_size=16",
            "finetune.micro_batch_size=8",
        ],
    )
    assert check_config(cfg, 2, stage="pretrain") is None  # it only checks; the batch maths is batch_maths's
    assert batch_maths(cfg, 2).accumulation == 1
    with pytest.raises(ConfigError, match=r"train.global_batch_size=16 must be a multiple of .* x 3 process"):
        check_config(cfg, 3, stage="pretrain")
    with pytest.raises(ConfigError, match=r"finetune.micro_batch_size \(8\) x processes \(3\)$"):
        check_config(cfg, 3, stage="finetune")
    check_config(cfg, 3, stage="preprocess")  # records are laid out for any number of processes
    no_reuse = load_config(
        "tiny", ["model.reuse_len=0", "data.perm_size=64", "finetune.batch_size=8", "finetune.micro_batch_size=2"]
    )
    check_config(no_reuse, 4, stage="finetune")  # fine to finetune from (an HF import has no reuse_len)
    with pytest.raises(ConfigError, match=r"model\.reuse_len must be >= 1 for pretraining records"):
        check_config(no_reuse, stage="preprocess")
    with pytest.raises(ConfigError, match=r"data.mask_alpha \(1\) must be >= data.mask_beta \(2\)"):
        check_config(load_config("tiny", ["data.mask_alpha=1", "data.mask_beta=2"]), stage="pretrain")


def test_a_setting_option_is_blamed_as_the_user_wrote_it():
    with pytest.raises(ConfigError) as e:
        load_config("tiny", ["tokenizer.threads=2"], [("--threads -1", "tokenizer.threads", -1)])
    assert str(e.value) == "--threads -1: tokenizer.threads must be in [0, 1024], got -1"
    cfg = load_config("tiny", ["tokenizer.vocab_size=900"], [("--vocab-size 500", "tokenizer.vocab_size", 500)])
    assert cfg.tokenizer.vocab_size == cfg.model.vocab_size == 500  # after --set; the model follows the tokenizer
