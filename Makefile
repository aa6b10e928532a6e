# crawlerd: `make run` (build, install, crawl the bundled synthetic web) and `make test`.
# Each target bootstraps its own virtualenv; all are idempotent.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml setup.py crawlerd/_native/*.pyx crawlerd/_native/*.pxd crawlerd/_native/*.h 2>/dev/null | cksum | cut -d' ' -f1)
SECONDS_RUN ?= 60
# headless browser for the crawl report test (Debian package; never a downloaded build)
CHROMIUM := /usr/bin/chromium
# pywb (replay tests) lives in a venv of its own: it pins werkzeug/redis, installs a top-level
# `tests` package and brotlipy, whose `brotli` module replaces the one crawlerd decodes with.
PYWB_VENV := .venv-pywb
PYWB_STAMP := $(PYWB_VENV)/.installed-pywb-2

.PHONY: run test test-long bench lint install clean config-check pywb chromium

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(STAMP): $(VENV)/bin/python
	rm -f $(VENV)/.installed-*
	$(PIP) install -q -e '.[test]'
	touch $@

install: $(STAMP)

# idempotent: skipped when the binary is there
$(CHROMIUM):
	apt-get update && apt-get install -y chromium

chromium: $(CHROMIUM)

$(PYWB_STAMP):
	rm -rf $(PYWB_VENV)
	$(PYTHON) -m venv $(PYWB_VENV)
	$(PYWB_VENV)/bin/python -m pip install -q --upgrade pip
	$(PYWB_VENV)/bin/python -m pip install -q 'pywb>=2.9,<3'
	touch $@

pywb: $(PYWB_STAMP)

run: $(STAMP)
	$(VENV)/bin/crawlerd demo --seconds $(SECONDS_RUN)

lint: $(STAMP)
	$(VENV)/bin/ruff check crawlerd tests bench

config-check: $(STAMP)
	$(VENV)/bin/crawlerd config check --config config.toml

test: $(STAMP) $(PYWB_STAMP) $(CHROMIUM)
	$(VENV)/bin/ruff check crawlerd tests bench
	$(VENV)/bin/pytest -q tests

test-long: $(STAMP)
	$(VENV)/bin/pytest -q -m long tests
	CRAWLERD_FUZZ=long $(VENV)/bin/pytest -q tests/fuzz

bench: $(STAMP)
	$(PIP) install -q -e '.[test,bench]'
	$(PY) bench/run_all.py

clean:
	rm -rf build $(VENV) $(PYWB_VENV) *.egg-info crawlerd/_native/*.so crawlerd/_native/*.c
