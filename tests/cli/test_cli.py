"""The CLI surface: one line per command in --help, in pipeline order, --version, and the bundled-corpus default."""

import pytest
from clitools import run_main

from xlnetcli import __version__
from xlnetcli.cli import BUNDLED_CORPUS, cli


def test_help_lists_every_command_on_one_line(capsys):
    code, out, _ = run_main(capsys, "--help")
    assert code == 0
    for name, cmd in cli.commands.items():
        line = next(ln for ln in out.splitlines() if ln.strip().startswith(name + " "))
        assert cmd.get_short_help_str(limit=200).split()[0] in line


def test_help_lists_commands_in_pipeline_order(capsys):
    code, out, _ = run_main(capsys, "--help")
    assert code == 0
    listed = out.split("Commands:")[1].splitlines()
    names = [ln.split()[0] for ln in listed if ln.startswith("  ") and not ln.startswith("   ")]
    assert names == [
        "tokenize",
        "shard",
        "shard-merge",
        "preprocess",
        "preprocess-merge",
        "pretrain",
        "finetune",
        "eval",
        "probe",
        "embed",
        "export",
        "import",
        "plot",
        "config",
    ]
    assert sorted(names) == sorted(cli.commands)


def test_version(capsys):
    code, out, _ = run_main(capsys, "--version")
    assert code == 0 and __version__ in out


@pytest.mark.slow
def test_tokenize_without_inputs_uses_the_bundled_corpus(tmp_path, capsys):
    code, _, err = run_main(capsys, "tokenize", "train", "--out", tmp_path / "tok", "--vocab-size", "1000", "--quiet")
    assert code == 0, err
    assert "bundled corpus" in err and BUNDLED_CORPUS.is_file()
    info = (tmp_path / "tok" / "xlnet_tokenizer.json").read_text()
    assert '"vocab_size": 1000' in info
