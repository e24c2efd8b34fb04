"""Presets ship in the package and are accepted by name from any folder; `xlnet config show`; outputs honour the
umask like any other tool's."""

from __future__ import annotations

import fnmatch
import importlib.resources
import os
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml
from clitools import ROOT, SAMPLE, assert_one_line_error, run_main, set_args

from xlnetcli.config import CONFIG_VERSION, PRESETS, Config, config_to_dict, load_config


def test_presets_are_package_data():
    """Every preset is a resource of the installed package and pyproject ships it in wheels and sdists."""
    root = importlib.resources.files("xlnetcli") / "config" / "presets"
    for rel in PRESETS.values():
        res = root.joinpath(*rel.split("/"))
        assert res.is_file(), rel
        assert yaml.safe_load(res.read_text(encoding="utf-8"))["model"]
    tomllib = pytest.importorskip("tomllib")
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["xlnetcli"]
    for rel in PRESETS.values():
        assert any(fnmatch.fnmatch(f"config/presets/{rel}", pat) for pat in patterns), (
            f"config/presets/{rel} is not package data"
        )


@pytest.mark.slow
def test_wheel_ships_the_presets_and_runs_them_without_a_checkout(tmp_path):
    """Build a wheel from the sources alone, install it into a fresh folder, and run the presets from an empty
    folder: what a `pip install` without a clone gets."""
    pytest.importorskip("setuptools")
    src = tmp_path / "src"
    for name in ("pyproject.toml", "README.md"):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes((ROOT / name).read_bytes())
    shutil.copytree(ROOT / "src" / "xlnetcli", src / "src" / "xlnetcli", ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            str(src),
            "-w",
            str(tmp_path / "dist"),
        ],
        check=True,
        env=env,
        capture_output=True,
    )
    wheel = next((tmp_path / "dist").glob("xlnetcli-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"xlnetcli/config/presets/{rel}" for rel in PRESETS.values()} <= names
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
        check=True,
        env=env,
        capture_output=True,
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    run_env = {**env, "PYTHONPATH": str(site)}
    where = subprocess.run(
        [sys.executable, "-c", "import xlnetcli; print(xlnetcli.__file__)"],
        cwd=empty,
        env=run_env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert where.startswith(str(site)), where  # the installed copy, not the checkout
    for name in PRESETS:
        out = subprocess.run(
            [sys.executable, "-m", "xlnetcli", "config", "show", name],
            cwd=empty,
            env=run_env,
            capture_output=True,
            text=True,
        )
        assert out.returncode == 0, out.stderr
        assert yaml.safe_load(out.stdout) == _as_written(load_config(name))
    # without a checkout there is no bundled corpus: tokenize train without inputs says what to pass, in one line
    out = subprocess.run(
        [sys.executable, "-m", "xlnetcli", "tokenize", "train", "--out", "tok", "--config", "tiny"],
        cwd=empty,
        env=run_env,
        capture_output=True,
        text=True,
    )
    assert_one_line_error(out.returncode, out.stderr, "no input files given", "source checkout")
    assert list(empty.iterdir()) == []


def _as_written(cfg: Config) -> dict:
    """A config as the tool writes it (config.yaml, `xlnet config show`): config_version, then the sections."""
    return {"config_version": CONFIG_VERSION, **config_to_dict(cfg)}


def test_config_by_name_from_an_empty_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_main(
        capsys, "tokenize", "train", SAMPLE, "--out", "tok", "--config", "tiny", "--vocab-size", "1000", "--quiet"
    )
    assert code == 0, err
    saved = yaml.safe_load((tmp_path / "tok" / "config.yaml").read_text())
    want = config_to_dict(load_config("tiny", ["tokenizer.vocab_size=1000"]))
    assert saved.pop("config_version") == CONFIG_VERSION  # every config the tool writes says its version
    assert saved == want  # the tiny preset (character_coverage 0.9999, ...), with the vocabulary asked for
    assert saved["tokenizer"]["character_coverage"] == 0.9999
    # a path still works, and wins over a name only when it is a real file
    (tmp_path / "tiny").mkdir()
    code, out, err = run_main(capsys, "config", "show", "tiny")
    assert code == 0 and yaml.safe_load(out) == _as_written(load_config("tiny"))
    (tmp_path / "mine.yaml").write_text("train:\n  lr: 3.0e-4\n")
    code, out, _ = run_main(capsys, "config", "show", "mine.yaml")
    assert code == 0 and yaml.safe_load(out)["train"]["lr"] == 3e-4


def test_config_show(capsys):
    code, out, err = run_main(capsys, "config", "show", "tiny")
    assert code == 0 and err == ""
    assert yaml.safe_load(out) == _as_written(load_config("tiny"))
    code, out, _ = run_main(capsys, "config", "show")
    assert code == 0 and yaml.safe_load(out) == _as_written(load_config(None))
    code, out, _ = run_main(
        capsys, "config", "show", "glue", "--set", "finetune.lr=5e-5", "--set", "tokenizer.vocab_size=1000"
    )
    shown = yaml.safe_load(out)
    assert code == 0 and shown["finetune"]["lr"] == 5e-5 and shown["model"]["vocab_size"] == 1000
    assert load_config(None, []) != load_config("glue")
    code, _, err = run_main(capsys, "config", "show", "tinyy")
    assert_one_line_error(code, err, "tinyy", *PRESETS)
    code, _, err = run_main(capsys, "config", "show", "tiny", "--set", "train.lr=-1")
    assert_one_line_error(code, err, "--set train.lr=-1", "train.lr must be a finite number > 0")


def test_set_of_a_section_finetune_does_not_read_is_refused(tmp_path, capsys):
    code, _, err = run_main(
        capsys,
        "finetune",
        "--task",
        "classification",
        "--train",
        tmp_path / "t.tsv",
        "--init",
        tmp_path / "nothing",
        "--out",
        tmp_path / "out",
        "--set",
        "train.lr=1e-3",
    )
    assert_one_line_error(
        code, err, "xlnet finetune reads finetune.*", "train.lr is not used", "did you mean finetune.lr?"
    )
    assert not (tmp_path / "out").exists()


# ---- file modes ---------------------------------------------------------------------------------------------------

TWO_STEP_RUN = [
    "--set",
    "model.vocab_size=1000",
    "--set",
    "model.d_model=32",
    "--set",
    "model.n_layer=1",
    "--set",
    "model.n_head=2",
    "--set",
    "model.d_head=16",
    "--set",
    "model.d_inner=64",
    "--set",
    "model.mem_len=16",
    "--set",
    "model.reuse_len=16",
    "--set",
    "data.seq_len=32",
    "--set",
    "data.num_predict=5",
    "--set",
    "train.global_batch_size=4",
    "--set",
    "train.micro_batch_size=2",
    "--set",
    "train.max_steps=2",
    "--set",
    "train.warmup_steps=1",
    "--set",
    "train.eval_every=never",
    "--set",
    "train.save_every=1",
    "--set",
    "train.precision=fp32",
]


def _modes(root: Path) -> tuple[set[int], set[int]]:
    files, dirs = set(), set()
    for p in [root, *root.rglob("*")]:
        (dirs if p.is_dir() else files).add(stat.S_IMODE(p.stat().st_mode))
    return files, dirs


@pytest.mark.slow
@pytest.mark.parametrize("mask, file_mode, dir_mode", [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700)])
def test_outputs_honour_the_umask(tmp_path, capsys, mask, file_mode, dir_mode):
    """tokenize, shard, preprocess and pretrain outputs (written through temp files and folders, then renamed) get
    the modes of an ordinary open()/mkdir under the umask, not tempfile's private 0600/0700."""
    old = os.umask(mask)
    try:
        w = tmp_path
        steps = [
            ["tokenize", "train", SAMPLE, "--out", w / "tok", "--vocab-size", "1000", "--quiet"],
            ["shard", SAMPLE, "--tokenizer", w / "tok", "--out", w / "shards", "--quiet", "--valid-fraction", "0.05"],
            ["preprocess", "--shards", w / "shards", "--out", w / "records", "--config", "tiny", *TWO_STEP_RUN],
            ["pretrain", "--data", w / "records", "--out", w / "run", "--quiet"],
        ]
        for args in steps if mask == 0o022 else steps[:2]:
            code, _, err = run_main(capsys, *args)
            assert code == 0, err
    finally:
        os.umask(old)
    outputs = ["tok", "shards", "records", "run"] if mask == 0o022 else ["tok", "shards"]
    for name in outputs:
        files, dirs = _modes(w / name)
        assert files == {file_mode}, (name, sorted(oct(m) for m in files))
        assert dirs == {dir_mode}, (name, sorted(oct(m) for m in dirs))
    if mask == 0o022:
        assert (w / "run" / "step_0000002" / "model.safetensors").is_file()


# ---- the demo preset ----------------------------------------------------------------------------------------------

# what scripts/demo.py set on top of the tiny preset before the demo preset existed (its RECIPE and FINETUNE_SETS)
DEMO_SETS = [
    "model.n_layer=2",
    "train.max_steps=1000",
    "train.warmup_steps=100",
    "train.eval_every=250",
    "finetune.summary_type=mean",
    "finetune.lr=5.0e-4",  # the demo's figures were measured at 5e-4; tiny's finetune lr is 1e-3 since #33
]


def test_demo_preset_is_tiny_with_the_demo_recipe(capsys):
    """`--config demo` resolves to exactly what `--config tiny` with the demo's --set items gave (the README's
    figures), and its file is tiny.yaml with those keys and nothing else changed."""
    assert load_config("demo") == load_config("tiny", DEMO_SETS)
    tiny = yaml.safe_load((ROOT / "configs" / PRESETS["tiny"]).read_text())
    for item in DEMO_SETS:
        dotted, value = item.split("=")
        section, key = dotted.split(".")
        tiny[section][key] = yaml.safe_load(value)
    assert yaml.safe_load((ROOT / "configs" / PRESETS["demo"]).read_text()) == tiny
    code, demo, _ = run_main(capsys, "config", "show", "demo")
    assert code == 0
    code, recipe, _ = run_main(capsys, "config", "show", "tiny", *set_args(DEMO_SETS))
    assert code == 0 and demo == recipe


def test_make_demo_runs_the_demo_preset():
    """scripts/demo.py passes --config demo and no --set (DEMO_STEPS aside, whose rule gives the preset's own steps)."""
    import importlib.util
    import inspect

    spec = importlib.util.spec_from_file_location("demo_script", ROOT / "scripts" / "demo.py")
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    assert demo.CONFIG == "demo" and demo.demo_steps_sets(None) == [] and demo.demo_steps_sets("") == []
    sets = demo.demo_steps_sets("1000")
    assert load_config("demo", sets[1::2]) == load_config("demo")
    assert "--set" not in inspect.getsource(demo.main)


# ---- the continue presets (xlnet pretrain --init) -------------------------------------------------------------------


@pytest.mark.parametrize("size", ["tiny", "base", "large"])
def test_continue_presets_keep_the_architecture_and_data_of_their_size(size):
    """continue-SIZE loads, and only its train section differs from SIZE's: a checkpoint of SIZE (base, large: the
    released xlnet-*-cased architecture) continues with records built as for SIZE."""
    cont, plain = load_config(f"continue-{size}"), load_config(size)
    for section in ("model", "tokenizer", "data"):
        assert getattr(cont, section) == getattr(plain, section), section
    assert cont.train != plain.train and cont.train.init is None  # the checkpoint is given by --init


def test_base_and_large_are_the_released_architectures():
    """base/large (and so continue-base/-large) are xlnet-base-cased / xlnet-large-cased's config.json shapes."""
    released = {
        "base": {"d_model": 768, "n_layer": 12, "n_head": 12, "d_inner": 3072},
        "large": {"d_model": 1024, "n_layer": 24, "n_head": 16, "d_inner": 4096},
    }
    for size, shape in released.items():
        model = load_config(f"continue-{size}").model
        common = {"vocab_size": 32000, "d_head": 64, "ff_activation": "gelu", "untie_r": True}
        assert {k: getattr(model, k) for k in {**shape, **common}} == {**shape, **common}
