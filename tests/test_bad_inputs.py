"""The bad-input sweep: every command, fed what users really get wrong.

Each case must give exactly one line on stderr starting with "xlnet: error:", a non-zero exit, no traceback, and
leave no output behind (not the output path, nor a temporary sibling of it).
"""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from clitools import run_main

from xlnetcli.cli import main

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "tests" / "data" / "sample.txt"
TASK_TRAIN = ROOT / "data" / "pydocs" / "task_train.tsv"

SMALL = {
    "tokenizer": {"vocab_size": 1000},
    "model": {"vocab_size": 1000, "d_model": 32, "n_layer": 1, "n_head": 2, "d_head": 16, "d_inner": 64,
              "mem_len": 16, "reuse_len": 16, "dropout": 0.0, "dropatt": 0.0},
    "data": {"seq_len": 32, "num_predict": 5, "valid_fraction": 0.05},
    "train": {"global_batch_size": 4, "micro_batch_size": 2, "max_steps": 2, "warmup_steps": 1, "eval_every": 0,
              "save_every": 0, "keep_last": 1, "precision": "fp32"},
    "finetune": {"max_seq_length": 32, "batch_size": 8, "micro_batch_size": 8, "max_steps": 2},
}


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    return run_main(capsys, *args)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A small but real pipeline: config, tokenizer, shards, records, a pretrained and a finetuned checkpoint."""
    import _pytest.capture  # noqa: F401  (capsys is function-scoped; run the builders without it)

    w = tmp_path_factory.mktemp("bad")
    cfg = w / "small.yaml"
    cfg.write_text(yaml.safe_dump(SMALL))
    steps = [
        ["tokenize", "train", SAMPLE, "--out", w / "tok", "--config", cfg, "--quiet"],
        ["shard", SAMPLE, "--tokenizer", w / "tok", "--out", w / "shards", "--config", cfg, "--quiet"],
        ["preprocess", "--shards", w / "shards", "--out", w / "records", "--config", cfg],
        ["pretrain", "--config", cfg, "--data", w / "records", "--out", w / "pre", "--quiet"],
    ]
    for args in steps:
        with pytest.raises(SystemExit) as e:
            main([str(a) for a in args])
        assert e.value.code == 0, args
    head = TASK_TRAIN.read_text().splitlines()[:41]
    (w / "train.tsv").write_text("\n".join(head) + "\n")
    (w / "valid.tsv").write_text("\n".join(head[:1] + head[1:21]) + "\n")
    with pytest.raises(SystemExit) as e:
        main([str(a) for a in ["finetune", "--task", "classification", "--train", w / "train.tsv", "--valid",
                               w / "valid.tsv", "--init", w / "pre", "--out", w / "ft", "--config", cfg, "--quiet"]])
    assert e.value.code == 0
    return w


def _snapshot(parent: Path) -> set[str]:
    return {p.name for p in parent.iterdir()} if parent.is_dir() else set()


def _case(work, name):
    """Build the arguments of one bad-input case; returns (args, output path that must not appear, expected text)."""
    w = work
    cfg = w / "small.yaml"
    bad = w / "cases" / name
    bad.mkdir(parents=True, exist_ok=True)
    out = bad / "out"

    def text(fname, content: str | bytes) -> Path:
        p = bad / fname
        p.write_bytes(content if isinstance(content, bytes) else content.encode())
        return p

    cases = {
        # --- tokenize train
        "tok-missing-input": (["tokenize", "train", bad / "nope.txt", "--out", out], "nope.txt"),
        "tok-binary": (["tokenize", "train", text("img.txt", b"\x89PNG\r\n\x1a\n\x00\x00" * 100), "--out", out],
                       "binary"),
        "tok-invalid-utf8": (["tokenize", "train", text("latin.txt", "caf\xe9 cr\xe8me ".encode("latin-1") * 200),
                              "--out", out], "UTF-8"),
        "tok-empty": (["tokenize", "train", text("empty.txt", ""), "--out", out], "no text"),
        "tok-dir-without-text": (["tokenize", "train", (bad / "d").mkdir() or bad / "d", "--out", out], "no text"),
        "tok-existing-output": (["tokenize", "train", SAMPLE, "--out", w / "tok"], "--overwrite"),
        "tok-unknown-key": (["tokenize", "train", SAMPLE, "--out", out, "--set", "tokenizer.vocab=10"],
                            "unknown key tokenizer.vocab"),
        "tok-wrong-type": (["tokenize", "train", SAMPLE, "--out", out, "--set", "tokenizer.uncased=maybe"],
                           "tokenizer.uncased"),
        "config-bad-yaml": (["tokenize", "train", SAMPLE, "--out", out, "--config", text("c.yaml", "model: [1, 2\n")],
                            "not valid YAML"),
        "config-missing": (["tokenize", "train", SAMPLE, "--out", out, "--config", bad / "missing.yaml"],
                           "config file not found"),
        # --- tokenize encode
        "encode-missing-tokenizer": (["tokenize", "encode", "--tokenizer", bad / "notok", "--text", "hi"], "notok"),
        "encode-corrupt-model": (["tokenize", "encode", "--tokenizer", _corrupt_tokenizer(w, bad), "--text", "hi"],
                                 "tokenizer"),
        # --- shard
        "shard-gz-corrupt": (["shard", text("c.txt.gz", b"\x1f\x8b\x08\x00garbage"), "--tokenizer", w / "tok",
                              "--out", out], "c.txt.gz"),
        "shard-existing-output": (["shard", SAMPLE, "--tokenizer", w / "tok", "--out", w / "shards"],
                                  "--overwrite"),
        "shard-blank-corpus": (["shard", text("blank.txt", "\n\n   \n"), "--tokenizer", w / "tok", "--out", out],
                               "no text"),
        "shard-tokenizer-edited": (["shard", SAMPLE, "--tokenizer", _edited_tokenizer(w, bad), "--out", out],
                                   "tokenizer"),
        # --- preprocess
        "prep-not-shards": (["preprocess", "--shards", w / "tok", "--out", out, "--config", cfg], "manifest"),
        "prep-too-small": (["preprocess", "--shards", _tiny_shards(w, bad), "--out", out, "--config", cfg],
                           "tokens"),
        "prep-odd-bi-batch": (["preprocess", "--shards", w / "shards", "--out", out, "--config", cfg,
                               "--set", "train.micro_batch_size=3", "--set", "train.global_batch_size=3"], "even"),
        "prep-num-predict": (["preprocess", "--shards", w / "shards", "--out", out, "--config", cfg,
                              "--set", "data.num_predict=40"], "num_predict"),
        "prep-other-tokenizer": (["preprocess", "--shards", _other_tokenizer_shards(w, bad), "--out", out,
                                  "--config", cfg], "tokenizer"),
        # --- pretrain
        "pre-records-disagree": (["pretrain", "--config", cfg, "--data", w / "records", "--out", out,
                                  "--set", "data.num_predict=6"], "num_predict"),
        "pre-missing-data": (["pretrain", "--config", cfg, "--data", bad / "nodata", "--out", out], "nodata"),
        "pre-other-run": (["pretrain", "--config", cfg, "--data", w / "records", "--out", w / "pre",
                           "--set", "model.d_inner=128"], "--resume"),
        "pre-batch-maths": (["pretrain", "--config", cfg, "--data", w / "records", "--out", out,
                             "--set", "train.global_batch_size=5"], "multiple"),
        "pre-interrupted-run": (["pretrain", "--config", cfg, "--data", w / "records", "--out",
                                 _interrupted_run(w, bad), "--resume"], "step_"),
        # --- finetune
        "ft-missing-column": (["finetune", "--task", "classification", "--train", w / "train.tsv", "--init", w / "pre",
                               "--out", out, "--config", cfg, "--label-column", "gold"], "gold"),
        "ft-empty-train": (["finetune", "--task", "classification", "--train", text("e.tsv", ""), "--init",
                            w / "pre", "--out", out, "--config", cfg], "e.tsv"),
        "ft-unseen-label": (["finetune", "--task", "classification", "--train", w / "train.tsv", "--valid",
                             text("v.tsv", "text\tlabel\nsome words here\tmystery\n"), "--init", w / "pre",
                             "--out", out, "--config", cfg], "mystery"),
        "ft-not-a-checkpoint": (["finetune", "--task", "classification", "--train", w / "train.tsv", "--init",
                                 w / "shards", "--out", out, "--config", cfg], "shards"),
        "ft-nan-weights": (["finetune", "--task", "classification", "--train", w / "train.tsv", "--init",
                            _nan_checkpoint(w, bad), "--out", out, "--config", cfg], "non-finite"),
        # --- eval / export / import
        "eval-nothing-to-score": (["eval", w / "ft"], "--file"),
        "eval-missing-file": (["eval", w / "ft", "--file", bad / "nofile.tsv"], "nofile.tsv"),
        "eval-nan-weights": (["eval", _nan_checkpoint(w, bad), "--data", w / "records"], "non-finite"),
        "export-missing": (["export", bad / "nockpt", "--out", out], "nockpt"),
        "import-not-hf": (["import", "--from-hf", w / "tok", "--out", out], "config.json"),
    }
    args, expect = cases[name]
    return args, out, expect


def _corrupt_tokenizer(w: Path, bad: Path) -> Path:
    d = bad / "tok_corrupt"
    shutil.copytree(w / "tok", d)
    (d / "spiece.model").write_bytes(b"not a sentencepiece model")
    return d


def _edited_tokenizer(w: Path, bad: Path) -> Path:
    d = bad / "tok_edited"
    shutil.copytree(w / "tok", d)
    p = d / "xlnet_tokenizer.json"
    p.write_text(p.read_text().replace('"uncased": false', '"uncased": true'))
    return d


def _tiny_shards(w: Path, bad: Path) -> Path:
    src = bad / "tiny.txt"
    src.write_text("One short line.\n\nAnother one.\n")
    out = bad / "tiny_shards"
    with pytest.raises(SystemExit) as e:
        main([str(a) for a in ["shard", src, "--tokenizer", w / "tok", "--out", out, "--quiet",
                               "--valid-fraction", "0"]])
    assert e.value.code == 0
    return out


def _other_tokenizer_shards(w: Path, bad: Path) -> Path:
    tok2, out = bad / "tok2", bad / "shards2"
    for args in (["tokenize", "train", SAMPLE, "--out", tok2, "--vocab-size", "900", "--quiet"],
                 ["shard", SAMPLE, "--tokenizer", tok2, "--out", out, "--quiet"]):
        with pytest.raises(SystemExit) as e:
            main([str(a) for a in args])
        assert e.value.code == 0
    return out


def _interrupted_run(w: Path, bad: Path) -> Path:
    run = bad / "run"
    shutil.copytree(w / "pre", run)
    step = sorted(run.glob("step_*"))[-1]
    (step / "model.safetensors").write_bytes(b"\x00" * 10)  # a torn write, as after a crash without our atomic rename
    return run


def _nan_checkpoint(w: Path, bad: Path) -> Path:
    from safetensors.numpy import load_file, save_file

    run = bad / "nan_run"
    if not run.exists():
        shutil.copytree(w / "pre", run)
        step = sorted(run.glob("step_*"))[-1]
        tensors = load_file(step / "model.safetensors")
        key = next(k for k in tensors if k.endswith("word_embedding.weight"))
        tensors[key] = tensors[key].copy()
        tensors[key][3, :] = np.nan
        save_file(tensors, step / "model.safetensors")
    return run


CASES = [
    "tok-missing-input", "tok-binary", "tok-invalid-utf8", "tok-empty", "tok-dir-without-text", "tok-existing-output",
    "tok-unknown-key", "tok-wrong-type", "config-bad-yaml", "config-missing",
    "encode-missing-tokenizer", "encode-corrupt-model",
    "shard-gz-corrupt", "shard-existing-output", "shard-blank-corpus", "shard-tokenizer-edited",
    "prep-not-shards", "prep-too-small", "prep-odd-bi-batch", "prep-num-predict", "prep-other-tokenizer",
    "pre-records-disagree", "pre-missing-data", "pre-other-run", "pre-batch-maths", "pre-interrupted-run",
    "ft-missing-column", "ft-empty-train", "ft-unseen-label", "ft-not-a-checkpoint", "ft-nan-weights",
    "eval-nothing-to-score", "eval-missing-file", "eval-nan-weights", "export-missing", "import-not-hf",
]


@pytest.mark.parametrize("name", CASES)
def test_bad_input_is_one_line_and_leaves_nothing(work, name, capsys):
    args, out, expect = _case(work, name)
    before = _snapshot(out.parent)
    code, stdout, err = run_cli(args, capsys)
    assert code != 0, f"{name}: exit code 0\n{stdout}{err}"
    assert "Traceback" not in err and "Traceback" not in stdout
    lines = [ln for ln in err.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("xlnet: error:")]
    assert len(errors) == 1, f"{name}: expected one error line, got:\n{err}"
    assert expect.lower() in errors[0].lower(), f"{name}: {errors[0]!r} does not mention {expect!r}"
    after = _snapshot(out.parent)
    assert after == before, f"{name}: left output behind: {sorted(after - before)}"


def test_sweep_is_wide():
    assert len(CASES) >= 25
    commands = {c.split("-")[0] for c in CASES}
    assert {"tok", "encode", "shard", "prep", "pre", "ft", "eval", "export", "import", "config"} <= commands


def test_gzip_input_works(work, tmp_path, capsys):
    """The counterpart of the corrupt-gzip case: a real .gz corpus shards fine."""
    gz = tmp_path / "sample.txt.gz"
    gz.write_bytes(gzip.compress(SAMPLE.read_bytes()))
    code, _, err = run_cli(["shard", gz, "--tokenizer", work / "tok", "--out", tmp_path / "s", "--quiet"], capsys)
    assert code == 0, err
