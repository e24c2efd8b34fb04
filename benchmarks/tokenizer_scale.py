"""Tokenizer training at scale: the old path (normalise the whole corpus into a temporary copy, SentencePiece samples
``input_sentence_size`` lines of it) against the new one (sample while reading, normalise in workers, hand
SentencePiece only the sample, bounded by ``tokenizer.input_sentence_bytes``), on real text repeated to size.

The text is built at run time (never committed) from /usr/share/doc (changelogs, copyright files, READMEs,
decompressed; no wordnet or fortune packages) plus data/pydocs/corpus.txt, one paragraph per line (as web corpora).
Every 50th paragraph is held out (up to --heldout-mb); the rest, repeated, makes the corpus.

    python benchmarks/tokenizer_scale.py --mb 100 --runs old,new            # before/after in one run
    python benchmarks/tokenizer_scale.py --mb 300 --runs new --sample-mb 16,64,128 --repeat 1

Each run is a child process: wall seconds, MB/s of corpus, peak RSS (the child and its workers), peak temporary
disk (polled), and on the held-out text tokens per byte (lower = more text per token) and the unknown rate.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from xlnetcli.config import load_config  # noqa: E402
from xlnetcli.core.files import atomic_output_dir  # noqa: E402
from xlnetcli.data.corpus.inputs import expand_inputs  # noqa: E402
from xlnetcli.data.corpus.reader import ReadStats, iter_lines  # noqa: E402
from xlnetcli.data.tokenizer import normalize_lines, normalize_text, train_tokenizer  # noqa: E402
from xlnetcli.data.tokenizer import train as T  # noqa: E402

MACHINE_OUTPUT = (".ps", ".eps", ".json", ".log")  # prose=True leaves these out (before .gz): not text to read
LONG_BLOCK = 2000  # prose=True: a block of more characters (a list, a table) gives its lines, not one paragraph


def paragraphs(limit: int, documents: bool = False, prose: bool = False):
    """Real text, one paragraph per line: /usr/share/doc (sorted walk) then the bundled corpus. ``documents``: also
    yield "" after each file's last paragraph (a blank line: the end of a document). ``prose``: leave out PostScript,
    JSON and logs, and give a block longer than LONG_BLOCK characters line by line (a paragraph of 1M tokens is no
    corpus's; as it was, PostScript manuals and test logs made such paragraphs)."""
    n = 0
    docs = sorted(Path("/usr/share/doc").rglob("*"))
    for p in [*docs, ROOT / "data" / "pydocs" / "corpus.txt"]:
        if any(x in str(p).lower() for x in ("wordnet", "fortune")) or p.is_symlink() or not p.is_file():
            continue
        if p.suffix in (".html", ".png", ".js", ".css", ".svg", ".pdf", ".jpg"):
            continue
        if prose and Path(p.name.removesuffix(".gz")).suffix in MACHINE_OUTPUT:
            continue
        try:
            data = gzip.decompress(p.read_bytes()) if p.suffix == ".gz" else p.read_bytes()
            text = data.decode("utf-8")
        except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile):
            continue
        if "\0" in text[:65536]:
            continue
        any_text = False
        for block in text.replace("\r", "").split("\n\n"):
            for part in block.split("\n") if prose and len(block) > LONG_BLOCK else (block,):
                s = " ".join(part.split())
                if s:
                    yield s
                    any_text = True
                    n += len(s) + 1
                    if n >= limit:
                        return
        if documents and any_text:
            yield ""


def build(work: Path, mb: float, pool_mb: float, heldout_mb: float) -> tuple[Path, Path]:
    """corpus.txt (a pool of real paragraphs repeated to ``mb``) and heldout.txt (every 50th paragraph)."""
    train, held = [], []
    for i, s in enumerate(paragraphs(int((pool_mb + heldout_mb) * 1e6))):
        (held if i % 50 == 0 and sum(map(len, held)) < heldout_mb * 1e6 else train).append(s)
    pool = "\n".join(train) + "\n"
    corpus, heldout = work / "corpus.txt", work / "heldout.txt"
    with open(corpus, "w", encoding="utf-8") as f:
        n = 0
        while n < mb * 1e6:
            f.write(pool[: int(mb * 1e6 - n)] if n + len(pool) > mb * 1e6 else pool)
            n += len(pool)
    heldout.write_text("\n".join(held) + "\n", encoding="utf-8")
    return corpus, heldout


