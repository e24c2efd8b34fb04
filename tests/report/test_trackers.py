"""Experiment trackers (train.report_to / finetune.report_to): wandb offline and MLflow's file store receive the very
values metrics.jsonl holds, the run config as parameters; a resumed run continues its tracker run; a missing package
is one line naming the extra, before any work."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest
import torch
from clitools import FAST_PRETRAIN, TINY, TRAIN_TSV, assert_one_line_error, run_main, set_args

from xlnetcli.config import config_to_dict, load_config
from xlnetcli.core.errors import ConfigError, XLNetError
from xlnetcli.report.metrics_log import MetricsLogger, NullLogger, read_metrics
from xlnetcli.train.pretrain import pretrain

pytestmark = pytest.mark.slow  # every test here trains, runs subprocesses or builds large inputs

torch.set_num_threads(1)

TRACKED_RUN = [*FAST_PRETRAIN, "train.eval_every=2", "train.save_every=2"]  # eval and save rows for the trackers


@pytest.fixture(scope="module")
def records(builds) -> Path:
    """Shared (conftest.py): read only."""
    return builds.pipeline(TRACKED_RUN).records


@pytest.fixture(autouse=True)
def _quiet(monkeypatch):
    monkeypatch.setenv("XLNET_NO_PROGRESS", "1")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)


@pytest.fixture
def wandb_offline(tmp_path, monkeypatch) -> Path:
    pytest.importorskip("wandb")
    d = tmp_path / "wandb_home"
    d.mkdir()
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(d))
    return d


@pytest.fixture
def mlflow_store(tmp_path, monkeypatch) -> str:
    pytest.importorskip("mlflow")
    uri = (tmp_path / "mlruns").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps file stores behind this switch
    return uri


def _cfg(*extra: str):
    return load_config(TINY, TRACKED_RUN + list(extra))


def _rows(run: Path, split: str) -> dict[int, dict]:
    return {r["step"]: r for r in read_metrics(run) if r["split"] == split}


# ---- wandb: its offline run file, read back -------------------------------------------------------------------


def _wandb_records(path: Path) -> list:
    """Protobuf records of a .wandb file: a 7-byte header, then LevelDB log framing (32 KiB blocks; each record has
    a 7-byte header: crc32, length, type FULL=1 / FIRST=2 / MIDDLE=3 / LAST=4)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, chunks, pending = 7, 32768, [], b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # block trailer padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and length == 0:
            pos += left
            continue
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 1:
            chunks.append(chunk)
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            chunks.append(pending + chunk)
    out = []
    for raw in chunks:
        r = pb.Record()
        r.ParseFromString(raw)
        out.append(r)
    return out


def _wandb_history(run_file: Path) -> tuple[list[dict], dict]:
    rows, config = [], {}
    for r in _wandb_records(run_file):
        kind = r.WhichOneof("record_type")
        if kind == "history":
            rows.append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in r.history.item})
        elif kind == "config":
            config.update({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.config.update})
        elif kind == "run":
            config.update({i.key: json.loads(i.value_json) for i in r.run.config.update})
    return rows, config


def test_wandb_offline_gets_the_metrics_jsonl_values(records, tmp_path, wandb_offline):
    run = tmp_path / "run"
    cfg = _cfg("train.max_steps=4", "train.report_to=wandb")
    pretrain(cfg, records, run, quiet=True)
    state = json.loads((run / "trackers.json").read_text())
    files = list(wandb_offline.glob(f"wandb/offline-run-*-{state['wandb']['id']}/run-*.wandb"))
    assert len(files) == 1, list(wandb_offline.rglob("*"))
    rows, config = _wandb_history(files[0])
    train = {r["step"]: r for r in rows if "train/loss" in r}
    evals = {r["step"]: r for r in rows if "eval/loss" in r}
    want_train, want_eval = _rows(run, "train"), _rows(run, "eval")
    assert sorted(train) == sorted(want_train) == [1, 2, 3, 4]
    assert sorted(evals) == sorted(want_eval) == [0, 2, 4]
    for s, r in want_train.items():
        assert train[s]["train/loss"] == r["loss"] and train[s]["train/lr"] == r["lr"]
        assert train[s]["train/grad_norm"] == r["grad_norm"]
    for s, r in want_eval.items():
        assert evals[s]["eval/loss"] == r["loss"] and evals[s]["eval/acc"] == r["acc"]
    # the run config, nested by section
    assert config["train"]["lr"] == cfg.train.lr
    assert config["model"]["d_model"] == 64 and config["train"]["report_to"] == "wandb"


