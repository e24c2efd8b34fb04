"""Long documents in transformers: an `xlnet export` of a run finetuned with ``finetune.document=memory`` read by
transformers' XLNetForSequenceClassification window by window with ``mems``, as `xlnet eval` reads it
(model/documents.py). Plain transformers and torch, no xlnetcli import, to copy: everything below this docstring
is the code block of docs/long-documents.md ("Hugging Face handoff"), byte for byte (tests/interop/
test_hf_documents.py checks that, and that its logits are ours)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer, XLNetForSequenceClassification


def load_document_classifier(export_dir: str | Path) -> tuple[XLNetForSequenceClassification, Any, dict[str, int]]:
    """(model, tokenizer, reading) of an `xlnet export` of a run finetuned with finetune.document=memory (or first).
    ``reading``: the run's window (finetune.max_seq_length), max_windows and mem_len, from xlnet_finetune.json.
    The model keeps the last mem_len states of each layer as its memory, the whole window joining it (reuse_len
    None): what xlnet's reading of a document keeps."""
    ft = json.loads((Path(export_dir) / "xlnet_finetune.json").read_text(encoding="utf-8"))["finetune"]
    if ft["document"] not in ("memory", "first"):
        raise ValueError(f"finetune.document={ft['document']}: this reads documents through the memory")
    window = ft["max_seq_length"]
    reading = {
        "window": window,
        "max_windows": ft["max_windows"] if ft["document"] == "memory" else 1,
        "mem_len": ft["mem_len"] or window,  # null: one window
    }
    model = XLNetForSequenceClassification.from_pretrained(export_dir, mem_len=reading["mem_len"], reuse_len=None)
    return model.eval(), AutoTokenizer.from_pretrained(export_dir), reading


@torch.no_grad()
def hf_predict_document(
    model: XLNetForSequenceClassification,
    tokenizer: Any,
    text_a: str | list[int],
    text_b: str | list[int] | None = None,
    *,
    window: int,
    max_windows: int,
    mem_len: int,
) -> torch.Tensor:
    """The logits [num_labels] of one document: text_a (and text_b), strings or token ids without special tokens.
    The sequence [A <sep> B <sep> <cls>] (segments A=0, B=1, <cls>=2; [A <sep> <cls>] without B) is cut to
    window * max_windows tokens keeping its start (the longer of A and B loses its end, B on ties), split into
    windows counted from its end (the first one shorter, no padding) and read in order, each window attending to
    the memory of the earlier ones; the last window's <cls> makes the prediction."""
    xl = model.transformer
    if xl.mem_len != mem_len or xl.reuse_len:
        raise ValueError(f"load the model with mem_len={mem_len}, reuse_len=None (load_document_classifier)")

    def ids(text: str | list[int]) -> list[int]:
        return list(text) if not isinstance(text, str) else tokenizer(text, add_special_tokens=False)["input_ids"]

    sep, cls, room = tokenizer.sep_token_id, tokenizer.cls_token_id, window * max_windows
    a = ids(text_a)
    if text_b is None:
        a = a[: room - 2]
        seq, seg = [*a, sep, cls], [0] * (len(a) + 1) + [2]
    else:
        b = ids(text_b)
        while len(a) + len(b) > room - 3:  # the longer loses its last token, B on ties
            (a if len(a) > len(b) else b).pop()
        seq, seg = [*a, sep, *b, sep, cls], [0] * (len(a) + 1) + [1] * (len(b) + 1) + [2]
    mems = None
    for end in range(len(seq) % window or window, len(seq) + 1, window):  # windows counted from the end
        lo = max(0, end - window)
        out = model(
            input_ids=torch.tensor([seq[lo:end]], device=model.device),
            token_type_ids=torch.tensor([seg[lo:end]], device=model.device),
            mems=mems,
            use_mems=True,
        )
        mems = out.mems
    return out.logits[0]
