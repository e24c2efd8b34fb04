"""`--part I/N`: a stage split across machines (`xlnet shard`, `xlnet preprocess`), what its parts share.

Part I of N is 0-based (I in 0..N-1, as SLURM_ARRAY_TASK_ID and JOB_COMPLETION_INDEX count); each stage decides what
a part holds (shards: whole input files, data/shards/parts.py; records: a range of rows, data/records/parts.py) and
its merge takes every part once.
"""

from __future__ import annotations

import json
from pathlib import Path

from xlnetcli.core.errors import DataError, XLNetError

# Parts of one stage at most: each is a job and a folder of its own, and a merge takes every one on its command line
# (a stage also bounds N by what it splits: preprocess by the rows of a global batch)
MAX_PARTS = 100_000


def parse_part(text: str) -> tuple[int, int]:
    """'I/N' -> (I, N), 0-based: I in 0..N-1, N at most MAX_PARTS (XLNetError otherwise)."""
    a, sep, b = text.partition("/")
    try:
        i, n = int(a), int(b)
    except ValueError:
        i = n = -1
    if not sep or n < 1:
        raise XLNetError(
            f"--part {text!r}: expected I/N with 1 <= N <= {MAX_PARTS} and 0 <= I < N (0-based), e.g. --part 0/8"
        )
    check_part((i, n))
    return i, n


def check_part(part: tuple[int, int], most: int = MAX_PARTS, what: str = "") -> None:
    """Refuse a part index out of 0..N-1 and more than ``most`` parts (``what``: why that many, for the message)."""
    i, n = part
    if n > most:
        why = what or "each part is a job and a folder of its own"
        raise XLNetError(f"--part {i}/{n}: {n} parts, more than {most} ({why}); choose N <= {most}")
    if not 0 <= i < n:
        raise XLNetError(f"--part {i}/{n}: part index {i} is out of range; parts are numbered 0..{n - 1} (0-based)")


def each_part_once(metas: list[tuple[Path, dict]], n: int, command: str) -> list[tuple[Path, dict]]:
    """The (folder, part.json) of the N parts of one run sorted by index; DataError naming a part given twice or the
    first one missing (and the `xlnet COMMAND --part` that makes it)."""
    seen: dict[int, Path] = {}
    for d, m in metas:
        if m["part"] in seen:
            raise DataError(f"part {m['part']}/{n} given twice ({seen[m['part']]} and {d})")
        seen[m["part"]] = d
    missing = [i for i in range(n) if i not in seen]
    if missing:
        raise DataError(
            f"part {missing[0]}/{n} is missing ({len(missing)} of {n} parts missing); run "
            f"`xlnet {command} ... --part {missing[0]}/{n}` and merge all {n} parts"
        )
    return sorted(metas, key=lambda dm: dm[1]["part"])


# part.json's kind -> (what the merged folder is, the command that makes a part, the merge)
_PART_KINDS = {
    "xlnet-shard-part": ("shard directory", "shard", "shard-merge"),
    "xlnet-records-part": ("records directory", "preprocess", "preprocess-merge"),
}


def part_folder_hint(folder: Path, kind: str) -> DataError | None:
    """When ``folder`` is a part folder of kind ``kind`` (its part.json) where the merged folder is expected (the
    reader found no manifest.json / meta.json): the one-line error saying so and naming the merge; None otherwise.
    part.json is read leniently: anything unexpected gives None (the reader's own message then)."""
    try:
        m = json.loads((Path(folder) / "part.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(m, dict) or m.get("kind") != kind or kind not in _PART_KINDS:
        return None
    what, command, merge = _PART_KINDS[kind]
    i, n = m.get("part"), m.get("parts")
    which = f"part {i}/{n}" if type(i) is int and type(n) is int else "a part"
    every = f"all {n} parts" if type(n) is int else "all the parts"
    return DataError(
        f"{folder} is {which} of an `xlnet {command} --part I/N` run (part.json), not a whole {what}: combine "
        f"{every} with `xlnet {merge} PARTS... --out DIR` and pass DIR"
    )
