"""Hugging Face XLNet directories: reading one (config.json + weights [+ spiece.model]) into our config, state dict
and meta, and the mapping of our finetuning heads to transformers' XLNetFor* classes (docs/xlnet.md §7). The pure
state-dict and config mappings are model/state_dict_adapter.py; writing exports and importing into our checkpoint
folders is interop/huggingface.py.

An export's config.json carries what released XLNet configs carry for inference: no memory length, no reuse length,
no bi_data (in transformers those are properties of a pretraining batch, and with bi_data on a model splits every
batch into forward and backward halves, which is wrong for inference). The values the model was pretrained with sit
beside it in ``xlnet_pretraining.json`` (PRETRAINING_FILE), which transformers ignores and `xlnet import` restores.

A finetuned checkpoint exports as the transformers class of its task with its head (HEAD_CLASS, `model_for_hf`):
classification and regression -> XLNetForSequenceClassification (id2label from our label list, problem_type),
multiple choice -> XLNetForMultipleChoice, SQuAD -> XLNetForQuestionAnswering; the parameter names are in
``_SUMMARY_KEYS`` / ``_SQUAD_KEYS``, the run's task, labels and finetune settings in ``xlnet_finetune.json``
(FINETUNE_FILE). `load_hf_dir` reads such a head back (`read_hf_head`), from our exports or from transformers.
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from xlnetcli.config import (
    CONFIG_VERSION,
    Config,
    FinetuneConfig,
    ModelConfig,
    config_from_dict,
    config_to_dict,
    upgrade_config,
)
from xlnetcli.config.sizes import check_weights_size
from xlnetcli.core.errors import CheckpointError, ConfigError
from xlnetcli.core.shapes import fix_hint, json_field, read_json_object
from xlnetcli.model.heads import SQUAD_TOP_K
from xlnetcli.model.state_dict_adapter import from_hf_config, from_hf_state, to_hf_config, to_hf_state

# ---- configs ------------------------------------------------------------------------------------------------


PRETRAINING_FILE = "xlnet_pretraining.json"
# model keys that describe how a model was pretrained (batch layout, memory, objective), not what it computes on one
# input
PRETRAINING_KEYS = ("mem_len", "reuse_len", "bi_data", "dropatt", "clamp_len", "same_length", "objective")


# xlnet_pretraining.json's "model" keys: kind and range (lo, hi; None = unbounded), as ModelConfig takes them
_PRETRAINING_FIELDS: dict[str, tuple[type, float | None, float | None]] = {
    "mem_len": (int, 0, 2**31 - 1),
    "reuse_len": (int, 0, 2**31 - 1),
    "bi_data": (bool, None, None),
    "dropatt": (float, 0, 1),
    "clamp_len": (int, -1, 2**31 - 1),
    "same_length": (bool, None, None),
    "objective": (str, None, None),
}


def _with_pretraining_values(mcfg: ModelConfig, path: Path) -> ModelConfig:
    """The pretraining layout written by our export (memory, reuse, bi_data, dropatt, objective), when the folder has
    it; every field checked for kind and range first, a bad one named with the file."""
    if not path.is_file():
        return mcfg
    fix = "remove it to import with inference settings"
    with fix_hint(fix):
        saved = json_field(
            read_json_object(path, CheckpointError, "written by xlnet export"), "model", dict, path, CheckpointError
        )
        values = {}
        for key, (kind, lo, hi) in _PRETRAINING_FIELDS.items():
            if key in saved:
                values[key] = json_field(saved, key, kind, f"{path} model", CheckpointError, lo=lo, hi=hi)
        if values.get("dropatt", 0) == 1:
            raise CheckpointError(f"{path} model: field 'dropatt' is 1, out of range (must be < 1)")
        try:
            return dataclasses.replace(mcfg, **values)
        except ConfigError as e:
            raise CheckpointError(f"{path}: {e}") from None


# transformers' XLNetConfig fields we read: kind and lower bound (numbers above any real model are caught by
# check_weights_size against the weights)
_HF_INTS = {"vocab_size": 9, "d_model": 2, "n_layer": 1, "n_head": 1, "d_inner": 1}
_HF_OPTIONAL: dict[str, tuple[type, float | None]] = {
    "d_head": (int, 1),
    "mem_len": (int, 0),
    "reuse_len": (int, 0),
    "clamp_len": (int, -1),
    "dropout": (float, 0),
    "layer_norm_eps": (float, 0),
    "initializer_range": (float, 0),
    "ff_activation": (str, None),
    "bi_data": (bool, None),
    "same_length": (bool, None),
}


_HF_TOKENIZER = {"uncased": "do_lower_case", "keep_accents": "keep_accents"}  # ours -> tokenizer_config.json


def check_hf_config(hc: dict[str, Any], where: Path) -> None:
    """The fields of an HF config.json we read, each of the right kind and range, else one line naming the file and
    the field (a string d_model, an n_head of 0, a float n_layer)."""
    for key, lo in _HF_INTS.items():
        json_field(hc, key, int, where, CheckpointError, lo=lo)
    for key, (kind, low) in _HF_OPTIONAL.items():
        if hc.get(key) is not None:
            json_field(hc, key, kind, where, CheckpointError, lo=low)


# the sections of the run's config our export keeps in xlnet_pretraining.json ("config") and `xlnet import` restores:
# how the model was trained, and how it is finetuned when `xlnet finetune --init` takes the checkpoint's config
RUN_SECTIONS = ("tokenizer", "data", "train", "finetune")


def _saved_sections(path: Path) -> dict[str, dict[str, Any]]:
    """The run's tokenizer, data, train and finetune sections our export keeps in ``path`` (xlnet_pretraining.json,
    field "config"), in today's spelling; {} for a folder without them (transformers' own, an older export)."""
    if not path.is_file():
        return {}
    try:
        rec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        raise CheckpointError(
            f"{path}: not a valid pretraining record ({type(e).__name__}); remove it to import with inference settings"
        ) from None
    saved = rec.get("config") if isinstance(rec, dict) else None
    if saved is None:
        return {}
    if not isinstance(saved, dict) or not all(isinstance(saved.get(k, {}), dict) for k in RUN_SECTIONS):
        raise CheckpointError(
            f"{path}: field 'config' must be an object of config sections; remove the field to import with "
            "default training settings"
        )
    try:
        raw = upgrade_config(saved, str(path))
    except ConfigError as e:
        raise CheckpointError(
            f"{path}: {e}; remove its 'config' field to import with default training settings"
        ) from None
    return {k: dict(raw[k]) for k in RUN_SECTIONS if k in raw}


def _full_config(
    mcfg: ModelConfig,
    tok: dict[str, Any] | None = None,
    finetune: dict[str, Any] | None = None,
    saved: dict[str, dict[str, Any]] | None = None,
) -> Config:
    """The full Config of an HF model: its model config, the run's own sections when our export kept them
    (``saved``: ``_saved_sections``), else the defaults; then the tokenizer options and the head's finetune settings."""
    saved = saved or {}
    raw = {
        "tokenizer": {**saved.get("tokenizer", {}), "vocab_size": mcfg.vocab_size},
        "model": dataclasses.asdict(mcfg),
        "data": saved.get("data", {"perm_size": None if mcfg.reuse_len else 512}),
        "train": saved.get("train", {"micro_batch_size": 16}),
    }
    if tok:
        raw["tokenizer"].update(tok)
    if finetune or "finetune" in saved:
        raw["finetune"] = {**saved.get("finetune", {}), **(finetune or {})}
    return config_from_dict(raw)


