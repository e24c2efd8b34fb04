"""The `xlnet` command line. Thin: parse arguments, load the config, call a plain function.

One module per command group (data.py: tokenize, shard, preprocess and their merges; train.py; evaluate.py;
interop.py; report.py: plot and config), the option blocks they share in options.py. Each command's work lives in a
stage module (data/shards/shard.py, train/pretrain.py, ...) whose functions tests call directly; the packages and
what each may import: docs/architecture.md. Errors meant for the user (XLNetError, and click's usage errors) are
printed on one line, `xlnet: error: ...`, and exit with code 2, without a traceback.
"""

from __future__ import annotations

import os
import sys

import click

from xlnetcli import __version__
from xlnetcli.cli.data import preprocess_cmd, preprocess_merge_cmd, shard_cmd, shard_merge_cmd, tokenize_group
from xlnetcli.cli.evaluate import embed_cmd, eval_cmd, probe_cmd
from xlnetcli.cli.interop import export_cmd, import_cmd
from xlnetcli.cli.options import BUNDLED_CORPUS, COMMAND_SECTIONS, SET_EXAMPLES, Group, check_override_sections
from xlnetcli.cli.report import config_group, plot_cmd
from xlnetcli.cli.train import finetune_cmd, pretrain_cmd
from xlnetcli.core.errors import Preempted, Terminated, XLNetError
from xlnetcli.core.text import clip, printable


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 120})
@click.version_option(__version__, prog_name="xlnet")
def cli() -> None:
    """XLNet from raw text: tokenize, shard, preprocess, pretrain, finetune, evaluate, embed."""


# In the order of the pipeline (the README's), which `xlnet --help` keeps.
for _command in (
    tokenize_group,
    shard_cmd,
    shard_merge_cmd,
    preprocess_cmd,
    preprocess_merge_cmd,
    pretrain_cmd,
    finetune_cmd,
    eval_cmd,
    probe_cmd,
    embed_cmd,
    export_cmd,
    import_cmd,
    plot_cmd,
    config_group,
):
    cli.add_command(_command)


def _check_utf8(args: list[str]) -> None:
    """Refuse an argument that is not UTF-8 (Python hands such bytes over as surrogates, which no file, tokenizer or
    JSON can take): one line showing its bytes."""
    for arg in args:
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            raw = os.fsencode(arg)
            raise XLNetError(f"argument {raw!r} is not valid UTF-8 text; pass text and paths in UTF-8") from None


def main(argv: list[str] | None = None) -> None:
    """Console entry point: user errors become one line on stderr and exit code 2; a preempted run exits 75."""
    try:
        _check_utf8(sys.argv[1:] if argv is None else argv)
        cli.main(args=argv, prog_name="xlnet", standalone_mode=False)
    except (click.exceptions.Abort, Terminated) as e:  # click turns KeyboardInterrupt (and Terminated) into Abort
        if isinstance(e, Terminated) or isinstance(e.__cause__, Terminated):
            click.echo("xlnet: terminated (SIGTERM); partial output removed", err=True)
            sys.exit(128 + 15)
        click.echo("xlnet: interrupted", err=True)
        sys.exit(130)
    except click.exceptions.NoArgsIsHelpError as e:  # `xlnet` or `xlnet tokenize` alone: the help text
        e.show()
        sys.exit(e.exit_code)
    except Preempted as e:  # SIGTERM: a checkpoint was written; not an error of the user's (said once, by rank 0)
        from xlnetcli.core.console import is_rank0

        if is_rank0():
            click.echo(f"xlnet: {e}", err=True)
        sys.exit(e.exit_code)
    except click.exceptions.UsageError as e:  # bad or missing option, unknown command: one line, with a pointer
        where = e.ctx.command_path if e.ctx is not None else "xlnet"
        message = _one_line(e.format_message())
        if (sys.argv[1:] if argv is None else argv)[:2] == ["preprocess", "merge"]:  # the earlier spelling
            where = "xlnet preprocess-merge"
            message = f"parts are combined with `{where} PARTS... --out DIR`"
        click.echo(f"xlnet: error: {message} (see '{where} --help')", err=True)
        sys.exit(2)
    except click.exceptions.ClickException as e:
        click.echo(f"xlnet: error: {_one_line(e.format_message())}", err=True)
        sys.exit(2)
    except XLNetError as e:
        click.echo(f"xlnet: error: {printable(str(e))}", err=True)  # one line, whatever a value in it held
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        click.echo("xlnet: interrupted", err=True)
        sys.exit(130)
    except OSError as e:
        from xlnetcli.core.files import copy_errors, is_disk_full, os_error_line

        if is_disk_full(e):
            target = e.filename or next((dst for _, dst, _ in copy_errors(e)), None)
            click.echo(f"xlnet: error: disk full while writing {target or 'output'}; free space and rerun", err=True)
            sys.exit(2)
        click.echo(f"xlnet: error: {printable(os_error_line(e))}", err=True)
        sys.exit(2)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    sys.exit(0)


def _one_line(message: str) -> str:
    return clip(" ".join(message.split()).rstrip("."), 300)


__all__ = ["BUNDLED_CORPUS", "COMMAND_SECTIONS", "SET_EXAMPLES", "check_override_sections", "cli", "main"]
