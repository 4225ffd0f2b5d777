"""Rollout checks (solos_check) against live services: all pass on a sound one, each fails when its part breaks."""

from __future__ import annotations

import http.server
import ipaddress
import itertools
import json
import re
import socket
import sys
import threading
import time
from contextlib import contextmanager

import pytest
from conftest import ROOT, WordHashEmbedder, refused_at_start, skip_or_fail

import solos_check
import solos_memory
import solos_rank

CHECK_NAMES = ["loopback only", "health", "cross-agent echo", "long row delta", "mcp tools", "degraded mode"]
NO_MESH = ["--a2a-ports", "none"]  # tests never ask the fleet's real 8300-8307


def by_name(results: list[solos_check.CheckResult]) -> dict[str, solos_check.CheckResult]:
    return {result.name: result for result in results}


def failed(results: list[solos_check.CheckResult]) -> list[str]:
    return [result.name for result in results if not result.ok]


def table_row(line: str) -> tuple[str, str, str]:
    """A printed line as (check, verdict, detail)."""
    name, verdict, detail = re.split(r"\s{2,}", line, maxsplit=2)
    return name, verdict, detail


def check_rows(server) -> list[dict]:
    with server.db() as conn:
        return [
            dict(row)
            for row in conn.execute(
                "SELECT id, agent, fact, source, tags FROM memory_longterm WHERE source = 'solos-check' ORDER BY id"
            )
        ]


@pytest.mark.slow
def test_every_check_passes_against_a_live_service(server, capsys):
    assert solos_check.main(["--url", server.url, "--writer", "atlas", "--reader", "sol", *NO_MESH]) == 0
    table = capsys.readouterr().out.splitlines()
    assert [line.split("  ")[0].strip() for line in table[:6]] == CHECK_NAMES
    assert all("  PASS  " in line for line in table[:5])
    assert "  WARN  keyword-only recall: " in table[5]  # a supported way to run, but not hybrid
    assert table[6] == "6/6 checks passed, 1 with a warning"
    assert table[-1].endswith(f"python3 {sys.argv[0]} --cleanup --db PATH (the service's --db)")
    assert f"127.0.0.1:{server.port}" in table[0]
    assert "auth loopback-trust, degraded true" in table[1]
    rows = check_rows(server)
    assert len(rows) == 4  # one echo fact, three distinct delta facts
    run_id = json.loads(rows[0]["tags"])[1]
    assert all(row["agent"] == "atlas" and json.loads(row["tags"]) == ["solos-check", run_id] for row in rows)


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_loopback_check_fails_on_a_wildcard_bind(make_server, host):
    exposed = make_server(host=host, allow_remote=True)
    results = solos_check.run_checks(f"http://127.0.0.1:{exposed.port}", "atlas", "sol")
    assert failed(results) == ["loopback only"]
    shown = "0.0.0.0" if host == "0.0.0.0" else "[::]"
    detail = by_name(results)["loopback only"].detail
    assert detail == f"listening beyond loopback: {shown} (all interfaces):{exposed.port}"


def test_ipv6_loopback_bind_passes(make_server):
    server = make_server(host="::1")
    result = solos_check.run_checks(f"http://[::1]:{server.port}", "atlas", "sol")
    assert failed(result) == []
    assert by_name(result)["loopback only"].detail == f"listening on [::1]:{server.port}"


def test_proc_addresses_decode_in_kernel_byte_order():
    assert str(solos_check.decode_proc_address("0100007F")) == "127.0.0.1"
    assert str(solos_check.decode_proc_address("00000000000000000000000001000000")) == "::1"
    mapped = solos_check.decode_proc_address("0000000000000000FFFF00000100007F")
    assert mapped == ipaddress.ip_address("::ffff:127.0.0.1") and solos_check.is_loopback(mapped)


def test_nothing_listening_fails_every_check(server):
    port = server.port
    server.server.shutdown()
    server.server.server_close()
    results = solos_check.run_checks(f"http://127.0.0.1:{port}", "atlas", "sol", timeout=1)
    assert failed(results) == CHECK_NAMES
    assert by_name(results)["loopback only"].detail.startswith(f"no listener on port {port}")
    assert "cannot talk to" in by_name(results)["health"].detail