# ---- finetuning heads (model/heads.py <-> transformers' XLNetFor* classes) -------------------------------------------


FINETUNE_FILE = "xlnet_finetune.json"
_RECORD_META = ("step", "metric", "value", "null_odds_threshold", "squad_v2")  # meta.json keys the record keeps
HEAD_CLASS = {
    "classification": "XLNetForSequenceClassification",
    "regression": "XLNetForSequenceClassification",
    "multiple-choice": "XLNetForMultipleChoice",
    "squad": "XLNetForQuestionAnswering",
}
# our head parameter -> transformers' (everything else is ``transformer.*`` on both sides). ClassificationHead:
# SequenceSummary(last|first, dense + tanh, dropout) then a linear layer = XLNetSequenceSummary + logits_proj.
_SUMMARY_KEYS = {
    "head.summary.proj.weight": "sequence_summary.summary.weight",
    "head.summary.proj.bias": "sequence_summary.summary.bias",
    "head.out.weight": "logits_proj.weight",
    "head.out.bias": "logits_proj.bias",
}
# SquadHead = XLNetPoolerStartLogits + XLNetPoolerEndLogits + XLNetPoolerAnswerClass (the original's layout)
_SQUAD_KEYS = {
    "head.start.weight": "start_logits.dense.weight",
    "head.start.bias": "start_logits.dense.bias",
    "head.end_dense.weight": "end_logits.dense_0.weight",
    "head.end_dense.bias": "end_logits.dense_0.bias",
    "head.end_ln.weight": "end_logits.LayerNorm.weight",
    "head.end_ln.bias": "end_logits.LayerNorm.bias",
    "head.end_out.weight": "end_logits.dense_1.weight",
    "head.end_out.bias": "end_logits.dense_1.bias",
    "head.cls_dense.weight": "answer_class.dense_0.weight",
    "head.cls_dense.bias": "answer_class.dense_0.bias",
    "head.cls_out.weight": "answer_class.dense_1.weight",
}


