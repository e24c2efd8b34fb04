"""Reading a text longer than one window (finetune.document; docs/long-documents.md).

A document arrives as one left-padded row whose windows of ``window`` tokens are counted from its end
(data/labelled/encode.py ``Reading``): the last window ends with <cls>, only the first holds padding.

- ``memory``: the windows in order, each attending to the memory of the earlier ones: Transformer-XL's segment
  recurrence (Dai §3.2), the paper's §2.4, used in pretraining and here carried into finetuning as ERNIE-Doc does
  (Ding et al. 2021). The gradient flows through the last ``grad_windows`` windows and the memory between them; the
  earlier windows run without it (truncated backpropagation through time).
- ``window-mean``: every window on its own (each has its own <sep> <cls>), its outputs averaged over the windows.

Documents of different lengths share a batch: all end in the batch's last window, and a document's windows before
its start are all padding, masked in attention and in memory, so a batch computes what each document alone does.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from xlnetcli.model.xlnet import XLNetModel


@dataclass
class DocumentStates:
    """What a reading of documents leaves for a head or a feature: the last window and sums over every real token."""

    hidden: torch.Tensor  # [B,W,d] the last window's content stream (its last position: the document's <cls>)
    mask: torch.Tensor  # [B,W] the last window's real tokens
    # [B,d] (or [B,layers,d] with per_layer) sum of the states of every real token; None when not asked (pool)
    sums: torch.Tensor | None
    count: torch.Tensor  # [B] real tokens of each document
    cls: torch.Tensor | None = None  # [B,layers,d] per layer (per_layer): the <cls> state of each layer

    def mean(self) -> torch.Tensor:
        """[B,d] (or [B,layers,d]): the mean state over the document's real tokens."""
        assert self.sums is not None, "read_with_memory(pool=False) keeps no sums"
        return self.sums / _per_row(self.count.clamp_min(1.0).to(self.sums.dtype), self.sums)


