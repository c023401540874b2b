"""Signing in through the login form, as every browser test starts."""

import re

from tests.factories import PASSWORD


def sign_in(page, base_url: str, username: str = "alice") -> None:
    """Fill the login form on ``page`` and wait for the jobs page it leads to."""
    page.goto(f"{base_url}/accounts/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r"/jobs/$"))
