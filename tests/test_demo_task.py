"""The bundled word-order task (data/pydocs/order_*.tsv) is what NOTICE.md and the demo say it is: balanced pairs
with the same words, labels that only word order decides, and text the pretraining corpus never contains."""

from __future__ import annotations

import csv
from collections import Counter

from clitools import PYDOCS

RUN = 8  # no task sentence shares a run of this many words with the corpus (make_demo_data.OVERLAP_WORDS)


def _rows(split: str) -> list[tuple[str, str]]:
    with (PYDOCS / f"order_{split}.tsv").open(encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t"))
    assert rows[0] == ["text", "label"]
    return [(text, label) for text, label in rows[1:]]


def _runs(words: list[str]) -> set[tuple[str, ...]]:
    return {tuple(words[i : i + RUN]) for i in range(len(words) - RUN + 1)}


def test_every_sentence_comes_as_an_original_and_a_swapped_version_of_the_same_words():
    for split in ("train", "valid"):
        rows = _rows(split)
        assert Counter(label for _, label in rows) == {"original": len(rows) // 2, "swapped": len(rows) // 2}
        originals = {tuple(sorted(t.split())): t for t, label in rows if label == "original"}
        assert len(originals) == len(rows) // 2
        for text, label in rows:
            if label == "swapped":
                words = text.split()
                source = originals[tuple(sorted(words))].split()  # the same bag of words ...
                assert words != source  # ... in another order
                assert (words[0], words[-1]) == (source[0], source[-1])  # the ends stay: no capital or full stop cue
                moved = [i for i, (a, b) in enumerate(zip(words, source, strict=True)) if a != b]
                assert moved and all(
                    words[i] == source[i + 1] and words[i + 1] == source[i] for i in moved[::2]
                )  # adjacent pairs swapped, no other change
                assert len(moved) <= 2 * max(1, len(words) // 6)


def test_task_text_is_not_in_the_corpus_and_the_splits_share_no_sentence():
    corpus = [ln.split() for ln in (PYDOCS / "corpus.txt").read_text(encoding="utf-8").splitlines() if ln.strip()]
    corpus_runs = set().union(*(_runs(words) for words in corpus))
    train = {t for t, label in _rows("train") if label == "original"}
    valid = {t for t, label in _rows("valid") if label == "original"}
    assert not train & valid
    for text in train | valid:
        assert not _runs(text.split()) & corpus_runs, text
