"""Which checkpoint a run resumes from: the run folder's config and step folders, refusing to mix runs; the metric
rows a resume drops."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from xlnetcli.checkpoint.folders import step_folders, verify_files
from xlnetcli.config import Config, config_to_dict, load_config
from xlnetcli.core.errors import CheckpointError, ConfigError, XLNetError
from xlnetcli.core.files import atomic_write_text
from xlnetcli.core.shapes import dumps_strict
from xlnetcli.report.metrics_log import read_metrics
from xlnetcli.train.checkpointer import TRAIN_STATE, resumable_steps


def run_config_file(run_dir: str | Path) -> Path | None:
    """The run's config.yaml or, when it was removed, the latest checkpoint's copy (every step folder has one)."""
    run_cfg = Path(run_dir) / "config.yaml"
    if run_cfg.is_file():
        return run_cfg
    return next((p / "config.yaml" for _, p in reversed(step_folders(run_dir)) if (p / "config.yaml").is_file()), None)


def config_diff(a: dict, b: dict, ignore: set[str] | frozenset[str] = frozenset()) -> list[tuple[str, Any, Any]]:
    out = []
    for section in a:
        for key in a[section]:
            dotted = f"{section}.{key}"
            if dotted in ignore:
                continue
            va, vb = a[section].get(key), b.get(section, {}).get(key)
            if va != vb:
                out.append((dotted, va, vb))
    return out


def resume_point(
    cfg: Config,
    run_dir: Path,
    resume: str | None,
    what: str,
    sections: tuple[str, ...],
    mutable: set[str],
    same_config: str,
    changeable: frozenset[str] = frozenset(),
) -> tuple[int, Path] | None:
    """Refuse to mix runs; return the checkpoint to resume from (step, folder), or None to start afresh.

    ``what`` names the run ("pretraining run"); ``sections`` are the config sections that must agree on resume except
    the ``mutable`` keys; ``same_config`` tells the user how to resume with the run's own config; ``changeable``: the
    training settings a resume may change (recorded: ``resume_changes``), named in the refusal of any other key."""
    if run_dir.exists() and not run_dir.is_dir():
        raise XLNetError(f"output path {run_dir} exists and is not a folder")
    run_cfg = run_config_file(run_dir)
    ckpts = resumable_steps(run_dir)
    if run_cfg is None:
        junk = [p for p in run_dir.iterdir() if not p.name.startswith(".")] if run_dir.is_dir() else []
        if junk:
            raise XLNetError(f"output folder {run_dir} is not empty and holds no {what}; choose another --out")
        if resume not in (None, "latest"):
            raise CheckpointError(f"nothing to resume: {run_dir} holds no {what}")
        return None
    if resume is None and not step_folders(run_dir) and (run_dir / "metrics.jsonl").is_file():
        return None  # a run killed before its first checkpoint (it logged, so it is ours): nothing to lose, start again
    try:
        old = load_config(run_cfg, upgrade=True)
    except ConfigError as e:
        raise CheckpointError(f"{run_cfg} is not a valid config ({e}); choose another --out") from None
    if resume is None:
        last = f" (last checkpoint step {ckpts[-1][0]})" if ckpts else ""
        raise XLNetError(
            f"output folder {run_dir} already holds a {what}{last}; pass --resume to continue it "
            "or choose another --out"
        )
    start = _pick_checkpoint(ckpts, resume, run_dir)
    if start is not None and run_cfg == run_dir / "config.yaml":
        _check_run_config_is_the_checkpoints(old, run_cfg, start[1], sections, mutable | changeable, changeable)
    _check_same_config(old, cfg, sections, mutable | changeable, run_dir, same_config, changeable)
    return start


def _check_run_config_is_the_checkpoints(
    old: Config,
    run_cfg: Path,
    step_dir: Path,
    sections: tuple[str, ...],
    mutable: set[str] | frozenset[str],
    changeable: frozenset[str],
) -> None:
    """The run's config.yaml (what a resume without --config loads) must say what the checkpoint resumed from trained
    with (its config.yaml, checked against meta.json's checksum) outside the keys a resume may change: a hand-edited
    run config is refused in one line naming every key it changed, before anything is written."""
    step_cfg = step_dir / "config.yaml"
    if not step_cfg.is_file():
        return  # an older checkpoint without its config: nothing to compare with
    verify_files(step_dir, ["config.yaml"])
    try:
        trained = load_config(step_cfg, upgrade=True)
    except ConfigError as e:
        raise CheckpointError(f"{step_cfg} is not a valid config ({e}); resume from another step folder") from None
    have = {k: v for k, v in config_to_dict(trained).items() if k in sections}
    diff = config_diff(have, config_to_dict(old), mutable)
    if not diff:
        return
    keys = ", ".join(f"{k} {now!r} (checkpoint: {was!r})" for k, was, now in diff)
    can = f"; on resume only {', '.join(sorted(changeable))} may change, with --set KEY=VALUE" if changeable else ""
    raise XLNetError(
        f"{run_cfg} differs from the config of checkpoint {step_dir.name} ({step_cfg}, checksummed) in {keys}: it was "
        f"edited by hand; restore it (cp {step_cfg} {run_cfg}){can}"
    )


def _check_same_config(
    old: Config,
    cfg: Config,
    sections: tuple[str, ...],
    mutable: set[str] | frozenset[str],
    run_dir: Path,
    same_config: str,
    changeable: frozenset[str] = frozenset(),
) -> None:
    """Refuse to resume the run in ``run_dir`` (config ``old``) with a config differing in ``sections`` outside the
    ``mutable`` keys; the error names the first difference, and the keys a resume may change."""
    have = {k: v for k, v in config_to_dict(old).items() if k in sections}
    diff = config_diff(have, config_to_dict(cfg), mutable)
    if diff:
        key, was, now = diff[0]
        more = f" (and {len(diff) - 1} more)" if len(diff) > 1 else ""
        can = (
            f"; a resume may change only {', '.join(sorted(changeable))} (and how often it logs/saves)"
            if changeable
            else ""
        )
        raise XLNetError(
            f"output folder {run_dir} holds a run with {key}={was!r} but this config has "
            f"{key}={now!r}{more}: {key} cannot change when resuming{can}; {same_config}"
        )


def resume_changes(step_dir: Path, cfg: Config, changeable: frozenset[str]) -> list[tuple[str, Any, Any]]:
    """The ``changeable`` settings ``cfg`` changes against the checkpoint in ``step_dir`` (its config.yaml: what the
    run trained with up to that step), as (key, was, now), sorted by key; [] for an exact resume. A checkpoint without
    a readable config.yaml (an older one) is compared with nothing: []."""
    path = step_dir / "config.yaml"
    if not path.is_file():
        return []
    try:
        old = config_to_dict(load_config(path, upgrade=True))
    except ConfigError as e:
        raise CheckpointError(f"{path} is not a valid config ({e}); resume from another step folder") from None
    new = config_to_dict(cfg)
    out = []
    for dotted in sorted(changeable):
        section, key = dotted.split(".")
        was, now = old.get(section, {}).get(key), new[section][key]
        if was != now:
            out.append((dotted, was, now))
    return out


def changes_text(step: int, changes: list[tuple[str, Any, Any]]) -> str:
    """'at step 30: train.lr 0.001 -> 0.0001, train.max_steps 40 -> 80' (the header's and metrics.jsonl's words)."""
    return f"at step {step}: " + ", ".join(f"{k} {was} -> {now}" for k, was, now in changes)


def _pick_checkpoint(ckpts: list[tuple[int, Path]], resume: str, run_dir: Path) -> tuple[int, Path] | None:
    """The checkpoint ``resume`` ("latest" or a step number) names among the run's resumable ``ckpts`` (None:
    "latest" of a run killed before its first checkpoint)."""
    if not ckpts:
        weights_only = step_folders(run_dir)
        if weights_only:
            raise CheckpointError(
                f"{weights_only[-1][1]} has weights but no {TRAIN_STATE}, so the run cannot continue exactly "
                "(restore the file, or use those weights elsewhere and train in another --out)"
            )
        if resume == "latest":
            return None  # killed before the first checkpoint: start again in the same folder
        raise CheckpointError(f"no checkpoint step {resume} in {run_dir}: it holds no checkpoint yet")
    if resume == "latest":
        return ckpts[-1]
    try:
        want = int(resume)
    except ValueError:
        raise XLNetError(f"--resume takes 'latest' or a step number, got {resume!r}") from None
    for step, path in ckpts:
        if step == want:
            return step, path
    have_steps = ", ".join(str(s) for s, _ in ckpts)
    raise CheckpointError(f"no checkpoint step {want} in {run_dir} (have: {have_steps})")


def truncate_metrics(run_dir: Path, step: int) -> None:
    """On resume drop the metric rows logged after the checkpoint (they will be logged again, identically)."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return
    rows = [r for r in read_metrics(run_dir) if r.get("step", 0) <= step]
    atomic_write_text(path, "".join(dumps_strict(r) + "\n" for r in rows))
