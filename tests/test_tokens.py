"""Who is calling: bearer tokens as the service reads them (the header, the tokens file, the `token` command,
PostgreSQL's `memory_token`) and as the client sends them. Each test attacks from outside, over HTTP."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, direct, start_server, stop_server, subscribed, wait_until, write_tokens

import solos_check
import solos_langgraph
import solos_memory
import solos_tokens
from solos_client import Client, UsageError


def bearer(token: str, scheme: str = "Bearer") -> dict[str, str]:
    return {"Authorization": f"{scheme} {token}"}


# ==== the Authorization header ====


@pytest.mark.parametrize("header", ["bearer atlas-token", "BEARER atlas-token", "Bearer\tatlas-token"])
def test_the_scheme_name_is_read_in_any_case_and_after_any_space(token_server, header):
    """RFC 9110 11.1: the scheme is a case-insensitive token, and a tab is whitespace. A client (or a profile's
    header typed by hand) sending `bearer <token>` was told the service "needs the calling agent's token in the
    Authorization header": it had sent it."""
    server = token_server
    recalled = server.request("GET", "/v1/recall?q=x", headers={"Authorization": header})
    assert (recalled.status, recalled.body.get("agent")) == (200, "atlas"), recalled.body
    called = server.mcp_tool("recall", {"q": "x"}, {"Authorization": header})
    assert called.status == 200 and called.body["result"]["structuredContent"]["agent"] == "atlas", called.body


@pytest.mark.parametrize("header", ["Basic YXRsYXMtdG9rZW4=", "Token atlas-token", "Bearer", "atlas-token"])
def test_another_scheme_or_no_token_is_a_401_saying_so(token_server, header):
    refused = token_server.request("GET", "/v1/recall?q=x", headers={"Authorization": header})
    assert refused.status == 401 and "atlas-token" not in refused.raw.decode(), refused.body


# ==== the tokens file ====