# ---- MLflow: its file store, read back through its client -----------------------------------------------------


def _mlflow_history(uri: str, run_id: str, key: str) -> dict[int, float]:
    from mlflow.tracking import MlflowClient

    return {m.step: m.value for m in MlflowClient(uri).get_metric_history(run_id, key)}


def test_mlflow_file_store_gets_the_metrics_jsonl_values_and_resume_continues(records, tmp_path, mlflow_store):
    from mlflow.tracking import MlflowClient

    run = tmp_path / "run"
    cfg = _cfg("train.max_steps=4", "train.report_to=mlflow")
    pretrain(cfg, records, run, quiet=True)
    run_id = json.loads((run / "trackers.json").read_text())["mlflow"]["run_id"]
    client = MlflowClient(mlflow_store)
    info = client.get_run(run_id)
    assert info.info.status == "FINISHED" and info.info.run_name == "run"
    assert client.get_experiment(info.info.experiment_id).name == "xlnet"
    params = info.data.params
    flat = {f"{s}.{k}": v for s, d in config_to_dict(cfg).items() for k, v in d.items()}
    assert len(params) == len(flat) and params["train.lr"] == str(cfg.train.lr)
    assert params["model.d_model"] == "64" and params["train.adam_betas"] == "[0.9, 0.999]"
    losses = _mlflow_history(mlflow_store, run_id, "train/loss")
    assert losses == {s: r["loss"] for s, r in _rows(run, "train").items()} and sorted(losses) == [1, 2, 3, 4]
    assert _mlflow_history(mlflow_store, run_id, "eval/loss") == {s: r["loss"] for s, r in _rows(run, "eval").items()}

    # --resume with more steps: the same MLflow run goes on (parameters are immutable there: none is re-logged)
    pretrain(_cfg("train.max_steps=6", "train.report_to=mlflow"), records, run, resume="latest", quiet=True)
    assert json.loads((run / "trackers.json").read_text())["mlflow"]["run_id"] == run_id
    losses = _mlflow_history(mlflow_store, run_id, "train/loss")
    assert losses == {s: r["loss"] for s, r in _rows(run, "train").items()} and sorted(losses) == [1, 2, 3, 4, 5, 6]
    assert client.get_run(run_id).info.status == "FINISHED"
    assert len(client.search_runs([info.info.experiment_id])) == 1


def test_finetune_report_to_mlflow(builds, tmp_path, mlflow_store):
    """finetune.report_to is the finetuning run's own key (its train.* settings come from the checkpoint)."""
    from xlnetcli.checkpoint.folders import save_model_dir
    from xlnetcli.model import XLNetLMHeadModel
    from xlnetcli.train.finetune import FinetuneArgs, finetune

    base = load_config(
        TINY, [*TRACKED_RUN, "model.mem_len=0", "model.reuse_len=0", "model.bi_data=false", "data.perm_size=16"]
    )
    torch.manual_seed(0)
    save_model_dir(
        tmp_path / "init",
        XLNetLMHeadModel(base.model),
        base,
        builds.tokenizer(base.tokenizer),
        meta={"kind": "pretrain", "step": 0},
    )
    lines = TRAIN_TSV.read_text(encoding="utf-8").splitlines()
    (tmp_path / "train.tsv").write_text("\n".join(lines[:65]) + "\n", encoding="utf-8")
    cfg = load_config(
        None,
        [
            "finetune.max_seq_length=32",
            "finetune.batch_size=16",
            "finetune.micro_batch_size=16",
            "finetune.max_steps=3",
            "finetune.report_to=mlflow",
            "finetune.precision=fp32",
        ],
    )
    finetune(
        cfg,
        FinetuneArgs("classification", tmp_path / "train.tsv", None, tmp_path / "init", tmp_path / "ft", quiet=True),
    )
    run_id = json.loads((tmp_path / "ft" / "trackers.json").read_text())["mlflow"]["run_id"]
    want = {r["step"]: r["loss"] for r in read_metrics(tmp_path / "ft") if r["split"] == "train"}
    assert want and _mlflow_history(mlflow_store, run_id, "train/loss") == want
    from mlflow.tracking import MlflowClient

    assert MlflowClient(mlflow_store).get_run(run_id).data.params["finetune.max_steps"] == "3"


