"""Continued pretraining (`xlnet pretrain --init`): the run starts from the checkpoint's weights (its step-0
evaluation is the starting model's loss on the new records), records where it started, resumes exactly, and refuses
what cannot continue in one line without writing anything."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from clitools import (
    BIN,
    FAST_PRETRAIN,
    TINY,
    TRAIN_TSV,
    assert_one_line_error,
    child_env,
    kill_when_written,
    run_main,
    set_args,
    step_weights,
    train_losses,
    write_config,
)

from xlnetcli.checkpoint.load import load_lm_model
from xlnetcli.config import load_config
from xlnetcli.core.files import sha256_file
from xlnetcli.data.records.stream import PretrainStream
from xlnetcli.model.objective import evaluate_plm, model_inputs
from xlnetcli.report.metrics_log import read_metrics
from xlnetcli.train.pretrain import list_checkpoints, pretrain

torch.set_num_threads(1)  # as the subprocesses (OMP_NUM_THREADS=1): bit-identical float reductions

# one evaluation at step 0 over 2 micro-batches (micro-batch indices 0 and 1: no memory), then 2 steps
CONTINUE = ["train.max_steps=2", "train.eval_every=2", "train.eval_batches=1", "train.save_every=end"]


@pytest.fixture(scope="module")
def records(builds) -> Path:
    """Shared (conftest.py): read only."""
    return builds.pipeline(FAST_PRETRAIN).records


@pytest.fixture(scope="module")
def source(records, tmp_path_factory) -> Path:
    """A pretraining run of 6 steps on the shared records: the checkpoint runs continue from."""
    out = tmp_path_factory.mktemp("source") / "run"
    pretrain(_cfg("train.max_steps=6", "train.eval_every=never"), records, out, quiet=True)
    return out


def _cfg(*extra: str):
    return load_config(TINY, FAST_PRETRAIN + list(extra))


def _continue(capsys, records: Path, out: Path, init: Path | None, *sets: str, resume: bool = False):
    """`xlnet pretrain --config tiny` with FAST_PRETRAIN, CONTINUE and ``sets`` on ``records`` into ``out`` (from
    ``init`` when given); returns (exit code, stderr: the log and any error)."""
    args = ["pretrain", "--config", TINY, *set_args([*FAST_PRETRAIN, *CONTINUE, *sets]), "--data", records]
    args += ["--out", out, *(["--init", init] if init is not None else []), *(["--resume"] if resume else [])]
    code, _, err = run_main(capsys, *args)
    return code, err


def _step0(run: Path) -> float:
    return next(r["loss"] for r in read_metrics(run) if r["split"] == "eval" and r["step"] == 0)


def _our_eval(ckpt: Path, records: Path) -> float:
    """The PLM loss `xlnet eval` computes for ``ckpt`` on the first 2 valid micro-batches of ``records``."""
    cfg = _cfg()
    model, *_ = load_lm_model(ckpt, overrides={"mem_len": cfg.model.mem_len, "bi_data": cfg.model.bi_data})
    stream = PretrainStream(records, "valid", 0, 1, 2, cfg.data.seed, dense=False, loop=False)
    return evaluate_plm(model, stream, 2)["loss"]


def _hf_loss(hf_lm, records: Path) -> float:
    """transformers' own PLM loss on the same 2 valid micro-batches: bi_data as in our rows (the second half of each
    batch read backwards), targets one-hot in target_mapping, cross entropy over the real targets."""
    cfg = _cfg()
    hf_lm.config.bi_data = cfg.model.bi_data
    hf_lm.eval()
    stream = PretrainStream(records, "valid", 0, 1, 2, cfg.data.seed, dense=False, loop=False)
    total, n = 0.0, 0
    with torch.no_grad():
        for _, batch in zip(range(2), stream, strict=False):
            x = model_inputs(batch, torch.device("cpu"))
            tmap = F.one_hot(x["target_index"], x["input_ids"].shape[1]).float()
            out = hf_lm(
                x["input_ids"],
                token_type_ids=x["token_type_ids"],
                perm_mask=x["perm_mask"].float(),
                target_mapping=tmap,
                use_mems=False,
            )
            nll = F.cross_entropy(out.logits.transpose(1, 2), x["labels"], reduction="none")
            w = x["label_mask"].float()
            total, n = total + float((nll * w).sum()), n + int(w.sum())
    return total / n


def _with_tokenizer(hf_dir: Path, records: Path) -> Path:
    """An HF directory gets the records' spiece.model (and tokenizer_config.json), as a released model ships its own."""
    for name in ("spiece.model", "tokenizer_config.json"):
        shutil.copy(records / "tokenizer" / name, hf_dir / name)
    return hf_dir


