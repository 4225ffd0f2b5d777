#!/bin/sh
# Install Hermes Agent into its own venv for tests/test_hermes.py.
#
# hermes-agent pins its own mcp (1.26) and installs generic top-level modules
# (agent, tools, ...), so it must never share a venv with the project: the test
# runs it as a subprocess with .venv-hermes/bin/python. Idempotent: a second
# run only checks the installed version and returns.
set -eu
cd "$(dirname "$0")/.."

HERMES_VERSION=0.19.0
PY=${PY:-python3}
VENV=.venv-hermes

installed() {
    [ -x "$VENV/bin/python" ] || return 1
    "$VENV/bin/python" - "$HERMES_VERSION" <<'PYEOF' 2>/dev/null
import sys
from importlib.metadata import version
sys.exit(0 if version("hermes-agent") == sys.argv[1] else 1)
PYEOF
}

if installed; then
    exit 0
fi

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check "hermes-agent[mcp]==$HERMES_VERSION"
installed || { echo "setup_hermes: hermes-agent $HERMES_VERSION did not install" >&2; exit 1; }
