"""scripts/make_domain_corpus.py (corpus B of benchmarks/continue_pretraining.py): the SWORD zText reader keeps the
running text and drops footnotes, headings and markup; the B task is built as the demo's, from held-out books."""

from __future__ import annotations

import csv
import glob
import importlib.util
import struct
import zlib
from collections import Counter

import pytest
from clitools import ROOT


def _builder():
    spec = importlib.util.spec_from_file_location("make_domain_corpus", ROOT / "scripts" / "make_domain_corpus.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _write_testament(folder, name, blocks):
    index, blob = b"", b""
    for text in blocks:
        z = zlib.compress(text.encode("utf-8"))
        index += struct.pack("<III", len(blob), len(z), len(text.encode("utf-8")))
        blob += z
    (folder / f"{name}.bzs").write_bytes(index)
    (folder / f"{name}.bzz").write_bytes(blob)


def test_books_reads_the_text_of_a_ztext_module(tmp_path):
    book = (
        '<milestone n="Ruth" type="x-usfm-toc2"/><title type="main">Ruth</title><div sID="p1" type="x-p"/>'
        '<chapter n="1" sID="Ruth.1"/><w lemma="strong:H1">In</w> <w lemma="x">the</w> days of the judges'
        '<note placement="foot"><reference>1:1 </reference>a footnote</note>, there was a famine . '
        '<div eID="p1" type="x-p"/><div sID="p2" type="x-p"/><q marker="“">Go back</q>, she said.'
    )
    _write_testament(tmp_path, "ot", ['<milestone type="x-importer"/>', book])
    _write_testament(tmp_path, "nt", [])
    assert _builder().books(tmp_path) == [
        ("Ruth", ["In the days of the judges, there was a famine.", "Go back, she said."])
    ]


def test_the_b_task_comes_from_held_out_books_in_both_versions(tmp_path):
    """On the real package (skipped without it): balanced pairs of the same words, none in corpus_b.txt."""
    debs = sorted(glob.glob("/tmp/sword-text-web_*.deb"))
    if not debs:
        pytest.skip("no sword-text-web .deb in /tmp (apt-get download sword-text-web)")
    mod = _builder()
    mod.build(tmp_path, mod.Path(debs[-1]))
    corpus = set((tmp_path / "corpus_b.txt").read_text(encoding="utf-8").splitlines())
    for split in ("train", "valid"):
        with (tmp_path / f"order_{split}.tsv").open(encoding="utf-8", newline="") as f:
            rows = list(csv.reader(f, delimiter="\t"))[1:]
        assert len(rows) > 1000 and Counter(label for _, label in rows) == {
            "original": len(rows) // 2,
            "swapped": len(rows) // 2,
        }
        bags = Counter(tuple(sorted(text.split())) for text, _ in rows)
        assert set(bags.values()) == {2}  # each sentence twice: as written and swapped
        assert not corpus & {text for text, _ in rows}