def head_keys(task: str, summary_use_proj: bool = True) -> dict[str, str]:
    """Our head parameter names -> transformers' for ``task``."""
    if task == "squad":
        return dict(_SQUAD_KEYS)
    return {k: v for k, v in _SUMMARY_KEYS.items() if summary_use_proj or ".proj." not in k}


def head_mismatch(task: str, ft: FinetuneConfig) -> str | None:
    """Why our head for ``task`` has no transformers class computing the same (None when one does)."""
    if task == "squad":
        return None
    if ft.summary_type == "attn":
        return (
            "finetune.summary_type 'attn' (a learned query over the tokens) has no transformers equivalent "
            "(XLNetSequenceSummary does not implement attn)"
        )
    if ft.summary_type == "mean":
        return (
            "finetune.summary_type 'mean' averages the real tokens; transformers' XLNetSequenceSummary averages "
            "the padding too, so padded inputs would score differently"
        )
    return None


def model_for_hf(
    cfg: Config,
    state: dict[str, torch.Tensor],
    meta: dict[str, Any],
    backbone_only: bool = False,
    where: str = "checkpoint",
) -> tuple[dict[str, Any], dict[str, torch.Tensor], dict[str, Any] | None]:
    """(config.json, transformers-named tensors, finetuning record or None) of a checkpoint: a pretrained model ->
    XLNetLMHeadModel; a finetuned one -> the class of its task (HEAD_CLASS) with its head; ``backbone_only`` ->
    XLNetModel (the transformer alone, keys without the ``transformer.`` prefix, as XLNetModel saves them)."""
    hc = to_hf_config(cfg.model)
    body = {k: v for k, v in state.items() if k.startswith("transformer.")}
    if backbone_only:
        hc["architectures"] = ["XLNetModel"]
        return hc, {k[len("transformer.") :]: v for k, v in to_hf_state(body, cfg.model).items()}, None
    if meta.get("kind") != "finetune":
        return hc, to_hf_state(state, cfg.model), None
    task = meta.get("task")
    if task not in HEAD_CLASS:
        raise CheckpointError(f"{where}: meta.json names an unknown finetuning task {task!r}")
    keys, own = _checked_head(task, cfg, state, where)
    tensors = to_hf_state(body, cfg.model)
    tensors.update({keys[k]: v.detach().clone().contiguous() for k, v in own.items()})
    labels = meta.get("labels")
    _add_head_config(hc, task, cfg.finetune, labels, own, where)
    record = {
        "comment": "The xlnet finetuning run this model comes from (transformers ignores this file; `xlnet eval`, "
        "`import` and `finetune --init` read it).",
        "task": task,
        "labels": labels,
        "config_version": CONFIG_VERSION,  # of the finetune section (config/loading.py)
        "finetune": config_to_dict(cfg)["finetune"],
        **{k: meta[k] for k in _RECORD_META if meta.get(k) is not None},
    }
    return hc, tensors, record


