"""Typed configuration. The dataclasses below are the single source of truth; YAML is their serialised form.

    cfg = load_config("configs/tiny.yaml", ["train.lr=1e-3", "model.dropout=0.0"])
    save_config(cfg, out_dir)        # written next to every output as config.yaml

Every key is type-checked; unknown keys, wrong types and impossible values raise ConfigError naming the key and the
file. Values are the paper's (arXiv 1906.08237, Tables 7-8) unless a comment says otherwise.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from .errors import ConfigError


@dataclass
class TokenizerConfig:
    vocab_size: int = 32000  # SentencePiece unigram vocabulary, ids 0-8 fixed (see tokenizer.py)
    character_coverage: float = 0.99995  # fraction of characters covered by the vocabulary (original recipe)
    input_sentence_size: int = 10_000_000  # sentences sampled (shuffled) for training the tokenizer
    uncased: bool = False  # lowercase before encoding (the released xlnet-*-cased models keep case)
    keep_accents: bool = False  # False: NFKD + drop combining marks, as the original preprocess_text
    threads: int = 0  # SentencePiece trainer threads; 0 = all cores


OBJECTIVES = ("plm", "mlm", "clm")


@dataclass
class ModelConfig:
    vocab_size: int = 32000  # must equal the tokenizer's vocabulary
    d_model: int = 768  # hidden size
    n_layer: int = 12  # transformer layers
    n_head: int = 12  # attention heads
    d_head: int = 64  # size of each head (n_head * d_head need not equal d_model)
    d_inner: int = 3072  # feed-forward inner size
    ff_activation: Literal["gelu", "gelu_new", "relu"] = "gelu"  # gelu = exact erf; gelu_new = tanh approximation
    untie_r: bool = True  # per-layer r_w/r_r/r_s biases (released models); False shares them across layers
    dropout: float = 0.1  # dropout on embeddings, attention output and FFN
    dropatt: float = 0.1  # dropout on attention probabilities
    layer_norm_eps: float = 1e-12  # post-LayerNorm epsilon
    initializer_range: float = 0.02  # N(0, std) init for embeddings and projections
    mem_len: int = 384  # Transformer-XL memory length (0 = no memory)
    reuse_len: int = 256  # leading tokens of each window cached as memory for the next one
    bi_data: bool = True  # per device: first half of the batch forward, second half backward (negated positions)
    clamp_len: int = -1  # clip relative positions to +-clamp_len (-1 = no clipping)
    # Kept for HF config round trips: like the original and HF, it only affects attn_type "uni", and XLNet is "bi".
    same_length: bool = False
    # attention kernel (kernels.py); auto = fused on CPU, sdpa on CUDA (einsum inside torch.compile)
    attn_impl: Literal["auto", "fused", "einsum", "sdpa", "flex"] = "auto"
    # pretraining objective on the same backbone, memory and records (the paper's Table 6 ablations, data.py):
    # plm = permutation LM (XLNet); mlm = <mask> at the targets, predicted by the content stream ("DAE +
    # Transformer-XL"); clm = the natural left-to-right order (Transformer-XL's LM), predicted by the query stream
    objective: Literal["plm", "mlm", "clm"] = "plm"

    def __post_init__(self) -> None:
        _positive(self, "vocab_size", "d_model", "n_layer", "n_head", "d_head", "d_inner")
        if self.objective not in OBJECTIVES:
            raise ConfigError(f"model.objective must be one of {', '.join(OBJECTIVES)}, got {self.objective!r}")
        _fraction(self, "dropout", "dropatt")
        if self.mem_len < 0 or self.reuse_len < 0:
            raise ConfigError("model.mem_len and model.reuse_len must be >= 0")
        if self.d_model % 2:
            raise ConfigError(f"model.d_model must be even (sinusoidal positions), got {self.d_model}")


@dataclass
class DataConfig:
    seq_len: int = 512  # tokens per example: [reuse part | A <sep> B <sep> <cls>]
    perm_size: int | None = None  # factorisation-order block size; None = reuse_len (the original)
    num_predict: int = 85  # targets per example (about seq_len/6: K = 6 in the paper)
    mask_alpha: int = 6  # span context: each span of n units sits in about n*alpha/beta tokens
    mask_beta: int = 1
    mask_mode: Literal["word", "original"] = "word"  # word: spans of whole words; original: subword spans (bug #220)
    passes: int = 1  # passes over the corpus, each with its own file order and masks
    valid_fraction: float = 0.01  # held-out share of the corpus (shard) used for evaluation records
    seed: int = 42  # seed for preprocessing and the online factorisation order

    def __post_init__(self) -> None:
        _positive(self, "seq_len", "num_predict", "mask_alpha", "mask_beta", "passes")
        if not 0.0 <= self.valid_fraction < 1.0:
            raise ConfigError(f"data.valid_fraction must be in [0, 1), got {self.valid_fraction}")


@dataclass
class TrainConfig:
    global_batch_size: int = 2048  # sequences per optimizer step over all ranks (paper v2: 8192; v1: 2048)
    micro_batch_size: int = 16  # sequences per rank per forward/backward; accumulation = global / (micro * world)
    max_steps: int = 500_000  # optimizer steps
    lr: float = 4e-4  # peak learning rate
    warmup_steps: int = 40_000  # linear warmup from 0
    schedule: Literal["linear", "cosine", "constant"] = "linear"  # decay after warmup
    min_lr_ratio: float = 0.0  # decay ends at lr * min_lr_ratio
    weight_decay: float = 0.01  # decoupled (AdamW); not applied to LayerNorm weights or biases
    adam_betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-6
    clip_norm: float = 1.0  # global gradient-norm clip (0 = off)
    precision: Literal["fp32", "bf16", "fp16"] = "bf16"  # autocast dtype; fp16 uses a grad scaler
    compile: bool = False  # torch.compile the model
    activation_checkpointing: bool = False  # recompute each layer in backward to save memory
    deterministic: bool = True  # deterministic GPU kernels: bit-identical runs and resumes (cost: BENCHMARKS.md)
    peak_tflops: float = 0.0  # the device's bf16 peak for the logged MFU; 0 = from the GPU's name (flops.py)
    distributed: Literal["ddp", "fsdp"] = "ddp"  # strategy under torchrun (fsdp = FSDP2 fully_shard)
    eval_every: int = 10_000  # steps between evaluations on held-out records (0 = never)
    eval_batches: int = 50  # batches per evaluation
    save_every: int = 10_000  # steps between checkpoints (0 = only at the end)
    keep_last: int = 3  # checkpoints kept
    log_every: int = 10  # steps between metric lines
    seed: int = 1234  # model init, dropout and factorisation-order seed
    # linear probe on frozen features during pretraining (probe.py): a labelled TSV/CSV/JSONL file (classification),
    # split deterministically into probe-train / probe-valid; probe accuracy every probe_every steps (0 = off)
    probe_file: str | None = None
    probe_every: int = 0

    def __post_init__(self) -> None:
        _positive(self, "global_batch_size", "micro_batch_size", "max_steps", "keep_last", "log_every")
        if self.global_batch_size % self.micro_batch_size:
            raise ConfigError(
                f"train.global_batch_size ({self.global_batch_size}) must be a multiple of "
                f"train.micro_batch_size ({self.micro_batch_size})"
            )
        if self.lr <= 0:
            raise ConfigError(f"train.lr must be > 0, got {self.lr}")
        if self.peak_tflops < 0:
            raise ConfigError(f"train.peak_tflops must be >= 0 (0 = from the GPU's name), got {self.peak_tflops}")
        if self.warmup_steps < 0 or self.warmup_steps > self.max_steps:
            raise ConfigError(f"train.warmup_steps must be in [0, max_steps={self.max_steps}], got {self.warmup_steps}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigError(f"train.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.probe_every < 0:
            raise ConfigError(f"train.probe_every must be >= 0 (0 = off), got {self.probe_every}")
        if self.probe_file is not None and not self.probe_file.strip():
            raise ConfigError("train.probe_file is empty; give a labelled file (TSV/CSV/JSONL) or leave it unset")
        if self.probe_every > 0 and self.probe_file is None:
            raise ConfigError(
                f"train.probe_every={self.probe_every} needs train.probe_file (a labelled TSV/CSV/JSONL file)"
            )


@dataclass
class FinetuneConfig:
    max_seq_length: int = 128  # [A <sep> B <sep> <cls>], left padded (SQuAD: right padded)
    batch_size: int = 32  # sequences per optimizer step over all ranks
    micro_batch_size: int = 32  # per rank per forward/backward
    lr: float = 2e-5
    epochs: float = 3.0  # used when max_steps = 0
    max_steps: int = 0  # optimizer steps (0 = derive from epochs)
    warmup_ratio: float = 0.1  # share of steps spent in linear warmup
    layer_decay: float = 1.0  # layer-wise lr decay: layer l gets lr * rate^(n_layer-1-l) (SQuAD: 0.75)
    weight_decay: float = 0.01
    adam_eps: float = 1e-6
    clip_norm: float = 1.0
    dropout: float = 0.1
    dropatt: float = 0.1
    summary_type: Literal["last", "first", "mean", "attn"] = "last"  # sequence summary for classification heads
    summary_use_proj: bool = True  # dense(d, tanh) projection on the summary
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    eval_every: int = 0  # steps between evaluations (0 = every epoch)
    early_stopping_patience: int = 0  # stop after this many evaluations without improvement (0 = off)
    doc_stride: int = 128  # SQuAD: stride between windows of a long paragraph
    max_query_length: int = 64  # SQuAD: question tokens kept
    max_answer_length: int = 64  # SQuAD: longest predicted answer in tokens
    seed: int = 1234

    def __post_init__(self) -> None:
        _positive(self, "max_seq_length", "batch_size", "micro_batch_size", "lr", "doc_stride")
        _fraction(self, "dropout", "dropatt", "warmup_ratio")
        if self.batch_size % self.micro_batch_size:
            raise ConfigError(
                f"finetune.batch_size ({self.batch_size}) must be a multiple of "
                f"finetune.micro_batch_size ({self.micro_batch_size})"
            )
        if not 0.0 < self.layer_decay <= 1.0:
            raise ConfigError(f"finetune.layer_decay must be in (0, 1], got {self.layer_decay}")


@dataclass
class Config:
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)

    def __post_init__(self) -> None:
        m, d = self.model, self.data
        if m.reuse_len > d.seq_len:
            raise ConfigError(f"model.reuse_len ({m.reuse_len}) must be <= data.seq_len ({d.seq_len})")
        if d.seq_len - m.reuse_len < 5:
            raise ConfigError(
                f"data.seq_len - model.reuse_len must leave room for A <sep> B <sep> <cls> (>= 5), "
                f"got {d.seq_len} - {m.reuse_len}"
            )
        perm = d.perm_size if d.perm_size is not None else m.reuse_len
        if perm <= 0 or (m.reuse_len and m.reuse_len % perm) or (d.seq_len - m.reuse_len) % perm:
            raise ConfigError(
                f"data.perm_size ({perm}) must divide model.reuse_len ({m.reuse_len}) and "
                f"data.seq_len - model.reuse_len ({d.seq_len - m.reuse_len})"
            )
        if d.num_predict > d.seq_len - 2:
            raise ConfigError(f"data.num_predict ({d.num_predict}) must be <= data.seq_len - 2 ({d.seq_len - 2})")
        if self.tokenizer.vocab_size != m.vocab_size:
            raise ConfigError(
                f"tokenizer.vocab_size ({self.tokenizer.vocab_size}) must equal model.vocab_size ({m.vocab_size})"
            )
        if m.bi_data and self.train.micro_batch_size % 2:
            raise ConfigError(
                f"train.micro_batch_size ({self.train.micro_batch_size}) must be even with model.bi_data "
                "(each device's batch is half forward, half backward)"
            )

    @property
    def perm_size(self) -> int:
        return self.data.perm_size if self.data.perm_size is not None else self.model.reuse_len


SECTIONS = {f.name: f.type for f in dataclasses.fields(Config)}


# ----------------------------------------------------------------------------------------------------------------
# Loading, overriding, saving


def _positive(obj: Any, *names: str) -> None:
    section = _section_name(obj)
    for name in names:
        value = getattr(obj, name)
        if value <= 0:
            raise ConfigError(f"{section}.{name} must be > 0, got {value}")


def _fraction(obj: Any, *names: str) -> None:
    section = _section_name(obj)
    for name in names:
        value = getattr(obj, name)
        if not 0.0 <= value < 1.0:
            raise ConfigError(f"{section}.{name} must be in [0, 1), got {value}")


def _section_name(obj: Any) -> str:
    return {v: k for k, v in _SECTION_CLASSES.items()}.get(type(obj), type(obj).__name__)


_SECTION_CLASSES = {
    "tokenizer": TokenizerConfig,
    "model": ModelConfig,
    "data": DataConfig,
    "train": TrainConfig,
    "finetune": FinetuneConfig,
}


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against the annotation ``tp``; return it converted (int -> float, list -> tuple)."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin is Literal:
        if value not in typing.get_args(tp):
            choices = ", ".join(repr(a) for a in typing.get_args(tp))
            raise ConfigError(f"{key}: expected one of {choices}, got {value!r}")
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
        raise ConfigError(errors[0] if errors else f"{key}: invalid value {value!r}")
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise ConfigError(f"{key}: expected a list of {len(args)} values, got {value!r}")
        return tuple(_coerce(v, a, f"{key}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads 1e-3 (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return value
    raise ConfigError(f"{key}: unsupported type {tp}")  # pragma: no cover - a programming error


def _build_section(cls: type, values: dict[str, Any], section: str) -> Any:
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in values.items():
        if key not in known:
            raise ConfigError(f"unknown key {section}.{key} (known: {', '.join(sorted(known))})")
        kwargs[key] = _coerce(value, hints[key], f"{section}.{key}")
    return cls(**kwargs)


def config_from_dict(raw: dict[str, Any]) -> Config:
    """Build a validated Config from nested dicts (missing keys take their defaults)."""
    if not isinstance(raw, dict):
        raise ConfigError(f"the config must be a mapping of sections, got {type(raw).__name__}")
    sections = {}
    for name, values in raw.items():
        if name not in _SECTION_CLASSES:
            raise ConfigError(f"unknown section {name!r} (known: {', '.join(_SECTION_CLASSES)})")
        if values is None:
            values = {}
        if not isinstance(values, dict):
            raise ConfigError(f"section {name!r} must be a mapping, got {values!r}")
        sections[name] = _build_section(_SECTION_CLASSES[name], values, name)
    return Config(**sections)


def parse_override(item: str) -> tuple[str, str, Any]:
    """'section.key=value' -> (section, key, parsed value). The value is parsed as YAML (1e-4, true, [1, 2])."""
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected section.key=value")
    path, text = item.split("=", 1)
    parts = path.strip().split(".")
    if len(parts) != 2 or not all(parts):
        raise ConfigError(f"--set {item!r}: expected section.key=value, e.g. train.lr=1e-4")
    try:
        value = yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        value = text
    return parts[0], parts[1], value


def load_config(path: str | Path | None = None, overrides: typing.Sequence[str] = ()) -> Config:
    """Load a YAML config (or the defaults when ``path`` is None) and apply ``section.key=value`` overrides."""
    raw: dict[str, Any] = {}
    where = "defaults"
    if path is not None:
        p = Path(path)
        where = str(p)
        if not p.is_file():
            raise ConfigError(f"config file not found: {p}")
        try:
            raw = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
        except (yaml.YAMLError, UnicodeDecodeError) as e:
            line = getattr(getattr(e, "problem_mark", None), "line", None)
            at = f" (line {line + 1})" if line is not None else ""
            raise ConfigError(f"{p}: not valid YAML{at}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{p}: the config must be a mapping of sections")
    raw = {k: dict(v) if isinstance(v, dict) else v for k, v in raw.items()}
    for item in overrides:
        section, key, value = parse_override(item)
        if section not in _SECTION_CLASSES:
            raise ConfigError(
                f"{where}: --set {item}: unknown section {section!r} (known: {', '.join(_SECTION_CLASSES)})"
            )
        if not isinstance(raw.get(section), dict):
            raw[section] = {}
        raw[section][key] = value
    try:
        return config_from_dict(raw)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None


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
    from .io import atomic_write_text

    path = Path(directory) / name
    atomic_write_text(path, dump_config(cfg))
    return path


def replace(cfg: Config, **sections: dict[str, Any]) -> Config:
    """A copy of ``cfg`` with some keys changed, re-validated: replace(cfg, model={"dropout": 0.0})."""
    raw = config_to_dict(cfg)
    for name, values in sections.items():
        raw[name].update(values)
    return config_from_dict(raw)
