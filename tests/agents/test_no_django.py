"""The agent (and the pure scheduler core) import without Django, in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

def _modules() -> list[str]:
    """Every module of the agent and the core, so a new one is checked without being listed
    (``agents.__main__`` runs the agent: its imports are ``agents.cli``'s)."""
    found = []
    for package in ("agents", "jobs/scheduling"):
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            if "build" in parts or parts[-1] == "__main__" and parts[0] == "agents":
                continue
            found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


MODULES = _modules()

CHECK = """
import importlib, sys
importlib.import_module(sys.argv[1])
loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('django', 'rest_framework', 'celery'))
assert not loaded, 'imported: ' + ', '.join(loaded[:10])
"""


@pytest.mark.parametrize("module", MODULES)
def test_module_imports_without_django(module):
    result = subprocess.run(
        [sys.executable, "-c", CHECK, module], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
