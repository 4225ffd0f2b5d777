"""Regression tests for what an attacker and a bad day found (issue 9), one section per finding.

The fault-injection parts (a read-only spell, a full disk, a slow-body flood) live in test_faults.py.
"""

from __future__ import annotations

import json
import os
import sqlite3

import pytest
from conftest import raw_exchange, statuses_in

import solos_memory
import solos_telemetry

# ---- 1. DNS rebinding: the Host/Origin rule on every route ----

EVERY_ROUTE = [
    ("GET", "/health", None),
    ("GET", "/metrics", None),
    ("GET", "/openapi.json", None),
    ("GET", "/", None),
    ("GET", "/v1/recall?agent=sol&q=x", None),
    ("GET", "/v1/stats", None),
    ("GET", "/v1/audit?agent=atlas", None),
    ("POST", "/v1/long", {"agent": "atlas", "fact": "rebound write"}),
    ("POST", "/v1/short", {"agent": "atlas", "key": "k", "value": "rebound"}),
    ("POST", "/v1/episodic", {"agent": "atlas", "event_type": "t", "summary": "rebound"}),
    ("PUT", "/v1/sharing", {"agent": "atlas", "episodic": True}),
    ("DELETE", "/v1/short?agent=atlas&key=keep", None),
    ("POST", "/mcp", {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
]


@pytest.mark.parametrize("method,path,body", EVERY_ROUTE)
@pytest.mark.parametrize("foreign", ["host", "origin"])
def test_a_rebound_name_or_a_foreign_origin_is_403_on_every_route_and_changes_nothing(
    server, method, path, body, foreign
):
    server.post("/v1/short", {"agent": "atlas", "key": "keep", "value": "kept"})
    headers = {"Host": f"evil.example:{server.port}", "Origin": "http://evil.example"}
    if foreign == "origin":
        headers["Host"] = f"127.0.0.1:{server.port}"
    reply = server.request(method, path, body=body, headers=headers)
    assert reply.status == 403, (method, path, reply.status, reply.raw[:200])
    message = json.dumps(reply.body)
    assert ("Host" if foreign == "host" else "Origin") in message and "evil.example" in message
    with server.db() as conn:
        assert conn.execute("SELECT count(*) FROM memory_longterm").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM memory_episodic").fetchone()[0] == 0
        assert conn.execute("SELECT value FROM memory_short WHERE key = 'keep'").fetchone()[0] == "kept"
        assert conn.execute("SELECT count(*) FROM episodic_sharing").fetchone()[0] == 0


def test_the_issue_reproduction_now_answers_403_with_the_rule_named(server):
    reply = server.request(
        "POST",
        "/v1/long",
        body={"agent": "atlas", "fact": "x"},
        headers={"Host": f"evil.example:{server.port}", "Origin": "http://evil.example"},
    )
    assert reply.status == 403 and reply.body["error"]["field"] == "Host"
    assert "DNS rebinding" in reply.body["error"]["message"]


def test_loopback_names_and_an_allowed_origin_with_its_host_pass(make_server):
    server = make_server(allowed_origins=("http://fleet.example:9999",))
    for host in (f"127.0.0.1:{server.port}", f"localhost:{server.port}", "fleet.example:9999"):
        assert server.request("GET", "/health", headers={"Host": host}).status == 200, host
    page = {"Host": "fleet.example:9999", "Origin": "http://fleet.example:9999"}
    assert server.post("/v1/long", {"agent": "atlas", "fact": "from the trusted page"}, headers=page).status == 201
    assert server.request("GET", "/health", headers={"Host": "fleet.example:1234"}).status == 403


# ---- 4. lone surrogates: refused at validation on both transports; stored junk never 500s anyone ----

SURROGATE_WRITES = [
    ("write_long", {"agent": "atlas", "fact": "bad \ud800 text"}, "fact"),
    ("write_long", {"agent": "atlas", "fact": "fine", "tags": ["ok", "\udfff"]}, "tags"),
    ("write_short", {"agent": "atlas", "key": "k\ud800", "value": "v"}, "key"),
    ("write_episodic", {"agent": "atlas", "event_type": "t", "summary": "s", "details": "\ud83d"}, "details"),
    ("recall", {"agent": "atlas", "q": "\ud800"}, "q"),
]


@pytest.mark.parametrize("tool,args,field", SURROGATE_WRITES)
def test_a_lone_surrogate_is_400_naming_the_field_on_rest_and_mcp(server, tool, args, field):
    op = solos_memory.OPERATIONS[tool]
    raw = json.dumps(args).encode()  # ensure_ascii: the surrogate travels as a valid \ud800 escape
    if op.method == "GET":  # a query string is UTF-8 percent-encoding: the nearest REST form is %ED%A0%80
        rest = server.request("GET", f"{op.path}?agent=atlas&q=%ED%A0%80")
    else:
        rest = server.request(op.method, op.path, raw=raw, headers={"Content-Type": "application/json"})
    assert rest.status == 400 and rest.body["error"]["field"] == ("query" if op.method == "GET" else field)
    reply = server.mcp_tool(tool, args)
    result = reply.body["result"]
    assert reply.status == 200 and result["isError"] is True, reply.raw
    assert result["structuredContent"]["error"]["field"] == field
    with server.db() as conn:
        for table in ("memory_longterm", "memory_short", "memory_episodic"):
            assert conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 0


def test_rows_other_writers_stored_with_bad_text_never_fail_a_recall(server):
    """Invalid UTF-8 bytes and an escaped lone surrogate in tags, written straight into the database."""
    with server.db() as conn:
        conn.execute(
            "INSERT INTO memory_longterm (agent, topic, fact, tags, created_at, updated_at) "
            "VALUES ('atlas', 't', CAST(X'6d61726b657220ff20627974657320e2' AS TEXT), '[\"\\ud800\"]', "
            "strftime('%Y-%m-%dT%H:%M:%fZ'), strftime('%Y-%m-%dT%H:%M:%fZ'))"
        )
        conn.execute(
            "INSERT INTO memory_longterm (agent, topic, fact, tags, created_at, updated_at) "
            "VALUES ('atlas', 't', 'marker clean fact', '[\"\\ud800\"]', "
            "strftime('%Y-%m-%dT%H:%M:%fZ'), strftime('%Y-%m-%dT%H:%M:%fZ'))"
        )
    for caller in ("sol", "atlas", "nova"):
        rest = server.recall(caller, "marker")
        assert rest.status == 200 and rest.body["count"] == 2, rest.raw[:300]
        assert any("\ufffd" in row["text"] for row in rest.body["results"])
        mcp = server.mcp_tool("recall", {"agent": caller, "q": "marker"})
        assert mcp.status == 200 and mcp.body["result"]["isError"] is False, mcp.raw[:300]
        assert mcp.body["result"]["structuredContent"]["count"] == 2


# ---- 5. a collapsed foreign episodic duplicate is an audited read ----


@pytest.mark.parametrize("transport", ["rest", "mcp"])
def test_a_foreign_episode_revealed_only_as_a_duplicate_is_audited(server, transport):
    assert server.request("PUT", "/v1/sharing", body={"agent": "atlas", "episodic": True}).status == 201
    text = "deployed the canary to the west fleet"
    atlas_row = server.post("/v1/episodic", {"agent": "atlas", "event_type": "deploy", "summary": text}).body["id"]
    server.post("/v1/episodic", {"agent": "sol", "event_type": "deploy", "summary": text})
    # Naming sol in the question ranks sol's copy first; atlas's row then shows only as also_written_by.
    query = {"agent": "sol", "q": "sol canary west fleet", "tiers": "episodic"}
    if transport == "rest":
        body = server.get("/v1/recall", **query).body
    else:
        body = server.mcp_tool("recall", {**query, "tiers": ["episodic"]}).body["result"]["structuredContent"]
    assert body["count"] == 1 and body["suppressed_duplicates"] == 1
    shown = body["results"][0]
    assert shown["agent"] == "sol" and shown["also_written_by"] == ["atlas"]
    reads = server.get("/v1/audit", agent="atlas").body["reads"]
    assert [(r["reader"], r["row_id"]) for r in reads] == [("sol", atlas_row)]


# ---- 6. /metrics: bounded label sets, escaped values ----


def test_odd_method_names_add_no_series_and_metrics_stay_parseable(server):
    from prometheus_client.parser import text_string_to_metric_families

    before = server.get("/metrics").raw.count(b"\nsolos_memory_requests_total{")
    for index in range(60):
        raw_exchange(server.port, f'X{index}"}}\\{{a="b HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n'.encode())
        raw_exchange(server.port, f"M{index}{'Q' * 2000} /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    text = server.get("/metrics").raw.decode()
    series = text.count("\nsolos_memory_requests_total{")
    assert series - before <= 3, f"{series - before} new series from 120 junk method names"
    assert 'method="other"' in text
    families = {family.name: family for family in text_string_to_metric_families(text)}
    methods = {sample.labels["method"] for sample in families["solos_memory_requests"].samples}
    assert methods <= {*solos_memory.SERVED_METHODS, "other"}


def test_label_values_are_escaped_per_the_exposition_format():
    assert solos_telemetry.label('a"b\\c\nd') == 'a\\"b\\\\c\\nd'


# ---- 7. /v1/stats in token mode: each caller sees its own; the log names the token's holder ----


def issue(tokens_file, agent: str) -> str:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert solos_memory.main(["token", agent, "--tokens-file", str(tokens_file)]) == 0
    return out.getvalue().strip()


def test_stats_show_an_agent_only_its_own_rejections_and_the_operator_everything(make_server, tmp_path):
    tokens_file = tmp_path / "tokens"
    atlas, sol, operator = (issue(tokens_file, name) for name in ("atlas", "sol", "@operator"))
    server = make_server(tokens_file=str(tokens_file))

    def auth(token: str) -> dict:
        return {"Authorization": f"Bearer {token}"}

    secret = "atlas-private-idempotency-key"
    first = {"event_type": "t", "summary": "one", "idempotency_key": secret}
    assert server.post("/v1/episodic", first, headers=auth(atlas)).status == 201
    conflict = server.post("/v1/episodic", {**first, "summary": "two"}, headers=auth(atlas))
    assert conflict.status == 409
    impostor = server.post("/v1/long", {"agent": "atlas", "fact": "sol posing as atlas"}, headers=auth(sol))
    assert impostor.status == 403

    sol_view = server.request("GET", "/v1/stats", headers=auth(sol)).body
    assert sol_view["view"] == "agent"
    assert all(r["agent"] == "sol" for r in sol_view["recent_rejections"])
    assert secret not in json.dumps(sol_view)
    # The impostor's rejection is logged under the token's holder, with the name it claimed.
    assert [(r["agent"], r["claimed_agent"]) for r in sol_view["recent_rejections"]] == [("sol", "'atlas'")]

    atlas_view = server.request("GET", "/v1/stats", headers=auth(atlas)).body
    assert [r["agent"] for r in atlas_view["recent_rejections"]] == ["atlas"]
    assert secret in json.dumps(atlas_view) or atlas_view["recent_rejections"][0]["code"] == "conflict"

    everything = server.request("GET", "/v1/stats", headers=auth(operator)).body
    assert everything["view"] == "operator"
    assert {r["agent"] for r in everything["recent_rejections"]} == {"atlas", "sol"}
    # An agent cannot ask for the operator view by naming no one, nor read another's by naming it.
    assert server.request("GET", "/v1/stats?agent=atlas", headers=auth(sol)).status == 403
    # The operator token reads stats and nothing else.
    assert server.post("/v1/long", {"agent": "atlas", "fact": "operator write"}, headers=auth(operator)).status == 403
    assert server.request("GET", "/v1/recall?agent=atlas&q=one", headers=auth(operator)).status == 403
    assert server.get("/v1/stats").status == 401


# ---- 8. request smuggling: framing errors close the connection; conflicting framing is 400 ----


def head(server, request_line: str, *headers: str) -> bytes:
    lines = [request_line, f"Host: 127.0.0.1:{server.port}", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")  # headers are ISO-8859-1 on the wire


def victim_present(server) -> bool:
    with server.db() as conn:
        return conn.execute("SELECT count(*) FROM memory_short WHERE key = 'victim'").fetchone()[0] == 1


SMUGGLED = b"DELETE /v1/short?agent=atlas&key=victim HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n"


@pytest.mark.parametrize(
    "framing",
    [
        ("POST /v1/long HTTP/1.1", "Content-Type: application/json"),  # no Content-Length: 411
        ("POST /v1/long HTTP/1.1", "Content-Type: application/json", "Content-Length: 2", "Content-Length: 0"),
        ("POST /v1/long HTTP/1.1", "Content-Type: application/json", "Content-Length: 2, 0"),
        ("POST /v1/long HTTP/1.1", "Content-Type: application/json", "Transfer-Encoding: gzip"),
        ("POST /v1/long HTTP/1.1", "Transfer-Encoding: chunked", "Content-Length: 2"),
        ("POST /mcp HTTP/1.1", "Content-Type: application/json"),
        ("PUT /v1/sharing HTTP/1.1", "Content-Type: application/json"),
        ("GET /v1/recall?agent=sol HTTP/1.1", "Content-Length: \u00b2"),
        ("POST /v1/long HTTP/1.1", "Content-Type: application/json", "Content-Length: 1\u00b3"),
    ],
)
def test_a_body_is_never_parsed_as_the_next_request(server, framing):
    assert server.post("/v1/short", {"agent": "atlas", "key": "victim", "value": "v"}).status == 201
    response = raw_exchange(server.port, head(server, *framing) + SMUGGLED % server.port)
    statuses = statuses_in(response)
    assert len(statuses) == 1 and statuses[0] in (400, 411), response[:300]
    assert b"Connection: close" in response
    assert victim_present(server), "the smuggled DELETE ran"


def test_a_body_sent_to_a_route_that_ignores_it_is_drained_not_run(server):
    assert server.post("/v1/short", {"agent": "atlas", "key": "victim", "value": "v"}).status == 201
    smuggled = SMUGGLED % server.port
    for route in ("/health", "/metrics", "/v1/recall?agent=sol", "/openapi.json"):
        data = head(server, f"GET {route} HTTP/1.1", f"Content-Length: {len(smuggled)}") + smuggled
        statuses = statuses_in(raw_exchange(server.port, data))
        assert statuses == [200], (route, statuses)
        assert victim_present(server), f"a body sent to GET {route} ran as a request"


# ---- 9. 500s where a 4xx was due ----


def test_unicode_digits_in_content_length_are_400(server):
    response = raw_exchange(server.port, head(server, "POST /v1/long HTTP/1.1", "Content-Length: \u00b2") + b"{}")
    assert statuses_in(response) == [400] and b'"field": "Content-Length"' in response


def test_an_integer_past_4300_digits_is_400_on_rest_and_a_parse_error_on_mcp(server):
    body = b'{"agent": "atlas", "fact": "f", "confidence": ' + b"9" * 5000 + b"}"
    rest = server.request("POST", "/v1/long", raw=body, headers={"Content-Type": "application/json"})
    assert rest.status == 400 and rest.body["error"]["field"] == "body"
    rpc = b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "recall", "arguments": {"k": '
    mcp = server.request("POST", "/mcp", raw=rpc + b"9" * 5000 + b"}}}", headers={"Content-Type": "application/json"})
    assert mcp.status == 400 and mcp.body["error"]["code"] == -32700


@pytest.mark.parametrize("depth", [200, 900, 2000])
def test_deep_nesting_inside_a_field_is_a_4xx_naming_it(server, depth):
    body = b'{"agent": "atlas", "fact": ' + b"[" * depth + b"]" * depth + b"}"
    rest = server.request("POST", "/v1/long", raw=body, headers={"Content-Type": "application/json"})
    assert rest.status == 400 and rest.body["error"]["field"] in ("fact", "body"), rest.raw[:200]
    rpc = b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "write_long", "arguments": '
    mcp = server.request("POST", "/mcp", raw=rpc + body + b"}}", headers={"Content-Type": "application/json"})
    assert mcp.status in (200, 400), mcp.raw[:200]
    assert mcp.body.get("error") or mcp.body["result"]["isError"] is True


# ---- 10. one validation, one answer: MCP refuses what REST refuses ----


@pytest.mark.parametrize(
    "tool,arguments",
    [
        ("write_long", b'{"agent": "atlas", "fact": "f", "confidence": NaN}'),
        ("write_episodic", b'{"agent": "atlas", "event_type": "t", "summary": "s", "duration_s": Infinity}'),
        ("write_short", b'{"agent": "atlas", "key": "k", "value": "v", "ttl_s": NaN}'),
    ],
)
def test_nan_and_infinity_are_refused_on_both_transports_and_nothing_is_stored(server, tool, arguments):
    op = solos_memory.OPERATIONS[tool]
    rest = server.request(op.method, op.path, raw=arguments, headers={"Content-Type": "application/json"})
    assert rest.status == 400, rest.raw
    rpc = b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "%s", "arguments": %s}}'
    mcp = server.request(
        "POST", "/mcp", raw=rpc % (tool.encode(), arguments), headers={"Content-Type": "application/json"}
    )
    assert mcp.status == 400 and mcp.body["error"]["code"] == -32700, mcp.raw
    with server.db() as conn:
        for table in ("memory_longterm", "memory_short", "memory_episodic"):
            assert conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 0


def test_non_finite_numbers_are_refused_by_validation_itself():
    schema = solos_memory.OPERATIONS["write_long"].input_schema
    for value in (float("nan"), float("inf"), float("-inf")):
        with pytest.raises(solos_memory.BadRequest) as refused:
            solos_memory.check_args(schema, {"agent": "atlas", "fact": "f", "confidence": value})
        assert refused.value.field == "confidence"


def test_a_utf16_body_is_refused_on_mcp_as_on_rest(server):
    rpc = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "write_long", "arguments": {}}}
    rpc["params"]["arguments"] = {"agent": "atlas", "fact": "sent as UTF-16"}
    raw = json.dumps(rpc).encode("utf-16")
    mcp = server.request("POST", "/mcp", raw=raw, headers={"Content-Type": "application/json"})
    assert mcp.status == 400 and mcp.body["error"]["code"] == -32700
    rest = server.request(
        "POST",
        "/v1/long",
        raw=json.dumps(rpc["params"]["arguments"]).encode("utf-16"),
        headers={"Content-Type": "application/json"},
    )
    assert rest.status == 400
    with server.db() as conn:
        assert conn.execute("SELECT count(*) FROM memory_longterm").fetchone()[0] == 0


# ---- 11. patterns guard whole values: no trailing newline ----


def test_an_agent_name_ending_in_a_newline_is_refused_everywhere(server, tmp_path):
    rest = server.post("/v1/long", {"agent": "atlas\n", "fact": "f"})
    assert rest.status == 400 and rest.body["error"]["field"] == "agent"
    mcp = server.mcp_tool("write_long", {"agent": "atlas\n", "fact": "f"})
    assert mcp.body["result"]["isError"] is True
    assert mcp.body["result"]["structuredContent"]["error"]["field"] == "agent"
    with pytest.raises(SystemExit):
        solos_memory.check_agent_names(["atlas\n"])
    tokens_file = tmp_path / "tokens"
    tokens_file.write_text("0" * 64 + " atlas\n\n")
    os.chmod(tokens_file, 0o600)
    assert solos_memory.Tokens.load(str(tokens_file)).by_hash == {"0" * 64: "atlas"}
    assert not solos_memory.fully_matches(solos_memory.AGENT_PATTERN, "atlas\n")


# ---- 2 (in-process part). storage errors are 503 with Retry-After, and a failed connection is not reused ----


def test_a_storage_failure_is_503_with_retry_after_and_its_connection_is_dropped(server, monkeypatch):
    store = server.server.memory.store
    real_connect = store.connect
    failing = {"on": True}

    def connect_then_fail():
        conn = real_connect()
        if failing["on"]:
            conn.reusable = False  # as a connection opened during a read-only spell is
            conn.execute("PRAGMA query_only = 1")  # every write on it fails with SQLITE_READONLY
        return conn

    store.close()  # empty the pool so the next request opens a connection
    monkeypatch.setattr(store, "connect", connect_then_fail)
    reply = server.post("/v1/long", {"agent": "atlas", "fact": "during the spell"})
    assert reply.status == 503 and reply.body["error"]["code"] == "storage_unavailable", reply.raw
    assert reply.headers["retry-after"] == "5" and "read-only" in reply.body["error"]["message"]
    assert server.recall("sol", "spell").status == 200  # reads still work on such a connection
    failing["on"] = False
    assert server.post("/v1/long", {"agent": "atlas", "fact": "after the spell"}).status == 201
    assert store.pool.qsize() >= 1 and all(conn.reusable for conn in list(store.pool.queue))
    with server.db() as conn:
        assert [row[0] for row in conn.execute("SELECT fact FROM memory_longterm")] == ["after the spell"]


def test_starting_on_a_database_that_cannot_be_opened_is_one_clear_line(tmp_path):
    missing_folder = tmp_path / "no" / "such" / "folder" / "solos.db"
    with pytest.raises(SystemExit) as stopped:
        solos_memory.build_server(solos_memory.Config(db=str(missing_folder), port=0, model_dir="off"))
    message = str(stopped.value)
    assert "cannot start" in message and "\n" not in message and "Traceback" not in message


def test_invalid_utf8_is_read_leniently_by_reads_and_writes_alike(tmp_path):
    store = solos_memory.Store(str(tmp_path / "x.db"))
    try:
        assert store.read(lambda conn: conn.execute("SELECT CAST(X'41ff42' AS TEXT)").fetchone()[0]) == "A\ufffdB"
        assert store.write(lambda conn: conn.execute("SELECT CAST(X'43ff' AS TEXT)").fetchone()[0]) == "C\ufffd"
        assert store.read(lambda conn: conn.execute("SELECT 'plain'").fetchone()[0]) == "plain"
    finally:
        store.close()


def test_sqlite_error_codes_are_named(tmp_path):
    assert sqlite3.SQLITE_READONLY in solos_memory.STORAGE_FAILURES
    assert sqlite3.SQLITE_FULL in solos_memory.STORAGE_FAILURES
