"""Regenerate the bundled demo data from the Python 3 standard library (PSF licence).

Sources: the docstrings of every pure-Python module of the running interpreter's standard library
(tests and site-packages excluded) and the language-reference topics in ``pydoc_data.topics``.
Outputs (deterministic for a given Python version):

  data/pydocs/corpus.txt          pretraining corpus: one sentence per line, blank line = end of document; the
                                  modules in ORDER_MODULES are held out of it
  data/pydocs/order_train.tsv     the demo task (word order): is a sentence in its original order, or have
  data/pydocs/order_valid.tsv     adjacent words been swapped; sentences from the held-out modules only
  data/pydocs/task_train.tsv      topic task (tests): which part of the stdlib a paragraph documents
  data/pydocs/task_valid.tsv
  tests/fixtures/sample.txt       a few hundred KB of the documents (every 8th, held-out ones included) for the tests

Users never need to run this; it is here so the data can be audited and rebuilt:
    python scripts/make_demo_data.py
"""

from __future__ import annotations

import ast
import csv
import os
import random
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STDLIB = Path(os.__file__).parent
SENT_SPLIT = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'(])")
# Demo task: paragraph -> area of the standard library it documents.
TASK_LABELS = {
    "asyncio": "concurrency",
    "concurrent": "concurrency",
    "multiprocessing": "concurrency",
    "threading": "concurrency",
    "email": "internet",
    "http": "internet",
    "urllib": "internet",
    "smtplib": "internet",
    "imaplib": "internet",
    "ftplib": "internet",
    "poplib": "internet",
    "mailbox": "internet",
    "xmlrpc": "internet",
    "tkinter": "gui",
    "idlelib": "gui",
    "turtle": "gui",
    "turtledemo": "gui",
    "unittest": "testing",
    "doctest": "testing",
    "pdb": "testing",
    "bdb": "testing",
    "trace": "testing",
    "profile": "testing",
    "cProfile": "testing",
    "pstats": "testing",
    "timeit": "testing",
}
# Word-order task: its sentences come from these modules, which the pretraining corpus leaves out, and its
# validation sentences from different modules than its training sentences.
ORDER_MODULES = {
    "train": ("distutils", "xml", "difflib", "tarfile", "configparser", "shutil"),
    "valid": ("logging", "json", "statistics"),
}
ORDER_WORDS = (8, 40)  # sentence length range, in whitespace-separated words
OVERLAP_WORDS = 8  # a task sentence shares no run of this many words with the corpus
SWAP_EVERY = 6  # one adjacent swap per this many words (one swap alone: the tiny models' probe stays near chance)


def prose_paragraphs(doc: str) -> list[str]:
    """Paragraphs of running English text (code, tables, doctests and option lists dropped)."""
    out = []
    for block in re.split(r"\n\s*\n", doc):
        lines = [ln for ln in block.splitlines() if ln.strip()]
        if not lines:
            continue
        if any(ln.lstrip().startswith((">>>", "...", "$", "%", "#", "|", "+-", "==", "--")) for ln in lines):
            continue
        if len(lines) > 1 and all(ln.startswith((" ", "\t")) for ln in lines[1:]) and ":" in lines[0][-2:]:
            continue  # a "Parameters:" style list
        text = " ".join(ln.strip() for ln in lines)
        text = re.sub(r"\s+", " ", text).strip()
        words = text.split()
        if len(words) < 6 or sum(c.isalpha() for c in text) < 0.6 * len(text):
            continue
        out.append(text)
    return out


def sentences(paragraph: str) -> list[str]:
    return [s.strip() for s in SENT_SPLIT.split(paragraph) if s.strip()]


