"""Whole-word span masking on scripts without spaces (data.word_rule): under "cjk" each piece that begins with a CJK
ideograph, kana or Hangul is a word, so target spans on Chinese-like text are as long (in tokens) as on English;
under "spaces" an unspaced run is one word and spans run long (issue #21: 11.6% of spans >= 6 tokens vs 3.5%)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm
from clitools import CORPUS, settings_config

from xlnetcli.data.records.masking import Spans, cjk_start_mask, is_cjk, sample_masks, word_start_table
from xlnetcli.data.tokenizer import train_tokenizer, word_start_mask

SEQ, GOAL = 128, 21  # the tiny preset's seq_len and num_predict


def chinese_like(n_sentences: int, seed: int = 0) -> str:
    """Chinese-like text: words of 1-3 ideographs (mostly 2) from a Zipf-distributed lexicon over 800 common-block
    characters, 6-30 words a sentence with a full-width comma every 3-8 words and a full stop, no spaces; now and
    then a number or a Latin name, as in real Chinese prose."""
    rng = np.random.default_rng(seed)
    chars = [chr(0x4E00 + int(i)) for i in rng.choice(20000, 800, replace=False)]
    p_char = 1 / np.arange(1, 801)
    lexicon = [
        "".join(rng.choice(chars, int(k), p=p_char / p_char.sum()))
        for k in rng.choice([1, 2, 3], 3000, p=[0.3, 0.55, 0.15])
    ]
    p_word = 1 / np.arange(1, 3001) ** 1.1
    p_word /= p_word.sum()
    out = []
    for _ in range(n_sentences):
        words = list(rng.choice(lexicon, int(rng.integers(6, 31)), p=p_word))
        for i in range(int(rng.integers(3, 9)), len(words), int(rng.integers(3, 9))):
            words[i] = "\uff0c" + words[i]
        if rng.random() < 0.2:
            words.insert(int(rng.integers(len(words))), str(int(rng.integers(1, 2000))))
        if rng.random() < 0.1:
            words.insert(int(rng.integers(len(words))), " Python ")
        out.append("".join(words) + "\u3002")
    return "\n".join(out) + "\n"


def span_lengths(tok_dir: Path, text_lines: list[str], rule: str) -> np.ndarray:
    """Lengths in tokens of the target spans (top-up left out) in 128 segments of SEQ tokens of the text."""
    sp = spm.SentencePieceProcessor(model_file=str(tok_dir / "spiece.model"))
    ids = np.concatenate([np.array(x, np.int64) for x in sp.encode(text_lines)])
    seg = ids[: (len(ids) // SEQ) * SEQ].reshape(-1, SEQ)[:128]
    assert len(seg) == 128
    mask = sample_masks(
        seg, word_start_table(tok_dir, rule), GOAL, Spans(6, 1, "word"), np.random.default_rng(0), top_up=False
    )
    edges = np.diff(np.pad(mask.astype(np.int8), ((0, 0), (1, 1))), axis=1)
    return np.flatnonzero(edges.reshape(-1) == -1) - np.flatnonzero(edges.reshape(-1) == 1)


@pytest.fixture(scope="module")
def zh_tok(tmp_path_factory) -> tuple[Path, list[str]]:
    d = tmp_path_factory.mktemp("zh")
    text = chinese_like(6000)
    (d / "zh.txt").write_text(text, encoding="utf-8")
    cfg = settings_config("tokenizer", vocab_size=2000, character_coverage=1.0, threads=1)
    train_tokenizer(cfg, [d / "zh.txt"], d / "tok", quiet=True)
    held_out = chinese_like(1500, seed=1).splitlines()
    return d / "tok", held_out


@pytest.fixture(scope="module")
def en_tok(tmp_path_factory) -> Path:
    """The tiny preset's tokenizer (8000 pieces) on the bundled English corpus."""
    from xlnetcli.config import load_config

    out = tmp_path_factory.mktemp("en") / "tok"
    train_tokenizer(load_config("tiny"), [CORPUS], out, quiet=True)
    return out


@pytest.mark.slow
def test_cjk_spans_follow_the_english_distribution(zh_tok, en_tok):
    tok_dir = en_tok
    en_lines = CORPUS.read_text(encoding="utf-8").splitlines()
    en = span_lengths(tok_dir, en_lines, "cjk")
    # no CJK piece in the demo's vocabulary: the same table, so the same spans and records as before word_rule
    assert (word_start_table(tok_dir, "cjk") == word_start_table(tok_dir, "spaces")).all()
    assert (en == span_lengths(tok_dir, en_lines, "spaces")).all()
    zh_dir, zh_lines = zh_tok
    zh_spaces, zh_cjk = span_lengths(zh_dir, zh_lines, "spaces"), span_lengths(zh_dir, zh_lines, "cjk")

    def long_share(x: np.ndarray) -> float:
        return float((x >= 6).mean())

    # the issue: an unspaced run is one word, spans run long
    print(
        f"spans >= 6 tokens: English {long_share(en):.3f}, Chinese-like {long_share(zh_spaces):.3f} (spaces), "
        f"{long_share(zh_cjk):.3f} (cjk); mean {en.mean():.2f}, {zh_spaces.mean():.2f}, {zh_cjk.mean():.2f} tokens"
    )
    assert long_share(zh_spaces) > 1.5 * long_share(en)
    # each CJK piece a word: no more long spans than English, the same length law (p(n) ~ 1/n over 1..5 units)
    assert long_share(zh_cjk) <= long_share(en) + 0.005
    assert abs(zh_cjk.mean() - en.mean()) < 0.25 * en.mean()
    shares = [float((zh_cjk == k).mean()) for k in (1, 2, 3)]
    assert shares[0] > shares[1] > shares[2]


def test_cjk_rule_marks_cjk_pieces_only(zh_tok):
    sp = spm.SentencePieceProcessor(model_file=str(zh_tok[0] / "spiece.model"))
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    extra = cjk_start_mask(pieces) & ~word_start_mask(sp)
    assert extra.sum() > 1000  # most pieces of Chinese text start without '▁'
    assert all(is_cjk(pieces[i].lstrip("\u2581")[0]) for i in np.flatnonzero(extra))
    assert (word_start_table(zh_tok[0], "cjk") == (word_start_mask(sp) | cjk_start_mask(pieces))).all()
    assert [is_cjk(c) for c in "\u4e2d\u3042\u30a2\ud55c\u3002\uff0cAa1\u00e9\u0391"] == [True] * 6 + [False] * 5


def test_word_rule_is_checked(tok_dir):
    from xlnetcli.core.errors import DataError

    with pytest.raises(DataError, match="word_rule"):
        word_start_table(tok_dir, "jieba")
