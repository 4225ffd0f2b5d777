"""Group commit (solos_store.Store.run): writes queued behind the lock's holder share its next transaction, each
in its own savepoint, so one writer's refusal or error undoes only its own changes, and a busy database fails
them all, none acknowledged."""

import sqlite3
import threading

import pytest
from conftest import wait_until

import solos_store


@pytest.fixture
def store(tmp_path):
    admin = solos_store.Store(str(tmp_path / "solos.db"), admin=True)
    admin.migrate()
    admin.register_agents(["atlas", "sol"])
    admin.close()
    store = solos_store.Store(str(tmp_path / "solos.db"), busy_timeout_ms=2000)
    commits: list[int] = []
    connect = store.connect

    def traced() -> solos_store.PooledConnection:
        conn = connect()
        conn.set_trace_callback(lambda sql: sql == "COMMIT" and commits.append(threading.get_ident()))
        return conn

    store.connect = traced
    store.commits = commits
    yield store
    store.close()


def facts(store) -> list[str]:
    return store.read(lambda conn: [row[0] for row in conn.execute("SELECT fact FROM memory_longterm ORDER BY id")])


def queue_behind_a_holder(store, works, while_held=lambda: None):
    """Run `works` as writes while the test holds the store's write lock; once all are queued, let them go
    (after `while_held`). Returns each work's outcome, in order: its result, or the exception it raised."""
    outcomes: list = [None] * len(works)

    def write(n, work):
        try:
            outcomes[n] = store.write(work)
        except Exception as error:
            outcomes[n] = error

    threads = [threading.Thread(target=write, args=(n, work)) for n, work in enumerate(works)]
    with store.write_lock:
        for thread in threads:
            thread.start()
        wait_until(lambda: len(store.queued) == len(works), "every write queued behind the holder")
        while_held()
    for thread in threads:
        thread.join(10)
    return outcomes


def long_fact(store, text, agent="atlas"):
    return lambda conn: store.put_long(conn, agent, "t", text, None, None, [])


def test_writes_queued_behind_the_holder_commit_together(store):
    outcomes = queue_behind_a_holder(store, [long_fact(store, f"fact {n}") for n in range(5)])
    assert [o["status"] for o in outcomes] == ["created"] * 5
    assert len({o["id"] for o in outcomes}) == 5
    assert len(store.commits) == 1  # whoever took the lock first committed all five
    assert sorted(facts(store)) == [f"fact {n}" for n in range(5)]


def test_a_refused_write_undoes_only_its_own_changes(store):
    def refused(conn):
        store.put_long(conn, "atlas", "t", "half written", None, None, [])
        raise solos_store.Conflict("refused after writing", "fact")

    def violates(conn):
        conn.execute("INSERT INTO memory_longterm (agent, fact) VALUES ('sol', 'half written too')")
        conn.execute("INSERT INTO memory_longterm (agent, fact) VALUES ('sol', NULL)")  # NOT NULL

    works = [long_fact(store, "before"), refused, long_fact(store, "from nobody", "nobody"), violates]
    works.append(long_fact(store, "after"))
    outcomes = queue_behind_a_holder(store, works)
    assert outcomes[0]["status"] == "created" and outcomes[4]["status"] == "created"
    assert isinstance(outcomes[1], solos_store.Conflict)
    assert isinstance(outcomes[2], solos_store.UnknownAgent)
    assert isinstance(outcomes[3], sqlite3.IntegrityError)
    assert len(store.commits) == 1
    assert sorted(facts(store)) == ["after", "before"]


def test_a_busy_database_fails_the_whole_batch_and_acknowledges_none(store, tmp_path):
    foreign = sqlite3.connect(tmp_path / "solos.db", isolation_level=None)
    store.busy_timeout_ms = 1000
    try:  # the fleet's writer takes the database's write lock while the writes queue
        outcomes = queue_behind_a_holder(
            store, [long_fact(store, f"fact {n}") for n in range(3)], lambda: foreign.execute("BEGIN IMMEDIATE")
        )
    finally:
        foreign.execute("ROLLBACK")
        foreign.close()
    assert all(isinstance(o, solos_store.Busy) for o in outcomes), outcomes
    assert store.commits == []
    assert facts(store) == []


def test_writes_queued_past_the_busy_timeout_are_refused_unrun_and_the_next_write_leads_afresh(store):
    store.busy_timeout_ms = 300
    outcomes: list = [None] * 4

    def write(n):
        try:
            outcomes[n] = store.write(long_fact(store, f"fact {n}"))
        except Exception as error:
            outcomes[n] = error

    threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    with store.write_lock:  # held past every writer's busy timeout
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
    assert all(isinstance(o, solos_store.Busy) for o in outcomes), outcomes
    assert store.queued == [] and store.commits == []
    assert store.write(long_fact(store, "afterwards"))["status"] == "created"
    assert facts(store) == ["afterwards"]


def test_a_write_that_waited_keeps_only_what_is_left_of_its_budget_and_one_that_did_not_keeps_it_all(store):
    statements: list[str] = []
    connect = store.connect

    def traced() -> solos_store.PooledConnection:
        conn = connect()
        conn.set_trace_callback(lambda sql: sql.startswith("PRAGMA busy_timeout") and statements.append(sql))
        return conn

    store.connect = traced
    store.upsert_long("atlas", "ops", "a write alone", None, None, [])
    assert statements == []  # nothing queued: the connection's own 2,000 ms is the budget, untouched

    def hold() -> None:  # long enough to use more than the slack of the queued write's budget
        threading.Event().wait((solos_store.BUSY_SLACK_MS + 100) / 1000)

    (outcome,) = queue_behind_a_holder(
        store, [lambda conn: store.put_long(conn, "sol", "ops", "a write that queued", None, None, [])], hold
    )
    assert outcome["status"] == "created"
    shortened, restored = statements
    assert int(shortened.split("=")[1]) < 2000 - solos_store.BUSY_SLACK_MS  # it waits only for what is left
    assert restored == "PRAGMA busy_timeout=2000"  # and the pooled connection gets its full timeout back
    statements.clear()
    store.upsert_long("atlas", "ops", "the next write alone", None, None, [])
    assert statements == []
