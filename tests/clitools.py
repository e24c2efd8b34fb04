"""Shared helpers for tests: run `xlnet` in-process, check the one-line error contract, kill-and-resume sweeps
(the shared tokenizer, shards and records are conftest.py's ``builds`` fixture)."""

from __future__ import annotations

from pathlib import Path

import pytest

from xlnetcli.cli import main
from xlnetcli.config import Config, load_config

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny.yaml"
SAMPLE = ROOT / "tests" / "data" / "sample.txt"


def kill_and_resume(start, kills: int, before_kill) -> int:
    """Fault injection: ``start()`` launches the command (a resuming one); ``kills`` times, ``before_kill(proc, k)``
    waits for the moment to strike and the process gets SIGKILL if still running; then one run goes to the end and
    must exit 0. Returns the number of kills that landed (a run that finished first ends the loop early)."""
    import os
    import signal

    landed = 0
    while True:
        proc = start()
        if landed < kills:
            before_kill(proc, landed)
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
                landed += 1
                continue
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err.decode() if isinstance(err, bytes) else err
        return landed


def flip_bit(path: Path, offset_from_end: int) -> None:
    """Corrupt ``path`` in place: flip the lowest bit of the byte ``offset_from_end`` bytes before its end."""
    data = bytearray(path.read_bytes())
    data[-offset_from_end] ^= 1
    path.write_bytes(bytes(data))


def settings_config(section: str, **keys) -> Config:
    """The default config with some keys of one section set: settings_config("tokenizer", vocab_size=2000)."""
    return load_config(None, [f"{section}.{k}={v}" for k, v in keys.items()])


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
