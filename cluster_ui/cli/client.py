"""Talking to the Colony API: where it is, who we are, and HTTP with one error type.

Configuration, first found wins: command-line flags, then the environment (``COLONY_URL``,
``COLONY_TOKEN``), then a TOML file (``$COLONY_CONFIG``, else ``$XDG_CONFIG_HOME/colony/config.toml``,
else ``~/.config/colony/config.toml``) with ``url = "..."`` and ``token = "..."``.
"""

from __future__ import annotations

import json
import os
import tomllib
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

DEFAULT_URL = "http://127.0.0.1:8000/"
TIMEOUT_S = 30


class ConfigError(Exception):
    """Not enough to talk to the API (no token, unreadable config): a usage problem."""


class Usage(Exception):
    """A usage problem found after parsing (a bad size, say): exit 2 like argparse does."""


class ApiError(Exception):
    """The API refused or could not be reached. ``body`` is its error object when it sent one."""

    def __init__(self, message: str, status: int | None = None, body: dict | None = None,
                 retry_after: str | None = None):
        super().__init__(message)
        self.status, self.body, self.retry_after = status, body, retry_after

    @property
    def fields(self) -> dict:
        return ((self.body or {}).get("error") or {}).get("fields") or {}


def config_path() -> Path:
    if os.environ.get("COLONY_CONFIG"):
        return Path(os.environ["COLONY_CONFIG"])
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "colony" / "config.toml"


def load_file(path: Path) -> dict:
    if not path.exists():
        return {}
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None


@dataclass(frozen=True)
class Settings:
    url: str
    token: str


def resolve(url: str | None = None, token: str | None = None) -> Settings:
    from_file = load_file(config_path())
    url = url or os.environ.get("COLONY_URL") or from_file.get("url") or DEFAULT_URL
    token = token or os.environ.get("COLONY_TOKEN") or from_file.get("token")
    if not token:
        raise ConfigError(
            "no API token: set COLONY_TOKEN, pass --token, or put token = \"...\" in "
            f"{config_path()} (create one on the dashboard's API tokens page)"
        )
    return Settings(url=url.rstrip("/") + "/", token=str(token))


class Client:
    def __init__(self, settings: Settings):
        self.settings = settings

    def request(self, method: str, path: str, body: dict | None = None, query: dict | None = None):
        data = json.dumps(body).encode() if body is not None else None
        _, answer = self.send(method, path, data, "application/json", query)
        return answer

    def send(self, method: str, path: str, data: bytes | None = None, content_type: str | None = None,
             query: dict | None = None) -> tuple[int, object]:
        """One call with a raw body; the status too, for calls where 200 and 201 mean different things."""
        url = urllib.parse.urljoin(self.settings.url, path.lstrip("/"))
        if query:
            url += "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v not in (None, "")})
        request = urllib.request.Request(url, data=data, method=method, headers={
            "Authorization": f"Token {self.settings.token}",
            "Accept": "application/json",
            **({"Content-Type": content_type} if data is not None and content_type else {}),
        })
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
                status, payload = response.status, response.read()
        except urllib.error.HTTPError as exc:
            raise _api_error(exc) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ApiError(f"cannot reach {self.settings.url}: {reason}") from None
        return status, (json.loads(payload) if payload else None)

    def get(self, path: str, **query):
        return self.request("GET", path, query=query)

    def post(self, path: str, body: dict | None = None):
        return self.request("POST", path, body=body)


def _api_error(exc: urllib.error.HTTPError) -> ApiError:
    raw = exc.read()
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    error = (body or {}).get("error") if isinstance(body, dict) else None
    if error:
        message = error.get("message") or exc.reason
    elif isinstance(body, dict) and "detail" in body:
        message = str(body["detail"])
    else:
        message = f"HTTP {exc.code} {exc.reason}"
    retry_after = exc.headers.get("Retry-After") if exc.headers else None
    return ApiError(str(message), status=exc.code, body=body if isinstance(body, dict) else None,
                    retry_after=retry_after)
