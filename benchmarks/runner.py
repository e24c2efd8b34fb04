"""Running `xlnet` commands from the benchmarks, measured one way: wall and CPU seconds of the whole process, its
output kept only to explain a failure (the last lines, then exit). Imported by the benchmark scripts next to it
(`python benchmarks/NAME.py` puts this folder on sys.path)."""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
XLNET = str(Path(sys.executable).with_name("xlnet"))
# without the installed entry point (a GPU machine reading the tree through PYTHONPATH): the package as a module
XLNET_CMD = [XLNET] if Path(XLNET).exists() else [sys.executable, "-m", "xlnetcli"]
_print_lock = threading.Lock()


def say(msg: str) -> None:
    """A time- and load-stamped progress line on stderr (safe from several threads)."""
    with _print_lock:
        print(f"[{time.strftime('%H:%M:%S')} load {os.getloadavg()[0]:.1f}] {msg}", file=sys.stderr, flush=True)


def sets_args(sets: Iterable[str]) -> list[str]:
    """``("a.b=1", ...)`` as ``--set a.b=1 ...``."""
    return [a for s in sets for a in ("--set", s)]


def xlnet(*args: str, threads: int | None = None, echo: bool = False) -> tuple[float, float]:
    """Run ``xlnet ARGS`` with ``threads`` OpenMP threads (default: OMP_NUM_THREADS, else 1) and no progress bars;
    returns its (wall, CPU user + system) seconds. ``echo`` prints the command first. A failure exits with the
    command and the last lines of its output."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(threads or os.environ.get("OMP_NUM_THREADS", "1")),
        "XLNET_NO_PROGRESS": "1",
    }
    if echo:
        say("$ " + shlex.join(["xlnet", *args]))
    t0 = time.time()
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen([*XLNET_CMD, *args], cwd=ROOT, env=env, text=True, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            log.seek(0)
            tail = log.read().strip().splitlines()[-5:]
            raise SystemExit(
                f"{Path(sys.argv[0]).stem}: {shlex.join(['xlnet', *args])} failed "
                f"({os.waitstatus_to_exitcode(status)}):\n" + "\n".join(tail)
            )
    return time.time() - t0, usage.ru_utime + usage.ru_stime


def check_sets(sets: Iterable[str], prefixes: tuple[str, ...], flag: str, config: str = "tiny") -> None:
    """Exit with one line unless every override is KEY=VALUE under ``prefixes``, changes no preprocessed record
    (those keys would need records of their own) and loads onto ``config``."""
    from xlnetcli.config import load_config
    from xlnetcli.core.errors import XLNetError
    from xlnetcli.train.pretrain import RECORD_KEYS

    sets = list(sets)
    for s in sets:
        key = s.split("=", 1)[0]
        if "=" not in s or not key.startswith(prefixes):
            raise SystemExit(
                f"{Path(sys.argv[0]).stem}: {flag} {s!r}: expected KEY=VALUE with a key under {' or '.join(prefixes)}"
            )
        if key in RECORD_KEYS.values():
            raise SystemExit(
                f"{Path(sys.argv[0]).stem}: {flag} {s!r}: {key} changes the preprocessed records, "
                "which this benchmark builds once from the preset"
            )
    try:
        load_config(config, sets)
    except XLNetError as e:
        raise SystemExit(f"{Path(sys.argv[0]).stem}: {flag}: {e}") from None


DEMO_FINETUNE = ("finetune.summary_type=mean",)  # the demo's finetuning reads the mean of the last layer


def add_override_args(ap: argparse.ArgumentParser, pretraining: str) -> None:
    """--set (model.* / train.* for ``pretraining``) and --finetune-set (every finetuning), both repeatable."""
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"model.* / train.* override of the tiny preset for {pretraining} (repeatable; the demo's "
        "recipe: --set model.n_layer=2)",
    )
    ap.add_argument(
        "--finetune-set",
        action="append",
        default=None,
        metavar="KEY=VALUE",
        help="finetune.* override for every finetuning (repeatable; default: the demo's "
        + " ".join(DEMO_FINETUNE)
        + ")",
    )


def overrides(args: argparse.Namespace) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(pretraining, finetuning) overrides of ``add_override_args``, checked (``check_sets``)."""
    sets, ft_sets = tuple(args.set), tuple(args.finetune_set or DEMO_FINETUNE)
    check_sets(sets, ("model.", "train."), "--set")
    check_sets(ft_sets, ("finetune.",), "--finetune-set")
    return sets, ft_sets
