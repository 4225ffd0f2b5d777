"""Row ids are never reused, and an event shows only the row it was logged for."""

from __future__ import annotations

import itertools
import json
import sqlite3

import pytest
from conftest import Stream, age, episode, purge, start_server, stop_server, subscribed, write_tokens
from hypothesis import HealthCheck, given, settings, strategies as st

import solos_memory
import solos_snapshot


def forget(server, agent: str, tier: str, row_id: int, headers: dict | None = None) -> int:
    query = {"agent": agent, "tier": tier, "id": row_id}
    return server.request("DELETE", "/v1/memory", query=query, headers=headers).status


def replay(server, agent: str, transport: str, headers: dict | None = None, **args) -> list[dict]:
    """Every event the agent sees from the start, over REST or MCP."""
    args = {"agent": agent, "since": 0, "limit": 1000, **args}
    if transport == "rest":
        query = {k: ",".join(v) if isinstance(v, list) else v for k, v in args.items()}
        reply = server.request("GET", "/v1/events", query=query, headers=headers)
        assert reply.status == 200, reply.body
        return reply.body["events"]
    reply = server.mcp_tool("read_events", args, headers=headers)
    return reply.body["result"]["structuredContent"]["events"]


@pytest.mark.slow
@pytest.mark.parametrize("tokens", [False, True])
def test_a_replayed_event_never_shows_the_next_writers_private_episode(make_server, tmp_path, tokens):
    config = {}
    atlas, sol = {}, {}
    if tokens:
        write_tokens(tmp_path / "tokens", {"atlas-token": "atlas", "sol-token": "sol"})
        config["tokens_file"] = str(tmp_path / "tokens")
        atlas, sol = {"Authorization": "Bearer atlas-token"}, {"Authorization": "Bearer sol-token"}
    server = make_server(**config)
    mine = episode(server, "atlas", "atlas drafted the rollout plan", atlas)
    assert forget(server, "atlas", "episodic", mine, atlas) == 200
    private = episode(server, "sol", "sol's private note about the salary review", sol)  # sol never opted in
    assert private != mine and private > mine
    for transport in ("rest", "mcp"):  # the write's row is gone, so only the forget shows
        events = replay(server, "atlas", transport, atlas, tiers=["episodic"], scope="own")
        assert [(e["kind"], e["row_id"], e["row"]) for e in events] == [("forget", mine, None)]
    stream = Stream(server, {"agent": "atlas", "tiers": "episodic", "scope": "own"}, {"Last-Event-ID": "0", **atlas})
    got = subscribed(stream).events(1)
    assert stream.quiet(0.3) == []
    stream.close()
    assert [(e["kind"], e["row_id"], e["row"]) for e in got] == [("forget", mine, None)]
    with server.db() as conn:
        assert conn.execute("SELECT count(*) FROM episodic_read_audit").fetchone()[0] == 0


def test_an_opted_in_authors_forgotten_episode_is_not_replaced_for_its_readers(server):
    server.request("PUT", "/v1/sharing", body={"agent": "atlas", "episodic": True})
    shared = episode(server, "atlas", "atlas shared the incident timeline")
    assert forget(server, "atlas", "episodic", shared) == 200
    server.request("PUT", "/v1/sharing", body={"agent": "nova", "episodic": True})
    nova = episode(server, "nova", "nova's episode about the billing migration")
    assert nova > shared
    events = replay(server, "sol", "rest", tiers=["episodic"], writers=["atlas"])
    assert [(e["kind"], e["row_id"], e["row"]) for e in events] == [("forget", shared, None)]
    with server.db() as conn:
        audited = conn.execute("SELECT reader, author, row_id FROM episodic_read_audit").fetchall()
    assert [tuple(r) for r in audited] == []  # nothing was handed out, so nothing is audited against atlas


