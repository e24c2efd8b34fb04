"""Span masking: which positions of a segment are prediction targets (the original ``_sample_mask``, docs/xlnet.md §4).

    ws = word_start_table(Path("shards/tokenizer"))
    masked = sample_masks(segments, ws, goal=num_predict_reuse, alpha=6, beta=1, mode="word", rng=rng)   # bool [N, n]

Spans of n units with p(n) ∝ 1/n (n <= MAX_GRAM), each inside a context of about n*alpha/beta tokens, until ``goal``
targets are chosen; single random positions top up the rest. "word" mode counts units in whole words, "original"
reproduces the original's subword spans. Vectorised over many segments; a segment's mask depends only on its own
uniform draws, so how segments are batched together changes nothing.
"""

from __future__ import annotations

import string
from pathlib import Path

import numpy as np

from xlnetcli.core.errors import DataError
from xlnetcli.data.special import CLS_ID, SEP_ID
from xlnetcli.data.tokenizer import Tokenizer

MAX_GRAM = 5  # spans of 1..5 units, p(n) ∝ 1/n (original _sample_mask); data.max_gram may lower it
_KK = np.arange(1, MAX_GRAM + 1)[None, :]


def ngram_cdf(max_gram: int = MAX_GRAM) -> np.ndarray:
    """Cumulative p(n) ∝ 1/n for n = 1..max_gram (the span-length law of the original _sample_mask)."""
    p = (1.0 / np.arange(1, max_gram + 1)) / (1.0 / np.arange(1, max_gram + 1)).sum()
    cdf = np.cumsum(p)
    return cdf * (1.0 / cdf[-1])


def word_start_table(tokenizer_dir: Path) -> np.ndarray:
    """bool [vocab]: the piece starts a word (docs/xlnet.md §4): where spans may begin and end."""
    if (tokenizer_dir / "xlnet_tokenizer.json").is_file() or (tokenizer_dir / "tokenizer.json").is_file():
        return np.asarray(Tokenizer.load(tokenizer_dir).word_start_mask(), dtype=bool)
    import sentencepiece as spm  # a bare SentencePiece model (no metadata file): the same rule from its pieces

    model = tokenizer_dir / "spiece.model"
    if not model.is_file():
        raise DataError(f"tokenizer model missing: {model}")
    sp = spm.SentencePieceProcessor(model_file=str(model))
    punct = set(string.punctuation)
    out = np.zeros(sp.get_piece_size(), dtype=bool)
    for i in range(sp.get_piece_size()):
        p = sp.id_to_piece(i)
        out[i] = p.startswith("▁") or sp.is_control(i) or sp.is_unknown(i) or sp.is_user_defined(i) or p in punct
    return out


TOPUP_DRAWS = 24  # candidate positions drawn per segment for the top-up (exact fallback when they run short)


def mask_draw_width(goal: int) -> int:
    """Uniforms drawn per segment by ``sample_masks``: goal+5 span lengths, goal+5 left contexts, top-up candidates."""
    return 2 * (goal + 5) + TOPUP_DRAWS


def sample_masks(
    seg: np.ndarray,
    word_start: np.ndarray,
    goal: int,
    alpha: int,
    beta: int,
    mode: str,
    rng: np.random.Generator,
    reverse: bool = False,
    top_up: bool = True,
    max_gram: int = MAX_GRAM,
) -> np.ndarray:
    """bool [N, n]: positions selected for prediction in each of N segments ``seg`` [N, n] of token ids.

    ``word_start``: bool [vocab]. ``mode`` "word": spans of n whole words, never over <sep>/<cls>, count capped at
    ``goal``. "original": the original's spans of n subword pieces starting at a word start (its bug #220), <sep>/<cls>
    may be selected (the loader drops them). ``reverse``: the segments are time-reversed text; spans are sampled
    in reading order (the segments are flipped, masked, and the mask flipped back), as the original.
    ``top_up=False`` returns the spans only (tests). Draws ``mask_draw_width(goal)`` uniforms per segment from ``rng``
    (one call), so a segment's mask depends only on its own draws: batching segments together changes nothing.
    """
    N = seg.shape[0]
    draws = rng.random((N, mask_draw_width(goal)))
    if reverse:
        return masks_from_draws(seg[:, ::-1], word_start, goal, alpha, beta, mode, draws, top_up, max_gram)[:, ::-1]
    return masks_from_draws(seg, word_start, goal, alpha, beta, mode, draws, top_up, max_gram)