def _hf_config():
    from transformers import XLNetConfig

    c = _cfg().model
    return XLNetConfig(
        vocab_size=c.vocab_size,
        d_model=c.d_model,
        n_layer=c.n_layer,
        n_head=c.n_head,
        d_inner=c.d_inner,
        ff_activation=c.ff_activation,
        untie_r=True,
    )


# ---- where a run starts from ------------------------------------------------------------------------------------


@pytest.mark.slow  # trains
def test_init_from_our_run_starts_from_its_weights_and_records_it(source, records, tmp_path, capsys):
    code, err = _continue(capsys, records, tmp_path / "cont", source, "model.mem_len=8", "model.dropout=0.0")
    assert code == 0, err
    last = list_checkpoints(source)[-1][1]
    assert "pretrained checkpoint" in err and "its bias from the checkpoint" in err  # the log goes to stderr
    assert "changed from the checkpoint: dropout 0.1 -> 0.0, mem_len 16 -> 8" in err
    # step 0 is the starting model on these records, to the bit (same function, same batches)
    assert _step0(tmp_path / "cont") == _our_eval(last, records)  # (mem_len differs: 2 batches carry no memory)
    # where it started: train.init in config.yaml (absolute), path and weights sha256 in every step folder
    cfg = load_config(tmp_path / "cont" / "config.yaml")
    assert cfg.train.init == str(source.resolve()) and cfg.model.mem_len == 8
    meta = json.loads((tmp_path / "cont" / "step_0000002" / "meta.json").read_text())
    assert meta["init"] == {
        "path": str(last.resolve()),
        "sha256": sha256_file(last / "model.safetensors"),
        "source": "pretrained checkpoint",
        "lm_bias": True,
    }
    # optimizer, schedule and step start fresh: the first step warms up from 0 (warmup 2: lr/2 at step 1)
    first = next(r for r in read_metrics(tmp_path / "cont") if r["split"] == "train")
    assert first["step"] == 1 and first["lr"] == pytest.approx(_cfg().train.lr / 2)


@pytest.mark.slow  # trains
def test_init_from_our_export_is_bit_identical_to_the_run(source, records, tmp_path, capsys):
    """Our HF export (XLNetLMHeadModel, with its bias) and the run itself start the same model, to the bit."""
    code, _, err = run_main(capsys, "export", str(source), "--out", str(tmp_path / "hf"))
    assert code == 0, err
    runs = {}
    for name, init in (("run", source), ("export", tmp_path / "hf")):
        pretrain(_cfg(*CONTINUE, f"train.init={init}"), records, tmp_path / name, quiet=True)
        runs[name] = tmp_path / name
    assert _step0(runs["run"]) == _step0(runs["export"])
    wa, wb = step_weights(runs["run"] / "step_0000002"), step_weights(runs["export"] / "step_0000002")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    meta = json.loads((runs["export"] / "step_0000002" / "meta.json").read_text())["init"]
    assert meta["source"] == "Hugging Face XLNetLMHeadModel" and meta["lm_bias"] is True
    assert meta["sha256"] == sha256_file(tmp_path / "hf" / "model.safetensors")


@pytest.mark.slow  # trains
def test_init_from_a_bare_model_file_beside_its_config(source, records, tmp_path, capsys):
    """model.safetensors + config.json alone (no tokenizer): the same start; the log says the tokenizer is unchecked."""
    code, _, err = run_main(capsys, "export", str(source), "--out", str(tmp_path / "hf"))
    assert code == 0, err
    (tmp_path / "bare").mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(tmp_path / "hf" / name, tmp_path / "bare" / name)
    code, err = _continue(capsys, records, tmp_path / "cont", tmp_path / "bare" / "model.safetensors")
    assert code == 0, err
    assert "no SentencePiece model" in err
    assert _step0(tmp_path / "cont") == _our_eval(list_checkpoints(source)[-1][1], records)


