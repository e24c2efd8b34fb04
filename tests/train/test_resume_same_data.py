"""Issue #22, class 10: a pretraining run resumes only against the records it was trained on.

Every step folder's meta.json records the records folder and the sha256 of its meta.json (which lists every records
file's sha256 and how they were made); data.seed is in the run's config, compared on resume. A resume pointed at other
records is refused in one line naming both and the fix, the run untouched; the same records moved elsewhere are fine.
"""

from __future__ import annotations

import json
import shutil

import pytest
from clitools import FAST_PRETRAIN, TINY, assert_one_line_error, run_main, train_losses, write_config
from conftest import tree_digest

from xlnetcli.config import load_config
from xlnetcli.core.files import sha256_file
from xlnetcli.train.pretrain import pretrain

pytestmark = pytest.mark.slow  # trains a few steps and preprocesses a second records folder


def test_resume_against_other_records_is_refused_and_the_same_records_moved_are_not(
    builds, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("XLNET_NO_PROGRESS", "1")
    pipe = builds.pipeline(FAST_PRETRAIN)
    rec = pipe.records
    other = builds.records(pipe.shards, load_config(TINY, FAST_PRETRAIN), passes=2)  # same shards, other records
    cfg = write_config(
        tmp_path / "cfg.yaml", [*FAST_PRETRAIN, "train.max_steps=4", "train.save_every=2", "train.eval_every=never"]
    )
    pretrain(load_config(cfg), rec, tmp_path / "a", quiet=True)
    run = tmp_path / "run"
    pretrain(load_config(cfg), rec, run, quiet=True, stop_after=2)
    meta = json.loads((run / "step_0000002" / "meta.json").read_text())
    assert meta["records"] == {"path": str(rec.resolve()), "sha256": sha256_file(rec / "meta.json")}

    before = tree_digest(run)
    code, _, err = run_main(capsys, "pretrain", "--data", other, "--out", run, "--resume", "--quiet")
    assert_one_line_error(code, err, f"trained on the records {rec.resolve()}", f"--data {other}", "other records")
    assert f"resume with --data {rec.resolve()}" in err
    assert tree_digest(run) == before

    moved = tmp_path / "moved"
    shutil.copytree(rec, moved)
    code, _, err = run_main(capsys, "pretrain", "--data", moved, "--out", run, "--resume", "--quiet")
    assert code == 0, err
    assert train_losses(run) == train_losses(tmp_path / "a")
