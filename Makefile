# Two commands do all the set-up on a fresh machine:
#   make demo   venv + install + local redis-server and Temporal dev server + the 5,000-task demo
#   make test   venv + install + the whole test suite (what CI runs through .ci/run); installs Debian's
#               redis-server and chromium (for the web UI test) when missing
#   make wheel  the distribution's wheel in dist/ (offline: the venv's setuptools, no dependency)
#   make bench  the benchmarks of issue 5 (fresh redis-server and dev server; ARGS=--smoke for a quick run)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: install demo test lint worker wheel bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

install: $(VENV)/.installed

demo: install
	scripts/ensure-redis-server --unless-configured
	$(PY) -m xmc_resumption demo $(ARGS)

test: install
	scripts/ensure-redis-server
	scripts/ensure-chromium
	$(PY) -m pytest $(ARGS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

wheel: install
	rm -rf build
	$(PY) -m pip wheel --quiet --no-deps --no-build-isolation --no-index -w dist .

bench: install
	scripts/ensure-redis-server
	$(PY) -m bench $(ARGS)

worker: install
	$(PY) -m worker

clean:
	rm -rf $(VENV) .xmc .pytest_cache .ruff_cache .mypy_cache build dist