def _checked_head(
    task: str, cfg: Config, state: dict[str, torch.Tensor], where: str
) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    """(our head names -> transformers', the checkpoint's head tensors) of a finetuned checkpoint, once its task has
    a transformers class computing the same and its head has exactly the expected parameters."""
    why = head_mismatch(task, cfg.finetune)
    if why:
        raise CheckpointError(
            f"{where}: {why}; the transformer carries over, the {task} head does not: pass "
            "--backbone-only to export the transformer alone (XLNetModel)"
        )
    keys = head_keys(task, cfg.finetune.summary_use_proj)
    own = {k: v for k, v in state.items() if k.startswith("head.")}
    if set(own) != set(keys):
        odd = sorted(set(own) ^ set(keys))[0]
        raise CheckpointError(
            f"{where}: the {task} head does not have the expected parameters ({odd}); the "
            "checkpoint does not match its config.yaml"
        )
    return keys, own


def _add_head_config(
    hc: dict[str, Any], task: str, ft: FinetuneConfig, labels: Any, own: dict[str, torch.Tensor], where: str
) -> None:
    """Add to config.json (``hc``) the task's class and its head's settings: SQuAD's beam sizes or the sequence
    summary, and the labels of a classification or regression head."""
    hc["architectures"] = [HEAD_CLASS[task]]
    if task == "squad":
        hc.update(start_n_top=SQUAD_TOP_K, end_n_top=SQUAD_TOP_K)
    else:
        hc.update(
            summary_type=ft.summary_type,
            summary_use_proj=ft.summary_use_proj,
            summary_activation="tanh" if ft.summary_use_proj else "linear",
            summary_proj_to_labels=False,
            summary_last_dropout=ft.dropout,
        )
    if task == "classification":
        if not labels or len(set(labels)) != len(labels) or own["head.out.weight"].shape[0] != len(labels):
            raise CheckpointError(f"{where}: meta.json labels {labels!r} do not match the classification head")
        hc.update(
            id2label={str(i): str(lab) for i, lab in enumerate(labels)},
            label2id={str(lab): i for i, lab in enumerate(labels)},
            problem_type="single_label_classification",
        )
    elif task == "regression":
        hc.update(id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0}, problem_type="regression")


@dataclass
class HFHead:
    """The task head of an HF directory: ``task`` is None when it has no xlnet equivalent (``note`` says why)."""

    arch: str
    task: str | None = None
    labels: list[str] | None = None
    finetune: dict[str, Any] = field(default_factory=dict)  # the head's settings in cfg.finetune
    note: str = ""


def read_hf_head(hc: dict[str, Any], keys: set[str]) -> HFHead | None:
    """The head of an HF XLNet directory from its config.json and parameter names; None for an LM or bare model."""
    arch = (hc.get("architectures") or [None])[0]
    if arch in (None, "XLNetLMHeadModel", "XLNetModel"):
        return None
    id2label = hc.get("id2label") or {}
    try:
        names = (
            [str(id2label[k]) for k in sorted(id2label, key=int)]
            if id2label
            else [f"LABEL_{i}" for i in range(int(hc.get("num_labels", 2)))]
        )
    except (TypeError, ValueError):
        return HFHead(arch, note="config.json has an invalid id2label")
    problem = hc.get("problem_type")
    if arch == "XLNetForQuestionAnswering":
        task = "squad"
    elif arch == "XLNetForMultipleChoice":
        task = "multiple-choice"
    elif arch == "XLNetForSequenceClassification":
        if problem == "multi_label_classification":
            return HFHead(arch, note="multi-label classification (a sigmoid per label) has no xlnet task")
        task = "regression" if problem == "regression" or (problem is None and len(names) == 1) else "classification"
        if task == "regression" and len(names) != 1:
            return HFHead(arch, note=f"regression with {len(names)} outputs has no xlnet task (one output)")
        if task == "classification" and (len(names) < 2 or len(set(names)) != len(names)):
            return HFHead(arch, note=f"id2label {names} is not a list of 2 or more distinct labels")
    else:
        return HFHead(arch, note=f"{arch} has no xlnet task (classification, regression, multiple-choice, squad)")
    ft: dict[str, Any] = {}
    if task != "squad":
        summary = hc.get("summary_type", "last")
        summary = "last" if summary == "cls_index" else summary  # these classes pass no cls_index: the last token
        proj = bool(hc.get("summary_use_proj", True))
        act = hc.get("summary_activation", "tanh")
        if summary not in ("last", "first"):
            return HFHead(arch, note=f"summary_type {summary!r} differs from ours (we average real tokens only)")
        if proj and hc.get("summary_proj_to_labels"):
            return HFHead(arch, note="summary_proj_to_labels projects to the labels; ours projects to d_model")
        if (proj and act != "tanh") or (not proj and act not in (None, "", "linear")):
            return HFHead(
                arch,
                note=f"summary_activation {act!r} with summary_use_proj={proj} differs from ours "
                "(tanh after the projection, none without)",
            )
        ft = {"summary_type": summary, "summary_use_proj": proj}
    missing = [v for v in head_keys(task, ft.get("summary_use_proj", True)).values() if v not in keys]
    if missing:
        return HFHead(arch, note=f"the weights lack {missing[0]}")
    return HFHead(arch, task, names if task == "classification" else None, ft)


