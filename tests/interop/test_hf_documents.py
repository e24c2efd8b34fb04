"""Issue 34, the Hugging Face handoff: an `xlnet export` of a classifier finetuned with finetune.document=memory,
read by transformers' XLNetForSequenceClassification window by window with ``mems`` through the snippet of
docs/long-documents.md (src/xlnetcli/interop/hf_documents.py, the same code), gives the logits `xlnet eval` gives:
documents of 1 to 6 windows and longer (cut), single texts and pairs, memory shorter than, equal to and longer than
a window. The export carries the reading (xlnet_finetune.json) and `xlnet import` keeps it.

The model is a tiny random one (finetunetools.MODEL_SETS) with a random head scaled so the logits are of order 1:
the comparison is of numbers, not of quality.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from clitools import PAGES, ROOT, VALID_TSV, code_blocks, run_main
from finetunetools import LABELS, MODEL_SETS, ft_cfg, pydocs_rows

pytestmark = pytest.mark.slow  # exports and runs transformers on a few dozen windows

transformers = pytest.importorskip("transformers")

PAGE = "docs/long-documents.md"
MODULE = ROOT / "src" / "xlnetcli" / "interop" / "hf_documents.py"
WINDOW, MAX_WINDOWS = 16, 6


@pytest.fixture(autouse=True)
def _no_progress(monkeypatch):
    monkeypatch.setenv("XLNET_NO_PROGRESS", "1")


def snippet() -> str:
    """The page's code block that defines the helpers."""
    return next(b for b in code_blocks("python", PAGES[PAGE]) if "def hf_predict_document" in b)


def words() -> list[str]:
    return " ".join(t for t, _ in pydocs_rows(VALID_TSV)).split()


