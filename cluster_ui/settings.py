"""Colony settings. Everything that differs between machines comes from the environment.

Defaults are the embedded developer set-up: SQLite under ``var/``, Redis on localhost. Production
sets ``DATABASE_URL`` (PostgreSQL), ``REDIS_URL``, ``DJANGO_SECRET_KEY`` and ``DJANGO_DEBUG=0``;
``python manage.py check --deploy`` must then report no issues (tests/security checks that it does).
"""

import os
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from cluster_ui.env import env_bool, env_float, env_int, env_list, env_secret, env_str

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("COLONY_VAR_DIR", str(BASE_DIR / "var")))
VAR_DIR.mkdir(parents=True, exist_ok=True)

DEBUG = env_bool("DJANGO_DEBUG", False)
# Signs sessions, CSRF tokens and password resets: a public fallback would let anyone forge them,
# so only a debug run may go without one. `make run` makes and keeps its own (var/secrets/).
SECRET_KEY = env_secret("DJANGO_SECRET_KEY") or ""
if not SECRET_KEY.strip():
    if not DEBUG:
        raise ImproperlyConfigured(
            "DJANGO_SECRET_KEY_FILE (or DJANGO_SECRET_KEY) is unset or empty and DJANGO_DEBUG is off: point "
            "DJANGO_SECRET_KEY_FILE at a file (mode 600) holding a key, e.g. "
            "`python -c 'import secrets; print(secrets.token_urlsafe(50))'`")
    SECRET_KEY = "django-insecure-debug-only-key"
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost,testserver")
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS", "")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI served from our static files, not a CDN
    "cluster_ui.apps.ClusterUiConfig",
    "cluster_ui.sso",  # single sign-on: OpenID Connect identities, IdP groups -> tenants and roles
    "monitoring",
    "jobs",
]

# django-prometheus times and counts every request between its two middlewares, first and last:
# by view name (bounded, unlike the raw path), method and status; /metrics exports them
# (monitoring.metrics.web_process_collectors). Its app is not installed: its ready() only opens
# export ports of its own, which Colony does not use (one /metrics, behind COLONY_METRICS_TOKEN).
MIDDLEWARE = [
    "django_prometheus.middleware.PrometheusBeforeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "cluster_ui.middleware.RefuseNulInUrlMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_prometheus.middleware.PrometheusAfterMiddleware",
]

ROOT_URLCONF = "cluster_ui.urls"
WSGI_APPLICATION = "cluster_ui.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "jobs.context_processors.led_tenants",
            ],
        },
    },
]


def _database(url: str) -> dict:
    config = dj_database_url.parse(url, conn_max_age=env_int("DATABASE_CONN_MAX_AGE", 60))
    if config["ENGINE"] == "django.db.backends.sqlite3":
        # WAL + IMMEDIATE lets the web server, the worker and the test process share one file
        # without "database is locked" on upgrade from a read to a write transaction.
        config["CONN_MAX_AGE"] = 0
        config["OPTIONS"] = {
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
        }
        # A file, not :memory:, so that worker and agent subprocesses in tests see the test DB.
        config["TEST"] = {"NAME": str(VAR_DIR / "test-colony.sqlite3")}
    return config


def _url(name: str, default: str) -> str:
    """``name`` (or the file ``name_FILE`` names), ``default`` when unset. Set but empty (`NAME=`
    in a .env or compose file, a secret file that mounted empty) is refused with the reason: it
    is no URL, and falling back to the developer default would run a deployment on SQLite or on
    a local Redis without a word."""
    value = env_secret(name)
    if value is None:
        return default
    if not value.strip():
        source = f"the file {name}_FILE names" if os.environ.get(f"{name}_FILE") else name
        raise ImproperlyConfigured(f"{name} is set but empty ({source}): set it to a URL, or unset it for "
                                   f"the embedded default ({default.split('://')[0]})")
    return value


# URLs may hold a password: each also comes from the file NAME_FILE names (as the dev stack passes them).
DATABASES = {"default": _database(_url("DATABASE_URL", f"sqlite:///{VAR_DIR / 'colony.sqlite3'}"))}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = BASE_DIR / "staticfiles"

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "jobs:queue"
LOGOUT_REDIRECT_URL = "login"

