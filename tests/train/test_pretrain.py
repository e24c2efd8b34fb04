"""Pretraining: exact resume after a real SIGKILL, torchrun (gloo) vs one process, learning, bad input."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import torch
from clitools import (
    BIN,
    FAST_PRETRAIN,
    TINY,
    child_env,
    kill_when_written,
    run_main,
    step_weights,
    train_losses,
    write_config,
)

from xlnetcli.config import batch_maths, load_config
from xlnetcli.core.errors import ConfigError, DataError, XLNetError
from xlnetcli.report.metrics_log import read_metrics
from xlnetcli.train.checkpointer import load_train_state
from xlnetcli.train.pretrain import evaluate_plm, list_checkpoints, pretrain

torch.set_num_threads(1)  # the same as the subprocesses (OMP_NUM_THREADS=1): bit-identical float reductions


@pytest.fixture(scope="module")
def records(builds) -> Path:
    """Shared (conftest.py): read only."""
    return builds.pipeline(FAST_PRETRAIN).records


def _cfg(*extra: str):
    return load_config(TINY, FAST_PRETRAIN + list(extra))


# ---- checkpoints, eval, metrics ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_run_layout_eval_and_rotation(records, tmp_path):
    cfg = _cfg("train.max_steps=6", "train.save_every=2", "train.keep_last=2", "train.eval_every=3")
    res = pretrain(cfg, records, tmp_path / "run", quiet=True)
    assert res["step"] == 6
    assert not [t for t in threading.enumerate() if t.name == "xlnet-prefetch"]  # joined, not left to the shutdown
    run = tmp_path / "run"
    assert [s for s, _ in list_checkpoints(run)] == [4, 6]  # keep_last = 2
    step = run / "step_0000006"
    for name in ("model.safetensors", "config.yaml", "meta.json", "train_state.safetensors", "tokenizer/spiece.model"):
        assert (step / name).is_file(), name
    assert json.loads((step / "meta.json").read_text())["kind"] == "pretrain"
    state = load_train_state(step)
    assert state["step"] == 6 and state["world_size"] == 1 and state["accumulation"] == 2
    assert state["format_version"] == 2
    r0 = state["ranks"][0]
    assert set(r0["rng"]) >= {"python", "numpy", "torch"} and r0["data"]["step"] == 6
    mems = r0["mems"]  # by records row: the 4 rows of the global batch, 2 layers of [row, mem_len, d_model]
    assert mems["rows"].tolist() == [0, 1, 2, 3] and len(mems["layers"]) == 2 and mems["layers"][0].shape == (4, 16, 64)
    rows = read_metrics(run)
    assert [r["step"] for r in rows if r["split"] == "train"] == [1, 2, 3, 4, 5, 6]
    evals = [r for r in rows if r["split"] == "eval"]
    assert [r["step"] for r in evals] == [0, 3, 6]  # step 0: the initial weights (baseline)
    assert all(r["ppl"] == pytest.approx(torch.tensor(r["loss"]).exp().item(), rel=1e-5) for r in evals)
    assert all(0.0 <= r["acc"] <= 1.0 and r["targets"] > 0 for r in evals)
    train_rows = [r for r in rows if r["split"] == "train"]
    assert all(r["tokens_per_s"] > 0 and r["lr"] > 0 for r in train_rows)
    # the checkpoint loads as an LM model (as `xlnet eval` would) and evaluate_plm agrees with the logged figure
    from xlnetcli.checkpoint.load import load_lm_model
    from xlnetcli.data.records.stream import PretrainStream

    model, *_ = load_lm_model(step)
    again = evaluate_plm(model, PretrainStream(records, "valid", 0, 1, 2, cfg.data.seed, dense=False, loop=False), 4)
    assert again["loss"] == pytest.approx(evals[-1]["loss"], rel=1e-5)


# ---- exact resume after a real SIGKILL --------------------------------------------------------------------------


@pytest.mark.slow
def test_resume_after_sigkill_is_exact(records, tmp_path):
    n, save = 40, 5
    over = [f"train.max_steps={n}", f"train.save_every={save}", "train.eval_every=10", "train.keep_last=3"]
    cfg_file = write_config(tmp_path / "cfg.yaml", FAST_PRETRAIN + over)  # dropout 0.1 stays on: RNG state must resume
    # uninterrupted reference run
    pretrain(load_config(cfg_file), records, tmp_path / "a", quiet=True)
    # the same run as a real process, killed with SIGKILL once the first checkpoint exists
    cmd = [
        str(BIN / "xlnet"),
        "pretrain",
        "--config",
        str(cfg_file),
        "--data",
        str(records),
        "--out",
        str(tmp_path / "b"),
        "--quiet",
    ]
    kill_when_written(cmd, tmp_path / "b" / f"step_{save:07d}" / "train_state.safetensors")
    killed_at = [s for s, _ in list_checkpoints(tmp_path / "b")]
    assert killed_at and killed_at[-1] < n, killed_at
    # resume (no --config: the run's own config.yaml)
    out = subprocess.run(
        [str(BIN / "xlnet"), "pretrain", "--data", str(records), "--out", str(tmp_path / "b"), "--resume", "--quiet"],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    la, lb = train_losses(tmp_path / "a"), train_losses(tmp_path / "b")
    assert [s for s, _ in lb] == list(range(1, n + 1))  # rows logged after the checkpoint were dropped, then redone
    assert la == lb  # bit-identical losses
    ea = [r["loss"] for r in read_metrics(tmp_path / "a") if r["split"] == "eval"]
    eb = [r["loss"] for r in read_metrics(tmp_path / "b") if r["split"] == "eval"]
    assert ea == eb
    wa, wb = step_weights(tmp_path / "a" / f"step_{n:07d}"), step_weights(tmp_path / "b" / f"step_{n:07d}")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    sa = load_train_state(tmp_path / "a" / f"step_{n:07d}")
    sb = load_train_state(tmp_path / "b" / f"step_{n:07d}")
    for k, v in sa["optimizer"]["state"].items():
        assert torch.equal(v["exp_avg_sq"], sb["optimizer"]["state"][k]["exp_avg_sq"])


@pytest.mark.slow
def test_resume_given_step(records, tmp_path):
    cfg = _cfg("train.max_steps=6", "train.save_every=2", "train.keep_last=5", "train.eval_every=never")
    pretrain(cfg, records, tmp_path / "a", quiet=True)
    pretrain(cfg, records, tmp_path / "b", quiet=True)
    pretrain(cfg, records, tmp_path / "b", resume="2", rewind=True, quiet=True)  # continue from step 2 again
    assert train_losses(tmp_path / "a") == train_losses(tmp_path / "b")
    with pytest.raises(XLNetError, match=r"no checkpoint step 3 .*have: 2, 4, 6"):
        pretrain(cfg, records, tmp_path / "b", resume="3", quiet=True)


# ---- torchrun: 2 processes (gloo) vs 1 process at the same global batch ----------------------------------------


@pytest.mark.slow
def test_torchrun_two_processes_match_one(records, tmp_path):
    over = [
        *FAST_PRETRAIN,
        "train.max_steps=6",
        "train.save_every=6",
        "train.eval_every=3",
        "model.dropout=0.0",
        "model.dropatt=0.0",
    ]
    cfg_file = write_config(tmp_path / "cfg.yaml", over)
    pretrain(load_config(cfg_file), records, tmp_path / "one", quiet=True)  # 1 process: micro 2 x accumulation 2
    cmd = [
        str(BIN / "torchrun"),
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "xlnetcli",
        "pretrain",
        "--config",
        str(cfg_file),
        "--data",
        str(records),
        "--out",
        str(tmp_path / "two"),
        "--device",
        "cpu",
        "--quiet",
    ]  # 2 processes: micro 2 x accumulation 1 each
    out = subprocess.run(cmd, env=child_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    l1, l2 = train_losses(tmp_path / "one"), train_losses(tmp_path / "two")
    assert [s for s, _ in l1] == [s for s, _ in l2] == list(range(1, 7))
    # Same data rows, same memories, same init; only the order of float additions differs (DDP's all-reduce
    # averages two ranks' gradients instead of accumulating two micro-batches in one process), which moves losses
    # by ~1e-7 relative and weights by ~1e-7 absolute after 6 Adam steps. Tolerances: 1e-5.
    assert [b for _, b in l2] == pytest.approx([a for _, a in l1], rel=1e-5)
    e1 = [r["loss"] for r in read_metrics(tmp_path / "one") if r["split"] == "eval"]
    e2 = [r["loss"] for r in read_metrics(tmp_path / "two") if r["split"] == "eval"]
    assert e2 == pytest.approx(e1, rel=1e-5)
    w1, w2 = step_weights(tmp_path / "one" / "step_0000006"), step_weights(tmp_path / "two" / "step_0000006")
    assert max((w1[k] - w2[k]).abs().max().item() for k in w1) < 1e-5
    st = load_train_state(tmp_path / "two" / "step_0000006")
    assert st["world_size"] == 2 and len(st["ranks"]) == 2 and st["ranks"][1]["mems"]["rows"].tolist() == [2, 3]


@pytest.mark.slow
def test_torchrun_fsdp_matches_one_and_resumes_exactly(records, tmp_path):
    """FSDP2 (fully_shard) on 2 gloo processes: close to one process; a resume from step 3 is bit-identical."""
    over = [
        *FAST_PRETRAIN,
        "train.max_steps=6",
        "train.save_every=3",
        "train.eval_every=3",
        "model.dropout=0.0",
        "model.dropatt=0.0",
        "train.keep_last=5",
    ]
    pretrain(load_config(TINY, over), records, tmp_path / "one", quiet=True)
    cfg_file = write_config(tmp_path / "cfg.yaml", [*over, "train.distributed=fsdp"])
    base = [
        str(BIN / "torchrun"),
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "xlnetcli",
        "pretrain",
        "--data",
        str(records),
        "--out",
        str(tmp_path / "fsdp"),
        "--device",
        "cpu",
        "--quiet",
    ]
    out = subprocess.run(
        [*base, "--config", str(cfg_file)], env=child_env(), capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    first = read_metrics(tmp_path / "fsdp")
    l1, l2 = train_losses(tmp_path / "one"), train_losses(tmp_path / "fsdp")
    assert [b for _, b in l2] == pytest.approx([a for _, a in l1], rel=1e-5)
    w1, w2 = step_weights(tmp_path / "one" / "step_0000006"), step_weights(tmp_path / "fsdp" / "step_0000006")
    assert w1.keys() == w2.keys() and max((w1[k] - w2[k]).abs().max().item() for k in w1) < 1e-5
    out = subprocess.run(
        [*base, "--resume", "3", "--rewind"], env=child_env(), capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    strip = lambda rows: [(r["step"], r["split"], r["loss"]) for r in rows]  # noqa: E731
    assert strip(read_metrics(tmp_path / "fsdp")) == strip(first)


# ---- learning check on real text ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_tiny_config_learns_on_real_text(builds, tmp_path):
    """Tiny config (2 layers, seq 64) on the bundled PSF text: held-out PLM loss must fall well below its start."""
    over = [
        "tokenizer.vocab_size=1000",
        "model.vocab_size=1000",
        "model.n_layer=2",
        "data.seq_len=64",
        "model.reuse_len=32",
        "model.mem_len=32",
        "data.num_predict=10",
        "train.global_batch_size=8",
        "train.micro_batch_size=8",
        "data.valid_fraction=0.05",
        "model.dropout=0.0",
        "model.dropatt=0.0",
        "train.max_steps=300",
        "train.warmup_steps=30",
        "train.lr=2e-3",
        "train.eval_every=150",
        "train.eval_batches=8",
        "train.save_every=end",
        "train.log_every=50",
    ]
    rec = builds.pipeline(over).records
    cfg = load_config(TINY, over)
    from xlnetcli.data.records.stream import PretrainStream
    from xlnetcli.model import XLNetLMHeadModel

    torch.manual_seed(cfg.train.seed)
    valid = PretrainStream(rec, "valid", 0, 1, 8, cfg.data.seed, dense=False, loop=False)
    start = evaluate_plm(XLNetLMHeadModel(cfg.model), valid, 8)["loss"]  # the same held-out batches as below
    res = pretrain(cfg, rec, tmp_path / "run", quiet=True)
    end = res["eval"]["loss"]
    # ln(1000) = 6.91 at start (measured 6.94); after 300 steps (~25 s) it reaches ~5.5 (measured 5.53):
    # held-out perplexity from ~1000 to ~250. Threshold: at least 1.2 nats lower and below 5.75.
    print(f"held-out PLM loss {start:.3f} -> {end:.3f}")
    assert start > 6.5
    assert end < min(5.75, start - 1.2), (start, end)


# ---- bad input ---------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_records_made_with_other_settings(records, tmp_path):
    with pytest.raises(DataError, match=r"num_predict=6 but the config has data.num_predict=5"):
        pretrain(_cfg("data.num_predict=5", "train.max_steps=2"), records, tmp_path / "r", quiet=True)
    with pytest.raises(DataError, match=r"global_batch_size=4 but the config has train.global_batch_size=8"):
        pretrain(_cfg("train.global_batch_size=8", "train.max_steps=2"), records, tmp_path / "r", quiet=True)
    with pytest.raises(DataError, match=r"seq_len=32 but the config has data.seq_len=48"):
        pretrain(_cfg("data.seq_len=48", "train.max_steps=2"), records, tmp_path / "r", quiet=True)
    with pytest.raises(DataError, match=r"not a records directory|does not exist"):
        pretrain(_cfg(), tmp_path / "nope", tmp_path / "r", quiet=True)


@pytest.mark.slow
def test_out_folder_of_another_run(records, tmp_path):
    cfg = _cfg("train.max_steps=2", "train.save_every=2", "train.eval_every=never")
    pretrain(cfg, records, tmp_path / "run", quiet=True)
    with pytest.raises(XLNetError, match=r"already holds a pretraining run \(last checkpoint step 2\); pass --resume"):
        pretrain(cfg, records, tmp_path / "run", quiet=True)
    other = _cfg("train.max_steps=2", "train.save_every=2", "train.eval_every=never", "train.weight_decay=0.5")
    with pytest.raises(XLNetError, match=r"holds a run with train.weight_decay=0.01 but this config has train.weigh"):
        pretrain(other, records, tmp_path / "run", resume="latest", quiet=True)
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "file.txt").write_text("x")
    with pytest.raises(XLNetError, match="not empty and holds no pretraining run"):
        pretrain(cfg, records, tmp_path / "junk", quiet=True)
    # a longer run of the same config may be resumed (max_steps may change)
    res = pretrain(
        _cfg("train.max_steps=3", "train.save_every=2", "train.eval_every=never"),
        records,
        tmp_path / "run",
        resume="latest",
        quiet=True,
    )
    assert res["step"] == 3


@pytest.mark.slow
def test_preprocess_flags_reach_pretrain_without_config(builds, tmp_path, capsys):
    """`xlnet preprocess --mask-mode original --passes 2`, then `xlnet pretrain` without --config (it reads the
    records' config.yaml): the saved config holds the mask mode and passes used, so pretraining is not refused."""
    cfg_file = write_config(tmp_path / "cfg.yaml", [*FAST_PRETRAIN, "train.max_steps=2"])
    rec = tmp_path / "rec"
    code, _, err = run_main(
        capsys,
        "preprocess",
        "--shards",
        builds.pipeline(FAST_PRETRAIN).shards,
        "--out",
        rec,
        "--config",
        cfg_file,
        "--mask-mode",
        "original",
        "--passes",
        "2",
    )
    assert code == 0, err
    saved = load_config(rec / "config.yaml")
    assert (saved.data.mask_mode, saved.data.passes) == ("original", 2)
    meta = json.loads((rec / "meta.json").read_text())
    assert (meta["mask_mode"], meta["passes"], len(meta["splits"]["train"]["files"])) == ("original", 2, 2)
    code, _, err = run_main(capsys, "pretrain", "--data", rec, "--out", tmp_path / "run", "--quiet")
    assert code == 0, err
    assert [s for s, _ in train_losses(tmp_path / "run")] == [1, 2]
    assert load_config(tmp_path / "run" / "config.yaml").data.mask_mode == "original"


def test_impossible_batch_maths():
    cfg = _cfg()
    assert batch_maths(cfg, 1).accumulation == 2 and batch_maths(cfg, 2).accumulation == 1
    maths = batch_maths(cfg, 2)  # bi_data: 2 forward rows, each also read reversed; 6 targets = 3 (reuse) + 3 (rest)
    assert (maths.global_batch_size, maths.micro_batch_size, maths.world, maths.forward_rows) == (4, 2, 2, 2)
    assert (maths.num_predict_reuse, maths.num_predict_rest) == (3, 3)
    odd = batch_maths(_cfg("data.num_predict=7", "model.bi_data=false"), 1)
    assert (odd.num_predict_reuse, odd.num_predict_rest, odd.forward_rows) == (4, 3, 4)
    with pytest.raises(ConfigError, match=r"impossible batch maths: train.global_batch_size=4 .* x 3 process"):
        batch_maths(cfg, 3)
    with pytest.raises(ConfigError, match="must be a multiple of"):
        _cfg("train.global_batch_size=6", "train.micro_batch_size=4")


@pytest.mark.slow
def test_nonfinite_loss_stops_with_diagnosis(records, tmp_path):
    cfg = _cfg(
        "train.max_steps=20",
        "train.save_every=1",
        "train.eval_every=never",
        "train.lr=1e30",
        "train.warmup_steps=0",
        "train.clip_norm=0",
    )
    with pytest.raises(XLNetError) as e:
        pretrain(cfg, records, tmp_path / "run", quiet=True)
    msg = str(e.value)
    assert "training diverged at step" in msg and "\n" not in msg
    assert "PLM loss is nan" in msg or "PLM loss is inf" in msg or "gradient" in msg
    assert "last good checkpoint" in msg and "--resume" in msg


@pytest.mark.slow
def test_out_of_memory_is_one_line(records, tmp_path, monkeypatch):
    import xlnetcli.train.pretrain as pt

    def boom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(pt, "_forward", boom)
    with pytest.raises(
        XLNetError,
        match=r"out of memory on cpu during training step 1 with micro-batch 2 x seq 32 .*activation_checkpointing",
    ):
        pretrain(
            _cfg(
                "train.max_steps=2", "train.eval_every=never", "train.global_batch_size=4", "train.micro_batch_size=2"
            ),
            records,
            tmp_path / "r",
            quiet=True,
        )


@pytest.mark.slow
def test_cli_errors_are_one_line(records, tmp_path):
    out = subprocess.run(
        [str(BIN / "xlnet"), "pretrain", "--config", str(TINY), "--data", str(records), "--out", str(tmp_path / "r")]
        + [f"--set={s}" for s in [*FAST_PRETRAIN, "data.mask_alpha=5"]],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "mask_alpha=6" in out.stderr and "data.mask_alpha=5" in out.stderr


@pytest.mark.slow
def test_redirected_log_has_one_plain_line_per_interval(records, tmp_path):
    """stderr to a file (nohup, SLURM): a line per log_every with loss, lr, tokens/s, peak memory and ETA, each on one
    line however long; evaluations too; metrics.jsonl records the peak memory."""
    cfg_file = write_config(
        tmp_path / "cfg.yaml",
        [*FAST_PRETRAIN, "train.max_steps=6", "train.log_every=2", "train.eval_every=3", "train.save_every=end"],
    )
    log = tmp_path / "log.txt"
    with open(log, "w") as f:
        proc = subprocess.run(
            [
                str(BIN / "xlnet"),
                "pretrain",
                "--config",
                str(cfg_file),
                "--data",
                str(records),
                "--out",
                str(tmp_path / "run"),
            ],
            env=child_env(),
            stdout=f,
            stderr=subprocess.STDOUT,
            timeout=300,
        )
    text = log.read_text()
    assert proc.returncode == 0, text
    lines = text.splitlines()
    steps = [ln for ln in lines if ln.startswith("step ")]
    assert [ln.split()[1] for ln in steps] == ["2/6", "4/6", "6/6"], text
    for ln in steps:
        assert all(k in ln for k in ("loss ", "lr ", "tokens/s", "peak ", "GiB", "ETA ")), ln
    assert any("step 3: eval loss" in ln for ln in lines) and any("step 6: eval loss" in ln for ln in lines)
    assert max(len(ln) for ln in lines) > 80  # long messages are not wrapped at 80 columns
    rows = [r for r in read_metrics(tmp_path / "run") if r["split"] == "train"]
    assert rows and all(r["peak_mem_gib"] > 0 for r in rows)


class _Payload:
    """Unpickling this runs code: it creates the file named in ``marker``."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


@pytest.mark.slow
def test_train_state_is_stored_without_pickle_and_a_pickle_payload_is_refused(records, tmp_path):
    cfg = _cfg("train.max_steps=4", "train.save_every=2", "train.eval_every=never")
    pretrain(cfg, records, tmp_path / "run", quiet=True, stop_after=2)
    folder = tmp_path / "run" / "step_0000002"
    with open(folder / "train_state.safetensors", "rb") as f:  # a safetensors header: JSON, then raw tensor bytes
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    assert "tree" in header["__metadata__"]
    state = load_train_state(folder)
    # a train_state.pt from elsewhere (the format earlier versions wrote with torch.save) carrying a payload
    marker = tmp_path / "pwned"
    state["evil"] = _Payload(str(marker))
    (folder / "train_state.safetensors").unlink()
    torch.save(state, folder / "train_state.pt")
    with pytest.raises(XLNetError, match="refusing to unpickle it"):
        pretrain(cfg, records, tmp_path / "run", resume="latest", quiet=True)
    assert not marker.exists()


# ---- preemption, full disk, a finished run ----------------------------------------------------------------------


@pytest.mark.slow
def test_sigterm_writes_a_checkpoint_and_resume_is_exact(records, tmp_path):
    """A scheduler's SIGTERM: the current step finishes, a checkpoint is written, exit code 75 with one line; --resume
    then gives the uninterrupted run's losses, evaluations and final weights bit for bit."""
    n = 40
    over = [f"train.max_steps={n}", "train.save_every=end", "train.eval_every=10", "train.keep_last=3"]
    cfg_file = write_config(tmp_path / "cfg.yaml", FAST_PRETRAIN + over)  # only SIGTERM and the end save
    pretrain(load_config(cfg_file), records, tmp_path / "a", quiet=True)
    run = tmp_path / "b"
    cmd = [
        str(BIN / "xlnet"),
        "pretrain",
        "--config",
        str(cfg_file),
        "--data",
        str(records),
        "--out",
        str(run),
        "--quiet",
    ]
    proc = subprocess.Popen(cmd, env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while (
        proc.poll() is None
        and time.time() < deadline
        and len(train_losses(run) if (run / "metrics.jsonl").exists() else []) < 3
    ):
        time.sleep(0.01)
    still_running = proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    err = err.decode()
    assert still_running, err
    assert proc.returncode == 75, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("xlnet: stopped on SIGTERM after step "), err
    stopped = [s for s, _ in list_checkpoints(run)]
    assert len(stopped) == 1 and 3 <= stopped[0] < n and f"step_{stopped[0]:07d}" in lines[0] and "--resume" in lines[0]
    assert not [p for p in run.iterdir() if p.name.startswith(".")]  # no temporary folder left
    out = subprocess.run(
        [str(BIN / "xlnet"), "pretrain", "--data", str(records), "--out", str(run), "--resume", "--quiet"],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    strip = lambda rows: [(r["step"], r["split"], r["loss"]) for r in rows]  # noqa: E731
    assert strip(read_metrics(run)) == strip(read_metrics(tmp_path / "a"))
    wa, wb = step_weights(tmp_path / "a" / f"step_{n:07d}"), step_weights(run / f"step_{n:07d}")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.slow
def test_disk_full_while_saving_names_the_last_good_checkpoint(records, tmp_path, monkeypatch, capsys):
    """ENOSPC half-way through writing a checkpoint: one line naming the last good one, no partial step folder; after
    freeing space, --resume finishes the run as if nothing happened."""
    import errno

    from clitools import assert_one_line_error, run_main

    cfg_file = write_config(
        tmp_path / "cfg.yaml",
        [*FAST_PRETRAIN, "train.max_steps=6", "train.save_every=2", "train.eval_every=never", "train.keep_last=5"],
    )
    pretrain(load_config(cfg_file), records, tmp_path / "a", quiet=True)
    from xlnetcli.train import checkpointer

    real_save, calls = checkpointer.save_tree, []

    def disk_full_on_second(obj, f):
        calls.append(f)
        if len(calls) == 2:  # the step-4 train state: part of the file lands, then the disk is full
            Path(f).write_bytes(b"\0" * 4096)
            raise OSError(errno.ENOSPC, "No space left on device", str(f))
        return real_save(obj, f)

    monkeypatch.setattr(checkpointer, "save_tree", disk_full_on_second)
    run = tmp_path / "b"
    code, _, err = run_main(capsys, "pretrain", "--config", cfg_file, "--data", records, "--out", run, "--quiet")
    assert_one_line_error(
        code,
        err,
        "disk full while writing checkpoint",
        "step_0000004",
        f"last good checkpoint {run / 'step_0000002'}",
        "--resume",
    )
    assert [s for s, _ in list_checkpoints(run)] == [2]
    assert not [p.name for p in run.iterdir() if p.name.startswith(".") or p.name == "step_0000004"]
    monkeypatch.setattr(checkpointer, "save_tree", real_save)
    code, _, err = run_main(capsys, "pretrain", "--data", records, "--out", run, "--resume", "--quiet")
    assert code == 0, err
    assert train_losses(run) == train_losses(tmp_path / "a")
    wa, wb = step_weights(tmp_path / "a" / "step_0000006"), step_weights(run / "step_0000006")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.slow
def test_resuming_a_finished_run_says_it_is_complete(records, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XLNET_NO_PROGRESS", "1")
    cfg = _cfg("train.max_steps=3", "train.save_every=2", "train.eval_every=3")
    first = pretrain(cfg, records, tmp_path / "run", quiet=True)
    res = pretrain(cfg, records, tmp_path / "run", resume="latest", quiet=True)
    assert res["already_complete"] and res["step"] == 3 and res["loss"] == first["loss"]
    assert res["eval"]["loss"] == first["eval"]["loss"]
    rows = read_metrics(tmp_path / "run")
    code, _, err = run_main(capsys, "pretrain", "--data", records, "--out", tmp_path / "run", "--resume")
    assert code == 0, err
    assert f"is already complete: step 3 of 3, final checkpoint {tmp_path / 'run' / 'step_0000003'}" in err
    assert "nan" not in err and "tokens/s" not in err
    assert read_metrics(tmp_path / "run") == rows  # nothing logged again


@pytest.mark.slow
def test_mem_len_zero_means_no_memory_in_pretraining(records, tmp_path):
    """model.mem_len=0 switches Transformer-XL memory off (the paper's "- memory" ablation row), as the original's
    _cache_mem does: nothing is carried between steps or saved in the train state (with memory on, the same run
    saves [micro_batch, mem_len, d_model] memories: test_run_layout_eval_and_rotation)."""
    cfg = _cfg("model.mem_len=0", "train.max_steps=3", "train.save_every=3", "train.eval_every=3")
    pretrain(cfg, records, tmp_path / "run", quiet=True)
    state = load_train_state(tmp_path / "run" / "step_0000003")
    assert state["ranks"][0]["mems"]["layers"] is None


@pytest.mark.slow
def test_deferred_check_pretrains_the_same_bits_and_resumes_exactly(records, tmp_path, monkeypatch):
    """The GPU's way on the CPU (fused AdamW, each step's figures read a step late): the same losses and weights as the
    figures read before each update, and a run stopped at its checkpoint resumes to the uninterrupted run's bits."""
    from xlnetcli.train import engine

    cfg = _cfg("train.max_steps=6", "train.save_every=3", "train.eval_every=3", "train.log_every=2")
    monkeypatch.setattr(engine, "fused_adamw", lambda device: True)
    monkeypatch.setattr(engine, "deferred_check", lambda *a: False)
    pretrain(cfg, records, tmp_path / "synced", quiet=True)
    monkeypatch.undo()
    monkeypatch.setattr(engine, "fused_adamw", lambda device: True)
    pretrain(cfg, records, tmp_path / "deferred", quiet=True)
    pretrain(cfg, records, tmp_path / "resumed", quiet=True, stop_after=3)
    pretrain(cfg, records, tmp_path / "resumed", resume="latest", quiet=True)
    runs = [tmp_path / r for r in ("synced", "deferred", "resumed")]
    losses = [train_losses(r) for r in runs]
    assert [s for s, _ in losses[0]] == [2, 4, 6] and losses[0] == losses[1] == losses[2]
    weights = [step_weights(r / "step_0000006") for r in runs]
    assert all(torch.equal(weights[0][k], w[k]) for w in weights[1:] for k in weights[0])
