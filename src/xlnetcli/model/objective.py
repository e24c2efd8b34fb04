"""The permutation-LM objective (paper section 2.3) and the Transformer-XL memory (section 2.4) around the model,
used by pretraining and by `xlnet eval`.

    inputs = model_inputs(batch, device)         # a PretrainStream micro-batch on the device (perm_mask built there)
    out = forward(model, inputs, mems)           # loss and new memories; the query stream only (docs/xlnet.md)
    evaluate_plm(model, stream, n_batches)       # held-out loss, perplexity and target accuracy
    mems = Memories(mem_len, [stream.rows(a) for a in range(A)], device)  # per micro-batch; saved by records row, so
                                                 # a run resumed on another layout takes its rows' (load_state_dicts)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np
import torch

from xlnetcli.config import ModelConfig
from xlnetcli.core import dist
from xlnetcli.core.dist import autocast_ctx
from xlnetcli.core.errors import CheckpointError

MODEL_INPUTS = ("input_ids", "token_type_ids", "perm_mask", "target_index", "labels", "label_mask")


def model_inputs(batch: dict, device: torch.device) -> dict:
    """Move a stream micro-batch to ``device``. A compact batch (dense=False) carries the factorisation order as two
    [B, L] rank vectors; the [B, L, L] perm_mask is built on the device (data.perm_mask_from_ranks)."""
    out = {k: batch[k].to(device, non_blocking=True) for k in MODEL_INPUTS if k in batch}
    if "perm_mask" not in out and "perm_q_rank" in batch:
        q = batch["perm_q_rank"].to(device, non_blocking=True)
        k = batch["perm_k_rank"].to(device, non_blocking=True)
        out["perm_mask"] = q[:, :, None] <= k[:, None, :]
    if "target_index" not in out and "target_mapping" in batch:
        out["target_mapping"] = batch["target_mapping"].to(device, non_blocking=True)
    return out


def carried_mems(mem_len: int, out: Any) -> list | None:
    """The memories the next segment attends to. ``mem_len`` 0 means no memory in training and evaluation, as in the
    original's ``_cache_mem`` (the model itself then keeps every past state, as transformers does at inference)."""
    if mem_len == 0 or out.mems is None:
        return None
    return [m.detach() for m in out.mems]


class Memories:
    """Transformer-XL memory of each micro-batch index ``a`` of this rank: the hidden states of the previous segment
    of the same rows, carried from step to step (the segment-level recurrence of the paper's §2.4). ``rows[a]``: the
    stored records rows micro-batch ``a`` reads (PretrainStream.rows). In a checkpoint they are kept by row, on the
    CPU: {"rows": int64 [n], "layers": one [n, m, d] tensor per layer, or None}, so a run resumed with another number
    of processes or micro-batch size picks each of its rows' memory from whichever rank saved it
    (``load_state_dicts``).

    ``static`` = (n_layer, d_model) keeps static shapes (train.static_shapes): the memory is always ``mem_len`` long,
    left-padded with zeros from the first step and its padding columns masked (``mem_pad``), so every step has the
    same shapes and can be captured once (CUDA graphs). A checkpoint holds only the real states, as without it."""

    def __init__(
        self,
        mem_len: int,
        rows: Sequence[np.ndarray | Sequence[int]],
        device: torch.device,
        static: tuple[int, int] | None = None,
    ) -> None:
        self.mem_len, self.device = mem_len, device
        self.rows = [np.asarray(r, dtype=np.int64) for r in rows]
        self.static = static if mem_len > 0 else None
        self.mems: list[list | None] = [None] * len(self.rows)
        self.pads: list[torch.Tensor | None] = [None] * len(self.rows)

    def __getitem__(self, micro: int) -> list | None:
        return self.mems[micro]

    def inputs(self, micro: int, batch_size: int) -> dict:
        """The model's memory arguments for micro-batch ``micro``: {"mems"}, plus {"mem_pad"} with static shapes (an
        all-padding memory of ``mem_len`` on the first step)."""
        if self.static is None:
            return {"mems": self.mems[micro]}
        if self.mems[micro] is None:
            self._set_padded(micro, [], batch_size)
        return {"mems": self.mems[micro], "mem_pad": self.pads[micro]}

    def carry(self, micro: int, out: Any) -> None:
        """Keep what micro-batch ``micro``'s next segment attends to."""
        mems = carried_mems(self.mem_len, out)
        self.mems[micro] = mems
        if self.static is not None and mems is not None:  # contiguous: the strides of every step too
            self.mems[micro] = [x.contiguous() for x in mems]
            pad = getattr(out, "mem_pad", None)
            self.pads[micro] = None if pad is None else pad.contiguous()

    def _set_padded(self, micro: int, real: list, batch_size: int) -> None:
        """Left-pad the real states ``real`` (per layer [B,m,d], m <= mem_len; [] = none) to mem_len with zeros."""
        assert self.static is not None
        n_layer, d = self.static
        m = real[0].shape[1] if real else 0
        zeros = torch.zeros(batch_size, self.mem_len - m, d, device=self.device)
        # one tensor per layer, never aliased: a compiled step's guards (and graph inputs) see the layout of later steps
        padded = [torch.cat([zeros.to(x.dtype), x], 1) for x in real]
        self.mems[micro] = padded or [zeros.clone() for _ in range(n_layer)]
        pad = torch.zeros(batch_size, self.mem_len, dtype=torch.bool, device=self.device)
        pad[:, : self.mem_len - m] = True
        self.pads[micro] = pad

    def _real(self, micro: int) -> list | None:
        """The real (unpadded) states of micro-batch ``micro``: every row has the same padding (all rows start
        together), so the real states are the last columns."""
        m, pad = self.mems[micro], self.pads[micro]
        if m is None or pad is None:
            return m
        n = self.mem_len - int(pad[0].sum())
        return [x[:, x.shape[1] - n :] for x in m] if n else None

    def state_dict(self) -> dict:
        """{"rows", "layers"} of every micro-batch (memory exists for all of them at a step boundary, or for none)."""
        real = [m for a in range(len(self.mems)) if (m := self._real(a)) is not None]
        layers = None
        if len(real) == len(self.mems):
            layers = [torch.cat(per_micro).detach().to("cpu") for per_micro in zip(*real, strict=True)]
        return {"rows": torch.from_numpy(np.concatenate(self.rows)), "layers": layers}

    def load_state_dict(self, state: dict) -> None:
        self.load_state_dicts([state])

    def load_state_dicts(self, states: list[dict]) -> None:
        """Each micro-batch's memory, by row, from the states of every rank of the saving run (any layout)."""
        saved = [_by_row(s) for s in states]
        kept = [m for _, m in saved if m is not None]
        if len(kept) < len(saved):  # no memory yet, or mem_len 0
            self.mems, self.pads = [None] * len(self.rows), [None] * len(self.rows)
            return
        rows = torch.cat([r for r, _ in saved]).tolist()
        layers = [torch.cat(per_rank) for per_rank in zip(*kept, strict=True)]
        at = {g: j for j, g in enumerate(rows)}
        for a, want in enumerate(self.rows):
            missing = [g for g in want.tolist() if g not in at]
            if missing:
                raise CheckpointError(
                    f"the checkpoint holds no memory for records row {missing[0]}; resume from another step folder"
                )
            index = torch.tensor([at[g] for g in want.tolist()])
            real = [x[index].to(self.device) for x in layers]
            self.mems[a], self.pads[a] = real, None
            if self.static is not None:
                self._set_padded(a, real, real[0].shape[0])


