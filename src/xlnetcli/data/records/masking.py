"""Span masking: which positions of a segment are prediction targets (the original ``_sample_mask``, docs/xlnet.md §4).

    ws = word_start_table(Path("shards/tokenizer"))
    masked = sample_masks(segments, ws, goal=num_predict_reuse, spans=Spans(alpha=6, beta=1), rng=rng)  # bool [N, n]

Spans of n units with p(n) ∝ 1/n (n <= MAX_GRAM), each inside a context of about n*alpha/beta tokens, until ``goal``
targets are chosen; single random positions top up the rest. "word" mode counts units in whole words, "original"
reproduces the original's subword spans. Vectorised over many segments; a segment's mask depends only on its own
uniform draws, so how segments are batched together changes nothing.

Words (data.word_rule): "spaces" = the original's rule (a piece starting with '▁', a special piece or a lone ASCII
punctuation piece starts a word), under which an unspaced run of Chinese or Japanese is one long word; "cjk" (default)
adds every piece that begins with a CJK ideograph, kana, Hangul or CJK punctuation character, so each such piece
is a word of its own (English text is unchanged). Segmented text (jieba and the like, spaces between words) is
masked by whole words with "spaces" (docs/xlnet.md §4).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import sentencepiece as spm

from xlnetcli.core.errors import DataError
from xlnetcli.data.special import CLS_ID, SEP_ID
from xlnetcli.data.tokenizer import SPIECE_FILE, word_start_mask
from xlnetcli.data.tokenizer.spm_model import SPIECE_UNDERLINE

WORD_RULES = ("spaces", "cjk")
# Unicode blocks whose characters are words of their own under word_rule "cjk" (first and last code point)
CJK_RANGES = (
    (0x1100, 0x11FF),  # Hangul Jamo
    (0x2E80, 0x2FDF),  # CJK and Kangxi radicals
    (0x3000, 0x303F),  # CJK symbols and punctuation
    (0x3040, 0x30FF),  # Hiragana, Katakana
    (0x3100, 0x31BF),  # Bopomofo, Hangul compatibility Jamo, Kanbun, Bopomofo extended
    (0x31F0, 0x31FF),  # Katakana phonetic extensions
    (0x3300, 0x4DBF),  # CJK compatibility, ideographs extension A
    (0x4E00, 0x9FFF),  # CJK unified ideographs
    (0xA960, 0xA97F),  # Hangul Jamo extended A
    (0xAC00, 0xD7FF),  # Hangul syllables, Jamo extended B
    (0xF900, 0xFAFF),  # CJK compatibility ideographs
    (0xFE30, 0xFE4F),  # CJK compatibility forms
    (0xFF00, 0xFFEF),  # halfwidth and fullwidth forms
    (0x20000, 0x323AF),  # ideographs extensions B-H, compatibility supplement
)
MAX_GRAM = 5  # spans of 1..5 units, p(n) ∝ 1/n (original _sample_mask); data.max_gram may lower it
_KK = np.arange(1, MAX_GRAM + 1)[None, :]


def ngram_cdf(max_gram: int = MAX_GRAM) -> np.ndarray:
    """Cumulative p(n) ∝ 1/n for n = 1..max_gram (the span-length law of the original _sample_mask)."""
    p = (1.0 / np.arange(1, max_gram + 1)) / (1.0 / np.arange(1, max_gram + 1)).sum()
    cdf = np.cumsum(p)
    return cdf * (1.0 / cdf[-1])


def word_start_table(tokenizer_dir: Path, rule: str = "cjk") -> np.ndarray:
    """bool [vocab]: the piece starts a word under ``rule`` (data.word_rule; docs/xlnet.md §4): where spans may begin
    and end."""
    model = tokenizer_dir / SPIECE_FILE  # the rule reads pieces only, so a bare model needs no metadata
    if not model.is_file():
        raise DataError(f"tokenizer model missing: {model}")
    sp = spm.SentencePieceProcessor(model_file=str(model))
    mask = word_start_mask(sp)
    if rule == "cjk":
        mask |= cjk_start_mask([sp.id_to_piece(i) for i in range(sp.get_piece_size())])
    elif rule != "spaces":
        raise DataError(f"data.word_rule must be one of {', '.join(WORD_RULES)}, got {rule!r}")
    return mask


def is_cjk(ch: str) -> bool:
    """A CJK ideograph, kana, Hangul or CJK punctuation character (CJK_RANGES)."""
    c = ord(ch)
    return any(lo <= c <= hi for lo, hi in CJK_RANGES)


def cjk_start_mask(pieces: list[str]) -> np.ndarray:
    """bool [len(pieces)]: the piece's first character (after '▁') is CJK: each such piece is a word."""
    return np.array([bool(p.lstrip(SPIECE_UNDERLINE)) and is_cjk(p.lstrip(SPIECE_UNDERLINE)[0]) for p in pieces], bool)


