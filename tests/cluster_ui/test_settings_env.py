"""Settings read from the environment as a .env or compose file leaves it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
READ = ("import json, django; from django.conf import settings; "
        "print(json.dumps([settings.DATABASES['default']['ENGINE'], settings.REDIS_URL]))")


def settings_with(**env: str) -> list:
    environ = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    environ.update(env, DJANGO_SETTINGS_MODULE="cluster_ui.settings")
    out = subprocess.run([sys.executable, "-c", READ], cwd=ROOT, env=environ, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_an_empty_database_or_redis_url_means_the_embedded_defaults_not_a_crash():
    assert settings_with(DATABASE_URL="", REDIS_URL="") == ["django.db.backends.sqlite3", "redis://127.0.0.1:6379/0"]
    assert settings_with(DATABASE_URL="postgres://u@db:5432/colony", REDIS_URL="redis://cache:6379/2") == [
        "django.db.backends.postgresql", "redis://cache:6379/2"]
