"""`xlnet embed` (issue 34): the features written are the model's (model/documents.document_features on the same
row), per layer and last layer agree, memory and the first window differ exactly where a text spans several windows,
the rows keep the file's order whatever the batches, npy and jsonl hold the same numbers; the CLI end to end with
its progress; bad input is one line and writes nothing. `xlnet probe --document` reads texts the same way."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from clitools import VALID_TSV, assert_one_line_error, run_main
from finetunetools import MODEL_SETS

from xlnetcli.checkpoint import lm
from xlnetcli.checkpoint.folders import save_model_dir
from xlnetcli.config import load_config
from xlnetcli.data import labelled
from xlnetcli.evaluate.embed import EmbedSettings, embed
from xlnetcli.evaluate.probe import document_reading
from xlnetcli.model import XLNetLMHeadModel
from xlnetcli.model.documents import document_features

W = 16  # the checkpoint's window: most of the bundled texts span several
SHORT = ["Return it.", "x", "Close the socket."]  # one window each


@pytest.fixture(scope="module")
def env(builds, tmp_path_factory):
    """A run folder (random weights) whose finetune section reads documents through the memory (4 windows of 16
    tokens), and a table of texts: the bundled validation texts (many over several windows, some cut) and short ones,
    with an id column."""
    d = tmp_path_factory.mktemp("embed")
    sets = [*MODEL_SETS, f"finetune.max_seq_length={W}", "finetune.document=memory", "finetune.max_windows=4"]
    cfg = load_config(None, sets)
    torch.manual_seed(0)
    run = d / "run"
    save_model_dir(
        run / "step_0000001",
        XLNetLMHeadModel(cfg.model).eval(),
        cfg,
        builds.tokenizer(cfg.tokenizer),
        meta={"kind": "pretrain", "step": 1},
    )
    texts = [ln.split("\t")[0] for ln in VALID_TSV.read_text(encoding="utf-8").splitlines()[1:31]]
    texts[5:5] = SHORT
    table = d / "texts.tsv"
    table.write_text("id\ttext\n" + "".join(f"t{i}\t{t}\n" for i, t in enumerate(texts)), encoding="utf-8")
    return {"run": run, "table": table, "texts": texts, "root": d}


def _settings(**kw) -> EmbedSettings:
    return EmbedSettings(**{"device": "cpu", "precision": "fp32", **kw})


@pytest.fixture(scope="module")
def memory_all(env):
    """The table embedded with the checkpoint's reading (memory), every layer, in batches of 5."""
    res = embed(env["run"], env["table"], env["root"] / "mem-all", _settings(layers="all", batch_size=5), quiet=True)
    out = env["root"] / "mem-all"
    return res, {p: np.load(out / f"{p}.npy") for p in ("mean", "cls")}


def _index(path):
    lines = path.read_text(encoding="utf-8").splitlines()
    head = lines[0].split("\t")
    return [dict(zip(head, ln.split("\t"), strict=True)) for ln in lines[1:]]


def test_features_are_document_features_of_the_same_row(env, memory_all):
    res, feats = memory_all
    xl = lm.load(env["run"])
    reading, mem_len = document_reading(xl.config.finetune)
    assert (reading.window, reading.document, reading.max_windows, mem_len) == (W, "memory", 4, W)
    assert res["document"] == "memory" and res["max_windows"] == 4 and res["mem_len"] == W  # from the checkpoint
    rows = [labelled.TextExample(t, None, None) for t in env["texts"]]
    enc = labelled.encode_texts(xl.tokenizer, rows, reading, "classification")
    n_layer = xl.config.model.n_layer
    assert feats["mean"].shape == feats["cls"].shape == (len(rows), n_layer + 1, xl.config.model.d_model)
    for i in (0, 5, 6, 12, len(rows) - 1):  # long, short, one token, ...
        a = {k: torch.from_numpy(enc.arrays[k][i : i + 1]) for k in ("input_ids", "token_type_ids", "attention_mask")}
        with torch.no_grad():
            mean, cls = document_features(xl.model.transformer, *a.values(), "memory", W, mem_len, per_layer=True)
        np.testing.assert_allclose(feats["mean"][i], mean[0].numpy(), atol=2e-5)
        np.testing.assert_allclose(feats["cls"][i], cls[0].numpy(), atol=2e-5)
    index = _index(env["root"] / "mem-all" / "index.tsv")
    assert [r["id"] for r in index] == [f"t{i}" for i in range(len(rows))]
    assert [int(r["tokens"]) for r in index] == enc.real_tokens().tolist()
    windows = [int(r["windows"]) for r in index]
    assert windows[5:8] == [1, 1, 1] and max(windows) == 4
    cut = [r["truncated"] == "true" for r in index]
    assert cut == enc.extra["cut"].tolist() and any(cut) and sum(cut) == res["truncated"]