def stdlib_documents() -> list[tuple[str, list[str]]]:
    """(top-level module, paragraphs) for every docstring in the standard library, in path order."""
    docs = []
    for path in sorted(STDLIB.rglob("*.py")):
        rel = path.relative_to(STDLIB)
        if {"site-packages", "test", "tests", "idle_test", "__pycache__"} & set(rel.parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        top = rel.parts[0].removesuffix(".py")
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                paras = prose_paragraphs(doc) if doc else []
                if paras:
                    docs.append((top, paras))
    return docs


def reference_documents() -> list[list[str]]:
    from pydoc_data import topics

    return [p for p in (prose_paragraphs(topics.topics[k]) for k in sorted(topics.topics)) if p]


def write_corpus(path: Path, documents: list[list[str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for paras in documents:
            for para in paras:
                for sent in sentences(para):
                    f.write(sent + "\n")
            f.write("\n")


def word_runs(words: list[str]) -> set[tuple[str, ...]]:
    return {tuple(words[i : i + OVERLAP_WORDS]) for i in range(len(words) - OVERLAP_WORDS + 1)}


def swap_adjacent(sentence: str, rng: random.Random) -> str:
    """The sentence with pairs of adjacent, different interior words swapped, one pair per SWAP_EVERY words (at least
    one; the pairs do not overlap, so the result always differs from the sentence). The first and last word stay in
    place, so capitalisation and the final full stop give nothing away; the words are the same, so the bag of words
    is the same."""
    words = sentence.split()
    spots = [i for i in range(1, len(words) - 2) if words[i].lower() != words[i + 1].lower()]
    for _ in range(max(1, len(words) // SWAP_EVERY)):
        if not spots:
            break
        i = rng.choice(spots)
        words[i], words[i + 1] = words[i + 1], words[i]
        spots = [j for j in spots if abs(j - i) > 1]
    return " ".join(words)


def write_tsv(path: Path, rows: list[tuple[str, str]]) -> None:
    with path.open("w", encoding="utf-8", newline="") as f:
        w = csv.writer(f, delimiter="\t", quoting=csv.QUOTE_MINIMAL, lineterminator="\n")
        w.writerow(["text", "label"])
        w.writerows(rows)


def order_task(
    stdlib: list[tuple[str, list[str]]],
    corpus_sentences: set[str],
    splits: dict[str, tuple[str, ...]] = ORDER_MODULES,
) -> dict[str, list[tuple[str, str]]]:
    """Both versions of every held-out sentence, "original" and "swapped": balanced, and a bag of words sees the
    two as the same example, so it is at chance by construction. A sentence that shares a run of OVERLAP_WORDS
    words with the corpus (some docstrings repeat across modules) or that the other split holds is dropped.
    ``stdlib`` is (document group, paragraphs); ``splits`` names the groups of each split (also used by
    scripts/make_domain_corpus.py, where the groups are books)."""
    rng = random.Random(1)
    corpus_runs = {run for sent in corpus_sentences for run in word_runs(sent.split())}
    seen: set[str] = set()
    out = {}
    for split, modules in splits.items():
        picked = []
        for top, paras in stdlib:
            if top not in modules:
                continue
            for sent in (s for p in paras for s in sentences(p)):
                words = sent.split()
                if (
                    ORDER_WORDS[0] <= len(words) <= ORDER_WORDS[1]
                    and " ".join(words) not in seen
                    and not corpus_runs & word_runs(words)
                ):
                    seen.add(" ".join(words))
                    picked.append(" ".join(words))
        rows = []
        for sent in picked:
            rows += [(sent, "original"), (swap_adjacent(sent, rng), "swapped")]
        rng.shuffle(rows)
        out[split] = rows
    return out


def main() -> None:
    stdlib = stdlib_documents()
    held_out = {m for modules in ORDER_MODULES.values() for m in modules}
    reference = reference_documents()
    documents = [paras for top, paras in stdlib if top not in held_out] + reference
    write_corpus(ROOT / "data/pydocs/corpus.txt", documents)
    # Test sample: every 8th document of all of them, a few hundred KB.
    write_corpus(ROOT / "tests/fixtures/sample.txt", ([paras for _, paras in stdlib] + reference)[::8])
    corpus_sentences = {" ".join(s.split()) for paras in documents for p in paras for s in sentences(p)}
    order = order_task(stdlib, corpus_sentences)
    for split, rows in order.items():
        write_tsv(ROOT / f"data/pydocs/order_{split}.tsv", rows)

    rng = random.Random(0)
    by_label: dict[str, list[str]] = {}
    for top, paras in stdlib:
        label = TASK_LABELS.get(top)
        if label:
            by_label.setdefault(label, []).extend(p for p in paras if 8 <= len(p.split()) <= 80)
    n = min(len(v) for v in by_label.values())
    rows = []
    for label in sorted(by_label):
        items = sorted(set(by_label[label]))
        rng.shuffle(items)
        rows += [(text, label) for text in items[:n]]
    rng.shuffle(rows)
    n_valid = len(rows) // 5
    for name, part in (("task_valid.tsv", rows[:n_valid]), ("task_train.tsv", rows[n_valid:])):
        write_tsv(ROOT / "data/pydocs" / name, part)
    print(
        f"python {sys.version.split()[0]}: {len(documents)} corpus documents ({len(held_out)} modules held out); "
        f"word-order task {len(order['train'])} train / {len(order['valid'])} valid rows; topic task {n} "
        f"paragraphs per label x {len(by_label)} labels ({len(rows) - n_valid} train / {n_valid} valid)"
    )


if __name__ == "__main__":
    main()