@pytest.mark.parametrize("tier", ["short", "long", "episodic"])
def test_no_tier_reuses_the_id_of_a_forgotten_or_deleted_newest_row(server, tier):
    def write(agent: str, text: str) -> int:
        if tier == "short":
            reply = server.post("/v1/short", {"agent": agent, "key": text, "value": text, "ttl_s": 600})
        elif tier == "long":
            reply = server.post("/v1/long", {"agent": agent, "fact": text})
        else:
            reply = server.post("/v1/episodic", {"agent": agent, "event_type": "task", "summary": text})
        assert reply.status == 201, reply.body
        return reply.body["id"]

    seen = set()
    for round_ in range(3):
        row_id = write("atlas", f"atlas row {round_}")
        assert row_id not in seen
        seen.add(row_id)
        if tier == "short" and round_ == 1:
            assert server.request("DELETE", "/v1/short", query={"agent": "atlas", "key": "atlas row 1"}).status == 200
        else:
            assert forget(server, "atlas", tier, row_id) == 200
    with server.db() as conn:  # the fleet's own writer, after the newest row went: a fresh id, not a reused one
        table = solos_memory.TIER_TABLE[tier].table
        if tier == "long":
            direct = conn.execute("INSERT INTO memory_longterm (agent, fact) VALUES ('sol', 'direct')").lastrowid
        elif tier == "episodic":
            direct = conn.execute(
                "INSERT INTO memory_episodic (agent, event_type, summary) VALUES ('sol', 't', 'direct')"
            ).lastrowid
        else:
            direct = conn.execute(
                "INSERT INTO memory_short (agent, key, value, expires_at) VALUES ('sol', 'k', 'direct', '2999')"
            ).lastrowid
        assert direct > max(seen)
        assert conn.execute(f"SELECT agent FROM {table} WHERE id = ?", (direct,)).fetchone()[0] == "sol"
        assert conn.execute(f"SELECT count(*) FROM {table} WHERE agent = ''").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM memory_event WHERE agent = ''").fetchone()[0] == 0
    assert write("nova", "after the direct write") > direct


def test_a_new_episode_never_takes_an_id_the_archive_holds(server):
    old = [episode(server, "atlas", f"old drill {i}") for i in range(3)]
    age(server, old)
    purge(server)
    with server.db() as conn:
        assert [r[0] for r in conn.execute("SELECT id FROM memory_episodic_archive ORDER BY id")] == old
        assert conn.execute("SELECT count(*) FROM memory_episodic").fetchone()[0] == 0
    new = episode(server, "sol", "sol's fresh episode")
    assert new > max(old)
    assert forget(server, "atlas", "episodic", old[-1]) == 200  # the archived row's author can still forget it


def test_a_database_forgotten_into_before_the_marks_existed_gets_its_mark_from_the_retractions(tmp_path):
    path = tmp_path / "old.db"
    running = start_server(path)
    first = episode(running, "atlas", "one")
    second = episode(running, "atlas", "two")
    assert forget(running, "atlas", "episodic", second) == 200
    stop_server(running)
    with sqlite3.connect(path, isolation_level=None) as conn:  # as the previous release left it: no marks
        conn.execute("DELETE FROM solos_memory_meta WHERE key LIKE 'row_id_high:%'")
        conn.execute("DELETE FROM memory_event")
    running = start_server(path)
    try:
        assert episode(running, "sol", "three") > second > first
    finally:
        stop_server(running)


def test_a_restore_never_lowers_the_marks(tmp_path):
    path, folder = tmp_path / "live.db", tmp_path / "snaps"
    running = start_server(path)
    early = episode(running, "atlas", "before the snapshot")
    stop_server(running)
    solos_snapshot.take_snapshot(str(path), folder, keep=5, busy_timeout_ms=5000)
    running = start_server(path)
    late = episode(running, "atlas", "after the snapshot")
    stop_server(running)
    snapshot = solos_snapshot.manifests(folder)[-1]
    assert solos_memory.main(["restore", str(snapshot), "--db", str(path)]) == 0
    running = start_server(path)
    try:
        assert episode(running, "sol", "after the restore") > late > early
    finally:
        stop_server(running)


# ==== Property: random writes, forgets, archives, restores and replays by several agents ====

