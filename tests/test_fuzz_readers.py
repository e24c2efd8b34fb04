"""Issue 22: every reader of a file a user or an earlier run gives us, fuzzed with Hypothesis. Whatever the bytes (or
whatever a valid file becomes with one field replaced, removed or retyped), the result is a correct read or an
XLNetError (one line, exit 2 through the CLI), never another exception, and the input is never changed.

Readers: config YAML and ``--set``, labelled TSV/CSV/JSONL, multiple-choice JSONL, SQuAD JSON, a step folder's
meta.json, HF config.json, metrics.jsonl, shard manifests, records meta.json, lock files, train-state trees; and
(issue 35) shard and records part.json through a merge, records meta.json through opening the records, a shard
manifest through preprocess, xlnet_pretraining.json through import, metrics.jsonl through plot: a refusal leaves the
folder it reads and writes byte for byte as it was (``untouched``), an accepted file gives output the next reader
takes.

A fixed example budget keeps the file under a minute on two cores; ``XLNET_FUZZ_EXAMPLES=2000`` (say) runs longer.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from clitools import FAST_PRETRAIN, SAMPLE, SQUAD, TINY, run_main
from conftest import tree_digest
from finetunetools import random_init_checkpoint
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from xlnetcli.checkpoint.hf_dir import PRETRAINING_FILE
from xlnetcli.checkpoint.load import load_model_dir
from xlnetcli.config import load_config
from xlnetcli.core.errors import XLNetError
from xlnetcli.core.files import lock_path, output_lock
from xlnetcli.data.labelled import read_choices, read_squad, read_table
from xlnetcli.data.records.format import ARRAYS, open_records, read_meta
from xlnetcli.data.shards.format import read_manifest, verify_shards
from xlnetcli.report.metrics_log import read_metrics
from xlnetcli.train.checkpointer import _check_state_shape, load_tree

EXAMPLES = int(os.environ.get("XLNET_FUZZ_EXAMPLES", "25"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=EXAMPLES <= 100,  # the suite's budget runs the same examples every time; longer runs explore
)

# ---- strategies --------------------------------------------------------------------------------------------------

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
)
JSON = st.recursive(
    SCALARS, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3), max_leaves=8
)


@st.composite
def mutated(draw: Any, base: Any) -> Any:
    """``base`` with one value somewhere replaced by any JSON value, or one key removed."""
    obj = copy.deepcopy(base)
    parent, key = None, None
    node = obj
    for _ in range(draw(st.integers(0, 6))):
        if isinstance(node, dict) and node:
            k = draw(st.sampled_from(sorted(node)))
        elif isinstance(node, list) and node:
            k = draw(st.integers(0, len(node) - 1))
        else:
            break
        parent, key, node = node, k, node[k]
    if parent is None:
        return draw(JSON)
    if isinstance(parent, dict) and draw(st.booleans()):
        del parent[key]
    else:
        parent[key] = draw(JSON)
    return obj


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj).encode()  # NaN/Infinity tokens included: readers must refuse them


FILE_BYTES = st.binary(max_size=300) | st.text(max_size=300).map(lambda t: t.encode("utf-8", "surrogatepass"))


def holds(read: Callable[[], Any], *inputs: Path) -> Any:
    """Run a reader: a result or an XLNetError, and every input byte-identical afterwards."""
    before = {p: (p.read_bytes() if p.is_file() else None) for p in inputs}
    try:
        return read()
    except XLNetError as e:
        assert "\n" not in str(e), str(e)
        return e
    finally:
        assert {p: (p.read_bytes() if p.is_file() else None) for p in inputs} == before


def untouched(read: Callable[[], Any], root: Path, out: Path | None = None) -> Any:
    """``holds`` for a command that writes ``out`` under ``root``: refused, every file and folder under ``root`` as
    it was (no output, temporary or lock left); accepted, the same once ``out`` is removed."""
    before = tree_digest(root)
    try:
        return read()
    except XLNetError as e:
        assert "\n" not in str(e), str(e)
        assert tree_digest(root) == before, "a refusal changed files"
        return e
    finally:
        if out is not None and out.exists():
            shutil.rmtree(out)
        assert tree_digest(root) == before


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


# ---- config ------------------------------------------------------------------------------------------------------

TINY_DICT = yaml.safe_load(TINY.read_text())


@FUZZ
@given(doc=mutated(TINY_DICT))
def test_config_yaml_with_one_field_changed(work, doc):
    path = work / "c.yaml"
    path.write_text(yaml.safe_dump(doc))
    holds(lambda: load_config(path), path)


@FUZZ
@given(data=FILE_BYTES)
def test_config_yaml_of_any_bytes(work, data):
    path = work / "c.yaml"
    path.write_bytes(data)
    holds(lambda: load_config(path), path)


@FUZZ
@given(
    key=st.sampled_from(["model.d_model", "train.lr", "data.seq_len", "train.report_to", "x", "model"]),
    value=st.text(max_size=30),
)
def test_set_overrides_of_any_text(key, value):
    holds(lambda: load_config(TINY, [f"{key}={value}"]))


@FUZZ
@given(arg=st.text(max_size=40))
def test_set_on_the_command_line_is_one_line_or_a_config(capsys, arg):
    code, _out, err = run_main(capsys, "config", "show", "tiny", "--set", arg)
    assert code in (0, 2) and "Traceback" not in err
    if code == 2:
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("xlnet: error:"), err


# ---- labelled data -----------------------------------------------------------------------------------------------


@FUZZ
@given(
    data=FILE_BYTES,
    suffix=st.sampled_from([".tsv", ".csv", ".jsonl"]),
    task=st.sampled_from(["classification", "regression"]),
)
def test_labelled_files_of_any_bytes(work, data, suffix, task):
    path = work / f"d{suffix}"
    path.write_bytes(data)
    result = holds(lambda: read_table(path, task=task), path)
    if isinstance(result, list) and task == "regression":
        assert all(isinstance(e.label, float) and e.label == e.label for e in result)  # never NaN


ROWS = st.lists(st.lists(st.text(max_size=8), min_size=1, max_size=4), min_size=1, max_size=5)


@FUZZ
@given(rows=ROWS, task=st.sampled_from(["classification", "regression"]))
def test_tsv_rows_of_any_width(work, rows, task):
    path = work / "r.tsv"
    path.write_text(
        "\n".join(["sentence\tlabel", *("\t".join(r) for r in rows)]) + "\n", encoding="utf-8", errors="surrogatepass"
    )
    holds(lambda: read_table(path, task=task), path)


CHOICE = {"context": "c", "question": "q _", "options": ["a", "b"], "answer": 1, "id": "x"}


@FUZZ
@given(row=mutated(CHOICE))
def test_multiple_choice_rows_with_one_field_changed(work, row):
    path = work / "mc.jsonl"
    path.write_bytes(_dumps(CHOICE) + b"\n" + _dumps(row) + b"\n")
    holds(lambda: read_choices(path), path)


SQUAD_DOC = json.loads(SQUAD.read_text())
SQUAD_DOC["data"] = SQUAD_DOC["data"][:1]


@FUZZ
@given(doc=mutated(SQUAD_DOC))
def test_squad_files_with_one_field_changed(work, doc):
    path = work / "sq.json"
    path.write_bytes(_dumps(doc))
    holds(lambda: read_squad(path), path)


# ---- checkpoints -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ckpt(builds, work) -> Path:
    random_init_checkpoint(builds, work)
    from xlnetcli.cli import main

    with pytest.raises(SystemExit):
        main(["export", str(work / "init"), "--out", str(work / "hf")])
    return work / "init"


@FUZZ
@given(data=st.data())
def test_step_folder_meta_json_with_one_field_changed(ckpt, work, data):
    folder = work / "meta_case"
    if not folder.exists():
        shutil.copytree(ckpt, folder)
    base = json.loads((ckpt / "meta.json").read_text())
    (folder / "meta.json").write_bytes(_dumps(data.draw(mutated(base))))
    holds(lambda: load_model_dir(folder), *(p for p in folder.rglob("*") if p.is_file()))


@FUZZ
@given(data=st.data())
def test_hf_config_json_with_one_field_changed(ckpt, work, data):
    folder = work / "hf_case"
    if not folder.exists():
        shutil.copytree(work / "hf", folder)
    base = json.loads((work / "hf" / "config.json").read_text())
    (folder / "config.json").write_bytes(_dumps(data.draw(mutated(base))))
    holds(lambda: load_model_dir(folder), *(p for p in folder.rglob("*") if p.is_file()))


@FUZZ
@given(tree=FILE_BYTES.map(lambda b: b.decode("utf-8", "replace")) | JSON.map(json.dumps))
def test_train_state_trees_of_any_shape(work, tree):
    path = work / "train_state.safetensors"
    save_file({}, str(path), metadata={"tree": tree})
    state = holds(lambda: load_tree(path), path)
    if not isinstance(state, XLNetError):
        holds(lambda: _check_state_shape(state, path))


# ---- run files: metrics, manifests, records meta, locks ----------------------------------------------------------


@FUZZ
@given(data=FILE_BYTES)
def test_metrics_jsonl_of_any_bytes(work, data):
    (work / "run").mkdir(exist_ok=True)
    path = work / "run" / "metrics.jsonl"
    path.write_bytes(data)
    holds(lambda: read_metrics(work / "run", warn=False), path)


@pytest.fixture(scope="module")
def pipeline(builds):
    return builds.pipeline(FAST_PRETRAIN)


@FUZZ
@given(data=st.data())
def test_shard_manifests_with_one_field_changed(pipeline, work, data):
    folder = work / "shards"
    if not folder.exists():
        shutil.copytree(pipeline.shards, folder)
    base = json.loads((pipeline.shards / "manifest.json").read_text())
    (folder / "manifest.json").write_bytes(_dumps(data.draw(mutated(base))))
    holds(lambda: read_manifest(folder), folder / "manifest.json")


@FUZZ
@given(data=st.data())
def test_records_meta_with_one_field_changed(pipeline, work, data):
    folder = work / "records"
    if not folder.exists():
        shutil.copytree(pipeline.records, folder)
    base = json.loads((pipeline.records / "meta.json").read_text())
    (folder / "meta.json").write_bytes(_dumps(data.draw(mutated(base))))
    holds(lambda: read_meta(folder), folder / "meta.json")


@FUZZ
@given(owner=FILE_BYTES | mutated({"host": "h", "pid": 1, "started": 0.0}).map(_dumps))
def test_lock_files_of_any_bytes(work, owner):
    out = work / "locked"
    lock = lock_path(out)
    lock.write_bytes(owner)
    os.utime(lock, (0, 0))  # written long ago (an unreadable lock this young gets a second's grace)

    def take() -> None:
        with output_lock(out):
            pass

    result = holds(take)
    if isinstance(result, XLNetError):
        assert lock.read_bytes() == owner  # refused: someone else's lock is left alone


# ---- issue 35: part.json of shard and records parts through a merge ------------------------------------------------


def _json(path: Path) -> Any:
    return json.loads(path.read_text())


def _mutated_parts(data: Any, bases: list[dict]) -> list[dict]:
    """One part's part.json with one field changed, or the plan (what every part must agree on) changed the same
    way in every part: a hand-edited plan is then not refused for parts that disagree, and reaches the merge."""
    which = data.draw(st.sampled_from([*range(len(bases)), "plan"]))
    metas = copy.deepcopy(bases)
    if which == "plan":
        plan = data.draw(mutated(bases[0]["plan"]))
        return [{**m, "plan": plan} for m in metas]
    metas[which] = data.draw(mutated(bases[which]))
    return metas


@pytest.fixture(scope="module")
def shard_parts(pipeline, work) -> list[Path]:
    """Parts 0 and 1 of 2 of two input files (read only: each example copies them)."""
    from xlnetcli.data.shards.parts import shard_part
    from xlnetcli.data.shards.shard import ShardOptions

    text = SAMPLE.read_text(encoding="utf-8").split("\n\n")
    inputs = [work / "in0.txt", work / "in1.txt"]
    inputs[0].write_text("\n\n".join(text[: len(text) // 2]), encoding="utf-8")
    inputs[1].write_text("\n\n".join(text[len(text) // 2 :]), encoding="utf-8")
    cfg = load_config(TINY, FAST_PRETRAIN)
    parts = [work / "shard_parts" / f"p{i}" for i in range(2)]
    for i, p in enumerate(parts):
        shard_part(cfg, [str(f) for f in inputs], p, pipeline.tokenizer, (i, 2), ShardOptions(shards=1, quiet=True))
    return parts


@FUZZ
@given(data=st.data())
def test_shard_part_json_with_one_field_changed(shard_parts, work, data):
    from xlnetcli.data.shards.parts import merge_shard_parts

    root = work / "shard_case"
    if root.exists():
        shutil.rmtree(root)
    dirs = [root / p.name for p in shard_parts]
    for src, d in zip(shard_parts, dirs, strict=True):
        shutil.copytree(src, d)
    for d, m in zip(dirs, _mutated_parts(data, [_json(p / "part.json") for p in shard_parts]), strict=True):
        (d / "part.json").write_bytes(_dumps(m))
    out = root / "merged"

    def merge_and_read() -> None:
        merge_shard_parts(dirs, out, quiet=True)
        verify_shards(out, read_manifest(out))  # what the merge wrote, preprocess reads

    untouched(merge_and_read, root, out)


@pytest.fixture(scope="module")
def record_parts(pipeline, work) -> list[Path]:
    """Records parts 0 and 1 of 2 of the pipeline's shards (read only: each example copies them)."""
    from xlnetcli.data.records.preprocess import preprocess

    cfg = load_config(TINY, FAST_PRETRAIN)
    parts = [work / "record_parts" / f"r{i}" for i in range(2)]
    for i, p in enumerate(parts):
        preprocess(cfg, pipeline.shards, p, part=(i, 2), quiet=True)
    return parts


