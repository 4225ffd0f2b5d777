"""Runs the Node tools that scripts/setup_node.sh installs (Node 22, conformance suite, Inspector)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from conftest import skip_or_fail

NODE_BIN = Path(__file__).resolve().parent.parent / ".cache" / "node" / "node_modules" / ".bin"


def run_node_tool(name: str, args: list[str], home: Path, timeout_s: float) -> str:
    """Run a tool with Node 22 first on PATH and return its stdout; a non-zero exit fails with its output.

    Skips (or, under SOLOS_TEST_REQUIRE_ALL=1, fails) when the tool is not installed.
    `home` becomes HOME, so the tools' state files (the Inspector's catalog) land in a temp dir.
    """
    tool = NODE_BIN / name
    if not (tool.exists() and (NODE_BIN / "node").exists()):
        skip_or_fail(f"{name} is not installed under {NODE_BIN}; run scripts/setup_node.sh")
    env = {
        **os.environ,
        "PATH": f"{NODE_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "HOME": str(home),
        "MCP_CATALOG_PATH": str(home / "mcp.json"),
        "NO_COLOR": "1",
    }
    completed = subprocess.run(
        [str(tool), *args],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        stdin=subprocess.DEVNULL,
    )
    assert completed.returncode == 0, f"{name} exited {completed.returncode}\n" + (
        completed.stdout[-8000:] + completed.stderr[-4000:]
    )
    return completed.stdout
