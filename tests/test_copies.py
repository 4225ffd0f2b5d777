"""Several copies of the service over one PostgreSQL database: each test
starts copies of the real service on one fresh database, as hosts of a cluster would run them, and checks
what they must agree on: recall across copies with both legs, streams that resume on any copy, a forget gone
everywhere, background work done once, and which copy answered."""

from __future__ import annotations

import collections
import hashlib
import json
import socket
import subprocess
import sys
import threading
import time

import pytest
from conftest import ROOT, PoisonRowEmbedder, Stream, WordHashEmbedder, subscribed, wait_until

import solos_embed_worker
import solos_memory

pytestmark = pytest.mark.slow

np = pytest.importorskip("numpy")
psycopg = pytest.importorskip("psycopg")

WAIT_S = 10.0
LISTEN = "LISTEN solos_memory_event"  # what a copy's listening connection last ran (pg_stat_activity.query)


class CountingEmbedder:
    """A deterministic stand-in for the model (a text's vector: its words' hashed directions, summed) that counts
    every text it embeds, in a tally its copies share. `together`: the first call waits for the other copies'
    first call, so their passes overlap."""

    dim = 64
    model_id = "word-hash-copies"

    def __init__(self, tally: collections.Counter, lock: threading.Lock, together: threading.Barrier | None = None):
        self.tally, self.lock, self.together, self.calls = tally, lock, together, 0

    def vector(self, text: str) -> np.ndarray:
        total = np.zeros(self.dim, dtype=np.float32)
        for word in text.lower().split():
            seed = int.from_bytes(hashlib.sha256(word.encode()).digest()[:4], "little")
            total += np.random.default_rng(seed).standard_normal(self.dim).astype(np.float32)
        return total / max(float(np.linalg.norm(total)), 1e-9)

    def embed(self, texts: list[str]) -> list[bytes]:
        with self.lock:
            self.calls += 1
            first = self.calls == 1
            self.tally.update(texts)
        if first and self.together is not None:
            self.together.wait(timeout=WAIT_S)
        time.sleep(0.01)  # a batch takes a moment, as the model's does
        return [self.vector(text).astype("<f4").tobytes() for text in texts]


def sql(url: str, query: str, params: tuple = ()) -> list[tuple]:
    """One statement as the database's owner, as the fleet's other writers and an operator reach it."""
    with psycopg.connect(url, autocommit=True) as conn:
        cursor = conn.execute(query, params)
        return cursor.fetchall() if cursor.description else []


def hybrid_recall(copy, q: str, **query) -> dict:
    reply = copy.recall("sol", q, min_relevance=0, **query)
    assert reply.status == 200, reply.body
    return reply.body


def indexed(copy, tier: str, row_id: int) -> bool:
    """The copy's vector index holds the row (its snapshot, or the rows added since)."""
    vectors = copy.server.memory.vectors
    ids = vectors.tiers.get(tier, (np.zeros(0),))[0]
    return row_id in set(ids.tolist()) or row_id in vectors.recent.get(tier, {})


# ==== 1 and 4: a write through one copy, recalled through another at once, by both legs ====


def test_a_write_through_one_copy_ranks_by_both_legs_on_another_at_once(copies):
    tally, lock = collections.Counter(), threading.Lock()
    a, b = copies(CountingEmbedder(tally, lock)), copies(CountingEmbedder(tally, lock))
    for n in range(5):  # each copy's vector index holds a snapshot, which the other's write leaves behind
        assert b.post("/v1/long", {"agent": "sol", "topic": "misc", "fact": f"unrelated note {n} on lunch"}).status
    for copy in (a, b):
        assert hybrid_recall(copy, "lunch note")["ranking"] == "hybrid"
        # The reload a new generation starts has not landed (at 100k rows it takes a third of a second, here
        # under one): the other copy's row must rank by its vector all the same.
        copy.server.memory.vectors.reload_soon = lambda store: None

    for copy, other, fact in (
        (a, b, "The backup job runs nightly at 02:00 UTC"),
        (b, a, "Gateway certs rotate monthly"),
    ):
        written = copy.post("/v1/long", {"agent": "atlas", "topic": "ops", "fact": fact})
        assert written.status == 201, written.body
        answer = hybrid_recall(other, fact.split(" ", 1)[1])  # at once: no wait for the reload
        top = answer["results"][0]
        assert (top["id"], top["agent"], top["foreign"]) == (written.body["id"], "atlas", True)
        assert answer["ranking"] == "hybrid" and answer["receipt"]["legs"] == ["keyword", "vector"]
        assert answer["receipt"]["without_vector"] == 0, answer["receipt"]  # its vector, from the database
        assert answer["degraded"] is False
        assert tally[f"atlas (ops): {fact}"] == 1  # embedded once, by the copy that wrote it


