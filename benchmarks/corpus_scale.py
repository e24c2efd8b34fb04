"""The data pipeline at corpus scale (#21): `xlnet tokenize train` -> `shard` -> `preprocess` on one corpus of
--size-mb, each stage with 1 and 2 workers, then `--part I/N` and `merge` for shard and preprocess, and the
projection to 1 TB on N machines.

    python benchmarks/corpus_scale.py --size-mb 1000          # what BENCHMARKS.md shows (and --size-mb 250)
    python benchmarks/corpus_scale.py                          # 50 MB (`make bench`)
    python benchmarks/corpus_scale.py --quick                  # 5 MB smoke run, tiny preset
    python benchmarks/corpus_scale.py --corpus 'my/*.txt'      # your own corpus (files, directory or glob)

The corpus is built at run time in --out (never committed): real text from /usr/share/doc (changelogs, copyright
files, READMEs, manuals, decompressed; no wordnet or fortune packages; PostScript, JSON and logs left out) then
data/pydocs/corpus.txt, one paragraph per line (a block over 2,000 characters line by line), one source file = one
document (tokenizer_scale.paragraphs with prose=True), written to --files files of equal size. The distinct text is
what this machine has (about 160 MB); beyond it the same text repeats from the start (the output says how much is
distinct). Repetition does not change the throughput or the memory of shard and preprocess, but it
flatters the tokenizer: its sample (tokenizer.input_sentence_bytes) holds repeated lines.

Every stage is `python -m xlnetcli ...` in a child process (this tree's src/), with TMPDIR inside the stage's folder:
  wall, CPU s    of the child and all its processes (os.wait4)
  RSS            the largest single process's peak (ru_maxrss of the child and the workers it waited for)
  PSS            the peak of the sum of proportional set sizes of the child's process tree (polled, shared pages once)
  temp disk      peak disk use under the stage's folder (the output and the `.NAME.*.tmp` folder beside it, TMPDIR),
                 polled, less the finished output (allocated blocks: sparse part files count what they hold)
  out MB         the output on disk, less the copy of the tokenizer a shard or records folder holds
  bytes/token    that per corpus token (train + valid) per pass
MB/s is corpus MB per wall second (a part: its share of the corpus, by the part's input bytes or rows). The 1 TB
projection uses the per-part rates and the merges' rates: the parts run on N machines like this one at once, the
merges on one. Temp files and stage outputs are deleted as soon as measured (only the last tokenizer and shards are
kept for the next stage); --keep keeps the corpus and those.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from runner import ROOT, say

sys.path.insert(0, str(ROOT / "src"))

from tokenizer_scale import paragraphs

from xlnetcli.config import load_config
from xlnetcli.data.corpus.inputs import expand_inputs, total_size

MB = 1e6
TB_MB = 1e6  # 1 TB in MB


# -------------------------------------------------------------------------------------------------------- the corpus
def build_corpus(folder: Path, size_mb: float, files: int) -> dict:
    """``files`` text files of about size_mb / files MB each in ``folder``: real paragraphs, one per line, a blank
    line after each source document, the text repeated from the start once it runs out. Deterministic."""
    folder.mkdir(parents=True, exist_ok=True)
    target, per_file = int(size_mb * MB), int(size_mb * MB / files)
    total = distinct = passes = 0
    paths: list[Path] = []
    f = None
    t0 = time.perf_counter()
    try:
        while total < target:
            passes += 1
            for s in paragraphs(1 << 62, documents=True, prose=True):
                if f is None or (f.tell() >= per_file and len(paths) < files):
                    if f is not None:
                        f.write("\n")  # a document cut at a file boundary ends there
                        total += 1
                        distinct += passes == 1
                        f.close()
                    paths.append(folder / f"corpus_{len(paths):03d}.txt")
                    f = open(paths[-1], "w", encoding="utf-8")  # noqa: SIM115 (several files, one at a time)
                line = s + "\n"
                f.write(line)
                n = len(line.encode())
                total += n
                distinct += n if passes == 1 else 0
                if total >= target:
                    break
    finally:
        if f is not None:
            f.close()
    size = sum(p.stat().st_size for p in paths)
    return {
        "source": "/usr/share/doc (text, .gz decompressed; no wordnet/fortune, PostScript, JSON, logs) + data/pydocs",
        "files": len(paths),
        "bytes": size,
        "distinct_bytes": min(distinct, size),
        "repeats": size / max(1, min(distinct, size)),
        "build_s": time.perf_counter() - t0,
        "inputs": [str(folder)],
    }


# ----------------------------------------------------------------------------------------------------- measurement
def _tree(root: int) -> list[int]:
    """``root`` and its descendants (one scan of /proc)."""
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
            kids.setdefault(ppid, []).append(int(d))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += kids.get(pid, [])
    return out


def _pss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def disk_bytes(folder: Path, skip: tuple[str, ...] = ()) -> int:
    """Allocated bytes of the files under ``folder`` (subfolders named in ``skip`` left out)."""
    total = 0
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = [d for d in dirnames if d not in skip]
        for name in filenames:
            with contextlib.suppress(OSError):  # removed while walking
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


def run_stage(cmd: list[str], folder: Path, interval: float = 0.5) -> dict:
    """Run ``python -m xlnetcli CMD`` with its temporary files under ``folder``; the figures of the run."""
    folder.mkdir(parents=True, exist_ok=True)
    tmpdir = folder / "tmpdir"
    tmpdir.mkdir(exist_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p),
        "XLNET_NO_PROGRESS": "1",
        "TMPDIR": str(tmpdir),
    }
    base = disk_bytes(folder)
    peak = {"pss": 0, "disk": base}
    stop = threading.Event()
    load = os.getloadavg()[0]
    say("$ xlnet " + " ".join(cmd))
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "xlnetcli", *cmd], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
        )

        def poll() -> None:
            while True:
                peak["pss"] = max(peak["pss"], sum(_pss(p) for p in _tree(proc.pid)))
                peak["disk"] = max(peak["disk"], disk_bytes(folder))
                if stop.wait(interval):
                    return

        th = threading.Thread(target=poll, daemon=True)
        th.start()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        stop.set()
        th.join()
        if proc.returncode != 0:
            log.seek(0)
            tail = "\n".join(log.read().strip().splitlines()[-8:])
            raise SystemExit(f"corpus_scale: xlnet {' '.join(cmd)} failed ({proc.returncode}):\n{tail}")
    shutil.rmtree(tmpdir, ignore_errors=True)
    return {
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "rss_mb": usage.ru_maxrss / 1024,
        "pss_mb": peak["pss"] / MB,
        "peak_disk_mb": (peak["disk"] - base) / MB,
        "load": load,
    }


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def corpus_tokens(shards: Path) -> int:
    m = json.loads((shards / "manifest.json").read_text())
    return sum(s["tokens"] for split in m["splits"].values() for s in split)


# ---------------------------------------------------------------------------------------------------------- stages
def run_all(a: argparse.Namespace, work: Path, inputs: list[str], nbytes: int) -> dict:
    cfg = ["--config", a.config]
    workers = [int(w) for w in a.workers.split(",")]
    wmax = max(workers)
    rows: list[dict] = []
    same: dict[str, bool] = {}
    out = work / "stages"
    mb = nbytes / MB

    def row(stage: str, w: int | str, res: dict, in_mb: float, output: Path | None, tokens: int = 0) -> dict:
        out_b = disk_bytes(output, skip=("tokenizer",)) if output and output.exists() else 0
        out_all = disk_bytes(output) if output and output.exists() else 0  # with the tokenizer's copy
        r = {"stage": stage, "workers": w, "mb": in_mb, **res, "mb_s": in_mb / res["wall_s"], "output_mb": out_b / MB}
        r["temp_mb"] = max(0.0, res["peak_disk_mb"] - out_all / MB)
        if tokens:
            r["bytes_per_token"] = out_b / tokens
        rows.append(r)
        print_row(r)
        return r

    print_header()
    # 1. tokenizer: the model must not depend on --workers
    models = []
    for w in workers:
        d = out / f"tok_w{w}"
        res = run_stage(["tokenize", "train", *inputs, "--out", str(d / "tok"), *cfg, "--workers", str(w)], d)
        row("tokenize train", w, res, mb, d / "tok")
        models.append(sha(d / "tok" / "spiece.model"))
        if w != workers[-1]:
            shutil.rmtree(d)
    same["tokenizer"] = len(set(models)) == 1
    tok = out / f"tok_w{workers[-1]}" / "tok"

    # 2. shards, one host
    shard_args = ["--tokenizer", str(tok), *cfg, "--shards", str(a.shards), "--quiet"]
    manifests = []
    for w in workers:
        d = out / f"shard_w{w}"
        res = run_stage(["shard", *inputs, "--out", str(d / "shards"), *shard_args, "--workers", str(w)], d)
        tokens = corpus_tokens(d / "shards")
        row("shard", w, res, mb, d / "shards", tokens)
        manifests.append(sha(d / "shards" / "manifest.json"))
        if w != workers[-1]:
            shutil.rmtree(d)
    same["shards"] = len(set(manifests)) == 1
    shards = out / f"shard_w{workers[-1]}" / "shards"
    tokens = corpus_tokens(shards)

    # 3. records, one host
    passes = load_config(a.config).data.passes
    metas = []
    for w in workers:
        d = out / f"pre_w{w}"
        res = run_stage(
            ["preprocess", "--shards", str(shards), "--out", str(d / "records"), *cfg, "--workers", str(w)], d
        )
        row("preprocess", w, res, mb, d / "records", tokens * passes)
        metas.append(sha(d / "records" / "meta.json"))
        shutil.rmtree(d)
    same["records"] = len(set(metas)) == 1

    # 4. --part I/N and merge, wmax workers per part
    parts = a.parts
    if parts > 1:
        sizes = {str(p): p.stat().st_size for p in map(Path, _expand(inputs))}
        d = out / "shard_parts"
        for i in range(parts):
            pd = d / f"part{i}"
            res = run_stage(["shard", *inputs, "--out", str(pd / "out"), *shard_args, "--workers", str(wmax),
                             "--part", f"{i}/{parts}"], pd)  # fmt: skip
            pj = json.loads((pd / "out" / "part.json").read_text())
            part_mb = sum(sizes.get(f["input"], 0) for f in pj["files"]) / MB
            row(f"shard --part {i}/{parts}", wmax, res, part_mb, pd / "out")
        res = run_stage(["shard-merge", *(str(d / f"part{i}" / "out") for i in range(parts)),
                         "--out", str(d / "merged"), "--quiet"], d)  # fmt: skip
        row("shard merge", "-", res, mb, d / "merged", tokens)
        same["shard merge"] = sha(d / "merged" / "manifest.json") == manifests[-1]
        shutil.rmtree(d)

        d = out / "pre_parts"
        for i in range(parts):
            pd = d / f"part{i}"
            res = run_stage(["preprocess", "--shards", str(shards), "--out", str(pd / "out"), *cfg,
                             "--workers", str(wmax), "--part", f"{i}/{parts}"], pd)  # fmt: skip
            row(f"preprocess --part {i}/{parts}", wmax, res, mb * _row_share(pd / "out", parts), pd / "out")
        res = run_stage(["preprocess-merge", *(str(d / f"part{i}" / "out") for i in range(parts)),
                         "--out", str(d / "merged")], d)  # fmt: skip
        row("preprocess merge", "-", res, mb, d / "merged", tokens * passes)
        same["preprocess merge"] = sha(d / "merged" / "meta.json") == metas[-1]
        shutil.rmtree(d)
    return {"rows": rows, "identical": same, "tokens": tokens, "passes": passes, "tokens_per_byte": tokens / nbytes}


def _expand(inputs: list[str]) -> list[str]:
    return [str(p) for p in expand_inputs(inputs)]


def _row_share(part: Path, parts: int) -> float:
    """The share of the rows of every pass a records part built (its part.json's rows of global_batch_size)."""
    pj = json.loads((part / "part.json").read_text())
    try:
        return (pj["rows"][1] - pj["rows"][0]) / pj["plan"]["meta"]["global_batch_size"]
    except (KeyError, TypeError, IndexError):
        return 1 / parts


# ---------------------------------------------------------------------------------------------------------- report
COLS = [
    ("stage", "<26", "stage", "{}"),
    ("workers", ">3", "w", "{}"),
    ("wall_s", ">7", "wall s", "{:.1f}"),
    ("mb_s", ">6", "MB/s", "{:.2f}"),
    ("cpu_s", ">7", "CPU s", "{:.1f}"),
    ("rss_mb", ">7", "RSS MB", "{:.0f}"),
    ("pss_mb", ">7", "PSS MB", "{:.0f}"),
    ("temp_mb", ">8", "temp MB", "{:.1f}"),
    ("output_mb", ">8", "out MB", "{:.1f}"),
    ("bytes_per_token", ">6", "B/tok", "{:.2f}"),
    ("load", ">5", "load", "{:.1f}"),
]


def print_header() -> None:
    print(" ".join(f"{h:{f}}" for _, f, h, _ in COLS), flush=True)


def print_row(r: dict) -> None:
    cells = [(v.format(r[k]) if k in r else "-") for k, _, _, v in COLS]
    print(" ".join(f"{c:{f}}" for c, (_, f, _, _) in zip(cells, COLS, strict=True)), flush=True)


def projection(res: dict, machines: list[int]) -> list[dict]:
    """1 TB on N machines like this one: the parts at once, each 1/N of the corpus at the parts' rate, then the merge
    on one machine at the merge's rate. The tokenizer runs on one machine."""

    def rate(prefix: str) -> float | None:
        rs = [r for r in res["rows"] if r["stage"].startswith(prefix)]
        return sum(r["mb"] for r in rs) / sum(r["wall_s"] for r in rs) if rs else None

    tok = max((r for r in res["rows"] if r["stage"] == "tokenize train"), key=lambda r: r["workers"])
    out = []
    for n in machines:
        p: dict = {"machines": n, "tokenize_whole_tb_h": TB_MB / tok["mb_s"] / 3600}
        for stage in ("shard", "preprocess"):
            part, merge = rate(f"{stage} --part"), rate(f"{stage} merge")
            if n == 1 or part is None or merge is None:  # one host (or no parts measured: linear, no merge)
                one = max((r for r in res["rows"] if r["stage"] == stage), key=lambda r: r["workers"])
                part, merge = one["mb_s"], float("inf")
            p[f"{stage}_parts_h"] = TB_MB / n / part / 3600
            p[f"{stage}_merge_h"] = TB_MB / merge / 3600
        p["total_h"] = sum(v for k, v in p.items() if k.endswith("_h") and not k.startswith("tokenize"))
        out.append(p)
    return out


def goals(res: dict, corpus: dict, sample_bytes: int) -> list[dict]:
    rows = res["rows"]
    tok = [r for r in rows if r["stage"] == "tokenize train"]
    tok2 = max(tok, key=lambda r: r["workers"])
    sh = max((r for r in rows if r["stage"] == "shard"), key=lambda r: r["workers"])
    pre = [r for r in rows if r["stage"] == "preprocess"]
    sample = min(sample_bytes or corpus["bytes"], corpus["bytes"]) / MB
    gb = corpus["bytes"] / 1e9
    mem = max(max(r["rss_mb"], r["pss_mb"]) for r in tok)
    return [
        {"goal": "tokenizer <= 300 s at 1 GB (2 cores)", "value": f"{tok2['wall_s']:.0f} s at {gb:.2f} GB",
         "met": tok2["wall_s"] <= 300 if gb >= 1 else None},
        {"goal": "tokenizer peak memory <= 2 GB", "value": f"{mem:.0f} MB", "met": mem <= 2000},
        {"goal": "tokenizer temp disk <= 2x the sample", "value": f"{max(r['temp_mb'] for r in tok):.1f} MB for a "
         f"{sample:.1f} MB sample bound", "met": max(r["temp_mb"] for r in tok) <= 2 * sample},
        {"goal": "shard >= 20 MB/s, 2 workers, 1 GB", "value": f"{sh['mb_s']:.1f} MB/s ({sh['workers']} workers) "
         f"at {gb:.2f} GB", "met": sh["mb_s"] >= 20 if gb >= 1 and sh["workers"] >= 2 else None},
        {"goal": "shard peak RSS flat in corpus size", "value": f"{sh['rss_mb']:.0f} MB RSS, {sh['pss_mb']:.0f} MB "
         "PSS (compare two sizes)", "met": None},
        {"goal": "records <= 1 byte per corpus token per pass", "value": f"{pre[-1]['bytes_per_token']:.2f}",
         "met": pre[-1]["bytes_per_token"] <= 1.0},
    ]  # fmt: skip


# ------------------------------------------------------------------------------------------------------------ main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=float, default=None, help="corpus size (default 50; --quick 5)")
    ap.add_argument("--corpus", action="append", default=None, help="use this corpus (repeatable; files, dirs, globs)")
    ap.add_argument("--files", type=int, default=16, help="files the built corpus is written to (--part deals files)")
    ap.add_argument("--workers", default="1,2", help="--workers values of each stage, comma-separated")
    ap.add_argument("--config", default=None, help="preset of every stage (default base; --quick tiny)")
    ap.add_argument("--shards", type=int, default=8, help="xlnet shard --shards")
    ap.add_argument("--parts", type=int, default=2, help="N of --part I/N for shard and preprocess (< 2: skip)")
    ap.add_argument("--machines", default="1,8,64,512", help="machine counts of the 1 TB projection")
    ap.add_argument("--out", type=Path, default=None, help="work folder (default: a new temporary folder)")
    ap.add_argument("--keep", action="store_true", help="keep the corpus, tokenizer and shards in --out")
    ap.add_argument("--json", type=Path, default=None, help="results (default: runs/bench/corpus_scale.json)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 5 MB, tiny preset")
    a = ap.parse_args()
    a.size_mb = a.size_mb or (5.0 if a.quick else 50.0)
    a.config = a.config or ("tiny" if a.quick else "base")
    t0 = time.time()
    work = (a.out or Path(tempfile.mkdtemp(prefix="corpus_scale."))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    made = [work / "stages"] + ([] if a.corpus else [work / "corpus"])
    if any(p.exists() for p in made):
        raise SystemExit(f"corpus_scale: {work} already holds {' or '.join(p.name for p in made)}; pick a new --out")
    say(f"load average {os.getloadavg()}, {os.cpu_count()} CPUs, work folder {work}")
    try:
        if a.corpus:
            inputs = a.corpus
            nbytes = total_size(expand_inputs(inputs))
            corpus = {"source": " ".join(inputs), "files": len(expand_inputs(inputs)), "bytes": nbytes}
        else:
            corpus = build_corpus(work / "corpus", a.size_mb, a.files)
            inputs, nbytes = corpus["inputs"], corpus["bytes"]
            say(
                f"corpus: {nbytes / MB:.1f} MB in {corpus['files']} files, {corpus['distinct_bytes'] / MB:.1f} MB "
                f"distinct (x{corpus['repeats']:.2f}), built in {corpus['build_s']:.0f} s"
            )
        res = run_all(a, work, inputs, nbytes)
        tcfg = load_config(a.config).tokenizer
        res["goals"] = goals(res, corpus, tcfg.input_sentence_bytes)
        res["projection"] = projection(res, [int(n) for n in a.machines.split(",")])
    finally:
        if not a.keep:
            for p in made:
                shutil.rmtree(p, ignore_errors=True)
            if a.out is None:
                shutil.rmtree(work, ignore_errors=True)
    print(f"\nsame output for every --workers / parts merged = one host: {res['identical']}")
    print(
        f"corpus tokens {res['tokens']:,} ({res['tokens_per_byte']:.3f} per byte); 1 TB = "
        f"{res['tokens_per_byte'] * 1e12 / 1e9:,.0f}B tokens"
    )
    print("\n1 TB on N machines like this one (parts at once on N machines, then the merge on one), hours:")
    print(f"{'N':>5} {'shard parts':>12} {'shard merge':>12} {'prep parts':>11} {'prep merge':>11} {'total':>8}")
    for p in res["projection"]:
        print(
            f"{p['machines']:>5} {p['shard_parts_h']:>12.1f} {p['shard_merge_h']:>12.1f} "
            f"{p['preprocess_parts_h']:>11.1f} {p['preprocess_merge_h']:>11.1f} {p['total_h']:>8.1f}"
        )
    print(
        f"tokenizer: one machine, {res['projection'][0]['tokenize_whole_tb_h']:.1f} h to read the whole 1 TB at the "
        "measured rate (an upper bound: SentencePiece's part is fixed by the sample)"
    )
    print("\ngoals:")
    for g in res["goals"]:
        print(f"  {'met' if g['met'] else '-' if g['met'] is None else 'MISSED':<6} {g['goal']}: {g['value']}")
    minutes = (time.time() - t0) / 60
    out = a.json or ROOT / "runs" / "bench" / "corpus_scale.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    res |= {
        "corpus": corpus,
        "config": a.config,
        "workers": a.workers,
        "shards": a.shards,
        "parts": a.parts,
        "cpus": os.cpu_count(),
        "load_end": os.getloadavg(),
        "minutes": minutes,
        "kept": str(work) if a.keep else None,
    }
    out.write_text(json.dumps(res, indent=2) + "\n")
    say(f"{minutes:.1f} min; results: {out}")


if __name__ == "__main__":
    main()