@FUZZ
@given(data=st.data())
def test_records_part_json_with_one_field_changed(record_parts, work, data):
    from xlnetcli.data.records.parts import merge_record_parts

    root = work / "record_parts"  # the parts find the shards by their relative path: copies stay beside them
    dirs = [root / f"case_{p.name}" for p in record_parts]
    for src, d in zip(record_parts, dirs, strict=True):
        if d.exists():
            shutil.rmtree(d)
        shutil.copytree(src, d)
    for d, m in zip(dirs, _mutated_parts(data, [_json(p / "part.json") for p in record_parts]), strict=True):
        (d / "part.json").write_bytes(_dumps(m))
    out = root / "merged"

    def merge_and_read() -> None:
        merge_record_parts(dirs, out)
        for split in read_meta(out)["splits"]:
            open_records(out, split)  # what the merge wrote, pretraining reads

    untouched(merge_and_read, root, out)


# ---- issue 35: records meta.json through opening the records, a shard manifest through preprocess -----------------


@FUZZ
@given(data=st.data(), split=st.sampled_from(["train", "valid"]))
def test_records_meta_opened_with_one_field_changed(pipeline, work, data, split):
    folder = work / "records"
    if not folder.exists():
        shutil.copytree(pipeline.records, folder)
    base = _json(pipeline.records / "meta.json")
    meta = data.draw(mutated(base))
    (folder / "meta.json").write_bytes(_dumps(meta))
    result = holds(lambda: open_records(folder, split), *(p for p in folder.rglob("*") if p.is_file()))
    if not isinstance(result, XLNetError):  # read: every records file it read was checked against its checksum
        files = [f"{prefix}.{name}.npy" for prefix in result[0]["splits"][split]["files"] for name in ARRAYS]
        assert all(isinstance(result[0]["sha256"].get(f), str) for f in files)


