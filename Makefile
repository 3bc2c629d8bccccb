# fastrecover developer entry points (GNU make + bash).
#
#   make venv     .venv with the library and the tools (tools/, fastrecover-tools), both editable, and the dev, postgres, spark extras
#   make test     real PostgreSQL (scripts/ensure-postgres.sh) + real Kafka, then pytest $(PYTEST_ARGS)
#   make check    the fast tier: every test that needs no broker, no PostgreSQL server and no Spark, in under
#                 3 minutes (pytest -m "not integration" $(PYTEST_ARGS); SQLite files and subprocesses included).
#                 tests/conftest.py marks each test broker/postgres/spark, and then integration, from the fixtures
#                 it uses; `make test` runs both tiers
#   make demo     fastrecover demo $(DEMO_ARGS)
#   make bench    fastrecover bench $(BENCH_ARGS)
#   make broker   a Kafka broker for manual work (Ctrl-C stops it)
#   make lint     ruff check, ruff format --check, mypy (strict on fastrecover and the tools; tests checked too), the docs site built --strict
#   make docs     the documentation site into site/ (--strict); `.venv/bin/mkdocs serve` previews it
#   make clean    caches and build output; `make distclean` also removes .venv
#
# The install step reruns only when pyproject.toml, tools/pyproject.toml or the C extension (hatch_build.py,
# fastrecover/_fastpoll.c, built in place by the editable install) is newer than .venv/.installed;
# pip's default cache keeps reinstalls fast.

SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
EXTRAS ?= dev,postgres,spark

PYTEST_ARGS ?=
DEMO_ARGS ?=
BENCH_ARGS ?=
BROKER_ARGS ?=

.PHONY: help venv test check demo bench broker lint docs clean distclean

help:
	@sed -n 's/^#   //p' $(firstword $(MAKEFILE_LIST))

venv: $(STAMP)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip

# Order-only: the venv must exist, but a newer interpreter alone does not trigger a reinstall.
$(STAMP): pyproject.toml tools/pyproject.toml hatch_build.py fastrecover/_fastpoll.c | $(BIN)/python
	$(BIN)/python -m pip install -e '.[$(EXTRAS)]' -e ./tools
	touch $@

# The assignment (not a bare `eval "$(...)"`) makes a failing ensure-postgres.sh fail the target.
test: venv
	pg_env="$$(bash scripts/ensure-postgres.sh)"; \
	eval "$$pg_env"; \
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# No ensure-postgres.sh and no broker: the fast tier must not need them (tests/conftest.py fails a test that
# sets up one, and refuses to start their processes).
check: venv
	$(BIN)/python -m pytest -m "not integration" $(PYTEST_ARGS)

demo: venv
	$(BIN)/fastrecover demo $(DEMO_ARGS)

bench: venv
	$(BIN)/fastrecover bench $(BENCH_ARGS)

broker: venv
	$(BIN)/python -m fastrecover_tools.testing.broker $(BROKER_ARGS)

lint: venv
	$(BIN)/ruff check fastrecover tools tests
	$(BIN)/ruff format --check fastrecover tools tests
	$(BIN)/mypy
	$(MAKE) --no-print-directory docs

# --strict: a broken link, a page missing from the nav or an unknown reference marker fails the build.
# The reference tables come from the code (tools/docs_hooks.py); tests/unit/test_docs_reference.py checks them.
docs: venv
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir site

clean:
	rm -rf build dist site .pytest_cache .mypy_cache .ruff_cache .hypothesis
	rm -f fastrecover/_fastpoll*.so fastrecover/_fastpoll*.pyd $(STAMP)  # the in-place extension: the next make rebuilds it
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +
	find . -path ./$(VENV) -prune -o -name '*.egg-info' -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
