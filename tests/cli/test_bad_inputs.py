"""The bad-input sweep: every command, fed what users really get wrong.

Each case must give exactly one line on stderr starting with "xlnet: error:", a non-zero exit, no traceback, and
leave no output behind (not the output path, nor a temporary sibling of it).
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from clitools import SAMPLE, TRAIN_TSV, run_main

from xlnetcli.cli import main

pytestmark = pytest.mark.slow  # every test here trains, runs subprocesses or builds large inputs

SMALL_CONFIG = {  # a config file for quick runs of every command
    "tokenizer": {"vocab_size": 1000},
    "model": {
        "vocab_size": 1000,
        "d_model": 32,
        "n_layer": 1,
        "n_head": 2,
        "d_head": 16,
        "d_inner": 64,
        "mem_len": 16,
        "reuse_len": 16,
        "dropout": 0.0,
        "dropatt": 0.0,
    },
    "data": {"seq_len": 32, "num_predict": 5, "valid_fraction": 0.05},
    "train": {
        "global_batch_size": 4,
        "micro_batch_size": 2,
        "max_steps": 2,
        "warmup_steps": 1,
        "eval_every": "never",
        "save_every": "end",
        "keep_last": 1,
        "precision": "fp32",
    },
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
    cfg.write_text(yaml.safe_dump(SMALL_CONFIG))
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
    head = TRAIN_TSV.read_text().splitlines()[:41]
    (w / "train.tsv").write_text("\n".join(head) + "\n")
    (w / "valid.tsv").write_text("\n".join(head[:1] + head[1:21]) + "\n")
    with pytest.raises(SystemExit) as e:
        main(
            [
                str(a)
                for a in [
                    "finetune",
                    "--task",
                    "classification",
                    "--train",
                    w / "train.tsv",
                    "--valid",
                    w / "valid.tsv",
                    "--init",
                    w / "pre",
                    "--out",
                    w / "ft",
                    "--config",
                    cfg,
                    "--quiet",
                ]
            ]
        )
    assert e.value.code == 0
    return w


def _snapshot(parent: Path) -> set[str]:
    return {p.name for p in parent.iterdir()} if parent.is_dir() else set()


def _case(work, name):
    """Build the arguments of one bad-input case; returns (args, output path that must not appear, expected text).
    Each case is a lambda, so only the asked-for case builds its inputs (a corrupt tokenizer, other shards, a NaN
    checkpoint ...), not every case's."""
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
        "tok-missing-input": lambda: (["tokenize", "train", bad / "nope.txt", "--out", out], "nope.txt"),
        "tok-binary": lambda: (
            ["tokenize", "train", text("img.txt", b"\x89PNG\r\n\x1a\n\x00\x00" * 100), "--out", out],
            "binary",
        ),
        "tok-invalid-utf8": lambda: (
            ["tokenize", "train", text("latin.txt", "caf\xe9 cr\xe8me ".encode("latin-1") * 200), "--out", out],
            "UTF-8",
        ),
        "tok-empty": lambda: (["tokenize", "train", text("empty.txt", ""), "--out", out], "no text"),
        "tok-lines-too-long": lambda: (
            [
                "tokenize",
                "train",
                text("long.txt", ((" ".join(["alpha", "beta"] * 4000) + "\n") * 3).encode()),
                "--out",
                out,
                "--set",
                "tokenizer.vocab_size=100",
            ],
            "split the text into lines",
        ),
        "tok-dir-without-text": lambda: (
            ["tokenize", "train", (bad / "d").mkdir() or bad / "d", "--out", out],
            "no text",
        ),
        "tok-existing-output": lambda: (["tokenize", "train", SAMPLE, "--out", w / "tok"], "--overwrite"),
        "tok-unknown-key": lambda: (
            ["tokenize", "train", SAMPLE, "--out", out, "--set", "tokenizer.vocab=10"],
            "unknown key tokenizer.vocab",
        ),
        "tok-wrong-type": lambda: (
            ["tokenize", "train", SAMPLE, "--out", out, "--set", "tokenizer.uncased=maybe"],
            "tokenizer.uncased",
        ),
        "config-bad-yaml": lambda: (
            ["tokenize", "train", SAMPLE, "--out", out, "--config", text("c.yaml", "model: [1, 2\n")],
            "not valid YAML",
        ),
        "config-missing": lambda: (
            ["tokenize", "train", SAMPLE, "--out", out, "--config", bad / "missing.yaml"],
            "config file not found",
        ),
        # --- tokenize encode
        "encode-missing-tokenizer": lambda: (
            ["tokenize", "encode", "--tokenizer", bad / "notok", "--text", "hi"],
            "notok",
        ),
        "encode-corrupt-model": lambda: (
            ["tokenize", "encode", "--tokenizer", _corrupt_tokenizer(w, bad), "--text", "hi"],
            "tokenizer",
        ),
        # --- shard
        "shard-gz-corrupt": lambda: (
            ["shard", text("c.txt.gz", b"\x1f\x8b\x08\x00garbage"), "--tokenizer", w / "tok", "--out", out],
            "c.txt.gz",
        ),
        "shard-existing-output": lambda: (
            ["shard", SAMPLE, "--tokenizer", w / "tok", "--out", w / "shards"],
            "--overwrite",
        ),
        "shard-blank-corpus": lambda: (
            ["shard", text("blank.txt", "\n\n   \n"), "--tokenizer", w / "tok", "--out", out],
            "no text",
        ),
        "shard-tokenizer-edited": lambda: (
            ["shard", SAMPLE, "--tokenizer", _edited_tokenizer(w, bad), "--out", out],
            "tokenizer",
        ),
        # --- preprocess
        "prep-not-shards": lambda: (["preprocess", "--shards", w / "tok", "--out", out, "--config", cfg], "manifest"),
        "prep-too-small": lambda: (
            ["preprocess", "--shards", _tiny_shards(w, bad), "--out", out, "--config", cfg],
            "tokens",
        ),
        "prep-odd-bi-batch": lambda: (
            [
                "preprocess",
                "--shards",
                w / "shards",
                "--out",
                out,
                "--config",
                cfg,
                "--set",
                "train.micro_batch_size=3",
                "--set",
                "train.global_batch_size=3",
            ],
            "even",
        ),
        "prep-num-predict": lambda: (
            ["preprocess", "--shards", w / "shards", "--out", out, "--config", cfg, "--set", "data.num_predict=40"],
            "num_predict",
        ),
        "prep-other-tokenizer": lambda: (
            ["preprocess", "--shards", _other_tokenizer_shards(w, bad), "--out", out, "--config", cfg],
            "tokenizer",
        ),
        # --- pretrain
        "pre-records-disagree": lambda: (
            ["pretrain", "--config", cfg, "--data", w / "records", "--out", out, "--set", "data.num_predict=6"],
            "num_predict",
        ),
        "pre-missing-data": lambda: (["pretrain", "--config", cfg, "--data", bad / "nodata", "--out", out], "nodata"),
        "pre-other-run": lambda: (
            ["pretrain", "--config", cfg, "--data", w / "records", "--out", w / "pre", "--set", "model.d_inner=128"],
            "--resume",
        ),
        "pre-batch-maths": lambda: (
            ["pretrain", "--config", cfg, "--data", w / "records", "--out", out, "--set", "train.global_batch_size=5"],
            "multiple",
        ),
        "pre-interrupted-run": lambda: (
            ["pretrain", "--config", cfg, "--data", w / "records", "--out", _interrupted_run(w, bad), "--resume"],
            "step_",
        ),
        # --- finetune
        "ft-missing-column": lambda: (
            [
                "finetune",
                "--task",
                "classification",
                "--train",
                w / "train.tsv",
                "--init",
                w / "pre",
                "--out",
                out,
                "--config",
                cfg,
                "--label-column",
                "gold",
            ],
            "gold",
        ),
        "ft-empty-train": lambda: (
            [
                "finetune",
                "--task",
                "classification",
                "--train",
                text("e.tsv", ""),
                "--init",
                w / "pre",
                "--out",
                out,
                "--config",
                cfg,
            ],
            "e.tsv",
        ),
        "ft-unseen-label": lambda: (
            [
                "finetune",
                "--task",
                "classification",
                "--train",
                w / "train.tsv",
                "--valid",
                text("v.tsv", "text\tlabel\nsome words here\tmystery\n"),
                "--init",
                w / "pre",
                "--out",
                out,
                "--config",
                cfg,
            ],
            "mystery",
        ),
        "ft-not-a-checkpoint": lambda: (
            [
                "finetune",
                "--task",
                "classification",
                "--train",
                w / "train.tsv",
                "--init",
                w / "shards",
                "--out",
                out,
                "--config",
                cfg,
            ],
            "shards",
        ),
        "ft-nan-weights": lambda: (
            [
                "finetune",
                "--task",
                "classification",
                "--train",
                w / "train.tsv",
                "--init",
                _nan_checkpoint(w, bad),
                "--out",
                out,
                "--config",
                cfg,
            ],
            "non-finite",
        ),
        # --- eval / export / import
        "eval-nothing-to-score": lambda: (["eval", w / "ft"], "--file"),
        "eval-missing-file": lambda: (["eval", w / "ft", "--file", bad / "nofile.tsv"], "nofile.tsv"),
        "eval-empty-file": lambda: (["eval", w / "ft", "--file", text("e.tsv", "text\tlabel\n")], "e.tsv: no examples"),
        "eval-unseen-label": lambda: (
            ["eval", w / "ft", "--file", text("v.tsv", "text\tlabel\nsome words\tmystery\n"), "--output", out],
            "v.tsv: label(s) never seen in the training data: 'mystery' (1x); known labels: ",
        ),
        "eval-nan-weights": lambda: (["eval", _nan_checkpoint(w, bad), "--data", w / "records"], "non-finite"),
        "export-missing": lambda: (["export", bad / "nockpt", "--out", out], "nockpt"),
        "import-not-hf": lambda: (["import", "--from-hf", w / "tok", "--out", out], "config.json"),
    }
    cases.update(_value_and_usage_cases(w, bad, out, text))
    args, expect = cases[name]()
    return args, out, expect


