"""Typed configuration. The dataclasses below are the single source of truth; YAML is their serialised form.

    cfg = load_config("tiny", ["train.lr=1e-3", "model.dropout=0.0"])   # a preset name or a YAML path
    save_config(cfg, out_dir)        # written next to every output as config.yaml

Every key is type-checked and every number range-checked against the range declared on its field (``ranged``);
unknown keys, wrong types and values out of range raise ConfigError naming the key, the allowed range and where the
value came from (the file, or the ``--set`` item). Values are the paper's (arXiv 1906.08237, Tables 7-8) unless a
comment says otherwise. The presets (tiny, base, large; finetune: glue, squad, race) ship in the package
(``xlnetcli/presets/``).
"""

from __future__ import annotations

import dataclasses
import math
import reprlib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from xlnetcli.core.errors import ConfigError

@dataclass(frozen=True)
class Range:
    """An interval of allowed values, written as in maths: "[0, 1)", "(0, inf)", "[1, inf)". NaN is never inside."""

    lo: float
    hi: float
    lo_closed: bool
    hi_closed: bool

    @classmethod
    def parse(cls, spec: str) -> Range:
        lo, hi = (float(x) for x in spec[1:-1].split(","))
        return cls(lo, hi, spec[0] == "[", spec[-1] == "]")

    def __contains__(self, v: float) -> bool:
        if isinstance(v, float) and math.isnan(v):
            return False
        return (v >= self.lo if self.lo_closed else v > self.lo) and (v <= self.hi if self.hi_closed else v < self.hi)

    def describe(self, integer: bool) -> str:
        lo = _num(self.lo, integer)
        if math.isinf(self.hi):
            rel = f"{'>=' if self.lo_closed else '>'} {lo}"
            return rel if integer else f"a finite number {rel}"
        return f"in {'[' if self.lo_closed else '('}{lo}, {_num(self.hi, integer)}{']' if self.hi_closed else ')'}"


def _num(x: float, integer: bool) -> str:
    return str(int(x)) if integer or x == int(x) else repr(x)


def ranged(default: Any, spec: str) -> Any:
    """A numeric field with its allowed range: ``lr: float = ranged(4e-4, "(0, inf)")`` (tuples: every element).
    Bounds used below: 2147483647 = 2**31 - 1 (SentencePiece keeps sizes in int32), 4294967295 = 2**32 - 1 (the
    seed range numpy accepts)."""
    return field(default=default, metadata={"range": Range.parse(spec)})


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxtuple, _REPR.maxdict, _REPR.maxstring, _REPR.maxother = 2, 4, 4, 4, 40, 40


def short(value: Any, limit: int = 60) -> str:
    """A bounded repr for messages: a huge or deeply nested value (an alias bomb) never reaches the terminal."""
    return clip(_REPR.repr(value), limit)


