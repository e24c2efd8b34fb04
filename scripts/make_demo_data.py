"""Regenerate the bundled demo data from the Python 3 standard library (PSF licence).

Sources: the docstrings of every pure-Python module of the running interpreter's standard library
(tests and site-packages excluded) and the language-reference topics in ``pydoc_data.topics``.
Outputs (deterministic for a given Python version):

  data/pydocs/corpus.txt          pretraining corpus: one sentence per line, blank line = end of document
  data/pydocs/task_train.tsv      demo classification task: which part of the stdlib a paragraph documents
  data/pydocs/task_valid.tsv
  tests/data/sample.txt           a few hundred KB of the corpus for the test suite

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
    "asyncio": "concurrency", "concurrent": "concurrency", "multiprocessing": "concurrency", "threading": "concurrency",
    "email": "internet", "http": "internet", "urllib": "internet", "smtplib": "internet", "imaplib": "internet",
    "ftplib": "internet", "poplib": "internet", "mailbox": "internet", "xmlrpc": "internet",
    "tkinter": "gui", "idlelib": "gui", "turtle": "gui", "turtledemo": "gui",
    "unittest": "testing", "doctest": "testing", "pdb": "testing", "bdb": "testing", "trace": "testing",
    "profile": "testing", "cProfile": "testing", "pstats": "testing", "timeit": "testing",
}


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


def main() -> None:
    stdlib = stdlib_documents()
    documents = [paras for _, paras in stdlib] + reference_documents()
    write_corpus(ROOT / "data/pydocs/corpus.txt", documents)
    # Test sample: every 8th document, a few hundred KB.
    write_corpus(ROOT / "tests/data/sample.txt", documents[::8])

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
        with (ROOT / "data/pydocs" / name).open("w", encoding="utf-8", newline="") as f:
            w = csv.writer(f, delimiter="\t", quoting=csv.QUOTE_MINIMAL, lineterminator="\n")
            w.writerow(["text", "label"])
            w.writerows(part)
    print(f"python {sys.version.split()[0]}: {len(documents)} documents, {n} paragraphs per label "
          f"x {len(by_label)} labels ({len(rows) - n_valid} train / {n_valid} valid)")


if __name__ == "__main__":
    main()
