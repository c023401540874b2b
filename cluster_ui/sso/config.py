"""Reading the OpenID Connect settings (settings.py's single sign-on block). No Django import
beyond ImproperlyConfigured: settings.py calls these while it is being read."""

from __future__ import annotations

import os
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured


def client_secret(name: str = "COLONY_OIDC_CLIENT_SECRET") -> str:
    """The client secret from the file ``NAME_FILE`` names, never from the environment itself:
    environments leak into child processes, crash reports and ``ps e``."""
    if os.environ.get(name):
        raise ImproperlyConfigured(f"{name} is read only from a file: put it in one only Colony's account "
                                   f"can read and set {name}_FILE to its path")
    path = os.environ.get(f"{name}_FILE", "")
    if not path:
        return ""
    try:
        return Path(path).read_text().strip()
    except OSError as exc:
        raise ImproperlyConfigured(f"{name}_FILE={path!r}: {exc.strerror}") from None


def oidc_enabled(issuer: str, **required: str) -> bool:
    """Single sign-on is on once the issuer is set; then everything else it needs must be, too."""
    if not issuer:
        stray = sorted(name for name, value in required.items() if value)
        if stray:
            raise ImproperlyConfigured(f"{', '.join(stray)} set but COLONY_OIDC_ISSUER is not: "
                                       "set it to turn single sign-on on, or unset the rest")
        return False
    missing = sorted(name for name, value in required.items() if not value)
    if missing:
        raise ImproperlyConfigured(f"COLONY_OIDC_ISSUER is set, so single sign-on also needs {', '.join(missing)}")
    return True
