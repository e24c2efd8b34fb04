"""Preprocessing split across machines: ``xlnet preprocess --part I/N`` and ``xlnet preprocess-merge`` (issue #21).

Records are rows: every row of every pass is built from the shards with its own seeded generator (preprocess.py), so
rows are independent work. Part I of N (0-based) builds rows [I*G//N, (I+1)*G//N) of every pass and split into a
part folder: the pass files at their full shape (sparse on disk outside its rows), config.yaml, tokenizer/ and
part.json (the meta.json one host would write, less its checksums; the sha256 of the shards' manifest; the sha256 of
each file's bytes in its rows). The merge checks the parts belong together, copies each part's rows into full pass
files and writes meta.json with the checksums: byte-identical to `xlnet preprocess` on one host writing to the same
folder. Where the shards are (meta.json's ``shards`` path, relative to the records, and absolute) is not a setting
the parts must share: the merge finds them from part 0 as a reader would, and records them relative to its output.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from xlnetcli.core.errors import DataError, XLNetError
from xlnetcli.core.files import atomic_output_dir, atomic_write_json, check_output_dir, sha256_file
from xlnetcli.core.shapes import fix_hint, json_field, read_folder_json, str_map
from xlnetcli.core.signals import sigterm_as_interrupt
from xlnetcli.core.text import short
from xlnetcli.data.parts import MAX_PARTS, each_part_once
from xlnetcli.data.records.format import (
    ARRAYS,
    FORMAT_VERSION,
    check_meta_shape,
    check_shapes,
    check_tokenizer_copy,
    checksums,
    create_npy,
    shards_location,
)
from xlnetcli.data.shards.format import NpyFile

PART_KIND = "xlnet-records-part"
PART_FORMAT_VERSION = 2  # 2: parts of records format 2 (they reference the shards)
_BLOCK = 1 << 24


def part_rows(rows: int, index: int, parts: int) -> range:
    """The rows of part ``index`` of ``parts``: a contiguous range, sizes differing by at most one."""
    return range(index * rows // parts, (index + 1) * rows // parts)


def _pass_files(d: Path) -> list[Path]:
    return sorted(d.glob("*/pass_*.npy"))


def _row_span(npy: NpyFile, rows: range) -> tuple[int, int]:
    """(byte offset, byte length) of rows ``rows`` (first axis) of an .npy file."""
    row_bytes = (npy.size // max(1, npy.shape[0])) * npy.dtype.itemsize if npy.shape else 0
    return npy.offset + rows.start * row_bytes, len(rows) * row_bytes


def _span_sha(path: Path, rows: range) -> str:
    npy = NpyFile(path)
    try:
        off, n = _row_span(npy, rows)
        h = hashlib.sha256()
        while n > 0:
            b = os.pread(npy.fd, min(n, _BLOCK), off)
            if not b:
                raise DataError(f"{path} is truncated; rerun that part")
            h.update(b)
            off, n = off + len(b), n - len(b)
        return h.hexdigest()
    finally:
        npy.close()


def write_part_meta(tmp: Path, meta: dict[str, Any], part: tuple[int, int], shards_sha: str) -> dict[str, Any]:
    """part.json of a finished part folder ``tmp`` (called by preprocess with ``part``)."""
    index, n = part
    rows = part_rows(int(meta["global_batch_size"]), index, n)
    out = {
        "kind": PART_KIND,
        "format_version": PART_FORMAT_VERSION,
        "part": index,
        "parts": n,
        "plan": {"meta": meta, "shards_manifest_sha256": shards_sha, "config_sha256": sha256_file(tmp / "config.yaml")},
        "rows": [rows.start, rows.stop],
        "sha256": {f.relative_to(tmp).as_posix(): _span_sha(f, rows) for f in _pass_files(tmp)},
    }
    atomic_write_json(tmp / "part.json", out)
    return out


def _read_part(d: Path) -> dict[str, Any]:
    """part.json of a records part, every field the merge uses checked for kind and range, plan.meta as a reader
    checks meta.json: one line naming the file and the field, and the command that writes the part again."""
    path = d / "part.json"
    m = read_folder_json(d, "part.json", "records part", "xlnet preprocess --part I/N", "xlnet preprocess --part")
    ok = m.get("kind") == PART_KIND and m.get("format_version") == PART_FORMAT_VERSION
    if not ok:
        raise DataError(f"{path}: not a records part of format {PART_FORMAT_VERSION}; rerun `xlnet preprocess --part`")
    with fix_hint("rerun `xlnet preprocess --part`"):
        _check_part_shape(m, path)
    return m


def _check_part_shape(m: dict[str, Any], path: Path) -> None:
    parts = json_field(m, "parts", int, path, lo=1, hi=MAX_PARTS)
    json_field(m, "part", int, path, lo=0, hi=parts - 1)
    plan = json_field(m, "plan", dict, path)
    meta = json_field(plan, "meta", dict, f"{path} plan")
    if meta.get("format_version") != FORMAT_VERSION:
        raise DataError(f"{path} plan.meta: field 'format_version' must be {FORMAT_VERSION}")
    check_meta_shape(meta, f"{path} plan.meta")
    if parts > meta["global_batch_size"]:
        raise DataError(f"{path}: {parts} parts of {meta['global_batch_size']} rows (plan.meta.global_batch_size)")
    for key in ("shards_manifest_sha256", "config_sha256"):
        json_field(plan, key, str, f"{path} plan")
    for name, split in meta["splits"].items():
        if split["rows"] != meta["global_batch_size"]:
            raise DataError(f"{path} plan.meta splits.{name}: field 'rows' must equal global_batch_size")
    rows = json_field(m, "rows", list, path)
    if len(rows) != 2 or not all(type(r) is int for r in rows):
        raise DataError(f"{path}: field 'rows' must be [first, end], two integers")
    digests = str_map(m, "sha256", path)
    want = {f"{prefix}.{a}.npy" for split in meta["splits"].values() for prefix in split["files"] for a in ARRAYS}
    if set(digests) != want:
        extra = sorted(set(digests) ^ want)[0]
        raise DataError(f"{path}: field 'sha256' does not list the records files of plan.meta ({extra!r})")


def _check_parts(dirs: Sequence[Path]) -> list[tuple[Path, dict[str, Any]]]:
    if not dirs:
        raise XLNetError("xlnet preprocess-merge: give the part folders to merge (PARTS...)")
    metas = [(d, _read_part(d)) for d in dirs]
    d0, m0 = metas[0]
    n = m0["parts"]
    names = {"config_sha256": "config", "shards_manifest_sha256": "shards", "meta": "records settings"}
    for d, m in metas[1:]:
        if m["parts"] != n:
            raise DataError(f"{d0} is a part of {n} but {d} a part of {m['parts']}: parts of different runs")
        for key in ("meta", "shards_manifest_sha256", "config_sha256"):
            a, b = _settings(m0["plan"].get(key)), _settings(m["plan"].get(key))
            if a != b:
                what = f"{names[key]} ({_differences(a, b, '' if key == 'meta' else key)})"
                if key == "meta" and a.get("tokenizer_sha256") != b.get("tokenizer_sha256"):
                    what = "tokenizer"
                raise DataError(f"{d0} and {d} differ in {what}: parts of different runs cannot be merged")
        if set(m["sha256"]) != set(m0["sha256"]):
            raise DataError(f"{d0} and {d} hold different record files: parts of different runs cannot be merged")
    metas = each_part_once(metas, n, "preprocess")
    G = int(m0["plan"]["meta"]["global_batch_size"])
    for d, m in metas:
        rows = part_rows(G, m["part"], n)
        if m["rows"] != [rows.start, rows.stop]:
            raise DataError(f"{d}/part.json holds rows {m['rows']}, not those of part {m['part']}/{n}")
        for rel, want in m["sha256"].items():
            p = d / rel
            if not p.is_file():
                raise DataError(f"{p} is missing: the part is incomplete; rerun that part")
            if _span_sha(p, rows) != want:
                raise DataError(f"{p} does not match its part.json (sha256 differs): corrupted; rerun that part")
        for p, want in ((d / "config.yaml", m["plan"]["config_sha256"]),):
            if not p.is_file() or sha256_file(p) != want:
                raise DataError(f"{p} is missing or does not match its part.json; rerun that part")
    # every part's tokenizer copy is the shards' (part 0's goes into the merged records, into every checkpoint)
    meta = m0["plan"]["meta"]
    shards = _found_shards(d0, meta.get("shards"))
    for d, _ in metas:
        check_tokenizer_copy(d, meta.get("tokenizer_sha256"), d / "part.json", shards, "records part")
    return metas


def _check_files_against_plan(d: Path, meta: dict[str, Any]) -> None:
    """The pass files of a part at the shapes plan.meta gives them: the merged meta.json then describes its files."""
    for split in meta["splits"].values():
        for prefix in split["files"]:
            try:
                arrays = [np.load(d / f"{prefix}.{a}.npy", mmap_mode="r") for a in ARRAYS]
                check_shapes(arrays, split, meta, d / prefix)
            except (OSError, ValueError, DataError) as e:
                raise DataError(
                    f"{d / 'part.json'}: plan.meta does not describe the part's file {prefix} "
                    f"({short(str(e).split(';')[0], 200)}); rerun `xlnet preprocess --part`"
                ) from None


def _differences(a: Any, b: Any, name: str = "", most: int = 3) -> str:
    """Where two plan values differ, as "seed 42 against 7": the first ``most`` keys (dotted, nested objects
    followed) with both values."""
    if not isinstance(a, dict) or not isinstance(b, dict):
        return f"{name} {_short(a)} against {_short(b)}"
    keys = [k for k in sorted(set(a) | set(b), key=str) if a.get(k, _ABSENT) != b.get(k, _ABSENT)]
    shown = [_differences(a.get(k, _ABSENT), b.get(k, _ABSENT), f"{name}.{k}" if name else str(k)) for k in keys]
    return "; ".join(shown[:most]) + (f"; {len(keys) - most} more" if len(keys) > most else "")


_ABSENT = object()


def _short(value: Any) -> str:
    return "absent" if value is _ABSENT else short(value, 40)


def _settings(value: Any) -> Any:
    """A part's plan value as the parts must agree on it: meta.json less where its part found the shards."""
    if not isinstance(value, dict) or not isinstance(value.get("shards"), dict):
        return value
    return {**value, "shards": {k: v for k, v in value["shards"].items() if k not in ("path", "absolute")}}