@FUZZ
@given(data=st.data())
def test_shard_manifest_through_preprocess(pipeline, work, data):
    from xlnetcli.data.records.preprocess import preprocess

    root = work / "preprocess_case"
    if not root.exists():
        shutil.copytree(pipeline.shards, root / "shards")
    base = _json(pipeline.shards / "manifest.json")
    (root / "shards" / "manifest.json").write_bytes(_dumps(data.draw(mutated(base))))
    cfg = load_config(TINY, FAST_PRETRAIN)
    untouched(lambda: preprocess(cfg, root / "shards", root / "rec", quiet=True), root, root / "rec")


# ---- issue 35: xlnet_pretraining.json through import, metrics.jsonl through plot ------------------------------------


@FUZZ
@given(data=st.data())
def test_xlnet_pretraining_json_with_one_field_changed(ckpt, work, data):
    from xlnetcli.interop.huggingface import import_hf

    root = work / "pretraining_case"
    if not root.exists():
        shutil.copytree(work / "hf", root / "hf")
    base = _json(work / "hf" / PRETRAINING_FILE)
    (root / "hf" / PRETRAINING_FILE).write_bytes(_dumps(data.draw(mutated(base))))
    result = untouched(lambda: import_hf(root / "hf", root / "imported"), root, root / "imported")
    if isinstance(result, XLNetError):
        assert PRETRAINING_FILE in str(result), str(result)  # the only file changed is the one named


