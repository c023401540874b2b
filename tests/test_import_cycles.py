"""No import cycle among the Django side's modules (``jobs`` but its pure core ``jobs/scheduling``,
which has its own rules in test_import_direction.py; ``monitoring``; ``cluster_ui``).

A cycle held apart by an import inside a function still is one: the modules cannot be read, tested
or moved one without the other, and which import wins depends on who imports first. So every
``import`` counts here, at any depth, and so does the package ``__init__`` that importing a
submodule runs (except the importer's own packages, which are running already). The only
exceptions are :data:`ALLOWED`, each with its reason.

Run as a script (``python tests/test_import_cycles.py``) to print the strongly connected
components and the imports that hold each together.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("jobs", "monitoring", "cluster_ui")
SKIPPED = ("jobs.scheduling",)

# (importer, imported) -> why this import may close a loop. Empty: nothing does today. An entry
# belongs here only for a reason other than dodging a cycle (Django app loading, say).
ALLOWED: dict[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Import:
    line: int
    in_function: bool


def _is_in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def module_files() -> dict[str, Path]:
    """Module name -> file, for every module of :data:`PACKAGES` but migrations and :data:`SKIPPED`."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            if not any(_is_in(name, skipped) for skipped in SKIPPED):
                found[name] = path
    return found


def _imported_names(node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.module is None or node.level:
        return []  # (the project uses no relative imports)
    # ``from a.b import c``: c may be a submodule, else a name in a.b (resolved below).
    return [f"{node.module}.{alias.name}" for alias in node.names]


def import_graph(files: dict[str, Path]) -> dict[str, dict[str, list[Import]]]:
    """Importer -> imported module -> where, among the modules of ``files``."""

    def resolve(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, dict[str, list[Import]]] = {}
    for module, path in files.items():
        edges = graph.setdefault(module, {})

        def add(target: str, node: ast.stmt, in_function: bool) -> None:
            where = Import(node.lineno, in_function)
            if target != module and target in files and not _is_in(module, target):
                if where not in edges.setdefault(target, []):
                    edges[target].append(where)

        def walk(node: ast.AST, in_function: bool) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    for name in _imported_names(child):
                        target = resolve(name)
                        if target is None:
                            continue
                        add(target, child, in_function)
                        parent = target.rpartition(".")[0]
                        while parent:  # importing a submodule runs its packages' __init__ first
                            add(parent, child, in_function)
                            parent = parent.rpartition(".")[0]
                walk(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

        walk(ast.parse(path.read_text(), filename=str(path)), False)
    return graph


def strongly_connected(graph: dict[str, set[str] | dict]) -> list[set[str]]:
    """Tarjan's strongly connected components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _without_allowed(graph):
    return {module: {target: where for target, where in edges.items() if (module, target) not in ALLOWED}
            for module, edges in graph.items()}


def describe(graph, component: set[str]) -> str:
    lines = [f"{len(component)} modules import one another:"]
    for module in sorted(component):
        for target, where in sorted(graph[module].items()):
            if target in component:
                at = ", ".join(f"line {i.line}{' (in a function)' if i.in_function else ''}" for i in where)
                lines.append(f"  {module} -> {target}: {at}")
    return "\n".join(lines)


def test_no_module_of_jobs_monitoring_or_cluster_ui_imports_itself_round_a_loop():
    graph = _without_allowed(import_graph(module_files()))
    cycles = strongly_connected(graph)
    assert not cycles, "\n\n".join(describe(graph, component) for component in cycles)


def test_each_allowed_import_is_still_there():
    graph = import_graph(module_files())
    stale = [pair for pair in ALLOWED if pair[1] not in graph.get(pair[0], {})]
    assert not stale, f"no longer imported, drop from ALLOWED: {stale}"


def test_the_walk_sees_imports_in_functions_and_the_packages_they_run():
    graph = import_graph(module_files())
    # JobsConfig.ready registers the Celery tasks (an import inside a method).
    assert [i.in_function for i in graph["jobs.apps"]["jobs.tasks"]] == [True]
    # ``from jobs.services import alerts`` runs jobs/services/__init__.py too; a module of the
    # package imports a sibling with its package running already.
    assert {"jobs.services", "jobs.services.alerts"} <= set(graph["jobs.tasks"])
    assert "jobs.services.lifecycle" in graph["jobs.services.apply"]
    assert "jobs.services" not in graph["jobs.services.apply"]
    # A name imported from a module is an edge to that module.
    assert "jobs.models" in graph["jobs.services.waits"]


def test_every_task_a_service_queues_by_name_is_registered():
    """Services queue tasks by name (jobs/services/enqueue.py), which is what keeps them from
    importing the tasks back; a misspelt name would only be logged when the message is lost."""
    from celery import current_app

    named = set()
    for path in (ROOT / "jobs" / "services").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "enqueue":
                named.add(node.args[0].value)
    assert {"scheduling_cycle", "send_notification", "announce_alerts", "send_alert_notification"} <= named
    assert sorted(name for name in named if f"jobs.tasks.{name}" not in current_app.tasks) == []


def test_a_loop_is_found_however_long_and_only_a_loop():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert strongly_connected(graph) == [{"a", "b", "c"}]


if __name__ == "__main__":
    full = import_graph(module_files())
    components = strongly_connected(_without_allowed(full))
    for component in sorted(components, key=len, reverse=True):
        print(describe(full, component), end="\n\n")
    print(f"{len(full)} modules, {sum(map(len, full.values()))} imports, {len(components)} cycles")
    sys.exit(1 if components else 0)
