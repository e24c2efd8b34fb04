"""Corpus B for benchmarks/continue_pretraining.py: a domain other than the bundled Python docs, built at run time
from the World English Bible (public domain) in Debian's `sword-text-web` package (a SWORD zText module).

    python scripts/make_domain_corpus.py --out WORK [--deb sword-text-web_*.deb]

Outputs in WORK (reused when present; deterministic for a given package version):

  corpus_b.txt        pretraining text, one sentence per line, blank line = end of a book; the books in
                      ORDER_BOOKS are held out of it
  heldout_b.txt       the held-out books' text (the same format), never pretrained on
  order_train.tsv     the B-domain word-order task, built as the demo's (scripts/make_demo_data.py: each sentence
  order_valid.tsv     as written and with adjacent words swapped, so a bag of words is at chance), from the held-out
                      books only, validation books other than the training books

The package: `apt-get download sword-text-web` (any folder; pass it with --deb), or this script looks in WORK, the
current folder and /tmp. The module is read directly: per testament a .bzs index of (offset, size, size) uint32
triples into .bzz, one zlib block per book, OSIS markup (footnotes and headings dropped, other tags stripped).
"""

from __future__ import annotations

import argparse
import glob
import gzip
import re
import struct
import subprocess
import sys
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_demo_data import order_task, sentences, write_corpus, write_tsv

PACKAGE = "sword-text-web"
MODULE = "usr/share/sword/modules/texts/ztext/engWEB2015eb"
GCIDE = "usr/share/dictd/gcide.dict.dz"  # --source gcide (dict-gcide, GPL): the lr's confirmation on a second corpus
# Word-order task books (held out of corpus_b.txt): narrative prose, validation books apart from training books
ORDER_BOOKS = {
    "train": ("Ruth", "Jonah", "Esther", "Acts"),
    "valid": ("Tobit", "Judith"),
}
DROP = re.compile(r"<(note|title)\b[^>]*>.*?</\1>", re.S)  # footnotes, headings
BREAK = re.compile(r'<div\b[^>]*type="x-p"[^>]*/>|<chapter\b[^>]*/>|<lb\b[^>]*/>|<l\b[^>]*/>')  # paragraph ends
TAG = re.compile(r"<[^>]+>")
BOOK_NAME = re.compile(r'<milestone n="([^"]+)" type="x-usfm-toc2"/>')


def find_deb(deb: str | None, work: Path, package: str = PACKAGE) -> Path:
    """The .deb to read: --deb, else PACKAGE_*.deb in WORK, the current folder or /tmp; else exit with how to get
    it."""
    if deb:
        return Path(deb)
    for folder in (work, Path.cwd(), Path("/tmp")):
        hits = sorted(glob.glob(str(folder / f"{package}_*.deb")))
        if hits:
            return Path(hits[-1])
    sys.exit(
        f"make_domain_corpus: no {package}_*.deb in {work}, the current folder or /tmp. Get it (Debian/Ubuntu, "
        f"a few MB) with `cd {work} && apt-get download {package}`, or pass --deb PATH."
    )


def books(module: Path) -> list[tuple[str, list[str]]]:
    """(book name, paragraphs of plain text) for every book of the module, in canon order."""
    out = []
    for testament in ("ot", "nt"):
        index, blob = (module / f"{testament}.bzs").read_bytes(), (module / f"{testament}.bzz").read_bytes()
        for i in range(len(index) // 12):
            offset, size, _ = struct.unpack_from("<III", index, 12 * i)
            osis = zlib.decompress(blob[offset : offset + size]).decode("utf-8")
            name = BOOK_NAME.search(osis)
            if not name:
                continue
            paras = [re.sub(r"\s+", " ", TAG.sub(" ", p)).strip() for p in BREAK.split(DROP.sub(" ", osis))]
            paras = [re.sub(r" ([,.;:?!\u2019\u201d])", r"\1", p) for p in paras if len(p.split()) >= 3]
            out.append((name.group(1), paras))
    return out


def gcide_documents(root: Path, mb: float = 4.5) -> list[list[str]]:
    """Definitions and quotations of GCIDE (dictd text: entries of indented lines, blank-line blocks), every 8th
    block up to about ``mb`` MB, 50 blocks to a document: a second domain for confirming the lr (no task)."""
    text = gzip.decompress((root / GCIDE).read_bytes()).decode("utf-8", errors="replace")
    blocks = [re.sub(r"\s+", " ", re.sub(r"\[[^\]]*\]|[{}\\*]", " ", b)).strip() for b in text.split("\n\n")[::8]]
    paras, size = [], 0
    for b in blocks:
        if len(b.split()) >= 6 and size < mb * 1e6:
            paras.append(b)
            size += len(b) + 1
    return [paras[i : i + 50] for i in range(0, len(paras), 50)]


def build_gcide(work: Path, deb: Path) -> dict[str, int]:
    """corpus_b.txt and heldout_b.txt (every 20th document) from dict-gcide; no task."""
    root = work / "pkg"
    if not (root / GCIDE).is_file():
        root.mkdir(parents=True, exist_ok=True)
        subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    docs = gcide_documents(root)
    write_corpus(work / "corpus_b.txt", [d for i, d in enumerate(docs) if i % 20])
    write_corpus(work / "heldout_b.txt", docs[::20])
    return {"books": len(docs)}


def build(work: Path, deb: Path) -> dict[str, int]:
    """Extract the package into WORK and write the corpus, held-out text and task files; returns their sizes."""
    root = work / "pkg"
    if not (root / MODULE).is_dir():
        root.mkdir(parents=True, exist_ok=True)
        subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    docs = books(root / MODULE)
    held = {b for names in ORDER_BOOKS.values() for b in names}
    missing = held - {name for name, _ in docs}
    if missing:
        sys.exit(f"make_domain_corpus: books {sorted(missing)} not in {deb.name}")
    train_docs = [paras for name, paras in docs if name not in held]
    write_corpus(work / "corpus_b.txt", train_docs)
    write_corpus(work / "heldout_b.txt", [paras for name, paras in docs if name in held])
    corpus_sentences = {" ".join(s.split()) for paras in train_docs for p in paras for s in sentences(p)}
    order = order_task(docs, corpus_sentences, ORDER_BOOKS)
    for split, rows in order.items():
        write_tsv(work / f"order_{split}.tsv", rows)
    return {"books": len(train_docs), **{split: len(rows) for split, rows in order.items()}}


SOURCES = {"web": (PACKAGE, build), "gcide": ("dict-gcide", build_gcide)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path, help="work folder (the outputs are reused when present)")
    ap.add_argument("--deb", default=None, help="the package's .deb (default: looked for, see above)")
    ap.add_argument("--source", choices=SOURCES, default="web", help="web (default), or gcide (no task)")
    args = ap.parse_args()
    if (args.out / "corpus_b.txt").is_file():
        print(f"corpus B already built in {args.out}")
        return
    package, builder = SOURCES[args.source]
    sizes = builder(args.out, find_deb(args.deb, args.out, package))
    mb = (args.out / "corpus_b.txt").stat().st_size / 1e6
    print(f"corpus B ({args.source}): {mb:.1f} MB, {sizes}")


if __name__ == "__main__":
    main()