# ---------------------------------------------------------------- HTTPS and browser hardening
# Production (DEBUG off) is served over HTTPS only: plain http is redirected, cookies are Secure and
# browsers are told (HSTS) never to try http again. The developer stack (`make run` sets
# DJANGO_DEBUG=1) and the tests (tests/settings.py) speak plain http on 127.0.0.1.
COLONY_HTTPS = env_bool("COLONY_HTTPS", not DEBUG)
SECURE_SSL_REDIRECT = COLONY_HTTPS
# Prometheus scrapes /metrics from inside the cluster over plain http (it has its own token).
SECURE_REDIRECT_EXEMPT = [r"^metrics$"]
SESSION_COOKIE_SECURE = COLONY_HTTPS
CSRF_COOKIE_SECURE = COLONY_HTTPS
SECURE_HSTS_SECONDS = env_int("COLONY_HSTS_SECONDS", 365 * 24 * 3600) if COLONY_HTTPS else 0
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("COLONY_HSTS_INCLUDE_SUBDOMAINS", True)
SECURE_HSTS_PRELOAD = env_bool("COLONY_HSTS_PRELOAD", True)
# Behind a TLS-terminating proxy Django sees plain http; trust the proxy's X-Forwarded-Proto, or
# SECURE_SSL_REDIRECT would redirect forever. Only behind a proxy that always sets (overwrites) it.
if env_bool("COLONY_TRUST_X_FORWARDED_PROTO", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
# Django's defaults, spelled out because they are part of what we promise.
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
SESSION_COOKIE_HTTPONLY = True

# ---------------------------------------------------------------- hostile input
# Bodies over this size are refused from their Content-Length before anything reads them: the API
# answers 413 in its error format (cluster_ui/api/errors.py), pages Django's 400. A job submission is a
# few KiB.
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("COLONY_MAX_REQUEST_BYTES", 256 * 1024)
# JSON nested deeper than this is refused (400) before it is decoded (cluster_ui/api/parsers.py).
COLONY_MAX_JSON_DEPTH = env_int("COLONY_MAX_JSON_DEPTH", 32)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "cluster_ui.api_tokens.ExpiringTokenAuthentication",  # tokens expire and can be revoked
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.PageNumberPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    # DRF's three, held to the size limit, JSON depth limit and strict UTF-8 (cluster_ui/api/parsers.py).
    "DEFAULT_PARSER_CLASSES": ["cluster_ui.api.parsers.JSONParser", "cluster_ui.api.parsers.FormParser",
                               "cluster_ui.api.parsers.MultiPartParser"],
    # One error format everywhere: {"error": {"code", "message", "fields"}}.
    "EXCEPTION_HANDLER": "cluster_ui.api.errors.exception_handler",
    # Counts only job submissions; 429 + Retry-After past the per-user rate.
    "DEFAULT_THROTTLE_CLASSES": ["cluster_ui.api.throttles.SubmissionRateThrottle"],
    "DEFAULT_THROTTLE_RATES": {"submit": env_str("COLONY_SUBMIT_RATE", "120/min") or None},
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Colony API",
    "DESCRIPTION": "Submit and follow GPU jobs on a shared, multi-tenant cluster.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "ENUM_NAME_OVERRIDES": {"PendingReasonCodeEnum": "jobs.scheduling.reasons.ReasonCode"},
}

# ---------------------------------------------------------------- Redis, Celery, scheduler
# With a password in it, pass REDIS_URL_FILE (a file only Colony's account can read) instead.
REDIS_URL = _url("REDIS_URL", "redis://127.0.0.1:6379/0")

# Throttle counters live in the cache; production shares one Redis cache between web workers.
_cache_url = env_secret("COLONY_CACHE_URL", "")
CACHES = {
    "default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": _cache_url}
    if _cache_url else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
}

CELERY_BROKER_URL = env_secret("CELERY_BROKER_URL", REDIS_URL)
CELERY_TASK_IGNORE_RESULT = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")

