"""Issue #35, advice: a part folder of a `--part I/N` run given where the merged folder is expected (`preprocess
--shards SHARD_PART`, `pretrain --data RECORDS_PART`) is named as a part, with the merge that makes the whole
(`xlnet shard-merge` / `xlnet preprocess-merge`), not "not a shard directory, create one with `xlnet shard`"."""

from __future__ import annotations

from pathlib import Path

import pytest
from clitools import FAST_PRETRAIN, SAMPLE, TINY, assert_one_line_error, run_main, set_args
from conftest import tree_digest

from xlnetcli.cli import main


@pytest.fixture(scope="module")
def parts(builds, tmp_path_factory) -> dict[str, Path]:
    """shard_part/ (part 0/1 of `xlnet shard`), rec_part/ (part 1/2 of `xlnet preprocess` of the shared shards)."""
    root = tmp_path_factory.mktemp("part_hints")
    pipe = builds.pipeline(FAST_PRETRAIN)
    cfg = ["--config", TINY, *set_args(FAST_PRETRAIN)]
    for args in (
        ["shard", SAMPLE, "--tokenizer", pipe.tokenizer, "--out", root / "shard_part", "--part", "0/1"],
        ["preprocess", "--shards", pipe.shards, "--out", root / "rec_part", "--part", "1/2", *cfg],
    ):
        with pytest.raises(SystemExit) as e:
            main([str(a) for a in args])
        assert not e.value.code
    return {"root": root, "shard_part": root / "shard_part", "rec_part": root / "rec_part", "cfg": cfg}


@pytest.fixture(autouse=True)
def _no_progress(monkeypatch):
    monkeypatch.setenv("XLNET_NO_PROGRESS", "1")


def test_a_shard_part_where_shards_are_expected_names_shard_merge(parts, capsys):
    before = tree_digest(parts["root"])
    args = ["preprocess", "--shards", parts["shard_part"], "--out", parts["root"] / "rec", *parts["cfg"]]
    code, _, err = run_main(capsys, *args)
    assert_one_line_error(
        code, err, f"{parts['shard_part']} is part 0/1 of an `xlnet shard --part I/N` run", "xlnet shard-merge PARTS"
    )
    assert tree_digest(parts["root"]) == before


def test_a_records_part_where_records_are_expected_names_preprocess_merge(parts, capsys):
    before = tree_digest(parts["root"])
    code, _, err = run_main(capsys, "pretrain", "--data", parts["rec_part"], "--out", parts["root"] / "run")
    assert_one_line_error(
        code,
        err,
        f"{parts['rec_part']} is part 1/2 of an `xlnet preprocess --part I/N` run",
        "all 2 parts",
        "xlnet preprocess-merge PARTS",
    )
    assert tree_digest(parts["root"]) == before


def test_a_folder_that_is_no_part_keeps_the_readers_message(parts, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "part.json").write_text('{"kind": "something else"}')
    code, _, err = run_main(capsys, "pretrain", "--data", tmp_path / "empty", "--out", tmp_path / "run")
    assert_one_line_error(code, err, "is not a records directory (no meta.json)")
    # a records part where shards are expected is not sent to shard-merge either
    args = ["preprocess", "--shards", parts["rec_part"], "--out", tmp_path / "rec", *parts["cfg"]]
    code, _, err = run_main(capsys, *args)
    assert_one_line_error(code, err, "no manifest.json")
    assert "merge" not in err
