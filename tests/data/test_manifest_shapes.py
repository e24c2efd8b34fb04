"""Issue #35, manifests of the wrong shape: a hand-edited part.json (shard or records part), records meta.json or
xlnet_pretraining.json is refused before it is used, in one `xlnet: error:` line naming the file, the key and the
command that writes it again (exit 2), nothing written and every input byte for byte as it was.

Before: a part.json field of the wrong type was a TypeError or KeyError traceback in the merge, a float dtype in a
shard part's plan wrote shards that preprocess refuses, a records part's plan.meta of the wrong shape wrote records
that every reader refuses, a records meta.json without its checksums was read with no check at all, and a bad field
of xlnet_pretraining.json was a bare exception name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from clitools import FAST_PRETRAIN, SAMPLE, assert_one_line_error, run_main
from conftest import tree_digest

from xlnetcli.core.errors import DataError
from xlnetcli.data.records.format import open_records, read_meta


@pytest.fixture(autouse=True)
def _no_progress(monkeypatch):
    monkeypatch.setenv("XLNET_NO_PROGRESS", "1")


@pytest.fixture(scope="module")
def pipeline(builds):
    return builds.pipeline(FAST_PRETRAIN)


@pytest.fixture(scope="module")
def parts(pipeline, tmp_path_factory) -> Path:
    """A folder holding shards/ (a copy of the pipeline's), c.yaml, the shard parts sp0, sp1 of two input files and
    the records parts rp0, rp1 of shards/ (read only: tests copy it)."""
    from xlnetcli.cli import main

    root = tmp_path_factory.mktemp("manifest_shapes")
    shutil.copytree(pipeline.shards, root / "shards")
    shutil.copyfile(pipeline.records / "config.yaml", root / "c.yaml")
    text = SAMPLE.read_text(encoding="utf-8").split("\n\n")
    (root / "a.txt").write_text("\n\n".join(text[: len(text) // 2]), encoding="utf-8")
    (root / "b.txt").write_text("\n\n".join(text[len(text) // 2 :]), encoding="utf-8")
    shard = ["shard", root / "a.txt", root / "b.txt", "--tokenizer", pipeline.tokenizer, "--quiet"]
    preprocess = ["preprocess", "--shards", root / "shards", "--config", root / "c.yaml"]
    for i in range(2):
        for args in (
            [*shard, "--out", root / f"sp{i}", "--part", f"{i}/2"],
            [*preprocess, "--out", root / f"rp{i}", "--part", f"{i}/2"],
        ):
            with pytest.raises(SystemExit) as e:
                main([str(a) for a in args])
            assert not e.value.code
    return root


@pytest.fixture
def world(parts, tmp_path) -> Path:
    root = tmp_path / "w"
    shutil.copytree(parts, root)
    return root


def edit_json(path: Path, edit) -> None:
    obj = json.loads(path.read_text())
    edit(obj)
    path.write_text(json.dumps(obj))


def refused(capsys, root: Path, args: list, *needles: str) -> None:
    """``xlnet ARGS`` refused in one line holding ``needles``, nothing under ``root`` changed (no output, no temporary,
    no lock, the inputs as they were)."""
    before = tree_digest(root)
    code, _, err = run_main(capsys, *args)
    assert_one_line_error(code, err, *needles)
    assert tree_digest(root) == before


# ---- shard parts -----------------------------------------------------------------------------------------------------

SHARD_PART_EDITS = [
    ("one", lambda m: m["files"][0].update(bad_bytes=None), "files[0]: field 'bad_bytes' must be an integer"),
    ("one", lambda m: m["files"][0].update(tokens="12"), "field 'tokens' must be an integer"),
    ("one", lambda m: m["files"][0].update(documents=-1), "field 'documents' is -1, out of range"),
    ("one", lambda m: m["files"][0].update(index=0.5), "field 'index' must be an integer"),
    ("one", lambda m: m["files"][0].update(valid="no"), "field 'valid' must be true or false"),
    ("one", lambda m: m["files"][0].update(input=None), "field 'input' must be a string"),
    ("one", lambda m: m["files"][0]["files"].update(tokens=5), "entry 'tokens' must be a string"),
    ("one", lambda m: m["files"][0]["files"].pop("doctok"), "files[0].files: field 'doctok' is missing"),
    ("one", lambda m: m["files"][0].update(sha256=[]), "field 'sha256' must be an object"),
    ("one", lambda m: m["files"][0]["files"].update(sentid="../x.npy"), "must be a path inside the part folder"),
    ("one", lambda m: m.update(files={}), "field 'files' must be a list"),
    ("one", lambda m: m["files"].append(3), "files[1]: must be an object"),
    ("one", lambda m: m.update(part="0"), "field 'part' must be an integer"),
    ("both", lambda m: m["plan"].update(dtype="float32"), "field 'dtype' must be uint16"),
    ("both", lambda m: m["plan"].update(dtype="uint32"), "field 'dtype' must be uint16"),
    ("both", lambda m: m["plan"].update(seed="42"), "plan: field 'seed' must be an integer"),
    ("both", lambda m: m["plan"].update(valid_fraction=1), "field 'valid_fraction' is 1"),
    ("both", lambda m: m["plan"].update(shards=0), "field 'shards' is 0, out of range"),
    ("both", lambda m: m["plan"].update(inputs=[]), "field 'inputs' must be an object"),
    ("both", lambda m: m["plan"]["inputs"].update(train=[1]), "plan.inputs: must hold the lists"),
    ("both", lambda m: m["plan"].update(sizes=["x", "y"]), "field 'sizes' must hold one size"),
    ("both", lambda m: m["plan"].update(sizes=[1]), "field 'sizes' must hold one size"),
    ("both", lambda m: m["plan"].update(bytes=1), "field 'bytes' is not the sum"),
    ("both", lambda m: m["plan"].update(vocab_size=1000.0), "field 'vocab_size' must be an integer"),
    ("both", lambda m: m["plan"].pop("config_sha256"), "field 'config_sha256' is missing"),
    ("both", lambda m: m["plan"].update(tokenizer_sha256=None), "field 'tokenizer_sha256' must be a string"),
]


@pytest.mark.parametrize(("which", "edit", "needle"), SHARD_PART_EDITS)
def test_shard_part_json_of_the_wrong_shape_is_one_line(world, capsys, which, edit, needle):
    for i in (0, 1) if which == "both" else (0,):
        edit_json(world / f"sp{i}" / "part.json", edit)
    args = ["shard-merge", world / "sp0", world / "sp1", "--out", world / "merged"]
    refused(capsys, world, args, "part.json", needle, "rerun `xlnet shard --part`")


# ---- records parts ---------------------------------------------------------------------------------------------------

RECORD_PART_EDITS = [
    ("both", lambda m: m["plan"]["meta"].update(bi_data=None), "plan.meta: field 'bi_data' must be true or false"),
    ("both", lambda m: m["plan"]["meta"].pop("bi_data"), "plan.meta: field 'bi_data' is missing"),
    ("both", lambda m: m["plan"]["meta"].update(seq_len="32"), "field 'seq_len' must be an integer"),
    ("both", lambda m: m["plan"]["meta"].update(global_batch_size=3.5), "field 'global_batch_size' must be an int"),
    ("both", lambda m: m["plan"]["meta"].update(dtype="float32"), "field 'dtype' must be uint16 or uint32"),
    ("both", lambda m: m["plan"]["meta"].pop("splits"), "field 'splits' is missing"),
    ("both", lambda m: m["plan"]["meta"]["splits"]["train"].update(rows=3), "field 'rows' must equal"),
    ("both", lambda m: m["plan"]["meta"]["splits"]["train"].update(steps_per_pass=5), "does not describe"),
    ("both", lambda m: m["plan"]["meta"].update(format_version=1), "field 'format_version' must be 2"),
    ("both", lambda m: m["plan"].pop("config_sha256"), "field 'config_sha256' is missing"),
    ("both", lambda m: m["plan"].update(meta=[]), "field 'meta' must be an object"),
    ("one", lambda m: m.update(rows="0-2"), "field 'rows' must be a list"),
    ("one", lambda m: m.update(rows=[0.0, 2]), "field 'rows' must be [first, end]"),
    ("one", lambda m: m.update(sha256={"x": 1}), "entry 'x' must be a string"),
    ("one", lambda m: m["sha256"].pop("train/pass_000.alen.npy"), "does not list the records files"),
    ("one", lambda m: m.update(parts="2"), "field 'parts' must be an integer"),
]


@pytest.mark.parametrize(("which", "edit", "needle"), RECORD_PART_EDITS)
def test_records_part_json_of_the_wrong_shape_is_one_line(world, capsys, which, edit, needle):
    for i in (0, 1) if which == "both" else (0,):
        edit_json(world / f"rp{i}" / "part.json", edit)
    args = ["preprocess-merge", world / "rp0", world / "rp1", "--out", world / "merged"]
    refused(capsys, world, args, "part.json", needle, "rerun `xlnet preprocess --part`")


# ---- records meta.json: its checksums are required -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (lambda m: m.pop("sha256"), "lists no checksums (field 'sha256')"),
        (lambda m: m.update(sha256={}), "lists no checksums (field 'sha256')"),
        (lambda m: m["sha256"].pop("train/pass_000.masked.npy"), "no checksum for train/pass_000.masked.npy"),
        (lambda m: m["sha256"].pop("valid/pass_000.alen.npy"), "no checksum for valid/pass_000.alen.npy"),
    ],
)
def test_records_without_their_checksums_are_refused(pipeline, tmp_path, edit, needle):
    """A step folder whose meta.json lost its checksums is refused; records in the same state were read unchecked."""
    rec = tmp_path / "rec"
    shutil.copytree(pipeline.records, rec)
    edit_json(rec / "meta.json", edit)
    before = tree_digest(rec)
    for read in (lambda: read_meta(rec), lambda: open_records(rec, "train")):
        with pytest.raises(DataError, match=needle.replace("(", r"\(").replace(")", r"\)")) as e:
            read()
        assert "meta.json" in str(e.value) and "re-run `xlnet preprocess`" in str(e.value)
    assert tree_digest(rec) == before


def test_records_without_checksums_through_the_cli(pipeline, tmp_path, capsys):
    rec = tmp_path / "rec"
    shutil.copytree(pipeline.records, rec)
    edit_json(rec / "meta.json", lambda m: m.pop("sha256"))
    args = ["pretrain", "--data", rec, "--out", tmp_path / "run", "--set", "train.max_steps=2"]
    refused(capsys, tmp_path, args, "meta.json lists no checksums", "re-run `xlnet preprocess`")


# ---- xlnet_pretraining.json ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def exported(builds, tmp_path_factory) -> Path:
    from finetunetools import random_init_checkpoint

    root = random_init_checkpoint(builds, tmp_path_factory.mktemp("pretraining_json"))
    from xlnetcli.cli import main

    with pytest.raises(SystemExit) as e:
        main(["export", str(root / "init"), "--out", str(root / "hf")])
    assert not e.value.code
    return root / "hf"


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (lambda m: m["model"].update(bi_data="yes"), "model: field 'bi_data' must be true or false"),
        (lambda m: m["model"].update(same_length=1), "model: field 'same_length' must be true or false"),
        (lambda m: m["model"].update(mem_len="16"), "model: field 'mem_len' must be an integer"),
        (lambda m: m["model"].update(reuse_len=-1), "model: field 'reuse_len' is -1, out of range"),
        (lambda m: m["model"].update(dropatt=None), "model: field 'dropatt' must be a number"),
        (lambda m: m["model"].update(dropatt=1), "model: field 'dropatt' is 1, out of range"),
        (lambda m: m["model"].update(clamp_len=-5), "model: field 'clamp_len' is -5, out of range"),
        (lambda m: m["model"].update(objective=3), "model: field 'objective' must be a string"),
        (lambda m: m.update(model=[]), "field 'model' must be an object"),
        (lambda m: m.pop("model"), "field 'model' is missing"),
    ],
)
def test_xlnet_pretraining_json_names_the_file_and_the_field(exported, tmp_path, capsys, edit, needle):
    hf = tmp_path / "hf"
    shutil.copytree(exported, hf)
    edit_json(hf / "xlnet_pretraining.json", edit)
    args = ["import", "--from-hf", hf, "--out", tmp_path / "ck"]
    refused(capsys, tmp_path, args, "xlnet_pretraining.json", needle, "remove it to import with inference settings")
