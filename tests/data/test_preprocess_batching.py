"""The vectorised span sampler: a segment's mask depends only on its own draws (batching/workers change nothing),
and the top-up stays a uniform choice."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from xlnetcli.data.records.masking import Spans, mask_draw_width, masks_from_draws, sample_masks
from xlnetcli.data.special import CLS_ID, SEP_ID


@settings(max_examples=30, deadline=None)
@given(
    st.integers(0, 2**31), st.integers(8, 90), st.integers(1, 20), st.sampled_from(["word", "original"]), st.booleans()
)
def test_masks_do_not_depend_on_batching(seed, n, goal, mode, top_up):
    rng = np.random.default_rng(seed)
    ws = rng.random(60) < 0.5
    seg = rng.integers(9, 60, (37, n))
    seg[rng.random(seg.shape) < 0.03] = SEP_ID
    seg[:, -1] = CLS_ID
    goal = min(goal, n - 6)
    if goal < 1:
        return
    draws = rng.random((len(seg), mask_draw_width(goal)))
    whole = masks_from_draws(seg, ws, goal, Spans(6, 1, mode), draws, top_up)
    cut = int(rng.integers(1, len(seg)))
    parts = [
        masks_from_draws(seg[a:b], ws, goal, Spans(6, 1, mode), draws[a:b], top_up) for a, b in ((0, cut), (cut, 37))
    ]
    assert (np.concatenate(parts) == whole).all()
    one = masks_from_draws(seg[cut : cut + 1], ws, goal, Spans(6, 1, mode), draws[cut : cut + 1], top_up)
    assert (one[0] == whole[cut]).all()


def test_top_up_is_uniform():
    # no word starts: spans never start, every target comes from the top-up; each eligible position equally likely
    seg = np.full((20000, 10), 20)
    seg[:, 3] = SEP_ID
    m = sample_masks(seg, np.zeros(30, bool), 2, Spans(6, 1, "word"), np.random.default_rng(0))
    assert (m.sum(1) == 2).all() and not m[:, 3].any()
    freq = np.delete(m.mean(0), 3)
    assert np.abs(freq - 2 / 9).max() < 0.015
