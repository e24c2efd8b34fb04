"""The README and docs/ cannot rot: every `xlnet` command in them parses with the real CLI, the file tree in
docs/architecture.md lists exactly the package's files, the Python API example runs, every `xlnetcli.` name
resolves, every relative link lands, and the make targets they name exist."""

from __future__ import annotations

import importlib
import re
import shlex

import click
import pytest
from clitools import PAGES, ROOT, TINY, code_blocks, parse_command

from xlnetcli.cli import cli

PACKAGE = ROOT / "src" / "xlnetcli"
TREE_PAGE = "docs/architecture.md"
TREE_DESC_COL = 26  # in the tree, a name starts left of this column; a description's continuation starts at it
TREE_NAME = r"(?:\{[^}]*\}|[^\s,{])+"  # a file or folder name in the tree, braces allowed: finetune/{glue,race}.yaml


def as_argv(line: str) -> list[str] | None:
    """The argv after `xlnet` of an `xlnet ...` or `... -m xlnetcli ...` command line (shell variables as 0), else
    None."""
    line = re.sub(r"\$\w+", "0", line.split(" #")[0].strip())  # as the shell would: $SLURM_ARRAY_TASK_ID/8 -> 0/8
    argv = shlex.split(line) if line else []
    if argv[:1] == ["xlnet"]:
        return argv[1:]
    if "xlnetcli" in argv and "-m" in argv:
        return argv[argv.index("xlnetcli") + 1 :]
    return None


def page_commands(text: str) -> list[list[str]]:
    """Every command line of a page's bash blocks, and every `xlnet ...` code span in the last cell of a table row
    (the README's pipeline table: one example per stage)."""
    lines = [ln for block in code_blocks("bash", text) for ln in block.replace("\\\n", " ").splitlines()]
    for row in text.splitlines():
        if row.startswith("|") and row.rstrip().endswith("|"):
            lines += re.findall(r"`(xlnet [^`]+)`", row.rstrip().rstrip("|").rsplit("|", 1)[-1])
    return [argv for argv in map(as_argv, lines) if argv is not None]


COMMANDS = [(page, argv) for page, text in PAGES.items() for argv in page_commands(text)]


@pytest.mark.parametrize("page", ["README.md", "docs/commands.md"])
def test_every_command_has_an_example(page):
    cmds = page_commands(PAGES[page])
    used = {c[0] for c in cmds} | {" ".join(c[:2]) for c in cmds if isinstance(cli.commands.get(c[0]), click.Group)}
    for name, cmd in cli.commands.items():
        if isinstance(cmd, click.Group):
            for sub in cmd.commands:
                assert f"{name} {sub}" in used, f"{page} has no example of `xlnet {name} {sub}`"
        else:
            assert name in used, f"{page} has no example of `xlnet {name}`"


@pytest.mark.parametrize("page,argv", COMMANDS, ids=lambda a: a if isinstance(a, str) else " ".join(a)[:60])
def test_command_parses(page, argv):
    """Every command line of the docs parses with the real CLI (clitools.parse_command); nothing is run."""
    assert not isinstance(parse_command(argv, page).command, click.Group)


def test_make_targets_exist():
    makefile = (ROOT / "Makefile").read_text()
    for target in ("demo", "test"):
        assert f"make {target}" in PAGES["README.md"]
    named = {t for text in PAGES.values() for t in re.findall(r"(?:`|^\s*)make ([a-z][\w-]*)", text, flags=re.M)}
    for target in sorted(named):
        assert re.search(rf"^{re.escape(target)}:", makefile, flags=re.M), f"Makefile has no `{target}` target"
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def tree_entries(block: str) -> list[tuple[int, str]]:
    """(indent, path) of every entry of a file tree: a name (or `a, b` / `x{1,2}` names) starting left of the
    description column, nested under the folder entries (ending in /) above it at a smaller indent."""
    out, stack = [], []  # stack: (indent, folder path)
    for line in block.splitlines():
        indent = len(line) - len(line.lstrip())
        if not line.strip() or indent >= TREE_DESC_COL:
            continue
        field = re.match(rf"{TREE_NAME}(?:, {TREE_NAME})*", line.strip()).group(0)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        prefix = stack[-1][1] if stack else ""
        for name in (n for part in field.split(", ") for n in _expand_braces(part)):
            out.append((indent, prefix + name))
        if field.endswith("/"):
            stack.append((indent, prefix + field))
    return out


