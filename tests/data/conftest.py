"""The data tests' shared pipeline: a 2000-piece tokenizer, the bundled corpus in shards, records of them (built once
per session by the ``builds`` fixture of tests/conftest.py; read only)."""

from __future__ import annotations

from pathlib import Path

import pytest
from clitools import CORPUS, preprocess_cfg, save_with_transformers, train_released_spm

from xlnetcli.config import TokenizerConfig


@pytest.fixture(scope="session")
def tok_dir(builds) -> Path:
    """A tokenizer (ids 0-8 as docs/xlnet.md §1)."""
    return builds.tokenizer(TokenizerConfig(vocab_size=2000))


@pytest.fixture(scope="session")
def shard_dir(builds, tok_dir) -> Path:
    """The pydocs corpus in 3 train shards and a valid shard."""
    return builds.shards(tok_dir, CORPUS, shards=3, valid_fraction=0.05)


@pytest.fixture(scope="session")
def records(builds, shard_dir) -> Path:
    return builds.records(shard_dir, preprocess_cfg(), passes=2)


@pytest.fixture(scope="session")
def released_spm(tmp_path_factory) -> Path:
    """A released-style spiece.model (clitools.train_released_spm)."""
    return train_released_spm(tmp_path_factory.mktemp("released"))


@pytest.fixture(scope="session")
def released_dir(tmp_path_factory, released_spm) -> Path:
    """A cased transformers XLNet tokenizer directory of the released-style model (as xlnet-base-cased's)."""
    pytest.importorskip("transformers")
    return save_with_transformers(released_spm, tmp_path_factory.mktemp("hf") / "cased")
