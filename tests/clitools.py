"""Shared helpers for CLI tests: run `xlnet` in-process and check the one-line error contract."""

from __future__ import annotations

import pytest

from xlnetcli.cli import main


def run_main(capsys, *args) -> tuple[int, str, str]:
    """Run ``xlnet ARGS`` through the real entry point; returns (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as e:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    return int(e.value.code or 0), out, err


def assert_one_line_error(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("xlnet: error:"), err
    assert "Traceback" not in err
    for n in needles:
        assert n in err, err
