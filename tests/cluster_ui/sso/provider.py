"""A real OpenID Connect provider on loopback for the single sign-on tests (tests/cluster_ui/sso and the
browser test).

``oidc-provider-mock`` is a small OpenID provider built on Authlib's server: discovery, dynamic
client registration, an authorization form, a token endpoint that signs RS256 ID tokens with its
own key (published at /jwks), userinfo, and PKCE and nonce checks. Colony talks to it over HTTP as
to any IdP; nothing of mozilla-django-oidc or of Colony is replaced. Users are put into its
directory with their claims (``groups`` included) as an IdP administrator would.
"""


from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from urllib.parse import parse_qs, quote, urlencode, urlsplit

import httpx
import werkzeug.serving
from werkzeug.wrappers import Request, Response

from cluster_ui.sso.group_map import parse_group_map

CALLBACK_PATH = "/sso/oidc/callback/"
PROVIDER_NAME = "Example IdP"
GROUP_MAP = {
    "vision-researchers": {"tenant": "vision"},
    "vision-leads": {"tenant": "vision", "role": "lead"},
    "nlp-researchers": {"tenant": "nlp", "role": "researcher"},
    "ghost-team": {"tenant": "no-such-tenant"},
    "hpc-admins": {"role": "operator"},
}


@dataclass
class Client:
    client_id: str
    client_secret: str


class Provider:
    """The running provider: its endpoints, its directory of users, and clients registered with it."""

    def __init__(self, server):
        self.issuer = f"http://localhost:{server.server_port}"
        self.http = httpx.Client(base_url=self.issuer, timeout=10)
        config = self.http.get("/.well-known/openid-configuration").json()
        assert config["issuer"] == self.issuer
        self.config = config

    def register(self, *redirect_uris: str) -> Client:
        response = self.http.post("/oauth2/clients", json={"redirect_uris": list(redirect_uris),
                                                           "token_endpoint_auth_method": "client_secret_basic"})
        assert response.status_code == 201, response.text
        body = response.json()
        return Client(body["client_id"], body["client_secret"])

    def add_user(self, sub: str, **claims) -> None:
        response = self.http.put(f"/users/{quote(sub, safe='')}", json=claims)
        assert response.status_code == 204, response.text

    def log_in(self, authorize_url: str, sub: str) -> str:
        """What a person does on the provider's sign-in page: the URL it sends the browser back to."""
        response = self.http.post(authorize_url, data={"sub": sub})
        assert response.status_code == 302, response.text
        return response.headers["location"]

    def deny(self, authorize_url: str) -> str:
        response = self.http.post(authorize_url, data={"action": "deny"})
        assert response.status_code == 302, response.text
        return response.headers["location"]

    def id_token_for(self, client: Client, redirect_uri: str, sub: str, nonce: str) -> str:
        """A genuine ID token this provider issues to ``client`` (another application, say)."""
        query = urlencode({"response_type": "code", "client_id": client.client_id, "redirect_uri": redirect_uri,
                           "scope": "openid email profile", "state": "s", "nonce": nonce})
        back = self.log_in(f"{self.config['authorization_endpoint']}?{query}", sub)
        code = parse_qs(urlsplit(back).query)["code"][0]
        response = self.http.post(self.config["token_endpoint"], auth=(client.client_id, client.client_secret),
                                  data={"grant_type": "authorization_code", "code": code, "redirect_uri": redirect_uri})
        assert response.status_code == 200, response.text
        return response.json()["id_token"]


def configure(settings, provider: Provider, client: Client, group_map=GROUP_MAP) -> None:
    """What an operator's COLONY_OIDC_* environment makes of settings (tests/cluster_ui/sso/test_config.py
    checks that reading)."""
    settings.COLONY_OIDC_ENABLED = True
    settings.COLONY_OIDC_ISSUER = provider.issuer
    settings.COLONY_OIDC_PROVIDER_NAME = PROVIDER_NAME
    settings.OIDC_RP_CLIENT_ID = client.client_id
    settings.OIDC_RP_CLIENT_SECRET = client.client_secret
    settings.OIDC_OP_AUTHORIZATION_ENDPOINT = provider.config["authorization_endpoint"]
    settings.OIDC_OP_TOKEN_ENDPOINT = provider.config["token_endpoint"]
    settings.OIDC_OP_USER_ENDPOINT = provider.config["userinfo_endpoint"]
    settings.OIDC_OP_JWKS_ENDPOINT = provider.config["jwks_uri"]
    settings.COLONY_OIDC_GROUP_MAP = parse_group_map(json.dumps(group_map))


class TokenSwap:
    """A man in the middle of the token endpoint: forwards Colony's code exchange to the provider
    and hands back its answer with the ID token replaced by ``swap(original)``, as a compromised
    network path or a confused proxy would."""

    def __init__(self, token_endpoint: str):
        self.token_endpoint = token_endpoint
        self.swap = None
        self.server = werkzeug.serving.make_server("127.0.0.1", 0, self._app, threaded=True)
        self.url = f"http://127.0.0.1:{self.server.server_port}/token"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    @Request.application
    def _app(self, request):
        forwarded = httpx.post(self.token_endpoint, content=request.get_data(), timeout=10,
                               headers={k: v for k, v in request.headers.items()
                                        if k.lower() in ("authorization", "content-type")})
        body = forwarded.json()
        if self.swap is not None and "id_token" in body:
            body["id_token"] = self.swap(body["id_token"])
        return Response(json.dumps(body), status=forwarded.status_code, content_type="application/json")
