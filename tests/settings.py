"""Settings for the test process only: production settings with a fast password hasher.

Subprocesses started by end-to-end tests (worker, agents) use ``cluster_ui.settings`` itself.
"""

import os
import secrets
from pathlib import Path


def _secret_key_file() -> str:
    """A key of the tests' own, in a file (mode 600) kept across runs under var/secrets/.

    Production settings refuse to start with DEBUG off and no key, and the tests run with DEBUG
    off. A path, not the key, goes into the environment: every worker, agent and devstack the tests
    start inherits it, and tests/security/test_secrets_in_environ.py scans environments for keys."""
    directory = Path(os.environ.get("COLONY_VAR_DIR") or Path(__file__).resolve().parents[1] / "var") / "secrets"
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    path = directory / "test-django-secret-key"
    if not path.exists():
        # Written aside and linked into place: xdist workers racing here all read one whole key.
        draft = directory / f".test-django-secret-key.{os.getpid()}"
        fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_urlsafe(50) + "\n")
        try:
            os.link(draft, path)
        except FileExistsError:
            pass
        finally:
            draft.unlink()
    return str(path)


if not (os.environ.get("DJANGO_SECRET_KEY") or os.environ.get("DJANGO_SECRET_KEY_FILE")):
    os.environ["DJANGO_SECRET_KEY_FILE"] = _secret_key_file()

from cluster_ui.settings import *  # noqa: E402,F401,F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# The test client and live servers speak plain http on 127.0.0.1, like the developer stack.
SECURE_SSL_REDIRECT = SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = False
SECURE_HSTS_SECONDS = 0

# One test database per test run, so that two suites running at once (two terminals, or a helper
# and CI) never share, and drop, each other's database.
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):  # noqa: F405
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / f"test-colony-{os.getpid()}.sqlite3")}  # noqa: F405
else:
    DATABASES["default"]["TEST"] = {"NAME": f"test_{DATABASES['default']['NAME']}_{os.getpid()}"}  # noqa: F405

# Each test starts on an emptied Redis; unit tests that judge nodes must not wait out the grace
# a real control plane gives agents after a Redis restart (tests/jobs/test_node_health.py has its own).
COLONY_REDIS_RESTART_GRACE_S = 0
