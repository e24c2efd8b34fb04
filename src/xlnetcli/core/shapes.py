"""Shape checks for the JSON the tool reads back (meta.json, manifests, HF config.json, metrics rows, lock files):
JSON that parses but is not the expected object is refused in one line naming the file and the field, never a
TypeError or KeyError deep inside.

    meta = read_json_object(path, CheckpointError)
    step = json_field(meta, "step", int, path, CheckpointError, lo=0)
    with fix_hint("rerun `xlnet shard`"):                  # every refusal inside ends with the way out
        json_field(meta, "dtype", str, path)
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from xlnetcli.core.errors import DataError, XLNetError

_KIND_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string", list: "a list"}
_KIND_NAMES[dict] = "an object"
MISSING = object()


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def loads_strict(text: str) -> Any:
    """json.loads that refuses NaN/Infinity (Python writes them, no other JSON reader accepts them); nesting deeper
    than Python's stack is a ValueError too, never a RecursionError."""
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def finite_or_null(obj: Any) -> Any:
    """``obj`` with every NaN or infinite float replaced by None: how a metric that has no value (a Pearson of a
    constant prediction, a diverged loss) is written, so that every file the tool writes is strict JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_or_null(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_null(v) for v in obj]
    return obj


def dumps_strict(obj: Any, **kwargs: Any) -> str:
    """json.dumps writing NaN/inf as null (``finite_or_null``): never the NaN/Infinity tokens JSON does not have."""
    return json.dumps(finite_or_null(obj), allow_nan=False, **kwargs)


def read_json_object(path: str | Path, error: type[XLNetError] = DataError, what: str = "") -> dict[str, Any]:
    """A JSON file holding one object; ``error`` naming the file otherwise (unreadable, not UTF-8, not JSON, not an
    object). ``what`` says what the file should be, for the message."""
    path = Path(path)
    hint = f" ({what})" if what else ""
    try:
        obj = loads_strict(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise error(f"{path}: unreadable ({e.strerror or type(e).__name__}){hint}") from None
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise error(f"{path}: corrupt (not valid JSON){hint}") from None
    if not isinstance(obj, dict):
        raise error(f"{path}: not a JSON object (found {describe(obj)}){hint}")
    return obj


def read_folder_json(folder: Path, name: str, what: str, create: str, rerun: str) -> dict[str, Any]:
    """``folder/name``, the JSON object that makes ``folder`` a ``what`` (a shard directory, a shard part, ...), read
    with read_json_object; DataError naming the command that makes one (``create``) when the folder or the file is
    missing, and the one to rerun (``rerun``) when the file is damaged."""
    path = folder / name
    if not folder.is_dir():
        raise DataError(f"{what} {folder} does not exist; create it with `{create}`")
    if not path.is_file():
        raise DataError(f"{folder} has no {name}: not a {what} (create one with `{create}`)")
    return read_json_object(path, DataError, f"rerun `{rerun}`")


def describe(value: Any) -> str:
    """A short account of a JSON value for a message: its kind and, when short, the value ("a string \"3\"")."""
    if value is None:
        return "null"
    kind = "a boolean" if isinstance(value, bool) else _KIND_NAMES.get(type(value), type(value).__name__)
    text = json.dumps(value, default=str) if not isinstance(value, float) or math.isfinite(value) else str(value)
    return f"{kind} {text}" if len(text) <= 40 else kind


def json_field(
    obj: dict[str, Any],
    key: str,
    kind: type | tuple[type, ...],
    where: str | Path,
    error: type[XLNetError] = DataError,
    *,
    lo: float | None = None,
    hi: float | None = None,
    default: Any = MISSING,
) -> Any:
    """``obj[key]`` checked: of ``kind`` (an int is a number, a bool is not), finite and within [lo, hi] when a number.
    Absent: ``default`` when given, else ``error`` naming ``where`` and the field."""
    if key not in obj:
        if default is not MISSING:
            return default
        raise error(f"{where}: field {key!r} is missing")
    value = obj[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    ok = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)
    if not ok and float in kinds and isinstance(value, int) and not isinstance(value, bool):
        ok = True
    if not ok:
        want = " or ".join(_KIND_NAMES.get(k, k.__name__) for k in kinds)
        raise error(f"{where}: field {key!r} must be {want}, found {describe(value)}")
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if number and (not math.isfinite(value) or (lo is not None and value < lo) or (hi is not None and value > hi)):
        bounds = [b for b in (lo is not None and f">= {lo}", hi is not None and f"<= {hi}") if b]
        raise error(f"{where}: field {key!r} is {value}, out of range (must be {' and '.join(bounds) or 'finite'})")
    return value


@contextlib.contextmanager
def fix_hint(fix: str) -> Iterator[None]:
    """An XLNetError raised inside (a field of the wrong kind, a missing key) ends with ``fix``: the command that
    writes the file again, so that a refusal names the file, the key and the way out in one line."""
    try:
        yield
    except XLNetError as e:
        if fix not in str(e):
            e.args = (f"{e}; {fix}",)
        raise


def str_map(obj: Any, key: str, where: str | Path, error: type[XLNetError] = DataError) -> dict[str, str]:
    """``obj[key]`` as a {string: string} object (checksums by file name), else ``error`` naming the field."""
    value = json_field(obj, key, dict, where, error)
    for k, v in value.items():
        if not isinstance(v, str):
            raise error(f"{where}: field {key!r} entry {k!r} must be a string, found {describe(v)}")
    return value
