"""The size rule of docs/architecture.md ("Sizes"): modules under 400 lines, classes
under 200, except those the document's table names with a reason and a ceiling."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("broker", "airflow_provider_logbus")
MODULE_LINES = 400
CLASS_LINES = 200


def measured() -> dict[str, int]:
    """Every module over MODULE_LINES and class over CLASS_LINES, by the table's names."""
    sizes = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            source = path.read_text()
            name = str(path.relative_to(ROOT))
            lines = len(source.splitlines())
            if lines > MODULE_LINES:
                sizes[name] = lines
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > CLASS_LINES:
                    sizes[f"{name}::{node.name}"] = node.end_lineno - node.lineno + 1
    return sizes


def allowed() -> dict[str, int]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## Sizes", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([^`]+)` \| (\d+) \| (.+) \|$", section, re.M)
    assert rows, "docs/architecture.md has no table of large modules and classes"
    assert all(len(why) > 40 for _, _, why in rows), "every row says why"
    return {name: int(ceiling) for name, ceiling, _ in rows}


def test_large_modules_and_classes_are_the_ones_the_architecture_document_explains():
    sizes, table = measured(), allowed()
    unexplained = {name: n for name, n in sizes.items() if name not in table}
    assert not unexplained, f"over the limit with no row in docs/architecture.md (\"Sizes\"): {unexplained}"
    grown = {name: (sizes[name], table[name]) for name in sizes if name in table and sizes[name] > table[name]}
    assert not grown, f"grown past their row's figure (lines, figure): {grown}"
    stale = sorted(set(table) - set(sizes))
    assert not stale, f"rows for modules or classes now under the limit (or gone): delete them: {stale}"
