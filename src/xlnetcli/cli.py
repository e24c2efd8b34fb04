"""The `xlnet` command line. Thin: parse arguments, load the config, call a plain function.

Each command's work lives in a module (tokenizer.py, shard.py, ...) whose functions tests call directly.
Errors meant for the user (XLNetError) are printed on one line and exit non-zero, without a traceback.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from . import __version__
from .config import Config, load_config
from .errors import XLNetError

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "tiny.yaml"


def config_options(f):
    """--config FILE and repeated --set section.key=value."""
    f = click.option(
        "--set", "overrides", multiple=True, metavar="SECTION.KEY=VALUE",
        help="Override one config key (repeatable), e.g. --set train.lr=1e-4.",
    )(f)
    f = click.option(
        "--config", "config_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
        help="YAML config (configs/tiny.yaml, base.yaml, large.yaml).",
    )(f)
    return f


def resolve_config(config_path: Path | None, overrides: tuple[str, ...]) -> Config:
    return load_config(config_path, overrides)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="xlnet")
def cli() -> None:
    """XLNet from raw text: tokenize, shard, preprocess, pretrain, finetune, evaluate."""


# ---- commands are registered below, one section per module -------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    """Console entry point: user errors become one line on stderr and exit code 2."""
    try:
        cli.main(args=argv, prog_name="xlnet", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("xlnet: interrupted", err=True)
        sys.exit(130)
    except click.exceptions.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except XLNetError as e:
        click.echo(f"xlnet: error: {e}", err=True)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        click.echo("xlnet: interrupted", err=True)
        sys.exit(130)
    except OSError as e:
        from .io import is_disk_full

        if is_disk_full(e):
            click.echo(f"xlnet: error: disk full while writing {e.filename or 'output'}; free space and rerun", err=True)
            sys.exit(2)
        click.echo(f"xlnet: error: {e.strerror or e}{f': {e.filename}' if e.filename else ''}", err=True)
        sys.exit(2)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    sys.exit(0)


# ---- plot ----
@cli.command("plot")
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None, help="PNG path (default RUN_DIR/curves.png).")
def plot_cmd(run_dir: Path, out: Path | None) -> None:
    """Plot loss, learning rate and throughput curves of a run as a PNG."""
    from .plot import plot_run

    click.echo(str(plot_run(run_dir, out)))


# ---- pretrain ----
@cli.command("pretrain")
@config_options
@click.option("--data", "data_dir", required=True, type=click.Path(path_type=Path), help="Records folder (xlnet preprocess).")
@click.option("--out", "out_dir", required=True, type=click.Path(path_type=Path), help="Run folder (checkpoints, metrics).")
@click.option("--resume", default=None, is_flag=False, flag_value="latest", metavar="[latest|STEP]",
              help="Continue the run in --out exactly, from its latest checkpoint or a given step.")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N (torchrun: cuda:LOCAL_RANK).")
@click.option("--quiet", is_flag=True, help="No progress bar or summary.")
def pretrain_cmd(config_path: Path | None, overrides: tuple[str, ...], data_dir: Path, out_dir: Path,
                 resume: str | None, device: str, quiet: bool) -> None:
    """Pretrain with permutation LM on preprocessed records (torchrun --nproc-per-node N for several processes).

    Without --config the run's config (when resuming) or the records' config is used; --set overrides keys.
    """
    from .pretrain import pretrain, pretrain_config_path

    path = pretrain_config_path(config_path, data_dir, out_dir, resume) or DEFAULT_CONFIG
    cfg = resolve_config(path, overrides)
    pretrain(cfg, data_dir, out_dir, resume=resume, device=device, quiet=quiet)


# ---- hf (export / import) ----------------------------------------------------------------------------------------


@cli.command("export")
@click.argument("ckpt", type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["hf"]), default="hf", show_default=True,
              help="Output format (hf: transformers XLNetLMHeadModel + XLNetTokenizer directory).")
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Output directory.")
@click.option("--overwrite", is_flag=True, help="Replace a non-empty output directory.")
def export_cmd(ckpt: Path, fmt: str, out: Path, overwrite: bool) -> None:
    """Export a checkpoint (run dir or step folder) as a Hugging Face directory."""
    from .hf import export_hf
    from .log import console

    export_hf(ckpt, out, overwrite=overwrite)
    console.print(f"exported {ckpt} -> {out} (config.json, model.safetensors, spiece.model)")


@cli.command("import")
@click.option("--from-hf", "hf_dir", type=click.Path(path_type=Path), required=True,
              help="A Hugging Face XLNet directory (config.json + model.safetensors or pytorch_model.bin).")
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Output checkpoint folder.")
@click.option("--overwrite", is_flag=True, help="Replace a non-empty output directory.")
def import_cmd(hf_dir: Path, out: Path, overwrite: bool) -> None:
    """Turn a Hugging Face XLNet directory into an xlnet checkpoint folder."""
    from .hf import import_hf
    from .log import console

    import_hf(hf_dir, out, overwrite=overwrite)
    console.print(f"imported {hf_dir} -> {out}")
