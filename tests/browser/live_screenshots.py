"""Screenshots of a live stack, not of a test: a queue with an ETA, and a checkpointing job that is
preempted with notice, resumes from its checkpoint and shows it in its live output.

    make run ARGS="--port 8765 --node 8xA100-80GB --node 8xA100-80GB"     # in one terminal
    .venv/bin/python tests/browser/live_screenshots.py http://127.0.0.1:8765/ var/screenshots

It needs a fresh stack (bob's and alice's queues empty) and Debian's chromium; about 2 minutes.
"""
import json
import sys
import time
import urllib.request
from pathlib import Path

URL = sys.argv[1].rstrip("/") + "/"
OUT = Path(sys.argv[2])
OUT.mkdir(parents=True, exist_ok=True)

def api(method, path, token=None, data=None):
    headers = {"Content-Type": "application/json", **({"Authorization": f"Token {token}"} if token else {})}
    req = urllib.request.Request(URL + path, method=method, headers=headers,
                                 data=json.dumps(data).encode() if data is not None else None)
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read() or b"null")

def token(user):
    return api("POST", "api/v1/auth/token/", data={"username": user, "password": "colony-demo"})["token"]

def wait(pred, timeout=120, what=""):
    end = time.time() + timeout
    while time.time() < end:
        v = pred()
        if v:
            return v
        time.sleep(1)
    raise SystemExit(f"timed out: {what}")

def snap(name: str, user: str, path: str) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1440, "height": 1100})
        page.goto(URL + "accounts/login/")
        page.fill("input[name=username]", user)
        page.fill("input[name=password]", "colony-demo")
        page.click("button[type=submit]")
        page.goto(URL + path)
        page.wait_for_timeout(4000)
        page.screenshot(path=str(OUT / f"{name}.png"), full_page=True)
        browser.close()
    print("saved", OUT / f"{name}.png")

def spec(name, argv, gpus, **kw):
    return {"name": name, "command": argv, "gpus": gpus, **kw}


bob, alice = token("bob"), token("alice")
CKPT = ("import os,signal,sys,time\n"
        "def notice(*_):\n"
        "    f=os.environ['COLONY_PREEMPT_FILE']; d=float(open(f).read())\n"
        "    print(f'preemption notice: {d-time.time():.0f} s to save; "
        "checkpoint saved at step {step}', flush=True); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, notice)\n"
        "start=int(open('ckpt').read()) if os.path.exists('ckpt') else 0\n"
        "print(f'resuming from step {start}' if start else 'starting from scratch', flush=True)\n"
        "step=start\n"
        "while step < start+400:\n"
        "    step+=1; open('ckpt','w').write(str(step)); "
        "print(f'step {step} loss {1/step:.4f}', flush=True); time.sleep(1)\n")

api("POST", "api/v1/jobs/", bob,
    spec("bert-pretrain", ["python", "-c", "import time; time.sleep(900)"], 8, max_runtime_s=1800))
borrower = api("POST", "api/v1/jobs/", bob, spec("resnet-sweep", ["python", "-c", CKPT], 8, checkpoints=True,
                                                      preempt_grace_s=20, max_runtime_s=3600, opportunistic_only=True))
wait(lambda: api("GET", f"api/v1/jobs/{borrower['id']}/", bob)["state"] == "RUNNING", what="borrower running")
time.sleep(8)
owed = api("POST", "api/v1/jobs/", alice,
           spec("vit-finetune", ["python", "-c", "import time; print('fine-tuning', flush=True); time.sleep(40)"], 8,
                max_runtime_s=120))
wait(lambda: api("GET", f"api/v1/jobs/{borrower['id']}/", bob)["state"] == "PENDING", what="borrower preempted")
later = api("POST", "api/v1/jobs/", alice,
            spec("vit-eval", ["python", "-c", "import time; time.sleep(30)"], 8, max_runtime_s=300))
time.sleep(5)
print(json.dumps({"borrower": borrower["id"], "owed": owed["id"]}))
snap("queue", "bob", "jobs/")
snap("job-preempted-pending", "bob", f"jobs/{borrower['id']}/")
wait(lambda: api("GET", f"api/v1/jobs/{borrower['id']}/", bob)["state"] == "RUNNING", timeout=200,
     what="borrower resumed")
time.sleep(10)
snap("job-resumed-live", "bob", f"jobs/{borrower['id']}/")