# ---- choice, errors, other ranks --------------------------------------------------------------------------------


def test_report_to_values():
    assert load_config(None, ["train.report_to=[wandb, MLflow]"]).train.report_to == "wandb,mlflow"
    assert load_config(None, ["train.report_to=wandb, mlflow,wandb"]).train.report_to == "wandb,mlflow"
    assert load_config(None, []).train.report_to == "auto" and load_config(None, []).finetune.report_to == "auto"
    for bad in ("comet", "none,wandb", "[]", "''", "[1]"):
        with pytest.raises(ConfigError, match="report_to"):
            load_config(None, [f"train.report_to={bad}"])
    with pytest.raises(ConfigError, match=r"finetune\.report_to"):
        load_config(None, ["finetune.report_to=tensorbord"])


def test_none_writes_only_metrics_jsonl(tmp_path):
    log = MetricsLogger(tmp_path, "none")
    log.log(1, "train", loss=1.5, name="x")
    log.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]
    assert read_metrics(tmp_path)[0]["loss"] == 1.5
    NullLogger().log(1, loss=2.0)  # other ranks: nothing at all


@pytest.mark.parametrize("name", ["wandb", "mlflow", "tensorboard"])
def test_missing_tracker_package_is_one_line_naming_the_extra(name, records, tmp_path, monkeypatch, capsys):
    blocked = {
        "wandb": ["wandb"],
        "mlflow": ["mlflow", "mlflow.tracking"],
        "tensorboard": ["torch.utils.tensorboard", "tensorboard"],
    }[name]
    for mod in blocked:
        monkeypatch.setitem(sys.modules, mod, None)  # import raises ImportError
    with pytest.raises(XLNetError, match=rf"pip install 'xlnetcli\[{name}\]'"):
        MetricsLogger(tmp_path / "direct", name)
    out = tmp_path / "run"
    code, _, err = run_main(
        capsys,
        "pretrain",
        "--config",
        TINY,
        *set_args(TRACKED_RUN),
        "--set",
        "train.max_steps=2",
        "--set",
        f"train.report_to={name}",
        "--data",
        records,
        "--out",
        out,
    )
    assert_one_line_error(code, err, f"report_to {name}", f"pip install 'xlnetcli[{name}]'")
    assert not out.exists()  # refused before the run folder is made


def test_tracker_outage_mid_run_is_reported_once_and_training_goes_on(tmp_path, capsys):
    class Flaky:
        name = "flaky"
        calls = 0

        def log(self, step, scalars):
            Flaky.calls += 1
            raise ConnectionError("tracking server went away")

        def close(self, ok):
            pass

    log = MetricsLogger(tmp_path, "none")
    log._trackers.append(Flaky())
    for s in range(3):
        log.log(s, "train", loss=1.0 + s)
    log.close()
    assert Flaky.calls == 1 and [r["step"] for r in read_metrics(tmp_path)] == [0, 1, 2]
    out = capsys.readouterr()
    assert (out.out + out.err).count("tracking server went away") == 1
