"""The import rule of docs/architecture.md ("Layers"), read from the source with `ast`.

Every import counts, also those inside functions (a lazy import is still a dependency):
the client library never imports the server, the provider reaches `broker` only
through the client library and the shared contracts, the server never imports a client,
a tool or the provider, and nothing in `broker/` imports Airflow, Spark or the provider.
Module-level imports (those that run at import time) never form a circle. The provider's
Spark side (the load job, the data source) reaches no Airflow module: executors run
without the `[airflow]` extra.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("broker", "airflow_provider_logbus")

FOLDERS = {  # broker/'s layers are its folders (docs/architecture.md, "Layers")
    "broker.common": "contracts", "broker.server": "server", "broker.client": "client", "broker.tools": "tools",
    "broker.registry": "registry",
}
MAY_IMPORT = {
    "contracts": {"contracts"},
    "server": {"contracts", "server"},
    "client": {"contracts", "client"},
    "registry": {"contracts", "registry"},  # the schema registry (docs/schemas.md) stands on the contracts alone
    "tools": {"contracts", "client", "server", "registry", "tools"},  # `logbus-broker` (cli.py) starts the server
    "provider": {"contracts", "client", "provider"},
    "unplaced": set(),  # a module of broker/ outside the layer folders: refused below
}
OUTSIDE_BROKER = ("airflow", "pyspark", "pyarrow", "pyiceberg", "airflow_provider_logbus", "harness", "bench", "tests")
SPARK_SIDE = ("airflow_provider_logbus.spark.load_job", "airflow_provider_logbus.spark.datasource")
# The format's Arrow decoder may import pyarrow, when called: readers that want columns
# have it, and the broker installs without it (docs/architecture.md).
ARROW_DECODER = "broker.common.columns_arrow"


def layer(module: str) -> str | None:
    """The layer of a project module; None for anything else (standard library, third
    party). `broker` itself (the version) counts as a contract; any other module of
    broker/ outside the layer folders has no layer, which `test_every_module_of_broker_is_in_a_layer_folder`
    refuses."""
    if module == "broker":
        return "contracts"
    for folder, name in FOLDERS.items():
        if module == folder or module.startswith(folder + "."):
            return name
    if module.startswith("broker."):
        return "unplaced"
    if module == "airflow_provider_logbus" or module.startswith("airflow_provider_logbus."):
        return "provider"
    return None


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    line: int
    at_import_time: bool  # False inside a function, or under `if TYPE_CHECKING:`

    def __str__(self) -> str:
        return f"{self.importer}:{self.line} imports {self.imported}"


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_sources(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, tuple[str, bool]]:
    """module -> (source, is_package) for every module of `packages`."""
    return {module_name(path, root): (path.read_text(), path.name == "__init__.py")
            for package in packages for path in sorted((root / package).rglob("*.py"))}


class _ImportVisitor(ast.NodeVisitor):
    def __init__(self, module: str, is_package: bool, known: set[str]) -> None:
        self.module, self.known = module, known
        self.package = module if is_package else module.rpartition(".")[0]
        self.depth = 0  # functions (and TYPE_CHECKING blocks) around the current node
        self.found: list[Import] = []

    def _add(self, name: str, node: ast.stmt) -> None:
        self.found.append(Import(self.module, name, node.lineno, self.depth == 0))

    def _nested(self, node: ast.AST) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _nested

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
                isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"):
            self._nested(node)
        else:
            self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = self.package.split(".")[: len(self.package.split(".")) - node.level + 1]
            source = ".".join(base + ([node.module] if node.module else []))
        else:
            source = node.module or ""
        for alias in node.names:  # `from package import module` depends on that module
            submodule = f"{source}.{alias.name}"
            self._add(submodule if submodule in self.known else source, node)


def imports_of(sources: dict[str, tuple[str, bool]]) -> list[Import]:
    known = set(sources)
    found: list[Import] = []
    for module, (source, is_package) in sources.items():
        visitor = _ImportVisitor(module, is_package, known)
        visitor.visit(ast.parse(source))
        found += visitor.found
    return found


def layer_violations(imports: list[Import]) -> list[str]:
    """Each import that breaks the rule, with the rule it breaks."""
    broken = []
    for imp in imports:
        mine, theirs = layer(imp.importer), layer(imp.imported)
        if mine is None:
            continue
        if theirs is not None and theirs not in MAY_IMPORT[mine]:
            broken.append(f"{imp}: the {mine} may import only {', '.join(sorted(MAY_IMPORT[mine]))}, not the {theirs}")
        elif mine != "provider" and imp.imported.split(".")[0] in OUTSIDE_BROKER:
            if imp.importer == ARROW_DECODER and imp.imported == "pyarrow" and not imp.at_import_time:
                continue
            broken.append(f"{imp}: nothing in broker/ imports {imp.imported.split('.')[0]}")
    return broken


def import_cycles(imports: list[Import]) -> list[list[str]]:
    """Circles of import-time imports between project modules (Tarjan's strongly
    connected components; a module importing itself is a circle of one)."""
    graph: dict[str, set[str]] = {}
    for imp in imports:
        if imp.at_import_time and layer(imp.imported) is not None:
            graph.setdefault(imp.importer, set()).add(imp.imported)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in sorted(graph.get(module, ())):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == module:
                    break
            if len(component) > 1 or module in graph.get(module, ()):
                cycles.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return cycles


def reached_from(imports: list[Import], starts: tuple[str, ...]) -> set[str]:
    """Every module that importing `starts` and calling into them may import: their
    imports, and through project modules (and the packages holding them) theirs."""
    graph: dict[str, set[str]] = {}
    for imp in imports:
        graph.setdefault(imp.importer, set()).add(imp.imported)
    reached: set[str] = set()
    todo = list(starts)
    while todo:
        module = todo.pop()
        if module in reached:
            continue
        reached.add(module)
        if layer(module) is not None:
            parents = [module.rsplit(".", n)[0] for n in range(1, module.count(".") + 1)]
            todo += [*graph.get(module, ()), *parents]
    return reached


# ------------------------------------------------------------------ the project


@pytest.fixture(scope="module")
def project_imports() -> list[Import]:
    return imports_of(project_sources())


def test_every_import_keeps_to_its_layer(project_imports):
    assert layer_violations(project_imports) == []


def test_every_module_of_broker_is_in_a_layer_folder():
    """broker/'s folders are its layers: a module directly under broker/ (other than
    the version) belongs to none, so no rule would hold it."""
    assert sorted(m for m in project_sources() if layer(m) == "unplaced") == []


def test_no_modules_import_each_other_at_import_time(project_imports):
    assert import_cycles(project_imports) == []


def test_the_spark_side_reaches_no_airflow_module(project_imports):
    reached = reached_from(project_imports, SPARK_SIDE)
    assert "airflow_provider_logbus.cluster" in reached and "broker.common.message" in reached
    assert sorted(m for m in reached if m.split(".")[0] == "airflow") == []


def test_the_reader_sees_function_level_imports(project_imports):
    """The rule covers lazy imports: `logbus` imports its subcommands inside a function."""
    lazy = [i for i in project_imports if i.importer == "broker.tools.cli" and i.imported == "broker.tools.admin"]
    assert lazy and not lazy[0].at_import_time


# ------------------------------------------------------------------ the checker


def check(**modules: str) -> list[Import]:
    """Imports of synthetic modules, named with `__` for dots."""
    return imports_of({name.replace("__", "."): (source, False) for name, source in modules.items()})


@pytest.mark.parametrize("importer, statement, broken", [
    ("broker.client.producer", "from broker.server.log.log import Log", "the client may import only client, contracts"),
    ("broker.client.producer", "def f():\n    import broker.server.handlers", "not the server"),
    ("broker.client.producer", "from broker.tools.admin import main", "not the tools"),
    ("airflow_provider_logbus.batch", "from broker.server.registration import BrokerRegistry", "not the server"),
    ("airflow_provider_logbus.batch", "from broker.server import config", "not the server"),
    ("broker.server.handlers", "from broker.client.offsets import lag", "not the client"),
    ("broker.server.log.log", "from airflow_provider_logbus.plan import Range", "not the provider"),
    ("broker.common.message", "from broker.server.log.segment import Segment", "the contracts may import only contracts"),
    ("broker.server.handlers", "import pyspark", "nothing in broker/ imports pyspark"),
    ("broker.registry.api", "from broker.server.auth.plain import PlainExchange", "the registry may import only"),
    ("broker.registry.store", "from broker.client.metadata import connect_zookeeper", "not the client"),
    ("broker.client.producer", "if TYPE_CHECKING:\n    from broker.server.broker import Broker", "not the server"),
])
def test_the_checker_names_an_import_against_the_rule(importer, statement, broken):
    sources = {importer: (statement, False), "broker.server.config": ("", False)}
    [violation] = layer_violations(imports_of(sources))
    assert broken in violation and violation.startswith(f"{importer}:")


@pytest.mark.parametrize("importer, statement", [
    ("broker.client.producer", "from broker.common.protocol import Acks\nfrom broker.client.cluster import ClusterMetadata"),
    ("airflow_provider_logbus.cluster", "from broker.client import offsets\nfrom broker.common.errors import LogbusError"),
    ("airflow_provider_logbus.cluster", "import airflow\nimport pyspark"),
    ("broker.tools.cli", "def main():\n    from broker.server.broker import serve\n    from broker.tools.admin import main"),
    ("broker.server.handlers", "from broker.server.replication.manager import ReplicaManager\nimport kazoo"),
])
def test_the_checker_passes_imports_within_the_rule(importer, statement):
    assert layer_violations(imports_of({importer: (statement, False)})) == []


def test_relative_imports_resolve_against_the_importing_package():
    imports = imports_of({"broker.client.producer": ("from ..server.log import log\nfrom . import cluster", False),
                          "broker.server.log.log": ("", False), "broker.client.cluster": ("", False)})
    assert [i.imported for i in imports] == ["broker.server.log.log", "broker.client.cluster"]
    assert len(layer_violations(imports)) == 1


def test_what_a_module_reaches_goes_through_project_modules_and_their_packages():
    imports = check(airflow_provider_logbus__spark__job="from airflow_provider_logbus import plan",
                    airflow_provider_logbus__plan="def f():\n    import pyarrow",
                    airflow_provider_logbus="import airflow", broker__message="import crcmod")
    reached = reached_from(imports, ("airflow_provider_logbus.spark.job",))
    assert {"pyarrow", "airflow"} <= reached and "crcmod" not in reached


def test_a_circle_of_import_time_imports_is_found_and_a_lazy_import_breaks_it():
    circle = check(broker__a="import broker.b", broker__b="from broker.c import x", broker__c="from broker import a")
    assert import_cycles(circle) == [["broker.a", "broker.b", "broker.c"]]
    lazy = check(broker__a="import broker.b", broker__b="def f():\n    import broker.a")
    assert import_cycles(lazy) == []
    assert import_cycles(check(broker__a="import broker.a")) == [["broker.a"]]


def test_only_the_arrow_decoder_imports_pyarrow_and_only_when_called(tmp_path):
    """The exception for `broker.common.columns_arrow` is narrow: at import time it is refused,
    and any other module of broker/ is refused either way."""
    lazy = Import("broker.common.columns_arrow", "pyarrow", 40, False)
    eager = Import("broker.common.columns_arrow", "pyarrow", 3, True)
    elsewhere = Import("broker.common.message", "pyarrow", 40, False)
    assert layer_violations([lazy]) == []
    assert len(layer_violations([eager])) == 1 and len(layer_violations([elsewhere])) == 1
