"""Fixtures: the provider (one per test session), Colony registered with it and configured for it."""

from __future__ import annotations

import pytest
from oidc_provider_mock import run_server_in_thread

from tests.cluster_ui.sso.provider import CALLBACK_PATH, Client, Provider, TokenSwap, configure


@pytest.fixture(scope="session")
def oidc_server():
    with run_server_in_thread(require_client_registration=True, require_nonce=True) as server:
        yield server


@pytest.fixture
def provider(oidc_server) -> Provider:
    provider = Provider(oidc_server)
    yield provider
    provider.http.close()


@pytest.fixture
def colony_client(provider) -> Client:
    """Colony registered with the provider for the test client's host."""
    return provider.register(f"http://testserver{CALLBACK_PATH}")


@pytest.fixture
def sso(settings, provider, colony_client):
    configure(settings, provider, colony_client)
    return provider


@pytest.fixture
def token_swap(sso, settings):
    swap = TokenSwap(sso.config["token_endpoint"])
    swap.thread.start()
    settings.OIDC_OP_TOKEN_ENDPOINT = swap.url
    yield swap
    swap.server.shutdown()