def clip(text: Any, limit: int = 60) -> str:
    text = str(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass
class TokenizerConfig:
    vocab_size: int = ranged(32000, "[9, 2147483647]")  # SentencePiece unigram vocabulary, ids 0-8 fixed (tokenizer.py)
    character_coverage: float = ranged(0.99995, "[0.98, 1]")  # characters covered by the vocabulary (SentencePiece)
    input_sentence_size: int = ranged(10_000_000, "[0, 2147483647]")  # sentences sampled for training (0 = all)
    uncased: bool = False  # lowercase before encoding (the released xlnet-*-cased models keep case)
    keep_accents: bool = False  # False: NFKD + drop combining marks, as the original preprocess_text
    threads: int = ranged(0, "[0, 1024]")  # SentencePiece trainer threads (at most 1024); 0 = all cores

    def __post_init__(self) -> None:
        check_ranges(self)


OBJECTIVES = ("plm", "mlm", "clm")


@dataclass
class ModelConfig:
    vocab_size: int = ranged(32000, "[9, 2147483647]")  # must equal the tokenizer's vocabulary
    d_model: int = ranged(768, "[2, inf)")  # hidden size
    n_layer: int = ranged(12, "[1, inf)")  # transformer layers
    n_head: int = ranged(12, "[1, inf)")  # attention heads
    d_head: int = ranged(64, "[1, inf)")  # size of each head (n_head * d_head need not equal d_model)
    d_inner: int = ranged(3072, "[1, inf)")  # feed-forward inner size
    ff_activation: Literal["gelu", "gelu_new", "relu"] = "gelu"  # gelu = exact erf; gelu_new = tanh approximation
    untie_r: bool = True  # per-layer r_w/r_r/r_s biases (released models); False shares them across layers
    dropout: float = ranged(0.1, "[0, 1)")  # dropout on embeddings, attention output and FFN
    dropatt: float = ranged(0.1, "[0, 1)")  # dropout on attention probabilities
    layer_norm_eps: float = ranged(1e-12, "(0, 1)")  # post-LayerNorm epsilon
    initializer_range: float = ranged(0.02, "(0, inf)")  # N(0, std) init for embeddings and projections
    mem_len: int = ranged(384, "[0, inf)")  # Transformer-XL memory length (0 = no memory in training/eval)
    reuse_len: int = ranged(256, "[0, inf)")  # leading tokens of each window cached as memory for the next one
    bi_data: bool = True  # per device: first half of the batch forward, second half backward (negated positions)
    clamp_len: int = ranged(-1, "[-1, inf)")  # clip relative positions to +-clamp_len (-1 = no clipping)
    # Kept for HF config round trips: like the original and HF, it only affects attn_type "uni", and XLNet is "bi".
    same_length: bool = False
    # attention kernel (kernels.py); auto = fused on CPU, sdpa on CUDA (einsum inside torch.compile)
    attn_impl: Literal["auto", "fused", "einsum", "sdpa", "flex"] = "auto"
    # pretraining objective on the same backbone, memory and records (the paper's Table 6 ablations, data.py):
    # plm = permutation LM (XLNet); mlm = <mask> at the targets, predicted by the content stream ("DAE +
    # Transformer-XL"); clm = the natural left-to-right order (Transformer-XL's LM), predicted by the query stream
    objective: Literal["plm", "mlm", "clm"] = "plm"

    def __post_init__(self) -> None:
        check_ranges(self)
        if self.objective not in OBJECTIVES:
            raise ConfigError(f"model.objective must be one of {', '.join(OBJECTIVES)}, got {short(self.objective)}")
        if self.d_model % 2:
            raise ConfigError(f"model.d_model must be even (sinusoidal positions), got {self.d_model}")


@dataclass
class DataConfig:
    seq_len: int = ranged(512, "[5, inf)")  # tokens per example: [reuse part | A <sep> B <sep> <cls>]
    perm_size: int | None = ranged(None, "[1, inf)")  # factorisation-order block size; None = reuse_len (original)
    num_predict: int = ranged(85, "[1, inf)")  # targets per example (about seq_len/6: K = 6 in the paper)
    mask_alpha: int = ranged(6, "[1, inf)")  # span context: each span of n units sits in about n*alpha/beta tokens
    mask_beta: int = ranged(1, "[1, inf)")
    # longest span, in units (words, or pieces with mask_mode=original): n ~ 1/n over 1..max_gram as the original;
    # 1 = single units, the paper's "- span-based pred" ablation row (Table 6)
    max_gram: int = ranged(5, "[1, 5]")
    mask_mode: Literal["word", "original"] = "word"  # word: spans of whole words; original: subword spans (bug #220)
    passes: int = ranged(1, "[1, inf)")  # passes over the corpus, each with its own file order and masks
    valid_fraction: float = ranged(0.01, "[0, 1)")  # held-out share of the corpus (shard) used for evaluation records
    seed: int = ranged(42, "[0, 4294967295]")  # seed for preprocessing and the online factorisation order

    def __post_init__(self) -> None:
        check_ranges(self)


@dataclass
class TrainConfig:
    global_batch_size: int = ranged(2048, "[1, inf)")  # sequences per optimizer step over all ranks (v2: 8192)
    micro_batch_size: int = ranged(16, "[1, inf)")  # sequences per rank per forward/backward; accumulation follows
    max_steps: int = ranged(500_000, "[1, inf)")  # optimizer steps
    lr: float = ranged(4e-4, "(0, inf)")  # peak learning rate
    warmup_steps: int = ranged(40_000, "[0, inf)")  # linear warmup from 0 (at most max_steps)
    schedule: Literal["linear", "cosine", "constant"] = "linear"  # decay after warmup
    min_lr_ratio: float = ranged(0.0, "[0, 1]")  # decay ends at lr * min_lr_ratio
    weight_decay: float = ranged(0.01, "[0, inf)")  # decoupled (AdamW); not applied to LayerNorm weights or biases
    adam_betas: tuple[float, float] = ranged((0.9, 0.999), "[0, 1)")
    adam_eps: float = ranged(1e-6, "(0, inf)")
    clip_norm: float = ranged(1.0, "[0, inf)")  # global gradient-norm clip (0 = off)
    precision: Literal["fp32", "bf16", "fp16"] = "bf16"  # autocast dtype; fp16 uses a grad scaler
    compile: bool = False  # torch.compile the model
    activation_checkpointing: bool = False  # recompute each layer in backward to save memory
    deterministic: bool = True  # deterministic GPU kernels: bit-identical runs and resumes (cost: BENCHMARKS.md)
    peak_tflops: float = ranged(0.0, "[0, inf)")  # device bf16 peak for the logged MFU; 0 = from the GPU's name
    distributed: Literal["ddp", "fsdp"] = "ddp"  # strategy under torchrun (fsdp = FSDP2 fully_shard)
    eval_every: int = ranged(10_000, "[0, inf)")  # steps between evaluations on held-out records (0 = never)
    eval_batches: int = ranged(50, "[1, inf)")  # batches per evaluation
    save_every: int = ranged(10_000, "[0, inf)")  # steps between checkpoints (0 = only at the end)
    keep_last: int = ranged(3, "[1, inf)")  # checkpoints kept
    log_every: int = ranged(10, "[1, inf)")  # steps between metric lines
    seed: int = ranged(1234, "[0, 4294967295]")  # model init, dropout and factorisation-order seed
    # trackers besides metrics.jsonl, a list or comma string of tensorboard, wandb, mlflow; none; auto = TensorBoard
    # when installed (extras: pip install 'xlnetcli[wandb]', 'xlnetcli[mlflow]')
    report_to: str | list[str] = "auto"
    # linear probe on frozen features during pretraining (probe.py): a labelled TSV/CSV/JSONL file (classification),
    # split deterministically into probe-train / probe-valid; probe accuracy every probe_every steps (0 = off)
    probe_file: str | None = None
    probe_every: int = ranged(0, "[0, inf)")

    def __post_init__(self) -> None:
        check_ranges(self)
        _report_to(self)
        if self.probe_file is not None and not self.probe_file.strip():
            raise ConfigError("train.probe_file is empty; give a labelled file (TSV/CSV/JSONL) or leave it unset")


@dataclass
class FinetuneConfig:
    max_seq_length: int = ranged(128, "[5, inf)")  # [A <sep> B <sep> <cls>], left padded (SQuAD: right padded)
    batch_size: int = ranged(32, "[1, inf)")  # sequences per optimizer step over all ranks
    micro_batch_size: int = ranged(32, "[1, inf)")  # per rank per forward/backward
    lr: float = ranged(2e-5, "(0, inf)")
    epochs: float = ranged(3.0, "(0, inf)")  # used when max_steps = 0
    max_steps: int = ranged(0, "[0, inf)")  # optimizer steps (0 = derive from epochs)
    warmup_ratio: float = ranged(0.1, "[0, 1)")  # share of steps spent in linear warmup
    layer_decay: float = ranged(1.0, "(0, 1]")  # layer-wise lr decay: layer l gets lr * rate^(n_layer-1-l); SQuAD 0.75
    weight_decay: float = ranged(0.01, "[0, inf)")
    adam_eps: float = ranged(1e-6, "(0, inf)")
    clip_norm: float = ranged(1.0, "[0, inf)")  # global gradient-norm clip (0 = off)
    dropout: float = ranged(0.1, "[0, 1)")
    dropatt: float = ranged(0.1, "[0, 1)")
    summary_type: Literal["last", "first", "mean", "attn"] = "last"  # sequence summary for classification heads
    summary_use_proj: bool = True  # dense(d, tanh) projection on the summary
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    eval_every: int = ranged(0, "[0, inf)")  # steps between evaluations (0 = every epoch)
    early_stopping_patience: int = ranged(0, "[0, inf)")  # stop after this many evaluations without gain (0 = off)
    save_every: int = ranged(0, "[0, inf)")  # steps between resumable checkpoints (0 = at every evaluation)
    doc_stride: int = ranged(128, "[1, inf)")  # SQuAD: stride between windows of a long paragraph
    max_query_length: int = ranged(64, "[1, inf)")  # SQuAD: question tokens kept
    max_answer_length: int = ranged(64, "[1, inf)")  # SQuAD: longest predicted answer in tokens
    seed: int = ranged(1234, "[0, 4294967295]")
    report_to: str | list[str] = "auto"  # as train.report_to, for finetuning runs

    def __post_init__(self) -> None:
        check_ranges(self)
        _report_to(self)


@dataclass
class Config:
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)

    def __post_init__(self) -> None:
        validate(self)  # what every config must satisfy (one process, no particular stage)

    @property
    def perm_size(self) -> int:
        return self.data.perm_size if self.data.perm_size is not None else self.model.reuse_len


