#!/usr/bin/env python3
"""The acceptance checks against the real cluster: three service copies over Patroni/PostgreSQL.

    .venv/bin/python deploy/cluster/acceptance.py [--state DIR] [--base-port N] [--failovers N]

Starts `cluster.py up --services 3` (3 etcd, 3 Patroni/PostgreSQL 15 in synchronous mode, HAProxy, three copies
of the service over HAProxy's primary port) and one SQLite service on a temp file, then checks and prints:

- (1) a write through one copy is recallable through another at once (keyword recall: the copies run with
  --model-dir off);
- (7) the bench, side by side: recall p50/p99 and write throughput, serial on one keep-alive connection and
  with 16 concurrent clients, for the SQLite service, 1 copy and 3 copies, with ratios;
- (3) `kill -9` of one copy during 16 REST writers spread over the copies: every acknowledged write is there;
- (4) `kill -9` of the database leader's whole node (Patroni and postmaster) during 16 writers: how long until
  writes are acknowledged again (bar: 15 s), every acknowledged write is there, and every answer during the
  switch was a success or a 503 with Retry-After, never an empty success, a 500 or a dropped connection.

Writers retry a write that got a connection error or a 503 on the next copy after 0.1 s (not after
Retry-After's seconds: the pause would hide how fast the service recovers). The retry sends the same fact, so a
write that committed before its answer was lost comes back 200 `unchanged` with the same id.

Loopback only. Every wait has a deadline; the run takes about 3-4 minutes and an alarm ends it at 8. At the end,
on failure and on Ctrl-C it stops what it started (`cluster.py down`, the SQLite service, its temp folder). By
default it uses its own state folder and ports, so it runs beside a `cluster.py up` on the defaults. Exit
status 0 only if every check passed. Needs psycopg (the checkout's .venv has it).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cluster  # noqa: E402 - the folder beside this file

# ==== Configuration ====

DEFAULT_STATE = Path("/tmp/solos-acceptance")
DEFAULT_BASE_PORT = 27500  # not cluster.py's 27400: a developer's cluster may run there
COPIES = 3
WRITERS = 16
AGENTS = ("atlas", "sol")
ALARM_S = 480  # (plus 60 s per extra failover) the backstop: whatever hangs, the run ends and cleans up
UP_TIMEOUT_S = 240  # cluster.py's own stages give up sooner (etcd 30 s, Patroni 120 s, HAProxy 30 s, copies 90 s)
REVIVE_TIMEOUT_S = 150
DOWN_TIMEOUT_S = 120
SQLITE_START_S = 30
HTTP_TIMEOUT_S = 20  # a request hanging this long is a failure of its own (the service's busy timeout is 5 s)
RETRY_PAUSE_S = 0.1
WARMUP_S = 5.0  # writers run this long before a kill
AFTER_COPY_KILL_S = 5.0
RECOVERY_BAR_S = 15.0  # check 4's bar: writes acknowledged again within this
RECOVERY_DEADLINE_S = 40.0  # past this, check 4 stops waiting and fails
TAIL_S = 4.0  # writers keep going this long after writes came back, so late failures show
VERIFY_TIMEOUT_S = 30.0
RECALL_SAMPLE = 20  # acknowledged writes looked up by recall on a surviving copy, besides the event feed
SAME_COPY_WRITES = 20  # check 1: write through one copy, recall through the next, this many times
SEED_FACTS = 1000  # the bench's corpus, the same on every store
BENCH_QUERIES = 200
BENCH_PHASE_S = 4.0
VOCABULARY_SIZE = 400
SERVICE_PY = cluster.REPO / "solos_memory.py"


class Failed(Exception):
    """A check or a stage did not pass; the message says which and why."""


class Aborted(BaseException):
    """Ctrl-C, SIGTERM or the alarm: stop, clean up, exit 1."""


# ==== HTTP ====


class Client:
    """One keep-alive HTTP connection to a service on 127.0.0.1:port; reconnects after a failure."""

    def __init__(self, port: int, timeout: float = HTTP_TIMEOUT_S):
        self.port, self.timeout = port, timeout
        self.conn: http.client.HTTPConnection | None = None

    def request(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict, Any]:
        """Status, headers (lower-case names) and decoded JSON body; OSError or HTTPException if the
        connection fails (the connection is then dropped)."""
        if self.conn is None:
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
        payload = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if payload is not None else {}
        try:
            self.conn.request(method, path, payload, headers)
            response = self.conn.getresponse()
            raw = response.read()
        except (OSError, http.client.HTTPException):
            self.close()
            raise
        if response.will_close:
            self.close()
        try:
            decoded = json.loads(raw) if raw else None
        except ValueError:
            decoded = raw.decode(errors="replace")
        return response.status, {k.lower(): v for k, v in response.getheaders()}, decoded

    def get(self, path: str, **query: Any) -> tuple[int, dict, Any]:
        return self.request("GET", f"{path}?{urlencode(query)}" if query else path)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def acknowledged_id(status: int, body: Any) -> int | None:
    """The row id of an acknowledged write (201 created, 200 updated/unchanged); None otherwise."""
    if status in (200, 201) and isinstance(body, dict) and isinstance(body.get("id"), int):
        return body["id"]
    return None


def refusal(headers: dict, body: Any) -> str:
    """A 503 by its reason, and whether it said when to retry: how a writer's answers are counted."""
    error = body.get("error", {}) if isinstance(body, dict) else {}
    message = error.get("message", "")
    reason = "read-only" if "read-only" in message else "unreachable" if "cannot be reached" in message else ""
    what = f"503 {error.get('code', '?')}" + (f" ({reason})" if reason else "")
    return what if headers.get("retry-after") else f"{what} without Retry-After"