def test_unregistered_reader_fails_the_echo(server):
    results = by_name(solos_check.run_checks(server.url, "atlas", "ghost"))
    assert not results["cross-agent echo"].ok
    assert (
        results["cross-agent echo"].detail
        == "GET /v1/recall as ghost: 422 agent 'ghost' is not registered in agent_registry"
    )
    assert not results["degraded mode"].ok


def test_echo_that_comes_back_unlabelled_fails(server, monkeypatch):
    real = solos_rank.tier_result
    monkeypatch.setattr(
        solos_rank, "tier_result", lambda tier, row, caller: {**real(tier, row, caller), "foreign": False}
    )
    result = by_name(solos_check.run_checks(server.url, "atlas", "sol"))["cross-agent echo"]
    assert not result.ok
    assert "came back as agent=atlas, foreign=false; expected agent=atlas, foreign=true" in result.detail


def test_same_writer_and_reader_is_refused(capsys):
    assert solos_check.main(["--writer", "atlas", "--reader", "atlas"]) == 2
    assert "different agents" in capsys.readouterr().err


@pytest.mark.parametrize("url", ["http://127.0.0.1:99999", "http://[::1", "ftp://127.0.0.1:8437", "127.0.0.1:8437"])
def test_a_url_check_cannot_use_is_refused_naming_the_flag(url, capsys):
    """A port out of range or a broken IPv6 address printed only urllib's "Port out of range 0-65535" or
    "Invalid IPv6 URL", leaving the operator to guess which argument it meant."""
    assert solos_check.main(["--url", url, *NO_MESH]) == 2
    assert capsys.readouterr().err.strip() == f"--url must look like http://127.0.0.1:8437, got {url!r}"


def test_mcp_without_the_core_tools_fails(make_server, monkeypatch):
    real = solos_memory.mcp_tools
    monkeypatch.setattr(
        solos_memory,
        "mcp_tools",
        lambda operations: [t for t in real(operations) if t.name not in ("stats", "write_long")],
    )
    server = make_server()
    results = solos_check.run_checks(server.url, "atlas", "sol")
    assert failed(results) == ["mcp tools"]
    assert by_name(results)["mcp tools"].detail.startswith(
        "tools/list lacks write_long, stats; it lists ack_notices, delete_short"
    )


def test_mcp_that_answers_initialize_with_an_error_fails(server, monkeypatch):
    error = {"jsonrpc": "2.0", "id": 1, "error": {"code": -32601, "message": "Method not found: initialize"}}
    monkeypatch.setattr(
        server.server.bridge, "handle", lambda method, headers, body: (200, {}, json.dumps(error).encode())
    )
    result = by_name(solos_check.run_checks(server.url, "atlas", "sol"))["mcp tools"]
    assert not result.ok
    assert (
        result.detail
        == '/mcp initialize answered without a result: {"code": -32601, "message": "Method not found: initialize"}'
    )


def insert_foreign_fact(server) -> None:
    """One of the fleet's other writers adding a fact straight into the table."""
    with server.db() as conn:
        conn.execute("INSERT INTO memory_longterm (agent, fact) VALUES ('nova', 'a fact written beside the check')")


def test_a_single_concurrent_write_is_absorbed_by_the_retry(server, monkeypatch):
    real, calls = solos_memory.Store.counts, []

    def counts_with_one_foreign_write(store):
        calls.append(1)
        if len(calls) == 3:  # the health check's jobs read is the first: between the first attempt's two counts
            insert_foreign_fact(server)
        return real(store)

    monkeypatch.setattr(solos_memory.Store, "counts", counts_with_one_foreign_write)
    result = by_name(solos_check.run_checks(server.url, "atlas", "sol"))["long row delta"]
    assert result.ok and result.detail.endswith("rows.long +3 (on retry; first delta 4)")


