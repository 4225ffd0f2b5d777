"""PostgreSQL: what the serving role may do. The service works as `solos_memory_service`,
which reads `memory_token` and never writes it: a token is issued by the `token` command, which works as the
URL's user. A service logging in as a member of that role only (not the owner) starts on a schema the owner
applied, so `RESET ROLE` gives SQL on its connection nothing more."""

from __future__ import annotations

import hashlib
import os
import threading

import pytest
from conftest import AGENTS, RunningServer, start_server, stop_server, wait_until

import solos_memory

pytestmark = pytest.mark.slow

psycopg = pytest.importorskip("psycopg")

WRITES = (
    "INSERT INTO memory_token (token_sha256, agent) VALUES ('{digest}', 'mallory')",
    "UPDATE memory_token SET agent = 'mallory'",
    "DELETE FROM memory_token",
    "TRUNCATE memory_token",
)


def minted(url: str) -> list[str]:
    with psycopg.connect(url, autocommit=True) as conn:
        return [row[0] for row in conn.execute("SELECT agent FROM memory_token ORDER BY agent")]


@pytest.fixture
def member_login(pg_url):
    """A login user that is a member of solos_memory_service and owns nothing; its URL (the schema applied by
    the owner first, as SECURITY.md says). Roles are the cluster's: a unique name, dropped after."""
    import solos_store_pg

    owner = solos_store_pg.PgStore(pg_url, admin=True)
    owner.migrate()
    owner.register_agents(list(AGENTS))  # the fleet's registry is the owner's to write
    owner.close()
    role = f"solos_login_{os.getpid()}_{id(pg_url) % 10**6}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN IN ROLE solos_memory_service")
    yield pg_url.replace("postgresql://postgres@", f"postgresql://{role}@")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s AND pid <> pg_backend_pid()",
            (role,),
        )
        conn.execute(f"DROP OWNED BY {role}; DROP ROLE {role}")


def serve_as(url: str) -> RunningServer:
    """The service on url, registering nobody: conftest's start_server registers its agents, which only the
    owner may."""
    server = solos_memory.build_server(solos_memory.Config(db=url, port=0, model_dir="off", log_requests=False))
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True).start()
    return RunningServer(server, url)


def test_the_serving_role_reads_tokens_and_cannot_write_them(pg_url, capsys):
    assert solos_memory.main(["token", "atlas", "--db", pg_url]) == 0  # the token command: the URL's user
    token = capsys.readouterr().out.strip()
    running = start_server(pg_url)
    try:
        mine = running.request("GET", "/v1/recall?q=x", headers={"Authorization": f"Bearer {token}"})
        assert (mine.status, mine.body["agent"]) == (200, "atlas")  # the serving role reads the hashes
        conn = running.server.memory.store.connect()  # a serving connection, as the service's SQL runs
        try:
            assert conn.execute("SELECT current_user").fetchone()[0] == "solos_memory_service"
            for statement in WRITES:
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(statement.format(digest=hashlib.sha256(b"minted").hexdigest()))
        finally:
            conn.close()
    finally:
        stop_server(running)
    assert minted(pg_url) == ["atlas"]


def test_a_service_logged_in_as_a_member_of_the_role_serves_and_cannot_mint_even_after_reset_role(pg_url, member_login):
    running = serve_as(member_login)  # the owner applied the schema; the member may not, and need not
    try:
        assert running.post("/v1/long", {"agent": "atlas", "fact": "served by a member"}).status == 201
        conn = running.server.memory.store.connect()
        try:
            conn.execute("RESET ROLE")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(WRITES[0].format(digest=hashlib.sha256(b"minted").hexdigest()))
        finally:
            conn.close()
    finally:
        stop_server(running)
    assert minted(pg_url) == []
    with pytest.raises(SystemExit):  # the token command needs the owner's URL: the member may not write tokens
        solos_memory.main(["token", "atlas", "--db", member_login])


APPEND_ONLY = ("memory_retraction", "episodic_read_audit")  # the audit trail: inserted and read, never rewritten
REWRITES = ("UPDATE {table} SET row_id = 0", "DELETE FROM {table}", "TRUNCATE {table}")


