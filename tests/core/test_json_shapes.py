"""Issue 22, class 5: files of the wrong shape. JSON that parses but is not the expected object (HF config.json and
tokenizer_config.json, records meta.json, shard manifests, lock files, trackers.json, the train state's top), numbers
out of range in them, a manifest whose counts disagree with its arrays, and arguments that are not UTF-8: one line
naming the file and the field, never a TypeError, KeyError or ZeroDivisionError from deep inside."""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import pytest
from clitools import FAST_PRETRAIN, assert_one_line_error, run_main
from finetunetools import random_init_checkpoint

from xlnetcli.checkpoint.load import load_model_dir
from xlnetcli.core.errors import CheckpointError, DataError, XLNetError
from xlnetcli.core.files import lock_path, output_lock
from xlnetcli.core.shapes import json_field, loads_strict, read_json_object
from xlnetcli.data.records.format import open_records, read_meta
from xlnetcli.data.shards.format import read_manifest
from xlnetcli.report.trackers import start_trackers
from xlnetcli.train.checkpointer import _check_state_shape

# ---- the shared validator ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("obj", "kind", "bounds", "needle"),
    [
        ({}, int, {}, "field 'n' is missing"),
        ({"n": "3"}, int, {}, "field 'n' must be an integer, found a string \"3\""),
        ({"n": True}, int, {}, "field 'n' must be an integer, found a boolean true"),
        ({"n": 2.5}, int, {}, "field 'n' must be an integer, found a number 2.5"),
        ({"n": -1}, int, {"lo": 0}, "field 'n' is -1, out of range"),
        ({"n": 10**20}, int, {"hi": 2**31}, "field 'n' is 100000000000000000000, out of range"),
        ({"n": None}, float, {}, "field 'n' must be a number, found null"),
        ({"n": [1]}, (str, int), {}, "field 'n' must be a string or an integer, found a list"),
    ],
)
def test_json_field_names_the_field_and_what_it_found(obj, kind, bounds, needle):
    with pytest.raises(DataError, match="^f.json: " + needle.replace("(", r"\(")):
        json_field(obj, "n", kind, "f.json", **bounds)


def test_json_field_accepts_what_it_should():
    assert json_field({"n": 3}, "n", float, "f") == 3
    assert json_field({}, "n", int, "f", default=7) == 7
    assert json_field({"b": False}, "b", bool, "f") is False


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"[1, 2]", "not a JSON object"),
        (b'{"a": NaN}', "not valid JSON"),
        (b"\xff\xfe{}", "not valid JSON"),
        (b"[" * 100_000, "not valid JSON"),
        (b"", "not valid JSON"),
    ],
)
def test_read_json_object_refuses_in_one_line(tmp_path, content, needle):
    (tmp_path / "x.json").write_bytes(content)
    with pytest.raises(DataError, match=needle):
        read_json_object(tmp_path / "x.json")


