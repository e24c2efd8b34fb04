"""Task metrics, dependency-free: accuracy, macro-F1, MCC, Pearson, Spearman, and SQuAD EM/F1.

The SQuAD functions follow the official v2.0 evaluation script: answers are normalised (lowercase, punctuation and the
articles a/an/the removed, whitespace collapsed) before comparison; an unanswerable question is scored 1 exactly when
the prediction is empty; the best null-odds threshold is searched over the predicted null odds.
"""

from __future__ import annotations

import collections
import math
import re
import string
from collections.abc import Mapping, Sequence
from typing import Any

# ---------------------------------------------------------------------------------------------------------------
# Classification


def accuracy(preds: Sequence[Any], labels: Sequence[Any]) -> float:
    _same_length(preds, labels)
    return sum(int(p == t) for p, t in zip(preds, labels, strict=True)) / len(labels) if labels else 0.0


def macro_f1(preds: Sequence[Any], labels: Sequence[Any]) -> float:
    """Unweighted mean of per-class F1 over every class that occurs in labels or predictions (scikit-learn's
    ``f1_score(average="macro")``); a class with no true or predicted positive gets F1 = 0."""
    _same_length(preds, labels)
    classes = sorted(set(labels) | set(preds), key=str)
    if not classes:
        return 0.0
    f1s = []
    for c in classes:
        tp = sum(1 for p, t in zip(preds, labels, strict=True) if p == c and t == c)
        fp = sum(1 for p, t in zip(preds, labels, strict=True) if p == c and t != c)
        fn = sum(1 for p, t in zip(preds, labels, strict=True) if p != c and t == c)
        denom = 2 * tp + fp + fn
        f1s.append(2 * tp / denom if denom else 0.0)
    return sum(f1s) / len(f1s)


def mcc(preds: Sequence[Any], labels: Sequence[Any]) -> float:
    """Matthews correlation coefficient, multi-class form (Gorodkin 2004, as scikit-learn); 0 when undefined."""
    _same_length(preds, labels)
    n = len(labels)
    if n == 0:
        return 0.0
    correct = sum(int(p == t) for p, t in zip(preds, labels, strict=True))
    pred_counts = collections.Counter(preds)
    true_counts = collections.Counter(labels)
    classes = set(pred_counts) | set(true_counts)
    cov_ytyp = correct * n - sum(pred_counts[c] * true_counts[c] for c in classes)
    cov_ypyp = n * n - sum(v * v for v in pred_counts.values())
    cov_ytyt = n * n - sum(v * v for v in true_counts.values())
    denom = cov_ypyp * cov_ytyt
    return cov_ytyp / math.sqrt(denom) if denom > 0 else 0.0


def classification_metrics(preds: Sequence[Any], labels: Sequence[Any]) -> dict[str, float]:
    return {"accuracy": accuracy(preds, labels), "macro_f1": macro_f1(preds, labels), "mcc": mcc(preds, labels)}


# ---------------------------------------------------------------------------------------------------------------
# Regression


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    """Pearson correlation; 0 when either side is constant."""
    _same_length(x, y)
    n = len(x)
    if n < 2:
        return 0.0
    mx, my = sum(x) / n, sum(y) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True))
    sxx = sum((a - mx) ** 2 for a in x)
    syy = sum((b - my) ** 2 for b in y)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else 0.0


def rankdata(x: Sequence[float]) -> list[float]:
    """1-based ranks, ties get the average of their ranks (scipy's ``rankdata(method="average")``)."""
    order = sorted(range(len(x)), key=lambda i: x[i])
    ranks = [0.0] * len(x)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and x[order[j + 1]] == x[order[i]]:
            j += 1
        avg = (i + j) / 2 + 1
        for k in range(i, j + 1):
            ranks[order[k]] = avg
        i = j + 1
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman rank correlation = Pearson correlation of the (average-tie) ranks."""
    return pearson(rankdata(x), rankdata(y))


def regression_metrics(preds: Sequence[float], labels: Sequence[float]) -> dict[str, float]:
    _same_length(preds, labels)
    n = max(1, len(labels))
    mse = sum((p - t) ** 2 for p, t in zip(preds, labels, strict=True)) / n
    return {"pearson": pearson(preds, labels), "spearman": spearman(preds, labels), "mse": mse}


def _same_length(a: Sequence[Any], b: Sequence[Any]) -> None:
    if len(a) != len(b):
        raise ValueError(f"predictions ({len(a)}) and labels ({len(b)}) differ in length")


# ---------------------------------------------------------------------------------------------------------------
# SQuAD (official v2.0 evaluation script semantics)

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCT = set(string.punctuation)


def normalize_answer(s: str) -> str:
    """Lower text and remove punctuation, articles and extra whitespace (official script)."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def _tokens(s: str) -> list[str]:
    return normalize_answer(s).split() if s else []