@pytest.mark.slow  # trains
@pytest.mark.parametrize("cls", ["XLNetLMHeadModel", "XLNetModel", "XLNetForSequenceClassification"])
def test_init_from_a_transformers_directory_matches_its_loss(cls, records, tmp_path, capsys):
    """A directory written by transformers from random weights: the step-0 evaluation equals transformers' own loss on
    the same batches (an XLNetModel under the tied head with a zero bias)."""
    import transformers

    torch.manual_seed(3)
    hf_model = getattr(transformers, cls)(_hf_config())
    with torch.no_grad():  # a visible bias, so that taking it (or not) shows
        for p in hf_model.parameters():
            if p.ndim == 1 and p.shape[0] == _hf_config().vocab_size:
                p.normal_(0, 0.5)
    hf_model.save_pretrained(tmp_path / "hf")
    _with_tokenizer(tmp_path / "hf", records)
    if cls != "XLNetLMHeadModel":  # its transformer under the tied head, bias zero
        lm = transformers.XLNetLMHeadModel(_hf_config())
        lm.transformer.load_state_dict(getattr(hf_model, "transformer", hf_model).state_dict())
        with torch.no_grad():
            lm.lm_loss.bias.zero_()
    else:
        lm = hf_model
    code, err = _continue(capsys, records, tmp_path / "cont", tmp_path / "hf")
    assert code == 0, err
    assert f"Hugging Face {cls}" in err
    assert ("its bias from the checkpoint" if cls == "XLNetLMHeadModel" else "bias zeros") in err
    assert _step0(tmp_path / "cont") == pytest.approx(_hf_loss(lm, records), abs=1e-5)


@pytest.mark.slow  # trains
def test_init_from_a_finetuned_run_takes_its_transformer(source, records, tmp_path, capsys):
    """A finetuned run: its transformer under the tied LM head, bias zeros (its task head left out)."""
    code, _, err = run_main(
        capsys,
        "finetune",
        "--task",
        "classification",
        "--train",
        str(TRAIN_TSV),
        "--init",
        str(source),
        "--out",
        str(tmp_path / "ft"),
        *set_args(["finetune.max_steps=2", "finetune.batch_size=8", "finetune.micro_batch_size=8"]),
        "--set",
        "finetune.max_seq_length=32",
    )
    assert code == 0, err
    code, err = _continue(capsys, records, tmp_path / "cont", tmp_path / "ft")
    assert code == 0, err
    assert "finetuned checkpoint (classification" in err and "bias zeros" in err
    assert _step0(tmp_path / "cont") == _our_eval(tmp_path / "ft", records)
    ft = step_weights(next((tmp_path / "ft").glob("step_*")))
    src = step_weights(list_checkpoints(source)[-1][1])
    assert any(not torch.equal(ft[k], src[k]) for k in src if k.startswith("transformer."))  # it did finetune


# ---- resume -----------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_continued_run_resumes_exactly_after_sigkill(source, records, tmp_path):
    n, save = 30, 5
    over = [*CONTINUE, f"train.max_steps={n}", f"train.save_every={save}", "train.eval_every=10", "train.keep_last=3"]
    cfg_file = write_config(tmp_path / "cfg.yaml", FAST_PRETRAIN + over)
    pretrain(load_config(cfg_file, [f"train.init={source.resolve()}"]), records, tmp_path / "a", quiet=True)
    cmd = [str(BIN / "xlnet"), "pretrain", "--config", str(cfg_file), "--data", str(records), "--quiet"]
    first = tmp_path / "b" / f"step_{save:07d}" / "train_state.safetensors"
    kill_when_written([*cmd, "--out", str(tmp_path / "b"), "--init", str(source)], first)
    # --init again (the same checkpoint, as a requeued job script would pass it) with --resume: its own weights
    out = subprocess.run(
        [*cmd, "--out", str(tmp_path / "b"), "--init", str(source), "--resume"],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert train_losses(tmp_path / "a") == train_losses(tmp_path / "b")
    wa, wb = step_weights(tmp_path / "a" / f"step_{n:07d}"), step_weights(tmp_path / "b" / f"step_{n:07d}")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    meta = json.loads((tmp_path / "b" / f"step_{n:07d}" / "meta.json").read_text())
    assert meta["init"]["path"] == str(list_checkpoints(source)[-1][1].resolve())


@pytest.mark.slow
def test_continued_run_on_two_processes_matches_one(source, records, tmp_path):
    """torchrun (gloo, 2 processes): every rank starts from the checkpoint; the same run as one process."""
    over = [*FAST_PRETRAIN, *CONTINUE, "train.max_steps=4", "model.dropout=0.0", "model.dropatt=0.0"]
    cfg_file = write_config(tmp_path / "cfg.yaml", [*over, f"train.init={source.resolve()}"])
    pretrain(load_config(cfg_file), records, tmp_path / "one", quiet=True)
    cmd = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", "-m", "xlnetcli", "pretrain"]
    args = ["--config", str(cfg_file), "--data", str(records), "--out", str(tmp_path / "two"), "--device", "cpu"]
    out = subprocess.run([*cmd, *args, "--quiet"], env=child_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert _step0(tmp_path / "two") == pytest.approx(_step0(tmp_path / "one"), rel=1e-6)
    l1, l2 = train_losses(tmp_path / "one"), train_losses(tmp_path / "two")
    assert [b for _, b in l2] == pytest.approx([a for _, a in l1], rel=1e-5)  # all-reduce order: ~1e-7 apart


@pytest.mark.slow  # trains
def test_resume_with_another_init_is_refused(source, records, tmp_path, capsys):
    code, err = _continue(capsys, records, tmp_path / "cont", source)
    assert code == 0, err
    code, err = _continue(capsys, records, tmp_path / "scratch", None)
    assert code == 0, err
    other = tmp_path / "other"
    shutil.copytree(source, other)
    code, err = _continue(capsys, records, tmp_path / "cont", other, resume=True)
    assert_one_line_error(code, err, "train.init=", str(source.resolve()), str(other.resolve()))
    code, err = _continue(capsys, records, tmp_path / "scratch", source, resume=True)
    assert_one_line_error(code, err, "train.init=None")


# ---- what cannot continue ---------------------------------------------------------------------------------------


def _refused(capsys, records: Path, tmp_path: Path, init: Path, *needles: str, sets: tuple[str, ...] = ()) -> None:
    out = tmp_path / "cont"
    code, err = _continue(capsys, records, out, init, *sets)
    assert_one_line_error(code, err, *needles)
    assert not out.exists()  # nothing written


def test_architecture_disagreeing_with_the_checkpoint_is_refused(source, records, tmp_path, capsys):
    _refused(capsys, records, tmp_path, source, "model.d_inner=128", "model.d_inner=256", sets=("model.d_inner=256",))


def test_not_an_xlnet_checkpoint_is_refused(records, tmp_path, capsys):
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "notes.txt").write_text("hello")
    _refused(capsys, records, tmp_path, tmp_path / "junk", "holds no checkpoint")
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 64}))
    _refused(capsys, records, tmp_path, tmp_path / "bert", "'bert' model, not XLNet")
    (tmp_path / "list").mkdir()
    (tmp_path / "list" / "config.json").write_text("[1, 2]")
    _refused(capsys, records, tmp_path, tmp_path / "list", "not a JSON object")