def old_path(cfg, files: list[Path], out: Path) -> dict:
    """The path before #21: every normalised line into a temporary file, SentencePiece samples from it."""
    tcfg = cfg.tokenizer
    with atomic_output_dir(out, True, "a tokenizer") as tmp:
        norm = Path(tmp) / ".normalized.txt"
        n = 0
        with open(norm, "w", encoding="utf-8") as f:
            batch: list[str] = []
            for line in iter_lines(files, ReadStats()):
                batch.append(line)
                if len(batch) >= 10000:
                    n += f.write("".join(s + "\n" for s in normalize_lines(batch) if s))
                    batch.clear()
            f.write("".join(s + "\n" for s in normalize_lines(batch) if s))
        model = T._train_unigram(str(norm), Path(tmp) / "spiece", tcfg, tcfg.threads or os.cpu_count() or 1)
        os.unlink(norm)
        (Path(tmp) / "spiece.model").write_bytes(model)
    return {}


def child(args) -> None:
    """One run in this process: print its figures as JSON."""
    cfg = load_config(args.config, [f"tokenizer.vocab_size={args.vocab}", f"tokenizer.input_sentence_bytes={args.b}"])
    files = expand_inputs([args.corpus])
    out = Path(args.out)
    peak = [0]
    stop = threading.Event()

    def poll() -> None:  # temporary disk: every file under the run's folder
        while not stop.wait(0.2):
            peak[0] = max(peak[0], sum(p.stat().st_size for p in out.parent.rglob("*") if p.is_file()))

    threading.Thread(target=poll, daemon=True).start()
    t0 = time.perf_counter()
    if args.child == "old":
        old_path(cfg, files, out)
    else:
        train_tokenizer(cfg, files, out, overwrite=True, quiet=True, workers=int(args.workers))
    secs = time.perf_counter() - t0
    stop.set()
    self_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kids_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    print(
        json.dumps(
            {"seconds": secs, "rss_mb": self_kb / 1024, "worker_rss_mb": kids_kb / 1024, "tmp_mb": peak[0] / 1e6}
        )
    )


def quality(model: Path, heldout: Path) -> tuple[float, float]:
    """(tokens per UTF-8 byte, unknown rate) of a model on the held-out text, normalised as in training."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(model))
    lines = [normalize_text(s) for s in heldout.read_text(encoding="utf-8").splitlines()]
    ids = sp.encode(lines)
    n_tok = sum(map(len, ids))
    n_unk = sum(i.count(0) for i in ids)
    return n_tok / sum(len(s.encode()) + 1 for s in lines), n_unk / n_tok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=100, help="corpus size")
    ap.add_argument("--pool-mb", type=float, default=20, help="distinct real text repeated to --mb")
    ap.add_argument("--heldout-mb", type=float, default=2)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--config", default="base", help="preset (tokenizer.threads 0 = all cores)")
    ap.add_argument("--runs", default="old,new", help="old, new (comma-separated)")
    ap.add_argument("--sample-mb", default="", help="input_sentence_bytes values for the new path (default: config)")
    ap.add_argument("--workers", default="2", help="--workers values for the new path")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--child", choices=["old", "new"], help=argparse.SUPPRESS)
    ap.add_argument("--corpus", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--b", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    default_b = load_config(args.config).tokenizer.input_sentence_bytes
    with tempfile.TemporaryDirectory(prefix="tokscale.") as d:
        work = Path(d)
        corpus, heldout = build(work, args.mb, args.pool_mb, args.heldout_mb)
        mb = corpus.stat().st_size / 1e6
        print(
            f"corpus {mb:.0f} MB ({args.pool_mb:g} MB of distinct real text), held-out "
            f"{heldout.stat().st_size / 1e6:.1f} MB, vocab {args.vocab}, preset {args.config}, {os.cpu_count()} cores"
        )
        print(f"{'run':<26} {'s':>7} {'MB/s':>6} {'RSS MB':>7} {'wrk MB':>7} {'tmp MB':>7} {'tok/B':>7} {'unk':>9}")
        plan = [("old", 1, 0)] if "old" in args.runs.split(",") else []
        samples = [int(float(x) * 1e6) for x in args.sample_mb.split(",") if x] or [default_b]
        if "new" in args.runs.split(","):
            plan += [("new", int(w), b) for b in samples for w in args.workers.split(",")]
        for kind, w, b in plan:
            for r in range(args.repeat):
                run = work / f"{kind}{w}_{b}_{r}"
                run.mkdir()
                cmd = [
                    sys.executable,
                    __file__,
                    "--child",
                    kind,
                    "--corpus",
                    str(corpus),
                    "--out",
                    str(run / "tok"),
                    "--b",
                    str(b),
                    "--workers",
                    str(w),
                    "--vocab",
                    str(args.vocab),
                    "--config",
                    args.config,
                ]
                res = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
                tpb, unk = quality(run / "tok" / "spiece.model", heldout)
                name = "old (full copy)" if kind == "old" else f"new w{w} sample {b / 1e6:g} MB"
                print(
                    f"{name:<26} {res['seconds']:7.1f} {mb / res['seconds']:6.1f} {res['rss_mb']:7.0f} "
                    f"{res['worker_rss_mb']:7.0f} {res['tmp_mb']:7.1f} {tpb:7.4f} {unk:9.2e}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