def refused_properly(what: str) -> bool:
    """A 503 that says when to retry: what a request may get while the database switches."""
    return what.startswith("503 ") and not what.endswith("without Retry-After")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_healthy(port: int, timeout: float, process: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise Failed(f"the service on {port} exited with {process.returncode}")
        try:
            if Client(port, timeout=2).get("/health")[0] == 200:
                return
        except (OSError, http.client.HTTPException):
            pass
        time.sleep(0.2)
    raise Failed(f"the service on {port} did not answer /health within {timeout:.0f} s")


# ==== Writers ====


class Writers:
    """Sixteen REST writers of long facts spread over the copies, each write retried until acknowledged.

    A connection error, a timeout or a 503 sends the same write to the next copy after RETRY_PAUSE_S; a 500,
    an empty success or another status is counted, and the write retried the same way. Every answer is
    counted by kind, with when it came and whether it followed an earlier failure of the same write.
    """

    def __init__(self, ports: list[int], run: str, writers: int = WRITERS):
        self.ports, self.run = ports, run
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.acked: dict[str, tuple[int, float, float, bool]] = {}  # fact -> id, sent at, answered at, retried
        self.outcomes: Counter[str] = Counter()
        self.failures: list[tuple[float, str, int]] = []  # when, what, port
        self.retried_then_unchanged = 0  # a retried write whose first try had committed
        self.threads = [threading.Thread(target=self.write, args=(n,), daemon=True) for n in range(writers)]

    def start(self) -> Writers:
        for thread in self.threads:
            thread.start()
        return self

    def finish(self, timeout: float = HTTP_TIMEOUT_S + 5) -> int:
        """Stop the writers; how many did not end in time."""
        self.stop.set()
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(timeout=max(0.1, deadline - time.monotonic()))
        return sum(thread.is_alive() for thread in self.threads)

    def fail(self, what: str, port: int) -> None:
        with self.lock:
            self.outcomes[what] += 1
            self.failures.append((time.monotonic(), what, port))

    def write(self, writer: int) -> None:
        clients = [Client(port) for port in self.ports]
        turn = writer % len(clients)
        seq = 0
        while not self.stop.is_set():
            seq += 1
            fact = f"{self.run} writer {writer} write {seq}: the relay in rack {seq % 40} was checked"
            body = {"agent": AGENTS[writer % 2], "topic": f"{self.run}-w{writer}", "fact": fact, "source": "check"}
            retried = False
            while not self.stop.is_set():
                client = clients[turn]
                sent = time.monotonic()
                try:
                    status, headers, answer = client.request("POST", "/v1/long", body)
                except TimeoutError:
                    what = "timeout"
                except (OSError, http.client.HTTPException):
                    what = "connection error"
                else:
                    row_id = acknowledged_id(status, answer)
                    if row_id is not None:
                        with self.lock:
                            self.outcomes[str(status)] += 1
                            self.acked[fact] = (row_id, sent, time.monotonic(), retried)
                            if retried and isinstance(answer, dict) and answer.get("status") == "unchanged":
                                self.retried_then_unchanged += 1
                        break
                    if status == 503:
                        what = refusal(headers, answer)
                    elif 200 <= status < 300:
                        what = f"{status} without an id (empty success)"
                    else:
                        what = str(status)
                self.fail(what, client.port)
                retried = True
                turn = (turn + 1) % len(clients)
                self.stop.wait(RETRY_PAUSE_S)
        for client in clients:
            client.close()

    def ack_times(self) -> list[float]:
        with self.lock:
            return sorted(done for _, _, done, _ in self.acked.values())


def events_ids(port: int, run: str, deadline: float) -> set[int]:
    """The long rows of this run in the event feed of the copy on port (REST, paginated by next_since)."""
    client = Client(port)
    found: set[int] = set()
    since = 0
    while time.monotonic() < deadline:
        status, _, body = client.get(
            "/v1/events", agent="sol", since=since, limit=1000, tiers="long", writers="atlas,sol", q=run
        )
        if status != 200:
            raise Failed(f"GET /v1/events on {port}: {status} {body}")
        found |= {e["row_id"] for e in body["events"] if e["kind"] == "write" and e["tier"] == "long"}
        # A page can hold no match and still have examined events (other runs'): go on until nothing is examined.
        if body["next_since"] == since:
            return found
        since = body["next_since"]
    raise Failed(f"reading the event feed on {port} took longer than {VERIFY_TIMEOUT_S:.0f} s")


def rows_in_database(url: str, facts: dict[str, int], deadline: float) -> tuple[int, str]:
    """How many (id, fact) pairs are in memory_longterm on the primary, read directly; and its port."""
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            with psycopg.connect(url, autocommit=True, connect_timeout=3) as conn:
                if conn.execute("select pg_is_in_recovery()").fetchone()[0]:
                    raise Failed("HAProxy's primary port reached a replica")
                port = conn.execute("select inet_server_port()").fetchone()[0]
                rows = conn.execute(
                    "select id, fact from memory_longterm where id = any(%s)", (list(facts.values()),)
                ).fetchall()
                present = {(row_id, fact) for row_id, fact in rows}
                return sum((row_id, fact) in present for fact, row_id in facts.items()), str(port)
        except (psycopg.Error, Failed) as error:
            last_error = error
            time.sleep(0.5)
    raise Failed(f"could not read the rows back from the primary: {last_error}")


def verify(writers: Writers, meta: dict, survivor: int) -> tuple[bool, list[str]]:
    """Every acknowledged write through a surviving copy's event feed and directly in PostgreSQL."""
    deadline = time.monotonic() + VERIFY_TIMEOUT_S
    facts = {fact: row_id for fact, (row_id, _, _, _) in writers.acked.items()}
    in_feed = events_ids(survivor, writers.run, deadline)
    feed_present = sum(row_id in in_feed for row_id in facts.values())
    db_present, db_port = rows_in_database(cluster.primary_url(meta), facts, deadline)
    ids_unique = len(set(facts.values())) == len(facts)
    sample = random.Random(len(facts)).sample(sorted(facts), min(RECALL_SAMPLE, len(facts)))
    recalled = sum(recalled_by(survivor, fact, facts[fact]) for fact in sample)
    lines = [
        f"present through copy {survivor} (its event feed): {feed_present}/{len(facts)};"
        f" found by recall there: {recalled}/{len(sample)} sampled",
        f"present in PostgreSQL (primary on {db_port}, id and text): {db_present}/{len(facts)}",
        f"lost (acknowledged, missing): {len(facts) - min(feed_present, db_present)}"
        + ("" if ids_unique else "; two acknowledged writes share an id!"),
    ]
    ok = bool(facts) and feed_present == db_present == len(facts) and recalled == len(sample) and ids_unique
    return ok, lines


def recalled_by(port: int, fact: str, row_id: int) -> bool:
    """Whether recall on the copy finds the row by its own words (writer, write number)."""
    words = fact.split(":")[0]  # "<run> writer N write M"
    status, _, body = Client(port).get("/v1/recall", agent="sol", q=words, k=10)
    return status == 200 and any(r["tier"] == "long" and r["id"] == row_id for r in body["results"])


def outcome_line(writers: Writers) -> str:
    return ", ".join(f"{what}: {count}" for what, count in sorted(writers.outcomes.items()))


def service_log_excerpt(meta: dict, lines: int = 30) -> str:
    """The first traceback in any copy's log, for a 500."""
    for record in cluster.records(meta, "service"):
        text = Path(record["log"]).read_text(errors="replace").splitlines()
        for index, line in enumerate(text):
            if "Traceback" in line or "unexpected error" in line:
                return f"{record['name']} ({record['log']}):\n    " + "\n    ".join(text[index : index + lines])
    return "(no traceback in the copies' logs)"


# ==== The checks ====


def check_write_then_recall(ports: list[int]) -> bool:
    """(1): write through copy A, recall through copy B with the very next request."""
    print("\n(1) a write through one copy, recalled through another at once (keyword recall: --model-dir off)")
    found, delays, ranking = 0, [], None
    word = "wr" + secrets.token_hex(3)
    for n in range(SAME_COPY_WRITES):
        a, b = ports[n % len(ports)], ports[(n + 1) % len(ports)]
        fact = f"The {word}{n} valve on floor {n} was replaced"
        status, _, body = Client(a).request("POST", "/v1/long", {"agent": "atlas", "topic": "check1", "fact": fact})
        row_id = acknowledged_id(status, body)
        if row_id is None:
            print(f"  write through {a}: {status} {body}")
            continue
        acked_at = time.monotonic()
        status, _, body = Client(b).get("/v1/recall", agent="sol", q=f"{word}{n} valve", k=5)
        delays.append(time.monotonic() - acked_at)
        ids = [r["id"] for r in body.get("results", []) if r["tier"] == "long"] if status == 200 else []
        found += row_id in ids
        ranking = body.get("ranking") if isinstance(body, dict) else None
    ok = found == SAME_COPY_WRITES
    print(
        f"  {found}/{SAME_COPY_WRITES} writes found by the first recall on the next copy"
        f" (ranking: {ranking}); ack to recall answer p50 {1000 * statistics.median(delays):.1f} ms,"
        f" max {1000 * max(delays):.1f} ms"
    )
    print(f"  {'PASS' if ok else 'FAIL'}")
    return ok


def check_copy_killed(meta: dict, state: Path) -> bool:
    """(3): kill -9 one copy under 16 writers; every acknowledged write is present."""
    ports = meta["ports"]["services"]
    victim = cluster.records(meta, "service")[1]
    victim_port, survivor = ports[1], ports[0]
    print(f"\n(3) kill -9 of copy {victim['name']} (port {victim_port}) during {WRITERS} writers over {ports}")
    writers = Writers(ports, "c3" + secrets.token_hex(3)).start()
    try:
        time.sleep(WARMUP_S)
        before = len(writers.acked)
        if not cluster.alive(victim):
            raise Failed(f"{victim['name']} is not running")
        os.kill(victim["pid"], signal.SIGKILL)
        killed_at = time.monotonic()
        time.sleep(AFTER_COPY_KILL_S)
    finally:
        stuck = writers.finish()
    to_victim = [f for f in writers.failures if f[2] == victim_port and f[0] >= killed_at]
    print(f"  {before / WARMUP_S:.0f} acknowledged writes/s before the kill; writers stuck at the end: {stuck}")
    print(f"  answers: {outcome_line(writers)}")
    print(
        f"  after the kill: {len(to_victim)} tries at the dead copy moved on to another;"
        f" retried writes the dead copy had committed (200 unchanged): {writers.retried_then_unchanged}"
    )
    ok, lines = verify(writers, meta, survivor)
    for line in lines:
        print(f"  {line}")
    # The dead copy's connections fail; anything else is a 503 with Retry-After or a success.
    bad = {w for w in writers.outcomes if w not in ("200", "201", "connection error") and not refused_properly(w)}
    if bad:
        print(f"  unexpected answers: {sorted(bad)}\n  {service_log_excerpt(meta)}")
    ok = ok and not bad and not stuck
    began = time.monotonic()
    revive(state)
    print(f"  revive: {victim['name']} serving again in {time.monotonic() - began:.1f} s")
    print(f"  {'PASS' if ok else 'FAIL'}")
    return ok


def check_leader_killed(meta: dict, state: Path) -> bool:
    """(4): kill -9 the leader's whole node under 16 writers; recovery time, nothing lost, only 2xx or 503."""
    ports = meta["ports"]["services"]
    print(f"\n(4) kill -9 of the database leader's node (Patroni and postmaster) during {WRITERS} writers over {ports}")
    writers = Writers(ports, "c4" + secrets.token_hex(3)).start()
    try:
        time.sleep(WARMUP_S)
        before = len(writers.acked)
        leader_before = cluster.leader(meta)
        killed = cluster.kill_leader(meta, whole_node=True)
        killed_at = time.monotonic()
        recovered_at = None
        while time.monotonic() < killed_at + RECOVERY_DEADLINE_S:
            if recovered_at is None:
                recovered_at = first_ack_after_outage(writers, killed_at)
            elif time.monotonic() > recovered_at + TAIL_S:
                break
            time.sleep(0.05)
    finally:
        stuck = writers.finish()
    times = writers.ack_times()
    around = [t for t in times if t >= killed_at - 1]
    gaps = [b - a for a, b in zip(around, around[1:])]
    gap = max(gaps, default=float("inf"))
    first_failure = min((f[0] for f in writers.failures if f[0] >= killed_at), default=None)
    leader_after = cluster.leader(meta)
    print(
        f"  leader {leader_before['name'] if leader_before else '?'} killed (patroni {killed.get('patroni_pid')},"
        f" postmaster {killed['postmaster_pid']}); new leader {leader_after['name'] if leader_after else '?'}"
    )
    print(f"  {before / WARMUP_S:.0f} acknowledged writes/s before the kill; writers stuck at the end: {stuck}")
    if recovered_at is None:
        print(f"  recovery: writes NOT acknowledged again within {RECOVERY_DEADLINE_S:.0f} s")
    else:
        print(
            f"  recovery: first refusal {first_failure - killed_at:.2f} s after the kill"
            if first_failure is not None
            else "  recovery: no refusal at all after the kill"
        )
        print(
            f"  writes acknowledged again {recovered_at - killed_at:.2f} s after the kill;"
            f" longest gap between acknowledgements {gap:.2f} s (bar: {RECOVERY_BAR_S:.0f} s)"
        )
    print(f"  answers: {outcome_line(writers)}")
    bad = {what for what in writers.outcomes if what not in ("200", "201") and not refused_properly(what)}
    if bad:
        print(f"  not a success nor a 503 with Retry-After: {sorted(bad)}")
        if any(what.startswith("5") for what in bad):
            print(f"  {service_log_excerpt(meta)}")
    print(f"  retried writes the first try had committed (200 unchanged): {writers.retried_then_unchanged}")
    ok, lines = verify(writers, meta, ports[0])
    for line in lines:
        print(f"  {line}")
    recovered = recovered_at is not None and recovered_at - killed_at <= RECOVERY_BAR_S and gap <= RECOVERY_BAR_S
    ok = ok and recovered and not bad and not stuck
    began = time.monotonic()
    revive(state)
    print(f"  revive: {killed['name']} back as a replica, cluster healthy in {time.monotonic() - began:.1f} s")
    print(f"  {'PASS' if ok else 'FAIL'}")
    return ok


def first_ack_after_outage(writers: Writers, killed_at: float) -> float | None:
    """When the first write sent after the first refusal following the kill was acknowledged.

    Not simply the first acknowledgement after the kill: the killed node's backends can still acknowledge a
    commit for a moment (the sync standby had confirmed it), which says nothing about recovery. None until
    then; the kill itself if nothing was ever refused (no outage)."""
    with writers.lock:
        refused = [when for when, _, _ in writers.failures if when >= killed_at]
        if not refused:
            acked_late = [done for _, sent, done, _ in writers.acked.values() if sent > killed_at + 2]
            return killed_at if acked_late else None
        outage = min(refused)
        after = [done for _, sent, done, _ in writers.acked.values() if sent > outage]
    return min(after) if after else None


def revive(state: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(cluster.HERE / "cluster.py"), "--state", str(state), "revive"],
        capture_output=True,
        text=True,
        timeout=REVIVE_TIMEOUT_S,
    )
    if result.returncode:
        raise Failed(f"cluster.py revive: {result.stderr.strip() or result.stdout.strip()}")


