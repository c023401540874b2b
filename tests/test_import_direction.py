"""Imports flow one way (../shared/DESIGN.md): ``monitoring`` never imports ``jobs``, and the
REST API's project-wide pieces in ``cluster_ui/api/`` (which both apps build on) import neither app;
only the /api/v1/ root (``cluster_ui/api/urls.py``) includes the apps' routes.

Read from the source (every ``import``, at any depth), so an import inside a function counts too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def imported_modules(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def _sources(folder: str, skip: tuple[str, ...] = ()) -> list[Path]:
    return [p for p in sorted((ROOT / folder).rglob("*.py")) if "migrations" not in p.parts and p.name not in skip]


def _is_in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


@pytest.mark.parametrize("path", _sources("monitoring"), ids=lambda p: str(p.relative_to(ROOT)))
def test_monitoring_imports_no_jobs(path):
    wrong = sorted(m for m in imported_modules(path) if _is_in(m, "jobs")
                   or _is_in(m, "cluster_ui") and not _is_in(m, "cluster_ui.api") or m == "cluster_ui.api.urls")
    assert not wrong, f"{path.relative_to(ROOT)} imports {wrong}"


@pytest.mark.parametrize("path", _sources("cluster_ui/api", skip=("urls.py",)), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_api_base_imports_no_app(path):
    wrong = sorted(m for m in imported_modules(path) if _is_in(m, "jobs") or _is_in(m, "monitoring"))
    assert not wrong, f"{path.relative_to(ROOT)} imports {wrong}"


def test_the_walk_sees_imports():
    assert "jobs.api.urls" in imported_modules(ROOT / "cluster_ui" / "api" / "urls.py")
    assert "cluster_ui.api" in imported_modules(ROOT / "monitoring" / "api" / "views.py")
