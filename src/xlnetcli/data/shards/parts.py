"""Sharding split across machines: ``xlnet shard --part I/N`` and ``xlnet shard-merge`` (issue #21 item 4).

One host reads the inputs in order, tokenises them, numbers the documents over the whole corpus and assigns each to
the valid split (hash of (seed, document index)) or to the train shard with the fewest tokens so far
(data/shards/shard.py).
Tokenising is the expensive part and is independent per input file (chunks never span files); the numbering and the
assignment are sequential but cheap. So:

  part I of N  (0-based: I in 0..N-1, as SLURM_ARRAY_TASK_ID and JOB_COMPLETION_INDEX count)
      expands the inputs exactly as one host would, deals the *whole input files* to N parts (largest first, each to
      the part with the fewest bytes so far: every part computes the same assignment from the file list and sizes alone,
      without reading another part's text), and tokenises its own files into a part folder: per file its token ids
      (one <eod> per document), sentence parities and per-document token / line counts, in input order.
  shard-merge
      checks the N parts belong together (same inputs, sizes, tokenizer, config, --shards; every part once; every
      file's sha256), then replays the documents file by file in input order through the same assignment as one host
      (global document indices follow from the per-file counts). I/O only.

The merged folder is byte-identical to `xlnet shard` on one host with the same inputs and options (manifest
included: it holds no timings or host names). A file is the unit: one huge input file gives one busy part; split
such a corpus into many files first.

Part folder::

    part.json       kind "xlnet-shard-part", format_version, part, parts, plan (what every part must agree on),
                    files: [{index, input, valid, documents, tokens, bad_bytes, null_records, files, sha256}]
    config.yaml     the resolved config, as one host saves it
    tokenizer/      the tokenizer, as one host saves it
    files/NNNNNN.{tokens,sentid,doctok,doclines}.npy    NNNNNN = the file's index in the global input order
"""

from __future__ import annotations

import heapq
import shutil
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from xlnetcli.config import Config, save_config
from xlnetcli.core.console import console
from xlnetcli.core.errors import DataError, XLNetError
from xlnetcli.core.files import atomic_output_dir, atomic_write_json, check_output_dir, sha256_file
from xlnetcli.core.shapes import describe, fix_hint, json_field, read_folder_json, str_map
from xlnetcli.core.signals import sigterm_as_interrupt
from xlnetcli.core.text import short
from xlnetcli.data.corpus.inputs import Source, total_size
from xlnetcli.data.corpus.reader import FileStats, ReadStats, iter_chunks
from xlnetcli.data.parts import MAX_PARTS, check_part, each_part_once
from xlnetcli.data.shards.format import FORMAT_VERSION, NpyFile, NpyStreamWriter
from xlnetcli.data.shards.shard import (
    ChunkResult,
    ShardOptions,
    ShardSummary,
    _Assigner,
    _check_counts,
    _check_split,
    _encode_in_order,
    _Shard,
    _summary,
    _write_errors,
    prepare_inputs,
    shard_output,
    token_dtype,
    write_manifest,
)
from xlnetcli.data.tokenizer import Tokenizer

PART_KIND = "xlnet-shard-part"
PART_FORMAT_VERSION = 1
MERGE_BLOCK_TOKENS = 1 << 22  # tokens replayed per step of the merge: memory stays bounded whatever the file size
_KINDS = ("tokens", "sentid", "doctok", "doclines")


def assign_files(sizes: Sequence[int], parts: int) -> list[int]:
    """The part of each input file: whole files, largest first, each to the part with the fewest bytes so far (then
    the fewest files, then the lowest index). Depends only on the sizes and ``parts``: every part computes the same."""
    load = [(0, 0, p) for p in range(parts)]  # a heap: the smallest (bytes, files, index) on top
    owner = [0] * len(sizes)
    for k in sorted(range(len(sizes)), key=lambda k: (-sizes[k], k)):
        b, c, p = load[0]
        owner[k] = p
        heapq.heapreplace(load, (b + sizes[k], c + 1, p))
    return owner


# ---------------------------------------------------------------------------------------------------------------------
# writing a part


class _FileWriter:
    """The four arrays of one input file in a part folder."""

    def __init__(self, directory: Path, index: int, dtype: np.dtype) -> None:
        self.rel = {k: f"files/{index:06d}.{k}.npy" for k in _KINDS}
        dt: dict[str, Any] = {"tokens": dtype, "sentid": np.uint8, "doctok": np.int64, "doclines": np.int64}
        self.w = {k: NpyStreamWriter(directory / self.rel[k], dt[k]) for k in _KINDS}
        self.documents = 0
        self.tokens = 0

    def add(self, res: ChunkResult) -> None:
        for k, arr in zip(_KINDS, (res.tokens, res.sentid, res.doc_tokens, res.doc_lines), strict=True):
            self.w[k].write(arr)
        self.documents += res.doc_tokens.size
        self.tokens += res.tokens.size

    def close(self) -> None:
        for w in self.w.values():
            w.close()


