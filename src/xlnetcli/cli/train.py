"""`xlnet pretrain` and `xlnet finetune`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from xlnetcli.cli.options import DEFAULT_CONFIG, column_options, device_option, examples, quiet_option, with_config
from xlnetcli.config import Config

if TYPE_CHECKING:
    pass


def _pretrain_config_path(data_dir: Path, out_dir: Path, resume: str | None) -> Path | str:
    from xlnetcli.train.pretrain import pretrain_config_path

    return pretrain_config_path(data_dir, out_dir, resume) or DEFAULT_CONFIG


@click.command(
    "pretrain",
    epilog=examples(
        "xlnet pretrain --data runs/records --out runs/tiny --config tiny",
        "xlnet pretrain --data runs/records --out runs/tiny --resume           # continue it exactly",
        "xlnet pretrain --data runs/records --out runs/tiny --resume 200 --branch runs/tiny-b   # from step 200, anew",
        "xlnet pretrain --init runs/tiny --config continue-tiny --data runs/b-records --out runs/tiny-b",
    ),
)
@click.option(
    "--data", "data_dir", required=True, type=click.Path(path_type=Path), help="Records folder (xlnet preprocess)."
)
@click.option(
    "--out", "out_dir", required=True, type=click.Path(path_type=Path), help="Run folder (checkpoints, metrics)."
)
@click.option(
    "--resume",
    default=None,
    is_flag=False,
    flag_value="latest",
    metavar="[latest|STEP]",
    help="Continue the run in --out exactly, from its latest checkpoint or a given step.",
)
@click.option(
    "--branch",
    default=None,
    metavar="NEWRUN",
    type=click.Path(path_type=Path),
    help="With --resume STEP: continue from that checkpoint in the new run folder NEWRUN (--out kept as it is); "
    "then continue NEWRUN itself with --out NEWRUN --resume.",
)
@click.option(
    "--rewind",
    is_flag=True,
    help="With --resume STEP: continue from that checkpoint in place, the later step folders and metric rows moved "
    "aside into --out/rewound_LAST_to_STEP/ (without it, a resume from a step with later checkpoints is refused).",
)
@click.option(
    "--init",
    default=None,
    metavar="CHECKPOINT",
    type=click.Path(resolve_path=True),  # absolute in config.yaml: the run records where it started
    help="Continue pretraining from this checkpoint (train.init): one of our runs or step folders (pretrained or "
    "finetuned), a Hugging Face XLNet directory, or a model.safetensors beside its config.json. Its architecture "
    "and tokenizer are the run's; optimizer, schedule and data start fresh.",
)
@device_option
@quiet_option
@with_config("pretrain", default=lambda p: _pretrain_config_path(p["data_dir"], p["out_dir"], p["resume"]))
def pretrain_cmd(
    cfg: Config,
    data_dir: Path,
    out_dir: Path,
    resume: str | None,
    branch: Path | None,
    rewind: bool,
    device: str,
    quiet: bool,
) -> None:
    """Pretrain with permutation LM on preprocessed records (torchrun --nproc-per-node N for several processes).

    Without --config the run's config (when resuming) or the records' config is used; --set overrides keys.
    With --init the run continues a checkpoint's pretraining (--config continue-tiny/-base/-large); resuming such a
    run takes its own latest checkpoint (--init, if given again, must name the same checkpoint).
    """
    from xlnetcli.train.pretrain import pretrain

    pretrain(cfg, data_dir, out_dir, resume=resume, device=device, quiet=quiet, branch=branch, rewind=rewind)


def _finetune_config_path(init: Path) -> Path | None:
    from xlnetcli.train.finetune import finetune_config_path

    return finetune_config_path(init)


@click.command(
    "finetune",
    epilog=examples(
        "xlnet finetune --task classification --train data/pydocs/task_train.tsv "
        "--valid data/pydocs/task_valid.tsv --init runs/tiny --out runs/pydocs-cls --config tiny",
        "xlnet finetune --task regression --train STS-B/train.tsv --valid STS-B/dev.tsv --init runs/base "
        "--out runs/stsb --config glue --set finetune.lr=5e-5",
    ),
)
@click.option(
    "--task",
    required=True,
    type=click.Choice(["classification", "regression", "multiple-choice", "squad"]),
    help="classification/regression: TSV/CSV/JSONL; multiple-choice: JSONL; squad: SQuAD v1.1/v2.0 JSON.",
)
@click.option("--train", "train", required=True, type=click.Path(path_type=Path), help="Training file.")
@click.option(
    "--valid",
    "valid",
    default=None,
    type=click.Path(path_type=Path),
    help="Validation file: evaluated every epoch (or finetune.eval_every steps); the best checkpoint is kept.",
)
@click.option(
    "--init",
    "init",
    required=True,
    type=click.Path(path_type=Path),
    help="Pretrained checkpoint: a run folder, a step folder, or a Hugging Face XLNet directory (a "
    "finetuned one keeps its head when task and labels match).",
)
@click.option("--out", "out", required=True, type=click.Path(path_type=Path), help="Run folder.")
@column_options
@click.option(
    "--from-scratch",
    is_flag=True,
    help="Random weights with --init's architecture and tokenizer (a baseline for the pretrained model).",
)
@click.option("--overwrite", is_flag=True, help="Replace a non-empty output folder (once the new run completes).")
@click.option(
    "--resume",
    is_flag=True,
    help="Continue an interrupted run into --out exactly, from its latest checkpoint (same arguments).",
)
@device_option
@quiet_option
@with_config("finetune", default=lambda p: _finetune_config_path(p["init"]))
def finetune_cmd(cfg: Config, **args: Any) -> None:
    """Finetune a pretrained XLNet on a labelled file (torchrun --nproc-per-node N for several processes).

    The architecture and tokenizer come from --init; finetuning settings from --config (presets glue, squad, race),
    else the checkpoint's own config, then --set finetune.KEY=VALUE.
    """
    from xlnetcli.train.finetune import FinetuneArgs, finetune

    finetune(cfg, FinetuneArgs(**args))
