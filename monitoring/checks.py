"""System checks for a deployment (``manage.py check --deploy``)."""

from django.conf import settings
from django.core.checks import Tags, Warning, register


@register(Tags.security, deploy=True)
def agent_authentication(app_configs, **kwargs):
    """Without agent authentication any client of Redis can post metrics and events for any node."""
    if settings.COLONY_AGENT_AUTH == "required":
        return []
    return [Warning(
        "Agent authentication is off: any client of Redis can post metrics and job events for any node.",
        hint="Set COLONY_AGENT_SECRET (or COLONY_AGENT_SECRET_FILE), at least 16 characters, and install "
             "each node's key from `manage.py agent_key NODE` (see docs/security.md, 'Agent authentication').",
        id="colony.W001",
    )]


@register(Tags.database, deploy=True)
def production_database(app_configs, **kwargs):
    """SQLite is the embedded developer default; a deployment that forgot DATABASE_URL would
    otherwise run on a file inside the container, and lose it with the container."""
    if settings.DATABASES["default"]["ENGINE"] != "django.db.backends.sqlite3":
        return []
    return [Warning(
        "The database is SQLite (the developer default): DATABASE_URL is unset.",
        hint="Set DATABASE_URL (or DATABASE_URL_FILE) to the PostgreSQL database, e.g. "
             "postgres://colony@db:5432/colony (docs/settings.md).",
        id="colony.W002",
    )]


@register(Tags.database, deploy=True)
def database_password(app_configs, **kwargs):
    """A PostgreSQL login over TCP without a password works only where pg_hba.conf trusts it, and
    then for anyone who can reach that port: on a GPU node, every job (one read another tenant's
    rows with psql that way). A Unix socket (empty or absolute HOST) is left alone: peer
    authentication there checks the process's own account."""
    database = settings.DATABASES["default"]
    host = database.get("HOST") or ""
    if (not database["ENGINE"].startswith("django.db.backends.postgresql") or database.get("PASSWORD")
            or not host or host.startswith("/") or (database.get("OPTIONS") or {}).get("sslcert")):
        return []
    return [Warning(
        f"DATABASE_URL logs in to PostgreSQL on {host} as {database.get('USER') or 'the default user'!r} and "
        "has no password: whoever can reach that port can log in the same way.",
        hint="Give the role a password and put postgres://USER:PASSWORD@HOST:PORT/DB in the file "
             "DATABASE_URL_FILE names (mode 600), or connect through a Unix socket with peer authentication.",
        id="colony.W003",
    )]