def _with_head(
    p: Path, hc: dict[str, Any], hf: dict[str, torch.Tensor], state: dict[str, torch.Tensor]
) -> tuple[dict[str, torch.Tensor], dict[str, Any], dict[str, Any] | None]:
    """(state, meta, finetune section) of an HF directory: with its head in our names when it carries over."""
    meta: dict[str, Any] = {"kind": "hf", "path": str(p)}
    head = read_hf_head(hc, set(hf))
    if head is None:
        return state, meta, None
    if head.task is None:
        meta["dropped_head"] = f"{head.arch}: {head.note}"
        return state, meta, None
    record = _finetune_record(p / FINETUNE_FILE, head)
    state = {k: v for k, v in state.items() if k.startswith("transformer.")}
    keys = head_keys(head.task, head.finetune.get("summary_use_proj", True))
    state.update({ours: hf[theirs].detach().clone().contiguous() for ours, theirs in keys.items()})
    meta = {
        "kind": "finetune",
        "task": head.task,
        "labels": head.labels,
        "path": str(p),
        "hf_class": head.arch,
        **{k: record[k] for k in _RECORD_META if k in record},
    }
    return state, meta, {**record.get("finetune", {}), **head.finetune}


def _finetune_record(path: Path, head: HFHead) -> dict[str, Any]:
    """Our export's finetuning record when it belongs to this head (same task and labels), else {}."""
    if not path.is_file():
        return {}
    try:
        rec = json.loads(path.read_text(encoding="utf-8"))
        section = {"config_version": rec.get("config_version", 1), "finetune": rec.get("finetune", {})}
        rec["finetune"] = upgrade_config(section, str(path))["finetune"]  # an earlier version's 0s read as today's
        FinetuneConfig(**rec["finetune"])
    except (OSError, ValueError, TypeError, AttributeError, RecursionError) as e:
        raise CheckpointError(
            f"{path}: not a valid finetuning record ({type(e).__name__}); remove it to use the "
            "head with default finetune settings"
        ) from None
    return rec if rec.get("task") == head.task and rec.get("labels") == head.labels else {}


def _load_pickled(path: Path, device: str) -> Any:
    """A pytorch_model.bin through torch's weights-only unpickler (tensors and containers, never code). Its warning
    about a pickle protocol it did not expect is left out: a file it cannot read gets the caller's one-line error."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
        return torch.load(path, map_location=device, weights_only=True)


def hf_dir_task(path: str | Path) -> str | None:
    """The xlnet task of an HF directory's head (None: a pretrained model, or a head that does not carry over)."""
    p = Path(path)
    try:
        hc = json.loads((p / "config.json").read_text(encoding="utf-8"))
        if (p / "model.safetensors").is_file():
            with safe_open(str(p / "model.safetensors"), framework="pt") as f:
                keys = set(f.keys())
        else:
            keys = set(_load_pickled(p / "pytorch_model.bin", "meta"))
    except Exception:  # noqa: BLE001 - unreadable: load_hf_dir reports it properly
        return None
    head = read_hf_head(hc, keys) if isinstance(hc, dict) else None
    return head.task if head else None


def describe_export(path: str | Path) -> str:
    """One line about an export: its class, and its labels for a classifier."""
    hc = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    arch = (hc.get("architectures") or ["XLNetLMHeadModel"])[0]
    if hc.get("problem_type") == "single_label_classification":
        labels = [hc["id2label"][k] for k in sorted(hc["id2label"], key=int)]
        return f"{arch}, {len(labels)} labels: {', '.join(labels)}"
    if hc.get("problem_type") == "regression":
        return f"{arch}, regression (1 output)"
    return arch


