"""Issue #35: the tokenizer copies are checked. Records (and each records part) carry a copy of the shards'
tokenizer, which pretraining puts into every checkpoint; `pretrain` and `preprocess-merge` compare it (sha256 of
spiece.model) with the shards' and with the tokenizer_sha256 their meta.json / part.json recorded, and refuse a
swapped one in one line naming both files, before anything is written (`preprocess` already compares the shards'
tokenizer with their manifest). Every input stays byte-identical."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from clitools import CORPUS, FAST_PRETRAIN, TINY, assert_one_line_error, run_main, set_args
from conftest import tree_digest

from xlnetcli.config import load_config
from xlnetcli.core.errors import DataError
from xlnetcli.data.records.format import read_meta
from xlnetcli.data.records.preprocess import preprocess

SPM = Path("tokenizer") / "spiece.model"


@pytest.fixture(scope="module")
def world(builds, tmp_path_factory) -> dict[str, Path]:
    """shards/ (a copy of the shared build), rec/ (records of them), p0/ p1/ (their two parts), other/ (a tokenizer of
    the same size trained on another text: same vocab_size, other pieces)."""
    root = tmp_path_factory.mktemp("tokcopies")
    pipe = builds.pipeline(FAST_PRETRAIN)
    shutil.copytree(pipe.shards, root / "shards")
    cfg = load_config(TINY, FAST_PRETRAIN)
    preprocess(cfg, root / "shards", root / "rec", quiet=True)
    for i in range(2):
        preprocess(cfg, root / "shards", root / f"p{i}", quiet=True, part=(i, 2))
    other = builds.tokenizer(cfg.tokenizer, CORPUS)
    assert (other / "spiece.model").read_bytes() != (pipe.tokenizer / "spiece.model").read_bytes()
    return {"root": root, "shards": root / "shards", "rec": root / "rec", "other": other} | {
        f"p{i}": root / f"p{i}" for i in range(2)
    }


@pytest.fixture(autouse=True)
def _no_progress(monkeypatch):
    monkeypatch.setenv("XLNET_NO_PROGRESS", "1")


def _copy(world: dict, tmp_path: Path, *names: str) -> dict[str, Path]:
    """Copies of some folders side by side (records find their shards by the relative path first)."""
    return {n: Path(shutil.copytree(world[n], tmp_path / n)) for n in names}


def _swap_tokenizer(folder: Path, other: Path) -> None:
    shutil.rmtree(folder / "tokenizer")
    shutil.copytree(other, folder / "tokenizer")


def _pretrain(capsys, tmp_path: Path, rec: Path) -> tuple[int, str]:
    args = [
        "pretrain",
        "--data",
        rec,
        "--out",
        tmp_path / "run",
        *set_args(["train.max_steps=1", "train.warmup_steps=0"]),
    ]
    code, _, err = run_main(capsys, *args)
    return code, err


def test_pretrain_refuses_records_whose_tokenizer_copy_was_swapped(world, tmp_path, capsys):
    c = _copy(world, tmp_path, "shards", "rec")
    _swap_tokenizer(c["rec"], world["other"])
    before = tree_digest(tmp_path)
    code, err = _pretrain(capsys, tmp_path, c["rec"])
    assert_one_line_error(code, err, str(c["rec"] / SPM), str(c["shards"] / SPM), "copy was replaced")
    assert tree_digest(tmp_path) == before  # no run folder, inputs as they were


def test_pretrain_refuses_records_whose_shards_tokenizer_was_swapped(world, tmp_path, capsys):
    c = _copy(world, tmp_path, "shards", "rec")
    _swap_tokenizer(c["shards"], world["other"])
    before = tree_digest(tmp_path)
    code, err = _pretrain(capsys, tmp_path, c["rec"])
    assert_one_line_error(code, err, str(c["shards"] / SPM), str(c["rec"] / SPM), "xlnet shard")
    assert tree_digest(tmp_path) == before


def test_pretrain_starts_on_records_whose_copy_is_the_shards(world, tmp_path, capsys):
    c = _copy(world, tmp_path, "shards", "rec")
    code, err = _pretrain(capsys, tmp_path, c["rec"])
    assert code == 0, err
    assert (tmp_path / "run" / "step_0000001" / SPM).read_bytes() == (c["shards"] / SPM).read_bytes()


def test_merge_refuses_a_part_whose_tokenizer_copy_was_swapped(world, tmp_path, capsys):
    c = _copy(world, tmp_path, "shards", "p0", "p1")
    _swap_tokenizer(c["p1"], world["other"])
    before = tree_digest(tmp_path)
    code, _, err = run_main(capsys, "preprocess-merge", c["p0"], c["p1"], "--out", tmp_path / "merged")
    assert_one_line_error(code, err, str(c["p1"] / SPM), str(c["shards"] / SPM), "rerun that part")
    assert tree_digest(tmp_path) == before


def test_merge_refuses_swapped_copies_even_without_the_shards(world, tmp_path, capsys):
    """Parts merged where their shards are not: each copy is compared with part.json's tokenizer_sha256."""
    c = _copy(world, tmp_path, "p0", "p1")
    for part in c.values():  # the shards moved away (where the parts look is not a setting the parts must share)
        m = json.loads((part / "part.json").read_text())
        m["plan"]["meta"]["shards"].update(path="../gone", absolute=str(tmp_path / "gone"))
        (part / "part.json").write_text(json.dumps(m))
    _swap_tokenizer(c["p0"], world["other"])
    before = tree_digest(tmp_path)
    code, _, err = run_main(capsys, "preprocess-merge", c["p0"], c["p1"], "--out", tmp_path / "merged")
    assert_one_line_error(code, err, str(c["p0"] / SPM), str(c["p0"] / "part.json"))
    assert tree_digest(tmp_path) == before


def test_preprocess_refuses_shards_whose_tokenizer_was_swapped(world, tmp_path, capsys):
    """Already so before #35 (check_shards compares the shards' tokenizer with their manifest); kept as a guard."""
    c = _copy(world, tmp_path, "shards")
    _swap_tokenizer(c["shards"], world["other"])
    before = tree_digest(tmp_path)
    args = [
        "preprocess",
        "--shards",
        c["shards"],
        "--out",
        tmp_path / "rec",
        "--config",
        TINY,
        *set_args(FAST_PRETRAIN),
    ]
    code, _, err = run_main(capsys, *args)
    assert_one_line_error(code, err, str(c["shards"]), "another tokenizer")
    assert tree_digest(tmp_path) == before


def test_a_missing_copy_is_named_with_its_source(world, tmp_path):
    from xlnetcli.data.records.format import check_tokenizer_copy

    c = _copy(world, tmp_path, "shards", "rec")
    (c["rec"] / SPM).unlink()
    meta = read_meta(c["rec"])
    with pytest.raises(DataError, match=rf"{c['rec'] / SPM} is missing: .*\(a copy of {c['shards'] / SPM}"):
        check_tokenizer_copy(c["rec"], meta["tokenizer_sha256"], c["rec"] / "meta.json", c["shards"])