# "billion laughs": 9 levels of 9 aliases, a few hundred bytes that expand to 9**9 values
BOMB = "tokenizer:\n  threads: &a [1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + "".join(
    f"  k{i}: &b{i} [{', '.join([f'*{prev}'] * 9)}]\n" for i, prev in enumerate(["a"] + [f"b{j}" for j in range(7)])
)


def _value_and_usage_cases(w: Path, bad: Path, out: Path, text) -> dict:
    """Bad config values (every section, from --set and from files), --set keys a command does not read, and click
    usage errors: each must be one `xlnet: error:` line naming the key or option and what is allowed."""
    cfg = w / "small.yaml"
    rec, pre, ft = w / "records", w / "pre", w / "ft"
    pretrain = ["pretrain", "--config", cfg, "--data", rec, "--out", out]
    tok = ["tokenize", "train", SAMPLE, "--out", out]
    shard = ["shard", SAMPLE, "--tokenizer", w / "tok", "--out", out]
    prep = ["preprocess", "--shards", w / "shards", "--out", out, "--config", cfg]
    fine = [
        "finetune",
        "--task",
        "classification",
        "--train",
        w / "train.tsv",
        "--init",
        pre,
        "--out",
        out,
        "--config",
        cfg,
    ]
    return {
        # --- config values, via --set (each names the key and the allowed range)
        "pre-lr-nan": lambda: ([*pretrain, "--set", "train.lr=.nan"], "train.lr must be a finite number > 0, got nan"),
        "pre-lr-inf": lambda: ([*pretrain, "--set", "train.lr=inf"], "train.lr must be a finite number > 0, got inf"),
        "pre-adam-betas": lambda: (
            [*pretrain, "--set", "train.adam_betas=[0.9, 1.0]"],
            "train.adam_betas[1] must be in [0, 1)",
        ),
        "pre-adam-eps-negative": lambda: ([*pretrain, "--set", "train.adam_eps=-1e-6"], "train.adam_eps must be"),
        "pre-layer-norm-eps": lambda: (
            [*pretrain, "--set", "model.layer_norm_eps=-1e-12"],
            "model.layer_norm_eps must be in",
        ),
        "pre-seed-negative": lambda: ([*pretrain, "--set", "train.seed=-1"], "train.seed must be in [0, 4294967295]"),
        "pre-weight-decay": lambda: ([*pretrain, "--set", "train.weight_decay=-0.01"], "train.weight_decay must be"),
        "pre-save-every": lambda: ([*pretrain, "--set", "train.save_every=-1"], "train.save_every must be >= 1"),
        "pre-clip-norm-inf": lambda: ([*pretrain, "--set", "train.clip_norm=inf"], "train.clip_norm must be a finite"),
        "pre-min-lr-ratio": lambda: (
            [*pretrain, "--set", "train.min_lr_ratio=2"],
            "train.min_lr_ratio must be in [0, 1]",
        ),
        "pre-warmup-over-max": lambda: ([*pretrain, "--set", "train.warmup_steps=10"], "train.warmup_steps"),
        "pre-keep-last-zero": lambda: ([*pretrain, "--set", "train.keep_last=0"], "train.keep_last must be >= 1"),
        "pre-eval-batches": lambda: ([*pretrain, "--set", "train.eval_batches=0"], "train.eval_batches must be >= 1"),
        "pre-log-every": lambda: ([*pretrain, "--set", "train.log_every=0"], "train.log_every must be >= 1"),
        "pre-peak-tflops": lambda: ([*pretrain, "--set", "train.peak_tflops=-1"], "train.peak_tflops must be"),
        "pre-init-range-nan": lambda: ([*pretrain, "--set", "model.initializer_range=.nan"], "model.initializer_range"),
        "pre-mem-len": lambda: ([*pretrain, "--set", "model.mem_len=-1"], "model.mem_len must be >= 0"),
        "pre-clamp-len": lambda: ([*pretrain, "--set", "model.clamp_len=-2"], "model.clamp_len must be >= -1"),
        "pre-dropout-one": lambda: ([*pretrain, "--set", "model.dropout=1"], "model.dropout must be in [0, 1)"),
        "pre-n-head-zero": lambda: ([*pretrain, "--set", "model.n_head=0"], "model.n_head must be >= 1"),
        "pre-max-steps-zero": lambda: ([*pretrain, "--set", "train.max_steps=0"], "train.max_steps must be >= 1"),
        "pre-set-finetune": lambda: ([*pretrain, "--set", "finetune.lr=1e-5"], "xlnet pretrain reads tokenizer.*"),
        "pre-resume-word": lambda: (["pretrain", "--data", rec, "--out", pre, "--resume", "first"], "--resume takes"),
        "pre-config-folder": lambda: (["pretrain", "--config", w / "tok", "--data", rec, "--out", out], "is a folder"),
        "pre-config-unknown": lambda: (
            ["pretrain", "--config", "tinyy", "--data", rec, "--out", out],
            "tiny, base, large, glue, squad, race",
        ),
        "pre-missing-data-option": lambda: (["pretrain", "--config", cfg, "--out", out], "Missing option '--data'"),
        # --- tokenizer values (SentencePiece's own limits, checked before it runs)
        "tok-threads-negative": lambda: ([*tok, "--threads", "-1"], "tokenizer.threads must be in [0, 1024]"),
        "tok-threads-too-many": lambda: ([*tok, "--threads", "5000"], "tokenizer.threads must be in [0, 1024]"),
        "tok-vocab-int-range": lambda: (
            [*tok, "--vocab-size", "3000000000"],
            "tokenizer.vocab_size must be in [9, 2147483647]",
        ),
        "tok-input-sentence-size": lambda: ([*tok, "--input-sentence-size", "-1"], "tokenizer.input_sentence_size"),
        "tok-character-coverage": lambda: (
            [*tok, "--character-coverage", "0.5"],
            "character_coverage must be in [0.98, 1]",
        ),
        "tok-set-other-section": lambda: ([*tok, "--set", "train.lr=1"], "xlnet tokenize train reads tokenizer.*"),
        "tok-vocab-abc": lambda: ([*tok, "--vocab-size", "abc"], "Invalid value for '--vocab-size'"),
        "tok-missing-out": lambda: (["tokenize", "train", SAMPLE], "Missing option '--out'"),
        "tok-set-no-section": lambda: ([*tok, "--set", "lr=1"], "expected section.key=value"),
        "tok-set-huge-value": lambda: ([*tok, "--set", "tokenizer.uncased=" + "x" * 100_000], "tokenizer.uncased"),
        # --- config files
        "config-alias-bomb": lambda: ([*tok, "--config", text("bomb.yaml", BOMB)], "aliases"),
        "config-alias-in-set": lambda: ([*tok, "--set", "tokenizer.threads=[&a 1, *a]"], "aliases"),
        "config-not-a-mapping": lambda: ([*tok, "--config", text("list.yaml", "- 1\n- 2\n")], "mapping"),
        "config-unknown-section": lambda: (
            [*tok, "--config", text("sec.yaml", "tokeniser:\n  threads: 1\n")],
            "unknown section 'tokeniser'",
        ),
        "config-file-value": lambda: (
            [*tok, "--config", text("v.yaml", "tokenizer:\n  threads: -1\n")],
            "v.yaml: tokenizer.threads must be in [0, 1024]",
        ),
        "config-binary-file": lambda: ([*tok, "--config", text("b.yaml", b"\xff\xfe\x00garbage")], "not valid YAML"),
        "config-show-unknown": lambda: (["config", "show", "nope"], "nor a preset name"),
        "config-show-bad-set": lambda: (["config", "show", "tiny", "--set", "train.lr=-1"], "--set train.lr=-1"),
        "config-show-folder": lambda: (["config", "show", bad], "is a folder"),
        "config-show-bomb": lambda: (["config", "show", text("bomb2.yaml", BOMB)], "aliases"),
        # --- tokenize encode
        "encode-neither": lambda: (["tokenize", "encode", "--tokenizer", w / "tok"], "pass either --text"),
        "encode-missing-tokenizer-option": lambda: (
            ["tokenize", "encode", "--text", "hi"],
            "Missing option '--tokenizer'",
        ),
        # --- shard
        "shard-shards-abc": lambda: ([*shard, "--shards", "abc"], "'abc' is not a valid integer"),
        "shard-shards-zero": lambda: ([*shard, "--shards", "0"], "--shards"),
        "shard-too-many-shards": lambda: ([*shard, "--shards", str(_beyond_open_file_limit())], "open files"),
        "shard-workers-zero": lambda: ([*shard, "--workers", "0"], "--workers"),
        "shard-valid-fraction": lambda: ([*shard, "--valid-fraction", "1.5"], "--valid-fraction"),
        "shard-seed-negative": lambda: ([*shard, "--seed", "-1"], "--seed"),
        "shard-missing-tokenizer": lambda: (["shard", SAMPLE, "--out", out], "Missing option '--tokenizer'"),
        "shard-set-model": lambda: ([*shard, "--set", "model.d_model=64"], "xlnet shard reads data.*"),
        "shard-unknown-option": lambda: ([*shard, "--foo"], "No such option"),
        "shard-valid-and-fraction": lambda: ([*shard, "--valid", SAMPLE, "--valid-fraction", "0.1"], "not both"),
        "shard-data-seed": lambda: ([*shard, "--set", "data.seed=-5"], "data.seed must be in [0, 4294967295]"),
        # --- preprocess
        "prep-passes-zero": lambda: ([*prep, "--passes", "0"], "--passes"),
        "prep-workers-abc": lambda: ([*prep, "--workers", "abc"], "--workers"),
        "prep-mask-mode": lambda: ([*prep, "--mask-mode", "nope"], "'nope' is not one of"),
        "prep-set-finetune": lambda: ([*prep, "--set", "finetune.lr=1"], "xlnet preprocess reads"),
        "prep-perm-size-zero": lambda: ([*prep, "--set", "data.perm_size=0"], "data.perm_size must be >= 1"),
        "prep-mask-beta-zero": lambda: ([*prep, "--set", "data.mask_beta=0"], "data.mask_beta must be >= 1"),
        "prep-valid-fraction": lambda: (
            [*prep, "--set", "data.valid_fraction=1"],
            "data.valid_fraction must be in [0, 1)",
        ),
        # --- finetune
        "ft-set-train-lr": lambda: ([*fine, "--set", "train.lr=1e-3"], "did you mean finetune.lr?"),
        "ft-max-steps-negative": lambda: ([*fine, "--set", "finetune.max_steps=-1"], "finetune.max_steps must be >= 1"),
        "ft-layer-decay-zero": lambda: (
            [*fine, "--set", "finetune.layer_decay=0"],
            "finetune.layer_decay must be in (0, 1]",
        ),
        "ft-epochs-zero": lambda: ([*fine, "--set", "finetune.epochs=0"], "finetune.epochs must be"),
        "ft-lr-nan": lambda: ([*fine, "--set", "finetune.lr=nan"], "finetune.lr must be a finite number > 0"),
        "ft-doc-stride-zero": lambda: ([*fine, "--set", "finetune.doc_stride=0"], "finetune.doc_stride must be >= 1"),
        "ft-warmup-ratio": lambda: (
            [*fine, "--set", "finetune.warmup_ratio=1"],
            "finetune.warmup_ratio must be in [0, 1)",
        ),
        "ft-task-unknown": lambda: (
            ["finetune", "--task", "nope", "--train", w / "train.tsv", "--init", pre, "--out", out],
            "'nope' is not one of",
        ),
        "ft-missing-init": lambda: (
            ["finetune", "--task", "classification", "--train", w / "train.tsv", "--out", out],
            "Missing option '--init'",
        ),
        "ft-preset-unknown": lambda: ([*fine[:-1], "gluee"], "nor a preset name"),
        # --- eval / export / import / plot / the command itself
        "eval-batches-zero": lambda: (["eval", pre, "--data", rec, "--batches", "0"], "--batches"),
        "eval-batch-size-abc": lambda: (["eval", ft, "--file", w / "train.tsv", "--batch-size", "abc"], "--batch-size"),
        "eval-missing-checkpoint": lambda: (["eval"], "Missing argument"),
        "export-format": lambda: (["export", pre, "--format", "onnx", "--out", out], "--format"),
        "import-missing-out": lambda: (["import", "--from-hf", pre], "Missing option '--out'"),
        "plot-missing-run": lambda: (["plot", bad / "norun"], "norun"),
        "usage-unknown-command": lambda: (["pretrian", "--data", rec], "No such command 'pretrian'"),
    }


