"""Rollout checks (solos_check) against live services: all pass on a sound one, each fails when its part breaks."""

from __future__ import annotations

import ipaddress
import itertools
import json
import sys

import pytest
from conftest import ROOT, skip_or_fail

import solos_check
import solos_memory
import solos_rank

CHECK_NAMES = ["loopback only", "health", "cross-agent echo", "long row delta", "mcp tools", "degraded mode"]


def by_name(results: list[solos_check.CheckResult]) -> dict[str, solos_check.CheckResult]:
    return {result.name: result for result in results}


def failed(results: list[solos_check.CheckResult]) -> list[str]:
    return [result.name for result in results if not result.ok]


def check_rows(server) -> list[dict]:
    with server.db() as conn:
        return [
            dict(row)
            for row in conn.execute(
                "SELECT id, agent, fact, source, tags FROM memory_longterm WHERE source = 'solos-check' ORDER BY id"
            )
        ]


def test_every_check_passes_against_a_live_service(server, capsys):
    assert solos_check.main(["--url", server.url, "--writer", "atlas", "--reader", "sol"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert [line.split("  ")[0].strip() for line in table[:6]] == CHECK_NAMES
    assert all("  PASS  " in line for line in table[:6])
    assert table[6] == "6/6 checks passed"
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
    assert by_name(results)["mcp tools"].detail.startswith("tools/list lacks write_long, stats; it lists delete_short")


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
        if len(calls) == 2:  # between the first attempt's writes and its second count
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

    def upsert_without_write_key(store, agent, topic, fact, *rest):
        return real(store, agent, topic, f"{fact} (copy {next(serial)})", *rest)

    monkeypatch.setattr(solos_memory.Store, "upsert_long", upsert_without_write_key)
    result = by_name(solos_check.run_checks(server.url, "atlas", "sol"))["long row delta"]
    assert not result.ok and "changed rows.long by 5, then by 5 on retry" in result.detail


def test_missing_degraded_header_fails(server, monkeypatch):
    monkeypatch.setattr(solos_memory, "degraded_header", lambda result: {})
    results = solos_check.run_checks(server.url, "atlas", "sol")
    assert failed(results) == ["degraded mode"]
    assert by_name(results)["degraded mode"].detail == "body says degraded true but X-Memory-Degraded is None"


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
    assert solos_check.main(["--url", token_server.url]) == 0
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
    assert solos_check.main(["--url", f"http://127.0.0.1:{port}", "--timeout", "1"]) == 1
    out = capsys.readouterr().out
    assert "0/6 checks passed" in out and "--cleanup" not in out


@pytest.mark.slow
def test_the_cleanup_hint_names_the_program_that_ran(server, tmp_path):
    """Run from the .pyz, the hint names the .pyz and its check subcommand, not solos_memory.py."""
    import subprocess

    pyz = tmp_path / "solos-memory.pyz"
    subprocess.run([sys.executable, str(ROOT / "pyz_build.py"), "--out", str(pyz)], check=True, capture_output=True)
    run = subprocess.run(
        [sys.executable, str(pyz), "check", "--url", server.url], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stdout + run.stderr
    hint = run.stdout.splitlines()[-1]
    assert f"python3 {pyz} check --cleanup --db PATH" in hint and "solos_memory.py" not in hint