# ==== 2: streams across copies ====


def subscribe(copy, query: dict, last_event_id: int | None = None) -> Stream:
    """A stream on one copy, registered by its hub (optionally resuming after an event id)."""
    headers = {} if last_event_id is None else {"Last-Event-ID": str(last_event_id)}
    return subscribed(Stream(copy, query, headers))


def test_a_stream_on_one_copy_is_woken_by_another_copys_commit_even_after_its_listener_reconnects(copies, pg_url):
    a, b = copies(), copies()
    b.server.memory.events.poll_s = 60.0  # only LISTEN/NOTIFY can wake copy B's hub in time
    listener = b.server.memory.events.listener
    wait_until(listener.listening.is_set, "copy B to listen")
    stream = subscribe(b, {"agent": "sol", "tiers": "long"})
    try:
        first = a.post("/v1/long", {"agent": "atlas", "fact": "written through copy A"}).body["id"]
        started = time.monotonic()
        seen = stream.event(timeout=3.0)
        assert seen is not None and seen["row_id"] == first, seen
        assert time.monotonic() - started < 2.0

        # The database drops the copies' listening connections (a restart, a failover): they listen again.
        listening = "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND query = %s"
        before = {pid for (pid,) in sql(pg_url, listening, (LISTEN,))}
        assert len(before) == 2
        sql(pg_url, "SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) pid", (sorted(before),))
        wait_until(
            lambda: len({pid for (pid,) in sql(pg_url, listening, (LISTEN,))} - before) == 2, "both to listen again"
        )
        second = a.post("/v1/long", {"agent": "atlas", "fact": "written after the reconnect"}).body["id"]
        seen = stream.event(timeout=3.0)
        assert seen is not None and seen["row_id"] == second, seen
    finally:
        stream.close()


def test_a_subscriber_resumes_on_another_copy_with_nothing_missing_and_nothing_twice(copies):
    a, b, c = copies(), copies(), copies()
    total, writers = 1000, (a, b, c)
    written: list[int] = []
    written_lock = threading.Lock()

    def write(copy, n0: int) -> None:
        for n in range(n0, total, len(writers)):
            agent = ("atlas", "hermes", "nova")[n % 3]
            reply = copy.post("/v1/long", {"agent": agent, "topic": f"t{n % 7}", "fact": f"event number {n} of many"})
            assert reply.status == 201, reply.body
            with written_lock:
                written.append(reply.body["id"])

    query = {"agent": "sol", "tiers": "long"}
    stream = subscribe(b, query)
    threads = [threading.Thread(target=write, args=(copy, i)) for i, copy in enumerate(writers)]
    for thread in threads:
        thread.start()
    got: list[dict] = []
    try:
        while len(got) < total // 2:  # on copy B until half have come, then hang up mid-flight
            event = stream.event(timeout=WAIT_S)
            assert event is not None, f"{len(got)} of {total} events arrived on copy B"
            got.append(event)
        stream.close()
        stream = subscribe(c, query, last_event_id=got[-1]["id"])  # and resume on copy C
        while len(got) < total:
            event = stream.event(timeout=WAIT_S)
            assert event is not None, f"{len(got)} of {total} events arrived, then nothing on copy C"
            got.append(event)
        assert stream.event(timeout=0.5) is None  # nothing more, and nothing twice
    finally:
        stream.close()
        for thread in threads:
            thread.join()
    ids = [event["id"] for event in got]
    assert ids == sorted(set(ids))  # in order, none repeated
    assert [event["kind"] for event in got] == ["write"] * total
    assert sorted(event["row_id"] for event in got) == sorted(written)  # none missing


# ==== 5: a forget through one copy, gone from every copy ====


