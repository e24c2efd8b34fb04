"""The data commands: `xlnet tokenize`, `xlnet shard`, `xlnet preprocess`, and the merges of their `--part I/N`
runs (`xlnet shard-merge`, `xlnet preprocess-merge`: commands of their own, so an input file may be called merge)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from xlnetcli.cli.options import (
    Group,
    examples,
    inputs_or_bundled,
    part_option,
    quiet_option,
    say_part_written,
    text_field_option,
    tokenizer_option,
    with_config,
)
from xlnetcli.config import Config
from xlnetcli.core.errors import DataError, XLNetError

INPUTS_HELP = (
    "Files may be .gz or .zst compressed, and text or JSONL may be URLs (https://, s3://, gs://, az://, hf://: the "
    "`remote` extra). Without INPUTS, the bundled corpus (data/pydocs/corpus.txt) is used."
)


@click.group(
    "tokenize",
    cls=Group,
    epilog=examples(
        "xlnet tokenize train data/pydocs/corpus.txt --out runs/tok --vocab-size 8000",
        'xlnet tokenize encode --tokenizer runs/tok --text "In 2000, the café opened."',
    ),
)
def tokenize_group() -> None:
    """Train a SentencePiece tokenizer (XLNet ids 0-8) or encode text with one."""


@tokenize_group.command(
    "train",
    help="Train a SentencePiece unigram tokenizer on text, JSONL or Parquet files, datasets folders, directories or "
    f"globs.\n\n{INPUTS_HELP}",
    epilog=examples(
        "xlnet tokenize train data/pydocs/corpus.txt --out runs/tok --vocab-size 8000",
        "xlnet tokenize train 'c4/en/c4-train.*.json.gz' --out runs/tok-c4 --config base --workers 2",
    ),
)
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


@tokenize_group.command(
    "encode",
    epilog=examples(
        'xlnet tokenize encode --tokenizer runs/tok --text "In 2000, the café opened."',
        "xlnet tokenize encode --tokenizer runs/tok --ids data/pydocs/task_valid.tsv",
    ),
)
@click.argument("file", required=False, type=click.Path(path_type=Path))
@tokenizer_option
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
        for n, raw in enumerate(click.open_file("-", "rb"), 1):  # stdin's bytes: the encoding is checked per line
            try:
                show(raw.decode("utf-8"))
            except UnicodeDecodeError as e:
                raise DataError(
                    f"stdin line {n:,}: not UTF-8 ({e.reason} at byte {e.start}); convert it first, e.g. "
                    "iconv -f LATIN1 -t UTF-8"
                ) from None
    else:
        from xlnetcli.data.corpus.inputs import expand_inputs
        from xlnetcli.data.corpus.reader import iter_lines

        assert file is not None  # exactly one of --text and FILE, checked above
        for line in iter_lines(expand_inputs([file])):
            show(line)


@click.command(
    "shard",
    help="Tokenise text, JSONL or Parquet files, datasets folders, directories or globs into N balanced shards + "
    f"valid.\n\n{INPUTS_HELP} Across machines: each runs `xlnet shard ... --part I/N --out parts/I`, then "
    "`xlnet shard-merge parts/* --out DIR` combines them.",
    epilog=examples(
        "xlnet shard data/pydocs/corpus.txt --tokenizer runs/tok --out runs/shards --shards 4 --workers 2",
        "xlnet shard 'corpus/*.txt.gz' --tokenizer runs/tok --shards 64 --out runs/parts/0 --part 0/2   # machine 0",
    ),
)
@click.argument("inputs", nargs=-1)
@tokenizer_option
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
@part_option("whole input files are dealt to parts by size", "shard-merge")
@click.option("--overwrite", is_flag=True, help="Replace an existing shard directory.")
@quiet_option
@with_config("shard")
def shard_cmd(
    cfg: Config, inputs: tuple[str, ...], tok_path: Path, out_dir: Path, part: tuple[int, int] | None, **options: Any
) -> None:
    from xlnetcli.checkpoint.folders import find_tokenizer
    from xlnetcli.core.console import console
    from xlnetcli.data.shards.parts import shard_part
    from xlnetcli.data.shards.shard import ShardOptions, shard_corpus

    o = ShardOptions(**options)
    if o.valid_inputs and click.get_current_context().params["valid_fraction"] is not None:
        raise XLNetError("pass either --valid-fraction or --valid FILE, not both")
    if inputs[:1] == ("merge",) and not Path("merge").exists():
        raise XLNetError("no input file named merge: parts are combined with `xlnet shard-merge PARTS... --out DIR`")
    args = (cfg, inputs_or_bundled(inputs), out_dir, find_tokenizer(tok_path))
    if part is not None:
        files = shard_part(*args, part, o)["files"]
        if not o.quiet:
            docs, tokens = sum(f["documents"] for f in files), sum(f["tokens"] for f in files)
            say_part_written(part, f"{len(files)} file(s), {docs:,} docs, {tokens:,} tokens", out_dir, "shard-merge")
        return
    s = shard_corpus(*args, o)
    if not o.quiet:
        console.print(
            f"wrote {o.shards} train shard(s) ({s.tokens['train']:,} tokens, {s.documents['train']:,} docs) "
            f"+ valid ({s.tokens['valid']:,} tokens, {s.documents['valid']:,} docs) to {out_dir} in "
            f"{s.seconds:.1f} s ({s.mb_per_s:.1f} MB/s, {s.tokens_per_s / 1e3:.0f}K tokens/s)"
        )


@click.command(
    "shard-merge",
    epilog=examples("xlnet shard-merge runs/parts/0 runs/parts/1 --out runs/shards"),
)
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


@click.command(
    "preprocess",
    epilog=examples(
        "xlnet preprocess --shards runs/shards --out runs/records --config tiny",
        "xlnet preprocess --shards runs/shards --out runs/records2 --config base --passes 2 --mask-mode original",
    ),
)
@click.option(
    "--shards", "shards", required=True, type=click.Path(path_type=Path), help="Shard directory (xlnet shard)."
)
@click.option("--out", "out", required=True, type=click.Path(path_type=Path), help="Records directory to create.")
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
@part_option("rows I*G//N to (I+1)*G//N of every pass", "preprocess-merge")
@click.option("--overwrite", is_flag=True, help="Replace an existing records directory.")
@with_config("preprocess")
def preprocess_cmd(
    cfg: Config, shards: Path, out: Path, workers: int, no_verify: bool, part: tuple[int, int] | None, overwrite: bool
) -> None:
    """Build permutation-LM records (examples, segment ids, prediction targets) from shards."""
    from xlnetcli.core.console import print0
    from xlnetcli.data.records.preprocess import preprocess

    meta = preprocess(cfg, shards, out, overwrite=overwrite, workers=workers, verify=not no_verify, part=part)
    if part is not None:
        say_part_written(part, f"rows {meta['rows'][0]}..{meta['rows'][1] - 1}", out, "preprocess-merge")
        return
    tr = meta["splits"]["train"]
    print0(
        f"wrote {out}: {tr['examples']} training examples ({tr['passes']} pass(es) x {tr['steps_per_pass']} steps "
        f"x {meta['global_batch_size']} rows), seq_len {meta['seq_len']}, mask mode {meta['mask_mode']}; they read "
        f"the tokens from {shards} (keep it)"
    )


@click.command(
    "preprocess-merge",
    epilog=examples("xlnet preprocess-merge runs/rparts/0 runs/rparts/1 --out runs/records"),
)
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
