"""The layering rule: no import cycle anywhere in infera_core, and in-tree plugins import
only the documented surface (docs/explanation/architecture.md, "What a plugin may import").

TYPE_CHECKING and function-level imports count: grimp (import-linter's graph) sees them all.
``lint-imports`` (run by .ci/run) checks the layers themselves.
"""

from __future__ import annotations

import ast
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]

PLUGIN_SURFACE = (
    "infera_core.errors",
    "infera_core.worker",
    "infera_core.request",
    "infera_core.registry",
    "infera_core.config",
    "infera_core.util",
    "infera_core.engines",
    "infera_core.transports.base",
    "infera_core.transports.upstreams",
    "infera_core.transports.http",
    "infera_core.discovery.base",
    "infera_core.discovery.records",
    "infera_core.kv.events",
    "infera_core.kv.decode",
    "infera_core.tokenize.base",
    "infera_core.scheduling.types",
    "infera_core.scheduling.arrays",
    "infera_core.scheduling.candidates",
    "infera_core.scheduling.config",
    "infera_core.scheduling.registry",
    "infera_core.scheduling.dp",
    "infera_core.plugin",
    "infera_core.testing",
)
"""What an engine, policy, transport or discovery plugin may import from infera_core: the
contracts, the plugin machinery, the test kits and leaf helpers. Never the server, the
launcher, the KV hub or a private name."""

ENTRY_MODULES = ("infera_core.cli.alias",)
"""What a distribution's command entry modules (``python -m infera.engine.<name>``,
``python -m infera_<name>``) may import besides the surface: the CLI they alias."""


def _cycles(graph: grimp.ImportGraph, modules: set[str]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on.add(v)
        for w in graph.find_modules_directly_imported_by(v) & modules:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(modules):
        if module not in index:
            visit(module)
    return found


def test_no_import_cycle_in_infera_core() -> None:
    graph = grimp.build_graph("infera_core")
    assert _cycles(graph, set(graph.modules)) == []


def _plugin_files() -> list[Path]:
    return sorted(
        p
        for base in (ROOT / "plugins", ROOT / "examples")
        for p in base.glob("*/infera*/**/*.py")
        if "tests" not in p.parts and ".egg-info" not in str(p)
    )


def _imports(path: Path) -> list[tuple[int, str, list[str]]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name, []) for a in node.names]
    return out


def _allowed(module: str, surface: tuple[str, ...]) -> bool:
    return any(module == s or module.startswith(s + ".") for s in surface)


def test_plugins_import_only_the_documented_surface() -> None:
    files = _plugin_files()
    assert len(files) > 50, "the plugin sources were not found"
    wrong = []
    for path in files:
        entry = path.name == "__main__.py" or path.parent.name == "engine"
        surface = PLUGIN_SURFACE + (ENTRY_MODULES if entry else ())
        for line, module, names in _imports(path):
            if module != "infera_core" and not module.startswith("infera_core."):
                continue
            where = f"{path.relative_to(ROOT)}:{line}"
            if not _allowed(module, surface):
                wrong.append(f"{where}: {module}")
            wrong += [f"{where}: {module}.{n} (private)" for n in names if n.startswith("_")]
    assert wrong == []


def test_the_surface_is_the_one_documented() -> None:
    page = (ROOT / "docs" / "explanation" / "architecture.md").read_text()
    missing = [s for s in PLUGIN_SURFACE + ENTRY_MODULES if f"`{s}" not in page]
    assert missing == [], "docs/explanation/architecture.md does not list these importable modules"


@pytest.mark.parametrize(
    "module", ["infera_core.plugin", "infera_core.engines.base", "infera_core.kv.events"]
)
def test_contracts_import_no_runtime(module: str) -> None:
    graph = grimp.build_graph("infera_core")
    runtime = ("infera_core.server", "infera_core.launcher", "infera_core.cli", "infera_core.up")
    reached = graph.find_upstream_modules(module)
    assert sorted(m for m in reached if m.startswith(runtime)) == []
