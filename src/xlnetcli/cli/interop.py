"""`xlnet export` and `xlnet import`: checkpoints to and from Hugging Face directories."""

from __future__ import annotations

from pathlib import Path

import click

from xlnetcli.cli.options import examples


@click.command(
    "export",
    epilog=examples(
        "xlnet export runs/tiny --out runs/tiny-hf",
        "xlnet export runs/pydocs-cls --out runs/pydocs-encoder --backbone-only   # the transformer alone",
    ),
)
@click.argument("ckpt", type=click.Path(path_type=Path))
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["hf"]),
    default="hf",
    show_default=True,
    help="Output format (hf: a transformers directory: XLNetLMHeadModel for a pretrained checkpoint, "
    "XLNetForSequenceClassification / ForMultipleChoice / ForQuestionAnswering with its head for a "
    "finetuned one, + XLNetTokenizer).",
)
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Output directory.")
@click.option(
    "--backbone-only", is_flag=True, help="Export the transformer alone (XLNetModel), without the LM or task head."
)
@click.option("--overwrite", is_flag=True, help="Replace a non-empty output directory.")
def export_cmd(ckpt: Path, fmt: str, out: Path, backbone_only: bool, overwrite: bool) -> None:
    """Export a checkpoint (run dir or step folder, pretrained or finetuned) as a Hugging Face directory."""
    from xlnetcli.checkpoint.hf_dir import describe_export
    from xlnetcli.core.console import console
    from xlnetcli.interop.huggingface import export_hf

    export_hf(ckpt, out, overwrite=overwrite, backbone_only=backbone_only)
    console.print(
        f"exported {ckpt} -> {out} as {describe_export(out)} (config.json, model.safetensors, spiece.model, "
        "tokenizer.json)"
    )


@click.command(
    "import",
    epilog=examples(
        "xlnet import --from-hf runs/tiny-hf --out runs/tiny-again",
        "xlnet import --from-hf xlnet-base-cased/ --out runs/base   # a local copy of a released model",
    ),
)
@click.option(
    "--from-hf",
    "hf_dir",
    type=click.Path(path_type=Path),
    required=True,
    help="A Hugging Face XLNet directory (config.json + model.safetensors or pytorch_model.bin).",
)
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Output checkpoint folder.")
@click.option("--overwrite", is_flag=True, help="Replace a non-empty output directory.")
def import_cmd(hf_dir: Path, out: Path, overwrite: bool) -> None:
    """Turn a Hugging Face XLNet directory into an xlnet checkpoint folder (with its task head when it has one)."""
    from xlnetcli.checkpoint.hf_dir import import_summary
    from xlnetcli.core.console import console
    from xlnetcli.interop.huggingface import import_hf

    import_hf(hf_dir, out, overwrite=overwrite)
    console.print(f"imported {hf_dir} -> {out}: {import_summary(out)}")