def test_weights_disagreeing_with_their_config_are_refused(source, records, tmp_path, capsys):
    code, _, err = run_main(capsys, "export", str(source), "--out", str(tmp_path / "hf"))
    assert code == 0, err
    hc = json.loads((tmp_path / "hf" / "config.json").read_text())
    hc["d_inner"] = 256
    (tmp_path / "hf" / "config.json").write_text(json.dumps(hc))
    _refused(capsys, records, tmp_path, tmp_path / "hf", "shape", sets=("model.d_inner=256",))


def test_tokenizer_larger_than_the_embedding_is_refused(source, records, builds, tmp_path, capsys):
    code, _, err = run_main(capsys, "export", str(source), "--out", str(tmp_path / "hf"))
    assert code == 0, err
    big = builds.pipeline([*FAST_PRETRAIN, "tokenizer.vocab_size=2000", "model.vocab_size=2000"]).tokenizer
    (tmp_path / "hf" / "xlnet_tokenizer.json").unlink()  # a bare spiece.model, as transformers ships one
    shutil.copy(big / "spiece.model", tmp_path / "hf" / "spiece.model")
    _refused(capsys, records, tmp_path, tmp_path / "hf", "2000 pieces", "1000 embeddings")


def test_records_of_another_tokenizer_are_refused(source, builds, tmp_path, capsys):
    from clitools import SAMPLE

    other = builds.pipeline([*FAST_PRETRAIN, "tokenizer.character_coverage=0.995"], src=SAMPLE).records
    _refused(capsys, other, tmp_path, source, "another tokenizer", "xlnet shard --tokenizer")


class _Payload:
    def __reduce__(self):
        return (os.system, ("touch /tmp/xlnet-init-payload-ran",))


def test_pickle_weights_with_a_payload_are_refused_never_run(source, records, tmp_path, capsys):
    code, _, err = run_main(capsys, "export", str(source), "--out", str(tmp_path / "hf"))
    assert code == 0, err
    (tmp_path / "hf" / "model.safetensors").unlink()
    with open(tmp_path / "hf" / "pytorch_model.bin", "wb") as f:
        pickle.dump({"transformer.word_embedding.weight": _Payload()}, f)
    Path("/tmp/xlnet-init-payload-ran").unlink(missing_ok=True)
    _refused(capsys, records, tmp_path, tmp_path / "hf", "pytorch_model.bin", "unreadable")
    assert not Path("/tmp/xlnet-init-payload-ran").exists()
