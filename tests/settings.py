"""Settings for the test process only: production settings with a fast password hasher.

Subprocesses started by end-to-end tests (worker, agents) use ``cluster_ui.settings`` itself.
"""

from cluster_ui.settings import *  # noqa: F401,F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# The test client and live servers speak plain http on 127.0.0.1, like the developer stack.
SECURE_SSL_REDIRECT = SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = False
SECURE_HSTS_SECONDS = 0

# One test database per test run, so that two suites running at once (two terminals, or a helper
# and CI) never share, and drop, each other's database.
import os  # noqa: E402

if DATABASES["default"]["ENGINE"].endswith("sqlite3"):  # noqa: F405
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / f"test-colony-{os.getpid()}.sqlite3")}  # noqa: F405
else:
    DATABASES["default"]["TEST"] = {"NAME": f"test_{DATABASES['default']['NAME']}_{os.getpid()}"}  # noqa: F405

# Each test starts on an emptied Redis; unit tests that judge nodes must not wait out the grace
# a real control plane gives agents after a Redis restart (tests/jobs/test_node_health.py has its own).
COLONY_REDIS_RESTART_GRACE_S = 0
