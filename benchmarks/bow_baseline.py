"""Bag-of-words baseline for a labelled classification file: how far the words alone go.

    python benchmarks/bow_baseline.py [--train data/pydocs/task_train.tsv] [--valid data/pydocs/task_valid.tsv]

Binary presence features of lower-cased words (letters and underscores) seen in at least --min-df training
examples, fed to the same linear probe as `xlnet probe` (standardised features, multinomial logistic regression,
L2 chosen on a held-out fifth of --train, scored once on --valid). If this matches a finetuned model, the task is
solvable from each class's vocabulary and pretraining has little room to show.
"""

from __future__ import annotations

import argparse
import collections
import json
import re

import numpy as np

from xlnetcli.evaluate.probe import ProbeArrays, linear_probe, read_rows, word_bag_groups

WORD = re.compile(r"[a-z_]+")


def words(text: str) -> set[str]:
    return set(WORD.findall(text.lower()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", default="data/pydocs/task_train.tsv")
    ap.add_argument("--valid", default="data/pydocs/task_valid.tsv")
    ap.add_argument("--min-df", type=int, default=2)
    args = ap.parse_args()
    train, valid = read_rows(args.train), read_rows(args.valid)
    df = collections.Counter(w for ex in train for w in words(ex.text_a + " " + (ex.text_b or "")))
    vocab = {w: i for i, w in enumerate(sorted(w for w, c in df.items() if c >= args.min_df))}
    labels = sorted({ex.label for ex in train})
    index = {lab: i for i, lab in enumerate(labels)}

    def features(rows):
        x = np.zeros((len(rows), len(vocab)))
        for i, ex in enumerate(rows):
            for w in words(ex.text_a + " " + (ex.text_b or "")):
                if w in vocab:
                    x[i, vocab[w]] = 1.0
        return x, np.array([index[ex.label] for ex in rows])

    (xt, yt), (xv, yv) = features(train), features(valid)
    res = linear_probe(ProbeArrays(xt, yt, xv, yv, len(labels), word_bag_groups(train)))
    majority = max(collections.Counter(yv.tolist()).values()) / len(yv)
    print(
        json.dumps(
            {
                "train_examples": len(train),
                "valid_examples": len(valid),
                "vocabulary": len(vocab),
                "accuracy": round(res["accuracy"], 4),
                "train_accuracy": round(res["train_accuracy"], 4),
                "l2": res["l2"],
                "majority": round(majority, 4),
            }
        )
    )


if __name__ == "__main__":
    main()