COUNTER = itertools.count()
AGENTS = ("atlas", "sol", "nova")
steps = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.sampled_from(AGENTS), st.sampled_from(("episodic", "long", "short"))),
        st.tuples(st.just("forget"), st.sampled_from(AGENTS), st.integers(0, 20)),
        st.tuples(st.just("share"), st.sampled_from(AGENTS), st.booleans()),
        st.tuples(st.just("archive"), st.just(""), st.just(0)),
        st.tuples(st.just("snapshot"), st.just(""), st.just(0)),
        st.tuples(st.just("restore"), st.just(""), st.just(0)),
        st.tuples(st.just("replay"), st.sampled_from(AGENTS), st.sampled_from(("own", "shared"))),
    ),
    min_size=1,
    max_size=25,
)


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=steps)
def test_an_event_shows_only_its_own_row_and_every_foreign_episode_read_is_audited(tmp_path_factory, plan):
    folder = tmp_path_factory.mktemp(f"ids{next(COUNTER)}")
    path, snaps = folder / "solos.db", folder / "snaps"
    running = start_server(path)
    written: dict[tuple[str, int], tuple[str, str]] = {}  # (tier, id) -> (writer, text): every row ever acknowledged
    live: list[tuple[str, int, str]] = []
    try:
        for n, (action, agent, arg) in enumerate(plan):
            if action == "write":
                text = f"{agent} wrote row {n} {next(COUNTER)}"
                if arg == "episodic":
                    row_id = episode(running, agent, text)
                elif arg == "long":
                    row_id = running.post("/v1/long", {"agent": agent, "fact": text}).body["id"]
                else:
                    row_id = running.post("/v1/short", {"agent": agent, "key": text, "value": text}).body["id"]
                assert (arg, row_id) not in written, f"{arg} id {row_id} was handed out twice"
                written[(arg, row_id)] = (agent, text)
                live.append((arg, row_id, agent))
            elif action == "forget" and live:
                tier, row_id, author = live.pop(arg % len(live))
                assert forget(running, author, tier, row_id) in (200, 404)  # 404: a restore took it back
            elif action == "share":
                running.request("PUT", "/v1/sharing", body={"agent": agent, "episodic": arg})
            elif action == "archive":
                with running.db() as conn:
                    conn.execute("UPDATE memory_episodic SET timestamp = '2020-01-01T00:00:00.000Z'")
                stop_server(running)
                assert solos_memory.main(["purge", "--db", str(path), "--archive-after-days", "30"]) == 0
                running = start_server(path)
            elif action in ("snapshot", "restore"):
                stop_server(running)
                if action == "snapshot":
                    solos_snapshot.take_snapshot(str(path), snaps, keep=3, busy_timeout_ms=5000)
                elif snaps.exists() and solos_snapshot.manifests(snaps):
                    newest = solos_snapshot.manifests(snaps)[-1]
                    assert solos_memory.main(["restore", str(newest), "--db", str(path)]) == 0
                running = start_server(path)
            elif action == "replay":
                with running.db() as conn:
                    audited_before = conn.execute("SELECT count(*) FROM episodic_read_audit").fetchone()[0]
                events = replay(running, agent, "rest", scope=arg, tiers=["short", "long", "episodic"])
                foreign_episodes = []
                for event in events:
                    if event["row"] is None:
                        continue
                    writer, text = written[(event["tier"], event["row_id"])]
                    assert event["agent"] == writer == event["row"]["agent"]
                    assert text in json.dumps(event["row"]), (event, text)
                    if event["tier"] == "episodic" and writer != agent:
                        foreign_episodes.append((agent, writer, event["row_id"]))
                with running.db() as conn:
                    audited = conn.execute(
                        "SELECT reader, author, row_id FROM episodic_read_audit ORDER BY id LIMIT -1 OFFSET ?",
                        (audited_before,),
                    ).fetchall()
                assert sorted(tuple(r) for r in audited) == sorted(foreign_episodes)
    finally:
        stop_server(running)


def test_an_event_never_renders_a_row_a_fleet_writer_put_at_its_id(server):
    """Explicit ids are the fleet's to choose; an event still shows only the row it was logged for."""
    server.request("PUT", "/v1/sharing", body={"agent": "sol", "episodic": True})
    mine = episode(server, "atlas", "atlas planned the audit")
    assert forget(server, "atlas", "episodic", mine) == 200
    with server.db() as conn:  # sol's own writer, choosing the freed id itself
        conn.execute(
            "INSERT INTO memory_episodic (id, agent, event_type, summary) VALUES (?, 'sol', 'task', 'sol payroll')",
            (mine,),
        )
    events = replay(server, "atlas", "rest", tiers=["episodic"])
    written = [e for e in events if e["kind"] == "write"]
    assert [(e["agent"], e["row"]["summary"]) for e in written] == [("sol", "sol payroll")]  # under its own event
    assert all(e["row"] is None or e["row"]["agent"] == e["agent"] for e in events)
