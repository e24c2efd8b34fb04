import json

import pytest

from xlnetcli.cli import main
from xlnetcli.report.plot import plot_run


def _write_metrics(run):
    run.mkdir()
    rows = [
        {"step": s, "split": "train", "loss": 9.0 - s / 10, "lr": 1e-3 * min(1, s / 5), "tokens_per_s": 1000 + s}
        for s in range(1, 30)
    ]
    rows += [{"step": s, "split": "eval", "loss": 8.5 - s / 12, "accuracy": 0.1 + s / 100} for s in (10, 20, 29)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    _write_metrics(tmp_path / "run")
    out = plot_run(tmp_path / "run")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.stat().st_size > 10_000


def test_plot_without_metrics_is_a_one_line_error(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit) as e:
        main(["plot", str(tmp_path / "empty")])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "no metrics" in err and err.count("\n") == 1