# ==== The bench (7) ====


def corpus(seed: int = 23) -> tuple[list[str], list[str]]:
    """SEED_FACTS facts and BENCH_QUERIES queries over one made-up vocabulary, the same on every store."""
    rng = random.Random(seed)
    letters = "bcdfghklmnprstvz"
    vowels = "aeiou"
    vocabulary = sorted(
        {"".join(rng.choice(letters) + rng.choice(vowels) for _ in range(rng.randint(2, 4))) for _ in range(600)}
    )[:VOCABULARY_SIZE]
    weights = [1 / (rank + 1) for rank in range(len(vocabulary))]  # Zipf-ish: some words common, most rare
    facts = [" ".join(rng.choices(vocabulary, weights, k=rng.randint(8, 14))) for _ in range(SEED_FACTS)]
    queries = [" ".join(rng.choices(vocabulary, weights, k=rng.randint(2, 3))) for _ in range(BENCH_QUERIES)]
    return facts, queries


def seed(ports: list[int], facts: list[str]) -> None:
    """Write the corpus through the given copies, 8 at a time (not timed)."""
    errors: list[str] = []

    def work(part: int) -> None:
        client = Client(ports[part % len(ports)])
        for n in range(part, len(facts), 8):
            body = {"agent": AGENTS[n % 2], "topic": f"seed{n % 50}", "fact": facts[n], "source": "bench"}
            status, _, answer = client.request("POST", "/v1/long", body)
            if acknowledged_id(status, answer) is None:
                errors.append(f"{status} {answer}")
                return

    threads = [threading.Thread(target=work, args=(part,)) for part in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    if errors or any(thread.is_alive() for thread in threads):
        raise Failed(f"seeding the bench corpus failed: {errors[:3]}")


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else float("nan")


def timed(ports: list[int], clients: int, duration: float, request) -> tuple[list[float], int]:
    """Run request(client, n) in `clients` threads, client i on ports[i % len], for duration; latencies (ms) and
    failures. With one client, requests alternate over the ports on one connection each, one at a time."""
    latencies: list[float] = []
    failures = [0]
    lock = threading.Lock()
    end = time.monotonic() + duration

    def work(index: int) -> None:
        mine = [Client(port) for port in (ports if clients == 1 else [ports[index % len(ports)]])]
        n = index
        while time.monotonic() < end:
            client = mine[n % len(mine)]
            began = time.perf_counter()
            try:
                ok = request(client, n)
            except (OSError, http.client.HTTPException):
                ok = False
            took = 1000 * (time.perf_counter() - began)
            with lock:
                if ok:
                    latencies.append(took)
                else:
                    failures[0] += 1
            n += clients
        for client in mine:
            client.close()

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=duration + HTTP_TIMEOUT_S + 5)
    return latencies, failures[0]