def test_a_forget_through_one_copy_is_gone_from_recall_and_the_vector_index_of_every_copy(copies, pg_url):
    tally, lock = collections.Counter(), threading.Lock()
    every = [copies(CountingEmbedder(tally, lock)) for _ in range(3)]
    a, b, c = every
    kept = a.post("/v1/long", {"agent": "nova", "topic": "pets", "fact": "the office cat is called Biscuit"})
    fact = a.post("/v1/long", {"agent": "atlas", "topic": "pets", "fact": "the office dog is called Pretzel"})
    row_id = fact.body["id"]
    for copy in every:
        wait_until(
            lambda copy=copy: row_id in ids_of(hybrid_recall(copy, "office dog Pretzel", ranking="vector")),
            "each copy's vector leg to find the row",
        )
        assert indexed(copy, "long", row_id)

    forgot = c.request("DELETE", "/v1/memory", query={"agent": "atlas", "tier": "long", "id": row_id})
    assert forgot.status == 200 and forgot.body["status"] == "forgotten", forgot.body
    for copy in every:
        for ranking in ("hybrid", "keyword", "vector"):
            found = ids_of(hybrid_recall(copy, "office dog Pretzel", ranking=ranking))
            assert row_id not in found, (copy.server.memory.copy, ranking)
        assert kept.body["id"] in ids_of(hybrid_recall(copy, "office cat Biscuit"))
        wait_until(lambda copy=copy: not indexed(copy, "long", row_id), "the row to leave every vector index")
    wait_until(lambda: sql(pg_url, "SELECT count(*) FROM memory_scrub_pending") == [(0,)], "the VACUUM")
    assert sql(pg_url, "SELECT count(*) FROM memory_longterm WHERE strpos(fact, 'Pretzel') > 0") == [(0,)]


def ids_of(answer: dict) -> list[int]:
    return [result["id"] for result in answer["results"]]


# ==== Embedding: no two copies embed one row ====


def test_two_copies_backfilling_embed_each_row_exactly_once(copies, pg_url):
    tally, lock, together = collections.Counter(), threading.Lock(), threading.Barrier(2)
    embedders = [CountingEmbedder(tally, lock, together) for _ in range(2)]
    running = [copies(embedder) for embedder in embedders]
    facts = [f"fleet note {n} written around the service" for n in range(200)]
    with psycopg.connect(pg_url, autocommit=True) as conn:  # the fleet's direct writes: no vector yet
        with conn.cursor() as cursor:
            cursor.executemany(
                "INSERT INTO memory_longterm (agent, topic, fact) VALUES ('nova', 'n', %s)", [(f,) for f in facts]
            )

    def both_embedding() -> bool:  # both passes at once, as at each copy's 30 s sweep
        for copy in running:  # again until both run: a wake during a copy's start-up pass may be spent on it
            copy.server.memory.worker.wake.set()
        return all(embedder.calls for embedder in embedders)

    wait_until(both_embedding, "both copies to embed", WAIT_S / 2)
    wait_until(
        lambda: sql(pg_url, "SELECT count(*) FROM memory_vector WHERE tier = 'long'") == [(200,)],
        "every row's vector",
    )
    texts = {f"nova (n): {fact}" for fact in facts}
    assert {text: n for text, n in tally.items() if text in texts} == dict.fromkeys(texts, 1)
    assert all(embedder.calls for embedder in embedders)  # both copies took part
    wait_until(lambda: sql(pg_url, "SELECT count(*) FROM memory_embed_claim") == [(0,)], "the claims' release")


def test_a_claim_holds_rows_from_other_copies_until_it_lapses(pg_url):
    import solos_store_pg

    one, two = solos_store_pg.PgStore(pg_url), solos_store_pg.PgStore(pg_url)
    try:
        one.migrate()
        sql(pg_url, "INSERT INTO agent_registry (agent) VALUES ('nova')")
        sql(pg_url, "INSERT INTO memory_longterm (agent, fact) SELECT 'nova', 'row ' || n FROM generate_series(1, 5) n")
        claimed = [row["id"] for row in one.rows_missing_vectors("long", "m", 3)]
        rest = [row["id"] for row in two.rows_missing_vectors("long", "m", 10)]
        assert len(claimed) == 3 and len(rest) == 2 and not set(claimed) & set(rest)
        assert two.rows_missing_vectors("long", "m", 10) == []  # all five are claimed
        sql(
            pg_url,
            "UPDATE memory_embed_claim SET until = '2000-01-01T00:00:00.000Z' WHERE row_id = ANY(%s)",
            (claimed,),
        )
        assert (
            sorted(row["id"] for row in two.rows_missing_vectors("long", "m", 10)) == claimed
        )  # lapsed: a dead copy's
    finally:
        one.close()
        two.close()


