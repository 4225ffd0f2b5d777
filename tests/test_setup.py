"""The README's Set up, run as a newcomer would: in an empty folder holding only the repository's files.

First the zero-install command on a python3 without site-packages (keyword-only
recall, and a degraded reason that names what is missing and how to install
it), then `make serve` on the same folder: it makes its venv from the package
index, starts catching up on the rows the first run and the fleet wrote, and
then answers with hybrid recall. The pip install makes this the slowest test
(about 20 s here); it is the whole promise of the Set up section.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

import pytest
from conftest import ROOT, call, service, set_up_commands, skip_or_fail, zero_install_command

import solos_embed
import solos_status

pytestmark = pytest.mark.slow  # pip installs the runtime venv, then the service catches up on 300 rows

FLEET_ROWS = 300  # written directly, as the fleet does: the full service must catch up on them by itself
SETUP_TIMEOUT_S = 600  # venv + pip install before the listening line; about 15 s from a nearby index
CATCH_UP_TIMEOUT_S = 120  # 300 short rows at 100-200 rows/s on one core


def repository_copy(target: Path) -> Path:
    """The repository's files as they are in the working tree (tracked, and new ones git does not ignore)."""
    if shutil.which("git") is None:
        skip_or_fail("git is not installed")
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout
    for name in filter(None, listed.decode().split("\0")):
        source = ROOT / name
        if source.is_file() and not source.is_symlink():  # a tracked file deleted in the working tree is gone
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


def bare_python3(folder: Path) -> Path:
    """A bin folder whose `python3` is this interpreter without site-packages: a python3 with nothing installed."""
    folder.mkdir()
    wrapper = folder / "python3"
    wrapper.write_text(f'#!/bin/sh\nexec "{Path(sys.base_prefix) / "bin" / "python3"}" -S "$@"\n')
    wrapper.chmod(0o755)
    return folder


def recall(port: int, q: str, **params: str) -> dict:
    status, body = call(
        port, "GET", f"/v1/recall?agent=sol&q={quote(q)}" + "".join(f"&{k}={v}" for k, v in params.items())
    )
    assert status == 200, body
    return body


def listening_line(lines: list[str]) -> dict:
    return next(json.loads(line) for line in lines if '"event": "listening"' in line)


def test_readme_set_up_in_an_empty_folder_from_zero_install_to_hybrid(tmp_path):
    commands = [set_up_commands()[0], " ".join(zero_install_command())]
    assert commands == ["make serve", "python3 solos_memory.py serve --register atlas,sol"], commands
    if shutil.which("make") is None:
        skip_or_fail("make is not installed")
    clone = repository_copy(tmp_path / "clone")
    assert not (clone / "solos.db").exists() and not (clone / ".venv-runtime").exists()
    pins = " ".join(solos_embed.PACKAGES.values())

    # 1. Zero-install: keyword-only, and the reason says what is missing and how to get it, everywhere alike.
    env = {**os.environ, "PATH": f"{bare_python3(tmp_path / 'bare-bin')}:{os.environ['PATH']}"}
    with service(["sh", "-c", commands[1] + " --port 0"], env=env, cwd=clone) as (port, lines):
        listening = listening_line(lines)
        reason = listening["degraded_reason"]
        assert (listening["embedder_state"], listening["degraded"]) == ("off", True)
        assert "onnxruntime, tokenizers, numpy" in reason and f"pip install {pins}" in reason
        assert "make serve" in reason
        shown = solos_status.without_paths(reason)  # the log line is the operator's; answers name no paths
        assert call(port, "GET", "/health")[1]["degraded_reason"] == shown
        fact = {"agent": "atlas", "topic": "infra", "fact": "The staging database moved to host kestrel."}
        assert call(port, "POST", "/v1/long", fact)[0] == 201
        keyword = recall(port, "staging database")
        assert (keyword["ranking"], keyword["degraded_reason"]) == ("keyword", shown)
    with sqlite3.connect(clone / "solos.db") as conn:  # the fleet's other writers, straight into the table
        conn.executemany(
            "INSERT INTO memory_longterm (agent, topic, fact) VALUES ('sol', 'chatter', ?)",
            [(f"note {n} about the weather and lunch",) for n in range(FLEET_ROWS)],
        )

    # 2. The full path: one command makes the venv and serves; it catches up by itself, then recall is hybrid.
    started = time.monotonic()
    with service(["sh", "-c", commands[0] + " ARGS='--port 0'"], cwd=clone, timeout_s=SETUP_TIMEOUT_S) as (port, lines):
        setup_s = time.monotonic() - started
        listening = listening_line(lines)
        # Under DEGRADED_BACKLOG_ROWS rows wait: catching up, counted, and not degraded.
        assert listening["embedder_state"] == "catching_up" and listening["degraded"] is False, listening
        assert 0 < listening["embed_backlog"] <= FLEET_ROWS + 1 and listening["degraded_reason"] is None
        deadline = time.monotonic() + CATCH_UP_TIMEOUT_S
        while (health := call(port, "GET", "/health")[1])["embedder_state"] != "ready":
            assert health["embedder_state"] == "catching_up" and health["degraded"] is False, health
            assert time.monotonic() < deadline, health
            time.sleep(0.2)
        hybrid = recall(port, "where is the staging database now", ranking="hybrid")
        assert (hybrid["ranking"], hybrid["degraded"], hybrid["degraded_reason"]) == ("hybrid", False, None)
        first = hybrid["results"][0]
        assert (first["agent"], first["foreign"], first["fact"]) == ("atlas", True, fact["fact"])
        stats = call(port, "GET", "/v1/stats")[1]
        assert stats["vectors"] == {"long": FLEET_ROWS + 1} and stats["embed_backlog"] == 0
    assert (clone / ".venv-runtime" / "installed").read_text().strip() == pins
    print(f"make serve: listening after {setup_s:.1f} s (venv and pip install included)")


def test_the_embedder_pins_agree_everywhere():
    """make serve, docs/operations.md's systemd lines, the test venv and the degraded reason install the same
    packages."""
    pins = " ".join(solos_embed.PACKAGES.values())
    assert f"EMBEDDER := {pins}\n" in (ROOT / "Makefile").read_text()
    assert f"pip install {pins}" in (ROOT / "docs" / "operations.md").read_text()
    requirements = (ROOT / "requirements-test.txt").read_text().split()
    assert set(solos_embed.PACKAGES.values()) <= set(requirements)