def bench(sqlite_port: int, copies: list[int]) -> list[tuple[str, dict]]:
    """(7): the same corpus and load on the SQLite service, one copy and three copies."""
    facts, queries = corpus()
    print(f"\n(7) bench: {SEED_FACTS} seeded facts, {BENCH_QUERIES} queries, {BENCH_PHASE_S:.0f} s per phase")
    began = time.monotonic()
    seed([sqlite_port], facts)
    seed(copies, facts)
    print(f"  seeded both databases in {time.monotonic() - began:.1f} s")
    run = "b7" + secrets.token_hex(3)
    setups = [
        ("SQLite, 1 service", [sqlite_port]),
        ("PostgreSQL, 1 copy", copies[:1]),
        ("PostgreSQL, 3 copies", copies),
    ]

    def recall(client: Client, n: int) -> bool:
        status, _, body = client.get("/v1/recall", agent="sol", q=queries[n % len(queries)], k=5)
        return status == 200 and isinstance(body, dict) and "results" in body

    def writer(label: str):
        def write(client: Client, n: int) -> bool:
            body = {
                "agent": AGENTS[n % 2],
                "topic": f"{run}-{label}-{n % 16}",
                "fact": f"{run} {label} bench write {n}: {facts[n % len(facts)]}",
            }
            status, _, answer = client.request("POST", "/v1/long", body)
            return status == 201 and acknowledged_id(status, answer) is not None

        return write

    results: list[tuple[str, dict]] = [(name, {}) for name, _ in setups]
    phases = [
        ("recall, serial", 1, lambda label: recall),
        (f"recall, {WRITERS} clients", WRITERS, lambda label: recall),
        ("write, serial", 1, writer),
        (f"write, {WRITERS} clients", WRITERS, writer),
    ]
    for phase, clients, make in phases:
        for (_, ports), (_, numbers) in zip(setups, results):
            label = f"{len(ports)}{'s' if ports == [sqlite_port] else 'p'}{clients}"
            timed(ports, clients, 0.5, make(label + "w"))  # warm the connections and caches
            latencies, failures = timed(ports, clients, BENCH_PHASE_S, make(label))
            numbers[phase] = {
                "per_s": len(latencies) / BENCH_PHASE_S,
                "p50": percentile(latencies, 0.5),
                "p99": percentile(latencies, 0.99),
                "failures": failures,
            }
    return results


