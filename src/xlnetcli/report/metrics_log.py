"""Run logs: metrics as JSON lines, mirrored to the trackers of ``report_to``; a null logger keeps other ranks quiet.

    logger = MetricsLogger(run_dir, report_to=cfg.train.report_to, config=cfg)   # rank 0 only
    logger.log(step, "train", loss=2.3, lr=1e-4)    # metrics.jsonl row; scalars as train/loss, train/lr at `step`

report_to (train.report_to for pretraining, finetune.report_to for finetuning) is a comma string or list of:
  tensorboard  TensorBoard event files in RUN/tensorboard/ (needs the tensorboard package)
  wandb        Weights & Biases (the `wandb` extra); WANDB_PROJECT (default xlnet), WANDB_MODE=offline, WANDB_DIR
               (default: the run folder) and the other WANDB_* variables apply; the x axis is the metric "step"
  mlflow       MLflow (the `mlflow` extra); MLFLOW_TRACKING_URI, MLFLOW_EXPERIMENT_NAME (default xlnet) apply
  auto         TensorBoard when it is installed, nothing else (the default);  none: metrics.jsonl only
The run config is logged once as parameters (wandb: nested config; MLflow: section.key params). A resumed run (its
metrics.jsonl already holds rows) continues the same wandb / MLflow run: their ids are kept in RUN/trackers.json.
A tracker that fails in the middle of a run is reported once and dropped; training goes on (metrics.jsonl is the
record).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import math
import os
import time
from pathlib import Path
from typing import Any

from xlnetcli.core.errors import DataError, XLNetError
from xlnetcli.core.console import console

TRACKERS_FILE = "trackers.json"


def _one_line(e: BaseException, limit: int = 300) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= limit else text[:limit] + "..."


def _flat_params(config: Any) -> dict[str, Any]:
    """{'section.key': value} of a Config (or a nested dict)."""
    if config is None:
        return {}
    if not isinstance(config, dict):
        from xlnetcli.config import config_to_dict

        config = config_to_dict(config)
    return {f"{s}.{k}": v for s, values in config.items() for k, v in (values or {}).items()}


def _names(report_to: str | list[str]) -> list[str]:
    items = [report_to] if isinstance(report_to, str) else list(report_to)
    return [n.strip().lower() for s in items for n in s.split(",") if n.strip()]


_EXTRAS = {"tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb"), "mlflow": ("mlflow", "mlflow")}


def _missing(name: str) -> XLNetError:
    package, extra = _EXTRAS[name]
    return XLNetError(f"report_to {name} needs the {package} package: pip install 'xlnetcli[{extra}]'")


def require_trackers(report_to: str | list[str]) -> None:
    """Fail early, in one line naming the extra to install, when a tracker of ``report_to`` is not installed."""
    for name in _names(report_to):
        try:
            if name == "tensorboard":
                import torch.utils.tensorboard  # noqa: F401 - needs the tensorboard package
            elif name == "wandb":
                import wandb  # noqa: F401
            elif name == "mlflow":
                import mlflow.tracking  # noqa: F401
        except ImportError:
            raise _missing(name) from None


def _nested(config: Any) -> dict[str, Any]:
    if config is None or isinstance(config, dict):
        return dict(config or {})
    from xlnetcli.config import config_to_dict

    return config_to_dict(config)


class _TensorBoard:
    name = "tensorboard"

    def __init__(self, run_dir: Path, required: bool) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            if required:
                raise _missing(self.name) from None
            raise
        self.writer = SummaryWriter(str(run_dir / "tensorboard"))

    def log(self, step: int, scalars: dict[str, float]) -> None:
        for k, v in scalars.items():
            self.writer.add_scalar(k, v, step)

    def close(self, ok: bool) -> None:
        self.writer.close()


class _WandB:
    name = "wandb"

    def __init__(self, run_dir: Path, config: Any, previous: dict | None) -> None:
        try:
            import wandb
        except ImportError:
            raise _missing(self.name) from None
        kwargs: dict[str, Any] = {}
        if previous and previous.get("id"):
            kwargs.update(id=previous["id"], resume="allow")
        try:
            self.run = wandb.init(
                project=os.environ.get("WANDB_PROJECT") or "xlnet", name=run_dir.resolve().name,
                config=_nested(config), dir=None if os.environ.get("WANDB_DIR") else str(run_dir),
                reinit="create_new", settings=wandb.Settings(console="off"), **kwargs)
        except Exception as e:  # wandb.Error, network, no API key, ...
            raise XLNetError(f"report_to wandb: could not start a run ({_one_line(e)}); log in with `wandb login` "
                             "or set WANDB_MODE=offline") from None
        # our step, not wandb's call counter, is the x axis: a resumed run logs its steps again without being dropped
        self.run.define_metric("step")
        self.run.define_metric("*", step_metric="step")

    def state(self) -> dict:
        return {"id": self.run.id, "project": self.run.project}

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self.run.log({**scalars, "step": step})

    def close(self, ok: bool) -> None:
        self.run.finish(exit_code=0 if ok else 1)


class _MLflow:
    name = "mlflow"

    def __init__(self, run_dir: Path, config: Any, previous: dict | None) -> None:
        try:
            from mlflow.entities import Param
            from mlflow.tracking import MlflowClient
        except ImportError:
            raise _missing(self.name) from None
        try:
            self.client = MlflowClient()  # MLFLOW_TRACKING_URI, else MLflow's default store
            self.run_id = None
            if previous and previous.get("run_id"):
                with contextlib.suppress(Exception):  # gone, or another store: start a new run
                    self.run_id = self.client.get_run(previous["run_id"]).info.run_id
                    self.client.update_run(self.run_id, status="RUNNING")
            if self.run_id is None:
                name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or "xlnet"
                exp = self.client.get_experiment_by_name(name)
                exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(name)
                run = self.client.create_run(exp_id, run_name=run_dir.resolve().name,
                                             tags={"xlnet.run_dir": str(run_dir.resolve())})
                self.run_id = run.info.run_id
            # parameters cannot change in MLflow: a resumed run adds only the ones it lacks
            have = self.client.get_run(self.run_id).data.params
            params = [Param(k, str(v)[:6000]) for k, v in _flat_params(config).items() if k not in have]
            for i in range(0, len(params), 100):  # the log_batch limit
                self.client.log_batch(self.run_id, params=params[i:i + 100])
        except XLNetError:
            raise
        except Exception as e:
            raise XLNetError(f"report_to mlflow: could not start a run ({_one_line(e)}); check MLFLOW_TRACKING_URI "
                             f"(now {os.environ.get('MLFLOW_TRACKING_URI') or 'unset'})") from None

    def state(self) -> dict:
        from mlflow import get_tracking_uri

        return {"run_id": self.run_id, "tracking_uri": get_tracking_uri()}

    def log(self, step: int, scalars: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in scalars.items()])

    def close(self, ok: bool) -> None:
        self.client.set_terminated(self.run_id, "FINISHED" if ok else "FAILED")

class MetricsLogger:
    """Appends one JSON object per line to ``metrics.jsonl``; mirrors numeric values to the ``report_to`` trackers.

    Trackers are started here (a missing package or a failed start is a one-line XLNetError, before any training).
    """

    def __init__(self, run_dir: str | Path, report_to: str | list[str] = "auto", config: Any = None) -> None:
        run_dir = Path(run_dir)
        self.path = run_dir / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        resumed = self.path.is_file() and self.path.stat().st_size > 0
        names = _names(report_to)
        previous: dict = {}
        state_path = run_dir / TRACKERS_FILE
        if resumed and state_path.is_file():
            with contextlib.suppress(ValueError, OSError):
                previous = json.loads(state_path.read_text(encoding="utf-8"))
        self._trackers: list[Any] = []
        try:
            for name in names:
                if name == "tensorboard":
                    self._trackers.append(_TensorBoard(run_dir, required=True))
                elif name == "auto":
                    try:
                        self._trackers.append(_TensorBoard(run_dir, required=False))
                    except Exception:  # auto: TensorBoard only when it is installed and works
                        pass
                elif name == "wandb":
                    self._trackers.append(_WandB(run_dir, config, previous.get("wandb")))
                elif name == "mlflow":
                    self._trackers.append(_MLflow(run_dir, config, previous.get("mlflow")))
                elif name != "none":
                    raise XLNetError(f"report_to: unknown tracker {name!r} (tensorboard, wandb, mlflow, auto, none)")
        except BaseException:
            self._close_trackers(ok=False)
            raise
        states = {t.name: t.state() for t in self._trackers if hasattr(t, "state")}
        if states:
            from xlnetcli.core.files import atomic_write_json

            atomic_write_json(state_path, states)
        self._f = self.path.open("a", encoding="utf-8")
        self._closed = False
        atexit.register(self._at_exit)  # a run that died with an exception marks its tracker runs failed

    def log(self, step: int, split: str = "train", **metrics: Any) -> None:
        row = {"step": step, "split": split, "time": round(time.time(), 3), **metrics}
        self._f.write(json.dumps(row) + "\n")
        self._f.flush()
        scalars = {f"{split}/{k}": float(v) for k, v in metrics.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
        if not scalars:
            return
        for t in list(self._trackers):
            try:
                t.log(step, scalars)
            except Exception as e:  # a tracker outage must not end a long run: report once, go on without it
                console.print(f"warning: report_to {t.name}: {_one_line(e)}; no longer logging to it "
                              "(metrics.jsonl keeps every row)", markup=False)
                self._trackers.remove(t)

    def _close_trackers(self, ok: bool) -> None:
        for t in self._trackers:
            with contextlib.suppress(Exception):
                t.close(ok)
        self._trackers = []

    def close(self, ok: bool = True) -> None:
        if getattr(self, "_closed", True):
            return
        self._closed = True
        atexit.unregister(self._at_exit)
        self._f.close()
        self._close_trackers(ok)

    def _at_exit(self) -> None:
        self.close(ok=False)


class NullLogger:
    def log(self, *args: Any, **kwargs: Any) -> None:
        return None

    def close(self, *args: Any, **kwargs: Any) -> None:
        return None


def read_metrics(run_dir: str | Path, warn: bool = True) -> list[dict]:
    """The rows of ``metrics.jsonl``. A torn last line (a process killed while appending) is skipped and reported;
    a bad line before the last one means the file was damaged otherwise, and is an error naming the line."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    rows = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict):
                raise ValueError("not an object")
        except ValueError:
            if i == len(lines):
                if warn:
                    console.print(f"[yellow]{path}: skipped a torn last line (a run was killed while logging)[/]")
                break
            raise DataError(f"{path} line {i} is not a JSON object; the file is damaged") from None
        rows.append(row)
    return rows
