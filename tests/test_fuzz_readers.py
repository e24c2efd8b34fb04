"""Issue 22: every reader of a file a user or an earlier run gives us, fuzzed with Hypothesis. Whatever the bytes (or
whatever a valid file becomes with one field replaced, removed or retyped), the result is a correct read or an
XLNetError (one line, exit 2 through the CLI), never another exception, and the input is never changed.

Readers: config YAML and ``--set``, labelled TSV/CSV/JSONL, multiple-choice JSONL, SQuAD JSON, a step folder's
meta.json, HF config.json, metrics.jsonl, shard manifests, records meta.json, lock files, train-state trees.

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
from clitools import FAST_PRETRAIN, SQUAD, TINY, run_main
from finetunetools import random_init_checkpoint
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from xlnetcli.checkpoint.load import load_model_dir
from xlnetcli.config import load_config
from xlnetcli.core.errors import XLNetError
from xlnetcli.core.files import lock_path, output_lock
from xlnetcli.data.labelled import read_choices, read_squad, read_table
from xlnetcli.data.records.format import read_meta
from xlnetcli.data.shards.format import read_manifest
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

    def take() -> None:
        with output_lock(out):
            pass

    result = holds(take)
    if isinstance(result, XLNetError):
        assert lock.read_bytes() == owner  # refused: someone else's lock is left alone
