"""The README cannot rot: every `xlnet` command in it parses with the real CLI, the file tree matches the repository,
the Python API example runs, and the two set-up commands exist."""

from __future__ import annotations

import re
import shlex

import click
import pytest

from clitools import README, ROOT, TINY, code_blocks

from xlnetcli.cli import cli


def readme_commands() -> list[list[str]]:
    """Every `xlnet ...` or `... -m xlnetcli ...` command line in the README's bash blocks, as argv after `xlnet`."""
    cmds = []
    for block in code_blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #")[0].strip()
            argv = shlex.split(line) if line else []
            if argv[:1] == ["xlnet"]:
                cmds.append(argv[1:])
            elif "xlnetcli" in argv and "-m" in argv:
                cmds.append(argv[argv.index("xlnetcli") + 1:])
    return cmds


COMMANDS = readme_commands()


def test_readme_covers_every_command():
    used = {c[0] for c in COMMANDS} | {" ".join(c[:2]) for c in COMMANDS if isinstance(cli.commands.get(c[0]),
                                                                                   click.Group)}
    for name, cmd in cli.commands.items():
        if isinstance(cmd, click.Group):
            for sub in cmd.commands:
                assert f"{name} {sub}" in used, f"README has no example of `xlnet {name} {sub}`"
        else:
            assert name in used, f"README has no example of `xlnet {name}`"


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: " ".join(a)[:60])
def test_readme_command_parses(argv):
    """Resolve the sub-command and parse its options exactly as click would (unknown options, missing required
    options and bad choices fail here); nothing is run."""
    ctx = cli.make_context("xlnet", list(argv), resilient_parsing=False)
    group, args = cli, list(argv)
    while isinstance(group, click.Group):
        name, cmd, args = group.resolve_command(ctx, args)
        assert cmd is not None, f"unknown command {name}"
        ctx = cmd.make_context(name, list(args), parent=ctx)
        group = cmd
    assert ctx.command.name == group.name


def test_make_targets_exist():
    makefile = (ROOT / "Makefile").read_text()
    for target in ("demo", "test"):
        assert f"make {target}" in README
        assert re.search(rf"^{target}:", makefile, flags=re.M), f"Makefile has no `{target}` target"
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_file_tree_matches_the_repository():
    tree = next(b for b in code_blocks("") if "src/xlnetcli/" in b)
    listed = set(re.findall(r"\b([a-z_]+\.py)\b", tree))
    modules = {p.name for p in (ROOT / "src" / "xlnetcli").glob("**/*.py")} - {"__init__.py", "__main__.py"}
    assert modules - listed == set(), f"modules missing from the README tree: {sorted(modules - listed)}"
    for name in listed:
        assert list(ROOT.glob(f"**/{name}")), f"README tree lists {name}, which does not exist"
    for cfg in re.findall(r"configs/[\w/{},.]+\.yaml", README):
        for path in _expand_braces(cfg):
            assert (ROOT / path).is_file(), f"README mentions {path}, which does not exist"


def _expand_braces(s: str) -> list[str]:
    m = re.search(r"\{([^}]*)\}", s)
    if not m:
        return [s]
    return [x for part in m.group(1).split(",") for x in _expand_braces(s[: m.start()] + part + s[m.end():])]


def test_python_api_example_runs(builds, tmp_path, monkeypatch):
    """The README's API block, run against a real (tiny, untrained) checkpoint with a real tokenizer."""
    import torch

    from xlnetcli.checkpoint.folders import save_model_dir
    from xlnetcli.config import load_config
    from xlnetcli.model import XLNetLMHeadModel

    cfg = load_config(TINY, ["tokenizer.vocab_size=1000", "model.vocab_size=1000",
                             "model.n_layer=1", "model.d_model=32", "model.d_inner=64"])
    save_model_dir(tmp_path / "runs" / "tiny" / "step_0000001", XLNetLMHeadModel(cfg.model).eval(), cfg,
                   tokenizer_dir=builds.tokenizer(cfg.tokenizer), meta={"kind": "pretrain", "step": 1})
    monkeypatch.chdir(tmp_path)
    block = next(b for b in code_blocks("python") if "api.load" in b)
    scope: dict = {}
    exec(compile(block, "README.md", "exec"), scope)
    out, out2 = scope["out"], scope["out2"]
    n = scope["ids"].shape[1]
    assert out.logits.shape == (1, n, 1000) and out.hidden.shape == (1, n, 32)
    assert len(out2.mems) == 1 and torch.isfinite(out2.logits).all()