# ---- HF directories ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def export(builds, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("shapes")
    random_init_checkpoint(builds, root)
    from xlnetcli.cli import main

    with pytest.raises(SystemExit) as e:
        main(["export", str(root / "init"), "--out", str(root / "hf")])
    assert e.value.code in (0, None)
    return root / "hf"


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"d_model": "64"}, "field 'd_model' must be an integer"),
        ({"n_head": 0}, "field 'n_head' is 0, out of range"),
        ({"n_layer": 2.5}, "field 'n_layer' must be an integer"),
        ({"vocab_size": True}, "field 'vocab_size' must be an integer"),
        ({"d_inner": None}, "field 'd_inner' must be an integer, found null"),
        ({"dropout": "0.1"}, "field 'dropout' must be a number"),
        ({"ff_activation": 5}, "field 'ff_activation' must be a string"),
        ({"bi_data": "no"}, "field 'bi_data' must be true or false"),
        ({"mem_len": -5}, "field 'mem_len' is -5, out of range"),
        ({"d_model": 1_000_000}, "describes a model of ~.* parameters"),
        ({"n_layer": 100_000}, "describes a model of ~.* parameters"),
        ({"layer_norm_eps": 5.0}, r"layer_norm_eps"),
    ],
)
def test_hf_config_fields_of_the_wrong_kind_or_size_are_refused(export, tmp_path, change, needle):
    hf = tmp_path / "hf"
    shutil.copytree(export, hf)
    cfg = json.loads((hf / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps({**cfg, **change}))
    with pytest.raises(CheckpointError, match=needle) as e:
        load_model_dir(hf)
    assert "config.json" in str(e.value)


def test_hf_tokenizer_settings_of_the_wrong_kind_are_refused(export, tmp_path):
    hf = tmp_path / "hf"
    shutil.copytree(export, hf)
    (hf / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": "yes"}))
    with pytest.raises(CheckpointError, match=r"tokenizer_config\.json: field 'do_lower_case' must be true or false"):
        load_model_dir(hf)


# ---- records and shards ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pipeline(builds):
    return builds.pipeline(FAST_PRETRAIN)


def _edit_json(path: Path, edit) -> None:
    obj = json.loads(path.read_text())
    edit(obj)
    path.write_text(json.dumps(obj))


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (lambda m: m.update(seq_len="32"), "field 'seq_len' must be an integer"),
        (lambda m: m.update(micro_batch_size=0), "field 'micro_batch_size' is 0, out of range"),
        (lambda m: m.update(splits=[1]), "field 'splits' must be an object"),
        (lambda m: m["splits"].update(train=5), "splits.train: must be an object"),
        (lambda m: m["splits"]["train"].update(rows=-1), "field 'rows' is -1"),
        (lambda m: m["splits"]["train"].update(files=["../../etc/x"]), "relative paths inside"),
        (lambda m: m.update(sha256={"a": 1}), "entry 'a' must be a string"),
        (lambda m: m.pop("shards"), "field 'shards' is missing"),
        (lambda m: m["shards"].update(absolute=3), "shards: field 'absolute' must be a string"),
        (lambda m: m["splits"]["train"].update(orders=[[1]]), "field 'orders' must hold one order"),
        (lambda m: m["splits"]["train"]["shards"][0].update(file="/etc/x"), "must be a path inside the shard"),
        (lambda m: m["splits"]["train"]["shards"][0].update(tokens="5"), "field 'tokens' must be an integer"),
        (lambda m: m["splits"]["train"].pop("row_len"), "field 'row_len' is missing"),
    ],
)
def test_records_meta_of_the_wrong_shape_is_refused(pipeline, tmp_path, edit, needle):
    rec = tmp_path / "rec"
    shutil.copytree(pipeline.records, rec)
    _edit_json(rec / "meta.json", edit)
    with pytest.raises(DataError, match=needle):
        read_meta(rec)


@pytest.mark.parametrize("key", ["rows", "steps_per_pass"])
def test_records_whose_counts_disagree_with_their_arrays_are_refused(pipeline, tmp_path, key):
    rec = tmp_path / "rec"
    shutil.copytree(pipeline.records, rec)
    _edit_json(rec / "meta.json", lambda m: m["splits"]["train"].update({key: m["splits"]["train"][key] + 1}))
    with pytest.raises(DataError, match=r"alen\.npy has shape .* but meta\.json's counts say"):
        open_records(rec, "train")


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (lambda m: m.update(vocab_size="1000"), "field 'vocab_size' must be an integer"),
        (lambda m: m.update(tokenizer_sha256=5), "field 'tokenizer_sha256' must be a string"),
        (lambda m: m["splits"].update(valid={}), "splits.valid must be a list"),
        (lambda m: m["splits"]["train"].append(7), r"splits.train\[1\]: must be an object"),
        (lambda m: m["splits"]["train"][0].update(tokens_file="/etc/passwd"), "must be a path inside"),
        (lambda m: m["splits"]["train"][0].update(tokens=-3), "field 'tokens' is -3"),
        (lambda m: m["splits"]["train"][0].pop("sentid_file"), "field 'sentid_file' is missing"),
        (lambda m: m["splits"]["train"][0].update(sha256={"tokens": []}), "entry 'tokens' must be a string"),
    ],
)
def test_shard_manifests_of_the_wrong_shape_are_refused(pipeline, tmp_path, edit, needle):
    shards = tmp_path / "shards"
    shutil.copytree(pipeline.shards, shards)
    _edit_json(shards / "manifest.json", edit)
    with pytest.raises(DataError, match=needle):
        read_manifest(shards)


