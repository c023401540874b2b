"""Single sign-on from an operator's environment: cluster_ui/settings.py read in a fresh process,
as the web server reads it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PRINT = ("import json, cluster_ui.settings as s; print(json.dumps({'enabled': s.COLONY_OIDC_ENABLED, "
         "'secret': s.OIDC_RP_CLIENT_SECRET, 'client': s.OIDC_RP_CLIENT_ID, 'basic': s.OIDC_TOKEN_USE_BASIC_AUTH, "
         "'claim': s.COLONY_OIDC_GROUPS_CLAIM, 'vision': s.COLONY_OIDC_GROUP_MAP.resolve(['v']).tenants}))")


def read_settings(tmp_path, **env):
    base = {k: v for k, v in os.environ.items() if not k.startswith("COLONY_OIDC_")}
    result = subprocess.run([sys.executable, "-c", PRINT], cwd=ROOT, capture_output=True, text=True, timeout=60,
                            env={**base, "COLONY_VAR_DIR": str(tmp_path), **env})
    return result


def full_env(tmp_path) -> dict[str, str]:
    secret = tmp_path / "oidc-secret"
    secret.write_text("s3cret-from-file\n")
    mapping = tmp_path / "groups.json"
    mapping.write_text(json.dumps({"v": {"tenant": "vision", "role": "lead"}}))
    return {
        "COLONY_OIDC_ISSUER": "https://idp.example.org/realms/lab/",
        "COLONY_OIDC_CLIENT_ID": "colony",
        "COLONY_OIDC_CLIENT_SECRET_FILE": str(secret),
        "COLONY_OIDC_AUTHORIZATION_ENDPOINT": "https://idp.example.org/auth",
        "COLONY_OIDC_TOKEN_ENDPOINT": "https://idp.example.org/token",
        "COLONY_OIDC_USERINFO_ENDPOINT": "https://idp.example.org/userinfo",
        "COLONY_OIDC_JWKS_ENDPOINT": "https://idp.example.org/certs",
        "COLONY_OIDC_GROUP_MAP_FILE": str(mapping),
    }


def test_off_by_default(tmp_path):
    result = read_settings(tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["enabled"] is False


def test_configured_from_the_environment_with_the_secret_and_mapping_from_files(tmp_path):
    result = read_settings(tmp_path, **full_env(tmp_path), COLONY_OIDC_GROUPS_CLAIM="realm_access.roles")
    assert result.returncode == 0, result.stderr
    read = json.loads(result.stdout)
    assert read == {"enabled": True, "secret": "s3cret-from-file", "client": "colony", "basic": True,
                    "claim": "realm_access.roles", "vision": {"vision": "lead"}}


def test_the_secret_is_never_taken_from_the_environment(tmp_path):
    result = read_settings(tmp_path, **full_env(tmp_path), COLONY_OIDC_CLIENT_SECRET="in-the-env")
    assert result.returncode != 0
    assert "COLONY_OIDC_CLIENT_SECRET is read only from a file" in result.stderr


def test_a_half_configuration_names_what_is_missing(tmp_path):
    env = full_env(tmp_path)
    del env["COLONY_OIDC_JWKS_ENDPOINT"], env["COLONY_OIDC_GROUP_MAP_FILE"]
    result = read_settings(tmp_path, **env)
    assert result.returncode != 0
    assert "also needs COLONY_OIDC_GROUP_MAP, COLONY_OIDC_JWKS_ENDPOINT" in result.stderr

    del env["COLONY_OIDC_ISSUER"]
    result = read_settings(tmp_path, **env)
    assert result.returncode != 0 and "set but COLONY_OIDC_ISSUER is not" in result.stderr


def test_a_broken_mapping_stops_the_start(tmp_path):
    env = full_env(tmp_path)
    Path(env["COLONY_OIDC_GROUP_MAP_FILE"]).write_text('{"v": {"tenant": "vision", "role": "owner"}}')
    result = read_settings(tmp_path, **env)
    assert result.returncode != 0
    assert "group 'v': role 'owner' is not one of researcher, lead, operator" in result.stderr


def test_an_unreadable_secret_file_stops_the_start(tmp_path):
    result = read_settings(tmp_path, **{**full_env(tmp_path), "COLONY_OIDC_CLIENT_SECRET_FILE": str(tmp_path / "nope")})
    assert result.returncode != 0 and "COLONY_OIDC_CLIENT_SECRET_FILE=" in result.stderr