def hashed(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def test_a_hash_given_to_two_agents_is_refused_never_read_as_the_last(tmp_path, make_server):
    """A token's hash on two lines with two agents (a line copied and edited, a token given to another agent by
    adding a line) made the token speak for whichever line came last, silently."""
    tokens = tmp_path / "tokens"
    write_tokens(tokens, {"atlas-token": "atlas"})
    with open(tokens, "a") as handle:
        handle.write(f"{hashed('atlas-token')} sol\n")
    with pytest.raises(SystemExit, match=r"tokens:2: .*line 1.*atlas.*sol"):
        solos_memory.Tokens.load(str(tokens))

    write_tokens(tokens, {"atlas-token": "atlas"})
    server = make_server(tokens_file=str(tokens))
    with open(tokens, "a") as handle:  # while it runs: refused, saying why, until the file is mended
        handle.write(f"{hashed('atlas-token')} sol\n")
    refused = server.request("GET", "/v1/recall?q=x", headers=bearer("atlas-token"))
    assert refused.status == 503 and "line 1" in refused.body["error"]["message"], refused.body


def test_the_token_command_starts_its_line_after_a_last_line_with_no_newline(tmp_path, make_server):
    """A tokens file whose last line has no newline (edited by hand, written by printf) got the new hash glued
    to that line: every running worker then refused every request (503) and the next start failed."""
    tokens = tmp_path / "tokens"
    write_tokens(tokens, {"atlas-token": "atlas"})
    tokens.write_text(tokens.read_text().rstrip("\n"))
    server = make_server(tokens_file=str(tokens))
    command = [sys.executable, str(ROOT / "solos_memory.py"), "token", "sol", "--tokens-file", str(tokens)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    sol = run.stdout.strip()
    for token, agent in (("atlas-token", "atlas"), (sol, "sol")):
        recalled = server.request("GET", "/v1/recall?q=x", headers=bearer(token))
        assert (recalled.status, recalled.body.get("agent")) == (200, agent), recalled.body


def test_a_bom_an_upper_case_hash_and_crlf_lines_are_read_as_meant(tmp_path, make_server):
    """A tokens file saved by a Windows editor (a BOM, CRLF) or holding a hash printed in upper case (as
    PowerShell's Get-FileHash and some sha256 tools do) stopped the start with "tokens:1: expected '<sha256
    hex> <agent>'", about a line that reads exactly so."""
    tokens = tmp_path / "tokens"
    write_tokens(tokens, {})
    lines = f"\ufeff{hashed('atlas-token').upper()} atlas\r\n{hashed('sol-token')} sol  \r\n"
    tokens.write_bytes(lines.encode("utf-8"))
    assert solos_memory.Tokens.load(str(tokens)).by_hash == {hashed("atlas-token"): "atlas", hashed("sol-token"): "sol"}
    server = make_server(tokens_file=str(tokens))
    for token, agent in (("atlas-token", "atlas"), ("sol-token", "sol")):
        recalled = server.request("GET", "/v1/recall?q=x", headers=bearer(token))
        assert (recalled.status, recalled.body.get("agent")) == (200, agent), recalled.body


def test_an_empty_tokens_file_setting_stops_the_start_instead_of_trusting_every_caller(tmp_path):
    """SOLOS_MEMORY_TOKENS_FILE= in lab-memory.env (or --tokens-file "" from a template whose variable was unset)
    asked for tokens and started in loopback trust, silently: with --allow-remote, anyone could read and write
    any agent's memory. It now stops the start in one line, as a tokens file that cannot be read does."""
    with pytest.raises(SystemExit, match="--tokens-file is empty"):
        solos_memory.build_server(solos_memory.Config(db=str(tmp_path / "x.db"), port=0, tokens_file=""))
    command = [sys.executable, str(ROOT / "solos_memory.py"), "serve", "--db", str(tmp_path / "y.db"), "--port", "0"]
    run = subprocess.run(
        [*command, "--model-dir", "off", "--workers", "2"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "SOLOS_MEMORY_TOKENS_FILE": ""},
    )
    assert run.returncode == 1 and run.stderr.strip().splitlines()[-1].startswith("--tokens-file is empty"), run.stderr


def test_the_token_commands_tokens_file_wins_over_the_environments_postgresql_url(tmp_path, make_server):
    """serve takes --tokens-file over tokens kept in PostgreSQL ("still works and wins"), but `token atlas
    --tokens-file F` in a shell holding SOLOS_MEMORY_DB=postgresql://... (lab-memory.env sourced) was refused with
    "give --tokens-file, or --db with a postgresql:// URL": it had been given."""
    tokens = tmp_path / "tokens"
    command = [sys.executable, str(ROOT / "solos_memory.py"), "token", "atlas", "--tokens-file", str(tokens)]
    environment = {**os.environ, "SOLOS_MEMORY_DB": "postgresql://nobody@127.0.0.1:1/unreached"}
    run = subprocess.run(command, capture_output=True, text=True, timeout=60, env=environment)
    assert run.returncode == 0, run.stderr
    server = make_server(tokens_file=str(tokens))
    recalled = server.request("GET", "/v1/recall?q=x", headers=bearer(run.stdout.strip()))
    assert (recalled.status, recalled.body.get("agent")) == (200, "atlas"), recalled.body


@pytest.mark.parametrize("spoil", ["chmod", "delete", "garble"])
def test_a_tokens_file_spoiled_while_running_refuses_every_call_without_naming_its_folder(token_server, spoil):
    """Any caller, without a token too, got the 503 naming the tokens file's full path (the operator's home and
    layout); SECURITY.md keeps machine paths to the operator's view. The log line keeps it."""
    tokens = Path(token_server.server.config.tokens_file)
    {"chmod": lambda: tokens.chmod(0o644), "delete": tokens.unlink, "garble": lambda: tokens.write_text("x\n")}[spoil]()
    for headers in ({}, bearer("atlas-token")):
        refused = token_server.request("GET", "/v1/recall?q=x&agent=atlas", headers=headers)
        message = refused.body["error"]["message"]
        assert refused.status == 503 and "tokens" in message and str(tokens.parent) not in message, message


# ==== tokens kept in PostgreSQL ====


def test_revoking_the_last_stored_token_refuses_every_call_and_never_opens_the_door(pg_url, capsys, monkeypatch):
    """Tokens kept in the database were on "while any exists": deleting the last row (an agent's tokens
    revoked, a rotation that deletes before it issues) turned every copy back to loopback trust within 5 s, so
    anyone could read and write any agent's memory by naming it."""
    monkeypatch.setattr(solos_tokens.StoredTokens, "REREAD_S", 0.2)
    copy = start_server(pg_url)
    try:
        assert solos_memory.main(["token", "atlas", "--db", pg_url]) == 0
        token = capsys.readouterr().out.strip()
        wait_until(lambda: copy.get("/v1/recall", agent="atlas", q="x").status == 401, "tokens on")
        direct(pg_url, "DELETE FROM memory_token")
        time.sleep(0.5)
        anonymous = copy.get("/v1/recall", agent="atlas", q="x")
        assert anonymous.status == 401, anonymous.body
        assert copy.request("GET", "/v1/recall?q=x", headers=bearer(token)).status == 401
        assert copy.mcp_tool("recall", {"agent": "atlas", "q": "x"}).status == 401
        assert copy.get("/health").body["auth"] == "tokens"
    finally:
        stop_server(copy)


def test_a_stream_opened_before_the_first_token_ends_once_tokens_are_on(pg_url, capsys, monkeypatch, streams):
    """A stream opened under loopback trust (no token yet in the database) was never asked again: once the
    first token was issued, every other call needed one, but that stream went on handing the agent it named
    every new row, for as long as it stayed open."""
    monkeypatch.setattr(solos_tokens.StoredTokens, "REREAD_S", 0.2)
    copy = start_server(pg_url)
    try:
        copy.server.memory.events.heartbeat_s = 0.2
        stream = subscribed(streams(copy, {"agent": "sol", "scope": "shared"}))
        assert solos_memory.main(["token", "atlas", "--db", pg_url]) == 0
        atlas = bearer(capsys.readouterr().out.strip())
        wait_until(lambda: copy.get("/v1/recall", agent="atlas", q="x").status == 401, "tokens on")
        assert copy.post("/v1/long", {"fact": "written once tokens are on"}, headers=atlas).status == 201
        message = stream.next(timeout=10)
        assert message is not None and message.get("event") == "error", message
        assert "written once tokens are on" not in json.dumps(message)
        assert stream.closed.wait(10)
    finally:
        stop_server(copy)


# ==== the client's token ====


def test_the_clients_token_loses_its_line_ending_and_bom_and_never_shows_in_an_error(token_server, tmp_path, caplog):
    """A token read from a CRLF .env or a token file saved with a BOM could not be sent: http.client refused the
    header and its message quoted it, so the token went into the Unavailable error, the breaker's last error,
    best-effort's warning log line and the empty result handed to the agent's turn."""
    server = token_server
    assert Client(server.url, token="atlas-token\r\n").recall("x")["agent"] == "atlas"
    (tmp_path / "atlas.token").write_bytes(b"\xef\xbb\xbfatlas-token\r\n")
    from_file = Client.from_env(
        {"SOLOS_MEMORY_URL": server.url, "SOLOS_MEMORY_TOKEN_FILE": str(tmp_path / "atlas.token")}
    )
    assert from_file.recall("x")["agent"] == "atlas"
    for unsendable in ("atlas-token-s3cret\u2603", "atlas-token s3cret", "atlas-token\rs3cret"):
        with pytest.raises(UsageError) as refused:
            Client(server.url, token=unsendable).recall("x")
        assert "s3cret" not in str(refused.value) and "token" in str(refused.value)
        soft = Client(server.url, token=unsendable, best_effort=True).recall("x")
        assert soft["results"] == [] and "s3cret" not in json.dumps(soft)
    assert "s3cret" not in caplog.text


@pytest.mark.parametrize("token", ["atlas-token\r\n", "atlas-token\rs3cret"])
def test_the_langgraph_writer_sends_a_token_without_its_line_ending_and_never_quotes_one(token_server, token):
    """store_memory's token from a CRLF environment file could not be sent, and the StoreMemoryError it raised
    quoted http.client's message, token and all."""
    try:
        point = solos_langgraph.store_memory("atlas", "ops", "kept by token", url=token_server.url, token=token)
    except solos_langgraph.StoreMemoryError as error:
        assert "s3cret" in token and "s3cret" not in str(error) and error.field == "token", error
    else:
        assert "s3cret" not in token and point


def test_a_token_that_yaml_read_as_a_number_is_still_sent(make_server, tmp_path):
    """plugins.solos.token in Hermes' config.yaml is handed over as YAML read it: a token of digits is an int."""
    write_tokens(tmp_path / "tokens", {"20261207": "atlas"})
    server = make_server(tokens_file=str(tmp_path / "tokens"))
    assert Client(server.url, token=20261207).recall("x")["agent"] == "atlas"  # type: ignore[arg-type]


# ==== DNS rebinding with tokens on ====


@pytest.mark.parametrize("path", ["/mcp", "/v1/recall?q=x"])
@pytest.mark.parametrize("token", [None, "guess", "atlas-token"])
def test_with_tokens_on_a_rebound_name_is_403_before_any_token_is_looked_at(token_server, path, token):
    """SECURITY.md: every route answers 403 to a rebound Host. With tokens on, /mcp asked for the token first:
    401 without one, and a rebound page (which reads its answers: it is same-origin) could tell a known token
    from an unknown one by 401 or 403."""
    headers = {"Host": f"evil.example:{token_server.port}", "MCP-Protocol-Version": "2025-11-25"}
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    method = "POST" if path == "/mcp" else "GET"
    reply = token_server.request(
        method,
        path,
        body if method == "POST" else None,
        headers={**headers, **bearer(token or "")} if token else headers,
    )
    assert reply.status == 403 and "DNS rebinding" in reply.raw.decode(), (reply.status, reply.raw[:200])


# ==== the rollout check's tokens ====


def test_the_rollout_check_strips_its_tokens_and_never_prints_one(token_server, monkeypatch, capsys):
    """SOLOS_CHECK_WRITER_TOKEN from a CRLF environment file stopped `check` at its first call with http.client's
    "Invalid header value b'Bearer <token>\\r\\n'" on stderr: the token in the rollout's log, no check run."""
    monkeypatch.setenv("SOLOS_CHECK_READER_TOKEN", "sol-token")
    monkeypatch.setenv("SOLOS_CHECK_WRITER_TOKEN", "atlas-token\r\n")
    assert solos_check.main(["--url", token_server.url, "--a2a-ports", "none"]) == 0, capsys.readouterr()
    monkeypatch.setenv("SOLOS_CHECK_WRITER_TOKEN", "atlas-token\rs3cret")
    assert solos_check.main(["--url", token_server.url, "--a2a-ports", "none"]) == 2
    printed = capsys.readouterr()
    assert "s3cret" not in printed.out + printed.err and "writer" in printed.err, printed