def shard_part(
    cfg: Config,
    inputs: Iterable[str],
    out_dir: str | Path,
    tokenizer: str | Path | Tokenizer,
    part: tuple[int, int],
    options: ShardOptions | None = None,
) -> dict[str, Any]:
    """Tokenise part ``part`` = (I, N) of the inputs into the part folder ``out_dir``; returns its part.json."""
    check_part(part)
    index, n_parts = part
    o = options or ShardOptions()
    cfg, out, tok, train_files, valid_files = prepare_inputs(cfg, inputs, out_dir, tokenizer, o, "a shard part")
    all_files: list[tuple[Source, bool]] = [(p, False) for p in train_files] + [(p, True) for p in valid_files]
    sizes = [total_size([p]) for p, _ in all_files]
    owner = assign_files(sizes, n_parts)
    mine = [k for k in range(len(all_files)) if owner[k] == index]
    if not mine:  # parts take whole files: with more parts than files some hold none
        console.print(
            f"warning: part {index}/{n_parts} holds none of the {len(all_files)} input files (parts take whole "
            "files); it is written empty, and shard-merge takes it like the others"
        )
    dtype = token_dtype(tok)
    stats = ReadStats()
    with shard_output(out, o, "a shard part") as (tmp, prog):
        (tmp / "files").mkdir()
        task = prog.add_task(f"part {index}/{n_parts}", total=sum(sizes[k] for k in mine), info="")
        writers: dict[int, _FileWriter] = {}

        def chunks() -> Iterator[tuple[str, Any]]:
            for k in mine:
                path = all_files[k][0]
                fs = FileStats(path)
                stats.files.append(fs)
                writers[k] = _FileWriter(tmp, k, dtype)
                for text in iter_chunks(
                    path, fs, o.chunk_chars, on_bytes=lambda n: prog.advance(task, n), text_field=o.text_field
                ):
                    yield text, k

        def take(res: ChunkResult, k: Any) -> None:
            writers[k].add(res)

        _encode_in_order(chunks(), tok, dtype, o.workers, take)
        for fw in writers.values():
            fw.close()
        for line in stats.warnings():
            console.print(line)
        tok.save(tmp / "tokenizer")
        save_config(cfg, tmp)
        files = []
        for k, fs in zip(mine, stats.files, strict=True):
            w = writers[k]
            files.append(
                {
                    "index": k,
                    "input": str(all_files[k][0]),
                    "valid": all_files[k][1],
                    "documents": w.documents,
                    "tokens": w.tokens,
                    "bad_bytes": fs.bad_bytes,
                    "null_records": fs.null_records,
                    "files": w.rel,
                    "sha256": {kind: sha256_file(tmp / rel) for kind, rel in w.rel.items()},
                }
            )
        meta = {
            "kind": PART_KIND,
            "format_version": PART_FORMAT_VERSION,
            "part": index,
            "parts": n_parts,
            "plan": {
                "shard_format_version": FORMAT_VERSION,
                "inputs": {"train": [str(p) for p in train_files], "valid": [str(p) for p in valid_files]},
                "sizes": sizes,
                "bytes": sum(sizes),
                "shards": o.shards,
                "seed": cfg.data.seed,
                "valid_fraction": cfg.data.valid_fraction,
                "tokenizer_sha256": tok.sha256,
                "vocab_size": tok.vocab_size,
                "dtype": dtype.name,
                "config_sha256": sha256_file(tmp / "config.yaml"),
            },
            "files": files,
        }
        atomic_write_json(tmp / "part.json", meta)
    return meta


# ---------------------------------------------------------------------------------------------------------------------
# merging parts


def _read_part(d: Path) -> dict[str, Any]:
    """part.json of a part folder, every field the merge uses checked for kind and range (one line naming the file
    and the field, and the command that writes the part again)."""
    path = d / "part.json"
    m = read_folder_json(d, "part.json", "shard part", "xlnet shard --part I/N", "xlnet shard --part")
    if m.get("kind") != PART_KIND or m.get("format_version") != PART_FORMAT_VERSION:
        raise DataError(f"{path}: not a shard part of format {PART_FORMAT_VERSION}; rerun `xlnet shard --part`")
    with fix_hint("rerun `xlnet shard --part`"):
        _check_part_shape(m, path)
    return m


