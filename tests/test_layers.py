"""The import contract: packages by pipeline stage, imports only down the stages, no import cycle.

Every module under src/xlnetcli is parsed with `ast` (nothing is imported); every import of `xlnetcli.*` counts,
including those inside functions and under TYPE_CHECKING. A failure names the file, the line, the import and the
packages the importer may use.
"""

from __future__ import annotations

import ast
from pathlib import Path

from clitools import ROOT

SRC = ROOT / "src"
PACKAGE = "xlnetcli"

# The layers, low to high: the one table of what may import what. A package may import itself and the packages on
# lower layers; packages on the same layer (data, model, report; api, cli) may not import each other. The package
# root (xlnetcli/__init__.py, the version string) is the bottom: importing any submodule runs it, so it imports
# nothing; `python -m xlnetcli` (__main__) sits on the CLI.
LAYERS: list[set[str]] = [
    {"__init__"},
    {"core"},  # errors, files (atomic writes, locks), console, dist
    {"config"},  # schema, loading, presets
    {"data", "model", "report"},  # corpus to records; the network; metrics logs and plots
    {"checkpoint"},  # step folders, loading them, HF directories, the loaded LM
    {"evaluate"},  # objectives' losses, metrics, finetuned models, probe, eval
    {"train"},  # engine, checkpointer (the train state), optimizer, pretrain, finetune
    {"interop"},  # HF export and import
    {"api", "cli"},  # the public faces
    {"__main__"},
]
LAYER_OF = {name: level for level, names in enumerate(LAYERS) for name in names}


def _module_name(path: Path) -> str:
    """src/xlnetcli/data/shard.py -> xlnetcli.data.shards.shard; a package's __init__.py -> the package."""
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts)


MODULES: dict[str, Path] = {_module_name(p): p for p in sorted((SRC / PACKAGE).rglob("*.py"))}


def _unit(module: str) -> str:
    """The layer table's name for a module: its top package under xlnetcli (xlnetcli.data.shards.shard -> data)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.Module) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement with whether it runs when the module is imported (not in a function body, not under
    TYPE_CHECKING): those are the edges an import cycle is made of."""
    found: list[tuple[ast.Import | ast.ImportFrom, bool]] = []

    def visit(node: ast.AST, runs: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append((child, runs))
            deferred = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) or (
                isinstance(child, ast.If) and _is_type_checking(child)
            )
            visit(child, runs and not deferred)

    visit(tree, True)
    return found


def _targets(node: ast.Import | ast.ImportFrom) -> list[str]:
    """The xlnetcli modules an import names: `from xlnetcli.core import errors` -> xlnetcli.core.errors,
    `from xlnetcli.config import load_config` -> xlnetcli.config, `from xlnetcli import __version__` -> xlnetcli."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
    return [n for n in names if n == PACKAGE or n.startswith(PACKAGE + ".")]


def _graph() -> list[tuple[str, int, str, str, bool]]:
    """(importer, line, imported module, the statement as written, runs at import time) for every xlnetcli import."""
    edges = []
    for module, path in MODULES.items():
        for node, runs in _imports(ast.parse(path.read_text(), filename=str(path))):
            for target in _targets(node):
                edges.append((module, node.lineno, target, ast.unparse(node), runs))
    return edges


def test_the_table_names_every_package():
    assert {_unit(m) for m in MODULES} == set(LAYER_OF), "a package or top-level module missing from LAYERS"


def test_no_relative_imports():
    bad = [
        f"{path.relative_to(SRC.parent)}:{node.lineno}: {ast.unparse(node)}"
        for path in MODULES.values()
        for node, _ in _imports(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and node.level
    ]
    assert not bad, "relative imports (write them absolute, from xlnetcli...):\n" + "\n".join(bad)


def test_imports_go_down_the_layers():
    bad = []
    for module, line, target, statement, _ in _graph():
        unit, used = _unit(module), _unit(target)
        if used != unit and LAYER_OF[used] >= LAYER_OF[unit]:
            allowed = sorted({unit} | {n for n, level in LAYER_OF.items() if level < LAYER_OF[unit]})
            bad.append(
                f"{MODULES[module].relative_to(SRC.parent)}:{line}: `{statement}` imports {used} "
                f"(layer {LAYER_OF[used]}) from {unit} (layer {LAYER_OF[unit]}); {unit} may import: "
                + ", ".join(allowed)
            )
    assert not bad, "imports against the layers (see LAYERS in tests/test_layers.py):\n" + "\n".join(bad)


def test_no_import_cycle():
    """A depth-first search over the modules' import-time imports (those in functions or under TYPE_CHECKING run
    later and cannot make a cycle at import)."""
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for module, _, target, _, runs in _graph():
        if runs and target != module:
            graph[module].add(target)
    done: set[str] = set()
    path: list[str] = []

    def visit(module: str) -> None:
        if module in path:
            cycle = [*path[path.index(module) :], module]
            raise AssertionError("import cycle: " + " -> ".join(cycle))
        if module in done:
            return
        path.append(module)
        for target in sorted(graph[module]):
            visit(target)
        path.pop()
        done.add(module)

    for module in sorted(graph):
        visit(module)