COLONY_SCHEDULER_INTERVAL = env_float("COLONY_SCHEDULER_INTERVAL", 2.0)
COLONY_EVENTS_INTERVAL = env_float("COLONY_EVENTS_INTERVAL", 1.0)
# A cycle holding the lock longer than this without renewing it is presumed dead and another may
# start (a running cycle renews it every third of this: jobs/services/leadership.py LeaseKeeper).
COLONY_SCHEDULER_LOCK_LEASE = env_float("COLONY_SCHEDULER_LOCK_LEASE", 30.0)
# ... but only for this long: a cycle hung with its process running then loses the lease too.
COLONY_SCHEDULER_MAX_CYCLE_S = env_float("COLONY_SCHEDULER_MAX_CYCLE_S", 300.0)
# The scheduling cycle runs only in the worker that consumes this queue, one process with
# `--pool solo -Q scheduler` (devstack's `scheduler` child, compose's `scheduler` service), so that
# what a cycle keeps for the next (jobs/services/scheduling_loop.py) survives and the lease stays
# with one process. General workers consume the default queue (`-Q celery`) only.
COLONY_SCHEDULER_QUEUE = "scheduler"
CELERY_TASK_ROUTES = {"jobs.tasks.scheduling_cycle": {"queue": COLONY_SCHEDULER_QUEUE}}
# Fair share: a tenant's recent GPU use decays with this half-life (seconds).
COLONY_USAGE_HALF_LIFE_S = env_float("COLONY_USAGE_HALF_LIFE_S", 24 * 3600.0)
# Borrowers turn over: one with less than this many GPU-seconds of service that would otherwise
# over-commit a GPU preempts borrowers past it that checkpoint (jobs/scheduling/turnover.py). 0: off.
COLONY_BORROWER_TURNOVER_GPU_S = env_float("COLONY_BORROWER_TURNOVER_GPU_S", 3600.0)
# Stop commands give a job this long after SIGTERM before SIGKILL.
COLONY_STOP_GRACE_SECONDS = env_float("COLONY_STOP_GRACE_SECONDS", 10.0)
# A launch not reported started, or a stop not yet confirmed, this long after it was sent is sent
# again (it may have been lost with Redis, or with a worker that died after its commit); agents
# recognise a command they already applied.
COLONY_RESEND_AFTER_S = env_float("COLONY_RESEND_AFTER_S", 15.0)
# Preemption notice: a job may ask for up to this many seconds between its stop signal and SIGKILL;
# one that asks for nothing gets the stop grace above.
COLONY_MAX_PREEMPT_GRACE_S = env_int("COLONY_MAX_PREEMPT_GRACE_S", 300)
# What a job that does not say asks of its node's CPU and host memory, per GPU it asks for (a
# fraction of a GPU asks that fraction). 0: nothing, so only jobs that ask are counted.
COLONY_DEFAULT_CPUS_PER_GPU = env_float("COLONY_DEFAULT_CPUS_PER_GPU", 0.0)
COLONY_DEFAULT_HOST_MEMORY_MIB_PER_GPU = env_int("COLONY_DEFAULT_HOST_MEMORY_MIB_PER_GPU", 0)
COLONY_MAX_ARRAY_SIZE = env_int("COLONY_MAX_ARRAY_SIZE", 1000)
COLONY_MAX_PENDING_PER_USER = env_int("COLONY_MAX_PENDING_PER_USER", 10_000)
# Variables a job may set although they change who it is or what runs in it (HOME, USER, LOGNAME,
# SHELL, LD_*: refused at submission otherwise). Its node must allow them too (--allow-job-env).
COLONY_JOB_ENV_ALLOWED = env_list("COLONY_JOB_ENV_ALLOWED")
# Uploaded code (colony submit packs the current directory): at most this much per tenant, and an
# archive no job has needed for this long is dropped (its row stays; uploading it again restores it).
COLONY_CODE_STORAGE_MB = env_int("COLONY_CODE_STORAGE_MB", 2048)
COLONY_CODE_RETENTION_DAYS = env_int("COLONY_CODE_RETENTION_DAYS", 30)

