"""Issue #22, class 1: file outputs checked against inputs.

Every file a command writes (`eval --output/--predict`, `probe --output`, `plot --out`; folder outputs were already
checked) is refused when it is, or resolves to through a symbolic or hard link, an input file, a file of an input
checkpoint, records or step folder, or one of a run folder's own files; nothing is written and every input stays
byte-identical. New files beside a run's own (`eval RUN --output RUN/valid.json`, `plot`'s curves.png) are fine and
are written temp-then-rename. `plot --out` honours the suffix (pdf, svg, ...) and refuses one it cannot draw.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from clitools import FAST_PRETRAIN, TRAIN_TSV, VALID_TSV, assert_one_line_error, run_main
from conftest import tree_digest
from finetunetools import ft_cfg, random_init_checkpoint

pytestmark = pytest.mark.slow  # the module finetunes a small model once (~10 s on a shared 2-core CPU)


@pytest.fixture(scope="module")
def world(builds, tmp_path_factory) -> dict[str, Path]:
    """init/ (a pretrained step folder), ft/ (a finetuned run), train/valid TSVs, records (shared), a probe JSON."""
    from xlnetcli.train.finetune import FinetuneArgs, finetune

    root = random_init_checkpoint(builds, tmp_path_factory.mktemp("outputs"))
    (root / "train.tsv").write_text("\n".join(TRAIN_TSV.read_text().splitlines()[:41]) + "\n")
    (root / "valid.tsv").write_text("\n".join(VALID_TSV.read_text().splitlines()[:21]) + "\n")
    cfg = ft_cfg("finetune.max_steps=2", "finetune.eval_every=2")
    finetune(
        cfg,
        FinetuneArgs("classification", root / "train.tsv", root / "valid.tsv", root / "init", root / "ft", quiet=True),
    )
    (root / "probe.json").write_text('{"results": {}}\n')
    (root / "links").mkdir()
    step = next((root / "ft").glob("step_*"))
    return {
        "root": root,
        "init": root / "init",
        "ft": root / "ft",
        "step": step,
        "train": root / "train.tsv",
        "valid": root / "valid.tsv",
        "rec": builds.pipeline(FAST_PRETRAIN).records,
        "probe": root / "probe.json",
        "links": root / "links",
    }


@pytest.fixture(autouse=True)
def _no_progress(monkeypatch):
    monkeypatch.setenv("XLNET_NO_PROGRESS", "1")


def _link(w: dict, name: str, target: Path, hard: bool = False) -> Path:
    p = w["links"] / name
    if not p.exists() and not p.is_symlink():
        os.link(target, p) if hard else p.symlink_to(target)
    return p


def _cases(w: dict) -> dict[str, tuple[list, str]]:
    """name -> (arguments, text the one-line error must hold)."""
    ft, step, init, train, valid, rec = w["ft"], w["step"], w["init"], w["train"], w["valid"], w["rec"]
    ev = ["eval", ft, "--file", valid]
    pr = ["probe", ft, "--train", train, "--valid", valid]
    return {
        "eval-output-is-file": ([*ev, "--output", valid], "is the input"),
        "eval-predict-is-file": ([*ev, "--predict", valid], "is the input"),
        "eval-output-best-weights": ([*ev, "--output", step / "model.safetensors"], "lies inside the input"),
        "eval-output-step-meta": ([*ev, "--output", step / "meta.json"], "lies inside the input"),
        "eval-output-run-results": ([*ev, "--output", ft / "results.json"], "is the input"),
        "eval-output-run-metrics": ([*ev, "--output", ft / "metrics.jsonl"], "is the input"),
        "eval-output-run-config": ([*ev, "--output", ft / "config.yaml"], "is the input"),
        "eval-predict-run-config": ([*ev, "--predict", ft / "config.yaml"], "is the input"),
        "eval-output-symlink-to-file": ([*ev, "--output", _link(w, "v.json", valid)], "is the input"),
        "eval-output-symlink-to-weights": (
            [*ev, "--output", _link(w, "w.json", step / "model.safetensors")],
            "lies inside the input",
        ),
        "eval-output-hardlink-to-file": ([*ev, "--output", _link(w, "hv.json", valid, hard=True)], "is the input"),
        "eval-output-hardlink-into-step": (
            [*ev, "--output", _link(w, "hm.json", step / "meta.json", hard=True)],
            "is a hard link to a file of the input",
        ),
        "eval-output-equals-predict": (
            [*ev, "--output", w["root"] / "same.json", "--predict", w["root"] / "same.json"],
            "name the same file",
        ),
        "eval-output-is-step-folder": ([*ev, "--output", step], "directory"),
        "eval-step-output-inside-step": (["eval", step, "--file", valid, "--output", step / "x.json"], "lies inside"),
        "eval-pretrained-output-in-records": (
            ["eval", init, "--data", rec, "--output", rec / "meta.json"],
            "lies inside the input",
        ),
        "eval-pretrained-output-is-config": (["eval", init, "--data", rec, "--output", init / "config.yaml"], "lies"),
        "probe-output-is-train": ([*pr, "--output", train], "is the input"),
        "probe-output-is-valid": ([*pr, "--output", valid], "is the input"),
        "probe-output-step-weights": ([*pr, "--output", step / "model.safetensors"], "lies inside the input"),
        "probe-output-symlink-to-train": ([*pr, "--output", _link(w, "t.json", train)], "is the input"),
        "plot-out-metrics": (["plot", ft, "--out", ft / "metrics.jsonl"], "is the input"),
        "plot-out-config": (["plot", ft, "--out", ft / "config.yaml"], "is the input"),
        "plot-out-inside-step": (["plot", ft, "--out", step / "curves.png"], "lies inside the input"),
        "plot-out-symlink-to-metrics": (["plot", ft, "--out", _link(w, "m.png", ft / "metrics.jsonl")], "is the"),
        "plot-out-probe-json": (["plot", w["probe"], "--out", w["probe"]], "is the input"),
        "plot-out-unknown-suffix": (["plot", ft, "--out", w["root"] / "c.xyz"], "cannot draw a .xyz file"),
        "export-out-inside-run": (["export", ft, "--out", ft / "hf"], "lies inside the input"),
        "pretrain-out-inside-init": (
            ["pretrain", "--data", rec, "--init", init, "--out", init / "run"],
            "lies inside the input",
        ),
    }


CASES = [
    "eval-output-is-file",
    "eval-predict-is-file",
    "eval-output-best-weights",
    "eval-output-step-meta",
    "eval-output-run-results",
    "eval-output-run-metrics",
    "eval-output-run-config",
    "eval-predict-run-config",
    "eval-output-symlink-to-file",
    "eval-output-symlink-to-weights",
    "eval-output-hardlink-to-file",
    "eval-output-hardlink-into-step",
    "eval-output-equals-predict",
    "eval-output-is-step-folder",
    "eval-step-output-inside-step",
    "eval-pretrained-output-in-records",
    "eval-pretrained-output-is-config",
    "probe-output-is-train",
    "probe-output-is-valid",
    "probe-output-step-weights",
    "probe-output-symlink-to-train",
    "plot-out-metrics",
    "plot-out-config",
    "plot-out-inside-step",
    "plot-out-symlink-to-metrics",
    "plot-out-probe-json",
    "plot-out-unknown-suffix",
    "export-out-inside-run",
    "pretrain-out-inside-init",
]


@pytest.mark.parametrize("name", CASES)
def test_an_output_that_is_an_input_is_refused_and_nothing_changes(world, name, capsys):
    args, needle = _cases(world)[name]
    before = {k: tree_digest(world[k]) for k in ("root", "rec")}
    code, _, err = run_main(capsys, *args)
    assert_one_line_error(code, err, needle)
    assert {k: tree_digest(world[k]) for k in ("root", "rec")} == before  # inputs byte-identical, nothing added


def test_every_case_is_listed(world):
    assert sorted(_cases(world)) == sorted(CASES)


def test_results_beside_a_runs_own_files_are_written_and_rewritten(world, capsys):
    """The documented `xlnet eval RUN --file F --output RUN/valid.json` (and probe's) work, also a second time."""
    ft, out = world["ft"], world["ft"] / "valid.json"
    try:
        for _ in range(2):
            code, _, err = run_main(capsys, "eval", ft, "--file", world["valid"], "--output", out)
            assert code == 0, err
            assert '"metrics"' in out.read_text()
        assert not [p.name for p in ft.iterdir() if p.name.startswith(".")]  # temp-then-rename: no leftovers
    finally:
        out.unlink(missing_ok=True)


def test_plot_honours_the_suffix_and_rewrites_its_own_image(world, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    ft = world["ft"]
    magic = {"a.png": b"\x89PNG", "a.pdf": b"%PDF", "a.svg": b"<?xml", "noext": b"\x89PNG"}
    for name, head in magic.items():
        code, _, err = run_main(capsys, "plot", ft, "--out", tmp_path / name)
        assert code == 0, err
        assert (tmp_path / name).read_bytes().startswith(head), name
    try:
        for _ in range(2):  # the default, RUN/curves.png, beside the run's files: written, then replaced
            code, _, err = run_main(capsys, "plot", ft)
            assert code == 0, err
            assert (ft / "curves.png").read_bytes().startswith(b"\x89PNG")
    finally:
        (ft / "curves.png").unlink(missing_ok=True)
    shutil.rmtree(tmp_path)
