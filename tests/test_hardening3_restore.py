"""Hardening, round three (issue 31): restore's ids and cursors (10), a purge's failure recorded under a held
lock (14), /health without paths (17), REST integers and a body-less PUT (18)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import raw_exchange, statuses_in

import solos_bounds

# ---- item 18: REST integers as long as MCP's; a method the path does not take is 405 with or without a body ----


def test_rest_takes_every_integer_mcp_takes(server):
    largest = str(solos_bounds.MAX_ID)
    rest = server.get("/v1/events", agent="sol", since=largest)
    mcp = server.mcp_tool("read_events", {"agent": "sol", "since": solos_bounds.MAX_ID})
    assert rest.status == 200, rest.body
    assert mcp.status == 200 and not mcp.body["result"]["isError"], mcp.body
    assert rest.body["next_since"] == mcp.body["result"]["structuredContent"]["next_since"] == solos_bounds.MAX_ID


@pytest.mark.parametrize(
    ("since", "named"),
    [
        (str(solos_bounds.MAX_ID + 1), "at most"),  # one past: the range check names it, as MCP's does
        ("9" * 40, "at most"),
        ("١٢", "integer"),  # Arabic-Indic digits: int() reads them, the schema's integer is ASCII
        ("12x", "integer"),
    ],
)
def test_rest_integers_out_of_range_or_malformed_are_a_400_naming_the_field(server, since, named):
    reply = server.get("/v1/events", agent="sol", since=since)
    assert reply.status == 400, reply.body
    assert reply.body["error"]["field"] == "since" and named in reply.body["error"]["message"]


def bare(server, method: str, path: str) -> tuple[int, dict, dict]:
    """A request without a body or a Content-Length (curl -X PUT URL): status, headers, JSON body."""
    raw = raw_exchange(server.port, f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n\r\n".encode())
    head, _, body = raw.partition(b"\r\n\r\n")
    fields = dict(line.split(": ", 1) for line in head.decode().split("\r\n")[1:])
    return statuses_in(raw)[0], {k.lower(): v for k, v in fields.items()}, json.loads(body)


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [("PUT", "/v1/recall", "GET"), ("POST", "/v1/recall", "GET"), ("PUT", "/v1/long", "POST")],
)
def test_a_method_the_path_does_not_take_is_405_without_a_body_too(server, method, path, allowed):
    status, headers, body = bare(server, method, path)
    with_body = server.request(method, path, body={})
    assert (status, with_body.status) == (405, 405), body
    assert allowed in headers["allow"] and body["error"]["code"] == with_body.body["error"]["code"]


@pytest.mark.parametrize(("method", "path"), [("PUT", "/v1/sharing"), ("POST", "/v1/long"), ("POST", "/mcp")])
def test_a_method_the_path_takes_still_needs_its_body(server, method, path):
    status, _, body = bare(server, method, path)
    assert status == 411 and body["error"]["field"] == "Content-Length"


# ---- item 17: /health (no token) names no machine path; the operator's view of stats keeps them ----


@pytest.fixture
def embedder_missing(make_server, monkeypatch, tmp_path):
    """A service whose embedder lacks its packages and model: the reason names the interpreter and the folder."""
    for module in ("onnxruntime", "tokenizers"):
        monkeypatch.setitem(sys.modules, module, None)
    monkeypatch.setattr(sys, "prefix", sys.base_prefix + "-venv")  # a venv: the install command names sys.executable
    return make_server("nothing.db", model_dir=str(tmp_path / "no-model"))


def test_health_names_no_path_the_operators_stats_do(embedder_missing, tmp_path):
    server = embedder_missing
    interpreter = str(Path(sys.executable).parent)
    operator = server.get("/v1/stats").body  # loopback trust, no agent named: the operator view
    assert operator["view"] == "operator" and interpreter in operator["degraded_reason"]
    assert str(tmp_path) in operator["degraded_reason"]
    health = server.get("/health").body
    assert health["degraded"] is True and "not installed for …/python" in health["degraded_reason"]
    agent_view = server.get("/v1/stats", agent="sol").body
    server.post("/v1/long", {"agent": "atlas", "fact": "keyword rows still come back"})
    recall = server.recall("sol", "keyword").body
    for reason in (health["degraded_reason"], agent_view["degraded_reason"], recall["degraded_reason"]):
        assert interpreter not in reason and str(tmp_path) not in reason, reason
        assert "onnxruntime, tokenizers" in reason and "pip install" in reason  # the advice stays
