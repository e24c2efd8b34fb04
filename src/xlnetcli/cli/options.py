"""What the commands share: the config options (--config, --set and the options that set a config key), the option
blocks several commands take, and the examples each command's --help ends with."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click

from xlnetcli.config import PRESETS, SECTIONS, Config, load_config, parse_override
from xlnetcli.core.errors import ConfigError, XLNetError
from xlnetcli.core.text import clip

DEFAULT_CONFIG = "tiny"  # the preset pretrain uses when neither --config, the run nor the records carry a config
BUNDLED_CORPUS = Path(__file__).resolve().parents[3] / "data" / "pydocs" / "corpus.txt"

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

# The --set example each command's help shows: a key of a section it reads (COMMAND_SECTIONS; tests load each one
# through the command's own check).
SET_EXAMPLES = {
    "tokenize train": "tokenizer.vocab_size=8000",
    "shard": "data.valid_fraction=0.02",
    "preprocess": "data.num_predict=64",
    "pretrain": "train.lr=1e-4",
    "finetune": "finetune.lr=3e-5",
    "config show": "train.lr=2e-4",
}

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

# --tokenizer of `tokenize encode` and `shard`: every path checkpoint.folders.find_tokenizer accepts
TOKENIZER_HELP = (
    "A tokenizer folder (xlnet tokenize train), a spiece.model file, a transformers XLNet directory (spiece.model + "
    "tokenizer_config.json, e.g. a copy of xlnet-base-cased), or the tokenizer/ of a run (its latest step), step "
    "folder, shards or records folder."
)


def preset_list() -> str:
    """Every preset by use, from the PRESETS table: 'pretraining: tiny, ...; continued pretraining (pretrain --init):
    continue-tiny, ...; finetuning: glue, ...'."""
    groups: dict[str, list[str]] = {"pretraining": [], "continued pretraining (pretrain --init)": [], "finetuning": []}
    for name, file in PRESETS.items():
        kind = "finetuning" if file.startswith("finetune/") else "pretraining"
        groups["continued pretraining (pretrain --init)" if name.startswith("continue-") else kind].append(name)
    return "; ".join(f"{use}: {', '.join(names)}" for use, names in groups.items() if names)


def examples(*lines: str) -> str:
    """A command's epilog: its example command lines, kept as written (click's \\b: no rewrapping)."""
    return "\b\nExamples:\n" + "\n".join(f"  {line}" for line in lines)


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


# ---- config ----------------------------------------------------------------------------------------------------


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


def resolve_config(config_path: str | Path | None, overrides: tuple[str, ...], command: str) -> Config:
    """Load --config (a preset name or a file) with --set overrides, refusing keys that ``command`` does not read."""
    check_override_sections(overrides, command)
    return load_config(config_path, overrides)


def set_option(command: str):
    """Repeated --set section.key=value, with an example the command accepts."""
    reads = ", ".join(f"{s}.*" for s in COMMAND_SECTIONS[command])
    return click.option(
        "--set",
        "overrides",
        multiple=True,
        metavar="SECTION.KEY=VALUE",
        help=f"Override one config key (repeatable; this command reads {reads}), e.g. --set {SET_EXAMPLES[command]}.",
    )


def _as_given(ctx: click.Context, name: str, value: Any) -> str:
    """How the user wrote an option, for messages: '--threads -1', '--cased'."""
    opt = next(p for p in ctx.command.params if p.name == name)
    if isinstance(opt, click.Option) and opt.is_flag:
        return opt.opts[0] if value else opt.secondary_opts[0]
    return f"{opt.opts[0]} {value}"