# ---- lock files, trackers.json, train states ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "owner",
    [[1, 2], {"host": 5, "pid": 1}, {"host": socket.gethostname(), "pid": "x"}, {"host": "h", "pid": -1}],
)
def test_lock_files_of_the_wrong_shape_are_one_line(tmp_path, owner):
    out = tmp_path / "out"
    lock_path(out).write_text(json.dumps(owner))
    with pytest.raises(XLNetError, match="locked by another xlnet process"), output_lock(out):
        pass
    assert json.loads(lock_path(out).read_text()) == owner  # a fresh lock of someone else is left alone


def test_a_lock_with_an_absurd_pid_is_not_a_crash(tmp_path):
    out = tmp_path / "out"
    lock_path(out).write_text(json.dumps({"host": socket.gethostname(), "pid": 10**30}))
    with pytest.raises(XLNetError, match="locked by another xlnet process"), output_lock(out):
        pass


@pytest.mark.parametrize("content", ["[1]", '{"wandb": 5, "mlflow": [1]}', '"x"'])
def test_trackers_json_of_the_wrong_shape_starts_new_tracker_runs(tmp_path, content):
    (tmp_path / "trackers.json").write_text(content)
    assert start_trackers(tmp_path, "none", None, resumed=True) == []


@pytest.mark.parametrize(
    ("state", "needle"),
    [
        ([1, 2], "not a training state"),
        ({"ranks": []}, "field 'step' is missing"),
        ({"step": -1, "ranks": [{}]}, "field 'step' is -1"),
        ({"step": 1, "ranks": {}}, "field 'ranks' must be a list"),
        ({"step": 1, "ranks": [1]}, "non-empty list of objects"),
        ({"step": 1, "ranks": []}, "non-empty list of objects"),
    ],
)
def test_train_states_of_the_wrong_shape_are_refused(state, needle):
    with pytest.raises(CheckpointError, match=needle):
        _check_state_shape(state, Path("step_0000002/train_state.safetensors"))


# ---- the command line --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arg", ["\udcff", "caf\udce9", "ok\udc80text"])
def test_arguments_that_are_not_utf8_are_one_line(tmp_path, capsys, arg):
    code, _, err = run_main(capsys, "tokenize", "encode", "--tokenizer", tmp_path, "--text", arg)
    assert_one_line_error(code, err, "not valid UTF-8")
    assert list(tmp_path.iterdir()) == []


# ---- nesting deeper than Python's stack (issue 35) --------------------------------------------------------------

DEEP = "[" * 100_000 + "]" * 100_000


def test_deeply_nested_json_is_a_value_error_not_a_recursion_error():
    with pytest.raises(ValueError, match="nested too deeply"):
        loads_strict(DEEP)


def test_a_deeply_nested_corpus_line_is_one_line_naming_it(tmp_path, capsys):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"text": "a line of text"}\n' + '{"text": ' + DEEP + "}\n")
    before = corpus.read_bytes()
    code, _, err = run_main(capsys, "tokenize", "train", corpus, "--out", tmp_path / "tok")
    assert_one_line_error(code, err, "corpus.jsonl line 2 is not JSON (nested too deeply)")
    assert corpus.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["corpus.jsonl"]
