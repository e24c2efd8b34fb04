"""`xlnet probe`: a planted feature is found, random labels give chance, the L2 choice never reads the validation
file, the in-process probe leaves a training model as it was, bad input gives one line."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from clitools import BIN, SAMPLE, TINY, assert_one_line_error, child_env, run_main

from xlnetcli.config import load_config
from xlnetcli.core.errors import ConfigError

PROBE_SETS = [
    "tokenizer.vocab_size=1000",
    "model.vocab_size=1000",
    "model.n_layer=2",
    "model.reuse_len=32",
    "model.mem_len=32",
    "data.seq_len=64",
    "finetune.max_seq_length=64",
]
A, B = "thread", "socket"  # single pieces in a 1000-piece vocabulary trained on the sample text


def _lines() -> list[str]:
    """Short real sentences of the sample text that contain neither planted word, in a fixed shuffled order."""
    lines = [
        ln.strip()
        for ln in SAMPLE.read_text(encoding="utf-8").splitlines()
        if 4 <= len(ln.split()) <= 10 and len(ln) <= 80 and "\t" not in ln and not {A, B} & set(ln.lower().split())
    ]
    random.Random(0).shuffle(lines)
    return lines


def _write(path: Path, rows: list[tuple[str, str]]) -> Path:
    path.write_text("text\tlabel\n" + "".join(f"{t}\t{lab}\n" for t, lab in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def env(builds, tmp_path_factory):
    """A tokenizer (shared, conftest.py: read only), a run folder holding the random initialisation (train.seed) and
    labelled files."""
    from xlnetcli.checkpoint.folders import save_model_dir
    from xlnetcli.model import XLNetLMHeadModel

    d = tmp_path_factory.mktemp("probe")
    cfg = load_config(TINY, PROBE_SETS)
    tok = builds.tokenizer(cfg.tokenizer)
    torch.manual_seed(cfg.train.seed)
    save_model_dir(
        d / "run" / "step_0000001",
        XLNetLMHeadModel(cfg.model).eval(),
        cfg,
        tokenizer_dir=tok,
        meta={"kind": "pretrain", "step": 1},
    )
    lines = _lines()
    assert len(lines) >= 1050
    rng = random.Random(1)

    def planted(texts):  # the label is decided by which of two words was inserted somewhere in the sentence
        rows = []
        for t in texts:
            words, lab = t.split(), rng.choice("ab")
            words.insert(rng.randrange(len(words) + 1), A if lab == "a" else B)
            rows.append((" ".join(words), lab))
        return rows

    files = {
        "planted_train": _write(d / "planted_train.tsv", planted(lines[:300])),
        "planted_valid": _write(d / "planted_valid.tsv", planted(lines[300:500])),
        "random_train": _write(d / "random_train.tsv", [(t, rng.choice("ab")) for t in lines[500:800]]),
        "random_valid": _write(d / "random_valid.tsv", [(t, rng.choice("ab")) for t in lines[800:1050]]),
    }
    return {"dir": d, "run": d / "run", "tok": tok, "cfg": cfg, **files}


@pytest.mark.slow
def test_planted_word_is_found_by_both_features(env, capsys):
    """Even random-init features carry token identity: a label decided by one planted word is read off the mean
    (and the <cls>) features far above chance. The checkpoint here is the run's initial weights, so the random-init
    baseline (same train.seed) must give exactly the same numbers."""
    out = env["dir"] / "planted.json"
    code, stdout, err = run_main(
        capsys,
        "probe",
        env["run"],
        "--train",
        env["planted_train"],
        "--valid",
        env["planted_valid"],
        "--baseline",
        "random",
        "--output",
        out,
        "--device",
        "cpu",
    )
    assert code == 0, err
    res = json.loads(out.read_text())
    print(stdout)
    assert [ln.split()[0] for ln in stdout.splitlines()[-2:]] == ["mean", "cls"]
    assert res["train_examples"] == 300 and res["valid_examples"] == 200 and res["labels"] == ["a", "b"]
    assert res["max_seq_length"] == 64 and res["truncated"] == 0  # the checkpoint's finetune.max_seq_length
    pre, rnd = res["results"]["pretrained"], res["results"]["random"]
    assert pre["mean"]["accuracy"] > 0.9, pre  # measured 0.965 (the commonest label: 0.45)
    assert pre["cls"]["accuracy"] > 0.85, pre  # measured 0.96
    assert rnd == pre
    assert set(pre["mean"]["heldout"]) == {"0.0001", "0.001", "0.01", "0.1", "1", "10"}


@pytest.mark.slow
def test_label_curve_rises_with_labelled_rows_and_is_plotted(env, capsys):
    """--train-sizes refits the probe on stratified draws of n training rows (features computed once): on the planted
    task, 200 rows do about as well as all 300 and 20 clearly worse; on random labels every size stays at chance.
    `xlnet plot` draws the curve from the JSON."""
    pytest.importorskip("matplotlib")
    out = env["dir"] / "curve.json"
    code, stdout, err = run_main(
        capsys,
        "probe",
        env["run"],
        "--train",
        env["planted_train"],
        "--valid",
        env["planted_valid"],
        "--train-sizes",
        "20,200,5000",
        "--output",
        out,
        "--device",
        "cpu",
    )
    assert code == 0, err
    res = json.loads(out.read_text())
    mean = res["results"]["pretrained"]["mean"]
    assert [pt["n"] for pt in mean["curve"]] == [20, 200]  # 5000 is not below the 300 training rows: the full file
    note = "--train-sizes 5000 not drawn: not below the 300 training rows"  # said, not silently dropped (issue 35)
    assert res["notes"][0].startswith(note) and f"  {note}" in stdout
    assert all(len(pt["accuracies"]) == 3 for pt in mean["curve"])
    small, large = (pt["accuracy"] for pt in mean["curve"])
    assert small < large - 0.1 and large > 0.9, mean["curve"]  # measured 0.82 and 0.975 (all 300 rows: 0.965)
    assert stdout.splitlines()[-3].split()[0] == "20" and stdout.splitlines()[-1].split()[0] == "300"

    from xlnetcli.evaluate.probe import ProbeSettings, probe

    noise = probe(
        env["run"], env["random_train"], env["random_valid"], ProbeSettings(device="cpu", train_sizes=[20, 100])
    )
    for kind, r in noise["results"]["pretrained"].items():
        for pt in r["curve"]:
            assert abs(pt["accuracy"] - 0.5) < 0.1, (kind, pt)  # sd 0.032 per draw (250 rows); measured 0.49-0.51

    code, stdout, err = run_main(capsys, "plot", out)
    assert code == 0, err
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    code, _, err = run_main(capsys, "plot", env["planted_train"])
    assert_one_line_error(code, err, "not a probe result")


@pytest.mark.slow
def test_random_labels_give_chance(env):
    from xlnetcli.evaluate.probe import ProbeSettings, probe

    res = probe(env["run"], env["random_train"], env["random_valid"], ProbeSettings(device="cpu"))
    for kind, r in res["results"]["pretrained"].items():
        # 250 validation examples: the accuracy of a guess has standard deviation 0.032; 0.1 is 3.2 of them
        assert abs(r["accuracy"] - 0.5) < 0.1, (kind, r)  # measured 0.48 / 0.50
        assert r["train_accuracy"] > r["accuracy"]  # it does fit its training rows (noise), which is not transferred


@pytest.mark.slow
def test_l2_choice_never_reads_the_validation_file(env, tmp_path):
    """Flipping every validation label leaves the L2 choice, the held-out scores and the fitted probe unchanged;
    only the final validation accuracy turns into 1 - accuracy."""
    from xlnetcli.evaluate.probe import ProbeSettings, probe

    text = env["random_valid"].read_text().splitlines()
    flip = {"a": "b", "b": "a"}
    flipped = _write(tmp_path / "flipped.tsv", [(t, flip[lab]) for t, lab in (ln.split("\t") for ln in text[1:])])
    one = probe(env["run"], env["random_train"], env["random_valid"], ProbeSettings(device="cpu"))
    two = probe(env["run"], env["random_train"], flipped, ProbeSettings(device="cpu"))
    for kind in ("mean", "cls"):
        a, b = one["results"]["pretrained"][kind], two["results"]["pretrained"][kind]
        assert (a["l2"], a["heldout"], a["train_accuracy"]) == (b["l2"], b["heldout"], b["train_accuracy"])
        assert b["accuracy"] == pytest.approx(1 - a["accuracy"])
        assert len(set(a["heldout"].values())) > 1  # the grid is a real choice on this (noisy) data


@pytest.mark.slow
def test_probe_checkpoint_in_process_leaves_the_model_as_it_was(env):
    """What the training engine calls every train.probe_every steps: a model object in train mode (dropout on),
    rows from one labelled file split deterministically. Mode, gradients and RNG states are untouched, and the
    result is the one of the same weights probed in eval mode."""
    from xlnetcli.data.tokenizer import Tokenizer
    from xlnetcli.evaluate.probe import ProbeSettings, probe_checkpoint, read_rows, split_rows
    from xlnetcli.model import XLNetLMHeadModel

    rows = read_rows(env["planted_train"])
    tr, va = split_rows(rows, seed=3)
    tr2, va2 = split_rows(rows, seed=3)
    assert [r.line for r in tr] == [r.line for r in tr2] and [r.line for r in va] == [r.line for r in va2]
    assert sorted(r.line for r in tr + va) == sorted(r.line for r in rows) and len(va) == 90
    for lab in "ab":  # stratified: each label's share of the valid part is 30% of its count
        n = sum(r.label == lab for r in rows)
        assert sum(r.label == lab for r in va) == round(0.3 * n)
    assert [r.line for r in split_rows(rows, seed=4)[1]] != [r.line for r in va]

    tok = Tokenizer.load(env["tok"])
    torch.manual_seed(0)
    model = XLNetLMHeadModel(env["cfg"].model).train()
    cpu_rng = torch.get_rng_state()
    res = probe_checkpoint(model, tok, tr, va, ProbeSettings(max_seq_length=64))
    assert model.training and all(p.grad is None for p in model.parameters())
    assert torch.equal(torch.get_rng_state(), cpu_rng)
    assert res["train_examples"] == 210 and res["valid_examples"] == 90
    assert res["accuracy"]["mean"] > 0.85, res["accuracy"]  # measured 1.0 (cls 0.92) on 90 examples
    again = probe_checkpoint(model.eval(), tok, tr, va, ProbeSettings(max_seq_length=64))
    assert again["features"] == res["features"]


def test_held_out_splits_keep_rows_made_of_the_same_words_together():
    """A word-order task holds every sentence twice (as written / two words swapped): the held-out part that picks
    L2, and the pretraining probe's valid part, never split such a pair, stay stratified, and a file without shared
    bags of words gets exactly the per-label draw."""
    import numpy as np

    from xlnetcli.data.labelled import TextExample
    from xlnetcli.evaluate.probe import _stratified, draw_rows, split_rows, word_bag_groups

    words = _lines()[:120]
    rows = []
    for i, t in enumerate(words):
        w = t.split()
        swapped = " ".join([*w[:1], w[2], w[1], *w[3:]])
        rows += [TextExample(t, None, "original", 2 * i), TextExample(swapped, None, "swapped", 2 * i + 1)]
    groups = word_bag_groups(rows)
    assert len(set(groups.tolist())) == len(words) and all(groups[0::2] == groups[1::2])
    for seed in range(5):
        tr, va = split_rows(rows, seed=seed)
        assert {r.line // 2 for r in tr}.isdisjoint({r.line // 2 for r in va})
        assert sum(r.label == "original" for r in va) == sum(r.label == "swapped" for r in va) == 36  # 30% of 120
        kept, held = _stratified(np.array([r.label for r in rows], dtype=object), 0.2, seed, groups)
        assert set(groups[kept].tolist()).isdisjoint(groups[held].tolist()) and len(held) == 48

    few = draw_rows(rows, 40, seed=0)  # the label curve's draws are row by row: a draw is about n labelled rows
    assert [r.label for r in few].count("original") == [r.label for r in few].count("swapped") == 20
    assert len({r.line // 2 for r in few}) > 20  # mostly one version of a sentence, not pairs

    # no shared bag of words: the per-label draw every earlier probe result was made with, written out here
    labels = np.array(["a", "b"] * 50 + ["c"], dtype=object)  # "c": one example, never held out
    rng = np.random.default_rng(7)
    per_label = sorted(i for lab in ("a", "b") for i in rng.permutation(np.flatnonzero(labels == lab))[:10].tolist())
    for groups in (None, np.arange(len(labels))):
        kept, held = _stratified(labels, 0.2, 7, groups)
        assert held.tolist() == per_label and kept.tolist() == sorted(set(range(len(labels))) - set(per_label))


@pytest.mark.slow
def test_bad_inputs_are_one_line(env, tmp_path, capsys):
    base = ["probe", env["run"], "--device", "cpu"]
    one = _write(tmp_path / "one.tsv", [("a sentence", "x"), ("another one", "x"), ("and a third", "x")])
    code, _, err = run_main(capsys, *base, "--train", one, "--valid", env["planted_valid"])
    assert_one_line_error(code, err, "at least 2 different labels")
    unseen = _write(tmp_path / "unseen.tsv", [("a sentence", "a"), ("another one", "c")])
    code, _, err = run_main(capsys, *base, "--train", env["planted_train"], "--valid", unseen)
    assert_one_line_error(code, err, "never seen", "'c'")
    empty = _write(tmp_path / "empty.tsv", [])  # a header alone
    code, _, err = run_main(capsys, *base, "--train", env["planted_train"], "--valid", empty)
    assert_one_line_error(code, err, "empty.tsv: no examples")
    code, _, err = run_main(capsys, *base, "--train", tmp_path / "missing.tsv", "--valid", env["planted_valid"])
    assert_one_line_error(code, err, "file not found")
    code, _, err = run_main(
        capsys, "probe", tmp_path / "nothing", "--train", env["planted_train"], "--valid", env["planted_valid"]
    )
    assert_one_line_error(code, err)
    code, _, err = run_main(
        capsys, *base, "--train", env["planted_train"], "--valid", env["planted_valid"], "--baseline", "bert"
    )
    assert code == 2 and "Traceback" not in err
    out = tmp_path / "res.json"
    code, _, err = run_main(capsys, *base, "--train", one, "--valid", env["planted_valid"], "--output", out)
    assert code == 2 and not out.exists()
    for sizes in ("50,x", "2,100"):
        code, _, err = run_main(
            capsys, *base, "--train", env["planted_train"], "--valid", env["planted_valid"], "--train-sizes", sizes
        )
        assert_one_line_error(code, err, "--train-sizes")


def test_a_max_seq_length_beyond_memory_is_refused_before_any_feature(env, tmp_path, capsys, monkeypatch):
    """Issue 35: `--max-seq-length 5000` ran for 49 s and died in an allocation traceback. One layer's attention
    scores for a batch of that length (12 x 4 heads x 5000 x 5 x 5000 floats: 24 GB) are estimated first, against
    the machine's memory, here set to 4 GB so that the test does not depend on the machine."""
    monkeypatch.setattr("xlnetcli.config.sizes.memory_bytes", lambda device=None: (4 * 10**9, "this machine's RAM"))
    rows = _write(tmp_path / "rows.tsv", [(t, "ab"[i % 2]) for i, t in enumerate(_lines()[:12])])
    out = tmp_path / "res.json"
    args = ["probe", env["run"], "--train", rows, "--valid", rows, "--device", "cpu", "--max-seq-length", "5000"]
    code, _, err = run_main(capsys, *args, "--output", out)
    assert_one_line_error(code, err, "12 examples of 5000 tokens need at least 24.0 GB", "RAM has 4.0 GB")
    assert "lower --max-seq-length 5000 or --batch-size 12" in err and not out.exists()
    code, _, err = run_main(capsys, *args, "--batch-size", "1", "--quiet")  # 2 GB: fits (short rows: quick)
    assert code == 0, err


