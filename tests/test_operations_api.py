"""What operators expect: OpenAPI from the operation table, Prometheus metrics, per-agent tokens, JSON logs,
/health that names no machine path."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, WordHashEmbedder, raw_exchange, wait_until, write_tokens
from openapi_spec_validator import validate
from prometheus_client.parser import text_string_to_metric_families

import solos_memory
import solos_telemetry


@pytest.mark.slow
def test_openapi_is_valid_and_covers_every_operation(server):
    reply = server.get("/openapi.json")
    assert reply.status == 200
    document = reply.body
    validate(document)
    assert document["openapi"] == "3.1.0"
    for op in solos_memory.OPERATIONS.values():
        spec = document["paths"][op.path][op.method.lower()]
        assert spec["operationId"] == op.name
        assert spec["responses"]["200"]["content"]["application/json"]["schema"] == op.output_schema
        if op.method in ("GET", "DELETE"):
            assert {p["name"] for p in spec["parameters"]} == set(op.input_schema["properties"])
        else:
            assert spec["requestBody"]["content"]["application/json"]["schema"] == op.input_schema


def test_responses_match_the_advertised_output_schemas(server):
    from jsonschema import validate as validate_json

    server.post("/v1/long", {"agent": "atlas", "fact": "schema fact"})
    server.request("PUT", "/v1/sharing", body={"agent": "atlas", "episodic": True})
    server.post("/v1/episodic", {"agent": "atlas", "event_type": "t", "summary": "schema event"})
    server.post("/v1/short", {"agent": "sol", "key": "k", "value": "schema value"})
    forgettable = server.post("/v1/long", {"agent": "sol", "fact": "schema fact to forget"}).body["id"]
    samples = {
        "recall": server.get(
            "/v1/recall", agent="sol", q="schema", tiers="long,short,episodic,durable", scope="shared"
        ),
        "write_long": server.post("/v1/long", {"agent": "atlas", "fact": "schema fact"}),
        "write_short": server.post("/v1/short", {"agent": "sol", "key": "k2", "value": "v"}),
        "write_episodic": server.post("/v1/episodic", {"agent": "atlas", "event_type": "t", "summary": "s"}),
        "delete_short": server.request("DELETE", "/v1/short", query={"agent": "sol", "key": "k2"}),
        "set_sharing": server.request("PUT", "/v1/sharing", body={"agent": "sol", "episodic": False}),
        "read_audit": server.get("/v1/audit", agent="atlas"),
        "stats": server.get("/v1/stats"),
        "promote": server.post("/v1/promote", {"agent": "atlas", "ids": [1]}),
        "forget": server.request("DELETE", "/v1/memory", query={"agent": "sol", "tier": "long", "id": forgettable}),
        "read_events": server.get("/v1/events", agent="atlas", since=0, tiers="long,short,episodic"),
        "read_deliveries": server.get("/v1/deliveries", agent="atlas"),
        "recall_as_of": server.get("/v1/recall/as_of", agent="sol", as_of="2099-01-01T00:00:00Z"),
        "read_notices": server.get("/v1/notices", agent="atlas"),
        "ack_notices": server.post("/v1/notices/ack", {"agent": "atlas", "ids": [1]}),
    }
    assert set(samples) == set(solos_memory.OPERATIONS)
    for name, reply in samples.items():
        assert reply.status in (200, 201), (name, reply.body)
        validate_json(reply.body, solos_memory.OPERATIONS[name].output_schema)
    assert samples["read_audit"].body["count"] == 1
    error = server.recall("mallory", "x")
    validate_json(error.body, solos_memory.ERROR_SCHEMA)


def test_metrics_are_prometheus_text(server):
    server.post("/v1/long", {"agent": "atlas", "fact": "metric fact"})
    server.recall("sol", "metric")
    server.recall("mallory", "metric")
    server.get("/no/such/path/with/a/unique/name")
    reply = server.request("GET", "/metrics")
    assert reply.status == 200 and reply.headers["content-type"].startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(reply.raw.decode())}
    requests = {
        (s.labels["route"], s.labels["method"], s.labels["status"]): s.value
        for s in families["solos_memory_requests"].samples
    }
    assert requests[("/v1/long", "POST", "201")] == 1
    assert requests[("/v1/recall", "GET", "200")] == 1
    assert requests[("/v1/recall", "GET", "422")] == 1
    assert requests[("other", "GET", "404")] == 1  # arbitrary paths do not become labels
    histogram = {
        (s.name, s.labels.get("le")): s.value
        for s in families["solos_memory_request_duration_seconds"].samples
        if s.labels["route"] == "/v1/recall"
    }
    assert histogram[("solos_memory_request_duration_seconds_count", None)] == 2
    assert histogram[("solos_memory_request_duration_seconds_bucket", "+Inf")] == 2
    rejections = {s.labels["reason"]: s.value for s in families["solos_memory_rejections"].samples}
    assert rejections == {"unknown_agent": 1, "not_found": 1}
    assert families["solos_memory_degraded"].samples[0].value == 1
    rows = {s.labels["tier"]: s.value for s in families["solos_memory_rows"].samples}
    assert rows["long"] == 1


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_tokens_decide_the_caller_over_rest(token_server):
    server = token_server
    assert server.get("/health").body["auth"] == "tokens"
    anonymous = server.post("/v1/long", {"agent": "atlas", "fact": "no token"})
    assert anonymous.status == 401 and anonymous.headers["www-authenticate"].startswith("Bearer")
    wrong = server.post("/v1/long", {"agent": "atlas", "fact": "bad token"}, headers=bearer("guess"))
    assert wrong.status == 401
    impostor = server.post("/v1/long", {"agent": "atlas", "fact": "sol pretending"}, headers=bearer("sol-token"))
    assert impostor.status == 403 and impostor.body["error"]["field"] == "agent"
    implied = server.post("/v1/long", {"fact": "written with the agent implied"}, headers=bearer("atlas-token"))
    assert implied.status == 201 and implied.body["agent"] == "atlas"
    recall = server.request("GET", "/v1/recall?q=implied", headers=bearer("sol-token"))
    assert [(r["agent"], r["foreign"]) for r in recall.body["results"]] == [("atlas", True)]
    assert server.request("GET", "/v1/stats").status == 401
    assert server.request("GET", "/v1/stats", headers=bearer("sol-token")).status == 200
    with server.db() as conn:
        assert [r[0] for r in conn.execute("SELECT agent FROM memory_longterm")] == ["atlas"]


def mcp_call(server, name: str, arguments: dict, headers: dict) -> dict:
    reply = server.mcp_tool(name, arguments, headers)
    assert reply.status == 200, reply.raw
    return reply.body["result"]


def test_tokens_decide_the_caller_over_mcp(token_server):
    server = token_server
    refused = server.mcp_tool("write_long", {"agent": "atlas", "fact": "mcp no token"})
    assert refused.status == 401 and refused.body["error"]["data"]["code"] == "unauthorized"  # in JSON-RPC's shape
    assert refused.headers["www-authenticate"].startswith("Bearer")
    unknown = server.mcp_tool("write_long", {"agent": "atlas", "fact": "x"}, bearer("not-a-token"))
    assert unknown.status == 401
    impostor = mcp_call(server, "write_long", {"agent": "atlas", "fact": "mcp impostor"}, bearer("sol-token"))
    assert impostor["isError"] is True and impostor["structuredContent"]["error"]["status"] == 403
    ok = mcp_call(server, "write_long", {"agent": "sol", "fact": "mcp with token"}, bearer("sol-token"))
    assert ok.get("isError") is not True and ok["structuredContent"]["agent"] == "sol"


def test_tokens_are_never_logged(make_server, tmp_path, capfd):
    tokens = tmp_path / "tokens"
    write_tokens(tokens, {"very-secret-value": "atlas"})
    server = make_server("logged.db", tokens_file=str(tokens), log_requests=True)
    server.post("/v1/long", {"agent": "sol", "fact": "x"}, headers=bearer("very-secret-value"))
    server.post("/v1/long", {"agent": "atlas", "fact": "x"}, headers=bearer("wrong-secret-value"))
    captured = capfd.readouterr()
    assert "very-secret-value" not in captured.err + captured.out
    assert "wrong-secret-value" not in captured.err + captured.out
    assert '"event": "rejected"' in captured.err


def test_tokens_file_readable_by_others_is_refused(tmp_path):
    tokens = tmp_path / "tokens"
    write_tokens(tokens, {"t": "atlas"})
    tokens.chmod(0o644)
    run = subprocess.run(
        [
            sys.executable,
            str(ROOT / "solos_memory.py"),
            "serve",
            "--db",
            str(tmp_path / "x.db"),
            "--port",
            "0",
            "--tokens-file",
            str(tokens),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode != 0 and "chmod 600" in run.stderr


@pytest.mark.parametrize("make", ["missing", "folder"])
def test_a_tokens_file_that_cannot_be_read_stops_startup_in_one_line(tmp_path, make):
    """The operator saw a FileNotFoundError traceback for a mistyped --tokens-file (and a folder was said to be
    'accessible by group or others'), after the database had been created."""
    tokens = tmp_path / "tokens"
    if make == "folder":
        tokens.mkdir(mode=0o700)
    command = [sys.executable, str(ROOT / "solos_memory.py"), "serve", "--db", str(tmp_path / "x.db"), "--port", "0"]
    run = subprocess.run(
        [*command, "--tokens-file", str(tokens), "--model-dir", "off"], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    line = run.stderr.strip().splitlines()[-1]
    assert line.startswith(f"--tokens-file {tokens}: cannot be read"), line
    assert not (tmp_path / "x.db").exists()  # checked before the database is opened


@pytest.mark.parametrize("where", ["no-such-folder/tokens", "."])
def test_a_tokens_file_the_token_command_cannot_write_is_one_line_and_no_token(tmp_path, where):
    """`token atlas --tokens-file` in a folder that does not exist (or naming a folder) was an OSError traceback;
    no token is printed, since none was kept."""
    tokens = tmp_path / where
    command = [sys.executable, str(ROOT / "solos_memory.py"), "token", "atlas", "--tokens-file", str(tokens)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and "Traceback" not in run.stderr and run.stdout == "", run.stderr
    assert run.stderr.strip().splitlines()[-1].startswith(f"--tokens-file {tokens}: cannot be written: ")


@pytest.mark.parametrize("flaw", ["mode 644", "a line it cannot read"])
def test_the_token_command_adds_no_token_to_a_file_the_service_refuses(tmp_path, flaw):
    """A tokens file made with the umask's 644 (or holding a bad line): `token` appended to it and printed the
    token, exit 0, for each of the fleet's agents; the service then refused to start on that file."""
    tokens = tmp_path / "tokens"
    bad_line = "not a token line\n" if "line" in flaw else ""
    tokens.write_text(f"{hashlib.sha256(b'old').hexdigest()} atlas\n{bad_line}")
    tokens.chmod(0o644 if flaw == "mode 644" else 0o600)
    before = tokens.read_text()
    command = [sys.executable, str(ROOT / "solos_memory.py"), "token", "sol", "--tokens-file", str(tokens)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and "Traceback" not in run.stderr and run.stdout == "", run.stderr
    said = "chmod 600" if flaw == "mode 644" else "expected '<sha256 hex> <agent>'"
    assert said in run.stderr and "no token was issued" in run.stderr, run.stderr
    assert tokens.read_text() == before


def test_token_command_prints_a_token_and_stores_only_its_hash(tmp_path):
    tokens = tmp_path / "tokens"
    run = subprocess.run(
        [sys.executable, str(ROOT / "solos_memory.py"), "token", "atlas", "--tokens-file", str(tokens)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    token = run.stdout.strip()
    assert run.returncode == 0 and len(token) >= 40
    stored = tokens.read_text()
    assert token not in stored and hashlib.sha256(token.encode()).hexdigest() in stored
    assert oct(os.stat(tokens).st_mode & 0o777) == "0o600"
    assert solos_memory.Tokens.load(str(tokens)).agent_for(f"Bearer {token}") == "atlas"


def test_logs_are_one_json_object_per_line(make_server, capfd):
    server = make_server("json-logs.db", log_requests=True)
    server.post("/v1/long", {"agent": "atlas", "fact": "logged fact"})
    server.post("/v1/long", {"agent": "mallory", "fact": "refused"})
    events: list[dict] = []

    def both_requests_logged() -> bool:  # a request's line is written after its answer: the client may read first
        lines = [line for line in capfd.readouterr().err.splitlines() if line.strip()]
        events.extend(json.loads(line) for line in lines)
        return sum(e["event"] == "request" for e in events) >= 2

    wait_until(both_requests_logged, "both requests' log lines")
    rejected = [e for e in events if e["event"] == "rejected"]
    assert rejected == [{**rejected[0], "agent": "mallory", "operation": "write_long", "code": "unknown_agent"}]
    assert any(e["event"] == "request" and e["status"] == 201 for e in events)


def test_unexpected_errors_are_logged_as_one_json_line_with_the_traceback(capfd):
    import logging

    logger = logging.getLogger("solos-test")
    logger.addHandler(solos_memory.JsonLogHandler())
    logger.propagate = False  # a CLI test run before may have given the root logger a handler of its own
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logger.exception("unexpected error on GET /v1/stats")
    finally:
        logger.handlers.clear()
        logger.propagate = True
    lines = [line for line in capfd.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1
    record = json.loads(lines[0])
    assert record["event"] == "log" and record["level"] == "error"
    assert "RuntimeError: boom" in record["traceback"]


# ---- /health (no token) names no machine path; the operator's view of stats keeps them ----


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


def test_an_agents_view_of_stats_names_no_machine_path_in_any_message(embedded_server, tmp_path):
    """degraded_reason was cut to '…/x.onnx' in an agent's view, but embed_error (the same failure), the delivery
    log's last_error and a job's error beside it kept '/home/op/SolOS/…': SECURITY.md says an agent's view does not."""

    class FullDisk(WordHashEmbedder):
        def embed(self, texts):
            raise OSError(28, "No space left on device", "/home/op/SolOS/cache/x.onnx")

    server = embedded_server(FullDisk())
    memory = server.server.memory
    assert server.post("/v1/long", {"agent": "atlas", "fact": "waits for its vector"}).status == 201
    wait_until(lambda: memory.worker.last_error, "the embedding pass to fail")
    memory.deliveries.last_error = "OperationalError: unable to open '/home/op/SolOS/runtime/solos.db'"
    with server.db() as conn:
        conn.execute(
            "INSERT INTO memory_job_run (job, ended_at, result, error) VALUES "
            "('snapshot', '2026-12-07T02:00:01.000Z', 'failed', 'SnapshotError: no database at /home/op/SolOS/x.db')"
        )
    agent_view = json.dumps(server.get("/v1/stats", agent="sol").body, ensure_ascii=False)
    assert "/home/op" not in agent_view and "…/x.onnx" in agent_view and "…/solos.db" in agent_view, agent_view
    assert "…/x.db" in agent_view
    operator = server.get("/v1/stats").body  # the operator's view keeps them whole
    assert operator["embed_error"] == memory.worker.last_error
    assert operator["delivery_log"]["last_error"] == memory.deliveries.last_error
    assert "/home/op/SolOS/x.db" in operator["jobs"]["snapshot"]["detail"]


# ---- /metrics: bounded label sets, escaped values ----


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


def test_a_refused_agent_name_is_kept_short_in_stats_the_page_and_the_log(server, capsys):
    """Loopback trust names a rejection by the agent its call claimed; a name that is no agent name (a 300 KB
    string) is kept as the reason keeps a bad value: short. Twenty of them made stats and the page 6 MB each."""
    huge = "A" * 300_000
    for _ in range(20):
        assert server.post("/v1/long", {"agent": huge, "fact": "x"}).status == 400
    assert server.post("/v1/long", {"agent": "sol\n<b>", "fact": "x"}).status == 400
    stats = server.get("/v1/stats")
    assert len(stats.raw) < 100_000, len(stats.raw)
    assert len(server.get("/").raw) < 100_000
    newest, *older = stats.body["recent_rejections"]
    assert newest["agent"] is None and newest["claimed_agent"] == repr("sol\n<b>")
    assert older[0]["agent"] is None and len(older[0]["claimed_agent"]) <= 60
    assert max(len(line) for line in capsys.readouterr().err.splitlines()) < 2_000
    assert server.post("/v1/long", {"agent": "mallory", "fact": "x"}).status == 422  # a name, not registered
    assert server.get("/v1/stats").body["recent_rejections"][0]["agent"] == "mallory"


# ---- /v1/stats in token mode: each caller sees its own; the log names the token's holder ----


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