@dataclass(frozen=True)
class BatchPlan:
    """Pretraining batch maths (docs/xlnet.md §5): what preprocess lays out and what each training process runs."""

    global_batch_size: int  # rows (parallel text streams) per optimizer step, all processes together
    micro_batch_size: int  # rows per process per forward/backward
    world: int  # processes
    accumulation: int  # micro-batches per process per step: global = micro x accumulation x world
    bi_data: bool  # each micro-batch: half forward rows, then the same rows time-reversed
    forward_rows: int  # distinct rows of text: global, or global / 2 with bi_data
    num_predict_reuse: int  # targets in the reuse part [0, reuse_len)
    num_predict_rest: int  # targets in the rest [reuse_len, seq_len)


def split_num_predict(num_predict: int) -> tuple[int, int]:
    """(targets in the reuse part, targets in the rest): the rest gets num_predict // 2 (the original data_utils)."""
    rest = num_predict // 2
    return num_predict - rest, rest


def batch_plan(cfg: Config, world: int = 1) -> BatchPlan:
    """The batch maths of ``cfg`` on ``world`` processes, or a one-line ConfigError naming a setting that works."""
    g, mb, bi = cfg.train.global_batch_size, cfg.train.micro_batch_size, cfg.model.bi_data
    if bi and mb % 2:
        raise ConfigError(
            f"train.micro_batch_size ({mb}) must be even with model.bi_data "
            "(each device's batch is half forward, half backward)"
        )
    if g % (mb * world):
        options = [m for m in range(1, mb + 1) if g % (m * world) == 0 and (not bi or m % 2 == 0)]
        hint = f"e.g. --set train.micro_batch_size={options[-1]}" if options else "change train.global_batch_size"
        raise ConfigError(
            f"impossible batch maths: train.global_batch_size={g} must be a multiple of "
            f"train.micro_batch_size={mb} x {world} process(es); {hint}"
        )
    reuse, rest = split_num_predict(cfg.data.num_predict)
    return BatchPlan(g, mb, world, g // (mb * world), bi, g // 2 if bi else g, reuse, rest)


# the stages that ask validate() for more than every config satisfies
STAGES = ("preprocess", "pretrain", "finetune")


def validate(cfg: Config, world: int = 1, stage: str | None = None) -> BatchPlan:
    """Every check that spans keys or sections, in one place; returns the pretraining batch plan on ``world``
    processes. A check that fails raises a one-line ConfigError naming the keys and a setting that works.

    Every Config runs it when built (one process, no stage): what any config must satisfy. A stage runs it once
    more with its name and number of processes for what that stage adds: ``preprocess`` and ``pretrain`` lay out or
    read permutation-LM records (a reuse part to predict in, span targets that fit both parts); ``pretrain`` and
    ``finetune`` split their batch over ``world`` processes."""
    if stage is not None and stage not in STAGES:
        raise ValueError(f"validate: unknown stage {stage!r} (stages: {', '.join(STAGES)})")
    m, d, t, ft = cfg.model, cfg.data, cfg.train, cfg.finetune
    L, R = d.seq_len, m.reuse_len
    # one window: [reuse part | A <sep> B <sep> <cls>], the factorisation order in blocks of perm_size (§2, §4)
    if R > L:
        raise ConfigError(f"model.reuse_len ({R}) must be <= data.seq_len ({L})")
    if L - R < 5:
        raise ConfigError(
            f"data.seq_len - model.reuse_len must leave room for A <sep> B <sep> <cls> (>= 5), got {L} - {R}"
        )
    P = cfg.perm_size
    if P <= 0 or (R and R % P) or (L - R) % P:
        raise ConfigError(f"data.perm_size ({P}) must divide model.reuse_len ({R}) and "
                          f"data.seq_len - model.reuse_len ({L - R})")
    if d.num_predict > L - 2:
        raise ConfigError(f"data.num_predict ({d.num_predict}) must be <= data.seq_len - 2 ({L - 2})")
    if cfg.tokenizer.vocab_size != m.vocab_size:
        raise ConfigError(
            f"tokenizer.vocab_size ({cfg.tokenizer.vocab_size}) must equal model.vocab_size ({m.vocab_size})"
        )
    if t.warmup_steps > t.max_steps:
        raise ConfigError(f"train.warmup_steps must be in [0, max_steps={t.max_steps}], got {t.warmup_steps}")
    if t.probe_every > 0 and t.probe_file is None:
        raise ConfigError(f"train.probe_every={t.probe_every} needs train.probe_file (a labelled TSV/CSV/JSONL file)")
    if stage in ("preprocess", "pretrain"):
        if R < 1:
            raise ConfigError("model.reuse_len must be >= 1 for pretraining records (the original uses seq_len/2)")
        goal0, goal1 = split_num_predict(d.num_predict)
        if goal0 > R or goal1 > L - R - 3:
            raise ConfigError(
                f"data.num_predict ({d.num_predict}) is larger than possible: {goal0} targets in the reuse part "
                f"(at most model.reuse_len = {R}) and {goal1} in the rest (at most seq_len - reuse_len - 3 = "
                f"{L - R - 3})"
            )
        if d.mask_alpha < d.mask_beta:
            raise ConfigError(
                f"data.mask_alpha ({d.mask_alpha}) must be >= data.mask_beta ({d.mask_beta}): "
                "each span needs a context of at least one token"
            )
    ft_world = world if stage == "finetune" else 1
    if ft.batch_size % (ft.micro_batch_size * ft_world):
        processes = f" x processes ({ft_world})" if ft_world > 1 else ""
        raise ConfigError(f"finetune.batch_size ({ft.batch_size}) must be a multiple of "
                          f"finetune.micro_batch_size ({ft.micro_batch_size}){processes}")
    return batch_plan(cfg, world if stage == "pretrain" else 1)


TRACKERS = ("tensorboard", "wandb", "mlflow")


def _report_to(obj: Any) -> None:
    """report_to as a canonical comma string: 'auto', 'none' or tracker names in the order given."""
    value = obj.report_to
    items = value.split(",") if isinstance(value, str) else list(value)
    names = list(dict.fromkeys(s.strip().lower() for s in items if s.strip()))
    allowed = (*TRACKERS, "auto", "none")
    bad = [n for n in names if n not in allowed]
    if not names or bad or (len(names) > 1 and ({"auto", "none"} & set(names))):
        section = {v: k for k, v in _SECTION_CLASSES.items()}.get(type(obj), type(obj).__name__)
        raise ConfigError(f"{section}.report_to: expected 'auto', 'none' or a list of "
                          f"{', '.join(TRACKERS)}, got {short(value)}")
    obj.report_to = ",".join(names)


SECTIONS = {
    "tokenizer": TokenizerConfig,
    "model": ModelConfig,
    "data": DataConfig,
    "train": TrainConfig,
    "finetune": FinetuneConfig,
}
_SECTION_CLASSES = SECTIONS

# The sections each command reads: a --set key of another section would be silently ignored, so it is refused.
# preprocess and pretrain write the resolved config next to their outputs, where the next command picks it up.
COMMAND_SECTIONS = {
    "tokenize train": ("tokenizer",),
    "shard": ("data",),
    "preprocess": ("tokenizer", "model", "data", "train"),
    "pretrain": ("tokenizer", "model", "data", "train"),
    "finetune": ("finetune",),
    "config show": tuple(_SECTION_CLASSES),
}

# Presets shipped in the package (xlnetcli/presets/), accepted by name wherever a config file is.
PRESETS = {
    "tiny": "tiny.yaml",
    "base": "base.yaml",
    "large": "large.yaml",
    "glue": "finetune/glue.yaml",
    "squad": "finetune/squad.yaml",
    "race": "finetune/race.yaml",
}


# ----------------------------------------------------------------------------------------------------------------
# Ranges


def check_ranges(obj: Any) -> None:
    """Check every field of a section against its declared range (the one place numeric values are validated)."""
    section = {v: k for k, v in _SECTION_CLASSES.items()}.get(type(obj), type(obj).__name__)
    for f in dataclasses.fields(obj):
        check_value(f, getattr(obj, f.name), f"{section}.{f.name}")


def check_value(f: dataclasses.Field, value: Any, key: str) -> None:
    rng = f.metadata.get("range")
    if rng is None or value is None:
        return
    for i, v in enumerate(value) if isinstance(value, tuple) else [(None, value)]:
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v not in rng:
            name = key if i is None else f"{key}[{i}]"
            raise ConfigError(f"{name} must be {rng.describe(isinstance(v, int))}, got {short(v)}")


# ----------------------------------------------------------------------------------------------------------------
# Loading, overriding, saving


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against the annotation ``tp``; return it converted (int -> float, list -> tuple)."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin is Literal:
        if value not in typing.get_args(tp):
            choices = ", ".join(repr(a) for a in typing.get_args(tp))
            raise ConfigError(f"{key}: expected one of {choices}, got {short(value)}")
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{key}: invalid value {short(value)}")
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {short(value)}")
        return [_coerce(v, typing.get_args(tp)[0], f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise ConfigError(f"{key}: expected a list of {len(args)} values, got {short(value)}")
        return tuple(_coerce(v, a, f"{key}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {short(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {short(value)}")
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads 1e-3 (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {short(value)}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {short(value)}")
        return value
    raise ConfigError(f"{key}: unsupported type {tp}")  # pragma: no cover - a programming error


def check_key(section: str, key: str, value: Any) -> Any:
    """One ``section.key: value``: the section and key must exist, the value have the field's type and lie in its
    range. Returns the converted value."""
    cls = _SECTION_CLASSES.get(section)
    if cls is None:
        raise ConfigError(f"unknown section {short(section)} (known: {', '.join(_SECTION_CLASSES)})")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if key not in fields:
        raise ConfigError(f"unknown key {section}.{clip(key)} (known: {', '.join(sorted(fields))})")
    name = f"{section}.{key}"
    value = _coerce(value, typing.get_type_hints(cls)[key], name)
    check_value(fields[key], value, name)
    return value


def _check_raw(raw: Any) -> dict[str, dict[str, Any]]:
    """Validate every key of nested dicts (sections of keys) on its own; returns them converted."""
    if not isinstance(raw, dict):
        raise ConfigError(f"the config must be a mapping of sections, got {type(raw).__name__}")
    out: dict[str, dict[str, Any]] = {}
    for name, values in raw.items():
        if name not in _SECTION_CLASSES:
            raise ConfigError(f"unknown section {short(name)} (known: {', '.join(_SECTION_CLASSES)})")
        if values is None:
            values = {}
        if not isinstance(values, dict):
            raise ConfigError(f"section {name!r} must be a mapping, got {short(values)}")
        out[name] = {key: check_key(name, key, value) for key, value in values.items()}
    return out


def config_from_dict(raw: dict[str, Any]) -> Config:
    """Build a validated Config from nested dicts (missing keys take their defaults)."""
    checked = _check_raw(raw)
    return Config(**{name: _SECTION_CLASSES[name](**values) for name, values in checked.items()})


def parse_override(item: str) -> tuple[str, str, Any]:
    """'section.key=value' -> (section, key, parsed value). The value is parsed as YAML (1e-4, true, [1, 2])."""
    if "=" not in item:
        raise ConfigError(f"--set {clip(item)}: expected section.key=value, e.g. train.lr=1e-4")
    path, text = item.split("=", 1)
    parts = path.strip().split(".")
    if len(parts) != 2 or not all(parts):
        raise ConfigError(f"--set {clip(item)}: expected section.key=value, e.g. train.lr=1e-4")
    try:
        value = yaml_load(text) if text.strip() else ""
    except YAMLAliasError:
        raise ConfigError(f"--set {clip(item)}: YAML aliases and anchors (*name, &name) are not allowed") from None
    except yaml.YAMLError:
        value = text
    return parts[0], parts[1], value


def check_override_sections(overrides: typing.Sequence[str], command: str) -> None:
    """Refuse ``--set`` keys of sections ``xlnet COMMAND`` does not read (they would be silently ignored)."""
    sections = COMMAND_SECTIONS[command]
    for item in overrides:
        section, key, _ = parse_override(item)
        if section in _SECTION_CLASSES and section not in sections:
            reads = ", ".join(f"{s}.*" for s in sections)
            alt = next((s for s in sections if key in {f.name for f in dataclasses.fields(_SECTION_CLASSES[s])}),
                       None)
            hint = f"; did you mean {alt}.{key}?" if alt else ""
            raise ConfigError(f"--set {clip(item)}: xlnet {command} reads {reads}; {section}.{clip(key)} is "
                              f"not used{hint}")


# ---- YAML without aliases -------------------------------------------------------------------------------------


class YAMLAliasError(yaml.YAMLError):
    """An alias or anchor in a config: refused, since a few hundred bytes of aliases expand to gigabytes."""


class _ConfigLoader(yaml.SafeLoader):
    """SafeLoader that refuses anchors and aliases (the 'billion laughs' expansion); configs never need them."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise YAMLAliasError(f"line {event.start_mark.line + 1}")
        return super().compose_node(parent, index)


def yaml_load(text: str) -> Any:
    """Parse one YAML document with safe types and no anchors or aliases (raises YAMLAliasError on one)."""
    return yaml.load(text, Loader=_ConfigLoader)  # noqa: S506 - a SafeLoader subclass


# ---- presets and files ----------------------------------------------------------------------------------------


def preset_path(name: str) -> Path:
    """The packaged YAML of a preset name (tiny, base, large, glue, squad, race)."""
    from importlib.resources import files

    if name not in PRESETS:
        raise ConfigError(f"unknown preset {short(name)} (presets: {', '.join(PRESETS)})")
    return Path(str(files(__package__).joinpath("presets", *PRESETS[name].split("/"))))


def resolve_config_path(path: str | Path) -> Path:
    """A config argument -> the YAML file it names: an existing file, else a preset name; a one-line error
    otherwise (a folder, or neither a file nor a preset)."""
    p = Path(path)
    if p.is_file():
        return p
    if str(path) in PRESETS:
        return preset_path(str(path))
    names = ", ".join(PRESETS)
    if p.is_dir():
        inner = f" (e.g. {p / 'config.yaml'})" if (p / "config.yaml").is_file() else ""
        raise ConfigError(f"config {p} is a folder; pass a YAML file{inner} or a preset name: {names}")
    raise ConfigError(f"config file not found: {clip(p, 200)} (nor a preset name: {names})")


def _read_yaml(path: str | Path) -> tuple[dict[str, Any], str]:
    """The sections of a config file (or preset) and how to name it in messages."""
    p = resolve_config_path(path)
    where = f"preset {path}" if str(path) in PRESETS and not Path(path).is_file() else str(p)
    try:
        raw = yaml_load(p.read_text(encoding="utf-8")) or {}
    except YAMLAliasError as e:
        raise ConfigError(f"{where}: YAML aliases and anchors (*name, &name) are not allowed in configs ({e})") \
            from None
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        line = getattr(getattr(e, "problem_mark", None), "line", None)
        at = f" (line {line + 1})" if line is not None else ""
        raise ConfigError(f"{where}: not valid YAML{at}") from None
    except OSError as e:
        raise ConfigError(f"{where}: cannot read it ({e.strerror or e})") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: the config must be a mapping of sections, got {type(raw).__name__}")
    return raw, where


def load_config(path: str | Path | None = None, overrides: typing.Sequence[str] = (),
                settings: typing.Sequence[tuple[str, str, Any]] = ()) -> Config:
    """Load a YAML config or preset name (the defaults when ``path`` is None), apply ``section.key=value``
    overrides, then ``settings``: (source, "section.key", value) from a command's own options, e.g.
    ("--vocab-size 500", "tokenizer.vocab_size", 500). A problem is reported against its source: the file for its
    own keys, the ``--set`` item or option for an override (and for a combination that an override made
    impossible)."""
    raw: dict[str, Any] = {}
    where = "the defaults"
    if path is not None:
        raw, where = _read_yaml(path)
    try:
        file_values = _check_raw(raw)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    values = {name: dict(v) for name, v in file_values.items()}
    changes = [(f"--set {clip(item)}", *parse_override(item)) for item in overrides]
    changes += [(source, *dotted.split("."), value) for source, dotted, value in settings]
    applied: list[tuple[str, str]] = []
    for source, section, key, value in changes:
        try:
            value = check_key(section, key, value)
        except ConfigError as e:
            raise ConfigError(f"{source}: {e}") from None
        values.setdefault(section, {})[key] = value
        applied.append((source, f"{section}.{key}"))
    # the two vocabulary sizes must agree: overriding one alone sets the other
    keys = {k for _, k in applied}
    for a, b in (("tokenizer", "model"), ("model", "tokenizer")):
        if f"{a}.vocab_size" in keys and f"{b}.vocab_size" not in keys:
            values.setdefault(b, {})["vocab_size"] = values[a]["vocab_size"]
    try:
        return Config(**{name: _SECTION_CLASSES[name](**v) for name, v in values.items()})
    except ConfigError as e:
        if applied and _builds(file_values):
            blamed = [source for source, k in applied if k in str(e)] or [source for source, _ in applied]
            src = "" if path is None else f" (with {where})"
            raise ConfigError(f"{clip(' '.join(blamed), 120)}: {e}{src}") from None
        raise ConfigError(f"{where}: {e}") from None


def _builds(values: dict[str, dict[str, Any]]) -> bool:
    try:
        Config(**{name: _SECTION_CLASSES[name](**v) for name, v in values.items()})
    except ConfigError:
        return False
    return True


def config_to_dict(cfg: Config) -> dict[str, Any]:
    out = {}
    for name in _SECTION_CLASSES:
        section = dataclasses.asdict(getattr(cfg, name))
        out[name] = {k: list(v) if isinstance(v, tuple) else v for k, v in section.items()}
    return out


def dump_config(cfg: Config) -> str:
    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False)


def save_config(cfg: Config, directory: str | Path, name: str = "config.yaml") -> Path:
    """Write the resolved config next to an output (atomically)."""
    from xlnetcli.core.files import atomic_write_text

    path = Path(directory) / name
    atomic_write_text(path, dump_config(cfg))
    return path


def replace(cfg: Config, **sections: dict[str, Any]) -> Config:
    """A copy of ``cfg`` with some keys changed, re-validated: replace(cfg, model={"dropout": 0.0})."""
    raw = config_to_dict(cfg)
    for name, values in sections.items():
        raw[name].update(values)
    return config_from_dict(raw)
