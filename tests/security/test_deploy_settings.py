"""Production settings pass Django's deployment check; the developer stack and tests keep plain http.

The settings are read in a fresh process with the environment a deployment sets, because
cluster_ui/settings.py decides at import time from the environment (the checks in ``manage.py``).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.test import Client

ROOT = Path(__file__).resolve().parents[2]
# Knobs this file sets or that would change the answer if the developer's shell had them.
OURS = ("DJANGO_SETTINGS_MODULE", "DJANGO_DEBUG", "DJANGO_SECRET_KEY", "DJANGO_SECRET_KEY_FILE",
        "DJANGO_ALLOWED_HOSTS", "COLONY_HTTPS", "COLONY_HSTS_SECONDS", "COLONY_HSTS_INCLUDE_SUBDOMAINS",
        "COLONY_HSTS_PRELOAD", "COLONY_TRUST_X_FORWARDED_PROTO", "COLONY_AGENT_SECRET",
        "COLONY_AGENT_SECRET_FILE", "COLONY_AGENT_AUTH", "DATABASE_URL", "DATABASE_URL_FILE")
SHOWN = ("DEBUG", "SECURE_SSL_REDIRECT", "SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE", "SECURE_HSTS_SECONDS",
         "SECURE_PROXY_SSL_HEADER", "X_FRAME_OPTIONS")


def python(tmp_path, *argv, **env) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in OURS}
    environ.update(COLONY_VAR_DIR=str(tmp_path), DJANGO_SETTINGS_MODULE="cluster_ui.settings", **env)
    return subprocess.run([sys.executable, *argv], cwd=ROOT, env=environ, capture_output=True, text=True,
                          timeout=60)


def manage(tmp_path, *argv, **env) -> subprocess.CompletedProcess:
    return python(tmp_path, "manage.py", *argv, **env)


def production(**extra) -> dict:
    return {"DJANGO_DEBUG": "0", "DJANGO_SECRET_KEY": secrets.token_urlsafe(64),
            "DJANGO_ALLOWED_HOSTS": "colony.example.org", "COLONY_AGENT_SECRET": secrets.token_hex(32),
            "DATABASE_URL": "postgres://colony:db-password@db.example.org:5432/colony", **extra}


def settings_in(tmp_path, **env) -> dict:
    # Only the settings module is imported (a `manage.py shell` also loaded every app: 0.9 s, not 0.1).
    code = f"from django.conf import settings; print(json.dumps({{n: getattr(settings, n, None) for n in {SHOWN!r}}}))"
    done = python(tmp_path, "-c", f"import json; {code}", **env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_check_deploy_is_clean_in_production(tmp_path):
    done = manage(tmp_path, "check", "--deploy", "--fail-level", "DEBUG", **production())
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues (0 silenced)." in done.stdout


def test_check_deploy_flags_agents_that_need_no_key(tmp_path):
    env = production()
    del env["COLONY_AGENT_SECRET"]
    done = manage(tmp_path, "check", "--deploy", "--fail-level", "WARNING", **env)
    assert done.returncode != 0
    assert "colony.W001" in done.stderr and "agent_key" in done.stderr


def test_check_deploy_flags_a_production_left_on_sqlite(tmp_path):
    env = production()
    del env["DATABASE_URL"]  # (set but empty is refused at start: tests/cluster_ui/test_settings_env.py)
    done = manage(tmp_path, "check", "--deploy", "--fail-level", "WARNING", **env)
    assert done.returncode != 0
    assert "colony.W002" in done.stderr and "DATABASE_URL is unset" in done.stderr


@pytest.mark.parametrize("key", [None, "", "file:empty", "file:missing"])
def test_production_refuses_to_start_without_a_secret_key(tmp_path, key):
    # It used to serve on a public fallback key (check --deploy: W009, exit 0): sessions forgeable.
    env = production()
    del env["DJANGO_SECRET_KEY"]
    if key == "":
        env["DJANGO_SECRET_KEY"] = ""
    elif key is not None:
        path = tmp_path / "django-secret-key"
        if key == "file:empty":
            path.write_text("\n")
        env["DJANGO_SECRET_KEY_FILE"] = str(path)
    done = manage(tmp_path, "check", **env)
    assert done.returncode != 0
    named = ("DJANGO_SECRET_KEY_FILE=" if key == "file:missing"
             else "DJANGO_SECRET_KEY_FILE (or DJANGO_SECRET_KEY) is unset or empty and DJANGO_DEBUG is off")
    assert f"ImproperlyConfigured: {named}" in done.stderr, done.stderr[-2000:]


def test_a_secret_key_from_its_file_is_used(tmp_path):
    env = production()
    key = env.pop("DJANGO_SECRET_KEY")
    (tmp_path / "django-secret-key").write_text(key + "\n")
    code = "from django.conf import settings; print(settings.SECRET_KEY)"
    done = python(tmp_path, "-c", code, DJANGO_SECRET_KEY_FILE=str(tmp_path / "django-secret-key"), **env)
    assert done.stdout.strip() == key, done.stderr[-2000:]


def test_a_debug_run_needs_no_secret_key(tmp_path):
    assert settings_in(tmp_path, DJANGO_DEBUG="1")["DEBUG"] is True


@pytest.mark.parametrize("url, flagged", [
    ("postgres://colony@db.example.org:5432/colony", True),            # a trusted TCP login: anyone on the host
    ("postgres://colony@127.0.0.1:5432/colony", True),
    ("postgres://colony:db-password@db.example.org:5432/colony", False),
    ("postgres://colony@%2Frun%2Fpostgresql/colony", False),           # a Unix socket: peer authentication
])
def test_check_deploy_flags_a_postgresql_login_without_a_password(tmp_path, url, flagged):
    done = manage(tmp_path, "check", "--deploy", "--fail-level", "WARNING", **production(DATABASE_URL=url))
    assert (done.returncode != 0, "colony.W003" in done.stderr) == (flagged, flagged), done.stdout + done.stderr
    if flagged:
        assert "has no password" in done.stderr


def test_production_is_https_only(tmp_path):
    assert settings_in(tmp_path, **production()) == {
        "DEBUG": False, "SECURE_SSL_REDIRECT": True, "SESSION_COOKIE_SECURE": True, "CSRF_COOKIE_SECURE": True,
        "SECURE_HSTS_SECONDS": 31536000, "SECURE_PROXY_SSL_HEADER": None, "X_FRAME_OPTIONS": "DENY",
    }


def test_behind_a_tls_proxy_the_forwarded_scheme_is_trusted_only_when_asked(tmp_path):
    shown = settings_in(tmp_path, **production(COLONY_TRUST_X_FORWARDED_PROTO="1"))
    assert shown["SECURE_PROXY_SSL_HEADER"] == ["HTTP_X_FORWARDED_PROTO", "https"]


@pytest.mark.parametrize("env", [
    # what `make run` (cluster_ui.devstack) sets, with the key it makes
    {"DJANGO_DEBUG": "0", "COLONY_HTTPS": "0", "DJANGO_SECRET_KEY": secrets.token_urlsafe(64)},
    {"DJANGO_DEBUG": "1"},                        # a developer's debug run
    production(COLONY_HTTPS="0"),                 # trying the compose stack over plain http
])
def test_development_speaks_plain_http(tmp_path, env):
    shown = settings_in(tmp_path, **env)
    assert (shown["SECURE_SSL_REDIRECT"], shown["SESSION_COOKIE_SECURE"], shown["CSRF_COOKIE_SECURE"],
            shown["SECURE_HSTS_SECONDS"]) == (False, False, False, 0)


def test_devstack_runs_with_debug_off_over_plain_http_unless_told_otherwise():
    # The live check (a 404 of Colony's own from `make run`) is in tests/e2e/test_devstack.py.
    source = (ROOT / "cluster_ui" / "devstack" / "supervisor.py").read_text()
    assert '"DJANGO_DEBUG": env.get("DJANGO_DEBUG", "0")' in source
    assert '"COLONY_HTTPS": env.get("COLONY_HTTPS", "0")' in source


def test_pages_carry_the_browser_security_headers(client, db):
    response = client.get("/accounts/login/")
    assert response.status_code == 200  # the tests' plain http is not redirected
    assert response["X-Frame-Options"] == "DENY"
    assert response["Referrer-Policy"] == "same-origin"
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["Cross-Origin-Opener-Policy"] == "same-origin"


def test_https_only_redirects_http_and_sends_hsts(db, settings, live_redis):
    settings.SECURE_SSL_REDIRECT, settings.SECURE_HSTS_SECONDS = True, 31536000
    client = Client()
    redirected = client.get("/accounts/login/")
    assert (redirected.status_code, redirected["Location"]) == (301, "https://testserver/accounts/login/")
    secure = client.get("/accounts/login/", secure=True)
    assert secure.status_code == 200
    assert secure["Strict-Transport-Security"] == "max-age=31536000; includeSubDomains; preload"
    # Prometheus scrapes /metrics over plain http inside the cluster (from the private Redis of
    # live_redis: a system Redis on 6379 that refused writes once made this answer 500).
    assert client.get("/metrics").status_code == 200


def test_forms_need_a_csrf_token(researcher):
    client = Client(enforce_csrf_checks=True)
    client.force_login(researcher)
    refused = client.post("/jobs/submit/", {"command": "python train.py", "gpus": "1"})
    assert refused.status_code == 403
    page = client.get("/jobs/submit/")
    assert b'name="csrfmiddlewaretoken"' in page.content


@pytest.mark.parametrize("password", ["short", "password123", "12345678901", "alice123"])
def test_weak_passwords_are_refused(researcher, password):
    with pytest.raises(ValidationError):
        validate_password(password, user=researcher)


def test_a_strong_password_is_accepted(researcher):
    validate_password("correct-horse-battery-staple", user=researcher)