def write_tsv(path: Path, rows: list[tuple[str, ...]], names: tuple[str, ...]) -> Path:
    lines = ["\t".join((*names, "label"))] + ["\t".join((*r, LABELS[i % len(LABELS)])) for i, r in enumerate(rows)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def text_of(tok, w: list[str], start: int, length: int) -> str:
    """The shortest run of words from ``w[start]`` of at least ``length`` tokens."""
    n = 1
    while len(tok.encode_ids(" ".join(w[start : start + n]))) < length:
        n += 1
    return " ".join(w[start : start + n])


@pytest.fixture(scope="module")
def texts(builds, tmp_path_factory):
    """singles.tsv (one text of 1 to 6 windows and more) and pairs.tsv (A and B, either longer, both short, both
    long, longer than MAX_WINDOWS together), from the bundled task's docstrings."""
    from xlnetcli.config import load_config
    from xlnetcli.data.tokenizer import Tokenizer

    tok = Tokenizer.load(builds.tokenizer(load_config(None, MODEL_SETS).tokenizer))
    d = tmp_path_factory.mktemp("docs")
    w = words()
    # sequence lengths (text + <sep> <cls>): a full window, a first window of one token, each window count, cut
    singles = [(text_of(tok, w, 40 * i, n - 2),) for i, n in enumerate([3, 10, 16, 17, 30, 40, 55, 64, 70, 90, 200])]
    pairs = [
        (text_of(tok, w, 0, n), text_of(tok, w, 500, m))
        for n, m in [(1, 1), (40, 5), (5, 40), (30, 30), (150, 20), (20, 150), (120, 120), (2, 66)]
    ]
    return write_tsv(d / "singles.tsv", singles, ("sentence",)), write_tsv(d / "pairs.tsv", pairs, ("text_a", "text_b"))


@pytest.fixture(scope="module", params=[10, None, 40], ids=["mem10", "mem-window", "mem40"])
def export(request, builds, tmp_path_factory):
    """(run, its export) of a random classifier read with finetune.document=memory and mem_len ``param`` (None:
    one window)."""
    from xlnetcli.checkpoint.folders import save_model_dir
    from xlnetcli.evaluate.finetuned import build_finetune_model
    from xlnetcli.interop.huggingface import export_hf

    d = tmp_path_factory.mktemp("memory")
    mem = request.param
    cfg = ft_cfg(
        *MODEL_SETS,
        f"finetune.max_seq_length={WINDOW}",
        "finetune.document=memory",
        f"finetune.max_windows={MAX_WINDOWS}",
        *([f"finetune.mem_len={mem}"] if mem else []),
        "finetune.micro_batch_size=4",
        "finetune.batch_size=4",
    )
    torch.manual_seed(0)
    model = build_finetune_model(cfg, "classification", len(LABELS))
    with torch.no_grad():
        for p in model.head.parameters():
            p.normal_(0, 0.5)
    meta = {"kind": "finetune", "task": "classification", "labels": LABELS, "step": 1}
    run = save_model_dir(d / "run", model, cfg, builds.tokenizer(cfg.tokenizer), meta=meta)
    return run, export_hf(run, d / "hf")


def our_logits(run: Path, file: Path):
    """(logits [N,labels] as `xlnet eval` computes them, the encoded rows)."""
    from xlnetcli.checkpoint.folders import tokenizer_dir_of
    from xlnetcli.data.tokenizer import Tokenizer
    from xlnetcli.evaluate.finetuned import load_finetuned, load_task_data, predict

    model, cfg, meta = load_finetuned(run)
    tok = Tokenizer.load(tokenizer_dir_of(Path(meta["path"])))
    data = load_task_data("classification", file, tok, cfg, LABELS, require_label=False)
    return predict(model, data, 4, torch.device("cpu"))["logits"], data, tok


def test_the_page_shows_the_helper_module_verbatim():
    """The snippet users copy is the module the tests import: nothing can drift."""
    source = MODULE.read_text(encoding="utf-8")
    doc = source.index('"""', 3) + 3  # the end of the module docstring
    assert snippet() == source[doc:].lstrip("\n")
    assert "xlnetcli" not in snippet()


def test_snippet_reproduces_our_document_predictions(export, texts, tmp_path, capsys):
    run, hf_dir = export
    scope: dict = {}
    exec(compile(snippet(), PAGE, "exec"), scope)
    model, tokenizer, reading = scope["load_document_classifier"](hf_dir)
    ft = json.loads((hf_dir / "xlnet_finetune.json").read_text())["finetune"]
    assert reading == {"window": WINDOW, "max_windows": MAX_WINDOWS, "mem_len": ft["mem_len"] or WINDOW}
    predict = scope["hf_predict_document"]
    worst, by_text = 0.0, 0
    for file in texts:
        ours, data, tok = our_logits(run, file)
        windows = -(-data.enc.arrays["attention_mask"].sum(1) // WINDOW)
        assert set(range(1, MAX_WINDOWS + 1)) <= set(windows.tolist()) or file.name == "pairs.tsv"
        assert data.enc.n_truncated >= 1  # some document is longer than MAX_WINDOWS windows
        for i, ex in enumerate(data.examples):
            # the texts, through the export's tokenizer.json: it gives our ids but where a comma follows a digit
            # (the original digit-comma rule, docs/huggingface.md#the-tokenizer): there, our ids
            a, b = (None if t is None else list(tok.encode_ids(t)) for t in (ex.text_a, ex.text_b))
            same_ids = all(
                t is None or tokenizer(t, add_special_tokens=False)["input_ids"] == ids
                for t, ids in ((ex.text_a, a), (ex.text_b, b))
            )
            if same_ids:
                got = predict(model, tokenizer, ex.text_a, ex.text_b, **reading)
            else:
                assert re.search(r"\d,", f"{ex.text_a} {ex.text_b}"), ex
                got = predict(model, tokenizer, a, b, **reading)
            worst = max(worst, float(np.abs(got.numpy() - ours[i]).max()))
            by_text += same_ids
        # `xlnet eval --predict` of the run and of the export give these probabilities
        for src in (run, hf_dir):
            out = tmp_path / f"{file.stem}-{src.name}.jsonl"
            assert run_main(capsys, "eval", src, "--file", file, "--predict", out)[0] == 0
            probs = [json.loads(line)["probabilities"] for line in out.read_text().splitlines()]
            want = torch.softmax(torch.from_numpy(ours), -1).numpy()
            assert np.abs(np.array([[p[lab] for lab in LABELS] for p in probs]) - want).max() < 1e-4
    assert worst < 1e-4, f"max |logit difference| {worst:.2e}"
    assert by_text >= 15  # most documents went in as text
    assert np.abs(ours).max() > 0.5  # logits of order 1: a difference would show


def test_page_example_runs(export, tmp_path, monkeypatch, capsys):
    """The page's usage block after the snippet, against a real export at the path it names."""
    shutil.copytree(export[1], tmp_path / "runs" / "long-cls-hf")
    monkeypatch.chdir(tmp_path)
    usage = next(b for b in code_blocks("python", PAGES[PAGE]) if 'load_document_classifier("runs/' in b)
    scope: dict = {}
    exec(compile(snippet() + usage, PAGE, "exec"), scope)
    assert scope["logits"].shape == (len(LABELS),)
    assert capsys.readouterr().out.split()[0] in LABELS


def test_snippet_refuses_a_model_loaded_without_the_memory(export):
    scope: dict = {}
    exec(compile(snippet(), PAGE, "exec"), scope)
    _, hf_dir = export
    model = transformers.XLNetForSequenceClassification.from_pretrained(hf_dir)
    tokenizer = transformers.AutoTokenizer.from_pretrained(hf_dir)
    with pytest.raises(ValueError, match="load the model with mem_len="):
        scope["hf_predict_document"](model, tokenizer, "a text", window=WINDOW, max_windows=MAX_WINDOWS, mem_len=10)


def test_import_of_the_export_keeps_the_reading(export, tmp_path, capsys):
    run, hf_dir = export
    code, _out, err = run_main(capsys, "import", "--from-hf", hf_dir, "--out", tmp_path / "back")
    assert code == 0, err
    from xlnetcli.checkpoint.load import load_model_dir

    cfg0, _, _ = load_model_dir(run)
    cfg1, _, _ = load_model_dir(tmp_path / "back")
    ft0, ft1 = cfg0.finetune, cfg1.finetune
    assert (ft1.document, ft1.max_windows, ft1.mem_len, ft1.max_seq_length) == (
        "memory",
        MAX_WINDOWS,
        ft0.mem_len,
        WINDOW,
    )
    assert ft1 == ft0
