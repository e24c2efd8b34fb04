"""Finetuning heads on top of XLNetModel (docs/xlnet.md §9) and the model that combines them.

- classification / regression: SequenceSummary (``last`` = the <cls> position, dense+tanh projection, dropout) then a
  linear layer to the labels (1 output for regression, MSE loss);
- multiple choice: the same summary scored to 1 logit per option, softmax (cross entropy) over the options;
- SQuAD: start logits dense(1); end logits from [h ; h_start] -> dense(tanh) -> LayerNorm -> dense(1) (teacher-forced
  start in training, top-k starts at inference); answerability from [softmax(start)·H ; h_cls] -> dense(tanh) ->
  dense(1, no bias); loss = 0.5 * (start + end) + 0.5 * cls.

State-dict names: ``transformer.*`` (exactly the pretrained XLNetModel's) and ``head.*``. Each head is a transformers
class's head parameter for parameter (checkpoint/hf_dir.py maps the names): ClassificationHead with summary last/first =
XLNetForSequenceClassification / XLNetForMultipleChoice, SquadHead = XLNetForQuestionAnswering (the same inference
beam; transformers' training loss feeds the gold start, not softmax(start), to the answerability head).
`carry_head` keeps a finetuned --init checkpoint's head when it fits the new run.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from xlnetcli.config import FinetuneConfig, ModelConfig
from xlnetcli.core.errors import XLNetError
from xlnetcli.model.documents import mean_over_windows, read_windows_apart, read_with_memory
from xlnetcli.model.xlnet import XLNetModel

NEG = -1e30
# data/labelled's class label of a row it cannot label (a label the run does not know, a choice row without one)
UNLABELLED = -1
SQUAD_TOP_K = 5  # start and end candidates kept at inference (the original's start_n_top = end_n_top = 5)


class SequenceSummary(nn.Module):
    """Pool [B,L,d] to [B,d]: last (the <cls> at the end), first, mean (over real tokens), attn (a learned query
    attending over real tokens); optional dense + tanh projection; then dropout."""

    def __init__(self, d_model: int, summary_type: str = "last", use_proj: bool = True, dropout: float = 0.1):
        super().__init__()
        if summary_type not in ("last", "first", "mean", "attn"):
            raise XLNetError(f"unknown summary_type {summary_type!r} (last, first, mean, attn)")
        self.summary_type = summary_type
        self.proj = nn.Linear(d_model, d_model) if use_proj else None
        self.query = nn.Parameter(torch.zeros(d_model)) if summary_type == "attn" else None
        self.dropout = nn.Dropout(dropout)

    def forward(
        self, hidden: torch.Tensor, attention_mask: torch.Tensor | None = None, pooled: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``pooled`` [B,d]: the summary already made (a document's mean over all its windows, model/documents.py)."""
        t = self.summary_type
        if pooled is not None:
            s = pooled
        elif t == "last":
            s = hidden[:, -1]
        elif t == "first":
            s = hidden[:, 0]
        else:
            m = torch.ones(hidden.shape[:2], device=hidden.device) if attention_mask is None else attention_mask
            m = m.to(hidden.dtype)
            if t == "mean":
                s = (hidden * m[..., None]).sum(1) / m.sum(1, keepdim=True).clamp_min(1.0)
            else:
                assert self.query is not None  # created for summary_type attn
                score = (hidden @ self.query) / math.sqrt(hidden.shape[-1])
                score = score.masked_fill(m == 0, NEG)
                s = (torch.softmax(score, dim=-1)[..., None] * hidden).sum(1)
        if self.proj is not None:
            s = torch.tanh(self.proj(s))
        return self.dropout(s)


class ClassificationHead(nn.Module):
    def __init__(self, d_model: int, n_out: int, summary_type: str, use_proj: bool, dropout: float) -> None:
        super().__init__()
        self.summary = SequenceSummary(d_model, summary_type=summary_type, use_proj=use_proj, dropout=dropout)
        self.out = nn.Linear(d_model, n_out)
        nn.init.normal_(self.out.weight, std=0.02)
        nn.init.zeros_(self.out.bias)

    def forward(
        self, hidden: torch.Tensor, attention_mask: torch.Tensor | None = None, pooled: torch.Tensor | None = None
    ) -> torch.Tensor:
        return self.out(self.summary(hidden, attention_mask, pooled))


