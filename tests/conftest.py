"""Session-wide builds shared by the test modules: tokenizer -> shards -> records of small real text.

Training a tokenizer takes 1-2 s on the 2-core test machine and a dozen modules want the same one (the tiny preset
with a 1000-piece vocabulary, on tests/fixtures/sample.txt), most of them also the same shards and records. The
``builds`` fixture makes each stage once per distinct setting and hands every later asker the same folder.

The folders are shared, so tests only read them: a test that changes a tokenizer, shard or record file copies the
folder first (shutil.copytree). At the end of the session every shared folder is compared with what was built, and a
difference fails the run naming the files, so a test that writes into one is caught instead of spoiling the others.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest
import torch

# attn_impl "triton" on a machine without CUDA runs in Triton's interpreter, which @triton.jit picks when a kernel is
# defined: triton's own (tl.rand ...) when triton is first imported, and torch._dynamo or transformers import it in
# many tests. So it is chosen here, before any test module (tests/model/test_triton_attention.py).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from clitools import SAMPLE, TINY


class Pipeline(NamedTuple):
    tokenizer: Path
    shards: Path
    records: Path


def tree_digest(root: Path) -> dict[str, str]:
    """Every file and folder under ``root``: relative path -> sha256 of the bytes ("dir" for a folder)."""
    return {
        str(p.relative_to(root)): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
    }


class Builds:
    """Tokenizers, shard folders and records, each built once per setting under ``root`` (read-only for tests)."""

    def __init__(self, root: Path):
        self.root = root
        self._built: dict[tuple, Path] = {}
        self._digests: dict[Path, dict[str, str]] = {}

    def _once(self, key: tuple, stage: str, build: Callable[[Path], object]) -> Path:
        if key not in self._built:
            out = self.root / f"{stage}_{len(self._built)}"
            build(out)
            self._built[key] = out
            self._digests[out] = tree_digest(out)
        return self._built[key]

    def tokenizer(self, tcfg, src: Path = SAMPLE) -> Path:
        """A tokenizer trained on ``src`` with the TokenizerConfig ``tcfg`` (thread count included: it changes the
        pieces SentencePiece picks)."""
        from xlnetcli.config import Config, ModelConfig
        from xlnetcli.data.tokenizer import train_tokenizer

        cfg = Config(tokenizer=tcfg, model=ModelConfig(vocab_size=tcfg.vocab_size))
        return self._once(
            ("tokenizer", str(src), dataclasses.astuple(tcfg)),
            "tok",
            lambda out: train_tokenizer(cfg, [src], out, quiet=True),
        )

    def shards(
        self, tokenizer: Path, src: Path = SAMPLE, *, valid_fraction: float, seed: int = 42, shards: int = 1
    ) -> Path:
        """``src`` sharded with ``tokenizer`` (a folder from :meth:`tokenizer`)."""
        from xlnetcli.config import Config, DataConfig
        from xlnetcli.data.shards.shard import ShardOptions, shard_corpus

        cfg = Config(data=DataConfig(valid_fraction=valid_fraction, seed=seed))
        return self._once(
            ("shards", str(tokenizer), str(src), valid_fraction, seed, shards),
            "shards",
            lambda out: shard_corpus(cfg, [src], out, tokenizer, ShardOptions(shards=shards, quiet=True)),
        )

    def records(self, shards: Path, cfg, passes: int | None = None) -> Path:
        """Records of ``shards`` preprocessed with the Config ``cfg`` (all of it: records keep their config.yaml,
        which `xlnet pretrain` without --config reads)."""
        from xlnetcli.config import config_to_dict
        from xlnetcli.data.records.preprocess import preprocess

        if passes is not None:
            cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, passes=passes))
        key = ("records", str(shards), json.dumps(config_to_dict(cfg), sort_keys=True))
        return self._once(key, "rec", lambda out: preprocess(cfg, shards, out, quiet=True))

    def pipeline(self, overrides: list[str], src: Path = SAMPLE, config: Path = TINY) -> Pipeline:
        """tokenizer -> shards -> records of ``src`` with ``config`` + ``overrides`` (data.valid_fraction and
        data.seed split the shards, as `xlnet shard --config` does)."""
        from xlnetcli.config import load_config

        cfg = load_config(config, overrides)
        tok = self.tokenizer(cfg.tokenizer, src)
        shards = self.shards(tok, src, valid_fraction=cfg.data.valid_fraction, seed=cfg.data.seed)
        return Pipeline(tok, shards, self.records(shards, cfg))

    def changed(self) -> list[str]:
        """The shared files that differ from what was built (written, added or removed)."""
        out = []
        for root, was in self._digests.items():
            now = tree_digest(root)
            out += [str(root / name) for name in sorted(set(was) | set(now)) if was.get(name) != now.get(name)]
        return out


@pytest.fixture(scope="session")
def builds(tmp_path_factory) -> Builds:
    """The session's shared tokenizers, shards and records; tests read them or copy them before changing them."""
    b = Builds(tmp_path_factory.mktemp("builds"))
    yield b
    changed = b.changed()
    assert not changed, f"tests wrote into shared builds (copy the folder first): {changed}"


@pytest.fixture(autouse=True)
def _signal_handlers_restored():
    """Each test starts with this process's SIGTERM / SIGINT handlers as they were: a test that ends in a caught
    preemption leaves SIGTERM ignored on purpose (core/errors.py Preempted), which must not leak into the next."""
    import signal

    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield
    for s, handler in saved.items():
        if handler is not None:
            signal.signal(s, handler)