def _expand_braces(s: str) -> list[str]:
    m = re.search(r"\{([^}]*)\}", s)
    if not m:
        return [s]
    return [x for part in m.group(1).split(",") for x in _expand_braces(s[: m.start()] + part + s[m.end() :])]


def test_file_tree_lists_exactly_the_package():
    tree = next(b for b in code_blocks("", PAGES[TREE_PAGE]) if "src/xlnetcli/" in b)
    entries = tree_entries(tree)
    listed = {
        p.removeprefix("src/xlnetcli/") for _, p in entries if p.startswith("src/xlnetcli/") and not p.endswith("/")
    }
    files = {
        p.relative_to(PACKAGE).as_posix()
        for p in PACKAGE.rglob("*")
        if p.is_file() and p.name != "__init__.py" and "__pycache__" not in p.parts
    }
    assert files - listed == set(), f"files missing from the {TREE_PAGE} tree: {sorted(files - listed)}"
    assert listed - files == set(), f"the {TREE_PAGE} tree lists files that do not exist: {sorted(listed - files)}"
    for indent, path in entries:
        if indent == 0:
            assert (ROOT / path).exists(), f"the {TREE_PAGE} tree lists {path}, which does not exist"


def test_preset_paths_exist():
    for page, text in PAGES.items():
        for cfg in re.findall(r"configs/[\w/{},.]+\.yaml", text):
            for path in _expand_braces(cfg):
                assert (ROOT / path).is_file(), f"{page} mentions {path}, which does not exist"


def test_python_names_resolve():
    """Every dotted `xlnetcli.module.name` the pages cite imports (the longest module prefix, then attributes)."""
    names = {n for text in PAGES.values() for n in re.findall(r"\bxlnetcli(?:\.[A-Za-z_]\w*)+", text)}
    assert names
    for name in sorted(names):
        parts = name.split(".")
        for i in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:i]))
            except ModuleNotFoundError:
                continue
            for attr in parts[i:]:
                assert hasattr(obj, attr), f"{name}: {'.'.join(parts[:i])} has no {attr}"
                obj = getattr(obj, attr)
            break


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lowercased, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_relative_links_land():
    for page, text in PAGES.items():
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+://", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (ROOT / page).parent / path if path else ROOT / page
            assert dest.exists(), f"{page} links to {target}, which does not exist"
            if anchor:
                headings = re.findall(r"^#+ (.+)$", dest.read_text(encoding="utf-8"), flags=re.M)
                assert anchor in {_anchor(h) for h in headings}, f"{page} links to {target}: no such heading"


def test_python_api_example_runs(builds, tmp_path, monkeypatch):
    """The API example (docs/python-api.md), run against a real (tiny, untrained) checkpoint with a real tokenizer."""
    import torch

    from xlnetcli.checkpoint.folders import save_model_dir
    from xlnetcli.config import load_config
    from xlnetcli.model import XLNetLMHeadModel

    cfg = load_config(
        TINY,
        [
            "tokenizer.vocab_size=1000",
            "model.vocab_size=1000",
            "model.n_layer=1",
            "model.d_model=32",
            "model.d_inner=64",
        ],
    )
    save_model_dir(
        tmp_path / "runs" / "tiny" / "step_0000001",
        XLNetLMHeadModel(cfg.model).eval(),
        cfg,
        tokenizer_dir=builds.tokenizer(cfg.tokenizer),
        meta={"kind": "pretrain", "step": 1},
    )
    monkeypatch.chdir(tmp_path)
    examples = [(page, b) for page, text in PAGES.items() for b in code_blocks("python", text) if "api.load" in b]
    assert examples, "no page has the Python API example"
    for page, block in examples:
        scope: dict = {}
        exec(compile(block, page, "exec"), scope)
        out, out2 = scope["out"], scope["out2"]
        n = scope["ids"].shape[1]
        assert out.logits.shape == (1, n, 1000) and out.hidden.shape == (1, n, 32)
        assert len(out2.mems) == 1 and torch.isfinite(out2.logits).all()
