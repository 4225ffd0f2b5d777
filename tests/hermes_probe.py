"""Connect real Hermes Agent to an MCP server and call its tools, without an LLM.

Run by .venv-hermes/bin/python (never the project's venv: hermes-agent pins its
own mcp and installs top-level modules named `agent`, `tools`, ...):

    .venv-hermes/bin/python tests/hermes_probe.py http://127.0.0.1:PORT/mcp \
        --call recall '{"agent": "sol", "q": "ferry"}' \
        [--headers '{"Authorization": "Bearer ..."}']

It does what a Hermes profile does at startup: writes `mcp_servers:
solos-memory: {url, headers}` into `config.yaml` under a fresh HERMES_HOME
(HOME too, so nothing touches ~; a temporary one unless --home), runs Hermes's own
`discover_mcp_tools()`, then dispatches each `--call` through
`model_tools.handle_function_call`, the function the agent loop uses when the
model picks a tool. It prints one JSON object on stdout:

    {"tools": [registered names], "schemas": {name: schema the model sees},
     "status": [get_mcp_status() rows], "protocol_version": "...",
     "calls": [{"tool", "args", "raw", "parsed"}]}

`raw` is the string the model would see; `parsed` is it decoded (Hermes wraps a
result as {"result": text, "structuredContent": obj}, an isError result as
{"error": text}). Exit status is 0 when the server connected, 2 when it did
not, 3 when the whole run overran --deadline.
"""

import argparse
import json
import os
import sys
import tempfile
import threading
from pathlib import Path

SERVER_NAME = "solos-memory"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Read the URL, headers and calls from argv."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="the MCP endpoint, e.g. http://127.0.0.1:8080/mcp")
    parser.add_argument(
        "--headers", default="{}", help="JSON object of HTTP headers sent on every request (default: {})"
    )
    parser.add_argument(
        "--call",
        nargs=2,
        action="append",
        default=[],
        metavar=("TOOL", "ARGS_JSON"),
        help="server-side tool name and its JSON arguments; repeatable, run in order (default: none)",
    )
    parser.add_argument(
        "--home",
        help="HERMES_HOME to create and keep, e.g. to read its logs/ after a failure (default: a temporary one)",
    )
    parser.add_argument(
        "--timeout", type=float, default=15.0, help="Hermes connect_timeout and per-call timeout, seconds (default: 15)"
    )
    parser.add_argument(
        "--deadline", type=float, default=60.0, help="hard stop for the whole run, seconds (default: 60)"
    )
    return parser.parse_args(argv)


def arm_deadline(seconds: float) -> None:
    """Exit with status 3 if the run overruns, whatever Hermes is waiting on."""

    def expire() -> None:
        print(f"hermes_probe: no result within {seconds:.0f}s", file=sys.stderr, flush=True)
        os._exit(3)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()


def write_profile(home: Path, url: str, headers: dict, timeout: float) -> None:
    """Write the config.yaml a Hermes user would have for this server."""
    import yaml

    server = {"url": url, "connect_timeout": timeout, "timeout": timeout}
    if headers:
        server["headers"] = headers
    # Lazy installs off: a test run installs nothing (Hermes pip-installs optional packages on first use).
    config = {"mcp_servers": {SERVER_NAME: server}, "security": {"allow_lazy_installs": False}}
    (home / "config.yaml").write_text(yaml.safe_dump(config))


def main(argv: list[str] | None = None) -> int:
    """Configure, discover, call, print."""
    args = parse_args(argv)
    arm_deadline(args.deadline)
    headers = json.loads(args.headers)
    calls = [(name, json.loads(arguments)) for name, arguments in args.call]

    scratch = None if args.home else tempfile.TemporaryDirectory(prefix="hermes-probe-")
    home = Path(args.home or scratch.name)
    home.mkdir(parents=True, exist_ok=True)
    # Hermes reads HERMES_HOME on every get_hermes_home() call, and some code
    # paths fall back to ~; set both before its first import.
    os.environ["HERMES_HOME"] = str(home)
    os.environ["HOME"] = str(home)
    os.environ.pop("HERMES_SAFE_MODE", None)
    write_profile(home, args.url, headers, args.timeout)

    # Imported late: these modules read HERMES_HOME at import time.
    from model_tools import handle_function_call
    from tools.mcp_tool import (
        _servers,
        discover_mcp_tools,
        get_mcp_status,
        mcp_prefixed_tool_name,
        shutdown_mcp_servers,
    )
    from tools.registry import registry

    tools = sorted(discover_mcp_tools())
    report: dict = {
        "tools": tools,
        "schemas": {name: registry.get_schema(name) for name in tools},
        "status": get_mcp_status(),
        "calls": [],
    }
    server = _servers.get(SERVER_NAME)
    init = getattr(server, "initialize_result", None)
    report["protocol_version"] = getattr(init, "protocolVersion", None)
    connected = server is not None and server.session is not None
    for name, arguments in calls:
        if not connected:
            break
        raw = handle_function_call(mcp_prefixed_tool_name(SERVER_NAME, name), arguments)
        try:
            parsed = json.loads(raw)
        except (TypeError, ValueError):
            parsed = None
        report["calls"].append({"tool": name, "args": arguments, "raw": raw, "parsed": parsed})

    shutdown_mcp_servers()
    print(json.dumps(report), flush=True)
    if scratch is not None:
        scratch.cleanup()
    return 0 if connected else 2


if __name__ == "__main__":
    sys.exit(main())
