"""The `xlnet` command line. Thin: parse arguments, load the config, call a plain function.

Each command's work lives in a stage module (data/shards/shard.py, train/pretrain.py, ...) whose functions tests call
directly; the packages and what each may import: docs/architecture.md.
Errors meant for the user (XLNetError, and click's usage errors) are printed on one line, `xlnet: error: ...`, and
exit with code 2, without a traceback.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click

from xlnetcli import __version__
from xlnetcli.config import PRESETS, SECTIONS, Config, load_config, parse_override
from xlnetcli.core.errors import ConfigError, Preempted, Terminated, XLNetError
from xlnetcli.core.shapes import dumps_strict
from xlnetcli.core.text import clip, printable

DEFAULT_CONFIG = "tiny"  # the preset pretrain uses when neither --config, the run nor the records carry a config
BUNDLED_CORPUS = Path(__file__).resolve().parents[2] / "data" / "pydocs" / "corpus.txt"


def inputs_or_bundled(inputs: tuple[str, ...]) -> tuple[str, ...]:
    """The given inputs, or the bundled Python-docs corpus when none are given (from a source checkout)."""
    if inputs:
        return inputs
    if not BUNDLED_CORPUS.is_file():
        raise XLNetError(
            "no input files given: pass text files, folders or globs (the bundled demo corpus, "
            "data/pydocs/corpus.txt, comes with a source checkout)"
        )
    click.echo(f"no inputs given: using the bundled corpus {BUNDLED_CORPUS}", err=True)
    return (str(BUNDLED_CORPUS),)


def config_options(f):
    """--config NAME|FILE and repeated --set section.key=value."""
    f = click.option(
        "--set",
        "overrides",
        multiple=True,
        metavar="SECTION.KEY=VALUE",
        help="Override one config key (repeatable), e.g. --set train.lr=1e-4.",
    )(f)
    f = click.option(
        "--config",
        "config_path",
        default=None,
        metavar="NAME|FILE",
        help=f"A preset ({', '.join(PRESETS)}) or a YAML file; `xlnet config show NAME` prints one.",
    )(f)
    return f


def text_field_option(f):
    """--text-field for JSONL, Parquet and datasets inputs."""
    return click.option(
        "--text-field",
        default="text",
        show_default=True,
        metavar="NAME",
        help="Field (JSONL) or column (Parquet, datasets folder) holding each document's text.",
    )(f)


def resolve_config(config_path: str | Path | None, overrides: tuple[str, ...], command: str) -> Config:
    """Load --config (a preset name or a file) with --set overrides, refusing keys that ``command`` does not read."""
    check_override_sections(overrides, command)
    return load_config(config_path, overrides)


# The options that set a run setting, one table: command -> {option (click parameter name): the config key it sets}.
# They apply after --config and --set; an option left out leaves the key as configured. The resolved config is
# saved next to the output. Every other option (paths, --resume, --overwrite, --workers, --quiet, ...) is an
# argument of the stage function.
SETTING_OPTIONS: dict[str, dict[str, str]] = {
    "tokenize train": {
        "vocab_size": "tokenizer.vocab_size",  # model.vocab_size follows (load_config): the model must match
        "character_coverage": "tokenizer.character_coverage",
        "input_sentence_size": "tokenizer.input_sentence_size",
        "input_sentence_bytes": "tokenizer.input_sentence_bytes",
        "seed": "tokenizer.seed",
        "threads": "tokenizer.threads",
        "uncased": "tokenizer.uncased",
        "keep_accents": "tokenizer.keep_accents",
    },
    "shard": {"valid_fraction": "data.valid_fraction", "seed": "data.seed"},
    "preprocess": {"passes": "data.passes", "mask_mode": "data.mask_mode"},
    "pretrain": {"init": "train.init"},
    "finetune": {},
}

# The config sections each command reads: a --set key of another section would be silently ignored, so it is refused.
# preprocess and pretrain write the resolved config next to their outputs, where the next command picks it up.
COMMAND_SECTIONS = {
    "tokenize train": ("tokenizer",),
    "shard": ("data",),
    "preprocess": ("tokenizer", "model", "data", "train"),
    "pretrain": ("tokenizer", "model", "data", "train"),
    "finetune": ("finetune",),
    "config show": tuple(SECTIONS),
}


def check_override_sections(overrides: Sequence[str], command: str) -> None:
    """Refuse ``--set`` keys of sections ``xlnet COMMAND`` does not read (they would be silently ignored)."""
    sections = COMMAND_SECTIONS[command]
    for item in overrides:
        section, key, _ = parse_override(item)
        if section in SECTIONS and section not in sections:
            reads = ", ".join(f"{s}.*" for s in sections)
            alt = next((s for s in sections if key in {f.name for f in dataclasses.fields(SECTIONS[s])}), None)
            hint = f"; did you mean {alt}.{key}?" if alt else ""
            raise ConfigError(
                f"--set {clip(item)}: xlnet {command} reads {reads}; {section}.{clip(key)} is not used{hint}"
            )


def _as_given(ctx: click.Context, name: str, value: Any) -> str:
    """How the user wrote an option, for messages: '--threads -1', '--cased'."""
    opt = next(p for p in ctx.command.params if p.name == name)
    if isinstance(opt, click.Option) and opt.is_flag:
        return opt.opts[0] if value else opt.secondary_opts[0]
    return f"{opt.opts[0]} {value}"


def with_config(command: str, default: Callable[[dict[str, Any]], str | Path | None] | None = None):
    """Turn the command's --config, --set and setting options (SETTING_OPTIONS) into one ``cfg`` argument.

    ``default(params)`` names the config to load when --config is not given (None: the defaults): an output's own
    config.yaml, read in today's spelling when an earlier version wrote it (config.upgrade_config)."""

    def wrap(f):
        @functools.wraps(f)
        def run(config_path: str | Path | None, overrides: tuple[str, ...], **params: Any) -> Any:
            ctx = click.get_current_context()
            settings = [
                (_as_given(ctx, name, value), key, value)
                for name, key in SETTING_OPTIONS[command].items()
                if (value := params.pop(name)) is not None
            ]
            check_override_sections(overrides, command)
            own = False  # an output's own config.yaml: an earlier version's is upgraded
            if config_path is None and default is not None:
                config_path, own = default(params), True
            return f(load_config(config_path, overrides, settings, upgrade=own), **params)

        return run

    return wrap


