# One image for every Colony process (web, worker, beat, agents); docker-compose.yml picks the command.
# colony runs the control plane; colony-jobs is the account agents (run as root) run jobs as.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 COLONY_VAR_DIR=/var/lib/colony
WORKDIR /app

# The runtime lock only (hashed, `make lock`): requirements.lock, which `make test` installs, also
# holds the test tools (pytest, Playwright, schemathesis, a mock OpenID provider) and never enters.
COPY requirements/runtime.lock /tmp/runtime.lock
RUN pip install --no-cache-dir --require-hashes -r /tmp/runtime.lock && rm /tmp/runtime.lock

COPY . .
RUN pip install --no-cache-dir --no-deps --no-build-isolation -e . \
 && DJANGO_SECRET_KEY=build-only python manage.py collectstatic --noinput \
 && useradd --system --create-home colony && useradd --system --user-group --no-create-home \
      --home-dir /nonexistent --shell /usr/sbin/nologin colony-jobs \
 && mkdir -p /var/lib/colony/agent /run/colony && chown colony /var/lib/colony && chmod 711 /var/lib/colony

USER colony
EXPOSE 8000
CMD ["gunicorn", "cluster_ui.wsgi:application", "--config", "python:cluster_ui.gunicorn_conf", "--bind", "0.0.0.0:8000", "--workers", "3"]
