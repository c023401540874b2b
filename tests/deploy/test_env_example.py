"""The compose stack's settings, built from `.env.example` exactly as compose builds them, pass
`manage.py check --deploy` with no warning.

Each server service's environment is the image's ENV (Dockerfile), then `.env` (a copy of
`.env.example`, read as compose reads an env_file), then the service's own `environment:`. The
files its `*_FILE` variables name are written by the `credentials` service's own command, into a
temporary directory standing for its volumes. With no Docker engine here that is as close to
`docker compose up` as this machine gets; `docker compose config` runs where an engine answers.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
# Where the credentials command writes when not told otherwise (its --root).
CREDENTIALS_ROOT = PurePosixPath("/run/colony")


def read_env_file(text: str) -> dict[str, str]:
    """``NAME=value`` lines as compose reads an env_file (compose-go's dotenv parser): ``#`` lines
    are comments; an unquoted value starts at its first non-blank and ends before its first `` #``,
    so ``NAME=   # a comment`` sets NAME to ``# a comment``; quotes around a value are dropped."""
    env = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, value = line.partition("=")
        value = value.lstrip(" \t")
        if value[:1] in ("'", '"') and value[-1:] == value[:1] and len(value) >= 2:
            value = value[1:-1]
        else:
            value = value.split(" #", 1)[0].rstrip()
        env[name.strip()] = value
    return env


def image_env() -> dict[str, str]:
    env = {}
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if line.startswith("ENV "):
            env.update(item.split("=", 1) for item in shlex.split(line.removeprefix("ENV ")))
    return env


def mounts(service: dict) -> dict[str, PurePosixPath]:
    """Named volume -> where ``service`` mounts it."""
    found = {}
    for volume in service.get("volumes") or []:
        name, target = volume.split(":")[:2]
        found[name] = PurePosixPath(target)
    return found


def write_credentials(root: Path) -> None:
    """The credentials service's command, with its files under ``root`` and owners left alone."""
    argv = list(SERVICES["credentials"]["command"])
    assert argv[:3] == ["python", "-m", "cluster_ui.devstack.credentials"], argv
    done = subprocess.run([sys.executable, *argv[1:], "--root", str(root), "--no-chown"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def compose_environment(service_name: str, root: Path) -> dict[str, str]:
    """``service_name``'s environment with each path into a credentials volume (and the image's
    state directory) moved under ``root``, where :func:`write_credentials` wrote."""
    service = SERVICES[service_name]
    assert service.get("env_file") == [".env"], service_name
    env = {**image_env(), **read_env_file((ROOT / ".env.example").read_text()),
           **{name: str(value) for name, value in (service.get("environment") or {}).items()}}
    written_at = mounts(SERVICES["credentials"])
    here = {}
    for volume, target in mounts(service).items():
        if volume in written_at:
            here[target] = root / written_at[volume].relative_to(CREDENTIALS_ROOT)
    for name, value in env.items():
        if name.endswith("_FILE") and value:
            path = PurePosixPath(value)
            mount = next((target for target in here if path.is_relative_to(target)), None)
            assert mount is not None, f"{service_name}: {name}={value} is in no volume the credentials service writes"
            env[name] = str(here[mount] / path.relative_to(mount))
    if env.get("COLONY_VAR_DIR", "").startswith("/"):
        env["COLONY_VAR_DIR"] = str(root / "state")
    return env


# Every Colony server process: what runs Django (not the one-shot credentials, nor the agents).
DJANGO_SERVICES = sorted(name for name, service in SERVICES.items()
                         if service.get("env_file") and name != "credentials"
                         and service["command"][:3] != ["python", "-m", "agents"])


def manage(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess:
    # Nothing of this process's environment but PATH: what compose does not set stays unset.
    return subprocess.run([sys.executable, "manage.py", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **env})


@pytest.fixture(scope="module")
def credentials(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("run-colony")
    write_credentials(root)
    return root


def test_no_value_in_the_example_is_a_comment_compose_took_for_it():
    # `DJANGO_EMAIL_HOST=   # empty: ...` once gave the workers an SMTP host named "# empty: ...".
    example = read_env_file((ROOT / ".env.example").read_text())
    assert {name: value for name, value in example.items() if value.startswith("#")} == {}


def test_every_server_service_reads_the_same_settings():
    assert {"web", "worker", "scheduler", "beat", "ingest", "migrate"} <= set(DJANGO_SERVICES)
    first, *rest = DJANGO_SERVICES
    assert all(SERVICES[name].get("environment") == SERVICES[first].get("environment") for name in rest)
    assert all(mounts(SERVICES[name]) == mounts(SERVICES[first]) for name in rest)


def test_every_file_the_example_names_is_one_the_credentials_service_writes(credentials):
    env = compose_environment("web", credentials)
    named = {name: Path(value) for name, value in env.items() if name.endswith("_FILE") and value}
    assert {"DJANGO_SECRET_KEY_FILE", "DATABASE_URL_FILE", "REDIS_URL_FILE"} <= set(named)
    assert [f"{name}={path}" for name, path in named.items() if not path.is_file()] == []


def test_the_example_environment_passes_check_deploy_with_no_warning(credentials):
    done = manage(compose_environment("web", credentials), "check", "--deploy", "--fail-level", "DEBUG")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues (0 silenced)." in done.stdout


@pytest.mark.parametrize("name, path", [
    ("DJANGO_EMAIL_HOST_PASSWORD_FILE", "/run/colony/server/email-password"),
    ("COLONY_OIDC_GROUP_MAP_FILE", "/run/colony/server/oidc-groups.json"),
])
def test_an_optional_file_once_named_must_exist(credentials, name, path):
    # Off until configured; configured and missing is an error that names the variable.
    env = compose_environment("web", credentials)
    env[name] = str(credentials / PurePosixPath(path).relative_to(CREDENTIALS_ROOT))
    done = manage(env, "check")
    assert done.returncode != 0
    assert f"ImproperlyConfigured: {name}={env[name]!r}: No such file or directory" in done.stderr, done.stderr[-2000:]


def _docker_engine() -> str | None:
    if shutil.which("docker") is None:
        return "no docker client on PATH"
    done = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=60)
    return None if done.returncode == 0 else f"no Docker engine answers `docker info` ({done.stderr.strip()[:120]})"


def test_docker_compose_accepts_the_file_with_the_example_env(tmp_path):
    reason = _docker_engine()
    if reason:
        pytest.skip(reason)
    shutil.copy(ROOT / "docker-compose.yml", tmp_path / "docker-compose.yml")
    shutil.copy(ROOT / ".env.example", tmp_path / ".env")
    done = subprocess.run(["docker", "compose", "config", "--quiet"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
