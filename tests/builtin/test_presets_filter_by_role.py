"""Every shipped and documented preset filters by role (a plain request never lands on a
prefill-only or decode-only worker), and none carries the redundant ``model`` filter."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from infera_core.plugin.hooks import InferaHooks

ROOT = Path(__file__).resolve().parents[2]
FILTERS = re.compile(r"filters=\[([^\]]*)\]|filters:\s*\[([^\]]*)\]")
DOCUMENTED = [
    *sorted((ROOT / "docs").rglob("*.md")),
    *sorted((ROOT / "examples").glob("*/*/*.py")),
    *sorted((ROOT / "examples").glob("*/*.md")),
    *sorted((ROOT / "plugins").glob("*/*/plugin.py")),
    *sorted((ROOT / "plugins").glob("*/*/presets.py")),
]


def test_every_installed_preset_filters_by_health_and_role() -> None:
    hooks = InferaHooks.load(disable=[])
    bad = {}
    for entry in hooks.catalog().policies.preset_entries():
        names = [f.name for f in entry.obj.profile.filters]
        if "role" not in names or "health" not in names:
            bad[f"{entry.name} ({entry.owner})"] = names
    assert not bad, f"presets without health + role filters: {bad}"


@pytest.mark.parametrize("path", DOCUMENTED, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_documented_preset_template_filters_by_role(path: Path) -> None:
    text = path.read_text()
    for match in FILTERS.finditer(text):
        listed = match.group(1) or match.group(2) or ""
        line = text.count("\n", 0, match.start()) + 1
        assert re.search(r"['\"]?role['\"]?", listed) and "health" in listed, (
            f"{path.relative_to(ROOT)}:{line}: filters {listed!r} miss health/role"
        )
        assert not re.search(r"name=['\"]model['\"]|name:\s*model\b", listed), (
            f"{path.relative_to(ROOT)}:{line}: the model filter is redundant in a preset"
        )