def _check_part_shape(m: dict[str, Any], path: Path) -> None:
    parts = json_field(m, "parts", int, path, lo=1, hi=MAX_PARTS)
    json_field(m, "part", int, path, lo=0, hi=parts - 1)
    plan = json_field(m, "plan", dict, path)
    where = f"{path} plan"
    inputs = json_field(plan, "inputs", dict, where)
    names = [json_field(inputs, split, list, f"{where}.inputs") for split in ("train", "valid")]
    if set(inputs) != {"train", "valid"} or not all(isinstance(f, str) for f in names[0] + names[1]):
        raise DataError(f"{where}.inputs: must hold the lists 'train' and 'valid' of input file names")
    n_files = len(names[0]) + len(names[1])
    sizes = json_field(plan, "sizes", list, where)
    if len(sizes) != n_files or not all(type(x) is int and 0 <= x < 2**62 for x in sizes):
        raise DataError(f"{where}: field 'sizes' must hold one size in bytes (an integer >= 0) per input file")
    if json_field(plan, "bytes", int, where, lo=0) != sum(sizes):
        raise DataError(f"{where}: field 'bytes' is not the sum of 'sizes'")
    for key in ("shard_format_version", "shards"):
        json_field(plan, key, int, where, lo=1, hi=FORMAT_VERSION if key == "shard_format_version" else 2**20)
    json_field(plan, "seed", int, where, lo=0, hi=2**32 - 1)
    if json_field(plan, "valid_fraction", float, where, lo=0, hi=1) == 1:
        raise DataError(f"{where}: field 'valid_fraction' is 1, out of range (must be < 1)")
    vocab = json_field(plan, "vocab_size", int, where, lo=9, hi=2**31 - 1)
    want = np.dtype(np.uint16) if vocab <= 1 << 16 else np.dtype(np.uint32)
    if json_field(plan, "dtype", str, where) != want.name:
        raise DataError(
            f"{where}: field 'dtype' must be {want.name} (the token ids of a {vocab}-piece vocabulary), "
            f"found {describe(plan['dtype'])}"
        )
    for key in ("tokenizer_sha256", "config_sha256"):
        json_field(plan, key, str, where)
    files = json_field(m, "files", list, path)
    for i, f in enumerate(files):
        at = f"{path} files[{i}]"
        if not isinstance(f, dict):
            raise DataError(f"{at}: must be an object, found {describe(f)}")
        json_field(f, "index", int, at, lo=0, hi=max(n_files - 1, 0))
        json_field(f, "input", str, at)
        json_field(f, "valid", bool, at)
        for key in ("documents", "tokens", "bad_bytes", "null_records"):
            json_field(f, key, int, at, lo=0, hi=2**62)
        rel = str_map(f, "files", at)
        digests = str_map(f, "sha256", at)
        for kind in _KINDS:
            name = json_field(rel, kind, str, f"{at}.files")
            json_field(digests, kind, str, f"{at}.sha256")
            if Path(name).is_absolute() or ".." in Path(name).parts or not Path(name).parts:
                raise DataError(f"{at}.files: field {kind!r} must be a path inside the part folder, found {name!r}")


def _check_parts(dirs: Sequence[Path]) -> list[tuple[Path, dict[str, Any]]]:
    """The parts in part order, refused unless they are the N parts of one run, each once, with intact files."""
    if not dirs:
        raise XLNetError("xlnet shard-merge: give the part folders to merge (PARTS...)")
    metas = [(d, _read_part(d)) for d in dirs]
    d0, m0 = metas[0]
    n = m0["parts"]
    for d, m in metas[1:]:
        if m["parts"] != n:
            raise DataError(f"{d0} is a part of {n} but {d} a part of {m['parts']}: parts of different runs")
        for key, want in m0["plan"].items():
            if m["plan"].get(key) != want:
                what = {"config_sha256": "config", "tokenizer_sha256": "tokenizer"}.get(key, key)
                both = f"{short(want, 40)} against {short(m['plan'].get(key), 40)}"
                raise DataError(f"{d0} and {d} differ in {what} ({both}): parts of different runs cannot be merged")
        if set(m["plan"]) != set(m0["plan"]):
            raise DataError(f"{d0} and {d} differ in their plan: parts of different runs cannot be merged")
    metas = each_part_once(metas, n, "shard")
    n_files = len(m0["plan"].get("sizes", []))
    owner = assign_files(m0["plan"]["sizes"], n)
    for d, m in metas:
        got = [f["index"] for f in m["files"]]
        if got != [k for k in range(n_files) if owner[k] == m["part"]]:
            raise DataError(f"{d}/part.json lists other input files than part {m['part']}/{n} owns; rerun that part")
    for d, m in metas:
        _verify_part(d, m)
    return metas


