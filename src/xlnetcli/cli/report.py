"""`xlnet plot` and `xlnet config`: what a run reports, and the configs."""

from __future__ import annotations

from pathlib import Path

import click

from xlnetcli.cli.options import Group, examples, preset_list, resolve_config, set_option


@click.group(
    "config",
    cls=Group,
    help=f"Print presets and resolved configs. Presets ship in the package: {preset_list()}.",
    epilog=examples("xlnet config show continue-base", "xlnet config show squad --set finetune.lr=3e-5"),
)
def config_group() -> None:
    pass


@config_group.command(
    "show",
    help="Print the resolved YAML of a preset or file (the defaults without NAME) after --set overrides.\n\n"
    f"NAME is a YAML file or a preset ({preset_list()}). Save the output to start your own config.",
    epilog=examples(
        "xlnet config show tiny",
        "xlnet config show base --set train.lr=2e-4 > my-base.yaml",
        "xlnet config show glue",
    ),
)
@click.argument("name", required=False, metavar="[NAME|FILE]")
@set_option("config show")
def config_show_cmd(name: str | None, overrides: tuple[str, ...]) -> None:
    from xlnetcli.config import dump_config

    click.echo(dump_config(resolve_config(name, overrides, "config show")), nl=False)


@click.command(
    "plot",
    epilog=examples(
        "xlnet plot runs/tiny                   # runs/tiny/curves.png",
        "xlnet plot runs/tiny/curve.json        # a probe's label-efficiency curve (xlnet probe --train-sizes)",
    ),
)
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="PNG path (default RUN_DIR/curves.png, or the probe JSON's path with .png).",
)
def plot_cmd(run_dir: Path, out: Path | None) -> None:
    """Plot loss, learning rate and throughput curves of a run as a PNG; given the JSON of `xlnet probe
    --train-sizes ... --output FILE`, plot its label-efficiency curve instead."""
    from xlnetcli.report.plot import plot_label_curve, plot_run

    click.echo(str(plot_label_curve(run_dir, out) if run_dir.is_file() else plot_run(run_dir, out)))
