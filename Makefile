# make test: install what the tests need (into .venv, .cache/node, .venv-hermes) and run them all.
PY ?= python3
VENV := .venv

.PHONY: test setup lint pyz bench

test: setup
	HF_HUB_OFFLINE=1 SOLOS_TEST_REQUIRE_ALL=1 $(VENV)/bin/python -m pytest -q

setup:
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -q -r requirements-test.txt
	sh scripts/setup_node.sh
	PY=$(PY) sh scripts/setup_hermes.sh

lint:
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy mcp_bridge.py pyz_build.py $(wildcard solos_*.py)

pyz:
	$(PY) pyz_build.py

bench:
	$(PY) bench/cold_start.py
	$(VENV)/bin/python bench/locomo.py --latency-rows 10000
