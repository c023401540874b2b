"""The agent (and the pure scheduler core) import without Django, in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

MODULES = [
    "agents",
    "agents.agent",
    "agents.cli",
    "agents.runner",
    "agents.throttle",
    "agents.nvml_probe",
    "agents.backends.simulated",
    "agents.backends.nvml",
    "agents.protocol",
    "jobs.scheduling",
    "jobs.scheduling.policies",
    "jobs.scheduling.simulate",
    "jobs.scheduling.simulate.__main__",
    "jobs.scheduling.simulate.report",
]

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
