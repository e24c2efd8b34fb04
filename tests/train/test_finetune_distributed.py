"""Finetuning and `xlnet eval` on several processes (torchrun, 2 gloo processes on the CPU).

Each rank takes ``[rank::2]`` of a step's examples (the example order is global: the same on every rank) and DDP
averages the two ranks' gradients, so the maths of a step is one process's with the same global batch (micro 4 x
accumulation 2 there, micro 4 x 1 on each rank here): only the order of float additions differs. Dropout is off in
these runs: each process draws its own masks, which no other layout can reproduce. Validation and `xlnet eval` run
batch b on rank b % 2 (the same batches as one process) and rank 0 scores.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from clitools import BIN, TRAIN_TSV, VALID_TSV, child_env, run_main, step_weights, train_losses
from finetunetools import ft_cfg, pydocs_rows, random_init_checkpoint

from xlnetcli.config import dump_config
from xlnetcli.report.metrics_log import read_metrics
from xlnetcli.train.checkpointer import load_train_state
from xlnetcli.train.finetune import partial_dir

pytestmark = pytest.mark.slow  # torchrun: ~5 s to start 2 processes, then a few seconds of training

torch.set_num_threads(1)  # the same as the subprocesses (OMP_NUM_THREADS=1)

K, SPLIT = 6, 3  # steps of a run; the step a 2-process run is stopped after
SETS = [
    "finetune.max_seq_length=32",
    "finetune.batch_size=8",
    "finetune.micro_batch_size=4",
    f"finetune.max_steps={K}",
    "finetune.eval_every=3",
    "finetune.warmup_ratio=0",
    "finetune.log_every=1",
    "finetune.dropout=0.0",
]
# 2 processes vs 1 on the same global batch: DDP's all-reduce averages two ranks' gradients where one process
# accumulates two micro-batches; the sums run in another order, which moves losses and weights by ~1e-7 after 6 AdamW
# steps (the pretraining tests' figure). Tolerance 1e-5, as there.
TOL = 1e-5

# Rank 1 alone gets SIGTERM during step SPLIT (what a scheduler sends): every rank stops after that step with a
# checkpoint (exit 75), as a preempted torchrun job does.
_STOPPED = """
import os, signal, sys
from xlnetcli.cli import main
from xlnetcli.train.finetune_workload import FinetuneWorkload

real = FinetuneWorkload.loss

def loss(self, model, batch, micro):
    if self.examples.steps == int(sys.argv[1]) and micro == 0 and self.env.rank == 1:
        os.kill(os.getpid(), signal.SIGTERM)
    return real(self, model, batch, micro)

FinetuneWorkload.loss = loss
main(sys.argv[2:])
"""


@pytest.fixture(scope="module")
def work(builds, tmp_path_factory) -> Path:
    """init/ (a random-init checkpoint), train.tsv (64 rows, 4 labels), valid.tsv (40 rows), ft.yaml (SETS)."""
    root = random_init_checkpoint(builds, tmp_path_factory.mktemp("ftdist"))
    for name, path, n in (("train", TRAIN_TSV, 64), ("valid", VALID_TSV, 40)):
        rows = [f"{t}\t{lab}" for t, lab in pydocs_rows(path, n)]
        (root / f"{name}.tsv").write_text("\n".join(["text\tlabel", *rows]) + "\n")
    (root / "ft.yaml").write_text(dump_config(ft_cfg(*SETS)))
    return root


def _args(work: Path, out: Path) -> list[str]:
    return [
        "finetune",
        "--task",
        "classification",
        "--train",
        str(work / "train.tsv"),
        "--valid",
        str(work / "valid.tsv"),
        "--init",
        str(work / "init"),
        "--out",
        str(out),
        "--config",
        str(work / "ft.yaml"),
        "--device",
        "cpu",
    ]


def _torchrun(*args: str) -> subprocess.CompletedProcess:
    cmd = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", *args]
    return subprocess.run(cmd, env=child_env(), capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def one(work) -> Path:
    """The reference: 1 process, micro 4 x accumulation 2, K steps."""
    from xlnetcli.cli import main

    with pytest.raises(SystemExit) as e:
        main([*_args(work, work / "one"), "--quiet"])
    assert e.value.code == 0
    return work / "one"


def _evals(run: Path) -> list[dict]:
    """The evaluation rows' numbers (step, metric, accuracy, macro_f1, mcc)."""
    rows = [r for r in read_metrics(run) if r["split"] == "eval"]
    return [{k: v for k, v in r.items() if k != "time" and isinstance(v, (int, float))} for r in rows]


