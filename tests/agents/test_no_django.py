"""The agent (and the pure scheduler core) import without Django, in a fresh interpreter."""

from __future__ import annotations

import json
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

# Every module in turn in one fresh interpreter: after each import, what it brought in of the
# forbidden packages. Modules only add to what is loaded, so while nothing forbidden has appeared
# each import was checked as if alone; once something has, the modules after it are checked
# again each in an interpreter of its own (below). One interpreter instead of 73: ~1 s, not 12.
CHECK_ALL = """
import importlib, json, sys, traceback
def forbidden():
    return sorted(m for m in sys.modules if m.split('.')[0] in ('django', 'rest_framework', 'celery'))
verdicts = {}
for name in sys.argv[1:]:
    if forbidden():
        verdicts[name] = None  # not checked: something before it loaded Django
        continue
    try:
        importlib.import_module(name)
    except BaseException:
        verdicts[name] = traceback.format_exc()
        continue
    loaded = forbidden()
    verdicts[name] = 'imported: ' + ', '.join(loaded[:10]) if loaded else ''
print(json.dumps(verdicts))
"""


@pytest.fixture(scope="module")
def verdicts() -> dict[str, str | None]:
    """module -> '' (imported without Django), what went wrong, or None (check it alone)."""
    result = subprocess.run([sys.executable, "-c", CHECK_ALL, *MODULES], cwd=REPO, capture_output=True, text=True,
                            timeout=120)
    try:
        return json.loads(result.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return dict.fromkeys(MODULES)  # the shared interpreter died: check each alone


@pytest.mark.parametrize("module", MODULES)
def test_module_imports_without_django(module, verdicts):
    verdict = verdicts.get(module)
    if verdict is None:
        result = subprocess.run(
            [sys.executable, "-c", CHECK, module], cwd=REPO, capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0, result.stderr
    else:
        assert verdict == "", verdict