def test_a_disturbed_row_count_fails(server, monkeypatch):
    real = solos_memory.Store.counts

    def counts_after_a_foreign_write(store):
        insert_foreign_fact(server)
        return real(store)

    monkeypatch.setattr(solos_memory.Store, "counts", counts_after_a_foreign_write)
    results = solos_check.run_checks(server.url, "atlas", "sol")
    assert failed(results) == ["long row delta"]
    assert by_name(results)["long row delta"].detail == (
        "5 writes of 3 distinct facts changed rows.long by 4, then by 4 on retry; expected 3 "
        "(concurrent fleet writers can disturb this count)"
    )


def test_repeats_that_insert_rows_fail(server, monkeypatch):
    real, serial = solos_memory.Store.upsert_long, itertools.count()

    def upsert_without_write_key(store, agent, topic, fact, *rest, **named):
        return real(store, agent, topic, f"{fact} (copy {next(serial)})", *rest, **named)

    monkeypatch.setattr(solos_memory.Store, "upsert_long", upsert_without_write_key)
    result = by_name(solos_check.run_checks(server.url, "atlas", "sol"))["long row delta"]
    assert not result.ok and "changed rows.long by 5, then by 5 on retry" in result.detail


def test_missing_degraded_header_fails(server, monkeypatch):
    monkeypatch.setattr(solos_memory, "degraded_header", lambda result: {})
    results = solos_check.run_checks(server.url, "atlas", "sol")
    assert failed(results) == ["degraded mode"]
    assert by_name(results)["degraded mode"].detail == "body says degraded true but X-Memory-Degraded is None"


def test_a_judge_recall_cannot_use_is_a_warning(make_server, monkeypatch, tmp_path):
    """A missing judge file changes what every recall's relevance means; the health check said 200 ok."""
    import solos_judge

    monkeypatch.setattr(solos_judge, "JUDGE_PATH", tmp_path / "judge.json")  # missing
    results = solos_check.run_checks(make_server().url, "atlas", "sol")
    health = by_name(results)["health"]
    assert health.ok and health.warning, health
    assert "judge unavailable (judge file unreadable: judge.json" in health.detail


@pytest.mark.slow
def test_with_an_embedder_the_check_says_so(make_server):
    try:
        server = make_server(model_dir=None)
    except SystemExit as error:
        skip_or_fail(f"embedder unavailable: {error}")
    if server.server.memory.embedder is None:
        skip_or_fail(f"embedder unavailable: {server.server.memory.embedder_error}")
    results = solos_check.run_checks(server.url, "atlas", "sol")
    assert failed(results) == []
    assert "degraded false" in by_name(results)["health"].detail
    assert (
        by_name(results)["degraded mode"].detail == "embedder loaded (degraded false): 4 rows, X-Memory-Degraded false"
    )


def test_with_tokens_the_checks_send_each_agents_token(token_server, monkeypatch, capsys):
    monkeypatch.setenv("SOLOS_CHECK_WRITER_TOKEN", "atlas-token")
    monkeypatch.setenv("SOLOS_CHECK_READER_TOKEN", "sol-token")
    assert solos_check.main(["--url", token_server.url, *NO_MESH]) == 0
    assert "auth tokens" in capsys.readouterr().out


def test_with_tokens_but_none_given_the_writes_are_refused(token_server):
    results = by_name(solos_check.run_checks(token_server.url, "atlas", "sol"))
    assert results["health"].ok and "auth tokens" in results["health"].detail
    detail = results["cross-agent echo"].detail
    assert detail.startswith("POST /v1/long as atlas: 401 ") and detail.endswith(solos_check.TOKEN_HINT)


def test_a_token_for_another_agent_is_refused(token_server):
    results = by_name(
        solos_check.run_checks(token_server.url, "atlas", "sol", writer_token="sol-token", reader_token="sol-token")
    )
    assert results["cross-agent echo"].detail == "POST /v1/long as atlas: 403 the token belongs to 'sol', not 'atlas'"


