"""``make run`` serves notebooks on its embedded defaults: the devstack starts the notebook proxy and
names it in its banner, and a notebook job submitted through the API (run as its researcher's
account when the stack runs as root) is reached from the dashboard: signed in, the job page's
Open notebook link leads through the proxy to the job's server; without signing in, nothing does.

The server here is a stand-in on the jobs' own ``python3`` that takes Jupyter's flags and answers
only to its token: a stack run as root runs jobs as accounts that may not reach this virtualenv's
interpreter (and so its jupyter). JupyterLab itself, through the same path, is
tests/browser/test_notebook_browser.py's."""

from __future__ import annotations

import http.cookiejar
import re
import urllib.error
import urllib.parse
import urllib.request

import pytest

from tests.e2e.conftest import devstack, wait_for

pytestmark = pytest.mark.e2e

SERVER = """
import http.server, os, sys
flags = dict(arg[2:].split("=", 1) for arg in sys.argv[1:] if arg.startswith("--") and "=" in arg)

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        ok = self.headers.get("Authorization") == "token " + os.environ["JUPYTER_TOKEN"]
        body = ("Stand-in lab at " + self.path if ok else "token required").encode()
        self.send_response(200 if ok else 403)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

http.server.HTTPServer(("127.0.0.1", int(flags["ServerApp.port"])), Handler).serve_forever()
"""


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def sign_in(url: str, username: str) -> http.cookiejar.CookieJar:
    jar = http.cookiejar.CookieJar()
    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    form = browser.open(f"{url}/accounts/login/", timeout=10).read().decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form).group(1)
    data = urllib.parse.urlencode({"username": username, "password": "colony-demo",
                                   "csrfmiddlewaretoken": token}).encode()
    browser.open(urllib.request.Request(f"{url}/accounts/login/", data=data, headers={"Referer": f"{url}/"}),
                 timeout=10)
    return jar


def test_make_run_serves_a_notebook_through_its_proxy(devstack_dir):
    with devstack(devstack_dir, nodes=("2xT4-16GB",)) as stack:
        port = int(re.search(r"Notebooks: http://127\.0\.0\.1:(\d+)/notebooks/<job>/", stack.output()).group(1))
        token = stack.token("alice")
        job = stack.api("POST", "jobs/", token, {"command": ["python3", "-c", SERVER], "gpus": 1, "notebook": True})
        job = wait_for(lambda: (lambda now: now if now["state"] not in ("PENDING", "PLACED") else None)(
            stack.api("GET", f"jobs/{job['id']}/", token)), timeout=60, interval=0.5, what="the notebook to start")
        assert job["state"] == "RUNNING", job

        jar = sign_in(stack.url, "alice")
        dashboard = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar), NoRedirect)
        try:
            dashboard.open(f"{stack.url}/jobs/{job['id']}/notebook/", timeout=10)
            raise AssertionError("Open notebook did not redirect")
        except urllib.error.HTTPError as answer:
            assert answer.code == 302
            where = answer.headers["Location"]
        assert where.startswith(f"http://127.0.0.1:{port}/notebooks/{job['id']}/?colony_ticket=")

        browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))

        def lab_page():  # 503 (and a retry) while the server starts
            try:
                with browser.open(where.replace("/?", "/lab?"), timeout=30) as page:
                    return page.read().decode()
            except urllib.error.HTTPError as exc:
                if exc.code != 503:
                    raise
                return None

        page = wait_for(lab_page, timeout=60, interval=1, what="the notebook server through the proxy")
        assert page == f"Stand-in lab at /notebooks/{job['id']}/lab"

        stranger = urllib.request.build_opener()
        with pytest.raises(urllib.error.HTTPError) as refused:
            stranger.open(f"http://127.0.0.1:{port}/notebooks/{job['id']}/lab", timeout=10)
        assert refused.value.code == 403
        stack.api("POST", f"jobs/{job['id']}/cancel/", token)
