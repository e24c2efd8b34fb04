"""`--part I/N`: a stage split across machines (`xlnet shard`, `xlnet preprocess`), what its parts share.

Part I of N is 0-based (I in 0..N-1, as SLURM_ARRAY_TASK_ID and JOB_COMPLETION_INDEX count); each stage decides what
a part holds (shards: whole input files, data/shards/parts.py; records: a range of rows, data/records/parts.py) and
its merge takes every part once.
"""

from __future__ import annotations

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
