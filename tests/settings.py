"""Settings for the test process only: production settings with a fast password hasher.

Subprocesses started by end-to-end tests (worker, agents) use ``cluster_ui.settings`` itself.
"""

from cluster_ui.settings import *  # noqa: F401,F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# One SQLite test database per test run, so that two suites running at once (two terminals, or a
# helper and CI) never share, and delete, each other's file.
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):  # noqa: F405
    import os

    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / f"test-colony-{os.getpid()}.sqlite3")}  # noqa: F405