# `xlnet --help` lists the commands in the order of the pipeline (the README's), not alphabetically.
PIPELINE_ORDER = (
    "tokenize",
    "shard",
    "preprocess",
    "pretrain",
    "finetune",
    "eval",
    "probe",
    "export",
    "import",
    "plot",
    "config",
)


class _Group(click.Group):
    """Lists every command with its whole first docstring line (click cuts them at 45 characters), in PIPELINE_ORDER
    (commands not in it after those, as declared)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        rank = {name: i for i, name in enumerate(PIPELINE_ORDER)}
        return sorted(self.commands, key=lambda name: rank.get(name, len(rank)))  # stable: the rest as declared

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        """`xlnet shard merge PARTS...` is its own command, while `xlnet shard INPUTS...` stays one command (a group
        could not take variadic INPUTS): an input file named merge is written ./merge."""
        if args[:2] == ["shard", "merge"]:
            return "shard merge", shard_merge_cmd, args[2:]
        if args[:2] == ["preprocess", "merge"]:
            return "preprocess merge", preprocess_merge_cmd, args[2:]
        return super().resolve_command(ctx, args)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                rows.append((name, cmd.get_short_help_str(limit=200)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 120})
@click.version_option(__version__, prog_name="xlnet")
def cli() -> None:
    """XLNet from raw text: tokenize, shard, preprocess, pretrain, finetune, evaluate."""


# ---- commands are registered below, one section per module -------------------------------------------------------


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
        click.echo(f"xlnet: error: {_one_line(e.format_message())} (see '{where} --help')", err=True)
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
        from xlnetcli.core.files import is_disk_full

        if is_disk_full(e):
            click.echo(
                f"xlnet: error: disk full while writing {e.filename or 'output'}; free space and rerun", err=True
            )
            sys.exit(2)
        click.echo(f"xlnet: error: {e.strerror or e}{f': {e.filename}' if e.filename else ''}", err=True)
        sys.exit(2)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    sys.exit(0)


def _one_line(message: str) -> str:
    return clip(" ".join(message.split()).rstrip("."), 300)


# ---- config ----
@cli.group("config", cls=_Group)
def config_group() -> None:
    """Print presets and resolved configs (presets ship in the package: tiny, base, large, glue, squad, race,
    demo)."""


@config_group.command("show")
@click.argument("name", required=False, metavar="[NAME|FILE]")
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="SECTION.KEY=VALUE",
    help="Override one config key (repeatable), e.g. --set train.lr=1e-4.",
)
def config_show_cmd(name: str | None, overrides: tuple[str, ...]) -> None:
    """Print the resolved YAML of a preset or file (the defaults without NAME) after --set overrides.

    Save it to start your own config: xlnet config show base --set train.lr=2e-4 > my.yaml"""
    from xlnetcli.config import dump_config

    click.echo(dump_config(resolve_config(name, overrides, "config show")), nl=False)


# ---- plot ----
@cli.command("plot")
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


# ---- pretrain ----
@cli.command("pretrain")
@config_options
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
    "--init",
    default=None,
    metavar="CHECKPOINT",
    type=click.Path(resolve_path=True),  # absolute in config.yaml: the run records where it started
    help="Continue pretraining from this checkpoint (train.init): one of our runs or step folders (pretrained or "
    "finetuned), a Hugging Face XLNet directory, or a model.safetensors beside its config.json. Its architecture "
    "and tokenizer are the run's; optimizer, schedule and data start fresh.",
)
@click.option(
    "--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N (torchrun: cuda:LOCAL_RANK)."
)
@click.option("--quiet", is_flag=True, help="No progress bar or summary.")
@with_config("pretrain", default=lambda p: _pretrain_config_path(p["data_dir"], p["out_dir"], p["resume"]))
def pretrain_cmd(cfg: Config, data_dir: Path, out_dir: Path, resume: str | None, device: str, quiet: bool) -> None:
    """Pretrain with permutation LM on preprocessed records (torchrun --nproc-per-node N for several processes).

    Without --config the run's config (when resuming) or the records' config is used; --set overrides keys.
    With --init the run continues a checkpoint's pretraining (--config continue-tiny/-base/-large); resuming such a
    run takes its own latest checkpoint (--init, if given again, must name the same checkpoint).
    """
    from xlnetcli.train.pretrain import pretrain

    pretrain(cfg, data_dir, out_dir, resume=resume, device=device, quiet=quiet)


def _pretrain_config_path(data_dir: Path, out_dir: Path, resume: str | None) -> Path | str:
    from xlnetcli.train.pretrain import pretrain_config_path

    return pretrain_config_path(data_dir, out_dir, resume) or DEFAULT_CONFIG


# ---- hf (export / import) ----------------------------------------------------------------------------------------


@cli.command("export")
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


@cli.command("import")
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


# ---- tokenizer ----

# --tokenizer of `tokenize encode` and `shard`: every path checkpoint.folders.find_tokenizer accepts
TOKENIZER_HELP = (
    "A tokenizer folder (xlnet tokenize train), a spiece.model file, a transformers XLNet directory (spiece.model + "
    "tokenizer_config.json, e.g. a copy of xlnet-base-cased), or the tokenizer/ of a run (its latest step), step "
    "folder, shards or records folder."
)


@cli.group("tokenize")
def tokenize_group() -> None:
    """Train a SentencePiece tokenizer (XLNet ids 0-8) or encode text with one."""


@tokenize_group.command("train")
@config_options
@click.argument("inputs", nargs=-1)
@click.option("--out", "out_dir", required=True, type=click.Path(path_type=Path), help="Tokenizer directory to create.")
@click.option("--vocab-size", type=int, default=None, help="Vocabulary size (default tokenizer.vocab_size).")
@click.option("--character-coverage", type=float, default=None, help="Character coverage (original: 0.99995).")
@click.option("--input-sentence-size", type=int, default=None, help="Lines sampled for training at most (0 = all).")
@click.option(
    "--input-sentence-bytes", type=int, default=None, help="UTF-8 bytes sampled for training at most (0 = no limit)."
)
@click.option("--seed", type=click.IntRange(0, 2**32 - 1), default=None, help="Seed of the sample (tokenizer.seed).")
@click.option("--threads", type=int, default=None, help="Trainer threads (0 = all cores).")
@click.option(
    "--workers", type=click.IntRange(min=1), default=1, show_default=True, help="Normalising processes (same model)."
)
@click.option("--uncased/--cased", default=None, help="Lowercase before encoding (default tokenizer.uncased).")
@click.option("--keep-accents/--strip-accents", default=None, help="Keep accents (default: strip, as the original).")
@text_field_option
@click.option("--overwrite", is_flag=True, help="Replace an existing tokenizer directory.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@with_config("tokenize train")
def tokenize_train_cmd(
    cfg: Config, inputs: tuple[str, ...], out_dir: Path, workers: int, text_field: str, overwrite: bool, quiet: bool
) -> None:
    """Train a SentencePiece unigram tokenizer on text, JSONL or Parquet files, datasets folders, directories or globs.

    Files may be .gz or .zst compressed, and text or JSONL may be URLs (https://, s3://, gs://, az://, hf://: the
    `remote` extra). Without INPUTS, the bundled corpus (data/pydocs/corpus.txt) is used."""
    from xlnetcli.core.console import console
    from xlnetcli.data.tokenizer import train_tokenizer

    tok = train_tokenizer(
        cfg,
        inputs_or_bundled(inputs),
        out_dir,
        overwrite=overwrite,
        quiet=quiet,
        text_field=text_field,
        workers=workers,
    )
    console.print(
        f"wrote {out_dir}/ spiece.model, xlnet_tokenizer.json, tokenizer.json (vocab {tok.vocab_size}, "
        f"uncased={tok.uncased}, keep_accents={tok.keep_accents}, sha256 {tok.sha256[:12]})"
    )


@tokenize_group.command("encode")
@click.argument("file", required=False, type=click.Path(path_type=Path))
@click.option(
    "--tokenizer",
    "tok_path",
    required=True,
    type=click.Path(path_type=Path),
    help=TOKENIZER_HELP,
)
@click.option("--text", default=None, help="Encode this text instead of a file.")
@click.option("--ids", "as_ids", is_flag=True, help="Print ids instead of pieces.")
def tokenize_encode_cmd(file: Path | None, tok_path: Path, text: str | None, as_ids: bool) -> None:
    """Print the pieces (or ids) of --text or of each line of FILE ('-' = stdin), one output line per input line."""
    from xlnetcli.checkpoint.folders import find_tokenizer
    from xlnetcli.data.tokenizer import Tokenizer

    if (text is None) == (file is None):
        raise XLNetError("pass either --text TEXT or a FILE to encode")
    tok = Tokenizer.load(find_tokenizer(tok_path))

    def show(line: str) -> None:
        ids = tok.encode_ids(line)
        click.echo(" ".join(map(str, ids)) if as_ids else " ".join(tok.id_to_piece(i) for i in ids))

    if text is not None:
        show(text)
    elif str(file) == "-":
        for line in click.open_file("-"):  # stdin, as click.get_text_stream("stdin") (deprecated in click 8.5)
            show(line)
    else:
        from xlnetcli.data.corpus.reader import expand_inputs, iter_lines

        assert file is not None  # exactly one of --text and FILE, checked above
        for line in iter_lines(expand_inputs([file])):
            show(line)


# ---- shard ----


@cli.command("shard")
@config_options
@click.argument("inputs", nargs=-1)
@click.option(
    "--tokenizer",
    "tok_path",
    required=True,
    type=click.Path(path_type=Path),
    help=TOKENIZER_HELP,
)
@click.option("--out", "out_dir", required=True, type=click.Path(path_type=Path), help="Shard directory to create.")
@click.option(
    "--shards",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Number of train shards (balanced by tokens).",
)
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True, help="Tokenisation processes.")
@click.option(
    "--valid-fraction",
    type=click.FloatRange(0, 1, max_open=True),
    default=None,
    help="Share of documents held out for validation (default data.valid_fraction).",
)
@click.option(
    "--valid",
    "valid_inputs",
    multiple=True,
    metavar="FILE",
    help="Validation file(s) or URL(s) instead of a random fraction (repeatable).",
)
@click.option(
    "--seed", type=click.IntRange(0, 2**32 - 1), default=None, help="Seed of the validation split (default data.seed)."
)
@text_field_option
@click.option(
    "--part",
    metavar="I/N",
    default=None,
    help="Write only part I of N (0-based: 0..N-1, e.g. $SLURM_ARRAY_TASK_ID/8) into --out, a part folder; whole "
    "input files are dealt to parts by size. Combine the N parts with `xlnet shard merge PARTS... --out DIR`: "
    "byte-identical to one host.",
)
@click.option("--overwrite", is_flag=True, help="Replace an existing shard directory.")
@click.option("--quiet", is_flag=True, help="No progress bar or summary.")
@with_config("shard")
def shard_cmd(
    cfg: Config,
    inputs: tuple[str, ...],
    tok_path: Path,
    out_dir: Path,
    shards: int,
    workers: int,
    valid_inputs: tuple[str, ...],
    text_field: str,
    part: str | None,
    overwrite: bool,
    quiet: bool,
) -> None:
    """Tokenise text, JSONL or Parquet files, datasets folders, directories or globs into N balanced shards + valid.

    Files may be .gz or .zst compressed, and text or JSONL may be URLs (https://, s3://, gs://, az://, hf://: the
    `remote` extra). Without INPUTS, the bundled corpus (data/pydocs/corpus.txt) is used. Across machines: each runs
    `xlnet shard ... --part I/N --out parts/I`, then `xlnet shard merge parts/* --out DIR` combines them."""
    from xlnetcli.checkpoint.folders import find_tokenizer
    from xlnetcli.core.console import console
    from xlnetcli.data.shards.shard import shard_corpus

    if valid_inputs and click.get_current_context().params["valid_fraction"] is not None:
        raise XLNetError("pass either --valid-fraction or --valid FILE, not both")
    args = (cfg, inputs_or_bundled(inputs), out_dir, find_tokenizer(tok_path))
    kw: dict[str, Any] = {"shards": shards, "workers": workers, "valid_inputs": valid_inputs, "overwrite": overwrite}
    if part is not None:
        from xlnetcli.data.shards.parts import parse_part, shard_part

        index, n_parts = parse_part(part)
        files = shard_part(*args, (index, n_parts), **kw, quiet=quiet, text_field=text_field)["files"]
        if not quiet:
            console.print(
                f"wrote part {index}/{n_parts} ({len(files)} file(s), {sum(f['documents'] for f in files):,} docs, "
                f"{sum(f['tokens'] for f in files):,} tokens) to {out_dir}; combine all {n_parts} parts with "
                f"`xlnet shard merge PARTS... --out DIR`"
            )
        return
    s = shard_corpus(*args, **kw, quiet=quiet, text_field=text_field)
    if not quiet:
        console.print(
            f"wrote {shards} train shard(s) ({s.tokens['train']:,} tokens, {s.documents['train']:,} docs) "
            f"+ valid ({s.tokens['valid']:,} tokens, {s.documents['valid']:,} docs) to {out_dir} in "
            f"{s.seconds:.1f} s ({s.mb_per_s:.1f} MB/s, {s.tokens_per_s / 1e3:.0f}K tokens/s)"
        )


@click.command("merge", context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 120})
@click.argument("parts", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--out", "out_dir", required=True, type=click.Path(path_type=Path), help="Shard directory to create.")
@click.option("--overwrite", is_flag=True, help="Replace an existing shard directory.")
@click.option("--quiet", is_flag=True, help="No summary.")
def shard_merge_cmd(parts: tuple[Path, ...], out_dir: Path, overwrite: bool, quiet: bool) -> None:
    """Combine the N part folders of `xlnet shard --part I/N` into one shard directory, byte-identical to one host.

    PARTS in any order; all N parts of one run (same inputs, tokenizer, config and --shards), each once, every file
    matching its sha256. The assignment of documents to shards happens here (reading and writing only)."""
    from xlnetcli.core.console import console
    from xlnetcli.data.shards.parts import merge_shard_parts

    s = merge_shard_parts(parts, out_dir, overwrite=overwrite, quiet=quiet)
    if not quiet:
        console.print(
            f"merged {len(parts)} part(s): {s.tokens['train']:,} train tokens ({s.documents['train']:,} docs) + valid "
            f"({s.tokens['valid']:,} tokens, {s.documents['valid']:,} docs) to {out_dir} in {s.seconds:.1f} s"
        )


# ---- finetune / eval ---------------------------------------------------------------------------------------------


def column_options(f):
    """Column choices for TSV/CSV/JSONL classification and regression files (GLUE names are found by default)."""
    f = click.option(
        "--no-header",
        is_flag=True,
        help="TSV/CSV without a header row: columns are 0-based indices (e.g. CoLA: --text-a-column 3 "
        "--label-column 1).",
    )(f)
    f = click.option(
        "--label-column",
        default=None,
        metavar="NAME",
        help="Label column (default: label, gold_label, score, is_duplicate, Quality, ...).",
    )(f)
    f = click.option(
        "--text-b-column",
        default=None,
        metavar="NAME",
        help="Second text column, '' for none (default: sentence2, question2, ... when present).",
    )(f)
    f = click.option(
        "--text-a-column",
        default=None,
        metavar="NAME",
        help="First text column (default: text, sentence, sentence1, question1, question, ...).",
    )(f)
    return f


def _columns(text_a: str | None, text_b: str | None, label: str | None):
    from xlnetcli.data.labelled import Columns

    return Columns(text_a, text_b, label)


@cli.command("finetune")
@config_options
@click.option(
    "--task",
    required=True,
    type=click.Choice(["classification", "regression", "multiple-choice", "squad"]),
    help="classification/regression: TSV/CSV/JSONL; multiple-choice: JSONL; squad: SQuAD v1.1/v2.0 JSON.",
)
@click.option("--train", "train_file", required=True, type=click.Path(path_type=Path), help="Training file.")
@click.option(
    "--valid",
    "valid_file",
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
@click.option("--out", "out_dir", required=True, type=click.Path(path_type=Path), help="Run folder.")
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
@click.option(
    "--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N (torchrun: cuda:LOCAL_RANK)."
)
@click.option("--quiet", is_flag=True, help="No progress bar or summary.")
@with_config("finetune", default=lambda p: _finetune_config_path(p["init"]))
def finetune_cmd(
    cfg: Config,
    task: str,
    train_file: Path,
    valid_file: Path | None,
    init: Path,
    out_dir: Path,
    text_a_column: str | None,
    text_b_column: str | None,
    label_column: str | None,
    no_header: bool,
    from_scratch: bool,
    overwrite: bool,
    resume: bool,
    device: str,
    quiet: bool,
) -> None:
    """Finetune a pretrained XLNet on a labelled file (torchrun --nproc-per-node N for several processes).

    The architecture and tokenizer come from --init; finetuning settings from --config (presets glue, squad, race),
    else the checkpoint's own config, then --set finetune.KEY=VALUE.
    """
    from xlnetcli.train.finetune import finetune

    finetune(
        cfg,
        task,
        train_file,
        valid_file,
        init,
        out_dir,
        columns=_columns(text_a_column, text_b_column, label_column),
        header=not no_header,
        overwrite=overwrite,
        device=device,
        quiet=quiet,
        from_scratch=from_scratch,
        resume=resume,
    )


def _finetune_config_path(init: Path) -> Path | None:
    from xlnetcli.train.finetune import finetune_config_path

    return finetune_config_path(init)


@cli.command("eval")
@click.argument("ckpt", type=click.Path(path_type=Path))
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
@click.option(
    "--output",
    default=None,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write the results as JSON to this file.",
)
@click.option("--batch-size", type=click.IntRange(min=1), default=None, help="Examples per forward pass.")
@click.option(
    "--null-odds-threshold",
    type=float,
    default=None,
    help="SQuAD 2.0: predict no answer above this null odds (default: the one found on validation).",
)
@column_options
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
def eval_cmd(
    ckpt: Path,
    file: Path | None,
    data_dir: Path | None,
    split: str,
    batches: int | None,
    predict_file: Path | None,
    output: Path | None,
    batch_size: int | None,
    null_odds_threshold: float | None,
    text_a_column: str | None,
    text_b_column: str | None,
    label_column: str | None,
    no_header: bool,
    device: str,
) -> None:
    """Evaluate a checkpoint: a finetuned one on --file (task metrics), a pretrained one on --data (PLM metrics).

    Prints the results as JSON on stdout.
    """

    from xlnetcli.evaluate.checkpoint_eval import evaluate

    kwargs: dict = {"device": device}
    if data_dir is not None:
        kwargs.update(split=split, batches=batches)
    else:
        kwargs.update(
            columns=_columns(text_a_column, text_b_column, label_column),
            header=not no_header,
            batch_size=batch_size,
            null_odds_threshold=null_odds_threshold,
        )
    res = evaluate(ckpt, file=file, data=data_dir, predict=predict_file, output=output, **kwargs)
    click.echo(dumps_strict(res, indent=2))


@cli.command("probe")
@click.argument("ckpt", type=click.Path(path_type=Path))
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
    "--output",
    default=None,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write the results as JSON to this file.",
)
@column_options
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
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
@click.option(
    "--train-sizes",
    default=None,
    metavar="N,N,...",
    help="Also refit the probe on draws of N training rows each (label efficiency: accuracy against the "
    "number of labelled examples; `xlnet plot` draws it from --output).",
)
def probe_cmd(
    ckpt: Path,
    train_file: Path,
    valid_file: Path,
    baseline: str | None,
    output: Path | None,
    text_a_column: str | None,
    text_b_column: str | None,
    label_column: str | None,
    no_header: bool,
    max_seq_length: int | None,
    batch_size: int,
    seed: int,
    device: str,
    train_sizes: str | None,
) -> None:
    """Linear probe on frozen features (mean-pooled and <cls>) of a checkpoint, optionally against random init.

    Prints a table of validation accuracies on stdout; --output writes the full result (held-out scores, L2) as JSON.
    """
    from xlnetcli.evaluate.probe import format_table, probe

    try:
        sizes = [int(n) for n in train_sizes.split(",")] if train_sizes else []
    except ValueError:
        raise click.BadParameter(
            f"expected comma-separated integers, got {train_sizes!r}", param_hint="--train-sizes"
        ) from None
    res = probe(
        ckpt,
        train_file,
        valid_file,
        baseline=baseline,
        output=output,
        columns=_columns(text_a_column, text_b_column, label_column),
        header=not no_header,
        max_seq_length=max_seq_length,
        batch_size=batch_size,
        seed=seed,
        device=device,
        train_sizes=sizes,
    )
    click.echo(format_table(res))


# ---- preprocess ----


@cli.command("preprocess")
@click.option(
    "--shards", "shards", required=True, type=click.Path(path_type=Path), help="Shard directory (xlnet shard)."
)
@click.option("--out", "out", required=True, type=click.Path(path_type=Path), help="Records directory to create.")
@config_options
@click.option(
    "--passes",
    type=click.IntRange(min=1),
    default=None,
    help="Passes over the corpus, each with its own file order and masks (default data.passes).",
)
@click.option(
    "--mask-mode",
    type=click.Choice(["word", "original"]),
    default=None,
    help="word: spans of whole words (default data.mask_mode); original: the original's subword spans.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Worker processes (output is identical).",
)
@click.option("--no-verify", is_flag=True, help="Skip checking the shards' sha256 against manifest.json.")
@click.option(
    "--part",
    metavar="I/N",
    default=None,
    help="Build only part I of N (0-based: 0..N-1) of the rows of every pass into --out, a part folder; combine the N "
    "parts with `xlnet preprocess merge PARTS... --out DIR`: byte-identical to one host.",
)
@click.option("--overwrite", is_flag=True, help="Replace an existing records directory.")
@with_config("preprocess")
def preprocess_cmd(
    cfg: Config, shards: Path, out: Path, workers: int, no_verify: bool, part: str | None, overwrite: bool
) -> None:
    """Build permutation-LM records (examples, segment ids, prediction targets) from shards."""
    from xlnetcli.core.console import print0
    from xlnetcli.data.records.preprocess import preprocess
    from xlnetcli.data.shards.parts import parse_part

    which = parse_part(part) if part is not None else None
    meta = preprocess(cfg, shards, out, overwrite=overwrite, workers=workers, verify=not no_verify, part=which)
    if which is not None:
        print0(
            f"wrote part {which[0]}/{which[1]} (rows {meta['rows'][0]}..{meta['rows'][1] - 1}) to {out}; combine all "
            f"{which[1]} parts with `xlnet preprocess merge PARTS... --out DIR`"
        )
        return
    tr = meta["splits"]["train"]
    print0(
        f"wrote {out}: {tr['examples']} training examples ({tr['passes']} pass(es) x {tr['steps_per_pass']} steps "
        f"x {meta['global_batch_size']} rows), seq_len {meta['seq_len']}, mask mode {meta['mask_mode']}; they read "
        f"the tokens from {shards} (keep it)"
    )


@click.command("merge", context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 120})
@click.argument("parts", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--out", "out", required=True, type=click.Path(path_type=Path), help="Records directory to create.")
@click.option("--overwrite", is_flag=True, help="Replace an existing records directory.")
def preprocess_merge_cmd(parts: tuple[Path, ...], out: Path, overwrite: bool) -> None:
    """Combine the N part folders of `xlnet preprocess --part I/N` into one records directory, byte-identical to one
    host. PARTS in any order; all N parts of one run (same shards, config and tokenizer), each once, every part's rows
    matching their sha256."""
    from xlnetcli.core.console import print0
    from xlnetcli.data.records.parts import merge_record_parts

    meta = merge_record_parts(parts, out, overwrite=overwrite)
    print0(f"merged {len(parts)} part(s) into {out}: {meta['splits']['train']['examples']} training examples")
