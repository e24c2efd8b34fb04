"""Finetuning on real labelled tasks (#33 item 4): `xlnet finetune` against transformers' usual recipe on the same
checkpoint, from-scratch, a bag-of-words floor and frozen-feature probes, side by side.

    python benchmarks/real_tasks.py build                                     # runs/real_tasks/<task>/{train,valid}.tsv
    python benchmarks/finetune_real.py --init demo/pretrain [--tasks rt-snippets,spamassassin] [--seeds 0,1,2] \
        [--json runs/finetune_real/results.json]
    python benchmarks/finetune_real.py --init demo/pretrain --tasks rt-snippets --seeds 0 --limit 200   # smoke run

For each task of --tasks-dir (the folders real_tasks.py writes) and each seed (--seeds; median and min-max reported):
1. `xlnet finetune --task classification --config tiny --init CKPT` with --lr/--batch/--epochs/--max-seq-length/
   --warmup-ratio/--weight-decay/--dropout given as `--set finetune.*` (dropatt = dropout, as transformers' XLNet has
   one dropout), finetune.seed = the seed, finetune.summary_type = --summary-type (default last: transformers' XLNet
   default, a dense + tanh projection of the last token, <cls>), and finetune.eval_every past the last step so that
   only the final model is evaluated, as on transformers' side (`--best-epoch` lets ours keep its best epoch
   instead, chosen on the validation file); and the same with `--from-scratch` (random init, same architecture).
2. transformers' usual recipe on `xlnet export CKPT` (an XLNetLMHeadModel directory with the tokenizer):
   `XLNetForSequenceClassification.from_pretrained(DIR, num_labels=K)` (summary_type as above, dropout and
   summary_last_dropout = --dropout), the export's tokenizer through AutoTokenizer (truncation to --max-seq-length,
   dynamic padding on the left as XLNet pads), shuffled batches each epoch (the last one partial), torch.optim.AdamW
   with weight decay except on biases and LayerNorm, get_linear_schedule_with_warmup, gradient clipping; the same
   optimizer steps (ceil(epochs * ceil(n / batch))), warmup (round(ratio * steps)), eps 1e-6 and clip 1.0 as ours;
   a plain torch loop (what Trainer runs), evaluated once at the end. Run in a child process like ours. What still
   differs: transformers initialises the new summary projection with its init (normal, std 0.02) where ours uses
   torch's Linear default, and the export's tokenizer.json lacks the original XLNet's digit-comma rule, so a row
   with "1,000" or "01, 2002" may get other ids: the share of training rows encoded to ours' ids is reported
   (ids_equal; 0.97-1.0 on these tasks' first rows).
3. a bag-of-words floor: TF-IDF of lower-cased word unigrams and bigrams (tokens of 2+ word characters, df >= 2,
   sublinear tf, smooth idf, rows L2-normalised) and multinomial logistic regression (L-BFGS; C from 0.1 to 1000
   chosen on a fifth of the training rows held out by whole groups (the `group` column), refitted on all of them).
   Python + torch sparse tensors: scikit-learn is not in the environment. Deterministic: once per task.
4. `xlnet probe CKPT --baseline random` (frozen features, mean and <cls>, linear probe): pretrained and random init.
   Deterministic given the checkpoint: once per task.

Timing: every process gets --threads OpenMP threads (OMP_NUM_THREADS, and torch.set_num_threads in the transformers
child); runs are one at a time, the order of ours / scratch / transformers rotating with the seed. "train s" is the
training loop alone (ours: results.json `seconds`, its step clock without evaluation and checkpoint pauses;
transformers: the loop's wall time, data already tokenised, as ours is before its clock starts); examples/s is the
examples the steps consumed (steps x batch for ours, which always fills a batch; epochs x rows for transformers)
over that time. Probe and BoW rows give the whole command's wall time (features or TF-IDF and every fit) and no rate.
Results: a Markdown table on stdout and JSON (--json, default WORK/results.json). The whole run (4 tasks of about
4,000 rows, 3 seeds, 3 epochs) takes one to two hours on 2 idle cores.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import math
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch
from runner import ROOT, say, sets_args, xlnet

from xlnetcli.config import load_config

TINY = load_config("tiny").finetune
HERE = Path(__file__).resolve()
L2_C_GRID = (0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 300.0, 1000.0)
SIDES = ("ours", "scratch", "hf")  # rotated per seed


# ---- rows ----------------------------------------------------------------------------------------------------------


def read_tsv(path: Path) -> list[dict[str, str]]:
    """The rows of a real_tasks TSV (text, label, optional group), as the finetuning reader sees them: tab separated,
    no quoting."""
    with open(path, encoding="utf-8-sig", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [r for r in rows if (r.get("text") or "").strip()]


def write_tsv(path: Path, rows: list[dict[str, str]]) -> None:
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write("text\tlabel\tgroup\n")
        f.writelines(f"{r['text']}\t{r['label']}\t{r.get('group', '')}\n" for r in rows)


def limited(task_dir: Path, work: Path, limit: int | None, limit_valid: int | None) -> tuple[Path, Path]:
    """(train, valid) files: the task's, or stratified draws of --limit / --limit-valid rows (xlnetcli's draw_rows,
    seed 0) written under WORK."""
    from xlnetcli.evaluate.probe import draw_rows, read_rows

    paths = []
    for name, n in (("train", limit), ("valid", limit_valid)):
        path = task_dir / f"{name}.tsv"
        if n is not None:
            rows = read_tsv(path)
            if n < len(rows):
                keep = {(e.text_a, e.label) for e in draw_rows(read_rows(path), n, seed=0)}
                rows = [r for r in rows if (r["text"], r["label"]) in keep]
                path = work / f"{name}_{n}.tsv"
                write_tsv(path, rows)
        paths.append(path)
    return paths[0], paths[1]


# ---- our side ------------------------------------------------------------------------------------------------------


# the hyperparameters both sides are given (options of this script, finetune.* keys of ours)
SHARED = (
    "lr",
    "epochs",
    "max_seq_length",
    "warmup_ratio",
    "weight_decay",
    "adam_eps",
    "clip_norm",
    "dropout",
    "summary_type",
)


def finetune_sets(a: argparse.Namespace, seed: int) -> list[str]:
    sets = {
        **{k: getattr(a, k) for k in SHARED},
        "batch_size": a.batch,
        "micro_batch_size": a.batch,
        "dropatt": a.dropout,
        "layer_decay": 1.0,
        "summary_use_proj": True,
        "seed": seed,
        "eval_every": "epoch" if a.best_epoch else 10**9,  # past the last step: only the final model is evaluated
        "save_every": "eval" if a.best_epoch else "end",
        "early_stopping_patience": 0,
    }
    common = [f"finetune.{k}={v:g}" if isinstance(v, float) else f"finetune.{k}={v}" for k, v in sets.items()]
    return common + list(a.ours_set)  # the levers (--ours-set) come last and win


def run_ours(a: argparse.Namespace, train: Path, valid: Path, out: Path, seed: int, scratch: bool) -> dict:
    args = [
        "finetune",
        "--task",
        "classification",
        "--train",
        str(train),
        "--valid",
        str(valid),
        "--config",
        "tiny",
        "--init",
        a.init,
        "--out",
        str(out),
        "--overwrite",
        "--quiet",
        *(["--from-scratch"] if scratch else []),
        *sets_args(finetune_sets(a, seed)),
    ]
    wall, cpu = xlnet(*args, threads=a.threads, echo=a.verbose)
    res = json.loads((out / "results.json").read_text())
    examples = res["steps"] * a.batch
    return {
        "accuracy": res["valid"]["accuracy"],
        "train_s": res["seconds"],
        "examples": examples,
        "examples_per_s": examples / res["seconds"] if res["seconds"] else None,
        "steps": res["steps"],
        "best_step": res["best_step"],
        "final_train_loss": res["final_train_loss"],
        "process_wall_s": wall,
        "cpu_s": cpu,
    }


# ---- transformers' side (a child process) --------------------------------------------------------------------------


def hf_finetune(spec: dict) -> None:
    """transformers' usual recipe (see the module docstring); writes spec["out"] as JSON."""
    from transformers import (
        AutoTokenizer,
        XLNetForSequenceClassification,
        get_linear_schedule_with_warmup,
    )

    torch.set_num_threads(spec["threads"])
    t_start = time.time()
    train, valid = read_tsv(Path(spec["train"])), read_tsv(Path(spec["valid"]))
    labels = sorted({r["label"] for r in train})
    index = {lab: i for i, lab in enumerate(labels)}
    tok = AutoTokenizer.from_pretrained(spec["export"])
    tok.padding_side = "left"  # XLNet's (the tokenizer's default too)
    L = spec["max_seq_length"]

    def encode(rows: list[dict[str, str]]) -> list[dict]:
        enc = tok([r["text"] for r in rows], truncation=True, max_length=L)
        return [
            {
                **{k: enc[k][i] for k in ("input_ids", "token_type_ids", "attention_mask")},
                "labels": index.get(r["label"], -100),
            }
            for i, r in enumerate(rows)
        ]

    train_enc, valid_enc = encode(train), encode(valid)
    ids_equal = ours_ids_equal(spec, train, [e["input_ids"] for e in train_enc])

    def collate(feats: list[dict]) -> dict:
        batch = tok.pad([{k: v for k, v in f.items() if k != "labels"} for f in feats], return_tensors="pt")
        batch["labels"] = torch.tensor([f["labels"] for f in feats])
        return batch

    torch.manual_seed(spec["seed"])  # the new head's initialisation
    model = XLNetForSequenceClassification.from_pretrained(
        spec["export"],
        num_labels=len(labels),
        id2label=dict(enumerate(labels)),
        label2id=index,
        summary_type=spec["summary_type"],
        summary_use_proj=True,
        summary_activation="tanh",
        summary_last_dropout=spec["dropout"],
        dropout=spec["dropout"],
    )
    model.train()
    no_decay = [n for n, _ in model.named_parameters() if "bias" in n or "layer_norm" in n]  # Trainer's rule
    groups = [
        {"params": [p for n, p in model.named_parameters() if n not in no_decay], "weight_decay": spec["weight_decay"]},
        {"params": [p for n, p in model.named_parameters() if n in no_decay], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=spec["lr"], eps=spec["adam_eps"])
    batch = spec["batch"]
    per_epoch = max(1, math.ceil(len(train_enc) / batch))
    total = max(1, math.ceil(spec["epochs"] * per_epoch))
    sched = get_linear_schedule_with_warmup(opt, round(spec["warmup_ratio"] * total), total)
    gen = torch.Generator().manual_seed(spec["seed"])
    step, examples, losses = 0, 0, []
    t0 = time.perf_counter()
    while step < total:
        order = torch.randperm(len(train_enc), generator=gen).tolist()  # RandomSampler: a new order each epoch
        for i in range(0, len(order), batch):
            if step >= total:
                break
            b = collate([train_enc[j] for j in order[i : i + batch]])
            loss = model(**b).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), spec["clip_norm"])
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            examples += len(b["labels"])
            losses.append(loss.item())
    train_s = time.perf_counter() - t0
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(valid_enc), 64):
            b = collate(valid_enc[i : i + 64])
            pred = model(**{k: v for k, v in b.items() if k != "labels"}).logits.argmax(-1)
            correct += int((pred == b["labels"]).sum())
    result = {
        "accuracy": correct / len(valid_enc),
        "train_s": train_s,
        "examples": examples,
        "examples_per_s": examples / train_s,
        "steps": step,
        "final_train_loss": statistics.fmean(losses[-10:]),
        "ids_equal": ids_equal,
        "child_wall_s": time.time() - t_start,
    }
    Path(spec["out"]).write_text(json.dumps(result, indent=2) + "\n")


