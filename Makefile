# Two commands do all the set-up on a fresh machine:
#   make demo   venv + install + local redis-server and Temporal dev server + the 5,000-task demo
#   make test   venv + install + the whole test suite (what CI runs through .ci/run); installs Debian's
#               redis-server and chromium (for the web UI test) when missing, and the Node package's
#               npm packages (clients/node, npm ci from its lock file, once)
#   make test-fast  the tests not marked slow (each test file marks its own: no dev server, no end-to-end runs)
#   make format the tree formatted and its fixable lint fixed (ruff format, ruff check --fix)
#   make wheel  the distribution's wheel in dist/, built in a venv of setuptools only (.venv-build: the
#               registry once, then offline), not the dev environment
#   make bench  the benchmarks of issue 5 (fresh redis-server and dev server; ARGS=--smoke for a quick run)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
BUILD_VENV ?= .venv-build
BUILD_PY := $(BUILD_VENV)/bin/python

NODE_DEPS := clients/node/node_modules/.package-lock.json

# make test's processes (pytest-xdist): the tests mostly wait on redis-server and Temporal, so more processes than
# cores pay; each starts its own servers and takes a test file whole (docs/development.md, "Tests").
# TEST_WORKERS=0 runs in this process alone.
TEST_WORKERS ?= 4
XDIST = -n $(TEST_WORKERS) --dist loadfile

.PHONY: install node-deps demo test test-fast lint format worker wheel bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

install: $(VENV)/.installed

# the Node package's npm packages (tests/test_node_producer.py); skipped where npm is missing
$(NODE_DEPS): clients/node/package-lock.json
	@if command -v npm >/dev/null 2>&1; then cd clients/node && npm ci --no-audit --no-fund --loglevel=error; \
	else echo "npm not found: tests/test_node_producer.py will be skipped"; fi

node-deps: $(NODE_DEPS)

demo: install
	scripts/ensure-redis-server --unless-configured
	$(PY) -m xmc_resumption demo $(ARGS)

test: install node-deps
	scripts/ensure-redis-server
	scripts/ensure-chromium
	$(PY) -m pytest $(XDIST) $(ARGS)

# the tests not marked slow (no dev server, no end-to-end process runs): a quick check while editing
test-fast: install
	scripts/ensure-redis-server
	$(PY) -m pytest $(XDIST) -m "not slow" $(ARGS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# what make lint checks, made so where a tool can: formatting, import order, the fixable rules
format: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# the wheel's build environment: pyproject.toml's build-system requirements (setuptools) and nothing else
$(BUILD_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(BUILD_VENV)
	$(BUILD_PY) -m pip install --quiet $$($(BUILD_PY) -c "import tomllib; print(' '.join(tomllib.load(open('pyproject.toml', 'rb'))['build-system']['requires']))")
	touch $@

wheel: $(BUILD_VENV)/.installed
	rm -rf build
	$(BUILD_PY) -m pip wheel --quiet --no-deps --no-build-isolation --no-index -w dist .

bench: install
	scripts/ensure-redis-server
	$(PY) -m bench $(ARGS)

worker: install
	$(PY) -m worker

clean:
	rm -rf $(VENV) $(BUILD_VENV) .xmc .pytest_cache .ruff_cache .mypy_cache build dist clients/node/node_modules clients/node/types clients/node/src/script.js