def with_config(command: str, default: Callable[[dict[str, Any]], str | Path | None] | None = None):
    """--config NAME|FILE, repeated --set and the command's setting options (SETTING_OPTIONS) as one ``cfg`` argument.

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

        run = set_option(command)(run)
        return click.option(
            "--config",
            "config_path",
            default=None,
            metavar="NAME|FILE",
            help=f"A YAML file or a preset ({preset_list()}); `xlnet config show NAME` prints one.",
        )(run)

    return wrap


# ---- option blocks ---------------------------------------------------------------------------------------------


def text_field_option(f):
    """--text-field for JSONL, Parquet and datasets inputs."""
    return click.option(
        "--text-field",
        default="text",
        show_default=True,
        metavar="NAME",
        help="Field (JSONL) or column (Parquet, datasets folder) holding each document's text.",
    )(f)


def tokenizer_option(f):
    """--tokenizer of `tokenize encode` and `shard`."""
    return click.option("--tokenizer", "tok_path", required=True, type=click.Path(path_type=Path), help=TOKENIZER_HELP)(
        f
    )


def device_option(f):
    return click.option(
        "--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N (torchrun: cuda:LOCAL_RANK)."
    )(f)


def quiet_option(f):
    return click.option("--quiet", is_flag=True, help="No progress bar or summary.")(f)


def output_option(f):
    return click.option(
        "--output",
        default=None,
        type=click.Path(dir_okay=False, path_type=Path),
        help="Also write the results as JSON to this file.",
    )(f)


def column_options(f=None, *, label: bool = True):
    """Column choices for TSV/CSV/JSONL classification and regression files (GLUE names are found by default); the
    command gets one ``columns`` (data.labelled.Columns) and ``header``. ``label=False`` (``@column_options(label=
    False)``): the text columns alone, for a command that reads no labels."""
    if f is None:
        return functools.partial(column_options, label=label)

    @functools.wraps(f)
    def run(text_a_column: str | None, text_b_column: str | None, no_header: bool, **kw):
        from xlnetcli.data.labelled import Columns

        label_column = kw.pop("label_column", None)
        return f(columns=Columns(text_a_column, text_b_column, label_column), header=not no_header, **kw)

    run = click.option(
        "--no-header",
        is_flag=True,
        help="TSV/CSV without a header row: columns are 0-based indices (e.g. CoLA: --text-a-column 3"
        + (" --label-column 1)." if label else ")."),
    )(run)
    if label:
        run = click.option(
            "--label-column",
            default=None,
            metavar="NAME",
            help="Label column (default: label, gold_label, score, is_duplicate, Quality, ...).",
        )(run)
    run = click.option(
        "--text-b-column",
        default=None,
        metavar="NAME",
        help="Second text column, '' for none (default: sentence2, question2, ... when present).",
    )(run)
    return click.option(
        "--text-a-column",
        default=None,
        metavar="NAME",
        help="First text column (default: text, sentence, sentence1, question1, question, ...).",
    )(run)


def scoring_options(f):
    """What `xlnet eval` and `xlnet probe` share: the checkpoint, --output, the labelled file's columns, --device,
    --quiet."""
    f = click.option("--quiet", is_flag=True, help="No progress bar (or, redirected, progress lines) on stderr.")(f)
    f = click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")(f)
    f = column_options(f)
    f = output_option(f)
    return click.argument("ckpt", type=click.Path(path_type=Path))(f)


def document_options(f):
    """How a text is read (finetune.max_seq_length, finetune.document; docs/long-documents.md): --max-seq-length,
    --document, --max-windows, --mem-len, each defaulting to the checkpoint's finetune section."""
    f = click.option(
        "--max-seq-length",
        type=click.IntRange(min=5),
        default=None,
        help="Tokens per example, or per window with --document (default: the checkpoint's finetune.max_seq_length).",
    )(f)
    f = click.option(
        "--mem-len",
        type=click.IntRange(min=1),
        default=None,
        help="With --document memory: states kept from earlier windows (default: the checkpoint's finetune.mem_len, "
        "null: a window).",
    )(f)
    f = click.option(
        "--max-windows",
        type=click.IntRange(1, 4096),
        default=None,
        help="With --document memory or window-mean: windows read per text, the rest cut (default: the "
        "checkpoint's finetune.max_windows).",
    )(f)
    return click.option(
        "--document",
        type=click.Choice(["first", "window-mean", "memory"]),
        default=None,
        help="How a text longer than --max-seq-length is read: its first window; every window apart, averaged; or "
        "the windows in order through XLNet's memory (default: the checkpoint's finetune.document).",
    )(f)


# ---- --part I/N ------------------------------------------------------------------------------------------------


def part_option(what: str, merge: str):
    """--part I/N of a stage split across machines, parsed to (I, N) (data/parts.py); ``merge`` combines the parts."""

    def parse(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[int, int] | None:
        from xlnetcli.data.parts import parse_part

        return None if value is None else parse_part(value)

    return click.option(
        "--part",
        metavar="I/N",
        default=None,
        callback=parse,
        help="Write only part I of N (0-based: 0..N-1, e.g. $SLURM_ARRAY_TASK_ID/8) into --out, a part folder: "
        f"{what}. Combine the N parts with `xlnet {merge} PARTS... --out DIR`: byte-identical to one host.",
    )


def say_part_written(part: tuple[int, int], what: str, out: Path, merge: str) -> None:
    """The line a part run ends with: what it wrote and how to combine the parts."""
    from xlnetcli.core.console import print0

    index, n = part
    print0(f"wrote part {index}/{n} ({what}) to {out}; combine all {n} parts with `xlnet {merge} PARTS... --out DIR`")


class Group(click.Group):
    """Lists its commands in the order they were added (the pipeline's), each with its whole first docstring line
    (click cuts them at 45 characters)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                rows.append((name, cmd.get_short_help_str(limit=200)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)
