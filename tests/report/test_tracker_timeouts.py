"""Issue 22, class 7: a tracker whose server does not answer is given up within seconds, in one line naming the whole
URL, before training starts (not minutes of MLflow's retries ending in a message cut mid-URL)."""

from __future__ import annotations

import http.server
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from clitools import FAST_PRETRAIN, TINY, assert_one_line_error, run_main, set_args

from xlnetcli.core.errors import XLNetError
from xlnetcli.report.trackers import one_line, probe_server, require_trackers


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A port that accepts connections and never answers."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    yield f"http://127.0.0.1:{s.getsockname()[1]}"
    s.close()


@pytest.fixture
def answering_server() -> Iterator[str]:
    """A server that answers every request with 404 (as an MLflow server does for its root)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_error(404)

        def log_message(self, *args) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_mlflow_with_nothing_listening_is_refused_within_seconds(monkeypatch):
    url = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
    start = time.monotonic()
    pattern = "no server answers at " + url.replace(".", r"\.") + r" \(MLFLOW_TRACKING_URI\)"
    with pytest.raises(XLNetError, match=pattern):
        require_trackers("mlflow")
    assert time.monotonic() - start < 10


def test_a_server_that_accepts_but_never_answers_is_given_up(silent_server):
    start = time.monotonic()
    with pytest.raises(XLNetError, match="no answer; start it"):
        probe_server("mlflow", silent_server, "MLFLOW_TRACKING_URI", timeout=1.0)
    assert time.monotonic() - start < 5


@pytest.mark.slow  # imports mlflow (~5 s)
def test_a_server_that_answers_passes_even_with_an_error_status(answering_server, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", answering_server)
    require_trackers("mlflow")


def test_wandb_with_a_base_url_that_does_not_answer_is_refused(monkeypatch):
    pytest.importorskip("wandb")
    url = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("WANDB_BASE_URL", url)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    with pytest.raises(XLNetError, match="report_to wandb: no server answers"):
        require_trackers("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")  # offline: no server needed
    require_trackers("wandb")


def test_file_stores_and_other_trackers_are_not_probed(monkeypatch, tmp_path):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tmp_path.as_uri())
    require_trackers("mlflow")
    require_trackers("none")


def test_long_messages_are_cut_between_words_never_inside_a_url():
    url = "http://tracking.example.com:5000/api/2.0/mlflow/experiments/get-by-name?experiment_name=xlnet"
    text = one_line(RuntimeError("x " * 140 + url + " failed"))
    assert text.endswith(" ...") and (url in text or "http" not in text)


@pytest.mark.slow  # builds records
def test_pretrain_gives_up_before_training_in_one_line(builds, monkeypatch, tmp_path, capsys):
    records = builds.pipeline(FAST_PRETRAIN).records
    url = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
    start = time.monotonic()
    args = ["--config", TINY, *set_args([*FAST_PRETRAIN, "train.max_steps=2", "train.report_to=mlflow"])]
    code, _, err = run_main(capsys, "pretrain", *args, "--data", records, "--out", tmp_path / "run")
    assert_one_line_error(code, err, url, "MLFLOW_TRACKING_URI")
    assert time.monotonic() - start < 30
    assert not (tmp_path / "run" / "step_0000002").exists()
