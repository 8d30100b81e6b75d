"""The repository's documents point at what exists: every file, module and class that
docs/architecture.md names in backticks, every document in docs/ from the README's
list, and no reference into the old design file that the repository never had."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("broker", "airflow_provider_logbus")
MODULE = re.compile(r"(?:broker|airflow_provider_logbus)(?:\.\w+)*")
CLASS = re.compile(r"([A-Z][a-z]\w*)(?:\.(\w+))?")  # `Log`, `Log.append`
CONSTANT = re.compile(r"[A-Z][A-Z0-9]*_[A-Z0-9_]+|API")  # `REQUEST_TYPES`, `API`


def backticked(text: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", text)


def module_path(module: str) -> Path | None:
    base = ROOT.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def defined(body: list[ast.stmt]) -> set[str]:
    """Names a module or class body defines: functions, classes, assignments, imports."""
    names: set[str] = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


@cache
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


@cache
def project_classes() -> dict[str, set[str]]:
    """Class name -> what the classes of that name define, over both packages."""
    classes: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(parsed(path)):
                if isinstance(node, ast.ClassDef):
                    classes.setdefault(node.name, set()).update(defined(node.body))
    return classes


@cache
def project_names() -> set[str]:
    """Every name any module or class of both packages defines."""
    names: set[str] = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            names |= defined(parsed(path).body)
    return names | {name for members in project_classes().values() for name in members}


def missing(reference: str) -> str | None:
    """Why `reference` names nothing in the repository, or None if it names something
    (or is not a kind of reference this checks: settings, file names, code snippets)."""
    if " " in reference:  # a command or a snippet
        return None
    if "::" in reference:  # path/to/module.py::Class, as the architecture document's size table names classes
        path, cls = reference.split("::", 1)
        if not (ROOT / path).is_file():
            return "no such file or directory"
        return None if cls in defined(parsed(ROOT / path).body) else f"{path} defines no {cls}"
    top = reference.split("/")[0]
    if "/" in reference or reference.endswith((".py", ".md")):
        if (ROOT / top).exists() or reference.endswith((".py", ".md")):
            return None if (ROOT / reference).exists() else "no such file or directory"
        return None
    if MODULE.fullmatch(reference):
        parts = reference.split(".")
        for cut in range(len(parts), 0, -1):
            path = module_path(".".join(parts[:cut]))
            if path is None:
                continue
            owner, body = ".".join(parts[:cut]), parsed(path).body
            for name in parts[cut:]:
                if name not in defined(body):
                    return f"{owner} defines no {name}"
                classes = [n for n in body if isinstance(n, ast.ClassDef) and n.name == name]
                owner, body = f"{owner}.{name}", classes[0].body if classes else []
            return None
        return "no such module"
    if match := CLASS.fullmatch(reference):
        cls, member = match.groups()
        if cls not in project_classes():
            return "no such class"
        if member and member not in project_classes()[cls]:
            return f"no class {cls} defines {member}"
        return None
    if CONSTANT.fullmatch(reference) and reference not in project_names():
        return "no such name"
    return None


@pytest.mark.parametrize("reference, why", [
    ("broker/server/log/log.py", None), ("broker/server/replication/", None), ("broker/nowhere.py", "no such file or directory"),
    ("docs/nowhere.md", "no such file or directory"), ("_rejects/", None),
    ("broker.client.offsets.lag", None), ("broker.client.offsets.drag", "broker.client.offsets defines no drag"),
    ("broker.nowhere", "broker defines no nowhere"), ("brokers.log", None), ("airflow_provider_logbus.targets.KINDS", None),
    ("broker.server.log.log.Log.append", None), ("broker.server.log.log.Log.prepend", "broker.server.log.log.Log defines no prepend"),
    ("Log.append", None), ("Log.prepend", "no class Log defines prepend"), ("Logg", "no such class"),
    ("TableState.token", None), ("REQUEST_TYPES", None), ("REQUEST_KINDS", "no such name"),
    ("log.dirs", None), ("acks=-1", None), ("python -m bench.raw docs/nowhere.md", None),
])
def test_the_reference_check_finds_what_is_not_there(reference, why):
    assert missing(reference) == why


def test_every_name_the_architecture_document_cites_exists():
    text = (ROOT / "docs" / "architecture.md").read_text()
    references = backticked(text)
    assert len(references) > 100  # the check reads the document's references
    assert {r: why for r in references if (why := missing(r))} == {}


def test_the_architecture_document_lists_every_document():
    text = (ROOT / "docs" / "architecture.md").read_text()
    assert {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")} - {"docs/architecture.md"} <= set(backticked(text))


def test_the_readme_names_every_document_and_only_files_that_exist():
    text = (ROOT / "README.md").read_text()
    named = set(backticked(text))
    assert {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")} <= named
    assert {r: why for r in named if (why := missing(r)) and "/" in r} == {}


def test_the_provider_document_maps_every_module():
    text = (ROOT / "docs" / "provider.md").read_text()
    section = text.split("\n## Modules\n", 1)[1].split("\n## ", 1)[0]
    package = ROOT / "airflow_provider_logbus"
    named = {r for r in backticked(section) if r.endswith(".py")}
    modules = {str(p.relative_to(package)) for p in package.rglob("*.py")
               if p.parts[len(package.parts)] != "examples" and (p.name != "__init__.py" or p.parent == package)}
    assert modules - named == set()
    assert {r for r in named if not (package / r).is_file()} == set()


def test_nothing_cites_the_old_design_file():
    """Its sections now live in docs/; a citation of it sends a reader nowhere."""
    old = re.compile("DESIGN" + r"(\.md| §)")  # not spelled out, or this file would cite it
    files = [ROOT / name for name in ("README.md", "BENCHMARKS.md", "pyproject.toml", "Makefile")]
    for folder in ("broker", "airflow_provider_logbus", "docs", "harness", "bench", "tests", "dags", "demo", "config"):
        files += [p for p in (ROOT / folder).rglob("*") if p.is_file() and p.suffix in (".py", ".md", ".properties")]
    citing = [str(p.relative_to(ROOT)) for p in files if old.search(p.read_text(errors="replace"))]
    assert citing == []