def test_cleanup_removes_exactly_the_check_rows(server, capsys):
    keep = [
        {
            "agent": "atlas",
            "fact": "an agent's own fact that mentions solos-check",
            "source": "runbook",
            "tags": ["solos-check"],
        },
        {
            "agent": "sol",
            "fact": "a fact with the check's source but not its tag",
            "source": "solos-check",
            "tags": ["ops"],
        },
    ]
    for body in keep:
        assert server.post("/v1/long", body).status == 201
    with server.db() as conn:  # another writer's comma-list tags are not JSON and must not break the cleanup
        conn.execute(
            "INSERT INTO memory_longterm (agent, fact, source, tags) "
            "VALUES ('nova', 'legacy row', 'solos-check', 'solos-check,ops')"
        )
    assert all(r.ok for r in solos_check.run_checks(server.url, "atlas", "sol"))
    written = [row for row in check_rows(server) if row["agent"] == "atlas"]
    check_ids, run_id = [row["id"] for row in written], json.loads(written[0]["tags"])[1]
    assert len(check_ids) == 4 and server.recall("sol", run_id, tiers="long").body["count"] == 4

    assert solos_check.main(["--cleanup", "--db", str(server.db_path)]) == 0
    assert capsys.readouterr().out == f"removed 4 solos-check rows from {server.db_path}\n"
    with server.db() as conn:
        remaining = [row["fact"] for row in conn.execute("SELECT fact FROM memory_longterm ORDER BY id")]
        keys = conn.execute(
            "SELECT count(*) FROM memory_write_key WHERE tier = 'long' AND row_id IN "
            f"({', '.join('?' * len(check_ids))})",
            check_ids,
        ).fetchone()[0]
    assert remaining == [body["fact"] for body in keep] + ["legacy row"]
    assert keys == 0
    assert server.recall("sol", run_id, tiers="long").body["count"] == 0  # the keyword index followed


def test_cleanup_of_a_missing_database_fails_without_creating_it(tmp_path, capsys):
    assert solos_check.main(["--cleanup", "--db", str(tmp_path / "absent.db")]) == 1
    assert "unable to open database file" in capsys.readouterr().err
    assert not (tmp_path / "absent.db").exists()


def test_the_cleanup_hint_shows_only_when_the_checks_wrote_rows(server, capsys):
    port = server.port
    server.server.shutdown()
    server.server.server_close()
    assert solos_check.main(["--url", f"http://127.0.0.1:{port}", "--timeout", "1", *NO_MESH]) == 1
    out = capsys.readouterr().out
    assert "0/6 checks passed" in out and "--cleanup" not in out


