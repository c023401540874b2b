"""A stand-in for a container runtime's client (docker, podman, apptainer), for the agent tests.

There is no container daemon where these tests run, so the integration is tested through the
runtime's command-line contract: :func:`install` writes an executable named like the runtime that
records its argv and environment (one JSON line per call) and then does what the real client
would, with the host as the "image": ``docker``/``podman run`` starts the inner argv in the ``-w``
directory with exactly the ``-e NAME`` variables (values from its own environment), in a session
of its own as a daemon-owned container would be, proxies the signals it gets (``--sig-proxy``),
and exits as ``docker run`` does (128 + signal); ``rm -f``/``kill NAME`` kill that "container";
``apptainer exec`` runs the argv in ``--pwd`` with the ``APPTAINERENV_*`` variables only.
"""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

SHIM = r'''#!{python}
import json, os, signal, subprocess, sys
RECORD, STATE, NAME = {record!r}, {state!r}, {name!r}
with open(RECORD, "a") as out:
    out.write(json.dumps({{"argv": sys.argv[1:], "env": dict(os.environ)}}) + "\n")
args = sys.argv[1:]
VALUED = {{"--name", "--gpus", "-v", "-w", "-e", "--user", "--group-add", "--device", "--pwd", "--bind"}}

def options(args):
    seen, i = [], 0
    while i < len(args) and args[i].startswith("-"):
        if args[i] in VALUED:
            seen.append((args[i], args[i + 1]))
            i += 2
        else:
            seen.append((args[i], None))
            i += 1
    return seen, args[i], args[i + 1:]

if NAME in ("docker", "podman") and args[:1] in (["rm"], ["kill"]):
    pidfile = os.path.join(STATE, args[-1] + ".pid")
    try:
        os.kill(int(open(pidfile).read()), signal.SIGKILL)
        os.unlink(pidfile)
    except (OSError, ValueError):
        sys.exit("Error: no such container: " + args[-1])
    sys.exit(0)
if NAME in ("docker", "podman") and args[:1] == ["run"]:
    opts, image, inner = options(args[1:])
    names = [value for flag, value in opts if flag == "-e"]
    env = {{"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}}
    env.update({{n: os.environ[n] for n in names if n in os.environ}})
    cwd = dict(opts).get("-w", "/")
    container = subprocess.Popen(inner, cwd=cwd, env=env, start_new_session=True)
    pidfile = os.path.join(STATE, dict(opts)["--name"] + ".pid")
    open(pidfile, "w").write(str(container.pid))
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP):
        signal.signal(signum, lambda s, f: container.send_signal(s))
    code = container.wait()
    try:
        os.unlink(pidfile)
    except OSError:
        pass
    sys.exit(128 - code if code < 0 else code)
if NAME == "apptainer" and args[:1] == ["exec"]:
    opts, image, inner = options(args[1:])
    env = {{k[len("APPTAINERENV_"):]: v for k, v in os.environ.items() if k.startswith("APPTAINERENV_")}}
    env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    os.chdir(dict(opts)["--pwd"])
    os.execve(inner[0], inner, env)
sys.exit("shim: unsupported call " + " ".join(args))
'''


def install(folder: Path, name: str) -> Path:
    """Write the ``name`` shim into ``folder`` (put it first on PATH); returns its record file."""
    folder.mkdir(parents=True, exist_ok=True)
    record, state = folder / f"{name}-calls.jsonl", folder / f"{name}-containers"
    state.mkdir(exist_ok=True)
    path = folder / name
    path.write_text(SHIM.format(python=sys.executable, record=str(record), state=str(state), name=name))
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return record


def calls(record: Path) -> list[dict]:
    """Each call of the shim so far: ``{"argv": [...], "env": {...}}``."""
    if not record.exists():
        return []
    return [json.loads(line) for line in record.read_text().splitlines()]


def running_containers(record: Path) -> list[str]:
    return sorted(p.stem for p in (record.parent / f"{record.name.split('-')[0]}-containers").glob("*.pid"))