def test_the_last_of_all_layers_is_the_last_layer(env, memory_all):
    _, every = memory_all
    embed(env["run"], env["table"], env["root"] / "mem-last", _settings(batch_size=7), quiet=True)
    for p in ("mean", "cls"):
        last = np.load(env["root"] / "mem-last" / f"{p}.npy")
        assert last.shape == every[p][:, -1].shape and last.dtype == np.float32
        np.testing.assert_allclose(last, every[p][:, -1], atol=2e-5)
    meta = json.loads((env["root"] / "mem-last" / "meta.json").read_text())
    assert meta["layers"] == "last" and meta["layer_names"] == ["layer_2"] and meta["precision"] == "fp32"


def test_memory_and_first_differ_on_long_texts_and_agree_on_one_window(env, memory_all):
    _, mem = memory_all
    embed(env["run"], env["table"], env["root"] / "first", _settings(document="first", layers="all"), quiet=True)
    first = {p: np.load(env["root"] / "first" / f"{p}.npy") for p in ("mean", "cls")}
    windows = np.array([int(r["windows"]) for r in _index(env["root"] / "mem-all" / "index.tsv")])
    assert set(windows[[5, 6, 7]]) == {1} and (windows > 1).sum() >= 10
    for p in ("mean", "cls"):
        one = windows == 1
        np.testing.assert_allclose(first[p][one], mem[p][one], atol=2e-5)
        gap = np.abs(first[p][~one, -1] - mem[p][~one, -1]).max(-1)  # last layer: the whole text against its start
        assert (gap > 1e-3).all(), gap


def test_rows_keep_the_file_order_whatever_the_batches(env, memory_all, tmp_path):
    _, feats = memory_all
    texts = env["texts"]
    order = list(reversed(range(len(texts))))
    table = tmp_path / "reversed.tsv"
    table.write_text("text\n" + "".join(f"{texts[i]}\n" for i in order), encoding="utf-8")
    for batch in (1, 64):
        out = tmp_path / f"b{batch}"
        embed(env["run"], table, out, _settings(layers="all", batch_size=batch), quiet=True)
        for p in ("mean", "cls"):
            np.testing.assert_allclose(np.load(out / f"{p}.npy"), feats[p][order], atol=2e-5)
        assert "id" not in _index(out / "index.tsv")[0]  # no id column in the file: none in the index


def test_jsonl_holds_what_npy_holds(env, memory_all, tmp_path):
    _, feats = memory_all
    embed(env["run"], env["table"], tmp_path / "j", _settings(layers="all", format="jsonl", batch_size=5), quiet=True)
    assert sorted(p.name for p in (tmp_path / "j").iterdir()) == ["embeddings.jsonl", "meta.json"]
    rows = [json.loads(ln) for ln in (tmp_path / "j" / "embeddings.jsonl").read_text().splitlines()]
    index = _index(env["root"] / "mem-all" / "index.tsv")
    assert len(rows) == len(index)
    for row, ix in zip(rows, index, strict=True):
        assert {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in row.items() if k in ix} == ix
    for p in ("mean", "cls"):
        assert np.array_equal(np.array([r[p] for r in rows], dtype=np.float32), feats[p])
    npy_meta = json.loads((env["root"] / "mem-all" / "meta.json").read_text())
    meta = json.loads((tmp_path / "j" / "meta.json").read_text())
    assert {k: v for k, v in meta.items() if k not in ("format", "files")} == {
        k: v for k, v in npy_meta.items() if k not in ("format", "files")
    }


def _progress(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("embed: ")]


