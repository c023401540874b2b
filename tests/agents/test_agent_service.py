"""The agent installed like a service: ``agents/pyproject.toml`` builds a ``colony-agent`` wheel
that installs, offline, into a fresh virtualenv holding only the agent's own dependencies (no
Django, no Celery), runs there against a real Redis, and ``agents/systemd/colony-agent@.service``
starts it with options the agent accepts.

The fresh virtualenv gets its dependencies from this one: a ``.pth`` file points at a directory of
links to exactly the distributions ``colony-agent`` declares (and what they require), so pip
resolves against them with ``--no-index`` and a dependency missing from the declaration fails the
install or the imports here.
"""

from __future__ import annotations

import ast
import configparser
import importlib.metadata as metadata
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis as redis_lib
from packaging.requirements import Requirement

from agents import protocol

REPO = Path(__file__).resolve().parents[2]
AGENTS = REPO / "agents"
UNIT = AGENTS / "systemd" / "colony-agent@.service"
SERVER_PACKAGES = ("django", "rest_framework", "celery", "psycopg", "jobs", "monitoring", "cluster_ui")
OFFLINE = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1", "PIP_CONFIG_FILE": os.devnull}


def declared_requirements() -> list[Requirement]:
    import tomllib

    project = tomllib.loads((AGENTS / "pyproject.toml").read_text())["project"]
    return [Requirement(r) for r in project["dependencies"]]


def with_requirements(names: list[str]) -> set[str]:
    """The distributions ``names`` need, transitively, as installed here (markers evaluated)."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = metadata.distribution(todo.pop()).metadata["Name"]
        if name.lower() in seen:
            continue
        seen.add(name.lower())
        for text in metadata.requires(name) or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return seen


def link_distributions(names: set[str], into: Path) -> None:
    """Links to the installed files of each distribution (its top-level modules and dist-info)."""
    into.mkdir()
    for name in names:
        dist = metadata.distribution(name)
        root = Path(dist.locate_file(""))
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops - {"__pycache__", "bin"}:
            if (root / top).exists() and not (into / top).exists():
                (into / top).symlink_to(root / top)


@pytest.fixture(scope="module")
def installed_agent(tmp_path_factory):
    """(python, colony-agent script) of a fresh virtualenv with the built wheel installed."""
    base = tmp_path_factory.mktemp("agent-install")
    source = base / "src"
    shutil.copytree(AGENTS, source, ignore=shutil.ignore_patterns("__pycache__"))
    wheels = base / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                    "-w", str(wheels), str(source)], check=True, capture_output=True, env=OFFLINE, timeout=180)
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    deps = base / "deps"
    link_distributions(with_requirements([r.name for r in declared_requirements()]), deps)
    (site / "colony_agent_deps.pth").write_text(f"{deps}\n")
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-index",
                              "--find-links", str(wheels), "colony-agent"],
                             capture_output=True, text=True, env=OFFLINE, timeout=180)
    assert install.returncode == 0, install.stdout + install.stderr
    return python, venv / "bin" / "colony-agent"


def run_in(python: Path, code: str, *args: str) -> subprocess.CompletedProcess:
    # Outside the repository, so that nothing imports from the checkout instead of the install.
    return subprocess.run([python, "-c", code, *args], capture_output=True, text=True, cwd="/", timeout=120)


IMPORT_ALL = """
import importlib, pkgutil, sys, agents
for module in pkgutil.walk_packages(agents.__path__, 'agents.'):
    if module.name != 'agents.__main__':
        importlib.import_module(module.name)
