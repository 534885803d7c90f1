"""Datasette-style guards: every hook is documented with its exact signature, and tested."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from infera_core.plugin import spec as hookspecs

ROOT = Path(__file__).resolve().parents[2]
HOOKS_DOC = ROOT / "docs" / "reference" / "hooks.md"


def _hookspecs() -> list[tuple[str, Callable[..., Any]]]:
    return [
        (name, fn)
        for name, fn in inspect.getmembers(hookspecs, inspect.isfunction)
        if hasattr(fn, f"{hookspecs.PROJECT_NAME}_spec")
    ]


def _annotation(ann: Any) -> str:
    if ann is inspect.Parameter.empty:
        raise AssertionError("hookspec parameters must be annotated")
    return ann if isinstance(ann, str) else getattr(ann, "__name__", repr(ann))


def expected_signature(name: str, fn: Callable[..., Any]) -> str:
    """``def name(arg: Type) -> None`` built from the spec function itself."""
    sig = inspect.signature(fn)
    args = ", ".join(f"{p.name}: {_annotation(p.annotation)}" for p in sig.parameters.values())
    ret = sig.return_annotation
    ret_s = "None" if ret in (None, "None", inspect.Signature.empty) else _annotation(ret)
    return f"def {name}({args}) -> {ret_s}"


def test_there_are_hookspecs() -> None:
    names = [n for n, _ in _hookspecs()]
    assert "infera_register_engines" in names and "infera_request_routed" in names
    assert all(n.startswith("infera_") for n in names)


@pytest.mark.parametrize(("name", "fn"), _hookspecs(), ids=[n for n, _ in _hookspecs()])
def test_hook_is_documented_with_exact_signature(name: str, fn: Callable[..., Any]) -> None:
    doc = HOOKS_DOC.read_text()
    assert re.search(rf"^### {name}$", doc, re.M), f"docs/reference/hooks.md has no '### {name}' section"
    section = doc.split(f"### {name}\n", 1)[1].split("\n### ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    signature = expected_signature(name, fn)
    assert blocks and blocks[0].strip() == signature, (
        f"the first code block under '### {name}' in docs/reference/hooks.md must be exactly:\n{signature}"
    )
    assert fn.__doc__ and "fires" in fn.__doc__.lower(), f"{name} docstring must say when it fires"


@pytest.mark.parametrize("name", [n for n, _ in _hookspecs()])
def test_hook_has_a_test(name: str) -> None:
    this = Path(__file__).resolve()
    test_dirs = [ROOT / "tests", *ROOT.glob("plugins/*/tests"), *ROOT.glob("examples/*/tests")]
    for path in (p for d in test_dirs for p in d.rglob("*.py")):
        if path.resolve() != this and name in path.read_text(errors="replace"):
            return
    pytest.fail(f"no test under tests/, plugins/*/tests/ or examples/*/tests/ mentions hook {name}")


def test_docs_do_not_describe_hooks_that_do_not_exist() -> None:
    documented = set(re.findall(r"^### (infera_\w+)$", HOOKS_DOC.read_text(), re.M))
    assert documented == {n for n, _ in _hookspecs()}
