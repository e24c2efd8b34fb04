"""`xlnet preprocess`: shards -> permutation-LM records, built as the original data_utils did (docs/xlnet.md §2-4).

    preprocess(cfg, "shards/", "records/", workers=4)       # what `xlnet preprocess` calls

This module is the orchestration; the pieces live in their own files: shard_format.py reads the shards, segments.py
does the A/B split, masking.py the span masking, record_format.py writes the records format (documented there):
per example |A|, where B starts, the label and the target bits; the tokens stay in the shards.

Layout of the examples (the original's ``create_tfrecords``):
- the token stream of a pass (the shards concatenated in a per-pass shuffled order, sentence ids flipped so they keep
  alternating across shard joins) is cut into contiguous rows: G = train.global_batch_size rows, or G/2 rows with
  bi_data, each then used forward and time-reversed. With bi_data, rows are grouped in blocks of
  train.micro_batch_size (one device's batch): [mb/2 forward rows ; the same rows reversed] (``row_source``,
  record_format.py); a trainer with another micro-batch size or number of processes pairs them again at read time
  (``stored_rows``). meta.json keeps each pass's shard order, so the reader rebuilds the same stream.
- row g, step s: ``inp = row[sR : sR+R]`` then an A/B split of the text after it, giving
  ``[inp | A | <sep> | B | <sep> | <cls>]`` (length L) with |A| + |B| = L - R - 3 exactly.
- prediction targets: span masking with n ~ p(n) ∝ 1/n (n <= 5), each span inside about n*alpha/beta tokens, goal
  num_predict - num_predict//2 in the reuse part and num_predict//2 in the rest; then single positions top up.

Each row draws from its own generator (seed, split, pass, row), so the records are the same for any --workers.
Memory is bounded: shards and records are read and written with pread/pwrite in blocks of STEP_BLOCK steps of the
job's rows (span masks sampled for all their segments at once); a random B span is one pread per window.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from xlnetcli.config import BatchMaths, Config, batch_maths, check_config, save_config, split_num_predict
from xlnetcli.core.console import print0, step_progress
from xlnetcli.core.errors import DataError
from xlnetcli.core.files import atomic_output_dir, atomic_write_json, check_output_not_input, sha256_file
from xlnetcli.core.signals import sigterm_as_interrupt
from xlnetcli.core.workers import ordered_map
from xlnetcli.data.parts import check_part
from xlnetcli.data.records.format import (
    FORMAT_VERSION,
    PassWriter,
    checksums,
    create_pass,
    row_source,
    shards_location,
    split_shards,
)
from xlnetcli.data.records.masking import Spans, mask_draw_width, masks_from_draws, word_start_table
from xlnetcli.data.records.parts import part_rows, write_part_meta
from xlnetcli.data.records.segments import Row, split_block
from xlnetcli.data.shards.format import PassStream, check_shards, split_files

STEP_BLOCK = 256  # windows of one row built together (bounds memory: STEP_BLOCK x L tokens)
_SPLIT_IDS = {"train": 0, "valid": 1}


# ----------------------------------------------------------------------------------------------------------------
# Building rows


@dataclass
class _Params:
    seq_len: int
    reuse_len: int
    num_predict: int
    spans: Spans
    seed: int


def _row_rng(seed: int, split: str, pass_id: int, row: int) -> np.random.Generator:
    return np.random.default_rng([seed, _SPLIT_IDS[split], pass_id, row, 0x584C4E])


class Built(NamedTuple):
    """Examples s0..s1 of one row: tokens [n, L] (what the reader rebuilds from the shards; not stored), alen [n],
    label [n], masked [n, L] bool, bstart [n] (B's first row position)."""

    tokens: np.ndarray
    alen: np.ndarray
    label: np.ndarray
    masked: np.ndarray
    bstart: np.ndarray


def build_rows(
    rows: Sequence[Row], rngs: Sequence[np.random.Generator], p: _Params, ws_table: np.ndarray, s0: int, s1: int
) -> list[Built]:
    """Examples of steps s0..s1 of several rows, masks sampled for all their segments at once.

    Each row draws from its own generator in a fixed order (split uniforms, then the mask uniforms of each part), and
    a segment's mask depends only on its own draws: the output is the same however rows are grouped (workers)."""
    L, R = p.seq_len, p.reuse_len
    goal0, goal1 = split_num_predict(p.num_predict)
    n = s1 - s0
    built, d0, d1 = [], [], []
    for row, rng in zip(rows, rngs, strict=True):
        built.append(split_block(row, L, R, rng.random((n, 3)), s0, s1))
        d0.append(rng.random((n, mask_draw_width(goal0))))
        d1.append(rng.random((n, mask_draw_width(goal1))))

    def reading_order(a: int, b: int) -> np.ndarray:  # segments in reading order (backward rows flipped back)
        return np.concatenate(
            [t[:, a:b][:, ::-1] if row.reverse else t[:, a:b] for row, (t, *_) in zip(rows, built, strict=True)]
        )

    m0 = masks_from_draws(reading_order(0, R), ws_table, goal0, p.spans, np.concatenate(d0))
    m1 = masks_from_draws(reading_order(R, L), ws_table, goal1, p.spans, np.concatenate(d1))
    out = []
    for k, (row, (t, alen, label, bstart)) in enumerate(zip(rows, built, strict=True)):
        masked = np.empty((n, L), bool)
        a, b = m0[k * n : (k + 1) * n], m1[k * n : (k + 1) * n]
        masked[:, :R] = a[:, ::-1] if row.reverse else a
        masked[:, R:] = b[:, ::-1] if row.reverse else b
        out.append(Built(t, alen, label, masked, bstart))
    return out


def build_row(
    row: Row, steps: int, p: _Params, rng: np.random.Generator, ws_table: np.ndarray, s0: int = 0, s1: int | None = None
) -> Built:
    """Examples of steps s0..s1 of one row (``Built``)."""
    return build_rows([row], [rng], p, ws_table, s0, steps if s1 is None else s1)[0]


# ----------------------------------------------------------------------------------------------------------------
# Whole passes


@dataclass(frozen=True)
class _RunShared:
    """What every job of one preprocess run reads: the row layout of a batch and how examples are built."""

    global_batch_size: int
    micro_batch_size: int
    bi_data: bool
    params: _Params
    ws_path: str  # the word-start table, saved once for the workers
    vocab_size: int  # the shards' vocabulary: a larger token id is refused


@dataclass
class _Job:
    """Rows ``rows`` of one pass of one split (a worker's unit of work)."""

    entries: list[tuple[str, str]]
    order: list[int]
    out_prefix: str
    split: str
    pass_id: int
    rows: list[int]
    row_len: int
    steps: int
    run: _RunShared


def _run_job(job: _Job) -> int:
    run = job.run
    ws_table = np.load(run.ws_path)
    stream = PassStream([(Path(a), Path(b)) for a, b in job.entries], job.order)
    out = PassWriter(job.out_prefix, job.steps, run.params.seq_len)
    done = 0
    try:
        srcs = [row_source(g, run.bi_data, run.micro_batch_size) for g in job.rows]
        rows = [Row(stream, f, job.row_len, rev) for f, rev in srcs]
        rngs = [_row_rng(run.params.seed, job.split, job.pass_id, g) for g in job.rows]
        for s0 in range(0, job.steps, STEP_BLOCK):
            s1 = min(job.steps, s0 + STEP_BLOCK)
            for g, b in zip(job.rows, build_rows(rows, rngs, run.params, ws_table, s0, s1), strict=True):
                if b.tokens.size and int(b.tokens.max()) >= run.vocab_size:
                    raise DataError(
                        f"shard token id {int(b.tokens.max())} >= vocab size {run.vocab_size}: the shards were made "
                        "with another tokenizer; rerun `xlnet shard` with this tokenizer"
                    )
                out.write(g, s0, b.alen, b.bstart, b.label, b.masked)
                done += s1 - s0
    finally:
        out.close()
        stream.close()
    return done


# ----------------------------------------------------------------------------------------------------------------
# Entry point


def preprocess(
    cfg: Config,
    shards: str | Path,
    out: str | Path,
    *,
    overwrite: bool = False,
    workers: int = 1,
    quiet: bool = False,
    verify: bool = True,
    part: tuple[int, int] | None = None,
) -> dict:
    """Build records from a shard directory with ``cfg`` (data.passes, data.mask_mode, the window and batch
    layout; saved as config.yaml); returns meta.json's content. ``verify`` checks every shard file's sha256 against
    manifest.json first (a flipped byte is refused, naming the file, instead of being trained on).

    ``part`` = (I, N): only rows [I*G//N, (I+1)*G//N) of every pass, into a part folder (part.json instead of
    meta.json) that `xlnet preprocess-merge` combines with the other N-1 (data/records/parts.py); returns part.json."""
    if part is not None:
        check_part(part)
    shards = Path(shards)
    check_output_not_input(out, [shards])
    check_config(cfg, stage="preprocess")
    maths = batch_maths(cfg)
    if part is not None:  # a part takes rows of every step's global batch: more parts than rows leave some empty
        most = maths.global_batch_size
        check_part(part, most, f"a part takes rows of each step's batch, and train.global_batch_size is {most}")
    manifest, sha = check_shards(shards, cfg.model.vocab_size, verify=verify, workers=workers)
    manifest_sha = sha256_file(shards / "manifest.json")  # the records refuse shards that change after this
    vocab = int(manifest["vocab_size"])
    tok_dir = shards / "tokenizer"
    ws_table = _word_starts(tok_dir, vocab, cfg.data.word_rule)
    dtype = manifest["dtype"]  # uint16 | uint32 (read_manifest checks it)
    params = _params(cfg)
    splits = _split_layouts(shards, manifest, maths.forward_rows, cfg.data.seq_len, cfg.model.reuse_len)
    read = None if verify else _unverified_shards(shards, manifest, splits, workers)
    meta = _records_meta(cfg, maths, sha, vocab, dtype)
    meta["shards"] = {**shards_location(shards, out), "manifest_sha256": manifest_sha}
    G, passes = maths.global_batch_size, cfg.data.passes
    total_examples = sum(passes * G * s.steps for s in splits.values())
    with sigterm_as_interrupt(), atomic_output_dir(out, overwrite, "records") as tmp:
        ws_path = tmp / ".word_start.npy"
        np.save(ws_path, ws_table)
        shared = _RunShared(G, maths.micro_batch_size, maths.bi_data, params, str(ws_path), vocab)
        jobs = []
        for split, layout in splits.items():
            files, orders, split_jobs = _create_passes(tmp, cfg, split, layout, workers, shared)
            jobs += split_jobs
            meta["splits"][split] = _split_meta(layout, maths, passes, files)
            meta["splits"][split].update(shards=split_shards(manifest, split, read), orders=orders)
        if part is not None:
            rows = part_rows(G, *part)
            jobs = [replace(j, rows=[g for g in j.rows if g in rows]) for j in jobs]
            jobs = [j for j in jobs if j.rows]
            total_examples = sum(len(j.rows) * j.steps for j in jobs)
        _run_jobs(jobs, workers, quiet, total_examples)
        ws_path.unlink()
        if part is None:
            meta["sha256"] = checksums(tmp)
        shutil.copytree(tok_dir, tmp / "tokenizer")
        # the config these records were made with, as used: `xlnet pretrain` without --config reads it back
        save_config(cfg, tmp)
        if part is not None:
            return write_part_meta(tmp, meta, part, manifest_sha)
        atomic_write_json(tmp / "meta.json", meta)
    return meta


def _unverified_shards(shards: Path, manifest: dict, splits: dict[str, Any], workers: int) -> dict[str, str]:
    """`--no-verify`: {token file: sha256 of its bytes now} of the splits the records read. The shards are taken as
    they are, not checked against manifest.json; the records then record (and their readers check) the bytes they
    were made from, so they stay readable and a later change is still caught. Files that differ from the manifest
    are named in a line."""
    files = [e["tokens_file"] for split in splits for e in manifest["splits"].get(split) or []]
    with ThreadPoolExecutor(max(1, min(workers, len(files)))) as ex:
        read = dict(zip(files, ex.map(lambda f: sha256_file(shards / f), files), strict=True))
    differ = []
    for split in splits:
        for e in manifest["splits"].get(split) or []:
            want = e.get("sha256")
            if not isinstance(want, dict) or want.get("tokens") != read[e["tokens_file"]]:
                differ.append(e["tokens_file"])
    if differ:
        print0(
            f"[yellow]--no-verify: {len(differ)} shard file(s) do not match {shards / 'manifest.json'} (first "
            f"{differ[0]}); the records are made from them as they are and record their sha256 now[/yellow]"
        )
    return read


def _word_starts(tok_dir: Path, vocab: int, rule: str) -> np.ndarray:
    """The tokenizer's word-start table under ``rule``, refused when it has fewer pieces than the shards' manifest
    says."""
    ws_table = word_start_table(tok_dir, rule)
    if len(ws_table) < vocab:
        raise DataError(f"{tok_dir}: tokenizer has {len(ws_table)} pieces, the manifest says {vocab}")
    return ws_table


def _params(cfg: Config) -> _Params:
    """The settings a worker needs to build records, from ``cfg``."""
    return _Params(
        cfg.data.seq_len,
        cfg.model.reuse_len,
        cfg.data.num_predict,
        Spans(cfg.data.mask_alpha, cfg.data.mask_beta, cfg.data.mask_mode, cfg.data.max_gram),
        cfg.data.seed,
    )


def _split_meta(layout: _SplitLayout, maths: BatchMaths, passes: int, files: list[str]) -> dict[str, Any]:
    """meta.json's entry for one split: its tokens, row layout, steps, passes, examples and record files (the
    shards it reads and their order in each pass are added by the caller)."""
    G = maths.global_batch_size
    return {
        "tokens": layout.total,
        "rows": G,
        "forward_rows": maths.forward_rows,
        "row_len": layout.row_len,
        "steps_per_pass": layout.steps,
        "passes": passes,
        "examples": passes * G * layout.steps,
        "files": files,
    }


@dataclass
class _SplitLayout:
    """One split's token stream cut into rows: ``steps`` windows of each row of ``row_len`` tokens."""

    paths: list[tuple[str, str]]
    total: int
    row_len: int
    steps: int


def _split_layouts(shards: Path, manifest: dict, n_fwd: int, L: int, R: int) -> dict[str, _SplitLayout]:
    """Row layout of each split that holds one window per forward row (a valid split too small is skipped, with a
    line; a train split too small is refused)."""
    layouts = {}
    for split in ("train", "valid"):
        paths, total = split_files(shards, manifest, split)
        need = n_fwd * L
        if total < need:
            if split == "train":
                raise DataError(
                    f"corpus too small for one window: {n_fwd} rows x seq_len {L} need {need} tokens, the train split "
                    f"has {total}; add text or lower train.global_batch_size / data.seq_len"
                )
            print0(f"[yellow]valid split skipped: {total} tokens, one window per row needs {need}[/yellow]")
            continue
        row_len = total // n_fwd
        layouts[split] = _SplitLayout(paths, total, row_len, (row_len - L) // R + 1)
    return layouts


def _records_meta(cfg: Config, maths: BatchMaths, sha: str, vocab: int, dtype: str) -> dict[str, Any]:
    """meta.json without its per-split entries and checksums (filled in as the records are written)."""
    return {
        "format_version": FORMAT_VERSION,
        "seq_len": cfg.data.seq_len,
        "reuse_len": cfg.model.reuse_len,
        "perm_size": cfg.perm_size,
        "bi_data": maths.bi_data,
        "num_predict": cfg.data.num_predict,
        "num_predict_reuse": maths.num_predict_reuse,
        "mask_alpha": cfg.data.mask_alpha,
        "mask_beta": cfg.data.mask_beta,
        "mask_mode": cfg.data.mask_mode,
        "max_gram": cfg.data.max_gram,
        "word_rule": cfg.data.word_rule,
        "seed": cfg.data.seed,
        "tokenizer_sha256": sha,
        "vocab_size": vocab,
        "dtype": dtype,
        "global_batch_size": maths.global_batch_size,
        "micro_batch_size": maths.micro_batch_size,
        "passes": cfg.data.passes,
        "layout": "rows [G, steps] of windows of the shards; bi_data blocks of micro_batch_size = [forward half ; "
        "same rows reversed]",
        "splits": {},
    }


def _create_passes(
    tmp: Path, cfg: Config, split: str, layout: _SplitLayout, workers: int, run: _RunShared
) -> tuple[list[str], list[list[int]], list[_Job]]:
    """Create the split's pass files (each pass reads the shards in its own seeded order); returns their names, the
    orders and the jobs that fill them, a few rows each."""
    (tmp / split).mkdir()
    G, mb = run.global_batch_size, run.micro_batch_size
    files, orders, jobs = [], [], []
    for pass_id in range(cfg.data.passes):
        rng = np.random.default_rng([cfg.data.seed, _SPLIT_IDS[split], pass_id])
        order = [int(k) for k in rng.permutation(len(layout.paths))]
        prefix = tmp / split / f"pass_{pass_id:03d}"
        create_pass(prefix, G, layout.steps, cfg.data.seq_len, layout.row_len)
        files.append(f"{split}/pass_{pass_id:03d}")
        orders.append(order)
        chunk = max(1, min(mb, G // max(1, workers)))
        for g0 in range(0, G, chunk):
            jobs.append(
                _Job(
                    layout.paths,
                    order,
                    str(prefix),
                    split,
                    pass_id,
                    list(range(g0, min(G, g0 + chunk))),
                    layout.row_len,
                    layout.steps,
                    run,
                )
            )
    return files, orders, jobs


def _run_jobs(jobs: list[_Job], workers: int, quiet: bool, total_examples: int) -> None:
    """Run the jobs in ``workers`` processes (this one and ``workers - 1`` forked helpers, core/workers.py), with a
    progress bar over the examples."""
    with step_progress(quiet) as bar:
        task = bar.add_task("preprocess", total=total_examples, info="examples")
        for n in ordered_map(_run_job, jobs, helpers=workers - 1, ahead=1):  # jobs are large: one at a time each
            bar.advance(task, n)
