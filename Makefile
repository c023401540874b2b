# The two commands a newcomer needs:
#   make run    bring Colony up on embedded defaults (SQLite, private Redis, simulated nodes)
#   make test   install everything and run the whole test suite
# Both create .venv and install the pinned requirements (requirements.lock) on first use.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test lock clean

$(STAMP): requirements.lock pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.lock
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	@touch $@

run: $(STAMP)
	$(BIN)/python -m cluster_ui.devstack $(ARGS)

# Browser tests drive Debian's Chromium through Playwright (which must never download a browser).
CHROMIUM ?= /usr/bin/chromium
$(CHROMIUM):
	@echo "Installing Debian's chromium for the browser tests..."
	@(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
		|| echo "!! could not install chromium: browser tests will be skipped"

# `ruff check` runs first ([tool.ruff] in pyproject.toml); no test starts while it finds a problem.
# Uses PostgreSQL when one answers on 127.0.0.1:5432 (as CI does), SQLite otherwise; the tests
# start their own private Redis either way. Two passes: the unit and integration tests on three
# xdist workers, then the end-to-end tests (real worker, agent, Redis and web processes) on two,
# whole files each (E2E_XDIST= runs them one at a time): their heartbeats and timeouts are tight,
# and a CPU-bound test beside them once stretched an agent restart past a node's heartbeat, so they
# never share the machine with the first pass. Two of them side by side mostly wait (together
# about one core): 24 of 24 passed in each of four runs beside a helper's two valgrind processes
# (load average 3.5-6.8), in 162-180 s against 228 s one at a time under the same load (XDIST=
# runs the first pass in one process). Three workers on two cores, because the first pass waits on subprocesses (agents,
# supervisors, timers) much of its time: on two workers the CPUs were idle nearly half of it
# (122 s on two workers, 115 s on three, back to back on a quiet machine). The first pass hands
# each worker whole test files (a file's tests share what they cache, e.g. the trace replays),
# those with a test marked `slow` first, so that no worker is left alone with a long one at the end.
# Exit status 5 is pytest's "nothing selected", e.g. a -k that matches only one pass.
# Bytecode is cached (__pycache__, git-ignored) even where the environment sets
# PYTHONDONTWRITEBYTECODE (our Dockerfile does, and so may a CI image): else every pytest process,
# and every worker, agent and supervisor the tests start, compiles the project from source again
# (pytest's collection alone: 12 s of CPU instead of 6, three times a run).
XDIST ?= -n 3 --dist loadfile --no-loadscope-reorder
E2E_XDIST ?= -n 2 --dist loadfile
test: $(STAMP) | $(CHROMIUM)
	@$(BIN)/ruff check . || exit 1; \
	unset PYTHONDONTWRITEBYTECODE; [ -n "$$DATABASE_URL" ] || unset DATABASE_URL; \
	if [ -z "$$DATABASE_URL" ] && $(BIN)/python -c "import socket; socket.create_connection(('127.0.0.1', 5432), 1)" 2>/dev/null; then \
		export DATABASE_URL=postgres://postgres@127.0.0.1:5432/colony; echo "Testing on PostgreSQL (127.0.0.1:5432)"; \
	else echo "Testing on $${DATABASE_URL:-SQLite}"; fi; \
	$(BIN)/python -m pytest $(XDIST) -m "not e2e" $(PYTEST_ARGS); first=$$?; \
	$(BIN)/python -m pytest $(E2E_XDIST) -m e2e $(PYTEST_ARGS); second=$$?; \
	for code in $$first $$second; do [ $$code -eq 0 ] || [ $$code -eq 5 ] || exit $$code; done

# Re-pin after changing dependencies in pyproject.toml. Two locks at the same versions:
# requirements.lock, everything with the test and docs tools (what `make test`/`make run` and CI install), and
# requirements/runtime.lock, the runtime dependencies alone with every file's hash (what the image
# installs: the Dockerfile). tests/deploy/test_runtime_lock.py holds them to each other.
PIP_TOOLS ?= pip-tools==7.4.1
lock:
	rm -rf .venv-lock .venv-lock-tools && $(PYTHON) -m venv .venv-lock && $(PYTHON) -m venv .venv-lock-tools
	.venv-lock/bin/pip install --quiet --disable-pip-version-check -e '.[test,docs]'
	.venv-lock/bin/pip freeze --all --exclude-editable | grep -v '^pip==' > requirements.lock
	.venv-lock-tools/bin/pip install --quiet --disable-pip-version-check '$(PIP_TOOLS)'
	rm -f requirements/runtime.lock
	CUSTOM_COMPILE_COMMAND='make lock' .venv-lock-tools/bin/pip-compile --quiet --generate-hashes --allow-unsafe \
		--strip-extras --no-emit-index-url --constraint requirements.lock --output-file requirements/runtime.lock \
		pyproject.toml
	rm -rf .venv-lock .venv-lock-tools

clean:
	rm -rf $(VENV) var staticfiles