def test_probe_config_keys_are_validated():
    cfg = load_config(TINY, ["train.probe_file=data/pydocs/task_train.tsv", "train.probe_every=100"])
    assert (cfg.train.probe_file, cfg.train.probe_every) == ("data/pydocs/task_train.tsv", 100)
    assert load_config(TINY).train.probe_every == 0 and load_config(TINY).train.probe_file is None
    with pytest.raises(ConfigError, match=r"train\.probe_every=50 needs train\.probe_file"):
        load_config(TINY, ["train.probe_every=50"])
    with pytest.raises(ConfigError, match=r"train\.probe_every must be >= 0"):
        load_config(TINY, ["train.probe_every=-1", "train.probe_file=x.tsv"])
    with pytest.raises(ConfigError, match=r"train\.probe_every: expected an integer"):
        load_config(TINY, ["train.probe_every=often"])


_SHARDED = """
import json, sys, torch
from xlnetcli.core import dist
from xlnetcli.config import load_config
from xlnetcli.model import XLNetLMHeadModel, XLNetLayer
from xlnetcli.evaluate.probe import ProbeSettings, probe_checkpoint, read_rows, split_rows
from xlnetcli.data.tokenizer import Tokenizer

env = dist.init_distributed("cpu")
cfg = load_config(sys.argv[1], json.loads(sys.argv[2]))
torch.manual_seed(0)
model = dist.wrap_model(XLNetLMHeadModel(cfg.model), env, sys.argv[3], layer_types=(XLNetLayer,)).train()
rows = split_rows(read_rows(sys.argv[5]))
res = probe_checkpoint(model, Tokenizer.load(sys.argv[4]), *rows, ProbeSettings(max_seq_length=64))
print("RESULT", env.rank, json.dumps({"features": res["features"], "training": model.training}), flush=True)
dist.cleanup()
"""


