"""Help that teaches: every command's --help ends with examples that parse, its --set example is one the command
accepts, and every preset is listed where a config is named."""

from __future__ import annotations

import shlex

import click
import pytest
from clitools import parse_command, run_main

from xlnetcli.cli import COMMAND_SECTIONS, SET_EXAMPLES, check_override_sections, cli
from xlnetcli.config import PRESETS, load_config


def _commands(group: click.Group = cli, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], click.Command]]:
    out = []
    for name, cmd in group.commands.items():
        out.append(((*path, name), cmd))
        if isinstance(cmd, click.Group):
            out += _commands(cmd, (*path, name))
    return out


COMMANDS = _commands()


def _examples(path: tuple[str, ...], capsys) -> list[list[str]]:
    code, out, _ = run_main(capsys, *path, "--help")
    assert code == 0
    assert "Examples:" in out, f"`xlnet {' '.join(path)} --help` shows no example"
    lines = out.split("Examples:")[1].splitlines()
    return [shlex.split(ln.split(" #")[0].split(" > ")[0])[1:] for ln in lines if ln.strip().startswith("xlnet ")]


@pytest.mark.parametrize("path,cmd", COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_help_shows_examples_that_parse(path, cmd, capsys):
    argvs = _examples(path, capsys)
    assert argvs, f"`xlnet {' '.join(path)} --help` shows no example"
    for argv in argvs:
        ctx = parse_command(argv)
        assert isinstance(cmd, click.Group) or ctx.command is cmd, f"an example of {path} runs {ctx.command.name}"
        for item in ctx.params.get("overrides", ()):
            check_override_sections([item], ctx.command_path.removeprefix("xlnet "))
            load_config(None, [item])


@pytest.mark.parametrize("command", sorted(COMMAND_SECTIONS))
def test_set_example_is_accepted_by_its_command(command, capsys):
    example = SET_EXAMPLES[command]
    check_override_sections([example], command)  # the check the command runs before loading
    load_config(None, [example])
    code, out, _ = run_main(capsys, *command.split(), "--help")
    assert code == 0 and f"--set {example}" in " ".join(out.split())


def test_every_command_that_reads_a_config_has_a_set_example():
    takes_set = {" ".join(p) for p, c in COMMANDS if any(o.name == "overrides" for o in c.params)}
    assert takes_set == set(COMMAND_SECTIONS) == set(SET_EXAMPLES)


@pytest.mark.parametrize("argv", [["config"], ["config", "show"], ["pretrain"], ["finetune"]])
def test_help_lists_every_preset(argv, capsys):
    code, out, _ = run_main(capsys, *argv, "--help")
    assert code == 0
    words = " ".join(out.split()).replace("continue- ", "continue-")  # click may wrap at the hyphen
    for name in PRESETS:
        assert name in words, f"`xlnet {' '.join(argv)} --help` leaves out the preset {name}"
