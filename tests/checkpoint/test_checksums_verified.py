"""Issue 22, class 2: every checksum meta.json records is verified whenever a checkpoint is loaded (eval, export,
finetune/probe/pretrain --init, the Python API, resume): an edited config.yaml, a swapped spiece.model or a damaged
train state is refused in one line naming the file; a step folder without meta.json or its checksums is refused with
the way out; an HF directory is still read as such."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from clitools import TRAIN_TSV, VALID_TSV, assert_one_line_error, run_main
from conftest import tree_digest
from finetunetools import MODEL_SETS, random_init_checkpoint

from xlnetcli import api
from xlnetcli.checkpoint.folders import save_model_dir, verify_checkpoint
from xlnetcli.checkpoint.load import load_model_dir, load_starting_point
from xlnetcli.config import load_config
from xlnetcli.core.errors import CheckpointError
from xlnetcli.model import XLNetLMHeadModel
from xlnetcli.train.checkpointer import TRAIN_STATE, load_train_state, save_tree

# records the checkpoint's tokenizer can read (for eval and pretrain --init): small batches of 64-token rows
RECORD_SETS = [*MODEL_SETS, "model.reuse_len=32", "train.global_batch_size=4", "train.micro_batch_size=2"]


@pytest.fixture(scope="module")
def pristine(builds, tmp_path_factory) -> Path:
    """A random-init step folder (tokenizer, config, weights) with a train state, all listed in meta.json."""
    root = tmp_path_factory.mktemp("checksums")
    cfg = load_config(None, MODEL_SETS)
    torch.manual_seed(0)
    state = {"step": 3, "ranks": [{"rng": torch.arange(4)}]}
    save_model_dir(
        root / "init",
        XLNetLMHeadModel(cfg.model),
        cfg,
        builds.tokenizer(cfg.tokenizer),
        meta={"kind": "pretrain", "step": 3},
        extra_files={TRAIN_STATE: lambda p: save_tree(state, p)},
    )
    return root / "init"


@pytest.fixture
def ckpt(pristine, tmp_path) -> Path:
    """A copy of the pristine step folder, free to damage."""
    shutil.copytree(pristine, tmp_path / "ckpt")
    return tmp_path / "ckpt"


def _edit_config(ckpt: Path) -> None:
    text = (ckpt / "config.yaml").read_text()
    assert "ff_activation: gelu" in text
    (ckpt / "config.yaml").write_text(text.replace("ff_activation: gelu", "ff_activation: relu"))


def _swap_spiece(ckpt: Path) -> None:
    data = bytearray((ckpt / "tokenizer" / "spiece.model").read_bytes())
    data[len(data) // 2] ^= 1
    (ckpt / "tokenizer" / "spiece.model").write_bytes(bytes(data))


def test_intact_folder_loads_and_every_file_is_listed(pristine):
    meta = verify_checkpoint(pristine)
    assert set(meta["sha256"]) >= {"config.yaml", "model.safetensors", TRAIN_STATE, "tokenizer/spiece.model"}
    load_model_dir(pristine)
    assert load_train_state(pristine)["step"] == 3


@pytest.mark.parametrize(
    ("damage", "needle"),
    [(_edit_config, "config.yaml"), (_swap_spiece, "tokenizer/spiece.model")],
    ids=["config-edited", "spiece-swapped"],
)
def test_an_edited_file_is_refused_by_every_loader(ckpt, damage, needle):
    damage(ckpt)
    for load in (load_model_dir, load_starting_point, api.load, load_train_state):
        with pytest.raises(CheckpointError, match=f"{needle} does not match the checksum"):
            load(ckpt)


def test_an_edited_train_state_is_refused_on_resume(ckpt):
    data = bytearray((ckpt / TRAIN_STATE).read_bytes())
    data[-3] ^= 1
    (ckpt / TRAIN_STATE).write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"train_state\.safetensors does not match the checksum"):
        load_train_state(ckpt)
    with pytest.raises(CheckpointError, match=r"train_state\.safetensors does not match the checksum"):
        load_model_dir(ckpt)  # the checkpointer's resume loads through it first


@pytest.mark.parametrize(
    "command",
    [
        lambda c, o: ["export", c, "--out", o / "hf"],
        lambda c, o: ["eval", c, "--data", o.parent / "records"],
        lambda c, o: ["probe", c, "--train", TRAIN_TSV, "--valid", VALID_TSV, "--output", o / "p.json"],
        lambda c, o: ["finetune", "--task", "classification", "--init", c, "--train", TRAIN_TSV, "--out", o / "ft"],
        lambda c, o: ["pretrain", "--init", c, "--data", o.parent / "records", "--out", o / "pre"],
    ],
    ids=["export", "eval", "probe-init", "finetune-init", "pretrain-init"],
)
def test_cli_refuses_an_edited_config_in_one_line_with_nothing_written(builds, ckpt, tmp_path, capsys, command):
    (tmp_path / "records").symlink_to(builds.pipeline(RECORD_SETS, config=None).records)
    _edit_config(ckpt)
    before = tree_digest(ckpt)
    out = tmp_path / "outs"
    out.mkdir()
    code, _, err = run_main(capsys, *command(ckpt, out))
    assert_one_line_error(code, err, "config.yaml does not match the checksum")
    assert tree_digest(ckpt) == before and not any(out.iterdir())


def test_a_missing_meta_json_is_refused_with_the_way_out(ckpt, capsys):
    (ckpt / "meta.json").unlink()
    with pytest.raises(CheckpointError, match=r"no meta\.json.*another step folder.*Hugging Face directory"):
        load_model_dir(ckpt)
    code, _, err = run_main(capsys, "export", ckpt, "--out", ckpt.parent / "hf")
    assert_one_line_error(code, err, "no meta.json")
    assert not (ckpt.parent / "hf").exists()


@pytest.mark.parametrize(
    ("sha256", "needle"),
    [
        (None, "lists no checksums"),
        ({}, "lists no checksums"),
        ([], "lists no checksums"),
        ("abc", "'sha256' must be an object"),
        ({"config.yaml": 5}, "entry 'config.yaml' must be a string"),
        ({"../config.yaml": "0" * 64}, "outside the folder"),
        ({"/etc/passwd": "0" * 64}, "outside the folder"),
        ({"gone.bin": "0" * 64}, "listed in meta.json but missing"),
        ({"tokenizer": "0" * 64}, "not a regular file"),
    ],
    ids=["absent", "empty", "empty-list", "string", "int-digest", "dotdot", "absolute", "missing-file", "a-folder"],
)
def test_a_meta_json_that_lost_its_checksums_is_refused(ckpt, sha256, needle):
    meta = json.loads((ckpt / "meta.json").read_text())
    if sha256 is None:
        del meta["sha256"]
    elif isinstance(sha256, dict) and sha256:
        meta["sha256"].update(sha256)
    else:
        meta["sha256"] = sha256
    (ckpt / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=needle):
        load_model_dir(ckpt)


@pytest.mark.parametrize("content", ["[]", "not json", '{"sha256": {"config.yaml": "x"}, "step": NaN}', "\xff"])
def test_a_meta_json_that_is_not_an_object_is_refused(ckpt, content):
    (ckpt / "meta.json").write_text(content, encoding="latin-1")
    with pytest.raises(CheckpointError, match=r"meta\.json"):
        load_model_dir(ckpt)


def test_a_symlink_out_of_the_folder_is_refused(ckpt, tmp_path):
    outside = tmp_path / "outside.yaml"
    shutil.move(ckpt / "config.yaml", outside)
    (ckpt / "config.yaml").symlink_to(outside)
    with pytest.raises(CheckpointError, match="not a regular file"):
        load_model_dir(ckpt)


def test_a_hugging_face_directory_needs_no_meta_json(builds, tmp_path, capsys):
    root = random_init_checkpoint(builds, tmp_path)
    code, _, err = run_main(capsys, "export", root / "init", "--out", tmp_path / "hf")
    assert code == 0, err
    assert not (tmp_path / "hf" / "meta.json").exists()
    cfg, state, _ = load_model_dir(tmp_path / "hf")
    assert cfg.model.d_model == 64 and state