def ours_ids_equal(spec: dict, rows: list[dict[str, str]], hf_ids: list[list[int]]) -> float | None:
    """Share of rows whose transformers ids equal ours (xlnetcli's tokenizer of the checkpoint, its encoder)."""
    try:
        from xlnetcli.checkpoint.folders import find_tokenizer
        from xlnetcli.data.labelled import TextExample, encode_texts
        from xlnetcli.data.tokenizer import Tokenizer

        tok = Tokenizer.load(find_tokenizer(spec["init"]))
        enc = encode_texts(
            tok, [TextExample(r["text"], None, None) for r in rows], spec["max_seq_length"], "classification"
        )
    except Exception as e:  # noqa: BLE001 (a check only: say why it could not run, keep the result)
        print(f"finetune_real: ids check skipped ({type(e).__name__}: {e})", file=sys.stderr)
        return None
    ours = [
        ids[mask > 0].tolist() for ids, mask in zip(enc.arrays["input_ids"], enc.arrays["attention_mask"], strict=True)
    ]
    return sum(o == h for o, h in zip(ours, hf_ids, strict=True)) / max(1, len(rows))


def run_hf(a: argparse.Namespace, export: Path, train: Path, valid: Path, out: Path, seed: int) -> dict:
    spec = {
        "init": a.init,
        "export": str(export),
        "train": str(train),
        "valid": str(valid),
        "out": str(out),
        "seed": seed,
        "threads": a.threads,
        "batch": a.batch,
        **{k: getattr(a, k) for k in SHARED},
    }
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(a.threads),
        "PYTHONPATH": str(ROOT / "src"),
        "TOKENIZERS_PARALLELISM": "false",
    }
    if a.verbose:
        say(f"$ transformers finetune (seed {seed}) -> {out}")
    t0 = time.time()
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(
            [sys.executable, str(HERE), "--hf-child", json.dumps(spec)], env=env, stdout=log, stderr=subprocess.STDOUT
        )
        _, status, usage = os.wait4(proc.pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            log.seek(0)
            tail = "\n".join(log.read().strip().splitlines()[-15:])
            sys.exit(f"finetune_real: transformers finetuning failed ({os.waitstatus_to_exitcode(status)}):\n{tail}")
    res = json.loads(out.read_text())
    res["process_wall_s"], res["cpu_s"] = time.time() - t0, usage.ru_utime + usage.ru_stime
    return res


# ---- bag of words ----------------------------------------------------------------------------------------------------

_TOKEN = re.compile(r"(?u)\b\w\w+\b")  # scikit-learn's default token pattern


def ngrams(text: str) -> list[str]:
    words = _TOKEN.findall(text.lower())
    return words + [f"{x} {y}" for x, y in itertools.pairwise(words)]


class Tfidf:
    """TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, min_df=2) as scikit-learn defines it: tf = 1 + ln(count),
    idf = ln((1 + n) / (1 + df)) + 1, rows L2-normalised; features = n-grams in >= min_df fitting rows."""

    def __init__(self, texts: list[str], min_df: int = 2) -> None:
        docs = [Counter(ngrams(t)) for t in texts]
        df = Counter(g for d in docs for g in d)
        vocab = sorted(g for g, c in df.items() if c >= min_df)
        self.index = {g: i for i, g in enumerate(vocab)}
        n = len(texts)
        self.idf = [math.log((1 + n) / (1 + df[g])) + 1.0 for g in vocab]

    def __call__(self, texts: list[str]):
        rows, cols, vals = [], [], []
        for r, t in enumerate(texts):
            feats = {
                self.index[g]: (1.0 + math.log(c)) * self.idf[self.index[g]]
                for g, c in Counter(ngrams(t)).items()
                if g in self.index
            }
            norm = math.sqrt(sum(v * v for v in feats.values())) or 1.0
            for c, v in feats.items():
                rows.append(r)
                cols.append(c)
                vals.append(v / norm)
        return torch.sparse_coo_tensor(
            torch.tensor([rows, cols], dtype=torch.long).reshape(2, -1),
            torch.tensor(vals, dtype=torch.float64),
            (len(texts), len(self.index)),
            check_invariants=True,
        ).coalesce()


def fit_lr(x, y, n_classes: int, c: float):
    """Multinomial logistic regression, scikit-learn's objective: sum of cross entropies + ||W||^2 / (2 C), intercept
    not penalised; full-batch L-BFGS in float64. Returns (W, b)."""
    yt = torch.as_tensor(y, dtype=torch.long)
    w = torch.zeros(x.shape[1], n_classes, dtype=torch.float64, requires_grad=True)
    b = torch.zeros(n_classes, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS(
        [w, b],
        lr=1.0,
        max_iter=300,
        history_size=20,
        tolerance_grad=1e-8,
        tolerance_change=1e-12,
        line_search_fn="strong_wolfe",
    )
    n = len(y)

    def closure():
        opt.zero_grad()
        logits = torch.sparse.mm(x, w) + b
        loss = torch.nn.functional.cross_entropy(logits, yt, reduction="sum") / n + (w * w).sum() / (2 * c * n)
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)
    return w.detach(), b.detach()


def lr_accuracy(model, x, y) -> float:
    w, b = model
    pred = (torch.sparse.mm(x, w) + b).argmax(-1)
    return float((pred == torch.as_tensor(y)).double().mean())


def held_out_groups(groups: list[str], fraction: float, seed: int) -> set[str]:
    """Whole groups, in a seeded order, until ``fraction`` of the rows is held out."""
    sizes = Counter(groups)
    order = sorted(sizes)
    random.Random(seed).shuffle(order)
    held, n = set(), 0
    for g in order:
        if n >= fraction * len(groups):
            break
        held.add(g)
        n += sizes[g]
    return held


def bow(train_path: Path, valid_path: Path, threads: int) -> dict:
    torch.set_num_threads(threads)
    t0 = time.time()
    train, valid = read_tsv(train_path), read_tsv(valid_path)
    labels = sorted({r["label"] for r in train})
    index = {lab: i for i, lab in enumerate(labels)}
    y = [index[r["label"]] for r in train]
    yv = [index.get(r["label"], -1) for r in valid]
    groups = [r.get("group") or " ".join(sorted(r["text"].split())) for r in train]  # no group column: the word bag
    held = held_out_groups(groups, 0.2, 0)
    fit = [i for i, g in enumerate(groups) if g not in held]
    ho = [i for i, g in enumerate(groups) if g in held]
    vec = Tfidf([train[i]["text"] for i in fit])
    x_fit, x_ho = vec([train[i]["text"] for i in fit]), vec([train[i]["text"] for i in ho])
    scores = {}
    for c in L2_C_GRID:
        scores[c] = lr_accuracy(fit_lr(x_fit, [y[i] for i in fit], len(labels), c), x_ho, [y[i] for i in ho])
    best = max(scores.values())
    c = min(v for v, s in scores.items() if s == best)  # ties: the stronger penalty
    vec = Tfidf([r["text"] for r in train])
    model = fit_lr(vec([r["text"] for r in train]), y, len(labels), c)
    acc = lr_accuracy(model, vec([r["text"] for r in valid]), yv)
    return {
        "accuracy": acc,
        "C": c,
        "heldout": {f"{k:g}": v for k, v in scores.items()},
        "features": len(vec.index),
        "train_s": time.time() - t0,
    }


# ---- the run ---------------------------------------------------------------------------------------------------------


def probe(a: argparse.Namespace, train: Path, valid: Path, out: Path) -> dict:
    wall, cpu = xlnet(
        "probe",
        a.init,
        "--train",
        str(train),
        "--valid",
        str(valid),
        "--max-seq-length",
        str(a.max_seq_length),
        "--baseline",
        "random",
        "--output",
        str(out),
        threads=a.threads,
        echo=a.verbose,
    )
    res = json.loads(out.read_text())["results"]
    return {
        "results": {f"{start}/{feat}": res[start][feat]["accuracy"] for start in res for feat in res[start]},
        "process_wall_s": wall,
        "cpu_s": cpu,
    }


METHODS = {  # key -> table name
    "ours": "xlnet finetune --init (pretrained)",
    "scratch": "xlnet finetune --from-scratch",
    "hf": "transformers' recipe on the export",
    "bow": "TF-IDF 1-2 grams + logistic regression",
    "probe pretrained/mean": "xlnet probe, mean (pretrained)",
    "probe pretrained/cls": "xlnet probe, <cls> (pretrained)",
    "probe random/mean": "xlnet probe, mean (random init)",
    "probe random/cls": "xlnet probe, <cls> (random init)",
    "majority": "majority class",
}


def summarise(runs: list[dict]) -> list[dict]:
    """One row per (task, method): median accuracy, min and max over seeds, median train s and examples/s."""
    out = []
    keys = list(dict.fromkeys((r["task"], r["method"]) for r in runs))
    for task, method in keys:
        sel = [r for r in runs if r["task"] == task and r["method"] == method]
        acc = [r["accuracy"] for r in sel]
        ts = [r["train_s"] for r in sel if r.get("train_s") is not None]
        eps = [r["examples_per_s"] for r in sel if r.get("examples_per_s") is not None]
        out.append(
            {
                "task": task,
                "method": method,
                "n": len(sel),
                "median": statistics.median(acc),
                "min": min(acc),
                "max": max(acc),
                "train_s": statistics.median(ts) if ts else None,
                "examples_per_s": statistics.median(eps) if eps else None,
            }
        )
    return out


def print_table(rows: list[dict]) -> None:
    print("| task | method | accuracy, median [min-max] | seeds | train wall s | train examples/s |")
    print("|---|---|---|---:|---:|---:|")
    for r in rows:
        spread = f"{r['median']:.3f} [{r['min']:.3f}-{r['max']:.3f}]" if r["n"] > 1 else f"{r['median']:.3f}"
        ts = "" if r["train_s"] is None else f"{r['train_s']:.1f}"
        eps = "" if r["examples_per_s"] is None else f"{r['examples_per_s']:.0f}"
        print(f"| {r['task']} | {METHODS[r['method']]} | {spread} | {r['n']} | {ts} | {eps} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--init", help="pretrained checkpoint (run folder or step folder) for finetuning, export and probe")
    ap.add_argument("--tasks-dir", default="runs/real_tasks", help="real_tasks.py's output (default: runs/real_tasks)")
    ap.add_argument("--tasks", default=None, help="comma-separated task folders (default: all under --tasks-dir)")
    ap.add_argument("--seeds", default="0,1,2", help="finetuning seeds, comma-separated (default: 0,1,2)")
    ap.add_argument("--methods", default="ours,scratch,hf,bow,probe", help="subset of ours,scratch,hf,bow,probe")
    ap.add_argument("--lr", type=float, default=TINY.lr, help=f"both sides (default: the tiny preset's {TINY.lr:g})")
    ap.add_argument("--batch", type=int, default=TINY.batch_size, help=f"default {TINY.batch_size}")
    ap.add_argument("--epochs", type=float, default=TINY.epochs, help=f"default {TINY.epochs:g}")
    ap.add_argument("--max-seq-length", type=int, default=TINY.max_seq_length, help=f"default {TINY.max_seq_length}")
    ap.add_argument("--warmup-ratio", type=float, default=TINY.warmup_ratio, help=f"default {TINY.warmup_ratio:g}")
    ap.add_argument("--weight-decay", type=float, default=TINY.weight_decay, help=f"default {TINY.weight_decay:g}")
    ap.add_argument("--dropout", type=float, default=TINY.dropout, help=f"default {TINY.dropout:g} (attention too)")
    ap.add_argument("--adam-eps", type=float, default=TINY.adam_eps, help=f"default {TINY.adam_eps:g}")
    ap.add_argument("--clip-norm", type=float, default=TINY.clip_norm, help=f"default {TINY.clip_norm:g}")
    ap.add_argument("--summary-type", choices=("last", "first"), default="last", help="both sides (default last)")
    ap.add_argument(
        "--best-epoch", action="store_true", help="ours evaluates every epoch and keeps the best (on valid)"
    )
    ap.add_argument(
        "--ours-set",
        action="append",
        default=[],
        metavar="finetune.KEY=VALUE",
        help="a lever for our side only (ours and scratch), after the shared settings; repeatable",
    )
    ap.add_argument("--threads", type=int, default=2, help="OpenMP / torch threads of every run (default 2)")
    ap.add_argument("--limit", type=int, default=None, help="a stratified draw of N training rows (smoke runs)")
    ap.add_argument("--limit-valid", type=int, default=None, help="the same for the validation file")
    ap.add_argument("--work", default="runs/finetune_real", help="working folder (runs replaced)")
    ap.add_argument("--json", default=None, help="results JSON (default: WORK/results.json)")
    ap.add_argument("--verbose", action="store_true", help="print each command")
    ap.add_argument("--hf-child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.hf_child:
        return hf_finetune(json.loads(a.hf_child))
    if not a.init:
        ap.error("--init is required")
    methods = [m for m in a.methods.split(",") if m]
    if set(methods) - {"ours", "scratch", "hf", "bow", "probe"}:
        ap.error(f"--methods: unknown {sorted(set(methods) - {'ours', 'scratch', 'hf', 'bow', 'probe'})}")
    seeds = [int(s) for s in a.seeds.split(",")]
    tasks_dir = Path(a.tasks_dir).resolve()
    a.init = str(Path(a.init).resolve())  # the xlnet commands run in the repository root
    names = (
        a.tasks.split(",") if a.tasks else sorted(p.name for p in tasks_dir.iterdir() if (p / "train.tsv").is_file())
    )
    if not names:
        sys.exit(f"finetune_real: no task under {tasks_dir}; run benchmarks/real_tasks.py build first")
    work = Path(a.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    os.environ["OMP_NUM_THREADS"] = str(a.threads)
    t_all = time.time()
    load0 = os.getloadavg()
    say(f"load average {load0[0]:.1f}, {os.cpu_count()} CPUs, {a.threads} threads per run")
    export = work / "hf_export"
    if "hf" in methods:
        xlnet("export", a.init, "--out", str(export), "--overwrite", threads=a.threads, echo=a.verbose)
    runs, extra = [], {}
    for name in names:
        tdir = work / name
        tdir.mkdir(exist_ok=True)
        train, valid = limited(tasks_dir / name, tdir, a.limit, a.limit_valid)
        valid_labels = Counter(r["label"] for r in read_tsv(valid))
        n_train = len(read_tsv(train))
        extra[name] = {
            "train": str(train),
            "valid": str(valid),
            "train_rows": n_train,
            "valid_rows": sum(valid_labels.values()),
        }
        say(f"{name}: {n_train} training rows, {sum(valid_labels.values())} validation rows")
        runs.append(
            {
                "task": name,
                "method": "majority",
                "seed": None,
                "accuracy": max(valid_labels.values()) / sum(valid_labels.values()),
            }
        )
        if "bow" in methods:
            r = bow(train, valid, a.threads)
            extra[name]["bow"] = r
            runs.append(
                {"task": name, "method": "bow", "seed": None, "accuracy": r["accuracy"], "train_s": r["train_s"]}
            )
            say(
                f"{name}: bag of words {r['accuracy']:.3f} (C {r['C']:g}, {r['features']} features, "
                f"{r['train_s']:.1f} s)"
            )
        if "probe" in methods:
            r = probe(a, train, valid, tdir / "probe.json")
            extra[name]["probe"] = r
            for key, acc in r["results"].items():
                runs.append(
                    {
                        "task": name,
                        "method": f"probe {key}",
                        "seed": None,
                        "accuracy": acc,
                        "train_s": r["process_wall_s"],
                    }
                )
            say(f"{name}: probe " + ", ".join(f"{k} {v:.3f}" for k, v in r["results"].items()))
        for i, seed in enumerate(seeds):
            order = [s for s in SIDES[i % 3 :] + SIDES[: i % 3] if s in methods]
            for side in order:
                out = tdir / f"{side}_seed{seed}"
                if side == "hf":
                    r = run_hf(a, export, train, valid, tdir / f"hf_seed{seed}.json", seed)
                else:
                    r = run_ours(a, train, valid, out, seed, scratch=side == "scratch")
                runs.append({"task": name, "method": side, "seed": seed, **r})
                say(
                    f"{name} seed {seed}: {side} {r['accuracy']:.3f} ({r['train_s']:.1f} s training, "
                    f"{r['examples_per_s']:.0f} examples/s)"
                )
    rows = summarise(runs)
    result = {
        "init": a.init,
        "settings": {
            k: getattr(a, k) for k in (*SHARED, "batch", "best_epoch", "ours_set", "threads", "limit", "limit_valid")
        },
        "seeds": seeds,
        "tasks": extra,
        "summary": rows,
        "runs": runs,
        "minutes": round((time.time() - t_all) / 60, 1),
        "load_average": {"start": load0, "end": os.getloadavg()},
        "versions": versions(),
    }
    out = Path(a.json) if a.json else work / "results.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print_table(rows)
    print(f"\nresults: {out} ({result['minutes']} min; load average {load0[0]:.1f} -> {os.getloadavg()[0]:.1f})")


def versions() -> dict:
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__, "python": sys.version.split()[0]}


if __name__ == "__main__":
    main()
