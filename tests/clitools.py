"""Shared constants and helpers for tests: paths (the repository, the tiny preset, fixtures, the bundled corpus), the
common override lists, configs, running `xlnet` in-process, the one-line error contract, kill-and-resume sweeps (the
shared tokenizer, shards and records are conftest.py's ``builds`` fixture)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest
import sentencepiece as spm
from safetensors.torch import load_file

from xlnetcli.cli import cli, main
from xlnetcli.config import Config, dump_config, load_config
from xlnetcli.data.tokenizer import CONTROL_SYMBOLS, USER_DEFINED_SYMBOLS
from xlnetcli.report.metrics_log import read_metrics

ROOT = Path(__file__).resolve().parents[1]
# the README and every page of docs/, by path relative to the repository: what a user reads
PAGES = {
    p.relative_to(ROOT).as_posix(): p.read_text(encoding="utf-8")
    for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
}
PRESET_DIR = ROOT / "src" / "xlnetcli" / "config" / "presets"
TINY = PRESET_DIR / "tiny.yaml"
FIXTURES = ROOT / "tests" / "fixtures"
SAMPLE = FIXTURES / "sample.txt"  # a few hundred KB of the bundled corpus (scripts/make_demo_data.py)
SQUAD = FIXTURES / "squad_pydocs.json"  # hand-written SQuAD 2.0 questions on stdlib doc paragraphs
PYDOCS = ROOT / "data" / "pydocs"  # the bundled corpus and tasks (data/pydocs/NOTICE.md)
CORPUS = PYDOCS / "corpus.txt"
TRAIN_TSV = PYDOCS / "task_train.tsv"
VALID_TSV = PYDOCS / "task_valid.tsv"
BIN = Path(sys.executable).parent  # where the `xlnet` and `torchrun` console scripts are

# The tiny preset shrunk so that a pretraining step takes milliseconds on a shared 2-core CPU (d_model 64, 2 layers,
# 32-token rows, 6 targets); modules add their schedule (eval_every, save_every, max_steps) after it.
FAST_PRETRAIN = [
    "tokenizer.vocab_size=1000",
    "model.vocab_size=1000",
    "model.n_layer=2",
    "model.d_model=64",
    "model.n_head=2",
    "model.d_head=32",
    "model.d_inner=128",
    "data.seq_len=32",
    "model.reuse_len=16",
    "model.mem_len=16",
    "data.num_predict=6",
    "train.global_batch_size=4",
    "train.micro_batch_size=2",
    "data.valid_fraction=0.05",
    "train.warmup_steps=2",
    "train.log_every=1",
    "train.eval_batches=2",
]

# Smaller still, for runs in subprocesses (d_model 32, 32-token rows, 6 targets): the model and data settings
# without the layer count, which modules set with their schedule.
MICRO_MODEL = [
    "tokenizer.vocab_size=1000",
    "model.vocab_size=1000",
    "model.d_model=32",
    "model.n_head=2",
    "model.d_head=16",
    "model.d_inner=64",
    "data.seq_len=32",
    "model.reuse_len=16",
    "model.mem_len=16",
    "data.num_predict=6",
    "train.global_batch_size=4",
    "train.micro_batch_size=2",
    "data.valid_fraction=0.05",
]


def set_args(overrides: list[str]) -> list[str]:
    """``["a=1", "b=2"]`` -> ``["--set", "a=1", "--set", "b=2"]``: overrides as `xlnet` options."""
    return [arg for o in overrides for arg in ("--set", o)]


def kill_and_resume(start, kills: int, before_kill) -> int:
    """Fault injection: ``start()`` launches the command (a resuming one); ``kills`` times, ``before_kill(proc, k)``
    waits for the moment to strike and the process gets SIGKILL if still running; then one run goes to the end and
    must exit 0. Returns the number of kills that landed (a run that finished first ends the loop early)."""
    landed = 0
    while True:
        proc = start()
        if landed < kills:
            before_kill(proc, landed)
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
                landed += 1
                continue
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err.decode() if isinstance(err, bytes) else err
        return landed


def kill_when_written(cmd: list[str], marker: Path, timeout: float = 120) -> None:
    """Run ``cmd`` (an `xlnet` command) and SIGKILL it once ``marker`` exists (a checkpoint's file); asserts it was
    still running then, i.e. the kill landed mid-run."""
    proc = subprocess.Popen(cmd, env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + timeout
    while not marker.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    still_running = proc.poll() is None
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert still_running, proc.stderr.read().decode() if proc.stderr else ""
    assert proc.returncode == -signal.SIGKILL


def flip_bit(path: Path, offset_from_end: int) -> None:
    """Corrupt ``path`` in place: flip the lowest bit of the byte ``offset_from_end`` bytes before its end."""
    data = bytearray(path.read_bytes())
    data[-offset_from_end] ^= 1
    path.write_bytes(bytes(data))


def preprocess_cfg(*extra: str) -> Config:
    """The tiny preset with a 2000-piece vocabulary and 64-token rows: the data tests' records (tests/data/conftest.py)
    plus ``extra`` overrides."""
    base = [
        "tokenizer.vocab_size=2000",
        "model.vocab_size=2000",
        "data.seq_len=64",
        "model.reuse_len=32",
        "data.num_predict=11",
        "train.global_batch_size=8",
        "train.micro_batch_size=4",
        "model.bi_data=true",
    ]
    return load_config(TINY, base + list(extra))


def settings_config(section: str, **keys) -> Config:
    """The default config with some keys of one section set: settings_config("tokenizer", vocab_size=2000)."""
    return load_config(None, [f"{section}.{k}={v}" for k, v in keys.items()])


def run_main(capsys, *args) -> tuple[int, str, str]:
    """Run ``xlnet ARGS`` through the real entry point; returns (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as e:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    return int(e.value.code or 0), out, err


def assert_one_line_error(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("xlnet: error:"), err
    assert "Traceback" not in err
    for n in needles:
        assert n in err, err


def child_env() -> dict:
    """The environment of an `xlnet` subprocess: one thread (bit-identical float reductions), no progress bars,
    unbuffered output, and not a torchrun rank."""
    env = dict(os.environ, XLNET_NO_PROGRESS="1", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    return env


def write_config(path: Path, overrides: list[str]) -> Path:
    """The tiny preset with ``overrides`` written to ``path`` as a config file."""
    path.write_text(dump_config(load_config(TINY, overrides)))
    return path


def train_losses(run: Path) -> list[tuple[int, float]]:
    """(step, loss) of every training row of a run's metrics.jsonl."""
    return [(r["step"], r["loss"]) for r in read_metrics(run) if r["split"] == "train"]


def step_weights(step_dir: Path) -> dict:
    """The tensors of a step folder's model.safetensors."""
    return load_file(str(step_dir / "model.safetensors"))


def code_blocks(lang: str, text: str | None = None) -> list[str]:
    """The bodies of the fenced blocks whose info string is ``lang`` ('' for plain fences), in ``text`` or, by
    default, in the README and docs/ (PAGES)."""
    blocks, body, current = [], [], None
    for line in (text if text is not None else "\n".join(PAGES.values())).splitlines():
        if line.startswith("```"):
            if current is None:
                current, body = line[3:].strip(), []
            else:
                if current == lang:
                    blocks.append("\n".join(body) + "\n")
                current = None
        elif current is not None:
            body.append(line)
    return blocks


def xlnet_spm(tmp_path: Path, train_file: str, lower: bool = False) -> bytes:
    """A SentencePiece model with XLNet's symbols trained directly with sentencepiece on a file named ``train_file``
    (as Hugging Face's spiece.model was; xlnet's own trainer names its file .normalized.*.txt)."""
    src = tmp_path / train_file
    text = SAMPLE.read_text(encoding="utf-8")
    src.write_text(text.lower() if lower else text, encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(src),
        model_prefix=str(tmp_path / "m"),
        model_type="unigram",
        vocab_size=600,
        num_threads=1,
        control_symbols=list(CONTROL_SYMBOLS),
        user_defined_symbols=list(USER_DEFINED_SYMBOLS),
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        minloglevel=2,
    )
    return (tmp_path / "m.model").read_bytes()


# The original XLNet's spm_train flags (zihangdai/xlnet README, "Pretraining with XLNet"); SentencePiece's own
# defaults put <unk> <s> </s> at 0-2, so the released ids 0-8 are <unk> <s> </s> <cls> <sep> <pad> <mask> <eod> <eop>.
RELEASED_CONTROL = ["<cls>", "<sep>", "<pad>", "<mask>", "<eod>"]
RELEASED_USER_DEFINED = ["<eop>", ".", "(", ")", '"', "-", "\u2013", "\u00a3", "\u20ac"]


def train_released_spm(out_dir: Path) -> Path:
    """A released-style spiece.model in ``out_dir``: the original's flags (unigram, coverage 0.99995, its control and
    user-defined symbols, shuffled input) on the bundled corpus, 3000 pieces instead of 32000 (about 1 s)."""
    spm.SentencePieceTrainer.train(
        input=str(CORPUS),
        model_prefix=str(out_dir / "spiece"),
        model_type="unigram",
        vocab_size=3000,
        character_coverage=0.99995,
        control_symbols=RELEASED_CONTROL,
        user_defined_symbols=RELEASED_USER_DEFINED,
        shuffle_input_sentence=True,
        num_threads=1,
        minloglevel=2,
    )
    return out_dir / "spiece.model"


def save_with_transformers(spiece: Path, out: Path, lower: bool = False, keep_accents: bool = False) -> Path:
    """``out`` as transformers' XLNetTokenizer saves a tokenizer built from ``spiece`` (tokenizer_config.json with
    do_lower_case and keep_accents, tokenizer.json), plus spiece.model as a released directory holds it: transformers
    5 builds the tokenizer from the model but writes no spiece.model (its save_vocabulary calls it tokenizer.model)."""
    import shutil

    import transformers

    src = out.with_name(out.name + ".src")
    src.mkdir(parents=True)
    shutil.copyfile(spiece, src / "spiece.model")
    xl = transformers.XLNetTokenizer.from_pretrained(src, do_lower_case=lower, keep_accents=keep_accents)
    xl.save_pretrained(out)
    if not (out / "spiece.model").is_file():
        shutil.copyfile(spiece, out / "spiece.model")
    return out


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (Linux /proc)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def child_pids(pid: int) -> list[int]:
    """The live (not zombie) children of process ``pid``."""
    path = Path(f"/proc/{pid}/task/{pid}/children")
    try:
        kids = [int(k) for k in path.read_text().split()]
    except OSError:
        return []
    return [k for k in kids if _alive(k)]


def wait_gone(pids: list[int], seconds: float = 10.0, what: str = "a helper outlived its parent") -> None:
    """Wait until none of ``pids`` is alive; fail with ``what`` after ``seconds``."""
    deadline = time.time() + seconds
    while any(_alive(k) for k in pids):
        assert time.time() < deadline, what
        time.sleep(0.05)


def parse_command(argv: list[str], where: str = "") -> click.Context:
    """Resolve ``xlnet ARGV``'s sub-command and parse its options exactly as click would (unknown options, missing
    required options and bad choices fail here); nothing is run. The context of the command reached."""
    ctx = cli.make_context("xlnet", list(argv), resilient_parsing=False)
    group, args = cli, list(argv)
    while isinstance(group, click.Group):
        name, cmd, args = group.resolve_command(ctx, args)
        assert cmd is not None, f"{where or argv}: unknown command {name}"
        ctx = cmd.make_context(name, list(args), parent=ctx)
        group = cmd
    return ctx
