"""The image installs the runtime lock and the project alone: no test tool (pyproject's `test`
extra) reaches it, every pin carries its files' hashes, and the versions are those of
requirements.lock, which `make test` and CI install (`make lock` writes both)."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parents[2]
RUNTIME_LOCK = ROOT / "requirements" / "runtime.lock"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
NAME = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)")
HASH = re.compile(r"--hash=sha256:[0-9a-f]{64}")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(spec: str) -> str:
    return canonical(NAME.match(spec.strip()).group(1))


def instructions() -> list[tuple[str, str]]:
    """The Dockerfile's instructions, continuation lines joined: (keyword, arguments)."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            found.append((keyword.upper(), rest.strip()))
    return found


def pip_installs() -> list[list[str]]:
    """The arguments of every `pip install` the image runs."""
    installs = []
    for keyword, rest in instructions():
        if keyword != "RUN":
            continue
        for command in re.split(r"&&|;", rest):
            argv = shlex.split(command)
            if "pip" in argv and argv[argv.index("pip") + 1:argv.index("pip") + 2] == ["install"]:
                installs.append(argv[argv.index("pip") + 2:])
    return installs


def copied() -> dict[PurePosixPath, str]:
    """Destination in the image -> the file of this checkout it was copied from (COPY src dest)."""
    sources = {}
    for keyword, rest in instructions():
        if keyword == "COPY" and not rest.startswith("--"):
            *srcs, dest = shlex.split(rest)
            if len(srcs) == 1 and not dest.endswith("/"):
                sources[PurePosixPath(dest)] = srcs[0]
    return sources


def lock_entries(text: str) -> dict[str, tuple[str, str]]:
    """name -> (version, the whole requirement with its continuation lines)."""
    entries = {}
    for entry in re.sub(r"\\\n", " ", text).splitlines():
        entry = entry.strip()
        if not entry or entry.startswith("#"):
            continue
        name, _, version = entry.split()[0].partition("==")
        entries[canonical(name)] = (version, entry)
    return entries


RUNTIME = lock_entries(RUNTIME_LOCK.read_text())
FULL = lock_entries((ROOT / "requirements.lock").read_text())


def test_the_image_installs_the_runtime_lock_with_hashes_and_the_project_without_deps():
    installs = pip_installs()
    files = [argv[argv.index("-r") + 1] for argv in installs if "-r" in argv]
    assert [copied().get(PurePosixPath(path)) for path in files] == ["requirements/runtime.lock"], installs
    for argv in installs:
        if "-r" in argv:
            assert "--require-hashes" in argv, argv
        else:
            # Nothing named here but the project, and none of its dependencies fetched unpinned.
            assert "--no-deps" in argv and [arg for arg in argv if not arg.startswith("-")] == ["."], argv


def test_no_test_tool_is_in_what_the_image_installs():
    test_tools = {requirement_name(spec) for spec in PYPROJECT["project"]["optional-dependencies"]["test"]}
    assert {"pytest", "playwright", "schemathesis", "hypothesis", "oidc-provider-mock"} <= test_tools
    installed = set(RUNTIME)
    assert installed & test_tools == set()
    assert [name for name in installed if name.startswith("pytest")] == []
    # What the test tools alone pull in (Playwright's greenlet, schemathesis' hypothesis-graphql).
    assert installed & {"greenlet", "hypothesis-graphql", "factory-boy", "faker", "execnet"} == set()


def test_every_runtime_pin_carries_hashes():
    assert len(RUNTIME) > 20
    unhashed = [entry for _version, entry in RUNTIME.values() if "==" not in entry or not HASH.search(entry)]
    assert unhashed == []
    for line in RUNTIME_LOCK.read_text().splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            assert "==" in stripped or HASH.fullmatch(stripped.removesuffix("\\").strip()), line


def test_the_runtime_lock_holds_every_runtime_dependency_at_the_test_locks_version():
    runtime_deps = {requirement_name(spec) for spec in PYPROJECT["project"]["dependencies"]}
    assert runtime_deps - set(RUNTIME) == set()
    assert {name: (version, FULL.get(name, ("missing",))[0]) for name, (version, _entry) in RUNTIME.items()
            if FULL.get(name, ("missing",))[0] != version} == {}


def test_a_developers_checkout_leaves_its_virtualenv_and_tests_out_of_the_image():
    # `COPY . .` would otherwise carry .venv (with every test tool) into /app.
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert {".venv", "tests", ".env", "var"} <= ignored