def _beyond_open_file_limit() -> int:
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return 10**9 if hard == resource.RLIM_INFINITY else hard  # 2 files a shard: always over the hard limit


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
        main(
            [str(a) for a in ["shard", src, "--tokenizer", w / "tok", "--out", out, "--quiet", "--valid-fraction", "0"]]
        )
    assert e.value.code == 0
    return out


def _other_tokenizer_shards(w: Path, bad: Path) -> Path:
    tok2, out = bad / "tok2", bad / "shards2"
    for args in (
        ["tokenize", "train", SAMPLE, "--out", tok2, "--vocab-size", "900", "--quiet"],
        ["shard", SAMPLE, "--tokenizer", tok2, "--out", out, "--quiet"],
    ):
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
        # as a diverged run would have saved it: the checksum in meta.json matches the NaN weights
        from xlnetcli.core.files import sha256_file

        meta = json.loads((step / "meta.json").read_text())
        meta["sha256"]["model.safetensors"] = sha256_file(step / "model.safetensors")
        (step / "meta.json").write_text(json.dumps(meta))
    return run


CASES = [
    "tok-lines-too-long",
    "tok-missing-input",
    "tok-binary",
    "tok-invalid-utf8",
    "tok-empty",
    "tok-dir-without-text",
    "tok-existing-output",
    "tok-unknown-key",
    "tok-wrong-type",
    "config-bad-yaml",
    "config-missing",
    "encode-missing-tokenizer",
    "encode-corrupt-model",
    "shard-gz-corrupt",
    "shard-existing-output",
    "shard-blank-corpus",
    "shard-tokenizer-edited",
    "prep-not-shards",
    "prep-too-small",
    "prep-odd-bi-batch",
    "prep-num-predict",
    "prep-other-tokenizer",
    "pre-records-disagree",
    "pre-missing-data",
    "pre-other-run",
    "pre-batch-maths",
    "pre-interrupted-run",
    "ft-missing-column",
    "ft-empty-train",
    "ft-unseen-label",
    "ft-not-a-checkpoint",
    "ft-nan-weights",
    "eval-nothing-to-score",
    "eval-missing-file",
    "eval-empty-file",
    "eval-unseen-label",
    "eval-nan-weights",
    "export-missing",
    "import-not-hf",
]
VALUE_AND_USAGE_CASES = [
    "pre-lr-nan",
    "pre-lr-inf",
    "pre-adam-betas",
    "pre-adam-eps-negative",
    "pre-layer-norm-eps",
    "pre-seed-negative",
    "pre-weight-decay",
    "pre-save-every",
    "pre-clip-norm-inf",
    "pre-min-lr-ratio",
    "pre-warmup-over-max",
    "pre-keep-last-zero",
    "pre-eval-batches",
    "pre-log-every",
    "pre-peak-tflops",
    "pre-init-range-nan",
    "pre-mem-len",
    "pre-clamp-len",
    "pre-dropout-one",
    "pre-n-head-zero",
    "pre-max-steps-zero",
    "pre-set-finetune",
    "pre-resume-word",
    "pre-config-folder",
    "pre-config-unknown",
    "pre-missing-data-option",
    "tok-threads-negative",
    "tok-threads-too-many",
    "tok-vocab-int-range",
    "tok-input-sentence-size",
    "tok-character-coverage",
    "tok-set-other-section",
    "tok-vocab-abc",
    "tok-missing-out",
    "tok-set-no-section",
    "tok-set-huge-value",
    "config-alias-bomb",
    "config-alias-in-set",
    "config-not-a-mapping",
    "config-unknown-section",
    "config-file-value",
    "config-binary-file",
    "config-show-unknown",
    "config-show-bad-set",
    "config-show-folder",
    "config-show-bomb",
    "encode-neither",
    "encode-missing-tokenizer-option",
    "shard-shards-abc",
    "shard-shards-zero",
    "shard-too-many-shards",
    "shard-workers-zero",
    "shard-valid-fraction",
    "shard-seed-negative",
    "shard-missing-tokenizer",
    "shard-set-model",
    "shard-unknown-option",
    "shard-valid-and-fraction",
    "shard-data-seed",
    "prep-passes-zero",
    "prep-workers-abc",
    "prep-mask-mode",
    "prep-set-finetune",
    "prep-perm-size-zero",
    "prep-mask-beta-zero",
    "prep-valid-fraction",
    "ft-set-train-lr",
    "ft-max-steps-negative",
    "ft-layer-decay-zero",
    "ft-epochs-zero",
    "ft-lr-nan",
    "ft-doc-stride-zero",
    "ft-warmup-ratio",
    "ft-task-unknown",
    "ft-missing-init",
    "ft-preset-unknown",
    "eval-batches-zero",
    "eval-batch-size-abc",
    "eval-missing-checkpoint",
    "export-format",
    "import-missing-out",
    "plot-missing-run",
    "usage-unknown-command",
]
CASES += VALUE_AND_USAGE_CASES


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
    assert code == 2 and len(errors[0]) < 600, f"{name}: exit {code}, {len(errors[0])} characters"
    after = _snapshot(out.parent)
    assert after == before, f"{name}: left output behind: {sorted(after - before)}"