TOPUP_DRAWS = 24  # candidate positions drawn per segment for the top-up (exact fallback when they run short)


@dataclass(frozen=True)
class Spans:
    """How spans are drawn (XLNet section 2.3 and the original ``_sample_mask``; data.mask_* keys)."""

    alpha: int = 6  # a span of n units sits in a context of about n * alpha / beta tokens
    beta: int = 1
    mode: str = "word"  # "word": units are whole words; "original": subword pieces from a word start (its bug #220)
    max_gram: int = MAX_GRAM  # longest span in units


def mask_draw_width(goal: int) -> int:
    """Uniforms drawn per segment by ``sample_masks``: goal+5 span lengths, goal+5 left contexts, top-up candidates."""
    return 2 * (goal + 5) + TOPUP_DRAWS


def sample_masks(
    seg: np.ndarray,
    word_start: np.ndarray,
    goal: int,
    spans: Spans,
    rng: np.random.Generator,
    reverse: bool = False,
    top_up: bool = True,
) -> np.ndarray:
    """bool [N, n]: positions selected for prediction in each of N segments ``seg`` [N, n] of token ids.

    ``word_start``: bool [vocab]. ``spans.mode`` "word": spans of n whole words, never over <sep>/<cls>, count capped at
    ``goal``. "original": the original's spans of n subword pieces starting at a word start (its bug #220), <sep>/<cls>
    may be selected (the loader drops them). ``reverse``: the segments are time-reversed text; spans are sampled
    in reading order (the segments are flipped, masked, and the mask flipped back), as the original.
    ``top_up=False`` returns the spans only (tests). Draws ``mask_draw_width(goal)`` uniforms per segment from ``rng``
    (one call), so a segment's mask depends only on its own draws: batching segments together changes nothing.
    """
    N = seg.shape[0]
    draws = rng.random((N, mask_draw_width(goal)))
    if reverse:
        return masks_from_draws(seg[:, ::-1], word_start, goal, spans, draws, top_up)[:, ::-1]
    return masks_from_draws(seg, word_start, goal, spans, draws, top_up)


