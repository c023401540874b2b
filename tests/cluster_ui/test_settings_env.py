"""Settings read from the environment as a .env file, a compose file or a secret mount leaves it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
READ = ("import json, django; from django.conf import settings; "
        "print(json.dumps([settings.DATABASES['default']['ENGINE'], settings.REDIS_URL]))")
OURS = ("DATABASE_URL", "DATABASE_URL_FILE", "REDIS_URL", "REDIS_URL_FILE")


def settings_with(**env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in OURS}
    environ.update(env, DJANGO_SETTINGS_MODULE="cluster_ui.settings")
    return subprocess.run([sys.executable, "-c", READ], cwd=ROOT, env=environ, capture_output=True, text=True,
                          timeout=60)


def read(**env: str) -> list:
    done = settings_with(**env)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_unset_urls_are_the_embedded_defaults_and_set_ones_are_used():
    assert read() == ["django.db.backends.sqlite3", "redis://127.0.0.1:6379/0"]
    assert read(DATABASE_URL="postgres://u@db:5432/colony", REDIS_URL="redis://cache:6379/2") == [
        "django.db.backends.postgresql", "redis://cache:6379/2"]


@pytest.mark.parametrize("name", ["DATABASE_URL", "REDIS_URL"])
def test_a_url_set_but_empty_is_refused_with_the_reason_not_replaced_by_the_default(name, tmp_path):
    # (It used to be dj_database_url's "Scheme '://' is unknown" for the one, a silent local Redis
    # for the other; a silent SQLite would lose a deployment's data with its container.)
    done = settings_with(**{name: ""})
    assert done.returncode != 0
    assert f"ImproperlyConfigured: {name} is set but empty ({name}): set it to a URL, or unset it" in done.stderr
    empty = tmp_path / "secret"
    empty.write_text("\n")  # a secret mount that came up empty
    done = settings_with(**{f"{name}_FILE": str(empty)})
    assert done.returncode != 0 and f"{name} is set but empty (the file {name}_FILE names)" in done.stderr


@pytest.mark.parametrize("name", ["DATABASE_URL", "REDIS_URL"])
def test_a_secret_file_that_is_named_but_missing_is_refused_naming_the_variable(name, tmp_path):
    # (It used to be a bare FileNotFoundError traceback, with no word of which setting named it.)
    missing = tmp_path / "not-mounted"
    done = settings_with(**{f"{name}_FILE": str(missing)})
    assert done.returncode != 0
    assert f"ImproperlyConfigured: {name}_FILE={str(missing)!r}: No such file or directory" in done.stderr