@pytest.mark.slow
def test_probe_checkpoint_on_a_sharded_model(env, tmp_path):
    """During pretraining under torchrun every rank calls the probe on its FSDP2-sharded model (the transformer is
    run below the root, whose embeddings must be gathered first): same result as the unsharded model, on every rank."""
    import subprocess

    from xlnetcli.data.tokenizer import Tokenizer
    from xlnetcli.evaluate.probe import ProbeSettings, probe_checkpoint, read_rows, split_rows
    from xlnetcli.model import XLNetLMHeadModel

    script = tmp_path / "sharded.py"
    script.write_text(_SHARDED)
    cmd = [
        str(BIN / "torchrun"),
        "--standalone",
        "--nproc-per-node",
        "2",
        str(script),
        str(TINY),
        json.dumps(PROBE_SETS),
        "fsdp",
        str(env["tok"]),
        str(env["planted_train"]),
    ]
    out = subprocess.run(cmd, env=child_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = [json.loads(ln.split(" ", 2)[2]) for ln in out.stdout.splitlines() if ln.startswith("RESULT")]
    torch.manual_seed(0)
    ref = probe_checkpoint(
        XLNetLMHeadModel(env["cfg"].model),
        Tokenizer.load(env["tok"]),
        *split_rows(read_rows(env["planted_train"])),
        ProbeSettings(max_seq_length=64),
    )
    assert len(got) == 2
    for g in got:
        assert g["training"]
        for kind in ("mean", "cls"):
            assert g["features"][kind]["accuracy"] == pytest.approx(ref["features"][kind]["accuracy"], abs=1e-9)
            assert g["features"][kind]["l2"] == ref["features"][kind]["l2"]


@pytest.mark.slow
def test_probe_during_pretraining_is_logged_plotted_and_leaves_training_unchanged(env, builds, tmp_path):
    """train.probe_every: probe rows at steps 0, 2, 4 in metrics.jsonl, a probe panel in the plot, and the training
    itself bit-identical to the same run without the probe (the probe draws from no RNG the run uses)."""
    from xlnetcli.report.metrics_log import read_metrics
    from xlnetcli.train.pretrain import pretrain

    over = [
        *PROBE_SETS,
        "data.num_predict=10",
        "train.global_batch_size=4",
        "train.micro_batch_size=2",
        "data.valid_fraction=0.05",
        "train.max_steps=4",
        "train.warmup_steps=1",
        "train.log_every=1",
        "train.eval_every=2",
        "train.eval_batches=1",
        "train.save_every=end",
        "model.d_model=64",
        "model.n_head=2",
        "model.d_head=32",
        "model.d_inner=128",
    ]
    cfg = load_config(TINY, over)
    tok, _, rec = builds.pipeline(over)  # env's tokenizer: the same settings
    assert tok == env["tok"]
    torch.set_num_threads(1)
    pretrain(cfg, rec, tmp_path / "plain", device="cpu", quiet=True)
    probed = load_config(TINY, [*over, f"train.probe_file={env['planted_train']}", "train.probe_every=2"])
    pretrain(probed, rec, tmp_path / "probed", device="cpu", quiet=True)
    rows = read_metrics(tmp_path / "probed")
    probes = [r for r in rows if r["split"] == "probe"]
    assert [r["step"] for r in probes] == [0, 2, 4]
    assert all(0.0 <= r["mean"] <= 1.0 and 0.0 <= r["cls"] <= 1.0 and r["examples"] == 90 for r in probes)
    assert min(r["mean"] for r in probes) > 0.7  # the planted word is visible even in the initial features

    def train_rows(run):
        return [
            (r["split"], r["step"], r["loss"], r.get("grad_norm"))
            for r in read_metrics(run)
            if r["split"] in ("train", "eval")
        ]

    assert train_rows(tmp_path / "probed") == train_rows(tmp_path / "plain")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    from xlnetcli.report.plot import plot_run

    assert plot_run(tmp_path / "probed").stat().st_size > 0
