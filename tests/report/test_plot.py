import json

import pytest

from xlnetcli.cli import main
from xlnetcli.core.errors import DataError
from xlnetcli.report.plot import plot_run
from xlnetcli.train.resume import truncate_metrics


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


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ('{"split": "train", "loss": 1.0}', "line 4 has no step (found none)"),
        ('{"step": "3", "split": "train", "loss": 1.0}', 'line 4 has no step (found a string "3")'),
        ('{"step": -1, "split": "train", "loss": 1.0}', "line 4 has no step (found an integer -1)"),
        ("[" * 100_000 + "]" * 100_000, "line 4 is nested too deeply to read"),
    ],
)
def test_a_bad_metrics_row_is_one_line_naming_it_in_plot_and_resume(tmp_path, capsys, line, needle):
    """Issue 35 (a round-3 case, reopened): a row without a step was a KeyError traceback in `xlnet plot`, a deeply
    nested one a RecursionError (also on --resume, which rewrites metrics.jsonl): the file's line is named, nothing
    is written and the file is left as it was."""
    _write_metrics(tmp_path / "run")
    path = tmp_path / "run" / "metrics.jsonl"
    rows = path.read_text().splitlines()
    path.write_text("\n".join([*rows[:3], line, *rows[3:]]) + "\n")
    before = path.read_bytes()
    with pytest.raises(SystemExit) as e:
        main(["plot", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("xlnet: error:") and err.count("\n") == 1, err
    assert f"metrics.jsonl {needle}" in err and "Traceback" not in err
    with pytest.raises(DataError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        truncate_metrics(tmp_path / "run", 5)
    assert path.read_bytes() == before and sorted(p.name for p in path.parent.iterdir()) == ["metrics.jsonl"]
