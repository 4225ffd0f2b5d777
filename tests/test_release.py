"""The release is one version: solos_store.__version__, shown by every surface an operator or a client reads,
repeated by the standalone client, and the newest release of CHANGELOG.md."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from conftest import ROOT

import solos_client
import solos_store

VERSION = solos_store.__version__
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25"}


def test_the_version_is_a_release_number_and_the_newest_in_the_changelog():
    assert re.fullmatch(r"\d+\.\d+\.\d+", VERSION)
    releases = re.findall(r"^## (\d+\.\d+\.\d+) \((\d{4}-\d{2}-\d{2})\)$", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert releases and releases[0][0] == VERSION, releases[:2]


def test_the_standalone_client_repeats_the_services_version():
    """solos_client.py is copied alone (Hermes plugin, agents), so it carries the number itself: the same one."""
    assert solos_client.__version__ == VERSION


def test_the_service_modules_take_the_version_from_the_store_and_define_it_nowhere_else():
    defining = [
        path.name
        for path in sorted(ROOT.glob("*.py"))
        if re.search(r"^__version__ = [\"']", path.read_text(), re.M) and path.name != "solos_client.py"
    ]
    assert defining == ["solos_store.py"]


@pytest.mark.parametrize("command", [["solos_memory.py"], ["solos_memory.py", "client"], ["solos_client.py"]])
def test_version_flags(command):
    run = subprocess.run(
        [sys.executable, *command, "--version"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
    )
    assert run.stdout.split() == [("solos_client" if "client" in command[-1] else "solos-memory"), VERSION]


def test_every_http_surface_shows_the_version(server):
    health = server.get("/health")
    assert health.body["version"] == VERSION
    assert health.headers["server"] == f"solos-memory/{VERSION}"
    assert server.get("/v1/stats").body["version"] == VERSION
    assert server.get("/openapi.json").body["info"]["version"] == VERSION
    page = server.get("/").raw.decode()
    footer = re.search(r'id="footer">(.*?)</p>', page, re.S)
    assert footer and f"Version {VERSION}," in footer[1]
    rpc = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }
    reply = server.request("POST", "/mcp", body=rpc, headers=MCP_HEADERS)
    assert reply.body["result"]["serverInfo"]["version"] == VERSION


def test_the_hermes_plugin_declares_the_version(tmp_path):
    target = solos_client.install_hermes(str(tmp_path), create=True)
    assert f'version: "{VERSION}"' in (target / "plugin.yaml").read_text()


# schema_pg.sql's sha256 at each revision (solos_store_pg.SCHEMA_PG_REVISION): a change to the file raises the
# revision, so a copy of an earlier release never applies its older functions over it (tests/test_copies.py).
SCHEMA_PG_SHA256 = {
    1: "d7cfe65c2ea77e18c602dab96c06229e7cc5c97b19119d3a2e920280bebc4fe3",
    2: "db5cc3316cd9a55388a3564d7cea55d174c344bf6b42236a68b6c4b489dffff7",
    3: "e4db76786978806584770855337810d2e33478284194b2b97aef6e93869d0159",
    4: "16a40c2ebd3d457beff1694c760dda535ffe1e97a562899ba8693fb61cef8029",
}


def test_a_change_to_schema_pg_raises_its_revision():
    solos_store_pg = pytest.importorskip("solos_store_pg")
    revision, digest = (
        solos_store_pg.SCHEMA_PG_REVISION,
        solos_store_pg.schema_digest((ROOT / "schema_pg.sql").read_text(encoding="utf-8")),
    )
    assert max(SCHEMA_PG_SHA256) == revision, "pin schema_pg.sql's sha256 at the new revision here"
    assert SCHEMA_PG_SHA256[revision] == digest, (
        f"schema_pg.sql changed (sha256 {digest}): raise solos_store_pg.SCHEMA_PG_REVISION and pin it here"
    )
