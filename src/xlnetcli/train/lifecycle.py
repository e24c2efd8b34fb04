"""Going back to an earlier checkpoint of a pretraining run, explicitly, so that the run stays one history:

- ``--resume N --branch NEWRUN``: a new run folder continues from step N of the run (which is left as it is). NEWRUN is
  made whole before any training (a temporary folder renamed): its config.yaml (the checkpoint's), step folder N
  (hard links, or a copy across file systems) and the run's metric rows up to N, with a "branch" row saying where it
  came from; from then on it is an ordinary run: ``--out NEWRUN --resume`` continues it after any interruption.
- ``--resume N --rewind``: in place. The step folders after N and the metric rows after N are moved aside into
  ``RUN/rewound_<last>_to_<N>/``, so the run folder is the run as it stood at step N (a later ``--resume`` continues
  from there, never from the old later steps).

Without either, ``--resume N`` is refused when the run has step folders after N: training on from N would leave the old
later checkpoints beside the new ones (and the next ``--resume`` would take the old last one).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from xlnetcli.checkpoint.folders import step_dir_name, step_folders
from xlnetcli.core.errors import XLNetError
from xlnetcli.core.files import atomic_write_text
from xlnetcli.core.shapes import dumps_strict
from xlnetcli.report.metrics_log import read_metrics
from xlnetcli.train.resume import run_config_file


def later_steps(run_dir: Path, step: int) -> list[Path]:
    """The run's step folders after ``step`` (resumable or not), oldest first."""
    return [p for s, p in step_folders(run_dir) if s > step]


def refuse_later_steps(run_dir: Path, step: int, later: list[Path]) -> None:
    """``--resume N`` without --rewind or --branch on a run with step folders after N: one line, the two ways on."""
    names = ", ".join(p.name for p in later[:3]) + (f" and {len(later) - 3} more" if len(later) > 3 else "")
    raise XLNetError(
        f"{run_dir} has checkpoints after step {step} ({names}): training on from step {step} in place would leave "
        f"them beside the new ones; continue from step {step} in a new run folder with --branch NEWRUN (this run "
        f"kept as it is), or pass --rewind to move the later steps and metric rows aside, or --resume alone for the "
        "latest"
    )


def _aside_dir(run_dir: Path, last: int, step: int) -> Path:
    base = run_dir / f"rewound_{last:07d}_to_{step:07d}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}_{n}")
    return path


def rewind(run_dir: Path, step: int) -> Path | None:
    """Move the step folders after ``step`` and the metric rows after it aside (``RUN/rewound_<last>_to_<step>/``);
    returns that folder (None: nothing after ``step``). Each move is a rename; an interruption leaves the run a
    consistent prefix of its old history, and the same command finishes the rewind."""
    later = later_steps(run_dir, step)
    rows = read_metrics(run_dir, warn=False)
    after = [r for r in rows if r.get("step", 0) > step]
    if not later and not after:
        return None
    last = max([int(p.name.split("_")[1]) for p in later] + [r["step"] for r in after])
    aside = _aside_dir(run_dir, last, step)
    aside.mkdir()
    if after:
        atomic_write_text(aside / "metrics.jsonl", "".join(dumps_strict(r) + "\n" for r in after))
    for p in reversed(later):  # the newest first: an interrupted rewind leaves an older consistent history
        p.rename(aside / p.name)
    kept = [r for r in rows if r.get("step", 0) <= step]
    atomic_write_text(run_dir / "metrics.jsonl", "".join(dumps_strict(r) + "\n" for r in kept))
    return aside


def _link_tree(src: Path, dst: Path) -> None:
    """``dst`` a copy of the folder ``src`` made of hard links (checkpoint files are never changed in place, only
    replaced or removed), copied where links cannot be made (another file system)."""

    def link_or_copy(a: str, b: str) -> None:
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)

    shutil.copytree(src, dst, copy_function=link_or_copy)


def make_branch(run_dir: Path, start: tuple[int, Path], branch: Path) -> None:
    """Create ``branch``: a run folder at step ``start`` of the run in ``run_dir`` (see the module docstring). The
    caller holds ``branch``'s lock and has checked the run and the checkpoint (pretrain.check_run_dir)."""
    step, folder = start
    if branch.exists() and (not branch.is_dir() or any(branch.iterdir())):
        what = "already holds a run" if run_config_file(branch) is not None else "exists and is not an empty folder"
        way = f"continue that run with --out {branch} --resume, or " if run_config_file(branch) is not None else ""
        raise XLNetError(f"--branch {branch} {what}; {way}choose another --branch folder")
    tmp = branch.parent / f".{branch.name}.branch.tmp"
    shutil.rmtree(tmp, ignore_errors=True)  # a branch killed while it was being made
    tmp.mkdir(parents=True)
    try:
        _link_tree(folder, tmp / step_dir_name(step))
        config = folder / "config.yaml" if (folder / "config.yaml").is_file() else run_config_file(run_dir)
        assert config is not None  # check_run_dir found the run by its config
        shutil.copy2(config, tmp / "config.yaml")
        rows = [r for r in read_metrics(run_dir, warn=False) if r.get("step", 0) <= step]
        rows.append(
            {
                "step": step,
                "split": "branch",
                "time": round(time.time(), 3),
                "from": str(run_dir.resolve()),
                "checkpoint": str(folder.resolve()),
            }
        )
        atomic_write_text(tmp / "metrics.jsonl", "".join(dumps_strict(r) + "\n" for r in rows))
        if branch.is_dir():
            branch.rmdir()  # empty (its lock is beside it, not in it)
        tmp.rename(branch)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