def print_bench(results: list[tuple[str, dict]]) -> bool:
    phases = list(results[0][1])
    print(f"  {'':22}" + "".join(f"{name:>26}" for name, _ in results))
    for phase in phases:
        cells = [numbers[phase] for _, numbers in results]
        print(f"  {phase:22}" + "".join(f"{c['per_s']:>11.0f}/s p50 {c['p50']:5.1f} ms" for c in cells))
        print(f"  {'':22}" + "".join(f"{'p99':>17} {c['p99']:5.1f} ms" for c in cells))
    base, one, three = (numbers for _, numbers in results)
    print("  ratios (PostgreSQL / SQLite; 3 copies / 1 copy):")
    for phase in phases:
        print(
            f"    {phase:22} throughput 1 copy {one[phase]['per_s'] / base[phase]['per_s']:.2f}x,"
            f" 3 copies {three[phase]['per_s'] / base[phase]['per_s']:.2f}x"
            f" (3/1: {three[phase]['per_s'] / one[phase]['per_s']:.2f}x);"
            f" p50 {one[phase]['p50'] / base[phase]['p50']:.2f}x, {three[phase]['p50'] / base[phase]['p50']:.2f}x;"
            f" p99 {one[phase]['p99'] / base[phase]['p99']:.2f}x, {three[phase]['p99'] / base[phase]['p99']:.2f}x"
        )
    failures = sum(numbers[phase]["failures"] for _, numbers in results for phase in phases)
    print(f"  failed requests in the bench: {failures}")
    print(f"  {'PASS' if not failures else 'FAIL'}")
    return not failures