def test_a_write_waits_for_its_rows_vector_while_another_copys_pass_embeds_it(pg_url):
    import solos_store_pg

    tally, lock = collections.Counter(), threading.Lock()
    embedder = CountingEmbedder(tally, lock)
    writer, other = solos_store_pg.PgStore(pg_url), solos_store_pg.PgStore(pg_url)
    writer.migrate()
    worker = solos_embed_worker.EmbedWorker(writer, embedder)  # not started: only the write's own embedding runs
    try:
        sql(pg_url, "INSERT INTO agent_registry (agent) VALUES ('nova')")
        written = writer.upsert_long("nova", "ops", "certs rotate monthly", None, None, [])
        # Between the write's commit and its own embedding, another copy's background pass claims the row.
        (theirs,) = other.rows_missing_vectors("long", embedder.model_id, 10)
        blob = embedder.embed(["nova (ops): certs rotate monthly"])[0]
        saver = threading.Timer(0.3, lambda: other.save_vectors("long", embedder.model_id, [(theirs, blob)]))
        saver.start()
        started = time.monotonic()
        left = worker.embed_rows("long", [written["id"]], None, solos_embed_worker.WRITE_EMBED_TIMEOUT_S)
        waited = time.monotonic() - started
        saver.join()
        # Acknowledged only once the vector is saved, by the pass that holds the claim: embedded once.
        assert left == [] and 0.25 <= waited < solos_embed_worker.WRITE_EMBED_TIMEOUT_S, waited
        assert sql(pg_url, "SELECT row_id FROM memory_vector WHERE tier = 'long'") == [(written["id"],)]
        assert embedder.calls == 1

        # Another pass caught claiming the row (its lock held, no claim committed yet), then letting it go: the
        # write waits, claims it itself and embeds it, rather than going on without a vector.
        again = writer.upsert_long("nova", "ops", "gateway certs rotate monthly", None, None, [])
        locked, release = threading.Event(), threading.Event()

        def claiming() -> None:
            with psycopg.connect(pg_url) as conn:
                conn.execute("SELECT id FROM memory_longterm WHERE id = %s FOR UPDATE", (again["id"],))
                locked.set()
                release.wait(WAIT_S)
                conn.rollback()

        holder = threading.Thread(target=claiming)
        holder.start()
        assert locked.wait(WAIT_S)
        threading.Timer(0.3, release.set).start()
        started = time.monotonic()
        left = worker.embed_rows("long", [again["id"]], None, solos_embed_worker.WRITE_EMBED_TIMEOUT_S)
        waited = time.monotonic() - started
        holder.join()
        assert left == [] and 0.25 <= waited < solos_embed_worker.WRITE_EMBED_TIMEOUT_S, waited
        assert embedder.calls == 2 and tally["nova (ops): gateway certs rotate monthly"] == 1
        assert sql(pg_url, "SELECT count(*) FROM memory_vector WHERE tier = 'long'") == [(2,)]
    finally:
        worker.stop()
        writer.close()
        other.close()


# ==== 6: background work once across copies; a job outlives the copy running it ====

DYING_RUN = """
import sys, time
sys.path.insert(0, {root!r})
import solos_jobs, solos_store_pg

def work():
    print("running", flush=True)
    time.sleep(60)

solos_jobs.recorded(solos_store_pg.PgStore({url!r}), "purge", work)
"""


def job_runs(url: str) -> list[tuple[str, str]]:
    return sql(url, "SELECT job, result FROM memory_job_run ORDER BY id")


