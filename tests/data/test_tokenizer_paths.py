"""`--tokenizer` of `xlnet tokenize encode` and `xlnet shard` (checkpoint.folders.find_tokenizer): a transformers
XLNet directory, a bare spiece.model, transformers 5's tokenizer.model, our tokenizer folder, a run (its latest step
folder's), a step folder, shards and records (their tokenizer/); a folder with nothing usable is refused in one line,
nothing written. A tokenizer whose size differs from the config's is refused by preprocess, naming the fix."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from clitools import SAMPLE, TINY, assert_one_line_error, run_main

from xlnetcli.checkpoint.folders import find_tokenizer, save_model_dir, step_dir_name
from xlnetcli.config import load_config
from xlnetcli.data.tokenizer import Tokenizer

TEXT = "In 2000, the café opened: 1,000, 2,000, ``Quoted''."


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tok_dir, released_dir) -> Path:
    """A run with two step folders: step 1 carries tok_dir, step 2 (the latest) the released-style tokenizer."""
    run = tmp_path_factory.mktemp("run")
    cfg = load_config(TINY)
    for step, tok in ((1, tok_dir), (2, released_dir)):
        save_model_dir(run / step_dir_name(step), {"w": torch.zeros(1)}, cfg, tokenizer_dir=tok)
    return run


def _forms(tmp_path: Path, tok_dir, released_dir, released_spm, run_dir, shard_dir, records) -> dict[str, tuple]:
    """Each form of --tokenizer: (the path given, the tokenizer folder or file it stands for)."""
    v5 = tmp_path / "transformers5"  # what transformers 5 saves: tokenizer.json, tokenizer_config.json, tokenizer.model
    shutil.copytree(released_dir, v5)
    (v5 / "spiece.model").rename(v5 / "tokenizer.model")
    return {
        "transformers directory": (released_dir, released_dir),
        "bare spiece.model": (released_spm, released_spm),
        "transformers 5 tokenizer.model": (v5, released_dir),
        "tokenizer folder": (tok_dir, tok_dir),
        "run": (run_dir, released_dir),
        "step folder": (run_dir / step_dir_name(1), tok_dir),
        "shards": (shard_dir, tok_dir),
        "records": (records, tok_dir),
    }


def test_every_form_encodes_with_its_tokenizer(
    tmp_path, capsys, tok_dir, released_dir, released_spm, run_dir, shard_dir, records
):
    forms = _forms(tmp_path, tok_dir, released_dir, released_spm, run_dir, shard_dir, records)
    for name, (given, means) in forms.items():
        want = Tokenizer.load(means)
        found = Tokenizer.load(find_tokenizer(given))
        assert (found.sha256, found.options()) == (want.sha256, want.options()), name
        code, out, err = run_main(capsys, "tokenize", "encode", "--tokenizer", given, "--ids", "--text", TEXT)
        assert code == 0, (name, err)
        assert out.split() == [str(i) for i in want.encode_ids(TEXT)], name


def test_uncased_transformers_directory_stays_uncased(tmp_path, capsys, released_spm):
    """do_lower_case in tokenizer_config.json beside the model, found through a run's step folder too."""
    from clitools import save_with_transformers

    hf = save_with_transformers(released_spm, tmp_path / "hf", lower=True)
    save_model_dir(tmp_path / "run" / step_dir_name(3), {"w": torch.zeros(1)}, load_config(TINY), tokenizer_dir=hf)
    lower = Tokenizer.load(hf).encode_pieces("hello world")
    assert lower != Tokenizer.load(released_spm).encode_pieces("HELLO World")
    for given in (hf, tmp_path / "run"):
        code, out, err = run_main(capsys, "tokenize", "encode", "--tokenizer", given, "--text", "HELLO World")
        assert code == 0 and out.split() == lower, err


def test_shard_with_a_transformers_directory_then_preprocess_names_the_vocabulary_fix(
    tmp_path, capsys, released_dir, run_dir
):
    """The shards carry the released tokenizer (3000 pieces); preprocess with a config of another size refuses in
    one line naming --set model.vocab_size=3000, and writes nothing."""
    text = tmp_path / "in.txt"
    text.write_text("\n".join(SAMPLE.read_text(encoding="utf-8").splitlines()[:400]) + "\n", encoding="utf-8")
    for given in (released_dir, run_dir):
        out = tmp_path / f"shards_{given.name}"
        code, _, err = run_main(capsys, "shard", text, "--tokenizer", given, "--out", out, "--quiet")
        assert code == 0, err
        assert (out / "tokenizer" / "spiece.model").read_bytes() == (released_dir / "spiece.model").read_bytes()
        assert json.loads((out / "manifest.json").read_text())["vocab_size"] == 3000
    records = tmp_path / "records"
    code, _, err = run_main(capsys, "preprocess", "--shards", out, "--out", records, "--config", "tiny")
    assert_one_line_error(code, err, "3000-piece tokenizer", "model.vocab_size is 8000", "--set model.vocab_size=3000")
    assert not records.exists()


def test_a_folder_without_a_tokenizer_is_refused(tmp_path, capsys, released_dir):
    v5 = tmp_path / "saved_by_transformers5"  # tokenizer.json alone: no SentencePiece model to encode with
    shutil.copytree(released_dir, v5)
    (v5 / "spiece.model").unlink()
    empty = tmp_path / "empty"
    empty.mkdir()
    no_tok = tmp_path / "run"  # a run whose latest step folder holds no tokenizer/
    save_model_dir(no_tok / step_dir_name(1), {"w": torch.zeros(1)}, load_config(TINY))
    cases = [
        (v5, "tokenizer.json holds no SentencePiece model"),
        (empty, "holds no tokenizer: expected spiece.model"),
        (tmp_path / "missing", "does not exist"),
        (no_tok, "has no tokenizer"),
    ]
    for given, needle in cases:
        code, _, err = run_main(capsys, "tokenize", "encode", "--tokenizer", given, "--text", "x")
        assert_one_line_error(code, err, str(given), needle)
        out = tmp_path / "shards"
        code, _, err = run_main(capsys, "shard", SAMPLE, "--tokenizer", given, "--out", out, "--quiet")
        assert_one_line_error(code, err, needle)
        assert not out.exists()