def _by_row(state: dict) -> tuple[torch.Tensor, list | None]:
    """(rows, layers) of one rank's saved memories. Train-state format 1 keyed them by global micro-batch index k,
    [mb, m, d] per layer, which read stored rows k*mb .. (k+1)*mb - 1 (that format's stream read them in order)."""
    if "rows" in state:
        return state["rows"], state["layers"]
    items = sorted(state.items())
    if not items or any(m is None for _, m in items):
        return torch.zeros(0, dtype=torch.int64), None
    rows = torch.cat([k * len(m[0]) + torch.arange(len(m[0])) for k, m in items])
    return rows, [torch.cat([m[i] for _, m in items]) for i in range(len(items[0][1]))]


def forward(model: torch.nn.Module, inputs: dict, mems: list | None, mem_pad: torch.Tensor | None = None) -> Any:
    # The PLM loss reads only the query stream: the last layer's content stream is skipped.
    if mem_pad is None:
        return model(**inputs, mems=mems, need_hidden=False)
    return model(**inputs, mems=mems, mem_pad=mem_pad, need_hidden=False)


@torch.no_grad()
def evaluate_plm(
    model: torch.nn.Module,
    stream: Any,
    n_batches: int,
    precision: str = "fp32",
    device: torch.device | str | None = None,
    on_rows: Callable[[int], None] | None = None,
) -> dict:
    """PLM loss, perplexity and target accuracy over the first ``n_batches`` micro-batches of ``stream``.

    Memory is carried across the stream's batches per micro-batch index, as in training. Counts are summed over all
    ranks (each rank reads its own rows). ``on_rows(n)`` after each micro-batch of ``n`` sequences (`xlnet eval`'s
    progress: evaluate/ passes it down, being above this layer). Returns {"loss", "ppl", "acc", "targets", "batches"}.
    """
    net = dist.unwrap(model)
    # config is a plain attribute of the LM model; nn.Module.__getattr__ would type it Tensor | Module
    mem_len = cast(ModelConfig, net.config).mem_len
    was_training = net.training
    net.eval()
    if device is None:
        device = next(net.parameters()).device
    device = torch.device(device)
    mems: dict[int, list | None] = {}
    totals = torch.zeros(4, dtype=torch.float64, device=device)  # loss*targets, correct, targets, batches
    try:
        it = iter(stream)
        for _ in range(n_batches):
            try:
                batch = next(it)
            except StopIteration:
                break
            a = int(batch.get("micro_index", 0))
            inputs = model_inputs(batch, device)
            labels, label_mask = inputs.pop("labels"), inputs.pop("label_mask")
            with autocast_ctx(device, precision):
                out = forward(net, inputs, mems.get(a))
            mems[a] = carried_mems(mem_len, out)
            logits = out.logits.float()
            nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), labels, reduction="none")
            w = label_mask.float()
            totals[0] += (nll * w).sum().double()
            totals[1] += ((logits.argmax(-1) == labels).float() * w).sum().double()
            totals[2] += w.sum().double()
            totals[3] += 1
            if on_rows is not None:
                on_rows(len(labels))
    finally:
        if was_training:
            net.train()
        close = getattr(stream, "close", None)
        if close is not None:
            close()
    dist.all_reduce_sum(totals)
    loss_sum, correct, n, batches = totals.tolist()
    loss = loss_sum / n if n else float("nan")
    return {
        "loss": loss,
        "ppl": math.exp(min(loss, 50.0)) if n else float("nan"),
        "acc": correct / n if n else float("nan"),
        "targets": int(n),
        "batches": int(batches),
    }