def leave_a_trail(running: RunningServer) -> None:
    """Every operation that writes or reads the audit trail, each answered: a foreign episode read (audited), the
    audit read, a forget of each tier (a retraction each, a notice to the reader), the notices read and acked."""
    assert running.request("PUT", "/v1/sharing", body={"agent": "atlas", "episodic": True}).status in (200, 201)
    episode = running.post("/v1/episodic", {"agent": "atlas", "event_type": "ops", "summary": "atlas rotated keys"})
    fact = running.post("/v1/long", {"agent": "atlas", "fact": "the vault key rotates weekly"})
    short = running.post("/v1/short", {"agent": "atlas", "key": "k", "value": "rotating now"})
    assert (episode.status, fact.status, short.status) == (201, 201, 201), (episode.body, fact.body, short.body)
    recalled = running.get("/v1/recall", agent="sol", q="rotated key rotates", tiers="episodic,long", k=10)
    assert {r["id"] for r in recalled.body["results"]} >= {episode.body["id"], fact.body["id"]}, recalled.body
    reads = running.get("/v1/audit", agent="atlas").body["reads"]
    assert [(r["reader"], r["row_id"]) for r in reads] == [("sol", episode.body["id"])]
    for tier, row in (("episodic", episode.body["id"]), ("long", fact.body["id"]), ("short", short.body["id"])):
        gone = running.request("DELETE", "/v1/memory", query={"agent": "atlas", "tier": tier, "id": row})
        assert (gone.status, gone.body["status"]) == (200, "forgotten"), gone.body
    notices = running.get("/v1/notices", agent="sol").body["notices"]
    assert notices, "the reader of a forgotten row is told"
    acked = running.post("/v1/notices/ack", {"agent": "sol", "ids": [n["id"] for n in notices]})
    assert acked.status == 200, acked.body
    assert running.get("/v1/stats").status == 200


def trail(url: str) -> list[tuple]:
    with psycopg.connect(url, autocommit=True) as conn:
        return [tuple(row) for table in APPEND_ONLY for row in conn.execute(f"SELECT * FROM {table} ORDER BY id")]


def assert_rewrites_refused(conn) -> None:
    for table in APPEND_ONLY:
        for statement in REWRITES:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement.format(table=table))


def test_the_serving_role_cannot_rewrite_the_audit_trail_and_every_operation_still_works(pg_url):
    running = start_server(pg_url)
    try:
        leave_a_trail(running)
        conn = running.server.memory.store.connect()
        try:
            assert conn.execute("SELECT current_user").fetchone()[0] == "solos_memory_service"
            assert_rewrites_refused(conn)
        finally:
            conn.close()
    finally:
        stop_server(running)
    before = trail(pg_url)
    assert len(before) == 4, before  # one read audited, three retractions
    assert solos_memory.main(["purge", "--db", pg_url]) == 0  # the daily job works as the role too
    assert trail(pg_url) == before


def test_a_member_of_the_role_cannot_rewrite_the_audit_trail_even_after_reset_role(pg_url, member_login):
    running = serve_as(member_login)
    try:
        leave_a_trail(running)
        conn = running.server.memory.store.connect()
        try:
            conn.execute("RESET ROLE")
            assert_rewrites_refused(conn)
        finally:
            conn.close()
    finally:
        stop_server(running)
    assert len(trail(pg_url)) == 4


def forget_and_vacuum(running: RunningServer, capfd) -> list[str]:
    """Write a fact, forget it, wait for the VACUUM after it; the log's vacuum lines."""
    try:
        row = running.post("/v1/long", {"agent": "atlas", "fact": "a secret to forget"}).body["id"]
        reply = running.request("DELETE", "/v1/memory", query={"agent": "atlas", "tier": "long", "id": row})
        assert reply.status == 200, reply.body
        store = running.server.memory.store
        wait_until(lambda: store.clear_forgotten(0), "the forget's VACUUM", timeout_s=30)
    finally:
        stop_server(running)
    return [line for line in capfd.readouterr().err.splitlines() if "vacuum" in line]


def test_a_forget_served_by_a_member_says_its_vacuum_was_skipped_not_done(pg_url, member_login, capfd):
    """PostgreSQL 15 lets only a table's owner VACUUM it: a member's VACUUM after a forget is skipped with a
    warning, and the service's log says so instead of claiming the dead tuples are gone."""
    events = forget_and_vacuum(serve_as(member_login), capfd)
    assert any('"event": "vacuum_skipped"' in line and "autovacuum" in line for line in events), events
    assert not any('"event": "forgotten_vacuumed"' in line for line in events), events


def test_a_forget_served_by_the_owner_says_its_tables_were_vacuumed(pg_url, capfd):
    events = forget_and_vacuum(start_server(pg_url), capfd)
    assert any('"event": "forgotten_vacuumed"' in line for line in events), events
    assert not any('"event": "vacuum_skipped"' in line for line in events), events