# Beat entries expire just under their period so that missed ticks never pile up.
CELERY_BEAT_SCHEDULE = {
    "scheduling-cycle": {
        "task": "jobs.tasks.scheduling_cycle",
        "schedule": COLONY_SCHEDULER_INTERVAL,
        "options": {"expires": COLONY_SCHEDULER_INTERVAL * 0.9},
    },
    "consume-agent-events": {
        "task": "jobs.tasks.consume_agent_events",
        "schedule": COLONY_EVENTS_INTERVAL,
        "options": {"expires": COLONY_EVENTS_INTERVAL * 0.9},
    },
    "purge-unused-code": {"task": "jobs.tasks.purge_unused_code", "schedule": 3600.0, "options": {"expires": 3500}},
    # Live job output (jobs/services/job_logs.py): its own task, so output never delays events.
    "consume-job-logs": {
        "task": "jobs.tasks.consume_job_logs",
        "schedule": COLONY_EVENTS_INTERVAL,
        "options": {"expires": COLONY_EVENTS_INTERVAL * 0.9},
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("COLONY_LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}

# ---------------------------------------------------------------- monitoring
# A node whose heartbeat key has expired (agents refresh it every interval, TTL 10 s) is only
# suspected; it is LOST (its jobs requeued) once it has stayed silent this much longer. A loaded
# machine (load 15-30 on two cores) lets heartbeats lapse for seconds at a time: requeueing on
# the first lapse ran jobs twice. So a node is lost after about a minute of silence, not 10 s.
COLONY_NODE_LOST_GRACE_S = env_float("COLONY_NODE_LOST_GRACE_S", 60.0)
# ... and never while it (re)registered less than this long ago.
COLONY_NODE_REGISTRATION_GRACE_S = env_float("COLONY_NODE_REGISTRATION_GRACE_S", 15.0)
# After Redis restarts (empty: heartbeats gone), no node is judged LOST for this long, so that
# agents can reconnect (their backoff tops out at 5 s) before their silence means anything.
COLONY_REDIS_RESTART_GRACE_S = env_float("COLONY_REDIS_RESTART_GRACE_S", 30.0)
COLONY_ALERT_TEMPERATURE_C = env_float("COLONY_ALERT_TEMPERATURE_C", 85.0)
COLONY_IDLE_GPU_MINUTES = env_float("COLONY_IDLE_GPU_MINUTES", 30.0)
COLONY_IDLE_GPU_UTIL_PERCENT = env_float("COLONY_IDLE_GPU_UTIL_PERCENT", 5.0)
# How often tenants' idle-GPU policies are applied (jobs/services/idle_reclaim.py): steps are minutes apart.
COLONY_IDLE_RECLAIM_INTERVAL_S = env_float("COLONY_IDLE_RECLAIM_INTERVAL_S", 60.0)
# A job requeued for idling stays off the nodes it idled on this long (jobs/services/avoided_nodes.py).
COLONY_IDLE_REQUEUE_AVOID_S = env_float("COLONY_IDLE_REQUEUE_AVOID_S", 900.0)
# A launch that fails for its node's reason is tried on up to this many nodes, each then avoided
# for COLONY_LAUNCH_AVOID_S (jobs/services/launch_failures.py).
COLONY_LAUNCH_MAX_NODES = env_int("COLONY_LAUNCH_MAX_NODES", 3)
COLONY_LAUNCH_AVOID_S = env_float("COLONY_LAUNCH_AVOID_S", 1800.0)
# API tokens last this many days unless made for fewer or more, never more than the maximum
# (cluster_ui/api_tokens.py).
COLONY_API_TOKEN_DAYS = env_int("COLONY_API_TOKEN_DAYS", 90)
COLONY_API_TOKEN_MAX_DAYS = env_int("COLONY_API_TOKEN_MAX_DAYS", 365)
COLONY_ROLLUP_RETENTION_10S_HOURS = env_float("COLONY_ROLLUP_RETENTION_10S_HOURS", 24.0)
COLONY_ROLLUP_RETENTION_1M_DAYS = env_float("COLONY_ROLLUP_RETENTION_1M_DAYS", 30.0)
# Bearer token Prometheus must send to /metrics; empty means /metrics is open (bind it privately).
COLONY_METRICS_TOKEN = env_secret("COLONY_METRICS_TOKEN", "")

# ---------------------------------------------------------------- agent authentication
# One secret makes every node's signing key and Redis password (agents/signing.py; operators get
# them with `manage.py agent_key NODE` and `manage.py agent_acl NODE`). "required": an agent message
# that is unsigned, or not signed with the key of the node it names, is dead-lettered, never
# applied. "off": messages are not checked (the readers log a warning when they start).
COLONY_AGENT_SECRET = env_secret("COLONY_AGENT_SECRET", "") or ""
COLONY_AGENT_AUTH = env_str("COLONY_AGENT_AUTH", "required" if COLONY_AGENT_SECRET else "off").strip().lower()
if COLONY_AGENT_AUTH not in ("required", "off"):
    raise ImproperlyConfigured(f"COLONY_AGENT_AUTH={COLONY_AGENT_AUTH!r}: use 'required' or 'off'")
if COLONY_AGENT_AUTH == "required" and len(COLONY_AGENT_SECRET) < 16:
    raise ImproperlyConfigured("COLONY_AGENT_AUTH=required needs COLONY_AGENT_SECRET (or COLONY_AGENT_SECRET_FILE) "
                               "of at least 16 characters, "
                               "e.g. `python -c 'import secrets; print(secrets.token_hex(32))'`")

CELERY_BEAT_SCHEDULE.update({
    "node-health": {
        "task": "jobs.tasks.check_node_health",
        "schedule": COLONY_SCHEDULER_INTERVAL,
        "options": {"expires": COLONY_SCHEDULER_INTERVAL * 0.9},
    },
    "compact-rollups": {"task": "monitoring.tasks.compact_rollups", "schedule": 60.0, "options": {"expires": 55}},
    # The cluster heatmap's settled blocks, computed as they settle rather than by the first viewer.
    "warm-heatmap": {"task": "monitoring.tasks.warm_heatmap", "schedule": 60.0, "options": {"expires": 55}},
    "prune-rollups": {"task": "monitoring.tasks.prune_rollups", "schedule": 600.0, "options": {"expires": 590}},
    "evaluate-alerts": {"task": "jobs.tasks.evaluate_alerts", "schedule": 30.0, "options": {"expires": 28}},
    "reclaim-idle-gpus": {
        "task": "jobs.tasks.reclaim_idle_gpus",
        "schedule": COLONY_IDLE_RECLAIM_INTERVAL_S,
        "options": {"expires": COLONY_IDLE_RECLAIM_INTERVAL_S * 0.9},
    },
})

# ---------------------------------------------------------------- notebooks (jobs/services/notebooks.py)
# Where browsers reach the notebook proxy (`manage.py notebook_proxy`), e.g. https://notebooks.example.org;
# unset: the host the dashboard was reached at, on COLONY_NOTEBOOK_PORT (what `make run` serves).
COLONY_NOTEBOOK_URL = env_str("COLONY_NOTEBOOK_URL", "").rstrip("/")
COLONY_NOTEBOOK_PORT = env_int("COLONY_NOTEBOOK_PORT", 8001)

# ---------------------------------------------------------------- notifications (jobs/services/notifications.py)
# Links in messages point here: the address researchers open Colony at.
COLONY_PUBLIC_URL = env_str("COLONY_PUBLIC_URL", "http://127.0.0.1:8000").rstrip("/")
# Webhooks never call loopback, private or link-local addresses (Redis, the database, a cloud's
# metadata service) unless their host is listed here, e.g. an in-cluster chat bridge.
COLONY_WEBHOOK_ALLOWED_HOSTS = env_list("COLONY_WEBHOOK_ALLOWED_HOSTS", "")
# Mail goes to the worker's console until an SMTP host is set.
EMAIL_HOST = env_str("DJANGO_EMAIL_HOST", "")
EMAIL_BACKEND = env_str("DJANGO_EMAIL_BACKEND", "django.core.mail.backends.smtp.EmailBackend" if EMAIL_HOST
                        else "django.core.mail.backends.console.EmailBackend")
EMAIL_PORT = env_int("DJANGO_EMAIL_PORT", 587)
EMAIL_HOST_USER = env_str("DJANGO_EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env_secret("DJANGO_EMAIL_HOST_PASSWORD", "") or ""
EMAIL_USE_TLS = env_bool("DJANGO_EMAIL_USE_TLS", True)
EMAIL_TIMEOUT = env_int("DJANGO_EMAIL_TIMEOUT", 10)
DEFAULT_FROM_EMAIL = env_str("DJANGO_DEFAULT_FROM_EMAIL", "Colony <colony@localhost>")
CELERY_BEAT_SCHEDULE.update({
    "notify-long-waits": {"task": "jobs.tasks.notify_long_waits", "schedule": 60.0, "options": {"expires": 55}},
    "redeliver-notifications": {"task": "jobs.tasks.redeliver_notifications", "schedule": 300.0,
                                "options": {"expires": 290}},
})
# ---------------------------------------------------------------- end of notifications

# ---------------------------------------------------------------- single sign-on (cluster_ui/sso)
# OpenID Connect login beside local accounts (mozilla-django-oidc, code flow with PKCE, nonce and
# state), off until COLONY_OIDC_ISSUER is set. docs/operations.md "Single sign-on" describes every knob and the
# group mapping; the client secret is read only from COLONY_OIDC_CLIENT_SECRET_FILE.
from cluster_ui.sso.config import client_secret, oidc_enabled  # noqa: E402
from cluster_ui.sso.group_map import parse_group_map  # noqa: E402

AUTHENTICATION_BACKENDS = ["django.contrib.auth.backends.ModelBackend", "cluster_ui.sso.backend.OIDCBackend"]
# Exactly as the provider writes it in its tokens (`iss`): with its trailing slash, if it has one.
COLONY_OIDC_ISSUER = env_str("COLONY_OIDC_ISSUER", "")
COLONY_OIDC_PROVIDER_NAME = env_str("COLONY_OIDC_PROVIDER_NAME", "your organisation")
OIDC_RP_CLIENT_ID = env_str("COLONY_OIDC_CLIENT_ID", "")
OIDC_RP_CLIENT_SECRET = client_secret("COLONY_OIDC_CLIENT_SECRET")
OIDC_OP_AUTHORIZATION_ENDPOINT = env_str("COLONY_OIDC_AUTHORIZATION_ENDPOINT", "")
OIDC_OP_TOKEN_ENDPOINT = env_str("COLONY_OIDC_TOKEN_ENDPOINT", "")
OIDC_OP_USER_ENDPOINT = env_str("COLONY_OIDC_USERINFO_ENDPOINT", "")
OIDC_OP_JWKS_ENDPOINT = env_str("COLONY_OIDC_JWKS_ENDPOINT", "")
# The IdP's groups -> tenants and roles: JSON text, or COLONY_OIDC_GROUP_MAP_FILE naming a file of it.
_group_map_text = env_secret("COLONY_OIDC_GROUP_MAP", "") or ""
COLONY_OIDC_GROUP_MAP = parse_group_map(_group_map_text)
COLONY_OIDC_ENABLED = oidc_enabled(
    COLONY_OIDC_ISSUER, COLONY_OIDC_CLIENT_ID=OIDC_RP_CLIENT_ID, COLONY_OIDC_CLIENT_SECRET_FILE=OIDC_RP_CLIENT_SECRET,
    COLONY_OIDC_AUTHORIZATION_ENDPOINT=OIDC_OP_AUTHORIZATION_ENDPOINT,
    COLONY_OIDC_TOKEN_ENDPOINT=OIDC_OP_TOKEN_ENDPOINT,
    COLONY_OIDC_USERINFO_ENDPOINT=OIDC_OP_USER_ENDPOINT, COLONY_OIDC_JWKS_ENDPOINT=OIDC_OP_JWKS_ENDPOINT,
    COLONY_OIDC_GROUP_MAP=_group_map_text.strip(),
)
COLONY_OIDC_GROUPS_CLAIM = env_str("COLONY_OIDC_GROUPS_CLAIM", "groups")
# The claim holding a user's POSIX account name (e.g. "uid" from an LDAP-backed IdP): their jobs run
# as that account on the nodes. Empty: nodes look the user up by their Colony name.
COLONY_OIDC_POSIX_CLAIM = env_str("COLONY_OIDC_POSIX_CLAIM", "")
OIDC_RP_SCOPES = env_str("COLONY_OIDC_SCOPES", "openid email profile")
OIDC_RP_SIGN_ALGO = env_str("COLONY_OIDC_SIGN_ALGO", "RS256")
# Seconds of clock difference tolerated on the ID token's exp/iat.
COLONY_OIDC_LEEWAY_S = env_int("COLONY_OIDC_LEEWAY_S", 60)
# client_secret_basic is what the OpenID spec makes the default; "post" sends it in the body.
OIDC_TOKEN_USE_BASIC_AUTH = env_str("COLONY_OIDC_TOKEN_AUTH", "basic").strip().lower() != "post"
OIDC_USE_PKCE = True
OIDC_USE_NONCE = True
OIDC_TIMEOUT = env_float("COLONY_OIDC_TIMEOUT_S", 10.0)
OIDC_AUTHENTICATION_CALLBACK_URL = "sso:oidc_authentication_callback"
# ---------------------------------------------------------------- end of single sign-on