def _per_row(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """[B] -> [B,1,...] broadcast against ``like`` [B,...]."""
    return x.view(-1, *([1] * (like.dim() - 1)))


def pad_to_windows(x: torch.Tensor, window: int, value: float) -> torch.Tensor:
    """Left-pad the last axis of ``x`` to a multiple of ``window`` (a batch cut to its longest row keeps its windows
    aligned on the end)."""
    extra = -x.shape[-1] % window
    return F.pad(x, (extra, 0), value=value) if extra else x


def document_windows(
    ids: torch.Tensor, seg: torch.Tensor, mask: torch.Tensor, window: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[B,T] rows -> [B,n,window] windows, padded on the left to a whole number of windows ([B,1,T] when T <= window:
    a batch of short rows keeps its own width)."""
    if ids.shape[-1] <= window:
        return ids[:, None], seg[:, None], mask[:, None]
    # the padding columns added are masked (attention and memory): the ids and segments they hold never count
    ids, seg, mask = (pad_to_windows(x, window, 0) for x in (ids, seg, mask))
    B = ids.shape[0]
    return ids.view(B, -1, window), seg.view(B, -1, window), mask.view(B, -1, window)


@contextmanager
def _layer_outputs(transformer: XLNetModel, L: int, into: list[torch.Tensor]) -> Iterator[None]:
    """Collect the content-stream states after the embedding and after every layer ([B,L,d] each) into ``into``."""

    def keep(_module, _args, out):
        into.append(out[:, :L])

    hooks = [transformer.word_embedding.register_forward_hook(keep)]
    hooks += [layer.register_forward_hook(keep) for layer in transformer.layer]
    try:
        yield
    finally:
        for h in hooks:
            h.remove()


def read_with_memory(
    transformer: XLNetModel,
    ids: torch.Tensor,
    seg: torch.Tensor,
    mask: torch.Tensor,
    window: int,
    mem_len: int,
    grad_windows: int = 1,
    per_layer: bool = False,
    pool: bool = True,
) -> DocumentStates:
    """Read [B,T] documents window by window with the memory carried (``mem_len`` states of the earlier windows, per
    layer); the gradient flows through the last ``grad_windows`` windows (all of them when a document has fewer) and
    the memory between them, none before. ``per_layer``: the sums and <cls> of the embedding and of every layer
    (no gradient: features). ``pool=False``: no sums (a head that reads only the last <cls>). The model's bi_data is
    off, as in all finetuning."""
    ids_w, seg_w, mask_w = document_windows(ids, seg, mask, window)
    n = ids_w.shape[1]
    mems: list[torch.Tensor] | None = None
    mem_pad: torch.Tensor | None = None
    sums: torch.Tensor | None = None
    count = mask_w.sum((1, 2))
    hidden = torch.empty(0)
    cls: torch.Tensor | None = None
    grad_from = n - grad_windows if torch.is_grad_enabled() else n
    layers: list[torch.Tensor] = []
    with _layer_outputs(transformer, window, layers) if per_layer else nullcontext():
        for w in range(n):
            m = mask_w[:, w]
            layers.clear()
            with torch.set_grad_enabled(w >= grad_from):
                out = transformer(
                    ids_w[:, w],
                    token_type_ids=seg_w[:, w],
                    attention_mask=m,
                    mems=mems,
                    mem_pad=mem_pad,
                    bi_data=False,
                    mem_len=mem_len,
                    detach_mems=False,
                )
            assert out.hidden is not None and out.mems is not None  # content output and memory were asked for
            hidden, mems, mem_pad = out.hidden, out.mems, out.mem_pad
            if not (pool or per_layer):
                continue
            states = torch.stack(layers, 1) if per_layer else hidden  # [B,layers,W,d] or [B,W,d]
            weights = m.to(states.dtype)
            weights = weights[:, None, :, None] if per_layer else weights[:, :, None]
            sums = (states * weights).sum(-2) if sums is None else sums + (states * weights).sum(-2)
            if per_layer:
                cls = states[:, :, -1]
    return DocumentStates(hidden, mask_w[:, -1], sums, count, cls)


def read_windows_apart(
    transformer: XLNetModel,
    ids: torch.Tensor,
    seg: torch.Tensor,
    mask: torch.Tensor,
    window: int,
    per_layer: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every window of [B,T] documents read on its own, the all-padding ones left out. -> (hidden [R,window,d] of the
    R real windows ([R,layers,window,d] with ``per_layer``: the embedding and every layer), their mask [R,window],
    ``owner`` [R]: the document of each)."""
    ids_w, seg_w, mask_w = document_windows(ids, seg, mask, window)
    n = ids_w.shape[1]
    real = (mask_w != 0).any(-1).flatten().nonzero().squeeze(1)  # the real windows, row-major (one device sync)
    m = mask_w.flatten(0, 1).index_select(0, real)
    layers: list[torch.Tensor] = []
    with _layer_outputs(transformer, window, layers) if per_layer else nullcontext():
        out = transformer(
            ids_w.flatten(0, 1).index_select(0, real),
            token_type_ids=seg_w.flatten(0, 1).index_select(0, real),
            attention_mask=m,
            mems=None,
            return_mems=False,
            bi_data=False,
        )
    assert out.hidden is not None
    return (torch.stack(layers, 1) if per_layer else out.hidden), m, real // n


def document_features(
    transformer: XLNetModel,
    ids: torch.Tensor,
    seg: torch.Tensor,
    mask: torch.Tensor,
    document: str,
    window: int,
    mem_len: int,
    per_layer: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, cls) features of [B,T] rows read as ``document`` says: [B,d] from the last layer, or [B,layers,d] with
    ``per_layer`` (the embedding, then every layer). ``memory`` (and ``first``, whose rows are one window): the mean
    over every real token, the final <cls>; ``window-mean``: the mean over every real token of the windows read
    apart, and their <cls> states averaged."""
    if document == "window-mean" and ids.shape[-1] > window:
        B = ids.shape[0]
        hidden, m, owner = read_windows_apart(transformer, ids, seg, mask, window, per_layer)
        weights = m.to(hidden.dtype)
        weights = weights[:, None, :, None] if per_layer else weights[:, :, None]
        sums = sum_by_document((hidden * weights).sum(-2), owner, B)
        count = sum_by_document(m.sum(-1).to(hidden.dtype), owner, B).clamp_min(1.0)
        return sums / _per_row(count, sums), mean_over_windows(hidden[..., -1, :], owner, B)
    states = read_with_memory(transformer, ids, seg, mask, window, mem_len, per_layer=per_layer)
    return states.mean(), states.cls if states.cls is not None else states.hidden[:, -1]


def sum_by_document(values: torch.Tensor, owner: torch.Tensor, B: int) -> torch.Tensor:
    """values [R,...] of the real windows, ``owner`` [R] the document of each -> [B,...] their sum per document."""
    return values.new_zeros((B, *values.shape[1:])).index_add_(0, owner, values)


def mean_over_windows(values: torch.Tensor, owner: torch.Tensor, B: int) -> torch.Tensor:
    """values [R,...] of the real windows, ``owner`` [R] the document of each -> [B,...] their mean per document."""
    count = sum_by_document(torch.ones_like(owner, dtype=values.dtype), owner, B).clamp_min(1.0)
    return sum_by_document(values, owner, B) / _per_row(count, values.new_empty((B, *values.shape[1:])))