@pytest.mark.slow
def test_the_cleanup_hint_names_the_program_that_ran(server, tmp_path):
    """Run from the .pyz, the hint names the .pyz and its check subcommand, not solos_memory.py."""
    import subprocess

    pyz = tmp_path / "solos-memory.pyz"
    subprocess.run([sys.executable, str(ROOT / "pyz_build.py"), "--out", str(pyz)], check=True, capture_output=True)
    run = subprocess.run(
        [sys.executable, str(pyz), "check", "--url", server.url, *NO_MESH], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stdout + run.stderr
    hint = run.stdout.splitlines()[-1]
    assert f"python3 {pyz} check --cleanup --db PATH" in hint and "solos_memory.py" not in hint


# ---- keyword-only recall: a warning, or a failure when hybrid was expected ----


def test_keyword_only_fails_when_hybrid_is_expected_and_passes_when_keyword_is(server, capsys):
    argv = ["--url", server.url, *NO_MESH]
    assert solos_check.main([*argv, "--expect", "hybrid"]) == 1
    table = capsys.readouterr().out.splitlines()
    name, verdict, detail = table_row(table[5])
    assert (name, verdict) == ("degraded mode", "FAIL")
    assert detail.startswith("expected hybrid recall, got keyword-only recall: 4 rows, degraded true")
    assert table[6] == "5/6 checks passed"
    assert solos_check.main([*argv, "--expect", "keyword"]) == 0
    table = capsys.readouterr().out.splitlines()
    _, verdict, detail = table_row(table[5])
    assert verdict == "PASS" and detail.startswith("keyword-only recall: ") and table[6] == "6/6 checks passed"


def test_an_embedder_fails_when_keyword_only_is_expected(make_server, monkeypatch):
    monkeypatch.setattr(solos_memory, "load_embedder", lambda config, threads=1: (WordHashEmbedder(), None))
    server = make_server("hybrid.db")
    results = by_name(solos_check.run_checks(server.url, "atlas", "sol", expect="keyword"))
    assert not results["degraded mode"].ok
    assert results["degraded mode"].detail == "expected keyword-only recall, but an embedder is loaded (degraded false)"
    assert by_name(solos_check.run_checks(server.url, "atlas", "sol", expect="hybrid"))["degraded mode"].ok


# ---- the A2A mesh: untouched by the rollout ----


class StandInAgent(http.server.BaseHTTPRequestHandler):
    """An A2A agent as the mesh check sees it: its card at the well-known path."""

    def do_GET(self) -> None:
        found = self.path == solos_check.A2A_PATH
        body = b'{"name": "stand-in"}' if found else b""
        self.send_response(200 if found else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args) -> None:
        pass


@contextmanager
def stand_in_agents(count: int):
    """count agents on free loopback ports, stoppable one by one: (ports, stop(port))."""
    servers = {}
    for _ in range(count):
        agent = http.server.ThreadingHTTPServer(("127.0.0.1", 0), StandInAgent)
        threading.Thread(target=agent.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers[agent.server_address[1]] = agent

    def stop(port: int) -> None:
        servers[port].shutdown()
        servers.pop(port).server_close()

    try:
        yield list(servers), stop
    finally:
        for port in list(servers):
            stop(port)


def free_port() -> int:
    """A loopback port nothing listens on (a dead agent)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def mesh_argv(ports: list[int], skip: list[int], baseline) -> list[str]:
    return ["--a2a-ports", ",".join(map(str, ports)), "--a2a-skip", ",".join(map(str, skip)) or "none",
            "--a2a-baseline", str(baseline)]  # fmt: skip


def test_an_agent_that_answered_before_the_rollout_and_not_after_fails_the_mesh_check(server, tmp_path, capsys):
    baseline, dead, skipped = tmp_path / "state" / "a2a.json", free_port(), free_port()
    with stand_in_agents(3) as (agents, stop):
        mesh = mesh_argv([*agents, dead, skipped], [skipped], baseline)
        assert solos_check.main(["--a2a-record", *mesh]) == 0
        out = capsys.readouterr().out
        assert f"{agents[0]} 200, {agents[1]} 200, {agents[2]} 200, {dead} refused" in out
        assert f"recorded 3 of 4 answering 200 in {baseline}" in out
        recorded = json.loads(baseline.read_text())["answers"]
        assert recorded == {**{str(port): 200 for port in agents}, str(dead): "refused"}  # the skipped one unasked

        assert solos_check.main(["--url", server.url, "--expect", "keyword", *mesh]) == 0  # the mesh as it was
        table = capsys.readouterr().out.splitlines()
        assert table_row(table[6])[:2] == ("a2a mesh", "PASS")
        assert table_row(table[6])[2].startswith("as before the rollout (")
        assert table[7] == "7/7 checks passed"

        stop(agents[1])  # the rollout cost the mesh an agent
        assert solos_check.main(["--url", server.url, "--expect", "keyword", *mesh]) == 1
        table = capsys.readouterr().out.splitlines()
        name, verdict, detail = table_row(table[6])
        assert (name, verdict) == ("a2a mesh", "FAIL")
        assert detail.startswith("answered 200 before the rollout (") and detail.endswith(
            f"not now: {agents[1]} refused"
        )
        assert table[7] == "6/7 checks passed"


def test_the_memory_service_on_a_mesh_port_fails_the_mesh_check(server, tmp_path):
    mesh = solos_check.Mesh((server.port - 1, server.port), (server.port,), "/", tmp_path / "a2a.json")
    result = by_name(solos_check.run_checks(server.url, "atlas", "sol", mesh=mesh))["a2a mesh"]
    assert not result.ok  # even on a port skipped as dead: it is the mesh's
    assert result.detail.startswith(f"the memory service listens on {server.port}, a port of the A2A mesh")


def test_without_a_baseline_the_mesh_check_warns_and_says_how_to_record_one(server, tmp_path):
    with stand_in_agents(1) as (agents, _):
        mesh = solos_check.Mesh(tuple(agents), (), solos_check.A2A_PATH, tmp_path / "none.json")
        result = by_name(solos_check.run_checks(server.url, "atlas", "sol", mesh=mesh))["a2a mesh"]
    assert result.ok and result.warning
    assert "record one with check --a2a-record before a rollout" in result.detail
    assert result.detail.endswith(f"now: {agents[0]} 200")


def test_mesh_ports_parse_as_the_fleet_writes_them():
    assert solos_check.parse_ports("8300-8307") == tuple(range(8300, 8308))
    assert solos_check.parse_ports("8300, 8302-8303,8300") == (8300, 8302, 8303)
    assert solos_check.parse_ports("none") == ()
    for bad in ("8307-8300", "83a0", "70000", "8300-"):
        with pytest.raises(Exception, match="expected ports"):
            solos_check.parse_ports(bad)


def test_the_mesh_defaults_are_the_fleets():
    parser = solos_check.argparse.ArgumentParser()
    solos_check.add_arguments(parser)
    args = parser.parse_args([])
    assert args.a2a_ports == tuple(range(8300, 8308)) and args.a2a_skip == (8305,)


@pytest.mark.parametrize("timeout", ["-1", "0", "nan", "soon"])
def test_a_timeout_check_cannot_use_stops_it_naming_timeout(timeout):
    """`check --timeout -1` printed "Timeout value out of range" (the socket's words), naming no option."""
    argv = ["check", "--url", "http://127.0.0.1:1", "--writer", "atlas", "--reader", "sol", "--timeout", timeout]
    last = refused_at_start([*argv, "--a2a-ports", "none"])
    assert "--timeout" in last and "0.001 or more" in last, last


def test_storage_that_failed_a_moment_ago_fails_the_health_check(server):
    """/health answers 200 while a full disk refuses the agents' writes: the check says so."""
    server.server.memory.store.storage_failure = ("the disk holding the database is full", time.time())
    try:
        health = by_name(solos_check.run_checks(server.url, "atlas", "sol"))["health"]
    finally:
        server.server.memory.store.storage_failure = None
    assert not health.ok and "storage failing" in health.detail and "disk holding the database is full" in health.detail


def test_the_status_page_lists_failing_storage_first_and_recovered_storage_not_at_all():
    import solos_status

    last = {"reason": "the disk holding the database is full", "at": "2026-12-07T02:40:00Z"}
    failing = solos_status.problem_list({"storage": {"state": "failing", "last_failure": last}}, {})
    assert failing == ["storage failing (last at 2026-12-07T02:40:00Z): the disk holding the database is full"]
    assert solos_status.problem_list({"storage": {"state": "ok", "last_failure": last}}, {}) == []


def test_a_daily_job_that_failed_or_is_overdue_fails_the_health_check(server, token_server):
    """The page, /v1/stats and /metrics list a failed or overdue job as a problem (no snapshot since the disk
    filled); `check` passed: it read /health alone, which does not carry the jobs."""
    for running, tokens in ((server, {}), (token_server, {"writer_token": "atlas-token", "reader_token": "sol-token"})):
        assert by_name(solos_check.run_checks(running.url, "atlas", "sol", **tokens))["health"].ok
        with running.db() as conn:
            conn.execute(
                "INSERT INTO memory_job_run (job, started_at, ended_at, result, error) VALUES ('snapshot', "
                "'2026-12-07T02:00:00.000Z', '2026-12-07T02:00:01.000Z', 'failed', "
                "'OperationalError: database or disk is full')"
            )
        health = by_name(solos_check.run_checks(running.url, "atlas", "sol", **tokens))["health"]
        assert not health.ok, health.detail
        assert "snapshot failed: OperationalError: database or disk is full" in health.detail, health.detail
