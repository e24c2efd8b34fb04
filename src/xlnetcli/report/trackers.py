"""Tracker backends for run logs: TensorBoard, Weights & Biases and MLflow, behind one small interface
(``log(step, scalars)``, ``close(ok)``, and ``state()`` for the ids a resumed run continues).

The optional packages (tensorboard, wandb, mlflow) are imported only when their tracker is asked for: they are heavy
and each is an extra. See metrics_log.py for ``report_to`` and the environment variables that apply.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from xlnetcli.config import config_to_dict
from xlnetcli.core.errors import XLNetError
from xlnetcli.core.files import atomic_write_json

TRACKERS_FILE = "trackers.json"


def one_line(e: BaseException, limit: int = 300) -> str:
    """The message of ``e`` on one line, cut at a word boundary (never inside a URL) past ``limit`` characters."""
    text = " ".join(str(e).split()) or type(e).__name__
    if len(text) <= limit:
        return text
    cut = text.rfind(" ", 0, limit)
    return text[: cut if cut > limit // 2 else limit] + " ..."


def _flat_params(config: Any) -> dict[str, Any]:
    """{'section.key': value} of a Config (or a nested dict)."""
    if config is None:
        return {}
    if not isinstance(config, dict):
        config = config_to_dict(config)
    return {f"{s}.{k}": v for s, values in config.items() for k, v in (values or {}).items()}


def _tracker_names(report_to: str | list[str]) -> list[str]:
    items = [report_to] if isinstance(report_to, str) else list(report_to)
    return [n.strip().lower() for s in items for n in s.split(",") if n.strip()]


_EXTRAS = {"tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb"), "mlflow": ("mlflow", "mlflow")}


def _missing(name: str) -> XLNetError:
    package, extra = _EXTRAS[name]
    return XLNetError(f"report_to {name} needs the {package} package: pip install 'xlnetcli[{extra}]'")


# Seconds a tracker's server gets to answer before a run starts: the clients' own defaults (MLflow: 7 retries with
# backoff, 120 s a request; wandb: 90 s) would hold a run for minutes on a server that is down.
PROBE_TIMEOUT_S = 5.0


def _tracker_url(name: str) -> tuple[str, str] | None:
    """(URL, where it came from) of the server a tracker talks to, when it talks to one over HTTP."""
    if name == "mlflow":
        uri = os.environ.get("MLFLOW_TRACKING_URI", "")
        return (uri, "MLFLOW_TRACKING_URI") if uri.lower().startswith(("http://", "https://")) else None
    if name == "wandb" and os.environ.get("WANDB_MODE", "").lower() not in ("offline", "disabled", "dryrun"):
        url = os.environ.get("WANDB_BASE_URL", "")
        return (url, "WANDB_BASE_URL") if url.lower().startswith(("http://", "https://")) else None
    return None


def probe_server(name: str, url: str, source: str, timeout: float = PROBE_TIMEOUT_S) -> None:
    """One HTTP request to ``url`` within ``timeout`` seconds: any answer (even an error status) means a server is
    there; no answer (refused, unreachable, silent) is one line naming the whole URL and what to do."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="GET"), timeout=timeout):
            return
    except urllib.error.HTTPError:
        return  # a server answered (401, 404, ...): the client reports anything else itself
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        why = (
            "no answer"
            if isinstance(reason, TimeoutError)
            else one_line(reason if isinstance(reason, BaseException) else e, 120)
        )
    raise XLNetError(
        f"report_to {name}: no server answers at {url} ({source}) within {timeout:g} s: {why}; start it, fix "
        f"{source}, or leave {name} out of report_to"
    )


def require_trackers(report_to: str | list[str]) -> None:
    """Fail early, in one line, when a tracker of ``report_to`` is not installed (naming the extra to install) or
    its server does not answer within seconds (naming the URL): before any training."""
    for name in _tracker_names(report_to):
        if name in ("mlflow", "wandb") and (target := _tracker_url(name)):
            probe_server(name, *target)
        try:
            if name == "tensorboard":
                import torch.utils.tensorboard  # noqa: F401, PLC0415 - optional extra (needs the tensorboard package)
            elif name == "wandb":
                import wandb  # noqa: F401, PLC0415 - heavy, optional extra
            elif name == "mlflow":
                import mlflow.tracking  # noqa: F401, PLC0415 - heavy, optional extra
        except ImportError:
            raise _missing(name) from None


def _nested(config: Any) -> dict[str, Any]:
    if config is None or isinstance(config, dict):
        return dict(config or {})
    return config_to_dict(config)