def test_cli_embeds_a_table_and_a_text_file_with_progress(env, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("XLNET_NO_PROGRESS", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    n = len(env["texts"])
    args = ["embed", env["run"], "--file", env["table"], "--device", "cpu", "--batch-size", "8"]
    code, out, err = run_main(capsys, *args, "--out", tmp_path / "a", "--pool", "cls", "--document", "window-mean")
    assert code == 0, err
    lines = _progress(err)
    assert lines[0].startswith(f"embed: 8/{n} texts (") and lines[-1].startswith(f"embed: {n}/{n} texts (100%)")
    assert f"embedded {n} texts (window-mean, 16-token windows, " in err and "texts/s" in err
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["cls.npy", "index.tsv", "meta.json"]
    meta = json.loads((tmp_path / "a" / "meta.json").read_text())
    assert meta["document"] == "window-mean" and meta["mem_len"] is None and meta["shape"] == {"cls": [n, 64]}
    code, out, err = run_main(
        capsys, *args, "--out", tmp_path / "q", "--pool", "cls", "--document", "window-mean", "--quiet"
    )
    assert code == 0 and err == "" and out == ""
    assert np.array_equal(np.load(tmp_path / "q" / "cls.npy"), np.load(tmp_path / "a" / "cls.npy"))
    # a .txt file: one text per line, blank lines skipped, each row's line kept
    txt = tmp_path / "texts.txt"
    txt.write_text(f"{env['texts'][0]}\n\n{SHORT[0]}\r\n", encoding="utf-8")
    code, _, err = run_main(
        capsys,
        "embed",
        env["run"],
        "--file",
        txt,
        "--out",
        tmp_path / "t",
        "--device",
        "cpu",
        "--max-seq-length",
        "32",
        "--document",
        "first",
        "--quiet",
    )
    assert code == 0, err
    index = _index(tmp_path / "t" / "index.tsv")
    assert [(r["row"], r["line"], r["windows"]) for r in index] == [("0", "1", "1"), ("1", "3", "1")]
    assert np.load(tmp_path / "t" / "mean.npy").shape == (2, 64)
    # --overwrite replaces a finished folder; without it the folder is refused
    code, _, err = run_main(capsys, "embed", env["run"], "--file", txt, "--out", tmp_path / "t", "--quiet")
    assert_one_line_error(code, err, "--overwrite")
    code, _, err = run_main(
        capsys,
        "embed",
        env["run"],
        "--file",
        txt,
        "--out",
        tmp_path / "t",
        "--quiet",
        "--overwrite",
        "--format",
        "jsonl",
        "--device",
        "cpu",
    )
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == ["embeddings.jsonl", "meta.json"]


def test_bad_inputs_are_one_line_and_write_nothing(env, tmp_path, capsys):
    run, table = env["run"], env["table"]
    (tmp_path / "empty.tsv").write_text("")
    (tmp_path / "header.tsv").write_text("text\n")
    (tmp_path / "cols.tsv").write_text("body\tlabel\nsome text\ta\n")
    (tmp_path / "blank.txt").write_text("\n  \n")
    (tmp_path / "tab-id.jsonl").write_text('{"id": "a\\tb", "text": "hello"}\n')
    (tmp_path / "notxlnet").mkdir()
    (tmp_path / "notxlnet" / "config.json").write_text('{"model_type": "bert", "hidden_size": 8}')
    out = tmp_path / "out"
    cases = [
        (["--file", tmp_path / "empty.tsv"], "no examples"),
        (["--file", tmp_path / "header.tsv"], "no examples"),
        (["--file", tmp_path / "cols.tsv"], "missing column"),
        (["--file", tmp_path / "cols.tsv", "--text-a-column", "nope"], "'nope'"),
        (["--file", tmp_path / "cols.tsv", "--text-a-column", "body", "--id-column", "key"], "missing id column"),
        (["--file", tmp_path / "blank.txt"], "no texts"),
        (["--file", tmp_path / "blank.txt", "--text-a-column", "x"], "no columns"),
        (["--file", tmp_path / "nothere.tsv"], "not found"),
        (["--file", tmp_path / "tab-id.jsonl"], "--format jsonl"),
        (["--file", table, "--layers", "some"], "--layers"),
        (["--file", table, "--pool", "max"], "--pool"),
        (["--file", table, "--pool", "mean,mean"], "--pool"),
        (["--file", table, "--format", "parquet"], "--format"),
        (["--file", table, "--document", "first", "--mem-len", "8"], "--mem-len"),
        (["--file", table, "--document", "first", "--max-windows", "2"], "--max-windows"),
        (["--file", table, "--document", "window-mean", "--mem-len", "8"], "--mem-len"),
        (["--file", table, "--max-seq-length", "4"], "--max-seq-length"),
        (["--file", table, "--precision", "fp16", "--device", "cpu"], "fp16"),
        (["--file", table, "--device", "tpu"], "unknown device"),
    ]
    for args, needle in cases:
        code, _, err = run_main(capsys, "embed", run, *args, "--out", out, "--quiet")
        assert_one_line_error(code, err, needle)
        assert not out.exists(), args
    for ckpt, needle in [(tmp_path / "notxlnet", "bert"), (tmp_path / "none", "not found"), (table, "is a file")]:
        code, _, err = run_main(capsys, "embed", ckpt, "--file", table, "--out", out, "--quiet")
        assert_one_line_error(code, err, needle)
        assert not out.exists()
    for inside, needle in [(run / "emb", "lies inside the input"), (table.parent, "holds the input"), (table, "not a")]:
        code, _, err = run_main(capsys, "embed", run, "--file", table, "--out", inside, "--quiet")
        assert_one_line_error(code, err, needle)
    assert sorted(p.name for p in run.iterdir()) == ["step_0000001"]
    assert not list(tmp_path.glob(".out*"))  # no partial folder, no lock left


def test_probe_reads_documents_as_asked(env, tmp_path, capsys):
    texts = env["texts"]
    rows = [(t, "ab"[i % 2]) for i, t in enumerate(texts)]
    for name, part in (("train", rows[:24]), ("valid", rows[24:])):
        (tmp_path / f"{name}.tsv").write_text("text\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in part))
    args = ["probe", env["run"], "--train", tmp_path / "train.tsv", "--valid", tmp_path / "valid.tsv", "--quiet"]
    code, out, err = run_main(capsys, *args, "--output", tmp_path / "mem.json", "--max-windows", "2")
    assert code == 0, err
    res = json.loads((tmp_path / "mem.json").read_text())
    assert (res["document"], res["max_windows"], res["mem_len"], res["max_seq_length"]) == ("memory", 2, W, W)
    assert "texts read as memory: up to 2 windows of 16 tokens in order through a memory of 16 states" in out
    assert f"{res['truncated']} examples cut to 2 windows of 16 tokens" in out
    code, _, err = run_main(capsys, *args, "--document", "first", "--mem-len", "4")
    assert_one_line_error(code, err, "--mem-len")