def _verify_part(d: Path, m: dict[str, Any]) -> None:
    """Every file of a part against its sha256 (and the tokenizer and config against part.json's plan)."""
    checks = [(d / "tokenizer" / "spiece.model", m["plan"]["tokenizer_sha256"])]
    checks.append((d / "config.yaml", m["plan"]["config_sha256"]))
    for f in m["files"]:
        checks += [(d / f["files"][k], f["sha256"][k]) for k in _KINDS]
    for p, want in checks:
        if not p.is_file():
            raise DataError(f"{p} is missing: the part is incomplete; rerun that part")
        if sha256_file(p) != want:
            raise DataError(f"{p} does not match its part.json (sha256 differs): corrupted; rerun that part")


def _replay(d: Path, f: dict[str, Any]) -> Iterator[ChunkResult]:
    """A file's documents from a part folder, in order, a block of whole documents at a time."""
    arr = {k: NpyFile(d / f["files"][k]) for k in _KINDS}
    try:
        n_docs = arr["doctok"].size
        if arr["doclines"].size != n_docs or arr["sentid"].size != arr["tokens"].size:
            raise DataError(f"{d / f['files']['tokens']}: the arrays of one file differ in length; rerun that part")
        doc_tok = arr["doctok"].read(0, n_docs)
        ends = np.cumsum(doc_tok)
        if n_docs and int(ends[-1]) != arr["tokens"].size:
            raise DataError(f"{d / f['files']['tokens']}: document sizes do not add up; rerun that part")
        a, t0 = 0, 0
        while a < n_docs:
            b = max(a + 1, int(np.searchsorted(ends, t0 + MERGE_BLOCK_TOKENS, "right")))
            t1 = int(ends[b - 1])
            yield ChunkResult(
                arr["tokens"].read(t0, t1).copy(),
                arr["sentid"].read(t0, t1).copy(),
                doc_tok[a:b].astype(np.int64),
                arr["doclines"].read(a, b).astype(np.int64),
                0,
            )
            a, t0 = b, t1
    finally:
        for x in arr.values():
            x.close()


def merge_shard_parts(
    parts: Sequence[str | Path], out_dir: str | Path, *, overwrite: bool = False, quiet: bool = False
) -> ShardSummary:
    """Combine the N part folders of one `xlnet shard --part I/N` run into the shard folder one host would write."""
    t0 = time.perf_counter()
    out = Path(out_dir)
    dirs = [Path(p) for p in parts]
    check_output_dir(out, overwrite, "shards", dirs)
    metas = _check_parts(dirs)
    agreed = metas[0][1]["plan"]  # what every part agreed on
    by_index = {f["index"]: (d, f) for d, m in metas for f in m["files"]}
    dtype = np.dtype(agreed["dtype"])
    _check_counts(agreed["shards"], 1)
    stats = ReadStats()
    inputs = agreed["inputs"]
    n_files = len(inputs["train"]) + len(inputs["valid"])
    with _write_errors(out), sigterm_as_interrupt(), atomic_output_dir(out, overwrite, "shards", dirs) as tmp:
        (tmp / "train").mkdir()
        (tmp / "valid").mkdir()
        train = [_Shard(tmp, "train", i, dtype) for i in range(agreed["shards"])]
        valid = _Shard(tmp, "valid", 0, dtype)
        assigner = _Assigner(train, valid, agreed["seed"], agreed["valid_fraction"])
        for k in range(n_files):
            d, f = by_index[k]
            stats.files.append(FileStats(f["input"], bad_bytes=f["bad_bytes"], null_records=f["null_records"]))
            for res in _replay(d, f):
                assigner.add(res, bool(f["valid"]))
        for s in [*train, valid]:
            s.close()
        for w in stats.warnings():
            if not quiet:
                console.print(w)
        _check_split(assigner, n_files, quiet)
        d0 = metas[0][0]
        files = {split: list(names) for split, names in inputs.items()}
        write_manifest(
            tmp,
            agreed["tokenizer_sha256"],
            agreed["vocab_size"],
            dtype,
            assigner,
            files,
            agreed["bytes"],
            stats.bad_bytes,
        )
        shutil.copytree(d0 / "tokenizer", tmp / "tokenizer")
        shutil.copyfile(d0 / "config.yaml", tmp / "config.yaml")
    return _summary(out, n_files, agreed["bytes"], time.perf_counter() - t0, train, valid, stats)


__all__ = ["assign_files", "merge_shard_parts", "shard_part"]