def _assert_same_run(run: Path, ref: Path) -> None:
    """Losses, validation metrics, the best step and its weights of ``run`` equal ``ref``'s within TOL."""
    la, lb = train_losses(ref), train_losses(run)
    assert [s for s, _ in lb] == [s for s, _ in la] == list(range(1, K + 1))
    assert [b for _, b in lb] == pytest.approx([a for _, a in la], rel=TOL)
    ea, eb = _evals(ref), _evals(run)
    assert [r["step"] for r in ea] == [r["step"] for r in eb] == [3, 6]
    for a, b in zip(ea, eb, strict=True):  # accuracy, macro_f1, mcc: counts of argmaxes, no tie within 1e-5 here
        assert b == pytest.approx(a, rel=TOL)
    ra, rb = (json.loads((r / "results.json").read_text()) for r in (ref, run))
    assert rb["best_step"] == ra["best_step"] and rb["value"] == pytest.approx(ra["value"], rel=TOL)
    wa, wb = step_weights(Path(ra["checkpoint"])), step_weights(Path(rb["checkpoint"]))
    assert wa.keys() == wb.keys() and max((wa[k] - wb[k]).abs().max().item() for k in wa) < TOL


def test_two_processes_finetune_and_evaluate_as_one(work, one, tmp_path, capsys):
    """`torchrun ... finetune` on 2 processes: the 1-process run's losses, metrics and best weights up to float
    rounding. `torchrun ... eval` of that checkpoint: exactly one process's metrics and predictions (the same batches,
    each run whole on one rank), printed and written once."""
    two = tmp_path / "two"
    out = _torchrun("-m", "xlnetcli", *_args(work, two))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "batch      8 = micro 4 x accumulation 1 x 2 process(es)" in out.stderr
    _assert_same_run(two, one)

    valid = str(work / "valid.tsv")
    p1, p2, r2 = tmp_path / "p1.jsonl", tmp_path / "p2.jsonl", tmp_path / "r2.json"
    code, stdout, err = run_main(capsys, "eval", two, "--file", valid, "--predict", p1, "--device", "cpu")
    assert code == 0, err
    res1 = json.loads(stdout)
    ev = _torchrun("-m", "xlnetcli", "eval", str(two), "--file", valid, "--predict", str(p2), "--output", str(r2))
    assert ev.returncode == 0, ev.stderr[-3000:]
    res2 = json.loads(ev.stdout)  # one JSON document: rank 0 alone prints
    assert res2 == json.loads(r2.read_text())
    for r in (res1, res2):
        r.pop("predictions")
    assert res2 == res1 and res1["examples"] == 40
    assert p2.read_bytes() == p1.read_bytes()  # every probability to the last digit written


def test_stopped_on_two_processes_resumes_on_one(work, one, tmp_path, capsys):
    """A 2-process run stopped by SIGTERM after step SPLIT resumes on 1 process (micro 4 x accumulation 2, or micro
    2 x accumulation 4): the example order and optimizer state are global, only dropout would be re-seeded (off
    here), so the result is the uninterrupted 1-process run's up to float rounding (its first steps ran on 2
    processes)."""
    script = tmp_path / "stopped.py"
    script.write_text(_STOPPED)
    run = tmp_path / "run"
    out = _torchrun(str(script), str(SPLIT), *_args(work, run), "--quiet")
    assert out.returncode != 0 and "stopped on SIGTERM after step 3 of 6" in out.stderr, out.stderr[-3000:]
    partial = partial_dir(run)
    assert not run.exists() and load_train_state(partial / f"step_{SPLIT:07d}")["world_size"] == 2
    shutil.copytree(partial, partial_dir(tmp_path / "micro"))
    code, _, err = run_main(capsys, *_args(work, run), "--resume")
    assert code == 0, err
    said = [ln.strip() for ln in err.splitlines() if ln.strip().startswith("layout")]
    assert said == [
        "layout     checkpoint of 2 process(es) x micro 4 x accumulation 1 continued on 1 x micro 4 x accumulation "
        "2: the same examples each step (the example order is global); dropout re-seeded (its masks differ from an "
        "uninterrupted run's)"
    ], err
    _assert_same_run(run, one)
    assert not partial.exists()
    # and with another micro-batch size (finetune.micro_batch_size may change on --resume): micro 2 x accumulation 4
    micro = ["--resume", "--set", "finetune.micro_batch_size=2"]
    code, _, err = run_main(capsys, *_args(work, tmp_path / "micro"), *micro)
    assert code == 0 and "continued on 1 x micro 2 x accumulation 4" in err, err
    _assert_same_run(tmp_path / "micro", one)
