# make test: install what the tests need (into .venv, .cache, .venv-hermes) and run them all.
PY ?= python3
VENV := .venv

.PHONY: test setup lint pyz bench

test: setup
	HF_HUB_OFFLINE=1 SOLOS_TEST_REQUIRE_ALL=1 $(VENV)/bin/python -m pytest -q

setup:
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -q -r requirements-test.txt