def _found_shards(part_dir: Path, shards: Any) -> Path | None:
    """The shards where part 0's records would find them (its relative path, else its absolute one), or None."""
    if not isinstance(shards, dict):
        return None
    near, far = part_dir / str(shards.get("path")), Path(str(shards.get("absolute")))
    return next((d for d in (near, far) if (d / "manifest.json").is_file()), None)


def _shards_for(part_dir: Path, shards: dict[str, Any], out: Path) -> dict[str, Any]:
    """meta.json's ``shards`` for the merged records in ``out``: the shards where part 0's records would find them
    from here (_found_shards), else its absolute path as it stands."""
    found = _found_shards(part_dir, shards) or Path(str(shards.get("absolute")))
    return {**shards, **shards_location(found, out)}


def merge_record_parts(parts: Sequence[str | Path], out_dir: str | Path, *, overwrite: bool = False) -> dict[str, Any]:
    """Combine the N part folders of one `xlnet preprocess --part I/N` run into the records one host would write;
    returns meta.json's content."""
    out = Path(out_dir)
    dirs = [Path(p) for p in parts]
    check_output_dir(out, overwrite, "records", dirs)
    metas = _check_parts(dirs)
    d0, m0 = metas[0]
    meta = m0["plan"]["meta"]
    _check_files_against_plan(d0, meta)
    if isinstance(meta.get("shards"), dict):
        meta["shards"] = _shards_for(d0, meta["shards"], out)
    G = int(meta["global_batch_size"])
    with sigterm_as_interrupt(), atomic_output_dir(out, overwrite, "records", dirs) as tmp:
        for rel in sorted(m0["sha256"]):
            src0 = NpyFile(d0 / rel)
            shape, dtype = src0.shape, src0.dtype
            src0.close()
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            create_npy(tmp / rel, shape, dtype)
            dst = NpyFile(tmp / rel, write=True)
            try:
                for d, m in metas:
                    src = NpyFile(d / rel)
                    try:
                        if src.shape != shape or src.dtype != dtype:
                            raise DataError(f"{d / rel}: shape or dtype differs from {d0 / rel}; rerun that part")
                        off, n = _row_span(src, part_rows(G, m["part"], len(metas)))
                        while n > 0:
                            b = os.pread(src.fd, min(n, _BLOCK), off)
                            if not b:
                                raise DataError(f"{d / rel} is truncated; rerun that part")
                            os.pwrite(dst.fd, b, off - src.offset + dst.offset)
                            off, n = off + len(b), n - len(b)
                    finally:
                        src.close()
            finally:
                dst.close()
        meta = dict(meta)
        meta["sha256"] = checksums(tmp)
        shutil.copytree(d0 / "tokenizer", tmp / "tokenizer")
        shutil.copyfile(d0 / "config.yaml", tmp / "config.yaml")
        atomic_write_json(tmp / "meta.json", meta)
    return meta


__all__ = ["merge_record_parts", "part_rows", "write_part_meta"]