METRIC_ROWS = [
    {"step": 1, "split": "train", "time": 1.0, "loss": 7.0, "lr": 0.001, "tokens_per_s": 100.0},
    {"step": 2, "split": "eval", "time": 2.0, "loss": 6.5, "accuracy": 0.1},
    {"step": 2, "split": "train", "time": 2.0, "loss": 6.0, "lr": 0.002, "tokens_per_s": 110.0},
]


@FUZZ
@given(rows=mutated(METRIC_ROWS))
def test_metrics_rows_through_plot(capsys, work, rows):
    run = work / "plot_case" / "run"
    run.mkdir(parents=True, exist_ok=True)
    lines = rows if isinstance(rows, list) else [rows]
    (run / "metrics.jsonl").write_bytes(b"".join(_dumps(r) + b"\n" for r in lines))
    out = work / "plot_case" / "curves.png"
    before = tree_digest(run)
    code, _out, err = run_main(capsys, "plot", str(run), "--out", str(out))
    assert code in (0, 2) and "Traceback" not in err, err
    if code == 2:  # one error line, the last (a warning about a torn last line may come before it)
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert lines[-1].startswith("xlnet: error:") and sum("error" in ln for ln in lines) == 1, err
        assert not out.exists()
    out.unlink(missing_ok=True)
    assert tree_digest(run) == before
