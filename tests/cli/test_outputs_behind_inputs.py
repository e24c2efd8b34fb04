"""Issue #35, class 1: outputs against everything behind the inputs.

Records read their tokens from the shard folder their meta.json names, and a records part from the one its part.json
names. A command's outputs are checked against those folders too (core.files.inputs_behind), not only against the
paths on its command line: `eval --data RECORDS --output SHARDS/manifest.json`, `preprocess-merge PARTS --out SHARDS
--overwrite` and `pretrain --data RECORDS --out SHARDS/run` are refused with one line naming the shards and the
records that read them; nothing is written, every input stays byte-identical.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from clitools import FAST_PRETRAIN, TINY, assert_one_line_error, run_main
from conftest import tree_digest

from xlnetcli.checkpoint.folders import save_model_dir
from xlnetcli.config import load_config
from xlnetcli.data.records.preprocess import preprocess
from xlnetcli.model import XLNetLMHeadModel


@pytest.fixture(scope="module")
def world(builds, tmp_path_factory) -> dict[str, Path]:
    """shards/ (a copy of the shared build), rec/ (records of them), p0/ p1/ (the two parts of the same records),
    init/ (a random-init checkpoint of the records' architecture)."""
    root = tmp_path_factory.mktemp("behind")
    pipe = builds.pipeline(FAST_PRETRAIN)
    shutil.copytree(pipe.shards, root / "shards")
    cfg = load_config(TINY, FAST_PRETRAIN)
    preprocess(cfg, root / "shards", root / "rec", quiet=True)
    for i in range(2):
        preprocess(cfg, root / "shards", root / f"p{i}", quiet=True, part=(i, 2))
    save_model_dir(root / "init", XLNetLMHeadModel(cfg.model), cfg, pipe.tokenizer, meta={"kind": "pretrain"})
    (root / "out").mkdir()
    return {k: root / k for k in ("shards", "rec", "p0", "p1", "init", "out")} | {"root": root}


@pytest.fixture(autouse=True)
def _no_progress(monkeypatch):
    monkeypatch.setenv("XLNET_NO_PROGRESS", "1")


def _cases(w: dict) -> dict[str, list]:
    shards, rec, init = w["shards"], w["rec"], w["init"]
    merge = ["preprocess-merge", w["p0"], w["p1"]]
    return {
        "eval-output-shards-manifest": ["eval", init, "--data", rec, "--output", shards / "manifest.json"],
        "eval-output-shard-file": ["eval", init, "--data", rec, "--output", shards / "train" / "x.json"],
        "merge-out-is-shards": [*merge, "--out", shards, "--overwrite"],
        "merge-out-inside-shards": [*merge, "--out", shards / "records"],
        "pretrain-out-inside-shards": ["pretrain", "--data", rec, "--out", shards / "run"],
        "pretrain-out-is-shards": ["pretrain", "--data", rec, "--out", shards],
    }


@pytest.mark.parametrize(
    "name",
    [
        "eval-output-shards-manifest",
        "eval-output-shard-file",
        "merge-out-is-shards",
        "merge-out-inside-shards",
        "pretrain-out-inside-shards",
        "pretrain-out-is-shards",
    ],
)
def test_an_output_over_the_shards_behind_the_inputs_is_refused(world, name, capsys):
    before = tree_digest(world["root"])
    code, _, err = run_main(capsys, *_cases(world)[name])
    assert_one_line_error(code, err, f"the shards {world['shards']}", "read by the input", "choose an output")
    assert tree_digest(world["root"]) == before  # nothing written, nothing removed


def test_a_hard_link_to_the_shards_manifest_is_refused(world, capsys):
    link = world["out"] / "m.json"
    os.link(world["shards"] / "manifest.json", link)
    try:
        before = tree_digest(world["root"])
        code, _, err = run_main(capsys, "eval", world["init"], "--data", world["rec"], "--output", link)
        assert_one_line_error(code, err, "is a hard link to a file of the shards", str(world["rec"]))
        assert tree_digest(world["root"]) == before
    finally:
        link.unlink()


def test_what_stands_behind_records_and_parts(world, tmp_path):
    from xlnetcli.core.files import inputs_behind

    shards = os.path.realpath(world["shards"])
    for d in ("rec", "p0"):
        assert [os.path.realpath(p) for p, _ in inputs_behind(world[d])] == [shards]
    assert inputs_behind(world["shards"]) == []  # shards read nothing through their manifest
    assert inputs_behind(world["init"]) == []
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "meta.json").write_text("[[[")  # unreadable: its reader refuses it, the output check adds nothing
    assert inputs_behind(bad) == [] and inputs_behind(tmp_path / "absent") == []


def test_an_output_beside_the_shards_is_written(world, capsys):
    """The check is no broader than what the inputs read: a results file next to the shards folder is fine."""
    out = world["out"] / "plm.json"
    code, _, err = run_main(capsys, "eval", world["init"], "--data", world["rec"], "--output", out, "--batches", "1")
    assert code == 0, err
    assert '"loss"' in out.read_text()
    out.unlink()