def test_sweep_is_wide():
    assert len(CASES) >= 100 and len(set(CASES)) == len(CASES)
    commands = {c.split("-")[0] for c in CASES}
    assert {"tok", "encode", "shard", "prep", "pre", "ft", "eval", "export", "import", "config"} <= commands


def test_gzip_input_works(work, tmp_path, capsys):
    """The counterpart of the corrupt-gzip case: a real .gz corpus shards fine."""
    gz = tmp_path / "sample.txt.gz"
    gz.write_bytes(gzip.compress(SAMPLE.read_bytes()))
    code, _, err = run_cli(["shard", gz, "--tokenizer", work / "tok", "--out", tmp_path / "s", "--quiet"], capsys)
    assert code == 0, err


def test_resume_without_the_run_config_uses_the_latest_checkpoints(work, tmp_path, capsys):
    """Every step folder carries the run's config: a deleted run-level config.yaml does not block --resume."""
    run = tmp_path / "run"
    shutil.copytree(work / "pre", run)
    (run / "config.yaml").unlink()
    code, _, err = run_cli(["pretrain", "--data", work / "records", "--out", run], capsys)  # not a fresh start
    assert code == 2 and "already holds a pretraining run" in err and "--resume" in err
    code, _, err = run_cli(
        ["pretrain", "--data", work / "records", "--out", run, "--resume", "--set", "train.max_steps=3", "--quiet"],
        capsys,
    )
    assert code == 0, err
    assert (run / "step_0000003" / "model.safetensors").is_file()
    restored = yaml.safe_load((run / "config.yaml").read_text())  # the run's config is back, as it was
    assert restored == yaml.safe_load((run / "step_0000003" / "config.yaml").read_text())
    assert {k: restored["model"][k] for k in SMALL_CONFIG["model"]} == SMALL_CONFIG["model"]
    assert restored["train"]["max_steps"] == 3