def masks_from_draws(
    seg: np.ndarray,
    word_start: np.ndarray,
    goal: int,
    spans: Spans,
    draws: np.ndarray,
    top_up: bool = True,
) -> np.ndarray:
    """``sample_masks`` on segments in reading order with pre-drawn uniforms ``draws`` [N, mask_draw_width(goal)].

    The original's loop (docs/xlnet.md §4) runs for all segments at once: iteration k uses each segment's k-th draws
    (span length n ~ 1/n, left context l), so the loop is a few array operations per iteration over the segments
    still active. Word starts are kept as one sorted array of flat positions (a sentinel word start at the end of
    every segment): "advance to the next word start" and "end after n words" are ``searchsorted``/index steps.
    """
    N, n = seg.shape
    mask = np.zeros((N, n), bool)
    if N == 0 or n == 0:
        return mask
    mode = spans.mode
    words = _WordStarts(seg, word_start, mode)
    begins, ends = _sample_spans(words, goal, spans, draws)
    if len(begins):
        lengths = ends - begins
        begins -= begins // words.width  # [N, n + 1] -> [N, n] positions (spans never reach the sentinel)
        span_of_target = np.repeat(begins - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
        mask.reshape(-1)[span_of_target + np.arange(int(lengths.sum()))] = True
    functional = words.functional - words.functional // words.width  # <sep>/<cls> in [N, n] positions
    if mode == "word":
        mask.reshape(-1)[functional] = False
    if top_up:
        _top_up(mask, functional if mode == "word" else functional[:0], goal, draws)
    return mask


class _WordStarts:
    """Where words start in N segments of n pieces, laid out flat as [N, n + 1]: segment r occupies
    [r*(n+1), r*(n+1) + n], and position n is a sentinel word start that ends every segment's last word.

    ``positions``: sorted flat positions of the word starts. ``next_start``: per flat position, the index in
    ``positions`` of the next word start at or after it. ``sentinel``: per segment, the index of its sentinel.
    ``pieces_before``: per word start, the pieces before it (differences within a segment count the pieces of
    whole words; in "word" mode <sep>/<cls> do not count). ``functional``: flat positions of <sep>/<cls>, which
    are word starts too."""

    def __init__(self, seg: np.ndarray, word_start: np.ndarray, mode: str) -> None:
        N, n = seg.shape
        self.width = n + 1
        codes = word_start.astype(np.uint8)  # 1 = word start, 3 = <sep>/<cls> (functional; a word start too)
        codes[[i for i in (SEP_ID, CLS_ID) if i < len(codes)]] = 3
        code_grid = np.empty((N, self.width), np.uint8)
        code_grid[:, :n] = codes.take(seg)
        code_grid[:, n] = 1
        self.functional = np.flatnonzero(code_grid == 3)
        is_start = code_grid.reshape(-1)
        is_start[self.functional] = 1
        is_start = is_start.view(bool)  # 0/1 bytes
        self.positions = np.flatnonzero(is_start)
        self.next_start = np.cumsum(is_start, dtype=np.int32)
        self.next_start -= is_start
        self.sentinel = self.next_start[np.arange(N) * self.width + n]
        self.pieces_before = self.positions
        if mode == "word" and len(self.functional):  # subtract the <sep>/<cls> word starts before each word start
            functional_start = np.zeros(len(self.positions) + 1, np.int32)
            functional_start[self.next_start[self.functional] + 1] = 1
            self.pieces_before = self.positions - np.cumsum(functional_start, dtype=np.int32)[:-1]


def _sample_spans(words: _WordStarts, goal: int, spans: Spans, draws: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(begins, ends): flat [N, n + 1] positions of the spans chosen, every segment's in order.

    Span-based partial prediction (XLNet §2.3, the original ``_sample_mask``): from a cursor, draw a span length of
    n_units ~ 1/n and a context of n_units*alpha/beta tokens; the span starts at the first word start at or after
    cursor + left (left uniform in the context) and the cursor moves past the span and the rest of its context. Until
    ``goal`` targets are chosen or the segment ends. Hot loop: every step is one array operation over the segments
    still active, so it stays whole."""
    alpha, beta, mode, max_gram = spans.alpha, spans.beta, spans.mode, spans.max_gram
    N, width = len(words.sentinel), words.width
    n = width - 1
    K = goal + 5
    active = np.arange(N) if goal > 0 else np.arange(0)  # the loop's state, compacted to the segments still active
    cursor = active * width
    row_end = cursor + n
    sentinel = words.sentinel[active]
    n_chosen = np.zeros(len(active), np.int64)
    u_length = np.ascontiguousarray(draws[:, :K].T)  # [K, N]: draw k of every segment contiguous
    u_left = np.ascontiguousarray(draws[:, K : 2 * K].T)
    context_of = np.arange(MAX_GRAM + 1) * alpha // beta
    cdf = ngram_cdf(max_gram)
    begins, ends = [], []
    step = 0
    while len(active):
        col = step % K
        remaining = goal - n_chosen
        n_units = np.minimum(np.searchsorted(cdf, u_length[col][active], side="right") + 1, max_gram)
        np.minimum(n_units, remaining, out=n_units)
        context = context_of[n_units]
        left = np.minimum((u_left[col][active] * context).astype(np.int64), context - 1)
        first_word = words.next_start[np.minimum(cursor + left, row_end)]  # next word start at or after cursor + left
        begin = words.positions[first_word]
        if mode == "original":  # n_units subword pieces from a word start (the original's bug #220)
            end = begin + n_units
            n_targets = n_units
            placed = end < row_end
        else:
            # whole-word spans: end after the most words (<= n_units) whose non-functional pieces keep the count
            # <= goal
            pieces_at_first = words.pieces_before[first_word]
            fits = (
                words.pieces_before[np.minimum(first_word[:, None] + _KK, sentinel[:, None])]
                <= (pieces_at_first + remaining)[:, None]
            )
            n_words = (fits & (n_units[:, None] >= _KK)).sum(1)
            end_word = np.minimum(first_word + n_words, sentinel)
            end = words.positions[end_word]
            n_targets = words.pieces_before[end_word] - pieces_at_first
            placed = (end_word > first_word) & (end < row_end)
        n_chosen += np.where(placed, n_targets, 0) if not placed.all() else n_targets
        next_cursor = end + (context - left)
        still_active = placed & (n_chosen < goal) & (next_cursor < row_end)
        if not placed.all():
            begin, end = begin[placed], end[placed]
        begins.append(begin)
        ends.append(end)
        if still_active.all():
            cursor = next_cursor
        else:
            active, cursor, row_end = active[still_active], next_cursor[still_active], row_end[still_active]
            sentinel, n_chosen = sentinel[still_active], n_chosen[still_active]
        step += 1
    if not begins:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(begins), np.concatenate(ends)


def _top_up(mask: np.ndarray, functional: np.ndarray, goal: int, draws: np.ndarray) -> None:
    """Add single random positions to ``mask`` [N, n] (in place) until each segment has ``goal`` targets, never a
    position in ``functional`` (flat [N, n]).

    The candidates are each segment's last draws, in order: the first eligible distinct ones are taken (a uniform
    subset); a segment whose candidates run short gets an exact draw, seeded by its own first two uniforms."""
    _, n = mask.shape
    K = goal + 5
    eligible = ~mask
    eligible.reshape(-1)[functional] = False
    missing = goal - mask.sum(1)
    rows = np.flatnonzero(missing > 0)
    if len(rows) == 0:
        return
    n_cand = draws.shape[1] - 2 * K
    candidates = np.minimum((draws[rows, 2 * K :] * n).astype(np.int64), n - 1)  # [S, n_cand]
    flat_cand = rows[:, None] * n + candidates
    usable = eligible.reshape(-1)[flat_cand]
    # a candidate counts once: its first draw in its row wins
    cell = (np.arange(len(rows)) * n)[:, None] + candidates
    first_draw = np.full(len(rows) * n, n_cand, np.int16)
    np.minimum.at(
        first_draw, cell.reshape(-1), np.broadcast_to(np.arange(n_cand, dtype=np.int16), cell.shape).reshape(-1)
    )
    usable &= first_draw[cell] == np.arange(n_cand)[None, :]
    n_usable = np.cumsum(usable, axis=1)
    mask.reshape(-1)[flat_cand[usable & (n_usable <= missing[rows, None])]] = True
    ran_short = np.flatnonzero(n_usable[:, -1] < missing[rows])
    for r in rows[ran_short]:
        free = np.flatnonzero(eligible[r] & ~mask[r])
        k = int(goal - mask[r].sum())
        seed = [int(x * 2**53) for x in draws[r, :2]]
        pick = np.random.default_rng(seed).permutation(free)[: max(0, k)]
        mask[r, pick] = True