loaded = sorted({m.split('.')[0] for m in sys.modules} & set(sys.argv[1].split(',')))
assert not loaded, 'server code loaded: %s' % loaded
print(agents.__file__)
"""


@pytest.mark.slow
def test_wheel_installs_offline_without_the_server_and_imports_every_agent_module(installed_agent):
    python, _ = installed_agent
    for package in SERVER_PACKAGES:
        assert run_in(python, f"import {package}").returncode != 0, f"{package} is importable in the agent's venv"
    result = run_in(python, IMPORT_ALL, ",".join(SERVER_PACKAGES))
    assert result.returncode == 0, result.stderr
    assert "site-packages" in result.stdout and str(REPO) not in result.stdout
    files = run_in(python, "import importlib.metadata as m; print('\\n'.join(str(f) for f in m.files('colony-agent')))")
    tops = {line.split("/")[0] for line in files.stdout.split()}
    # The package and its metadata; ".." is the colony-agent script in the venv's bin/.
    assert {t for t in tops if not t.endswith(".dist-info")} - {".."} == {"agents"}, tops
    assert "agents/systemd/colony-agent@.service" in files.stdout


def test_every_third_party_import_of_the_agent_is_a_declared_dependency():
    """Including imports inside functions (pynvml), which importing the modules does not reach."""
    provided = set()
    for name in with_requirements([r.name for r in declared_requirements()]):
        provided |= {Path(str(f)).parts[0].removesuffix(".py") for f in metadata.files(name) or []}
    imported = set()
    for path in AGENTS.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                imported.add(node.module.split(".")[0])
    third_party = imported - set(sys.stdlib_module_names) - {"agents", "__future__"}
    assert third_party and third_party <= provided, third_party - provided


def test_installed_agent_runs_against_redis_and_stops_cleanly_on_sigterm(installed_agent, redis_url, tmp_path):
    _, script = installed_agent
    key_file = tmp_path / "key"
    key_file.write_text("ab" * 32)
    key_file.chmod(0o600)
    agent = subprocess.Popen([script, "--node", "svc-1", "--simulate", "1xT4-16GB", "--redis", redis_url,
                              "--key-file", str(key_file), "--workdir", str(tmp_path / "work"), "--interval", "0.2"],
                             cwd="/", stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    client = redis_lib.Redis.from_url(redis_url)
    try:
        deadline = time.monotonic() + 30
        while not client.exists(protocol.heartbeat_key("svc-1")) and time.monotonic() < deadline:
            assert agent.poll() is None, agent.stdout.read()
            time.sleep(0.1)
        assert client.exists(protocol.heartbeat_key("svc-1")), "the installed agent never heartbeat"
    finally:
        agent.send_signal(signal.SIGTERM)
        output = agent.communicate(timeout=30)[0]
        client.close()
    assert agent.returncode == 0, output


# --- the systemd unit ---------------------------------------------------------------------------

def unit() -> configparser.ConfigParser:
    # systemd units repeat keys (LoadCredential=, EnvironmentFile=); strict=False keeps the last.
    parser = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    parser.optionxform = str
    parser.read_string(UNIT.read_text())
    return parser


def unit_values(key: str) -> list[str]:
    return [line.split("=", 1)[1] for line in UNIT.read_text().splitlines() if line.startswith(key + "=")]


def exec_start_argv(node: str = "gpu-01", credentials: str = "/run/credentials/x",
                    state: str = "/var/lib") -> list[str]:
    """ExecStart with the specifiers the unit uses filled in as systemd would."""
    line = unit()["Service"]["ExecStart"]
    assert not re.search(r"%[^idS%]", line), "a specifier this test does not know"
    return shlex.split(line.replace("%i", node).replace("%d", credentials).replace("%S", state))


def test_unit_starts_one_agent_per_node_with_credentials_from_files():
    service = unit()["Service"]
    argv = exec_start_argv()
    assert argv[0].endswith("/colony-agent")
    assert argv[argv.index("--node") + 1] == "gpu-01"
    assert argv[argv.index("--key-file") + 1] == "/run/credentials/x/key"
    assert argv[argv.index("--redis-file") + 1] == "/run/credentials/x/redis-url"
    assert "--redis" not in argv, "a Redis URL with a password must not be on the command line"
    assert unit_values("LoadCredential") == ["key:/etc/colony/agent/%i.key", "redis-url:/etc/colony/agent/%i.redis-url"]
    assert service["WorkingDirectory"] == argv[argv.index("--workdir") + 1].replace("/var/lib", "%S").replace(
        "gpu-01", "%i")
    assert service["Restart"] == "on-failure" and service["RestartSec"]
    assert service["KillMode"] == "process", "systemd must leave the job supervisors alone when the agent restarts"


def test_unit_sandboxes_the_agent_but_lets_it_switch_users_and_reach_gpus():
    service = unit()["Service"]
    assert service["ProtectSystem"] == "strict"
    assert "%S/colony-agent/%i" in service["ReadWritePaths"].split()
    assert service["PrivateTmp"] == "yes"
    for setting in ("NoNewPrivileges", "PrivateDevices", "DynamicUser", "PrivateUsers", "CapabilityBoundingSet"):
        assert setting not in service, f"{setting} stops jobs running as their accounts or using the GPUs"


def test_exec_start_options_are_ones_the_agent_accepts():
    result = subprocess.run([sys.executable, "-m", "agents", "--help"], capture_output=True, text=True, cwd=REPO,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    accepted = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", result.stdout))
    used = {arg.split("=")[0] for arg in exec_start_argv() if arg.startswith("--")}
    assert used and used <= accepted, used - accepted


def test_exec_start_parses_with_real_credential_files(tmp_path, monkeypatch):
    """The whole command line, values included, as the agent itself reads it at start."""
    from agents.cli import parse_args

    for name in ("COLONY_AGENT_KEY_FILE", "COLONY_AGENT_KEY", "COLONY_REDIS_URL_FILE", "COLONY_AGENT_RUN_AS",
                 "COLONY_AGENT_RUN_AS_TENANT"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "key").write_text("cd" * 32)
    (tmp_path / "redis-url").write_text("redis://gpu-01:secret@control:6379/0\n")
    for path in tmp_path.iterdir():
        path.chmod(0o400)  # as systemd hands credentials over
    args = parse_args(exec_start_argv(credentials=str(tmp_path), state=str(tmp_path / "state"))[1:])
    assert args.node == "gpu-01" and args.key == bytes.fromhex("cd" * 32)
    assert args.redis == "redis://gpu-01:secret@control:6379/0" and not args.redis_warning and not args.key_warning
    assert args.workdir == tmp_path / "state" / "colony-agent" / "gpu-01"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_verifies_the_unit(installed_agent, tmp_path):
    """systemd's own checker, with ExecStart pointed at the agent installed above (it must exist)."""
    _, script = installed_agent
    instance = tmp_path / "colony-agent@gpu-01.service"
    instance.write_text(UNIT.read_text().replace("/opt/colony-agent/bin/colony-agent", str(script)))
    result = subprocess.run(["systemd-analyze", "verify", str(instance)], capture_output=True, text=True, timeout=60)
    complaints = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert result.returncode == 0 and not complaints, complaints
