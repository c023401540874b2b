"""Settings for the test process only: production settings with a fast password hasher.

Subprocesses started by end-to-end tests (worker, agents) use ``cluster_ui.settings`` itself.
"""

from cluster_ui.settings import *  # noqa: F401,F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
