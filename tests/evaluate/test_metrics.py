"""Metric functions against values computed by hand (the arithmetic is in the comments)."""

from __future__ import annotations

import math

import pytest

from xlnetcli.evaluate import metrics as M


def test_accuracy_f1_mcc_binary():
    preds, labels = [0, 1, 1, 0], [0, 1, 0, 0]
    assert M.accuracy(preds, labels) == 0.75
    # class 0: tp 2 fp 0 fn 1 -> F1 4/5; class 1: tp 1 fp 1 fn 0 -> F1 2/3
    assert M.macro_f1(preds, labels) == pytest.approx((0.8 + 2 / 3) / 2)
    # TP 1 TN 2 FP 1 FN 0 -> (1*2 - 1*0) / sqrt((1+1)(1+0)(2+1)(2+0)) = 2 / sqrt(12)
    assert M.mcc(preds, labels) == pytest.approx(2 / math.sqrt(12))


def test_mcc_multiclass_and_degenerate():
    # n 6, correct 3, every class predicted 2x and true 2x: (3*6 - 12) / sqrt((36-12)(36-12)) = 0.25
    assert M.mcc([0, 1, 2, 0, 1, 2], [0, 1, 2, 1, 2, 0]) == pytest.approx(0.25)
    assert M.mcc(["a", "a", "a"], ["a", "b", "a"]) == 0.0  # constant predictions: undefined -> 0
    assert M.mcc([1, 0, 1], [1, 0, 1]) == pytest.approx(1.0)
    # string labels; a class only in predictions counts in macro-F1 with F1 0
    assert M.macro_f1(["x", "y", "z"], ["x", "y", "y"]) == pytest.approx((1.0 + 2 / 3 + 0.0) / 3)


def test_pearson_spearman():
    # dx -1.5 -.5 .5 1.5; dy -3 -1 0 4: sxy 11, sxx 5, syy 26
    assert M.pearson([1, 2, 3, 4], [2, 4, 5, 9]) == pytest.approx(11 / math.sqrt(130))
    # ranks with ties: x -> 1 2.5 2.5 4, y -> 1 3 2 4: 4.5 / sqrt(4.5 * 5)
    assert M.rankdata([1, 2, 2, 3]) == [1, 2.5, 2.5, 4]
    assert M.spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(4.5 / math.sqrt(22.5))
    assert M.spearman([1, 5, 10, 100], [0, 1, 2, 3]) == pytest.approx(1.0)  # monotone, not linear
    assert M.pearson([1, 1, 1], [1, 2, 3]) == 0.0
    r = M.regression_metrics([1.0, 2.0], [1.0, 4.0])
    assert r["mse"] == pytest.approx(2.0) and r["pearson"] == pytest.approx(1.0)


def test_squad_normalisation_and_scores():
    assert M.normalize_answer("The  Quick, brown-fox!") == "quick brownfox"
    assert M.normalize_answer("An apple a day") == "apple day"
    assert M.exact_score("the Method Resolution Order", "method resolution order.") == 1
    # gold cat sat on mat, pred cat on mat: common 3, P 1, R 3/4 -> 6/7
    assert M.f1_score("the cat sat on the mat", "a cat on mat") == pytest.approx(6 / 7)
    assert M.f1_score("", "") == 1.0 and M.f1_score("", "x") == 0.0 and M.f1_score("x", "") == 0.0


def test_squad_evaluate_splits():
    gold = {"q1": ["Paris", "the city of Paris"], "q2": [], "q3": ["42"]}
    preds = {"q1": "city of Paris", "q2": "", "q3": "43"}
    r = M.squad_evaluate(gold, preds)
    assert r["exact"] == pytest.approx(200 / 3) and r["f1"] == pytest.approx(200 / 3)
    assert r["HasAns_exact"] == 50.0 and r["HasAns_total"] == 2
    assert r["NoAns_exact"] == 100.0 and r["NoAns_total"] == 1
    # partial overlap: best over golds ("Paris" vs "the city of Paris" -> P 1, R 1/3 -> 0.5)
    r = M.squad_evaluate({"q": ["Paris", "the city of Paris"]}, {"q": "city"})
    assert r["f1"] == pytest.approx(50.0) and r["exact"] == 0.0


def test_squad_null_odds_threshold_search():
    gold = {"q1": ["Paris"], "q2": [], "q3": ["42"]}
    preds = {"q1": "Paris", "q2": "Lyon", "q3": "42"}  # best non-null answers
    odds = {"q1": -2.0, "q2": 1.0, "q3": 0.5}
    r = M.squad_evaluate(gold, preds, odds, na_prob_thresh=0.0)
    # threshold 0: q1 answered (right), q2 null (right), q3 null (wrong)
    assert r["exact"] == pytest.approx(200 / 3)
    # sweep: start 1 (the no-answer q2 right); q1 +1 -> 2 (t=-2); q3 +1 -> 3 (t=0.5); q2 -1 -> 2
    assert r["best_exact"] == pytest.approx(100.0) and r["best_exact_thresh"] == 0.5
    assert r["best_f1"] == pytest.approx(100.0) and r["best_f1_thresh"] == 0.5
    with pytest.raises(ValueError):
        M.squad_evaluate(gold, {"q1": "x"})