def purge_on(hosts: int, url: str) -> list[int]:
    """`purge` as each host's timer starts it, all at once: their exit statuses."""
    statuses: list[int] = []
    threads = [
        threading.Thread(target=lambda: statuses.append(solos_memory.main(["purge", "--db", url])))
        for _ in range(hosts)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return statuses


def test_daily_jobs_run_once_across_copies_and_outlive_a_copy_killed_mid_run(copies, pg_url, capsys):
    a, b = copies(), copies()
    dying = subprocess.Popen(
        [sys.executable, "-c", DYING_RUN.format(root=str(ROOT), url=pg_url)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert dying.stdout is not None and dying.stdout.readline().strip() == "running"
        assert a.get("/v1/stats").body["jobs"]["purge"]["state"] == "running"
        assert solos_memory.main(["purge", "--db", pg_url]) == 0  # another host's timer meanwhile
        assert "another copy is running it now" in capsys.readouterr().err
        assert job_runs(pg_url) == [("purge", "running"), ("archive", "ok")]
    finally:
        dying.kill()  # kill -9 of the copy running the job
        dying.wait()
    purge = wait_until(
        lambda: (state := b.get("/v1/stats").body["jobs"]["purge"])["state"] == "failed" and state,
        "the dead run to show as failed",
    )
    assert "never ended" in purge["detail"] and purge["problem"] is True

    assert purge_on(3, pg_url) == [0, 0, 0]  # the next day's timers on three hosts at once
    skips = [json.loads(line) for line in capsys.readouterr().err.splitlines() if '"job_skipped"' in line]
    assert sorted(skip["job"] for skip in skips) == ["archive", "archive", "archive", "purge", "purge"]
    assert job_runs(pg_url) == [("purge", "running"), ("archive", "ok"), ("purge", "ok")]  # once each
    jobs = a.get("/v1/stats").body["jobs"]
    assert (jobs["purge"]["state"], jobs["archive"]["state"]) == ("ok", "ok")
    assert jobs == b.get("/v1/stats").body["jobs"]


def test_a_jobs_turn_is_held_on_a_connection_the_server_drops_within_minutes_of_its_host_dying(pg_url, monkeypatch):
    # The turn's connection is idle for the whole run: a host that died without a word (power, network) was
    # noticed by the server only at its default TCP keepalive (2 h 11 min), and the job showed "running" until.
    import solos_copies
    import solos_jobs
    import solos_store_pg

    store = solos_store_pg.PgStore(pg_url, admin=True)
    store.migrate()
    opened: list = []

    def connect():
        opened.append(store_connect())
        return opened[-1]

    store_connect = store.connect
    monkeypatch.setattr(store, "connect", connect)
    seen: dict = {}

    def work() -> int:
        turn = opened[0]  # the job's turn, taken first; the run records its row on the pool's connections
        held = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted"
        assert turn.execute(held).fetchone()[0] == 1
        seen.update({name: turn.execute(f"SHOW {name}").fetchone()[0] for name in solos_copies.KEEPALIVE})
        return 0

    try:
        assert solos_jobs.recorded(store, "purge", work) == 0
    finally:
        store.close()
    assert seen == {name: str(value) for name, value in solos_copies.KEEPALIVE.items()}, seen
    assert 0 < solos_copies.dead_turn_s() <= 5 * 60


def test_the_sweep_the_pruning_and_the_vacuum_wait_for_another_copys_turn(copies, pg_url):
    a, b = copies(), copies()
    with psycopg.connect(pg_url, autocommit=True) as other:  # another copy, in the middle of each in turn
        other.execute("BEGIN")
        other.execute("SELECT pg_advisory_xact_lock(8437, 1)")  # solos_copies.EXPIRY_SWEEP
        short = [
            copy.post("/v1/short", {"agent": "atlas", "key": f"k{n}", "value": "gone soon", "ttl_s": 0.3}).body["id"]
            for n, copy in enumerate((a, b, a, b))
        ]
        time.sleep(2.5)  # both copies' sweeps come round twice (each second), and skip
        expired = "SELECT row_id, count(*) FROM memory_event WHERE kind = 'expire' GROUP BY row_id ORDER BY row_id"
        assert sql(pg_url, expired) == []
        other.execute("COMMIT")
        wait_until(lambda: len(sql(pg_url, expired)) == len(short), "the expiry events")
        time.sleep(1.5)
        assert sql(pg_url, expired) == [(row_id, 1) for row_id in short]  # once each, by one copy or the other

        sql(pg_url, "UPDATE memory_event SET ts = '2000-01-01T00:00:00.000Z'")  # past the retention
        other.execute("BEGIN")
        other.execute("SELECT pg_advisory_xact_lock(8437, 2)")  # solos_copies.EVENT_PRUNE
        assert a.server.memory.events.prune() == 0
        other.execute("COMMIT")
        assert a.server.memory.events.prune() == 2 * len(short) and b.server.memory.events.prune() == 0

        other.execute("SELECT pg_advisory_lock(8437, 3)")  # solos_copies.FORGET_VACUUM
        a.server.memory.scrubber.retry_s = 0.2
        fact = a.post("/v1/long", {"agent": "atlas", "fact": "a fact to forget"}).body["id"]
        forgot = a.request("DELETE", "/v1/memory", query={"agent": "atlas", "tier": "long", "id": fact})
        assert forgot.body["wal_checkpoint"] == "pending"
        time.sleep(1.0)  # the scrubber asks again every 0.2 s; another copy's VACUUM holds the turn
        assert sql(pg_url, "SELECT tier FROM memory_scrub_pending") == [("long",)]
        other.execute("SELECT pg_advisory_unlock(8437, 3)")
        wait_until(lambda: sql(pg_url, "SELECT count(*) FROM memory_scrub_pending") == [(0,)], "the VACUUM")


def test_a_copy_hears_every_writer_but_its_own_notifier_and_its_index_still_takes_its_writes(pg_url, monkeypatch):
    """Each of the notifier's NOTIFYs woke the copy's own listener, hub and index thread, for writes whose answer
    had already woken the hub and marked the index (about 0.2 ms of CPU a write, bench/store_compare.py): the
    listener skips the NOTIFYs of its own copy's notifier, and wakes for any other copy's or fleet writer's."""
    import solos_pg_keyword
    import solos_store_pg

    monkeypatch.setattr(solos_pg_keyword, "POLL_S", 3600.0)  # the index applies on a wake or a marked write only
    admin = solos_store_pg.PgStore(pg_url, admin=True)
    admin.migrate()
    admin.register_agents(["atlas"])
    admin.close()
    store, other = solos_store_pg.PgStore(pg_url), solos_store_pg.PgStore(pg_url)
    woken = threading.Event()
    listener = store.listen(woken.set)
    try:
        wait_until(listener.listening.is_set, "the copy to listen")
        index = store.keyword
        wait_until(lambda: index.health() == "ready", "the copy's keyword index to fill")
        woken.clear()
        own = store.upsert_long("atlas", "ops", "the quokka rota is Kim", None, None, [])["id"]
        wait_until(lambda: listener.ignored == 1, "the listener to hear its own notifier")
        assert not woken.is_set()
        held = "SELECT count(*) FROM memory_longterm_fts WHERE rowid = ?"
        wait_until(lambda: index.writer.execute(held, (own,)).fetchone()[0] == 1, "the index to take its own write")

        theirs = other.upsert_long("atlas", "ops", "the wombat rota is Lee", None, None, [])["id"]
        wait_until(woken.is_set, "another copy's notifier to wake the listener")
        wait_until(lambda: index.writer.execute(held, (theirs,)).fetchone()[0] == 1, "the index to take theirs")
        with psycopg.connect(pg_url, autocommit=True) as fleet:
            woken.clear()
            fleet.execute("INSERT INTO memory_longterm (agent, fact) VALUES ('atlas', 'written by the fleet')")
            wait_until(woken.is_set, "a fleet writer's commit to wake the listener")
        assert listener.ignored == 1 and listener.heard >= 3
    finally:
        listener.stop()
        store.close()
        other.close()


# ==== 5 of the build: which copy answered, and the database's counts ====


def test_each_copy_says_which_answered_and_shows_the_clusters_counts(copies):
    every = [copies(copy_name="host-a"), copies(copy_name="host-b"), copies()]
    names = ["host-a", "host-b", f"{socket.gethostname()}:{every[2].port}"]
    for n, copy in enumerate(every):
        assert copy.post("/v1/long", {"agent": "atlas", "fact": f"fact {n} written through a copy"}).status == 201
        assert copy.recall("sol", "fact written").status == 200
        copy.server.memory.activity.save()  # as each copy does every minute
    shared = None
    for copy, name in zip(every, names):
        assert copy.get("/health").body["copy"] == name
        stats = copy.get("/v1/stats").body
        assert stats["copy"] == name
        assert f'solos_memory_copy_info{{copy="{name}"}} 1' in copy.get("/metrics").raw.decode()
        assert f", copy {name}, up " in copy.get("/").raw.decode()
        counts = (stats["rows"], stats["agents"], stats["jobs"], stats["activity"]["day"]["recalls"])
        assert counts == (shared or counts)
        shared = counts
    assert shared is not None and shared[0]["long"] == 3 and shared[3] == {"sol": 3}  # every copy's recalls


def test_the_services_writes_notify_after_their_commit_and_every_other_writer_as_it_commits(pg_url):
    """A NOTIFY in a write transaction holds the notify queue's lock from its commit until its WAL flush, so
    concurrent writers queued for each other's flush. The service's one-statement writes leave it to the store's
    notifier, after the commit, even once the notifier's session is cut; a transaction of the service's and the
    fleet's direct writes still NOTIFY as they commit. Every listener hears each of them."""
    import solos_store
    import solos_store_pg

    admin = solos_store_pg.PgStore(pg_url, admin=True)
    admin.migrate()
    admin.register_agents(["atlas"])
    admin.close()
    store = solos_store_pg.PgStore(pg_url)
    try:
        with psycopg.connect(pg_url, autocommit=True) as listener, psycopg.connect(pg_url, autocommit=True) as fleet:
            listener.execute(LISTEN)

            def notified_by() -> set[int]:
                return {note.pid for note in listener.notifies(timeout=3.0, stop_after=1)}

            store.upsert_long("atlas", "ops", "written in one statement", None, None, [])
            assert notified_by() == {store.notifier.pid}
            wait_until(lambda: store.notifier.sent >= 1, "the notifier to count what it sent")  # after NOTIFY returns
            writer = store.read(lambda conn: conn.info.backend_pid)  # the pool's connection, reused (LIFO)
            assert writer != store.notifier.pid

            solos_store.Store.upsert_long(store, "atlas", "ops", "written step by step", None, None, [])
            assert notified_by() == {writer}
            fleet.execute("INSERT INTO memory_longterm (agent, fact) VALUES ('atlas', 'written by the fleet')")
            assert notified_by() == {fleet.info.backend_pid}

            sql(pg_url, "SELECT pg_terminate_backend(%s)", (store.notifier.pid,))
            cut = store.notifier.pid
            store.upsert_long("atlas", "ops", "written after the notifier's session was cut", None, None, [])
            wait_until(lambda: store.notifier.pid != cut, "the notifier to connect again")
            assert notified_by() == {store.notifier.pid}
    finally:
        store.close()


def test_first_pokes_from_many_writers_at_once_start_the_notifier_once():
    """Without a lock, every writer whose poke finds the thread not yet alive calls Thread.start: two OS threads
    then run one notify loop, and one dies in threading's bookkeeping."""
    import solos_copies

    notifier = solos_copies.Notifier("postgresql://127.0.0.1:1/none")
    starts = []

    def slow_start() -> None:  # the window in which another writer's poke also finds it not alive
        starts.append(threading.get_ident())
        time.sleep(0.05)

    notifier.start = slow_start  # type: ignore[method-assign]
    gate = threading.Barrier(8)

    def writer() -> None:
        gate.wait()
        notifier.poke()

    writers = [threading.Thread(target=writer) for _ in range(8)]
    for thread in writers:
        thread.start()
    for thread in writers:
        thread.join()
    assert len(starts) == 1
    assert notifier.poked.is_set()


# ==== 7: copies of different releases over one schema ====


def test_a_copy_of_an_earlier_schema_leaves_a_later_one_alone_and_says_so(pg_url):
    # A copy on an older tree, started (or restarted by systemd) mid-rollout, applied its own schema_pg.sql over
    # the later one: the later copies kept serving on its older functions and triggers (a short row written
    # already expired was no longer listed for its expire event) and the digest a member login checks was its.
    import solos_store
    import solos_store_pg

    def meta(key: str) -> list[tuple]:
        return sql(pg_url, "SELECT value FROM solos_memory_meta WHERE key = %s", (key,))

    store = solos_store_pg.PgStore(pg_url, admin=True)
    store.migrate()
    store.close()
    ours = solos_store_pg.SCHEMA_PG_REVISION
    assert meta("schema_pg_revision") == [(str(ours),)]
    sql(pg_url, "UPDATE solos_memory_meta SET value = %s WHERE key = 'schema_pg_revision'", (str(ours + 1),))
    sql(pg_url, "UPDATE solos_memory_meta SET value = 'a later release' WHERE key = 'schema_pg_sha256'")
    with pytest.raises(solos_store.SchemaMismatch, match=f"revision {ours + 1}.*this copy's is {ours}"):
        solos_store_pg.PgStore(pg_url, admin=True).migrate()
    assert meta("schema_pg_sha256") == [("a later release",)]  # not applied over it

    # A release from before revisions were recorded leaves the revision as it was and writes its own digest: the
    # next start of a current copy applies this schema again.
    sql(pg_url, "UPDATE solos_memory_meta SET value = %s WHERE key = 'schema_pg_revision'", (str(ours),))
    store = solos_store_pg.PgStore(pg_url, admin=True)
    store.migrate()
    store.close()
    ours_digest = solos_store_pg.schema_digest(solos_store.read_resource("schema_pg.sql").decode())
    assert meta("schema_pg_sha256") == [(ours_digest,)]


def test_a_copy_whose_clock_runs_ahead_does_not_make_the_next_days_run_skip(pg_url, monkeypatch):
    # Each copy stamped a run's end with its own clock and measured "within its period" with its own: a run on a
    # host 3 hours ahead read as 3 hours later than it was, and every other host's timer the next day skipped the
    # job ("it succeeded ... within its period"), so the cluster went a day without a purge.
    import types

    import solos_jobs
    import solos_store_pg

    store = solos_store_pg.PgStore(pg_url, admin=True)
    store.migrate()
    real = time.time
    ahead = types.SimpleNamespace(
        **{name: getattr(time, name) for name in ("monotonic", "sleep", "strftime", "gmtime")}
    )
    ahead.time = lambda: real() + 3 * 3600
    try:
        monkeypatch.setattr(solos_jobs, "time", ahead)
        assert solos_jobs.recorded(store, "purge", lambda: 0) == 0  # the host whose clock is 3 hours ahead
        monkeypatch.setattr(solos_jobs, "time", time)
        (ended,) = sql(pg_url, "SELECT ended_at FROM memory_job_run WHERE job = 'purge'")[0]
        day_later = solos_jobs.stamp(solos_jobs.seconds(ended) - 22.5 * 3600)  # as if that run was 22.5 hours ago
        sql(pg_url, "UPDATE memory_job_run SET ended_at = %s WHERE job = 'purge'", (day_later,))
        assert solos_jobs.recorded(store, "purge", lambda: 0) == 0  # a host on time: not skipped
        assert sql(pg_url, "SELECT result FROM memory_job_run WHERE job = 'purge' ORDER BY id") == [("ok",), ("ok",)]
    finally:
        store.close()


def test_a_copy_starting_while_the_fleet_holds_a_write_open_neither_waits_nor_stops_the_others(
    copies, pg_url, monkeypatch
):
    # Every start applied schema_pg.sql in one transaction, and CREATE INDEX IF NOT EXISTS locks its table (SHARE)
    # before it finds the index there: a copy (re)starting while a fleet writer's transaction was open on a tier
    # waited for it with no bound, holding the tables it had locked already, and every other copy's writes to
    # them were 503 busy for as long as that transaction lived.
    import solos_store
    import solos_store_pg

    a = copies()
    assert a.post("/v1/long", {"agent": "atlas", "fact": "before the restart"}).status == 201
    with psycopg.connect(pg_url) as fleet:  # a transaction of the fleet's, open across the start
        fleet.execute("INSERT INTO memory_episodic (agent, event_type, summary) VALUES ('atlas', 't', 'open')")
        started = threading.Event()

        def restart() -> None:
            solos_store_pg.PgStore(pg_url, admin=True).migrate()  # the same release starting again
            started.set()

        threading.Thread(target=restart, daemon=True).start()
        assert started.wait(WAIT_S / 2), "the start waited for the fleet's transaction"
        assert a.post("/v1/long", {"agent": "atlas", "fact": "while another copy starts"}).status == 201

        # A start that must apply a changed schema waits a bounded time, then says what holds it up.
        monkeypatch.setattr(solos_store_pg, "SCHEMA_LOCK_TIMEOUT_MS", 300)
        sql(pg_url, "UPDATE solos_memory_meta SET value = 'an earlier file' WHERE key = 'schema_pg_sha256'")
        begun = time.monotonic()
        with pytest.raises(solos_store.StorageUnavailable, match="another transaction holds"):
            solos_store_pg.PgStore(pg_url, admin=True).migrate()
        assert time.monotonic() - begun < WAIT_S / 2
        assert a.post("/v1/long", {"agent": "atlas", "fact": "after the refused start"}).status == 201
        fleet.rollback()
    solos_store_pg.PgStore(pg_url, admin=True).migrate()  # applied once the fleet's transaction ended
    digest = solos_store_pg.schema_digest(solos_store.read_resource("schema_pg.sql").decode())
    assert sql(pg_url, "SELECT value FROM solos_memory_meta WHERE key = 'schema_pg_sha256'") == [(digest,)]


def test_rows_a_broken_embedder_failed_on_are_free_at_once_and_a_poison_rows_claim_holds(pg_url):
    """The embedder fails on every row of a batch (it is broken, not the rows): its claims are released, so another
    copy embeds those rows now rather than after the claim lapses (CLAIM_S). It held them 60 s, and a broken copy
    went on claiming a new batch at each wake. A row the embedder fails on alone keeps its claim until it lapses:
    the copies' shared backoff, so a row that fails every time is not retried by each copy at each pass."""
    import solos_store_pg

    broken_store, healthy_store = solos_store_pg.PgStore(pg_url), solos_store_pg.PgStore(pg_url)
    try:
        broken_store.migrate()
        sql(pg_url, "INSERT INTO agent_registry (agent) VALUES ('nova')")
        sql(pg_url, "INSERT INTO memory_longterm (agent, fact) SELECT 'nova', 'row ' || n FROM generate_series(1, 5) n")
        broken = WordHashEmbedder(fail_after=0)
        with pytest.raises(RuntimeError, match="embedder broke"):
            solos_embed_worker.embed_missing(broken_store, broken)
        assert sql(pg_url, "SELECT count(*) FROM memory_embed_claim") == [(0,)]
        assert solos_embed_worker.embed_missing(healthy_store, WordHashEmbedder()) == 5

        sql(pg_url, "INSERT INTO memory_longterm (agent, fact) VALUES ('nova', 'a poison row'), ('nova', 'row 6')")
        poisoned: dict = {}
        assert solos_embed_worker.embed_missing(broken_store, PoisonRowEmbedder(), passed_over=poisoned) == 1
        assert len(poisoned) == 1
        assert sql(pg_url, "SELECT count(*) FROM memory_embed_claim") == [(1,)]
        assert solos_embed_worker.embed_missing(healthy_store, PoisonRowEmbedder()) == 0  # held: not tried again
    finally:
        broken_store.close()
        healthy_store.close()