def import_summary(out: str | Path) -> str:
    """One line about an imported checkpoint: the task head it kept, or the head it dropped."""
    meta = json.loads((Path(out) / "meta.json").read_text(encoding="utf-8"))
    if meta.get("kind") == "finetune":
        labels = meta.get("labels")
        return f"a finetuned {meta['task']} checkpoint with its {meta.get('hf_class', 'task')} head" + (
            f" ({len(labels)} labels: {', '.join(labels)})" if labels else ""
        )
    if meta.get("dropped_head"):
        return f"the transformer only; head dropped ({meta['dropped_head']})"
    return "a pretrained checkpoint"


# ---- directories ------------------------------------------------------------------------------------------------


def first_non_finite(state: dict[str, torch.Tensor]) -> str | None:
    """The name of the first floating-point tensor of ``state`` holding a NaN or an infinity, else None."""
    for key, tensor in state.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            return key
    return None


def load_hf_dir(path: str | Path) -> tuple[Config, dict[str, torch.Tensor], dict[str, Any]]:
    """(Config, our state dict, meta) from an HF XLNet directory (config.json + weights [+ spiece.model])."""
    p = Path(path)
    hc = read_json_object(p / "config.json", CheckpointError, "a transformers config")
    if hc.get("model_type", "xlnet") != "xlnet":
        raise CheckpointError(f"{p} is a {hc.get('model_type')!r} model, not XLNet")
    check_hf_config(hc, p / "config.json")
    try:
        mcfg = _with_pretraining_values(from_hf_config(hc), p / PRETRAINING_FILE)
    except ConfigError as e:
        raise CheckpointError(f"{p / 'config.json'}: {e}") from None
    if (p / "model.safetensors").is_file():
        try:
            hf = load_file(str(p / "model.safetensors"))
        except Exception as e:  # noqa: BLE001 - safetensors raises several types
            raise CheckpointError(f"{p / 'model.safetensors'}: corrupt ({str(e).splitlines()[0][:100]})") from None
    elif (p / "pytorch_model.bin").is_file():
        try:
            hf = _load_pickled(p / "pytorch_model.bin", "cpu")
        except Exception as e:  # noqa: BLE001
            raise CheckpointError(f"{p / 'pytorch_model.bin'}: unreadable ({str(e).splitlines()[0][:100]})") from None
    else:
        raise CheckpointError(f"{p} has config.json but no model.safetensors or pytorch_model.bin")
    if not isinstance(hf, dict) or not all(isinstance(v, torch.Tensor) for v in hf.values()):
        raise CheckpointError(f"{p}: the weights file is not a state dict (names -> tensors)")
    bad = first_non_finite(hf)
    if bad is not None:  # as our own checkpoints (load.check_finite): every number computed from them would be garbage
        weights = p / ("model.safetensors" if (p / "model.safetensors").is_file() else "pytorch_model.bin")
        raise CheckpointError(
            f"{weights}: non-finite values (NaN/inf) in {bad}; these weights cannot be used: take a copy of the model "
            "without NaN/inf (download or save it again)"
        )
    check_weights_size(mcfg, sum(v.numel() for v in hf.values()), p / "config.json")
    tok = {}
    tc = p / "tokenizer_config.json"
    if tc.is_file():
        t = read_json_object(tc, CheckpointError, "transformers' tokenizer settings")
        tok = {k: json_field(t, hf, bool, tc, CheckpointError, default=False) for k, hf in _HF_TOKENIZER.items()}
    state, meta, finetune = _with_head(p, hc, hf, from_hf_state(hf, mcfg))
    meta.setdefault("hf_class", str((hc.get("architectures") or ["XLNetLMHeadModel"])[0]))
    meta["lm_bias"] = "lm_loss.bias" in hf  # an XLNetModel or a task model has no LM bias (from_hf_state: zeros)
    meta["weights"] = "model.safetensors" if (p / "model.safetensors").is_file() else "pytorch_model.bin"
    saved = _saved_sections(p / PRETRAINING_FILE)
    try:
        cfg = _full_config(mcfg, tok, finetune, saved)
    except ConfigError as e:
        if not saved:
            raise
        raise CheckpointError(
            f"{p / PRETRAINING_FILE}: field 'config' is not a valid config for this model ({e}); remove the "
            "field to import with default training settings"
        ) from None
    return cfg, state, meta
