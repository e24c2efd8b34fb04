"""The config schema: one dataclass per section, each key with its type, default and allowed range (``ranged``).

The dataclasses are the single source of truth; YAML is their serialised form (loading.py). Building a section checks
its ranges, and building a Config runs the cross-key checks (checks.py). Values are the paper's (arXiv 1906.08237,
Tables 7-8) unless a comment says otherwise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from xlnetcli.config.checks import canonical_report_to, check_config, check_ranges
from xlnetcli.core.errors import ConfigError
from xlnetcli.core.text import short


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
    """A bound as a range message writes it: 1, not 1.0; 0.98 as is."""
    return str(int(x)) if integer or x == int(x) else repr(x)


def ranged(default: Any, spec: str) -> Any:
    """A numeric field with its allowed range: ``lr: float = ranged(4e-4, "(0, inf)")`` (tuples: every element).
    Bounds used below: 2147483647 = 2**31 - 1 (SentencePiece keeps sizes in int32), 4294967295 = 2**32 - 1 (the
    seed range numpy accepts)."""
    return field(default=default, metadata={"range": Range.parse(spec)})


def steps_or_word(default: Any, zero_was: Any, spelled: str) -> Any:
    """A cadence or length in optimizer steps (>= 1), or one of the words its type allows (``never``, ``epoch``,
    ``end``, ``eval``, or null), each meaning the same in train.* and finetune.*. Configs before config_version 2
    wrote 0 for a section's special case: ``zero_was`` is that case in today's spelling (loading.upgrade reads it so),
    ``spelled`` how the refusal of a new 0 names it."""
    return field(default=default, metadata={"range": Range.parse("[1, inf)"), "zero_was": zero_was, "spelled": spelled})


@dataclass
class TokenizerConfig:
    # SentencePiece unigram vocabulary, ids 0-8 fixed (data/special.py)
    vocab_size: int = ranged(32000, "[9, 2147483647]")
    character_coverage: float = ranged(0.99995, "[0.98, 1]")  # characters covered by the vocabulary (SentencePiece)
    input_sentence_size: int = ranged(10_000_000, "[0, 2147483647]")  # sentences sampled for training (0 = all)
    # UTF-8 bytes sampled for training at most (0 = no limit): SentencePiece's memory and time grow with the sample's
    # bytes (about 25 bytes of memory and 3 s per MB: BENCHMARKS.md), so long lines no longer multiply them
    input_sentence_bytes: int = ranged(32_000_000, "[0, inf)")
    seed: int = ranged(42, "[0, 4294967295]")  # seed of the training sample (drawn while the corpus is read)
    uncased: bool = False  # lowercase before encoding (the released xlnet-*-cased models keep case)
    keep_accents: bool = False  # False: NFKD + drop combining marks, as the original preprocess_text
    threads: int = ranged(0, "[0, 1024]")  # SentencePiece trainer threads (at most 1024); 0 = all cores

    def __post_init__(self) -> None:
        check_ranges(self, "tokenizer")


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
    # attention kernel (model/kernels.py); auto = fused on CPU, triton on CUDA (with triton and bf16; else sdpa eagerly,
    # einsum inside torch.compile)
    attn_impl: Literal["auto", "fused", "einsum", "sdpa", "flex", "triton"] = "auto"
    # pretraining objective on the same backbone, memory and records (the paper's Table 6 ablations;
    # data/records/stream.py):
    # plm = permutation LM (XLNet); mlm = <mask> at the targets, predicted by the content stream ("DAE +
    # Transformer-XL"); clm = the natural left-to-right order (Transformer-XL's LM), predicted by the query stream
    objective: Literal["plm", "mlm", "clm"] = "plm"

    def __post_init__(self) -> None:
        check_ranges(self, "model")
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
    # what a word is for span masking: spaces = pieces after a space (the original); cjk = also each piece starting
    # with a CJK ideograph, kana or Hangul (unspaced scripts; same as spaces on text without them). Pre-segmented text
    # (e.g. jieba output, spaces between words) with spaces: docs/xlnet.md §4
    word_rule: Literal["spaces", "cjk"] = "cjk"
    passes: int = ranged(1, "[1, inf)")  # passes over the corpus, each with its own file order and masks
    valid_fraction: float = ranged(0.01, "[0, 1)")  # held-out share of the corpus (shard) used for evaluation records
    seed: int = ranged(42, "[0, 4294967295]")  # seed for preprocessing and the online factorisation order

    def __post_init__(self) -> None:
        check_ranges(self, "data")


@dataclass
class TrainConfig:
    global_batch_size: int = ranged(2048, "[1, inf)")  # sequences per optimizer step over all ranks (v2: 8192)
    micro_batch_size: int = ranged(16, "[1, inf)")  # sequences per rank per forward/backward; accumulation follows
    max_steps: int = ranged(500_000, "[1, inf)")  # optimizer steps (a number: pretraining has no epochs)
    lr: float = ranged(4e-4, "(0, inf)")  # peak learning rate
    warmup_steps: int = ranged(40_000, "[0, inf)")  # linear warmup from 0 (at most max_steps)
    schedule: Literal["linear", "cosine", "constant"] = "linear"  # decay after warmup
    min_lr_ratio: float = ranged(0.0, "[0, 1]")  # decay ends at lr * min_lr_ratio
    weight_decay: float = ranged(0.01, "[0, inf)")  # decoupled (AdamW); not applied to LayerNorm weights or biases
    adam_betas: tuple[float, float] = ranged((0.9, 0.999), "[0, 1)")
    adam_eps: float = ranged(1e-6, "(0, inf)")
    clip_norm: float = ranged(1.0, "[0, inf)")  # global gradient-norm clip (0 = off)
    # autocast dtype; fp16 uses a grad scaler; auto = bf16 on a CUDA GPU with bf16, else fp32 (a CPU runs bf16 about
    # 2x slower), resolved once at the start of a run: the run's config.yaml records the value used
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    compile: bool = False  # torch.compile the model
    # pretraining memory padded to model.mem_len from the first step, padding masked: the same maths, every step the
    # same shapes (CUDA graphs / torch.compile mode="reduce-overhead" capture one step)
    static_shapes: bool = False
    # replay each compiled layer as a CUDA graph (torch.compile mode="reduce-overhead"): the host launches one graph
    # per layer and direction instead of its kernels; needs compile and static_shapes, one CUDA process, and no
    # activation checkpointing
    cuda_graphs: bool = False
    activation_checkpointing: bool = False  # recompute each layer in backward to save memory
    deterministic: bool = True  # deterministic GPU kernels: bit-identical runs and resumes (cost: BENCHMARKS.md)
    peak_tflops: float = ranged(0.0, "[0, inf)")  # device bf16 peak for the logged MFU; 0 = from the GPU's name
    distributed: Literal["ddp", "fsdp"] = "ddp"  # strategy under torchrun (fsdp = FSDP2 fully_shard)
    # steps between evaluations on held-out records, or never ("epoch" is finetuning's: pretraining has no epochs)
    eval_every: int | Literal["never", "epoch"] = steps_or_word(10_000, "never", "never (no evaluation)")
    eval_batches: int = ranged(50, "[1, inf)")  # batches per evaluation
    # steps between resumable checkpoints, or end (only at the end) or eval (at every evaluation)
    save_every: int | Literal["end", "eval"] = steps_or_word(10_000, "end", "end (only at the end) or eval")
    keep_last: int = ranged(3, "[1, inf)")  # checkpoints kept
    log_every: int = ranged(10, "[1, inf)")  # steps between metric lines
    seed: int = ranged(1234, "[0, 4294967295]")  # model init, dropout and factorisation-order seed
    # trackers besides metrics.jsonl, a list or comma string of tensorboard, wandb, mlflow; none; auto = TensorBoard
    # when installed (extras: pip install 'xlnetcli[wandb]', 'xlnetcli[mlflow]')
    report_to: str | list[str] = "auto"
    # linear probe on frozen features during pretraining (evaluate/probe.py): a labelled TSV/CSV/JSONL file
    # (classification), split deterministically into probe-train / probe-valid; probe accuracy every probe_every
    # steps (0 = off)
    probe_file: str | None = None
    probe_every: int = ranged(0, "[0, inf)")
    # continued pretraining (`xlnet pretrain --init`): the checkpoint the weights start from (our run or step folder,
    # pretrained or finetuned; an HF XLNet directory); None = random init. Its architecture is the run's.
    init: str | None = None

    def __post_init__(self) -> None:
        check_ranges(self, "train")
        if self.eval_every == "epoch":
            raise ConfigError("train.eval_every=epoch: pretraining has no epochs; give steps (e.g. 10000) or never")
        self.report_to = canonical_report_to(self.report_to, "train.report_to")
        if self.init is not None and not self.init.strip():
            raise ConfigError("train.init is empty; give a checkpoint (run, step or HF folder) or leave it unset")
        if self.probe_file is not None and not self.probe_file.strip():
            raise ConfigError("train.probe_file is empty; give a labelled file (TSV/CSV/JSONL) or leave it unset")


@dataclass
class FinetuneConfig:
    max_seq_length: int = ranged(128, "[5, inf)")  # [A <sep> B <sep> <cls>], left padded (SQuAD: right padded)
    batch_size: int = ranged(32, "[1, inf)")  # sequences per optimizer step over all ranks
    micro_batch_size: int = ranged(32, "[1, inf)")  # per rank per forward/backward
    # steps of similar lengths, padded less: an epoch's order sorted by length within windows of this many steps, the
    # steps of a window shuffled (0 = off); 16 halved the training time of the bundled tasks at the same accuracy
    length_buckets: int = ranged(16, "[0, inf)")
    lr: float = ranged(2e-5, "(0, inf)")
    epochs: float = ranged(3.0, "(0, inf)")  # used when max_steps is null
    # optimizer steps; null = derive from epochs
    max_steps: int | None = steps_or_word(None, None, "null (derive from finetune.epochs)")
    warmup_ratio: float = ranged(0.1, "[0, 1)")  # share of steps spent in linear warmup
    layer_decay: float = ranged(1.0, "(0, 1]")  # layer-wise lr decay: layer l gets lr * rate^(n_layer-1-l); SQuAD 0.75
    weight_decay: float = ranged(0.01, "[0, inf)")
    adam_eps: float = ranged(1e-6, "(0, inf)")
    clip_norm: float = ranged(1.0, "[0, inf)")  # global gradient-norm clip (0 = off)
    dropout: float = ranged(0.1, "[0, 1)")
    dropatt: float = ranged(0.1, "[0, 1)")
    summary_type: Literal["last", "first", "mean", "attn"] = "last"  # sequence summary for classification heads
    summary_use_proj: bool = True  # dense(d, tanh) projection on the summary
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "fp32"  # as train.precision (auto: bf16 on a GPU, else fp32)
    peak_tflops: float = ranged(0.0, "[0, inf)")  # as train.peak_tflops (the logged MFU), for finetuning runs
    log_every: int = ranged(10, "[1, inf)")  # steps between metric lines
    # steps between evaluations, or epoch (at the end of every epoch) or never (the last model is kept); the last
    # step is always evaluated unless never
    eval_every: int | Literal["never", "epoch"] = steps_or_word("epoch", "epoch", "epoch (every epoch) or never")
    early_stopping_patience: int = ranged(0, "[0, inf)")  # stop after this many evaluations without gain (0 = off)
    # steps between resumable checkpoints, or eval (at every evaluation) or end (only at the end)
    save_every: int | Literal["end", "eval"] = steps_or_word("eval", "eval", "eval (at every evaluation) or end")
    doc_stride: int = ranged(128, "[1, inf)")  # SQuAD: stride between windows of a long paragraph
    max_query_length: int = ranged(64, "[1, inf)")  # SQuAD: question tokens kept
    max_answer_length: int = ranged(64, "[1, inf)")  # SQuAD: longest predicted answer in tokens
    seed: int = ranged(1234, "[0, 4294967295]")
    report_to: str | list[str] = "auto"  # as train.report_to, for finetuning runs
    # How a text longer than one window (max_seq_length tokens) is read in finetune, eval and probe
    # (docs/long-documents.md): first = its first window only; window-mean = every window on its own, the outputs
    # averaged; memory = the windows in order with the Transformer-XL memory carried (Dai §3.2), the prediction from
    # the last window's <cls>
    document: Literal["first", "window-mean", "memory"] = "first"
    max_windows: int = ranged(8, "[1, 4096]")  # windows read per text (document != first); the rest is cut
    grad_windows: int = ranged(1, "[1, inf)")  # memory: gradient through the last k windows, the memory detached beyond
    mem_len: int | None = ranged(None, "[1, inf)")  # memory: states kept from earlier windows; null = max_seq_length

    @property
    def memory_length(self) -> int:
        """The memory a ``memory`` reading keeps: finetune.mem_len, or one window when null."""
        return self.mem_len or self.max_seq_length

    def __post_init__(self) -> None:
        check_ranges(self, "finetune")
        self.report_to = canonical_report_to(self.report_to, "finetune.report_to")


@dataclass
class Config:
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)

    def __post_init__(self) -> None:
        check_config(self)  # what every config must satisfy (one process, no particular stage)

    @property
    def perm_size(self) -> int:
        return self.data.perm_size if self.data.perm_size is not None else self.model.reuse_len


SECTIONS = {
    "tokenizer": TokenizerConfig,
    "model": ModelConfig,
    "data": DataConfig,
    "train": TrainConfig,
    "finetune": FinetuneConfig,
}
