"""``static/js/colony.js`` prints sizes, durations, cores and GPU requests exactly as
``agents/units.py`` does: the page's script rewrites what the server rendered every few seconds,
so a difference would flicker. Both run the same table (``cases.json``).

The script runs in Node when it is installed, else in the headless Chromium the browser tests use.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "static" / "js" / "colony.js"
CASES = json.loads((Path(__file__).with_name("cases.json")).read_text())
JS_NAME = {"duration": "duration", "bytes": "bytes", "mib": "mib", "cores": "cores", "share": "share",
           "gpu_request": "gpuRequest"}
# Every case through window.Colony; answers {kind: [printed, ...]}.
RUN_CASES = """
var out = {};
Object.keys(JS_NAME).forEach(function (kind) {
  out[kind] = CASES[kind].map(function (c) { return window.Colony[JS_NAME[kind]](c[0]); });
});
"""


def _in_node(node: str) -> dict:
    program = (f"var window = {{}};\n{SCRIPT.read_text()}\nvar CASES = {json.dumps(CASES)};\n"
               f"var JS_NAME = {json.dumps(JS_NAME)};\n{RUN_CASES}\nprocess.stdout.write(JSON.stringify(out));\n")
    done = subprocess.run([node, "-"], input=program, capture_output=True, text=True, timeout=60, check=True)
    return json.loads(done.stdout)


def _in_chromium() -> dict:
    from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS

    if not Path(CHROMIUM).exists() and not shutil.which(CHROMIUM):
        pytest.skip(f"neither node nor Chromium ({CHROMIUM}) to run the script in")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page()
            page.add_script_tag(content=SCRIPT.read_text())
            return page.evaluate(f"() => {{ var CASES = {json.dumps(CASES)}; var JS_NAME = {json.dumps(JS_NAME)};"
                                 f"{RUN_CASES} return out; }}")
        finally:
            browser.close()


@pytest.fixture(scope="module")
def printed_by_js() -> dict:
    node = shutil.which(os.environ.get("COLONY_TEST_NODE", "node"))
    return _in_node(node) if node else _in_chromium()


@pytest.mark.parametrize("kind", sorted(JS_NAME))
def test_the_page_script_prints_what_the_server_prints(kind, printed_by_js):
    expected = [case[1] for case in CASES[kind]]
    assert printed_by_js[kind] == expected