class _TensorBoard:
    name = "tensorboard"

    def __init__(self, run_dir: Path, required: bool) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter  # noqa: PLC0415 - optional extra (tensorboard)
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
            import wandb  # noqa: PLC0415 - heavy, optional extra
        except ImportError:
            raise _missing(self.name) from None
        kwargs: dict[str, Any] = {}
        if previous and previous.get("id"):
            kwargs.update(id=previous["id"], resume="allow")
        try:
            self.run = wandb.init(
                project=os.environ.get("WANDB_PROJECT") or "xlnet",
                name=run_dir.resolve().name,
                config=_nested(config),
                dir=None if os.environ.get("WANDB_DIR") else str(run_dir),
                reinit="create_new",
                settings=wandb.Settings(console="off"),
                **kwargs,
            )
        except Exception as e:  # noqa: BLE001 - any failure (wandb.Error, network, no API key, ...) -> one line
            raise XLNetError(
                f"report_to wandb: could not start a run ({one_line(e)}); log in with `wandb login` "
                "or set WANDB_MODE=offline"
            ) from None
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
            from mlflow.entities import Param  # noqa: PLC0415 - heavy, optional extra
            from mlflow.tracking import MlflowClient  # noqa: PLC0415 - heavy, optional extra
        except ImportError:
            raise _missing(self.name) from None
        try:
            self.client = MlflowClient()  # MLFLOW_TRACKING_URI, else MLflow's default store
            run_id: str | None = None
            if previous and previous.get("run_id"):
                with contextlib.suppress(Exception):  # gone, or another store: start a new run
                    run_id = self.client.get_run(previous["run_id"]).info.run_id
                    self.client.update_run(run_id, status="RUNNING")
            if run_id is None:
                name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or "xlnet"
                exp = self.client.get_experiment_by_name(name)
                exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(name)
                run = self.client.create_run(
                    exp_id, run_name=run_dir.resolve().name, tags={"xlnet.run_dir": str(run_dir.resolve())}
                )
                run_id = run.info.run_id
            self.run_id: str = run_id
            # parameters cannot change in MLflow: a resumed run adds only the ones it lacks
            have = self.client.get_run(self.run_id).data.params
            params = [Param(k, str(v)[:6000]) for k, v in _flat_params(config).items() if k not in have]
            for i in range(0, len(params), 100):  # the log_batch limit
                self.client.log_batch(self.run_id, params=params[i : i + 100])
        except XLNetError:
            raise
        except Exception as e:  # noqa: BLE001 - any failure (store, network, permissions, ...) -> one line
            raise XLNetError(
                f"report_to mlflow: could not start a run ({one_line(e)}); check MLFLOW_TRACKING_URI "
                f"(now {os.environ.get('MLFLOW_TRACKING_URI') or 'unset'})"
            ) from None

    def state(self) -> dict:
        from mlflow import get_tracking_uri  # noqa: PLC0415 - heavy, optional extra

        return {"run_id": self.run_id, "tracking_uri": get_tracking_uri()}

    def log(self, step: int, scalars: dict[str, float]) -> None:
        from mlflow.entities import Metric  # noqa: PLC0415 - heavy, optional extra

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in scalars.items()])

    def close(self, ok: bool) -> None:
        self.client.set_terminated(self.run_id, "FINISHED" if ok else "FAILED")


def start_trackers(run_dir: Path, report_to: str | list[str], config: Any, resumed: bool) -> list[Any]:
    """The trackers of ``report_to``, started (a missing package or a failed start is a one-line XLNetError; those
    already started are closed). A ``resumed`` run continues the wandb / MLflow runs named in RUN/trackers.json, which
    is written with the ids of the runs now open."""
    previous: dict = {}
    state_path = run_dir / TRACKERS_FILE
    if resumed and state_path.is_file():
        with contextlib.suppress(ValueError, OSError, RecursionError):
            loaded = json.loads(state_path.read_text(encoding="utf-8"))
            # of the wrong shape: start new tracker runs (the ids only continue a run, metrics.jsonl is the record)
            previous = {k: v for k, v in loaded.items() if isinstance(v, dict)} if isinstance(loaded, dict) else {}
    trackers: list[Any] = []
    try:
        for name in _tracker_names(report_to):
            if name == "tensorboard":
                trackers.append(_TensorBoard(run_dir, required=True))
            elif name == "auto":
                with contextlib.suppress(Exception):  # auto: TensorBoard only when it is installed and works
                    trackers.append(_TensorBoard(run_dir, required=False))
            elif name == "wandb":
                trackers.append(_WandB(run_dir, config, previous.get("wandb")))
            elif name == "mlflow":
                trackers.append(_MLflow(run_dir, config, previous.get("mlflow")))
            elif name != "none":
                raise XLNetError(f"report_to: unknown tracker {name!r} (tensorboard, wandb, mlflow, auto, none)")
    except BaseException:
        close_trackers(trackers, ok=False)
        raise
    states = {t.name: t.state() for t in trackers if hasattr(t, "state")}
    if states:
        atomic_write_json(state_path, states)
    return trackers


def close_trackers(trackers: list[Any], ok: bool) -> None:
    """Close every tracker (its run marked finished or failed), ignoring errors: metrics.jsonl is the record."""
    for t in trackers:
        with contextlib.suppress(Exception):
            t.close(ok)