# ==== Run ====


def start_sqlite(folder: Path) -> tuple[subprocess.Popen, int]:
    """One SQLite service on a temp file, with the copies' flags."""
    port = free_port()
    log = open(folder / "sqlite-service.log", "ab")  # noqa: SIM115 - kept open for the process's life
    process = subprocess.Popen(
        [cluster.DEFAULT_PYTHON, str(SERVICE_PY), "serve", "--db", str(folder / "solos.db"), "--host", "127.0.0.1"]
        + ["--port", str(port), "--model-dir", "off", "--register", ",".join(AGENTS)],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=folder,
        start_new_session=True,  # a Ctrl-C reaches us, and we stop it ourselves
    )
    wait_healthy(port, SQLITE_START_S, process)
    return process, port


def stop_process(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


def on_signal(signum: int, _frame: Any) -> None:
    raise Aborted(f"stopped by {signal.Signals(signum).name}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--state", type=Path, default=DEFAULT_STATE, help=f"the cluster's folder (default: {DEFAULT_STATE})"
    )
    parser.add_argument(
        "--base-port",
        type=int,
        default=DEFAULT_BASE_PORT,
        help=f"the cluster's ports, planned as cluster.py does (default: {DEFAULT_BASE_PORT})",
    )
    parser.add_argument(
        "--failovers",
        type=int,
        default=1,
        help="run check 4 this many times in a row, about 35 s each (default: 1)",
    )
    args = parser.parse_args(argv)
    state = args.state.resolve()
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM):
        signal.signal(signum, on_signal)
    signal.alarm(ALARM_S + 60 * max(0, args.failovers - 1))
    began = time.monotonic()
    launched = time.time()
    temp = Path(tempfile.mkdtemp(prefix="solos-acceptance-"))
    sqlite: subprocess.Popen | None = None
    results: dict[str, bool] = {}
    status = 1
    try:
        up = subprocess.run(
            [sys.executable, str(cluster.HERE / "cluster.py"), "--state", str(state), "up"]
            + ["--base-port", str(args.base_port), "--services", str(COPIES)],
            capture_output=True,
            text=True,
            timeout=UP_TIMEOUT_S,
        )
        print(up.stdout.strip())
        if up.returncode:
            raise Failed(f"cluster.py up failed:\n{up.stderr.strip()}")
        meta = cluster.load_meta(state)
        copies = meta["ports"]["services"]
        sqlite, sqlite_port = start_sqlite(temp)
        print(f"SQLite service on 127.0.0.1:{sqlite_port} ({temp / 'solos.db'}); copies on {copies}")

        results["1 write on A, recall on B"] = check_write_then_recall(copies)
        bench_results = bench(sqlite_port, copies)
        results["7 bench"] = print_bench(bench_results)
        stop_process(sqlite)
        results["3 kill -9 a copy"] = check_copy_killed(meta, state)
        for n in range(args.failovers):
            meta = cluster.load_meta(state)  # revive recorded the new processes
            name = "4 kill -9 the leader's node" + (f" #{n + 1}" if args.failovers > 1 else "")
            results[name] = check_leader_killed(meta, state)
        status = 0 if all(results.values()) else 1
    except Failed as error:
        print(f"\nFAILED: {error}")
    except Aborted as error:
        print(f"\nABORTED: {error}")
    except Exception as error:  # noqa: BLE001 - report, then still clean up
        print(f"\nERROR: {type(error).__name__}: {error}")
    finally:
        signal.alarm(0)
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_IGN)  # the clean-up itself must not be cut short
        if sqlite is not None:
            stop_process(sqlite)
        shutil.rmtree(temp, ignore_errors=True)
        down = stop_cluster(state, launched)
    checks = ", ".join(f"({name}) {'PASS' if ok else 'FAIL'}" for name, ok in results.items()) or "no check ran"
    print(f"\nsummary: {checks}; {down}; {time.monotonic() - began:.0f} s in all")
    return status


def stop_cluster(state: Path, launched: float) -> str:
    """`cluster.py down`, but only for a cluster this run started (never someone else's in the same folder)."""
    try:
        meta = cluster.load_meta(state)
    except cluster.ClusterError:
        return "no cluster to stop"
    if meta.get("started", 0) < launched:
        return f"the cluster in {state} is not this run's: left alone"
    try:
        result = subprocess.run(
            [sys.executable, str(cluster.HERE / "cluster.py"), "--state", str(state), "down"],
            capture_output=True,
            text=True,
            timeout=DOWN_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return "cluster.py down did not finish in time"
    line = (result.stdout.strip().splitlines() or [result.stderr.strip()])[0]
    return line if result.returncode == 0 else f"cluster.py down FAILED: {line}"


if __name__ == "__main__":
    sys.exit(main())
