"""A loaded XLNet LM, published as the Python API `xlnetcli.api`: load a checkpoint (ours or an HF directory) and
run XLNet with HF-style arguments.

    from xlnetcli import api
    xl = api.load("runs/tiny")                       # run dir, step folder, or HF dir (e.g. a copy of xlnet-base-cased)
    out = xl(input_ids, token_type_ids=seg, attention_mask=am, perm_mask=pm, target_mapping=tm)
    out.logits, out.hidden, out.query, out.mems      # batch-first; mems: per layer [B, M, d]
    out2 = xl(next_ids, mems=out.mems)               # Transformer-XL memory across segments
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from xlnetcli.checkpoint.folders import tokenizer_dir_of
from xlnetcli.checkpoint.load import load_lm_model, resolve_checkpoint
from xlnetcli.config import Config
from xlnetcli.core.errors import CheckpointError
from xlnetcli.data.tokenizer import Tokenizer
from xlnetcli.model import LMOutput, XLNetLMHeadModel


def _tensor(x, dtype, device):
    if x is None:
        return None
    return torch.as_tensor(x, dtype=dtype, device=device)


class XLNet:
    """A loaded XLNet LM (eval mode, no grad by default). ``.model`` is the nn.Module, ``.config`` the Config."""

    def __init__(self, model: XLNetLMHeadModel, config: Config, meta: dict[str, Any], path: Path) -> None:
        self.model, self.config, self.meta, self.path = model, config, meta, path

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def tokenizer(self) -> Tokenizer | None:
        """The checkpoint's tokenizer (xlnetcli.data.tokenizer.Tokenizer), or None if the checkpoint has none."""
        try:
            return Tokenizer.load(tokenizer_dir_of(self.path))
        except CheckpointError:
            return None

    def __call__(
        self,
        input_ids,
        token_type_ids=None,
        attention_mask=None,
        perm_mask=None,
        target_mapping=None,
        target_index=None,
        mems=None,
        return_mems: bool = True,
        grad: bool = False,
    ) -> LMOutput:
        dev = self.device
        fdt = next(self.model.parameters()).dtype
        ids = _tensor(input_ids, torch.long, dev)
        if ids.dim() == 1:
            ids = ids[None]
        args = dict(
            token_type_ids=_tensor(token_type_ids, torch.long, dev),
            attention_mask=_tensor(attention_mask, fdt, dev),
            perm_mask=_tensor(perm_mask, fdt, dev),
            target_mapping=_tensor(target_mapping, fdt, dev),
            target_index=_tensor(target_index, torch.long, dev),
            mems=mems,
            return_mems=return_mems,
        )
        with torch.set_grad_enabled(grad):
            return self.model(ids, **args)


def load(path: str | Path, device: str | torch.device = "cpu", **model_overrides) -> XLNet:
    """Load a run directory (latest step), a step folder or an HF XLNet directory.

    ``model_overrides``: non-architecture model keys, e.g. ``mem_len=128, attn_impl="einsum"``. ``bi_data`` is off
    unless asked for: it is a pretraining batch layout (half forward, half backward), not something inference wants."""
    model_overrides.setdefault("bi_data", False)
    p = resolve_checkpoint(path)
    model, cfg, meta = load_lm_model(p, device=device, overrides=model_overrides or None)
    return XLNet(model, cfg, meta, p)
