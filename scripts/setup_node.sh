#!/bin/sh
# Install the Node tooling the MCP tests drive into .cache/node (gitignored):
# Node 22 (the conformance suite needs it; the machine ships Node 20), the
# official conformance suite and the MCP Inspector CLI, at pinned versions.
# Re-runs are a no-op while the stamp matches the pins.
set -e
cd "$(dirname "$0")/.."
PREFIX=.cache/node
PINS="node@22 @modelcontextprotocol/conformance@0.1.16 @modelcontextprotocol/inspector@2.12.0"
STAMP="$PREFIX/.installed"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$PINS" ] && [ -x "$PREFIX/node_modules/.bin/node" ]; then
    exit 0
fi
command -v npm >/dev/null || { echo "setup_node.sh: npm is missing (apt-get install npm)" >&2; exit 1; }
mkdir -p "$PREFIX"
# A package.json of our own keeps npm from walking up into the repository.
[ -f "$PREFIX/package.json" ] || echo '{"private": true}' > "$PREFIX/package.json"
# shellcheck disable=SC2086
npm install --prefix "$PREFIX" --no-audit --no-fund --loglevel=error $PINS
"$PREFIX/node_modules/.bin/node" --version
echo "$PINS" > "$STAMP"
