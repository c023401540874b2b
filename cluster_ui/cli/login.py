"""``colony login``: trade a username and password for an API token and keep it (with the URL)
in the config file, readable by its owner only, so later commands need no flags or variables."""

from __future__ import annotations

import getpass
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from cluster_ui.cli.client import DEFAULT_URL, TIMEOUT_S, ApiError, Usage, _api_error, config_path, load_file


def add_arguments(parser) -> None:
    parser.add_argument("--username", "-u", help="your Colony username (asked for when not given)")
    parser.add_argument("--password-stdin", action="store_true",
                        help="read the password from standard input (for scripts) instead of asking")


def cmd_login(args) -> tuple[dict, str]:
    path = config_path()
    url = (getattr(args, "url", None) or os.environ.get("COLONY_URL") or load_file(path).get("url")
           or DEFAULT_URL).rstrip("/") + "/"
    username = args.username or input("Username: ").strip()
    password = sys.stdin.readline().rstrip("\n") if args.password_stdin else getpass.getpass("Password: ")
    if not username or not password:
        raise Usage("give a username and a password")
    token = _obtain_token(url, username, password)
    _save(path, url, token)
    return {"url": url, "username": username, "config": str(path)}, \
        f"Logged in to {url} as {username}; the token is saved in {path}."


def _obtain_token(url: str, username: str, password: str) -> str:
    request = urllib.request.Request(
        urllib.parse.urljoin(url, "api/v1/auth/token/"), method="POST",
        data=json.dumps({"username": username, "password": password}).encode(),
        headers={"Content-Type": "application/json", "Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            return json.loads(response.read())["token"]
    except urllib.error.HTTPError as exc:
        raise _api_error(exc) from None
    except (urllib.error.URLError, OSError) as exc:
        raise ApiError(f"cannot reach {url}: {getattr(exc, 'reason', exc)}") from None


def _save(path: Path, url: str, token: str) -> None:
    """Write the config atomically, 0600 from its first byte: it holds a credential."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    kept = {key: value for key, value in load_file(path).items() if key not in ("url", "token")}
    lines = [f"{key} = {json.dumps(value)}" for key, value in kept.items() if isinstance(value, (str, int, bool))]
    lines += [f"url = {json.dumps(url)}", f"token = {json.dumps(token)}"]
    temporary = path.with_name(path.name + ".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write("\n".join(lines) + "\n")
    os.replace(temporary, path)