def exact_score(gold: str, pred: str) -> int:
    return int(normalize_answer(gold) == normalize_answer(pred))


def f1_score(gold: str, pred: str) -> float:
    gold_toks, pred_toks = _tokens(gold), _tokens(pred)
    if not gold_toks or not pred_toks:
        # If either is no-answer, F1 is 1 if they agree, 0 otherwise.
        return float(gold_toks == pred_toks)
    common = collections.Counter(gold_toks) & collections.Counter(pred_toks)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_toks), same / len(gold_toks)
    return 2 * precision * recall / (precision + recall)


def _golds(answers: Sequence[str]) -> list[str]:
    golds = [a for a in answers if normalize_answer(a)]
    return golds or [""]  # unanswerable: the only correct prediction is the empty string


def _best_thresh(
    preds: Mapping[str, str], scores: Mapping[str, float], na_probs: Mapping[str, float], has_ans: Mapping[str, bool]
) -> tuple[float, float]:
    """Official find_best_thresh: sweep the threshold over the sorted null odds; predict null above it."""
    num_no_ans = sum(1 for q in scores if not has_ans[q])
    cur = best = float(num_no_ans)
    best_thresh = 0.0
    for qid in sorted(scores, key=lambda q: na_probs[q]):
        diff = scores[qid] if has_ans[qid] else (-1 if preds[qid] else 0)
        cur += diff
        if cur > best:
            best, best_thresh = cur, na_probs[qid]
    return 100.0 * best / max(1, len(scores)), best_thresh


def squad_evaluate(
    gold: Mapping[str, Sequence[str]],
    preds: Mapping[str, str],
    na_probs: Mapping[str, float] | None = None,
    na_prob_thresh: float = 0.0,
) -> dict[str, float]:
    """Score SQuAD predictions.

    gold: qid -> list of gold answer texts (empty list = unanswerable). preds: qid -> best non-null answer text
    (or "" for no answer). na_probs: qid -> null odds (higher = more likely unanswerable); when given, a prediction is
    replaced by "" where its null odds exceed ``na_prob_thresh``, and best_exact / best_f1 with their thresholds are
    added (the null-odds threshold search). Returns percentages, with HasAns_* / NoAns_* splits when both occur.
    """
    missing = [q for q in gold if q not in preds]
    if missing:
        raise ValueError(f"{len(missing)} questions have no prediction (first: {missing[0]})")
    has_ans = {q: bool(_golds(a) != [""]) for q, a in gold.items()}
    raw_exact = {q: max(exact_score(g, preds[q]) for g in _golds(a)) for q, a in gold.items()}
    raw_f1 = {q: max(f1_score(g, preds[q]) for g in _golds(a)) for q, a in gold.items()}
    exact: dict[str, float] = dict(raw_exact)
    f1: dict[str, float] = dict(raw_f1)
    if na_probs is not None:
        for q in gold:
            if na_probs[q] > na_prob_thresh:
                exact[q] = f1[q] = float(not has_ans[q])
    n = max(1, len(gold))
    out: dict[str, float] = {
        "exact": 100.0 * sum(exact.values()) / n,
        "f1": 100.0 * sum(f1.values()) / n,
        "total": len(gold),
    }
    for name, keep in (("HasAns", True), ("NoAns", False)):
        qids = [q for q in gold if has_ans[q] == keep]
        if qids:
            out[f"{name}_exact"] = 100.0 * sum(exact[q] for q in qids) / len(qids)
            out[f"{name}_f1"] = 100.0 * sum(f1[q] for q in qids) / len(qids)
            out[f"{name}_total"] = len(qids)
    if na_probs is not None:
        out["best_exact"], out["best_exact_thresh"] = _best_thresh(preds, raw_exact, na_probs, has_ans)
        out["best_f1"], out["best_f1_thresh"] = _best_thresh(preds, raw_f1, na_probs, has_ans)
    return out


# The metric that picks the best checkpoint, per task (higher is better for all).
PRIMARY_METRIC = {
    "classification": "accuracy",
    "regression": "pearson",
    "multiple-choice": "accuracy",
    "squad": "f1",
}
