"""`xlnet eval` and `xlnet probe`: scoring checkpoints (their shared options: options.scoring_options)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from xlnetcli.cli.options import examples, scoring_options
from xlnetcli.core.shapes import dumps_strict


@click.command(
    "eval",
    epilog=examples(
        "xlnet eval runs/tiny --data runs/records                  # PLM loss, perplexity, target accuracy",
        "xlnet eval runs/pydocs-cls --file data/pydocs/task_valid.tsv --output runs/pydocs-cls/valid.json",
        "xlnet eval runs/sst2 --file SST-2/test.tsv --predict sst2_test.tsv   # predictions; labels not needed",
    ),
)
@scoring_options
@click.option(
    "--file",
    "file",
    default=None,
    type=click.Path(path_type=Path),
    help="Finetuned checkpoint: the labelled file to score (unlabelled is fine with --predict).",
)
@click.option(
    "--data",
    "data_dir",
    default=None,
    type=click.Path(path_type=Path),
    help="Pretrained checkpoint: preprocessed records (xlnet preprocess) -> PLM loss, perplexity, accuracy.",
)
@click.option("--split", default="valid", show_default=True, help="Records split to evaluate (with --data).")
@click.option(
    "--batches",
    type=click.IntRange(min=1),
    default=None,
    help="With --data: at most this many micro-batches (default all).",
)
@click.option(
    "--predict",
    "predict_file",
    default=None,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write one prediction per example (.jsonl, or .tsv with index/id and prediction).",
)
@click.option("--batch-size", type=click.IntRange(min=1), default=None, help="Examples per forward pass.")
@click.option(
    "--precision",
    type=click.Choice(["auto", "fp32", "bf16", "fp16"]),
    default=None,
    help="Autocast precision (default: with --file the run's finetune.precision, with --data auto: bf16 on a CUDA "
    "GPU with bf16, else fp32).",
)
@click.option(
    "--null-odds-threshold",
    type=float,
    default=None,
    help="SQuAD 2.0: predict no answer above this null odds (default: the one found on validation).",
)
def eval_cmd(
    ckpt: Path, output: Path | None, file: Path | None, data_dir: Path | None, predict_file: Path | None, **options: Any
) -> None:
    """Evaluate a checkpoint: a finetuned one on --file (task metrics), a pretrained one on --data (PLM metrics).

    Prints the results as JSON on stdout.
    """
    from xlnetcli.core.console import is_rank0
    from xlnetcli.evaluate.checkpoint_eval import evaluate

    # the options of the checkpoint's kind: --data reads the records' split; --file its columns, header, batch size,
    # null-odds threshold (evaluate ignores the other kind's)
    res = evaluate(ckpt, file=file, data=data_dir, predict=predict_file, output=output, **options)
    if is_rank0():  # under torchrun: printed once
        click.echo(dumps_strict(res, indent=2))


@click.command(
    "probe",
    epilog=examples(
        "xlnet probe runs/tiny --train data/pydocs/order_train.tsv --valid data/pydocs/order_valid.tsv "
        "--baseline random",
        "xlnet probe runs/tiny --train data/pydocs/order_train.tsv --valid data/pydocs/order_valid.tsv "
        "--train-sizes 50,200,800 --output runs/tiny/curve.json",
    ),
)
@scoring_options
@click.option(
    "--train",
    "train_file",
    required=True,
    type=click.Path(path_type=Path),
    help="Labelled file (TSV/CSV/JSONL, as finetuning reads) the probe is trained on.",
)
@click.option(
    "--valid",
    "valid_file",
    required=True,
    type=click.Path(path_type=Path),
    help="Labelled file the probe is scored on (never used to choose anything).",
)
@click.option(
    "--baseline",
    type=click.Choice(["random"]),
    default=None,
    help="Also probe the same architecture at its random initialisation (the run's train.seed).",
)
@click.option(
    "--max-seq-length",
    type=click.IntRange(min=5),
    default=None,
    help="Tokens per example (default: the checkpoint's finetune.max_seq_length).",
)
@click.option(
    "--batch-size", type=click.IntRange(min=1), default=64, show_default=True, help="Examples per forward pass."
)
@click.option(
    "--seed",
    type=click.IntRange(0, 2**32 - 1),
    default=0,
    show_default=True,
    help="Seed of the held-out split that picks L2.",
)
@click.option(
    "--train-sizes",
    default=None,
    metavar="N,N,...",
    help="Also refit the probe on draws of N training rows each (label efficiency: accuracy against the "
    "number of labelled examples; `xlnet plot` draws it from --output).",
)
def probe_cmd(ckpt: Path, train_file: Path, valid_file: Path, train_sizes: str | None, **kw: Any) -> None:
    """Linear probe on frozen features (mean-pooled and <cls>) of a checkpoint, optionally against random init.

    Prints a table of validation accuracies on stdout; --output writes the full result (held-out scores, L2) as JSON.
    """
    from xlnetcli.evaluate.probe import ProbeSettings, format_table, probe

    try:
        sizes = [int(n) for n in train_sizes.split(",")] if train_sizes else []
    except ValueError:
        raise click.BadParameter(
            f"expected comma-separated integers, got {train_sizes!r}", param_hint="--train-sizes"
        ) from None
    how = {k: kw.pop(k) for k in ("max_seq_length", "batch_size", "seed", "device")}
    click.echo(format_table(probe(ckpt, train_file, valid_file, ProbeSettings(**how, train_sizes=sizes), **kw)))
