"""`xlnet probe`: linear probes on frozen features, a measure of what pretraining put into the representations.

    res = probe("runs/tiny", "task_train.tsv", "task_valid.tsv", baseline="random", output="probe.json")
    res["results"]["pretrained"]["mean"]["accuracy"], res["results"]["random"]["mean"]["accuracy"]

Features (no finetuning, the model in eval mode): each example is encoded exactly as finetuning encodes it
(data/labelled/encode.py: ``[A <sep> B <sep> <cls>]``, left padded, so ``<cls>`` is the last position), run through
the content stream once, and read at the last layer as
- ``mean``: the mean over the example's real (non-pad) positions;
- ``cls``: the ``<cls>`` position (what the finetuning summary ``last`` reads).
A text longer than ``max_seq_length`` is read as ``document`` says (``document_reading``: first window, windows apart
and averaged, or windows in order through the memory; model/documents.py), so mean is over all its tokens read and
cls the final <cls>. `xlnet embed` (embed.py) writes these features of a file's texts.

Classifier: multinomial logistic regression on standardised features, fitted by full-batch L-BFGS (float64, on the
CPU: deterministic). The L2 strength is picked from ``L2_GRID`` on a stratified held-out part of the training file
(never the validation file; rows made of the same words stay on one side of that split, so the held-out score of a
word-order task is not spoiled by the other version of a sentence sitting in the fitted part); the probe is then
refitted on the whole training file with that strength and scored once on the validation file.
``baseline="random"`` repeats everything for the same architecture at its random initialisation (``train.seed`` of
the checkpoint's config: for one of our runs, exactly its step-0 weights).

Label efficiency (``train_sizes``, ``--train-sizes 50,200,800``): the same probe refitted on stratified draws of
``n`` training rows (``CURVE_DRAWS`` draws per size, L2 chosen again within each draw), scored on the whole validation
file, from the features computed once: accuracy against the number of labelled examples, the view where a
pretrained start shows most (``xlnet plot probe.json`` draws it).

``probe_checkpoint(model, tokenizer, train_rows, valid_rows)`` is the same probe on a model object, for use during
pretraining (``train.probe_file`` / ``train.probe_every``; ``split_rows`` makes the deterministic train/valid split of
that one file). It leaves the model's mode, its gradients and every RNG untouched::

    train_rows, valid_rows = split_rows(read_rows(cfg.train.probe_file), seed=cfg.train.seed)   # once
    settings = ProbeSettings(max_seq_length=cfg.finetune.max_seq_length, seed=cfg.train.seed)
    res = probe_checkpoint(model, tokenizer, train_rows, valid_rows, settings)  # all ranks (FSDP)
    logger.log(step, "probe", mean=res["accuracy"]["mean"], cls=res["accuracy"]["cls"])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

from xlnetcli.checkpoint import lm
from xlnetcli.checkpoint.folders import tokenizer_dir_of
from xlnetcli.checkpoint.load import checkpoint_inputs
from xlnetcli.config.sizes import check_inference_fits
from xlnetcli.core import dist
from xlnetcli.core.console import CountProgress
from xlnetcli.core.errors import DataError, XLNetError
from xlnetcli.core.files import atomic_write_json, check_file_outputs
from xlnetcli.data import labelled
from xlnetcli.data.tokenizer import Tokenizer
from xlnetcli.model import XLNetLMHeadModel
from xlnetcli.model.documents import document_features
from xlnetcli.model.kernels import resolve_impl

if TYPE_CHECKING:
    from torch.distributed.fsdp import FSDPModule

    from xlnetcli.model.xlnet import XLNetModel

FEATURES = ("mean", "cls")
L2_GRID = (1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0)  # penalty 0.5 * l2 * ||W||^2 added to the mean cross entropy
HELDOUT_FRACTION = 0.2  # share of the training file held out to choose the L2 strength
CURVE_DRAWS = 3  # draws of the training rows per size of the label-efficiency curve
LINEAR_MEMORY_IMPLS = ("flex", "triton")  # attention kernels that never write [batch, heads, length, length] scores


@dataclass(frozen=True)
class ProbeSettings:
    """How a probe runs (`xlnet probe`'s options; train.probe_* during pretraining)."""

    max_seq_length: int | None = None  # tokens per example; None: the checkpoint's finetune.max_seq_length
    batch_size: int = 64  # examples per forward pass when extracting features
    # how a text longer than max_seq_length is read (finetune.document; docs/long-documents.md): None, in `probe`,
    # the checkpoint's finetune.document, max_windows and mem_len (null: a window); in probe_checkpoint, first
    document: str | None = None
    max_windows: int | None = None  # windows read per text (document != first)
    mem_len: int | None = None  # memory: states kept from earlier windows
    seed: int = 0  # the held-out split that chooses L2, and the label-efficiency draws
    train_sizes: Sequence[int] = ()  # sizes of the label-efficiency curve (none: no curve)
    l2_grid: Sequence[float] = L2_GRID  # the L2 strengths tried
    device: str | None = "auto"  # where `probe` loads the checkpoint (probe_checkpoint uses the model's device)


@dataclass
class ProbeArrays:
    """One kind of features with its labels: what a linear probe fits (train) and scores (valid)."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_valid: np.ndarray
    y_valid: np.ndarray
    n_classes: int
    groups: np.ndarray | None = None  # one id per training row: rows of a group never split (word_bag_groups)

    def subset(self, rows: np.ndarray) -> ProbeArrays:
        """The same validation set, training rows ``rows`` only."""
        groups = None if self.groups is None else self.groups[rows]
        return ProbeArrays(self.x_train[rows], self.y_train[rows], self.x_valid, self.y_valid, self.n_classes, groups)


# ---------------------------------------------------------------------------------------------------------------
# Rows


def read_rows(
    path: str | Path, columns: labelled.Columns | None = None, header: bool = True
) -> list[labelled.TextExample]:
    """Labelled classification rows of a TSV/CSV/JSONL file (the finetuning reader and its column rules)."""
    return labelled.read_table(path, "classification", columns, header, require_label=True)


def split_rows(
    rows: Sequence[labelled.TextExample], fraction: float = 0.3, seed: int = 0
) -> tuple[list[labelled.TextExample], list[labelled.TextExample]]:
    """(train, valid) parts of one labelled file, stratified by label, rows with the same bag of words on the same
    side (``word_bag_groups``), and a pure function of (rows, seed): the split ``train.probe_file`` is probed with
    during pretraining."""
    labels = np.array([r.label for r in rows], dtype=object)
    rest, held = _stratified(labels, fraction, seed, word_bag_groups(rows))
    return [rows[i] for i in rest], [rows[i] for i in held]


def draw_rows(rows: Sequence[labelled.TextExample], n: int, seed: int = 0) -> list[labelled.TextExample]:
    """About ``n`` rows, stratified by label, drawn row by row from ``seed``, the way ``label_curve`` draws the rows
    it fits on (for finetuning on a few labelled rows)."""
    _, idx = _stratified(np.array([r.label for r in rows], dtype=object), n / len(rows), seed)
    return [rows[i] for i in idx]


def word_bag_groups(rows: Sequence[labelled.TextExample]) -> np.ndarray:
    """One group id per row; rows made of the same words (as a multiset: duplicates, or a sentence and its reordered
    copy in a word-order task) share it. Held-out splits keep a group on one side, so a held-out score never rewards
    recognising a text seen in training."""
    ids: dict[tuple[str, ...], int] = {}
    return np.array(
        [ids.setdefault(tuple(sorted(f"{r.text_a} {r.text_b or ''}".split())), len(ids)) for r in rows], dtype=np.int64
    )


def _stratified(
    labels: np.ndarray, fraction: float, seed: int, groups: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(kept, held-out) indices, sorted: about ``fraction`` of every class with at least two examples is held out
    (at least one of it), the order within a class drawn from ``seed``. With ``groups`` (one id per row), rows of a
    group are held out or kept together: groups are visited in an order drawn from ``seed`` and held out while no
    class goes past its share (a class's share is then an upper bound). Without shared ids it is the per-class draw."""
    rng = np.random.default_rng(seed)
    n_held: dict[Any, int] = {}
    for lab in sorted(set(labels.tolist()), key=str):
        n = int((labels == lab).sum())
        n_held[lab] = 0 if n < 2 else min(n - 1, max(1, round(fraction * n)))
    held: list[int] = []
    if groups is None or len(np.unique(groups)) == len(labels):
        for lab in (lab for lab in sorted(n_held, key=str) if n_held[lab]):
            held.extend(rng.permutation(np.flatnonzero(labels == lab))[: n_held[lab]].tolist())
    else:
        members: dict[int, list[int]] = {}
        for i, g in enumerate(groups.tolist()):
            members.setdefault(g, []).append(i)
        taken = dict.fromkeys(n_held, 0)
        for g in rng.permutation(sorted(members)).tolist():
            counts: dict[Any, int] = {}
            for i in members[g]:
                counts[labels[i]] = counts.get(labels[i], 0) + 1
            if all(taken[lab] + c <= n_held[lab] for lab, c in counts.items()):
                held.extend(members[g])
                for lab, c in counts.items():
                    taken[lab] += c
    held_arr = np.array(sorted(held), dtype=np.int64)
    kept = np.setdiff1d(np.arange(len(labels)), held_arr)
    return kept, held_arr


# ---------------------------------------------------------------------------------------------------------------
# Features

DOCUMENTS = ("first", "window-mean", "memory")  # finetune.document's values
LOWER_ALSO = {"first": "", "window-mean": " or --max-windows", "memory": " or --mem-len"}  # what else to lower


def document_reading(
    ft: Any,
    max_seq_length: int | None = None,
    document: str | None = None,
    max_windows: int | None = None,
    mem_len: int | None = None,
) -> tuple[labelled.Reading, int]:
    """(how texts are laid out, the memory's length) for features: each setting given, else the FinetuneConfig
    ``ft``'s (a checkpoint's finetune section; its mem_len null: a window). ``max_windows`` and ``mem_len`` given for a
    reading that does not use them are refused (they would be ignored), in the options' names."""
    window = max_seq_length or ft.max_seq_length
    if window < 4:
        raise XLNetError(f"--max-seq-length must be >= 4, got {window}")
    doc = document or ft.document
    if doc not in DOCUMENTS:
        raise XLNetError(f"--document takes {', '.join(DOCUMENTS)}, got {doc!r}")
    if doc == "first" and max_windows is not None:
        raise XLNetError(
            f"--max-windows {max_windows} reads texts over several windows: pass --document memory or "
            "window-mean with it (first reads one window)"
        )
    if doc != "memory" and mem_len is not None:
        raise XLNetError(f"--mem-len {mem_len} is the memory of --document memory; --document {doc} carries none")
    windows = 1 if doc == "first" else (max_windows or ft.max_windows)
    if not 1 <= windows <= 4096:
        raise XLNetError(f"--max-windows must be in [1, 4096], got {windows}")
    mem = mem_len or ft.mem_len or window
    if mem < 1:
        raise XLNetError(f"--mem-len must be >= 1, got {mem}")
    return labelled.Reading(window, doc, windows), mem


def check_features_fit(
    m: Any, batch: int, reading: labelled.Reading, mem_len: int, device: torch.device, keys: str
) -> None:
    """Refuse (config.sizes.check_inference_fits) features whose attention scores alone would not fit ``device``:
    a window against itself and the memory (memory), every window of the batch at once (window-mean)."""
    length, rows = reading.window, batch
    if reading.document == "memory" and reading.max_windows > 1:
        length += mem_len
    elif reading.document == "window-mean":
        rows *= reading.max_windows
    check_inference_fits(m, rows, length, device, keys)


@torch.no_grad()
def extract_features(
    model: torch.nn.Module,
    enc: labelled.Encoded,
    batch_size: int = 64,
    on_rows: Callable[[int], None] | None = None,
    reading: labelled.Reading | None = None,
    mem_len: int | None = None,
    per_layer: bool = False,
) -> dict[str, np.ndarray]:
    """{"mean": [N, d], "cls": [N, d]} float64 features of encoded examples from the last layer's content stream
    ([N, layers, d] with ``per_layer``: the embedding, then every layer). Rows wider than one window are documents,
    read as ``reading.document`` says (model/documents.py), with ``mem_len`` states of memory (default: a window).

    ``model``: an XLNetLMHeadModel, a finetuning model or a bare XLNetModel (its ``transformer`` is used). Runs in
    eval mode without memory and without bi_data (as finetuning does); the model's mode is restored. ``on_rows(n)``
    after each batch of ``n`` examples (a progress bar: core.console.CountProgress.advance)."""
    net = dist.unwrap(model)
    transformer = getattr(net, "transformer", net)
    was_training = net.training
    net.eval()
    # FSDP2: the transformer is called below the root, so the root's own parameters (embeddings) are gathered here;
    # each sharded layer gathers its own when called
    # (fully_shard swaps the class of the module: the unwrapped net is then an FSDPModule)
    sharded = cast("FSDPModule", net) if dist.is_fsdp(net) and transformer is not net else None
    if sharded is not None:
        sharded.unshard()
    device = next(transformer.parameters()).device
    out: dict[str, list[np.ndarray]] = {k: [] for k in FEATURES}
    document, window = (
        ("first", enc.arrays["input_ids"].shape[-1]) if reading is None else (reading.document, reading.window)
    )
    batches = enc.by_length(batch_size)  # similar lengths together, each batch padded only to its longest
    try:
        for idx in batches:
            a = enc.batch(idx, ("input_ids", "token_type_ids", "attention_mask"))  # left padding: <cls> stays last
            ids = torch.from_numpy(a["input_ids"]).to(device)
            seg = torch.from_numpy(a["token_type_ids"]).to(device)
            mask = torch.from_numpy(a["attention_mask"]).to(device)
            net_t = cast("XLNetModel", transformer)
            mean, cls = document_features(net_t, ids, seg, mask, document, window, mem_len or window, per_layer)
            out["mean"].append(mean.double().cpu().numpy())
            out["cls"].append(cls.double().cpu().numpy())  # left padding: <cls> is always last
            if on_rows is not None:
                on_rows(len(idx))
    finally:
        if sharded is not None:
            sharded.reshard()
        if was_training:
            net.train()
    return {k: labelled.in_row_order(v, batches) for k, v in out.items()}


# ---------------------------------------------------------------------------------------------------------------
# Logistic regression


class _Standardizer:
    def __init__(self, x: torch.Tensor) -> None:
        self.mu = x.mean(0)
        sd = x.std(0, unbiased=False)
        self.sd = torch.where(sd > 1e-8 * (1.0 + self.mu.abs()), sd, torch.ones_like(sd))  # constant columns stay 0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mu) / self.sd


def fit_logistic(
    x: np.ndarray, y: np.ndarray, n_classes: int, l2: float, max_iter: int = 200
) -> tuple[_Standardizer, torch.Tensor, torch.Tensor]:
    """Multinomial logistic regression on standardised ``x`` [n, d]: minimises mean cross entropy +
    0.5 * l2 * ||W||^2 (bias not penalised) with full-batch L-BFGS (strong Wolfe line search), in float64."""
    xt = torch.as_tensor(x, dtype=torch.float64)
    yt = torch.as_tensor(y, dtype=torch.long)
    std = _Standardizer(xt)
    z = std(xt)
    w = torch.zeros(z.shape[1], n_classes, dtype=torch.float64, requires_grad=True)
    b = torch.zeros(n_classes, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS(
        [w, b],
        lr=1.0,
        max_iter=max_iter,
        history_size=20,
        tolerance_grad=1e-9,
        tolerance_change=1e-12,
        line_search_fn="strong_wolfe",
    )

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(z @ w + b, yt) + 0.5 * l2 * (w * w).sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)
    return std, w.detach(), b.detach()


def _accuracy(model: tuple[_Standardizer, torch.Tensor, torch.Tensor], x: np.ndarray, y: np.ndarray) -> float:
    std, w, b = model
    pred = (std(torch.as_tensor(x, dtype=torch.float64)) @ w + b).argmax(-1).numpy()
    return float((pred == y).mean()) if len(y) else float("nan")


def linear_probe(
    data: ProbeArrays,
    l2_grid: Sequence[float] = L2_GRID,
    heldout_fraction: float = HELDOUT_FRACTION,
    seed: int = 0,
    on_fit: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Choose L2 on a stratified held-out part of the training set (rows of a group in ``data.groups`` never
    split, see ``word_bag_groups``), refit on all of it, score the validation set (``len(l2_grid) + 1`` fits, each
    followed by ``on_fit(1)``).

    Returns {"accuracy" (validation), "train_accuracy" (the refitted probe on its own training set), "l2" (chosen),
    "heldout" {l2: held-out accuracy}}. The validation arrays are read once, after everything else is fixed."""
    x_train, y_train, n_classes = data.x_train, data.y_train, data.n_classes
    fit_idx, held_idx = _stratified(y_train, heldout_fraction, seed, data.groups)
    if len(held_idx) == 0 or len(fit_idx) == 0:
        raise DataError(
            "the probe's training file needs at least 2 examples of some label to hold out for choosing the L2 strength"
        )
    fitted = on_fit or (lambda n: None)
    scores = {}
    for l2 in l2_grid:
        clf = fit_logistic(x_train[fit_idx], y_train[fit_idx], n_classes, l2)
        scores[l2] = _accuracy(clf, x_train[held_idx], y_train[held_idx])
        fitted(1)
    best = max(scores.values())
    l2 = max(v for v, s in scores.items() if s == best)  # ties: the stronger penalty
    clf = fit_logistic(x_train, y_train, n_classes, l2)
    fitted(1)
    return {
        "accuracy": _accuracy(clf, data.x_valid, data.y_valid),
        "train_accuracy": _accuracy(clf, x_train, y_train),
        "l2": l2,
        "heldout": {f"{k:g}": v for k, v in scores.items()},
    }


def label_curve(
    data: ProbeArrays,
    sizes: Sequence[int],
    l2_grid: Sequence[float] = L2_GRID,
    draws: int = CURVE_DRAWS,
    seed: int = 0,
    on_fit: Callable[[int], None] | None = None,
) -> list[dict[str, Any]]:
    """``linear_probe`` on stratified draws of ``n`` training rows for each ``n`` in ``sizes`` (smaller than the
    training set; draw ``k`` uses seed ``seed + k``): [{"n", "accuracy" (mean over draws), "accuracies"}]."""
    out, y_train = [], data.y_train
    for n in _curve_sizes(sizes, len(y_train)):
        accs = []
        for k in range(draws):
            _, rows = _stratified(y_train, n / len(y_train), seed + k)
            accs.append(linear_probe(data.subset(rows), l2_grid, seed=seed, on_fit=on_fit)["accuracy"])
        out.append({"n": n, "accuracy": float(np.mean(accs)), "accuracies": accs})
    return out


def _curve_sizes(sizes: Sequence[int], n_train: int) -> list[int]:
    """The sizes of the label-efficiency curve: each once, ascending, below the training set's."""
    return [n for n in sorted(set(sizes)) if n < n_train]


def _fit_count(settings: ProbeSettings, n_train: int) -> int:
    """The logistic fits of one kind of features: one per L2 strength and the refit (``linear_probe``), on all
    ``n_train`` training rows and on each draw of the label-efficiency curve (``label_curve``)."""
    probes = 1 + CURVE_DRAWS * len(_curve_sizes(settings.train_sizes, n_train))
    return probes * (len(settings.l2_grid) + 1)


# ---------------------------------------------------------------------------------------------------------------
# Probing a model object (pretraining) and a checkpoint (`xlnet probe`)


def probe_labels(
    train_rows: Sequence[labelled.TextExample],
    valid_rows: Sequence[labelled.TextExample],
    train_name: str,
    valid_name: str,
) -> list[str]:
    """The probe's labels (those of the training rows, at least 2); every validation label among them."""
    if not train_rows:
        raise DataError(f"{train_name}: no examples to train the probe on")
    if not valid_rows:
        raise DataError(f"{valid_name}: no examples to score the probe on")
    label_list = labelled.build_label_list(train_rows)
    if len(label_list) < 2:
        raise DataError(
            f"{train_name}: the probe needs at least 2 different labels, found {len(label_list)} "
            f"({', '.join(label_list)})"
        )
    labelled.check_labels(valid_rows, label_list, valid_name, train_name)
    return label_list


def probe_checkpoint(
    model: torch.nn.Module,
    tokenizer: Any,
    train_rows: Sequence[labelled.TextExample],
    valid_rows: Sequence[labelled.TextExample],
    settings: ProbeSettings,
    label_list: Sequence[str] | None = None,
    progress: str | None = None,
) -> dict[str, Any]:
    """Linear probes (``mean`` and ``cls`` features) of ``model`` on labelled rows (``settings.max_seq_length``
    must be set; ``settings.device`` is not read: the model's is used). ``progress``: the name the progress of the
    features and of the fits is shown under (`xlnet probe`: core.console.CountProgress); None: none (pretraining).

    Returns {"accuracy": {"mean": a, "cls": a}, "features": {kind: linear_probe result}, "labels", "train_examples",
    "valid_examples", "majority" (validation accuracy of always answering the training file's commonest label),
    "truncated"}; with ``settings.train_sizes``, each feature's result also holds "curve" (``label_curve``). Every
    process of a sharded (FSDP) model must call it together: the forward pass gathers weights."""
    if label_list is None:
        label_list = probe_labels(train_rows, valid_rows, "probe training rows", "probe validation rows")
    s = settings
    assert s.max_seq_length is not None
    doc = s.document or "first"
    reading = labelled.Reading(s.max_seq_length, doc, 1 if doc == "first" else s.max_windows or 1)
    mem_len = s.mem_len or s.max_seq_length
    tr = labelled.encode_texts(tokenizer, train_rows, reading, "classification", label_list)
    va = labelled.encode_texts(tokenizer, valid_rows, reading, "classification", label_list)
    y_tr, y_va = tr.arrays["labels"], va.arrays["labels"]
    quiet = progress is None
    with CountProgress(f"{progress} features", len(tr) + len(va), "examples", quiet) as bar:
        f_tr, f_va = (
            extract_features(model, tr, s.batch_size, bar.advance, reading, mem_len),
            extract_features(model, va, s.batch_size, bar.advance, reading, mem_len),
        )
    groups = word_bag_groups(train_rows)
    feats = {}
    with CountProgress(f"{progress} fits", len(FEATURES) * _fit_count(s, len(y_tr)), "fits", quiet) as bar:
        for k in FEATURES:
            data = ProbeArrays(f_tr[k], y_tr, f_va[k], y_va, len(label_list), groups)
            feats[k] = linear_probe(data, s.l2_grid, seed=s.seed, on_fit=bar.advance)
            if s.train_sizes:
                feats[k]["curve"] = label_curve(data, s.train_sizes, s.l2_grid, seed=s.seed, on_fit=bar.advance)
    commonest = int(np.bincount(y_tr, minlength=len(label_list)).argmax())
    return {
        "accuracy": {k: v["accuracy"] for k, v in feats.items()},
        "features": feats,
        "labels": list(label_list),
        "train_examples": len(train_rows),
        "valid_examples": len(valid_rows),
        "majority": float((y_va == commonest).mean()),
        "truncated": tr.n_truncated + va.n_truncated,
    }


def random_init_like(model: XLNetLMHeadModel, seed: int) -> XLNetLMHeadModel:
    """The same architecture at its random initialisation from ``seed`` (the global RNG is left as it was)."""
    device = next(model.parameters()).device
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        fresh = XLNetLMHeadModel(model.config)  # built on the CPU, as pretraining does, then moved
    return fresh.to(device).eval()


def _check_probe_args(baseline: str | None, batch_size: int, train_sizes: Sequence[int]) -> None:
    """Reject ``probe`` arguments that are wrong before any file is read."""
    if baseline not in (None, "random"):
        raise XLNetError(f"--baseline takes 'random', got {baseline!r}")
    if batch_size < 1:
        raise XLNetError(f"--batch-size must be >= 1, got {batch_size}")
    if any(n < 4 for n in train_sizes):
        raise XLNetError(
            f"--train-sizes must each be >= 4 (some to fit, some to choose L2 on), got "
            f"{','.join(map(str, train_sizes))}"
        )


def checkpoint_tokenizer(xl: lm.XLNet) -> Tokenizer:
    """The loaded checkpoint's tokenizer, checked to be present and to fit the model's embeddings."""
    tok = Tokenizer.load(tokenizer_dir_of(xl.path))
    if tok.vocab_size > xl.config.model.vocab_size:
        raise XLNetError(
            f"{xl.path}: the tokenizer has {tok.vocab_size} pieces but the model only "
            f"{xl.config.model.vocab_size} embeddings"
        )
    return tok


def _probe_report(
    xl: lm.XLNet,
    train: str | Path,
    valid: str | Path,
    label_list: list[str],
    settings: ProbeSettings,
    baseline: str | None,
    results: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    """The JSON record ``probe`` returns: the run's settings, then each model's ``probe_checkpoint`` features."""
    first = results["pretrained"]
    return {
        "kind": "probe",
        "checkpoint": str(xl.path),
        "step": xl.meta.get("step"),
        "objective": xl.config.model.objective,
        "train": str(train),
        "valid": str(valid),
        "train_examples": first["train_examples"],
        "valid_examples": first["valid_examples"],
        "labels": label_list,
        "majority": first["majority"],
        "max_seq_length": settings.max_seq_length,
        "document": settings.document,
        "max_windows": settings.max_windows,
        "mem_len": settings.mem_len,
        "truncated": first["truncated"],
        "seed": settings.seed,
        "random_init_seed": xl.config.train.seed if baseline == "random" else None,
        "results": {name: r["features"] for name, r in results.items()},
    }


def probe(
    checkpoint: str | Path,
    train: str | Path,
    valid: str | Path,
    settings: ProbeSettings = ProbeSettings(),
    baseline: str | None = None,
    output: str | Path | None = None,
    columns: labelled.Columns | None = None,
    header: bool = True,
    quiet: bool = False,
) -> dict[str, Any]:
    """Probe a checkpoint (run folder, step folder or HF directory) with ``train``/``valid`` labelled files; with
    ``output``, also write the result as JSON (``format_table`` renders it for a terminal). ``baseline="random"``
    adds the same architecture from random init. ``settings.max_seq_length``, ``document``, ``max_windows`` and
    ``mem_len`` default to the checkpoint's finetune section (``document_reading``). ``settings.train_sizes`` adds
    the label-efficiency curve (``label_curve``) of every model. Progress goes to stderr unless ``quiet``."""
    _check_probe_args(baseline, settings.batch_size, settings.train_sizes)
    check_file_outputs({"--output": output}, [*checkpoint_inputs(checkpoint), train, valid])
    train_rows = read_rows(train, columns, header)
    valid_rows = read_rows(valid, columns, header)
    label_list = probe_labels(train_rows, valid_rows, str(train), str(valid))
    dev = dist.resolve_device(settings.device)
    xl = lm.load(checkpoint, device=dev)
    tok = checkpoint_tokenizer(xl)
    s = settings
    reading, mem_len = document_reading(xl.config.finetune, s.max_seq_length, s.document, s.max_windows, s.mem_len)
    settings = replace(
        settings,
        max_seq_length=reading.window,
        document=reading.document,
        max_windows=reading.max_windows,
        mem_len=mem_len if reading.document == "memory" else None,
    )
    if resolve_impl(xl.config.model.attn_impl, dev) not in LINEAR_MEMORY_IMPLS:  # kernels that write the scores
        batch = min(settings.batch_size, max(len(train_rows), len(valid_rows)))
        keys = f"--max-seq-length {reading.window} or --batch-size {batch}" + LOWER_ALSO[reading.document]
        check_features_fit(xl.config.model, batch, reading, mem_len, dev, keys)
    models = {"pretrained": xl.model}
    if baseline == "random":
        models["random"] = random_init_like(xl.model, xl.config.train.seed)
    results = {
        name: probe_checkpoint(m, tok, train_rows, valid_rows, settings, label_list, None if quiet else name)
        for name, m in models.items()
    }
    res = _probe_report(xl, train, valid, label_list, settings, baseline, results)
    beyond = [n for n in sorted(set(settings.train_sizes)) if n >= len(train_rows)]
    if beyond:
        res["notes"] = [
            f"--train-sizes {','.join(map(str, beyond))} not drawn: not below the {len(train_rows)} training rows "
            "(the whole training file is the curve's last point)"
        ]
    if output is not None:
        atomic_write_json(output, res)
    return res


def format_table(res: dict[str, Any]) -> str:
    """The result of ``probe`` as a few plain lines: one per feature kind, one column per model."""
    names = list(res["results"])
    step = f" (step {res['step']})" if res.get("step") is not None else ""
    lines = [
        f"linear probe of {res['checkpoint']}{step}: {res['train_examples']} training / "
        f"{res['valid_examples']} validation examples, {len(res['labels'])} labels, majority-class accuracy "
        f"{res['majority']:.3f}"
    ]
    doc = res.get("document") or "first"
    if doc != "first":
        reading = labelled.Reading(res["max_seq_length"], doc, res["max_windows"])
        lines.append(f"  texts read as {doc}: {reading.describe(res.get('mem_len') or reading.window)}")
    if res["truncated"] and doc == "first":
        lines.append(f"  {res['truncated']} examples truncated to {res['max_seq_length']} tokens")
    elif res["truncated"]:
        lines.append(
            f"  {res['truncated']} examples cut to {res['max_windows']} windows of {res['max_seq_length']} tokens"
        )
    lines += [f"  {note}" for note in res.get("notes", [])]
    lines.append("features  " + "".join(f"{n:>12}" for n in names) + "   (L2 chosen on held-out training rows)")
    for kind in FEATURES:
        cells = "".join(f"{res['results'][n][kind]['accuracy']:>12.3f}" for n in names)
        l2s = ", ".join(f"{n} {res['results'][n][kind]['l2']:g}" for n in names)
        lines.append(f"{kind:<10}{cells}   ({l2s})")
    sizes = [pt["n"] for pt in res["results"][names[0]][FEATURES[0]].get("curve", [])]
    if sizes:
        lines.append(f"label efficiency: validation accuracy from n training rows (mean of {CURVE_DRAWS} draws)")
        lines.append("n         " + "".join(f"{f'{n} {kind}':>17}" for n in names for kind in FEATURES))
        for i, n_rows in enumerate([*sizes, res["train_examples"]]):
            cells = "".join(f"{_curve_point(res['results'][n][kind], i):>17.3f}" for n in names for kind in FEATURES)
            lines.append(f"{n_rows:<10}{cells}")
    return "\n".join(lines)


def _curve_point(result: dict[str, Any], i: int) -> float:
    """The i-th point of a feature's label-efficiency curve, the full training file after the drawn sizes."""
    curve = result["curve"]
    return curve[i]["accuracy"] if i < len(curve) else result["accuracy"]
