"""Config checks: every key's type and range, and the checks that span keys or sections (``check_config``).

Every message is one line naming the key, the allowed values and a setting that works. The pretraining batch maths
(``batch_maths``) lives here too: it is the check that the batch sizes divide, and the layout the stages run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import types
import typing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from xlnetcli.config.sizes import check_fits
from xlnetcli.core.errors import ConfigError
from xlnetcli.core.text import short

if TYPE_CHECKING:  # the schema builds on these checks; the type is only named here
    from xlnetcli.config.schema import Config


# ----------------------------------------------------------------------------------------------------------------
# One key: type and range


def check_ranges(obj: Any, section: str) -> None:
    """Check every field of a section against its declared range (the one place numeric values are validated)."""
    for f in dataclasses.fields(obj):
        check_value(f, getattr(obj, f.name), f"{section}.{f.name}")


def check_value(f: dataclasses.Field, value: Any, key: str) -> None:
    """``value`` of field ``f`` (each element of a tuple) inside the field's declared range, if it declares one."""
    rng = f.metadata.get("range")
    if rng is None or value is None:
        return
    if "spelled" in f.metadata and value == 0 and not isinstance(value, bool):
        raise ConfigError(f"{key}=0 is no longer accepted: write {key}={f.metadata['spelled']}")
    for i, v in enumerate(value) if isinstance(value, tuple) else [(None, value)]:
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v not in rng:
            name = key if i is None else f"{key}[{i}]"
            raise ConfigError(f"{name} must be {rng.describe(isinstance(v, int))}, got {short(v)}")


def coerce(value: Any, tp: Any, key: str) -> Any:
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
                return coerce(value, arg, key)
            except ConfigError as e:
                errors.append(str(e))
        if len(errors) > 1 and any(typing.get_origin(a) is Literal for a in args):  # int | Literal["never", ...]
            forms = " or ".join(_expected(arg) for arg in args if arg is not type(None))
            raise ConfigError(f"{key}: expected {forms}, got {short(value)}")
        raise ConfigError(errors[0] if errors else f"{key}: invalid value {short(value)}")
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {short(value)}")
        return [coerce(v, typing.get_args(tp)[0], f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise ConfigError(f"{key}: expected a list of {len(args)} values, got {short(value)}")
        return tuple(coerce(v, a, f"{key}[{i}]") for i, (v, a) in enumerate(zip(value, args, strict=True)))
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
            with contextlib.suppress(ValueError):
                value = float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {short(value)}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {short(value)}")
        return value
    raise ConfigError(f"{key}: unsupported type {tp}")  # pragma: no cover - a programming error


def _expected(tp: Any) -> str:
    """How a message names the values of a simple type: 'an integer', "one of 'never', 'epoch'"."""
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(tp, str(tp))


TRACKERS = ("tensorboard", "wandb", "mlflow")


def canonical_report_to(value: str | list[str], key: str) -> str:
    """report_to as a canonical comma string: 'auto', 'none' or tracker names in the order given."""
    items = value.split(",") if isinstance(value, str) else list(value)
    names = list(dict.fromkeys(s.strip().lower() for s in items if s.strip()))
    allowed = (*TRACKERS, "auto", "none")
    bad = [n for n in names if n not in allowed]
    if not names or bad or (len(names) > 1 and ({"auto", "none"} & set(names))):
        raise ConfigError(f"{key}: expected 'auto', 'none' or a list of {', '.join(TRACKERS)}, got {short(value)}")
    return ",".join(names)


# ----------------------------------------------------------------------------------------------------------------
# Across keys: batch maths and the stages' checks


@dataclass(frozen=True)
class BatchMaths:
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


def batch_maths(cfg: Config, world: int = 1) -> BatchMaths:
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
    return BatchMaths(g, mb, world, g // (mb * world), bi, g // 2 if bi else g, reuse, rest)


# the stages that ask check_config() for more than every config satisfies
STAGES = ("preprocess", "pretrain", "finetune")


def check_config(cfg: Config, world: int = 1, stage: str | None = None, device: Any = None) -> None:
    """Every check that spans keys or sections, in one place. A check that fails raises a one-line ConfigError naming
    the keys and a setting that works (the batch maths itself: ``batch_maths``).

    Every Config runs it when built (one process, no stage): what any config must satisfy. A stage runs it once
    more with its name and number of processes for what that stage adds: ``preprocess`` and ``pretrain`` lay out or
    read permutation-LM records (a reuse part to predict in, span targets that fit both parts); ``pretrain`` and
    ``finetune`` split their batch over ``world`` processes. A stage also checks that its sizes fit the machine
    (sizes.py: host RAM, or the memory of a CUDA ``device``) before anything is allocated."""
    if stage is not None and stage not in STAGES:
        raise ValueError(f"check_config: unknown stage {stage!r} (stages: {', '.join(STAGES)})")
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
        raise ConfigError(
            f"data.perm_size ({P}) must divide model.reuse_len ({R}) and data.seq_len - model.reuse_len ({L - R})"
        )
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
    if ft.document == "memory" and ft.summary_type in ("first", "attn"):
        raise ConfigError(
            f"finetune.summary_type={ft.summary_type} does not read a document through its memory (the first window "
            "passes without gradient): use finetune.summary_type=last or mean with finetune.document=memory"
        )
    if ft.document != "first" and ft.grad_windows > ft.max_windows:
        raise ConfigError(
            f"finetune.grad_windows ({ft.grad_windows}) must be <= finetune.max_windows ({ft.max_windows}): "
            "gradient cannot flow through more windows than a document has"
        )
    ft_world = world if stage == "finetune" else 1
    if ft.batch_size % (ft.micro_batch_size * ft_world):
        processes = f" x processes ({ft_world})" if ft_world > 1 else ""
        raise ConfigError(
            f"finetune.batch_size ({ft.batch_size}) must be a multiple of "
            f"finetune.micro_batch_size ({ft.micro_batch_size}){processes}"
        )
    if t.cuda_graphs and (not (t.compile and t.static_shapes) or t.activation_checkpointing):
        raise ConfigError(
            "train.cuda_graphs needs train.compile=true and train.static_shapes=true, and "
            "train.activation_checkpointing=false (or set train.cuda_graphs=false)"
        )
    if t.cuda_graphs and stage == "pretrain" and world > 1:
        raise ConfigError(f"train.cuda_graphs runs in one process, got {world} (set train.cuda_graphs=false)")
    on = str(device).split(":")[0]  # a torch.device or its name; torch is not imported here
    if t.cuda_graphs and stage == "pretrain" and device is not None and on != "cuda":
        raise ConfigError(f"train.cuda_graphs needs a CUDA device, this run is on {on} (set train.cuda_graphs=false)")
    batch_maths(cfg, world if stage == "pretrain" else 1)  # the batch sizes divide
    if stage is not None:
        check_fits(cfg, stage, device)