class SquadHead(nn.Module):
    def __init__(self, d_model: int, dropout: float, layer_norm_eps: float = 1e-12, top_k: int = SQUAD_TOP_K) -> None:
        super().__init__()
        self.top_k = top_k
        self.start = nn.Linear(d_model, 1)
        self.end_dense = nn.Linear(2 * d_model, d_model)
        self.end_ln = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.end_out = nn.Linear(d_model, 1)
        self.cls_dense = nn.Linear(2 * d_model, d_model)
        self.cls_out = nn.Linear(d_model, 1, bias=False)
        self.dropout = nn.Dropout(dropout)
        for lin in (self.start, self.end_dense, self.end_out, self.cls_dense, self.cls_out):
            nn.init.normal_(lin.weight, std=0.02)
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)

    def end_logits(self, hidden: torch.Tensor, h_start: torch.Tensor) -> torch.Tensor:
        """hidden [B, L, d], h_start [B, d] or [B, k, d] -> [B, L] or [B, k, L]."""
        if h_start.dim() == 3:
            k = h_start.shape[1]
            h = hidden.unsqueeze(1).expand(-1, k, -1, -1)
            hs = h_start.unsqueeze(2).expand(-1, -1, hidden.shape[1], -1)
        else:
            h, hs = hidden, h_start.unsqueeze(1).expand_as(hidden)
        x = torch.tanh(self.end_dense(torch.cat([h, hs], dim=-1)))
        return self.end_out(self.end_ln(x)).squeeze(-1)

    def forward(
        self,
        hidden: torch.Tensor,
        p_mask: torch.Tensor,
        cls_index: torch.Tensor,
        start_positions: torch.Tensor | None = None,
        end_positions: torch.Tensor | None = None,
        is_impossible: torch.Tensor | None = None,
    ) -> dict[str, torch.Tensor]:
        hidden = hidden.float()
        p_mask = p_mask.float()
        start = self.start(hidden).squeeze(-1)
        start = start * (1 - p_mask) + NEG * p_mask
        b = torch.arange(hidden.shape[0], device=hidden.device)
        h_cls = hidden[b, cls_index]
        start_p = torch.softmax(start, dim=-1)
        start_feature = torch.einsum("bl,bld->bd", start_p, hidden)
        cls_logits = self.cls_out(self.dropout(torch.tanh(self.cls_dense(torch.cat([start_feature, h_cls], -1)))))
        cls_logits = cls_logits.squeeze(-1)
        out: dict[str, torch.Tensor] = {"cls_logits": cls_logits}
        if start_positions is not None:
            assert end_positions is not None  # the training batch gives both
            end = self.end_logits(hidden, hidden[b, start_positions])
            end = end * (1 - p_mask) + NEG * p_mask
            start_loss = F.cross_entropy(start, start_positions)
            end_loss = F.cross_entropy(end, end_positions)
            loss = 0.5 * (start_loss + end_loss)
            if is_impossible is not None:
                loss = loss + 0.5 * F.binary_cross_entropy_with_logits(cls_logits, is_impossible.float())
            out["loss"] = loss
        else:
            k = min(self.top_k, hidden.shape[1])
            start_logp = torch.log_softmax(start, dim=-1)
            top_lp, top_idx = start_logp.topk(k, dim=-1)  # [B, k]
            h_start = torch.gather(hidden, 1, top_idx.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
            end = self.end_logits(hidden, h_start)  # [B, k, L]
            end = end * (1 - p_mask.unsqueeze(1)) + NEG * p_mask.unsqueeze(1)
            end_lp, end_idx = torch.log_softmax(end, dim=-1).topk(k, dim=-1)  # [B, k, k]
            out.update(
                start_top_log_probs=top_lp, start_top_index=top_idx, end_top_log_probs=end_lp, end_top_index=end_idx
            )
        return out


class FinetuneModel(nn.Module):
    """XLNetModel + a task head. ``forward(batch)`` returns a dict with ``loss`` when the batch has labels: the mean
    over its labelled rows (a class label UNLABELLED = -1 is an unlabelled row; with none labelled the loss is NaN).
    Nothing is read back from the device to decide it (a per-step sync on a GPU)."""

    def __init__(self, model_cfg: ModelConfig, ft: FinetuneConfig, task: str, n_labels: int = 1) -> None:
        super().__init__()
        self.task = task
        # a row longer than one window is a document, read as finetune.document says (model/documents.py)
        self.window, self.document = ft.max_seq_length, ft.document
        self.mem_len, self.grad_windows = ft.memory_length, ft.grad_windows
        self.summary_type = ft.summary_type
        self.transformer = XLNetModel(model_cfg)
        d = model_cfg.d_model
        if task == "squad":
            self.head: nn.Module = SquadHead(d, ft.dropout, model_cfg.layer_norm_eps)
        else:
            n_out = n_labels if task == "classification" else 1
            self.head = ClassificationHead(d, n_out, ft.summary_type, ft.summary_use_proj, ft.dropout)

    def encode(
        self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> torch.Tensor:
        out = self.transformer(
            input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask, mems=None, return_mems=False
        )
        return out.hidden

    def scores(self, ids: torch.Tensor, seg: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """[B,T] rows -> the head's outputs [B,n_out] (classification, regression, multiple choice's options). A row
        wider than one window is a document (finetune.document): read with memory, or window by window with the
        outputs averaged; ``first`` rows are one window."""
        if self.document == "memory" and ids.shape[-1] > self.window:
            mean = self.summary_type == "mean"
            states = read_with_memory(
                self.transformer, ids, seg, mask, self.window, self.mem_len, self.grad_windows, pool=mean
            )
            pooled = states.mean() if mean else None
            return self.head(states.hidden, states.mask, pooled).float()
        if self.document == "window-mean" and ids.shape[-1] > self.window:
            hidden, m, owner = read_windows_apart(self.transformer, ids, seg, mask, self.window)
            return mean_over_windows(self.head(hidden, m).float(), owner, ids.shape[0])
        return self.head(self.encode(ids, seg, mask), mask).float()

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        ids, seg, mask = batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]
        labels = batch.get("labels")
        if self.task == "multiple-choice":
            bsz, k, length = ids.shape
            logits = self.scores(ids.reshape(-1, length), seg.reshape(-1, length), mask.reshape(-1, length))
            logits = logits.reshape(bsz, k).masked_fill(batch["option_mask"] == 0, NEG)
            out: dict[str, Any] = {"logits": logits}
            if labels is not None:
                out["loss"] = F.cross_entropy(logits, labels, ignore_index=UNLABELLED)
            return out
        if self.task == "squad":
            hidden = self.encode(ids, seg, mask)
            training = "start_positions" in batch
            return self.head(
                hidden,
                batch["p_mask"],
                batch["cls_index"],
                batch.get("start_positions") if training else None,
                batch.get("end_positions") if training else None,
                batch.get("is_impossible") if training else None,
            )
        logits = self.scores(ids, seg, mask)
        out = {"logits": logits}
        if labels is not None:
            if self.task == "regression":
                out["loss"] = F.mse_loss(logits.squeeze(-1), labels.float())
            else:
                out["loss"] = F.cross_entropy(logits, labels, ignore_index=UNLABELLED)
        return out


def carry_head(
    model: FinetuneModel,
    state: dict[str, torch.Tensor],
    init_ft: FinetuneConfig,
    init_meta: dict,
    task: str,
    labels: list[str] | None,
    ft: FinetuneConfig,
    where: Any,
) -> str | None:
    """Load the task head of a finetuned ``--init`` checkpoint (ours or an HF export) into ``model.head`` when it
    fits this run: same task, same labels (rows reordered when only the order differs), same head settings.
    Returns a line for the log (None when ``--init`` has no head: a pretrained model)."""
    head = {k[len("head.") :]: v for k, v in state.items() if k.startswith("head.")}
    if init_meta.get("dropped_head"):  # an HF directory whose head has no xlnet equivalent
        return f"new {task} head (random init): the head of {where} does not carry over ({init_meta['dropped_head']})"
    if init_meta.get("kind") != "finetune" or not head:
        return None
    init_task, init_labels = init_meta.get("task"), init_meta.get("labels")
    why = None
    if init_task != task:
        why = f"it was trained for {init_task}, this run is {task}"
    elif task == "classification" and init_labels != labels:
        if init_labels and labels and sorted(init_labels) == sorted(labels) and len(set(labels)) == len(labels):
            order = torch.tensor([init_labels.index(lab) for lab in labels])  # the same classes in our order
            head["out.weight"], head["out.bias"] = head["out.weight"][order], head["out.bias"][order]
        else:
            why = (
                f"its labels ({', '.join(map(str, init_labels or []))}) differ from the training file's "
                f"({', '.join(labels or [])})"
            )
    if why is None and task != "squad":
        for key in ("summary_type", "summary_use_proj"):
            if getattr(init_ft, key) != getattr(ft, key):
                why = (
                    f"it uses finetune.{key}={getattr(init_ft, key)!r}, this run {getattr(ft, key)!r} "
                    f"(--set finetune.{key}={getattr(init_ft, key)} keeps it)"
                )
                break
    own = model.head.state_dict()
    if why is None and (own.keys() != head.keys() or any(own[k].shape != v.shape for k, v in head.items())):
        why = "its parameters do not match this run's head"
    if why is not None:
        return f"new {task} head (random init): the head of {where} does not fit: {why}"
    model.head.load_state_dict(head, strict=True)
    return f"{task} head kept from {where}" + (f" (labels {', '.join(labels)})" if labels else "")