def masks_from_draws(
    seg: np.ndarray,
    word_start: np.ndarray,
    goal: int,
    alpha: int,
    beta: int,
    mode: str,
    draws: np.ndarray,
    top_up: bool = True,
    max_gram: int = MAX_GRAM,
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
    K = goal + 5
    M = n + 1  # flat layout: segment r occupies [r*M, r*M + n], position n a sentinel word start
    codes = word_start.astype(np.uint8)  # 1 = word start, 3 = <sep>/<cls> (functional; a word start too)
    codes[[i for i in (SEP_ID, CLS_ID) if i < len(codes)]] = 3
    wsx = np.empty((N, M), np.uint8)
    wsx[:, :n] = codes.take(seg)
    wsx[:, n] = 1
    fpos = np.flatnonzero(wsx == 3)  # flat positions of <sep>/<cls> in the [N, M] layout
    wx = wsx.reshape(-1)
    wx[fpos] = 1
    wx = wx.view(bool)  # 0/1 bytes
    wflat = np.flatnonzero(wx)  # sorted flat positions of word starts
    nxtw = np.cumsum(wx, dtype=np.int32)  # index in wflat of the next word start at or after each flat position
    nxtw -= wx
    wsent = nxtw[np.arange(N) * M + n]  # index in wflat of each segment's sentinel
    cw = wflat  # pieces before each word start (differences within a segment count pieces)
    if mode == "word" and len(fpos):  # count non-functional pieces only: subtract <sep>/<cls> word starts before
        isf = np.zeros(len(wflat) + 1, np.int32)
        isf[nxtw[fpos] + 1] = 1
        cw = wflat - np.cumsum(isf, dtype=np.int32)[:-1]
    # the loop state, in flat [N, M] positions; compacted to the segments still active
    act = np.arange(N) if goal > 0 else np.arange(0)
    cur = act * M
    row_end = cur + n
    sent = wsent[act]
    count = np.zeros(len(act), np.int64)
    u_n = np.ascontiguousarray(draws[:, :K].T)  # [K, N]: draw k of every segment contiguous
    u_l = np.ascontiguousarray(draws[:, K : 2 * K].T)
    ctx_of = np.arange(MAX_GRAM + 1) * alpha // beta
    cdf = ngram_cdf(max_gram)
    begs, ends = [], []
    it = 0
    while len(act):
        col = it % K
        left = goal - count
        ng = np.minimum(np.searchsorted(cdf, u_n[col][act], side="right") + 1, max_gram)
        np.minimum(ng, left, out=ng)
        ctx = ctx_of[ng]
        lctx = np.minimum((u_l[col][act] * ctx).astype(np.int64), ctx - 1)
        j = nxtw[np.minimum(cur + lctx, row_end)]  # next word start at or after cur + l
        if mode == "original":
            beg = wflat[j]
            end = beg + ng
            cnt = ng
            ok = end < row_end
        else:
            # end after k_fit words: the most words (<= n) whose non-functional pieces keep the count <= goal
            cj = cw[j]
            fit = cw[np.minimum(j[:, None] + _KK, sent[:, None])] <= (cj + left)[:, None]
            k_fit = (fit & (_KK <= ng[:, None])).sum(1)
            je = np.minimum(j + k_fit, sent)
            beg = wflat[j]
            end = wflat[je]
            cnt = cw[je] - cj
            ok = (je > j) & (end < row_end)
        count += np.where(ok, cnt, 0) if not ok.all() else cnt
        nxt_cur = end + (ctx - lctx)
        keep = ok & (count < goal) & (nxt_cur < row_end)
        if not ok.all():
            beg, end = beg[ok], end[ok]
        begs.append(beg)
        ends.append(end)
        if keep.all():
            cur = nxt_cur
        else:
            act, cur, row_end, sent, count = act[keep], nxt_cur[keep], row_end[keep], sent[keep], count[keep]
        it += 1
    if begs:
        b = np.concatenate(begs)
        lens = np.concatenate(ends) - b
        if len(b):
            b -= b // M  # [N, M] -> [N, n] positions (spans never reach the sentinel)
            starts = np.repeat(b - np.concatenate([[0], np.cumsum(lens)[:-1]]), lens)
            mask.reshape(-1)[starts + np.arange(int(lens.sum()))] = True
    fseg = fpos - fpos // M  # <sep>/<cls> in [N, n] positions
    if mode == "word":
        mask.reshape(-1)[fseg] = False
    if not top_up:
        return mask
    # top up with single random positions until the goal is reached: candidates drawn uniformly in order, the first
    # eligible distinct ones taken (a uniform subset); segments whose candidates run short use an exact draw
    eligible = ~mask
    if mode == "word":
        eligible.reshape(-1)[fseg] = False
    need = goal - mask.sum(1)
    sel = np.flatnonzero(need > 0)
    if len(sel) == 0:
        return mask
    T = draws.shape[1] - 2 * K
    cand = np.minimum((draws[sel, 2 * K:] * n).astype(np.int64), n - 1)  # [S, T]
    flat = sel[:, None] * n + cand
    ok = eligible.reshape(-1)[flat]
    loc = (np.arange(len(sel)) * n)[:, None] + cand  # first occurrence of each candidate in its row
    first = np.full(len(sel) * n, T, np.int16)
    np.minimum.at(first, loc.reshape(-1), np.broadcast_to(np.arange(T, dtype=np.int16), loc.shape).reshape(-1))
    ok &= first[loc] == np.arange(T)[None, :]
    csum = np.cumsum(ok, axis=1)
    take = ok & (csum <= need[sel, None])
    mask.reshape(-1)[flat[take]] = True
    short = np.flatnonzero(csum[:, -1] < need[sel])
    for r in sel[short]:
        el = np.flatnonzero(eligible[r] & ~mask[r])
        k = int(goal - mask[r].sum())
        seed = [int(x * 2**53) for x in draws[r, :2]]
        pick = np.random.default_rng(seed).permutation(el)[: max(0, k)]
        mask[r, pick] = True
    return mask
