"""There is no Docker engine here, so check what we can: every service in docker-compose.yml
runs an entry point that exists in this project."""

import importlib
import importlib.util
from pathlib import Path

import pytest
import yaml
from django.core.management import get_commands

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
OUR_SERVICES = {name: svc for name, svc in COMPOSE["services"].items() if "image" not in svc or "build" in svc}


def test_compose_has_the_production_shaped_stack():
    assert {"postgres", "redis", "web", "worker", "beat"} <= set(COMPOSE["services"])
    assert sum(1 for name in COMPOSE["services"] if name.startswith("agent")) >= 2
    assert (ROOT / "Dockerfile").is_file()


def _check_entry_point(argv: list[str]) -> None:
    program, *args = argv
    if program == "gunicorn":
        module, attr = args[0].split(":")
        assert hasattr(importlib.import_module(module), attr), args[0]
    elif program == "celery":
        assert importlib.util.find_spec(args[args.index("-A") + 1]) is not None
        assert args[2] in {"worker", "beat"}, args
    elif program == "python" and args[0] == "-m":
        assert importlib.util.find_spec(f"{args[1]}.__main__") is not None, args[1]
    elif program == "python" and args[0] == "manage.py":
        assert args[1] in get_commands(), args[1]
    else:
        pytest.fail(f"unknown entry point {argv}")


@pytest.mark.parametrize("service", sorted(OUR_SERVICES))
def test_service_command_names_an_entry_point_that_exists(service):
    _check_entry_point(OUR_SERVICES[service]["command"])


def test_dockerfile_default_command_exists():
    line = next(l for l in (ROOT / "Dockerfile").read_text().splitlines() if l.startswith("CMD"))
    _check_entry_point(yaml.safe_load(line.removeprefix("CMD ")))
