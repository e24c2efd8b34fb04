"""`xlnet eval`, `xlnet probe` and `xlnet embed`: scoring checkpoints and reading features out of them (their shared
options: options.scoring_options, options.column_options, options.document_options)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from xlnetcli.cli.options import column_options, document_options, examples, scoring_options
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
        "xlnet probe runs/tiny --train data/pydocs/task_train.tsv --valid data/pydocs/task_valid.tsv "
        "--max-seq-length 32 --document memory --max-windows 4   # long texts through the memory",
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
@document_options
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
    keys = ("max_seq_length", "document", "max_windows", "mem_len", "batch_size", "seed", "device")
    how = {k: kw.pop(k) for k in keys}
    click.echo(format_table(probe(ckpt, train_file, valid_file, ProbeSettings(**how, train_sizes=sizes), **kw)))


@click.command(
    "embed",
    epilog=examples(
        "xlnet embed runs/tiny --file data/pydocs/task_valid.tsv --out runs/tiny-emb        # mean.npy, cls.npy, "
        "index.tsv",
        "xlnet embed runs/tiny --file data/pydocs/task_valid.tsv --out runs/tiny-emb-doc --max-seq-length 32 "
        "--document memory --max-windows 8   # long texts through the memory",
        "xlnet embed runs/pydocs-cls --file texts.txt --out runs/emb --pool mean --layers all --format jsonl",
    ),
)
@click.argument("ckpt", type=click.Path(path_type=Path))
@click.option(
    "--file",
    "file",
    required=True,
    type=click.Path(path_type=Path),
    help="The texts: a TSV/CSV/JSONL table (as finetuning reads; labels not needed) or a .txt file, one text a line.",
)
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Output directory.")
@click.option(
    "--pool",
    default="mean,cls",
    show_default=True,
    metavar="mean,cls",
    help="Features written: mean (over the text's tokens) and/or cls (its final <cls> state).",
)
@click.option(
    "--layers",
    type=click.Choice(["last", "all"]),
    default="last",
    show_default=True,
    help="last: the last layer's states, [N, d]; all: the embedding then every layer, [N, n_layer + 1, d].",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["npy", "jsonl"]),
    default="npy",
    show_default=True,
    help="npy: a float32 array per pool + index.tsv; jsonl: embeddings.jsonl, one object per text. Both: meta.json.",
)
@document_options
@click.option("--batch-size", type=click.IntRange(min=1), default=64, show_default=True, help="Texts per forward pass.")
@click.option(
    "--precision",
    type=click.Choice(["auto", "fp32", "bf16", "fp16"]),
    default="auto",
    show_default=True,
    help="Autocast precision (auto: bf16 on a CUDA GPU with bf16, else fp32).",
)
@column_options(label=False)
@click.option(
    "--id-column", default=None, metavar="NAME", help="Column kept as each row's id (default: id, idx, index or guid)."
)
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
@click.option("--overwrite", is_flag=True, help="Replace a non-empty output directory.")
@click.option("--quiet", is_flag=True, help="No progress bar (or, redirected, progress lines) nor summary on stderr.")
def embed_cmd(ckpt: Path, file: Path, out: Path, pool: str, layers: str, fmt: str, **kw: Any) -> None:
    """Features of every text of a file (mean-pooled and <cls>, last layer or all), long texts read in windows.

    Writes DIR/mean.npy and cls.npy ([N, d] float32, rows in file order) with index.tsv, or embeddings.jsonl; and
    meta.json with the settings and checkpoint used.
    """
    from xlnetcli.evaluate.embed import EmbedSettings, embed, format_summary

    pools = tuple(p.strip() for p in pool.split(","))
    keys = ("max_seq_length", "document", "max_windows", "mem_len", "batch_size", "device", "precision")
    settings = EmbedSettings(pool=pools, layers=layers, format=fmt, **{k: kw.pop(k) for k in keys})
    res = embed(ckpt, file, out, settings, **kw)
    if not kw["quiet"]:
        click.echo(format_summary(res), err=True)
