"""The token a notebook server demands (``colony jupyter``). Its server listens on 127.0.0.1 of
its node, which every other job there can reach, so it demands a token: ``HMAC(SECRET_KEY, launch
id)``, unguessable without the server's secret, new for every attempt, stored nowhere. The
control plane adds it to the launch (:func:`launch_env`; never to the job's stored env, which
teammates may read), the node hands it to the server in its environment, and the notebook proxy
adds it to each request it forwards: the user never handles it. Apart from
:mod:`jobs.services.notebooks` because the launch (:mod:`jobs.services.commands`) needs it too.
"""

from __future__ import annotations

from django.utils.crypto import salted_hmac

from agents import tunnel_protocol

_TOKEN_SALT = "colony.notebook.token"


def token(launch: str) -> str:
    """The token the notebook server of attempt ``launch`` demands (64 hex digits)."""
    return salted_hmac(_TOKEN_SALT, launch, algorithm="sha256").hexdigest()


def launch_env(env: dict[str, str], launch: str) -> dict[str, str]:
    """A launch's env: a notebook job's gets its server's token; any other job's is unchanged."""
    if tunnel_protocol.notebook_idle_s(env) is None:
        return env
    return {**env, tunnel_protocol.NOTEBOOK_TOKEN_ENV: token(launch)}
