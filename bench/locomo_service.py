"""A LoCoMo conversation in a scratch service, through REST: what bench/locomo.py and the benches that fit or
measure on LoCoMo share.

The databases (a temp SQLite file, or a fresh PostgreSQL database, per conversation), the `Service` (one
solos-memory server on one of them, over one kept-alive connection), writing a conversation's turns as long facts
(`write_turns`), waiting until every row has its vector (`prepare`) and asking as the reader (`recall_ids`).
Stdlib only, but for psycopg with a PostgreSQL database. Imports only harness.py and locomo_data.py of the benches.
"""

from __future__ import annotations

import contextlib
import http.client
import itertools
import json
import os
import subprocess
import tempfile
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

from harness import Process
from locomo_data import REPO, Turn

READER = "locomo-reader"

# ==== The databases: a temp SQLite file, or a fresh PostgreSQL database, per conversation ====


class SqliteFiles:
    """A new SQLite file in a temp dir for each conversation (the service creates it)."""

    label = "SQLite"

    @contextlib.contextmanager
    def fresh(self) -> Iterator[str]:
        with tempfile.TemporaryDirectory(prefix="locomo-") as tmp:
            yield str(Path(tmp) / "solos.db")

    def close(self) -> None:
        pass


class PgDatabases:
    """A fresh database on one PostgreSQL server for each conversation: created beside the URL's and dropped after
    it, or, where the URL's user may not create databases, the URL's own database when empty, emptied after each."""

    label = "PostgreSQL"
    PREFIX = "pgbench_locomo"

    def __init__(self, url: str) -> None:
        try:
            import psycopg
        except ImportError:
            raise SystemExit("--db postgresql://… needs psycopg: run with .venv/bin/python") from None
        self.url, self.sql = url, psycopg.sql
        try:
            self.admin = psycopg.connect(url, autocommit=True, connect_timeout=5)
        except psycopg.Error as error:
            raise SystemExit(
                f"--db: cannot connect to {shown_url(url)}: {str(error).strip().splitlines()[0]}"
            ) from None
        self.numbers = itertools.count(1)
        may_create = self.admin.execute(
            "SELECT rolsuper OR rolcreatedb FROM pg_roles WHERE rolname = current_user"
        ).fetchone()[0]
        self.reuse = not may_create
        if self.reuse and self.relations():
            self.admin.close()
            raise SystemExit(
                f"--db: {shown_url(url)} holds tables and its user may not create databases; "
                "give an empty database, or a user with CREATEDB"
            )

    def relations(self) -> int:
        return self.admin.execute(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public'"
        ).fetchone()[0]

    @contextlib.contextmanager
    def fresh(self) -> Iterator[str]:
        if self.reuse:
            try:
                yield self.url
            finally:
                self.empty()
            return
        name = f"{self.PREFIX}_{os.getpid()}_{next(self.numbers)}"
        self.admin.execute(self.sql.SQL("CREATE DATABASE {}").format(self.sql.Identifier(name)))
        try:
            yield urllib.parse.urlunsplit(urllib.parse.urlsplit(self.url)._replace(path="/" + name))
        finally:
            # WITH (FORCE): the service's pool, or a crashed service's, may still hold connections.
            self.admin.execute(
                self.sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(self.sql.Identifier(name))
            )

    def empty(self) -> None:
        """Back to an empty database: the schema public as PostgreSQL 15 creates it, nothing in it."""
        self.admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        with self.admin.transaction():
            self.admin.execute("DROP SCHEMA public CASCADE")
            self.admin.execute("CREATE SCHEMA public AUTHORIZATION pg_database_owner")
            self.admin.execute("GRANT USAGE ON SCHEMA public TO PUBLIC")

    def close(self) -> None:
        self.admin.close()


def shown_url(url: str) -> str:
    """A URL without its password, for messages."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    user = f"{parts.username}@" if parts.username else ""
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}{host}{f':{parts.port}' if parts.port else ''}"))


# ==== The service, through REST ====


class Service:
    """One solos-memory server on a fresh database, talked to over one kept-alive connection."""

    def __init__(
        self, python: str, db: str | Path, agents: list[str], serve_args: list[str], tree: Path = REPO
    ) -> None:
        # The database (a file or a postgresql:// URL) goes in through SOLOS_MEMORY_DB, so this works wherever
        # the CLI puts --db. `tree`: the checkout whose service runs (another one for a side-by-side bench).
        self.python, self.script = python, str(tree / "solos_memory.py")
        self.env = {**os.environ, "SOLOS_MEMORY_DB": str(db), "HF_HUB_OFFLINE": "1"}
        self.cli("agents", "add", *agents)
        # Port 0: the service names its port in its first log line (harness.Process reads it).
        self.proc = Process([python, self.script, "serve", "--port", "0", "--no-request-log", *serve_args], self.env)
        self.port = self.proc.port
        self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)

    def request(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        """One request; returns (status, parsed JSON body)."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        try:
            self.conn.request(method, path, body=data, headers=headers)
            response = self.conn.getresponse()
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
            # The service closes keep-alive connections idle for 30 s (a long backfill): reconnect once.
            self.conn.close()
            self.conn.request(method, path, body=data, headers=headers)
            response = self.conn.getresponse()
        raw = response.read()
        return response.status, (json.loads(raw) if raw else {})

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        """Run a solos_memory.py command on this database; raise with its stderr if it fails."""
        done = subprocess.run(
            [self.python, self.script, *args], env=self.env, capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"solos_memory.py {' '.join(args)} failed: {done.stderr[-2000:]}")
        return done

    def backfill(self) -> None:
        """Embed whatever the writes left without a vector (idempotent)."""
        self.cli("backfill")

    def close(self) -> None:
        self.conn.close()
        self.proc.stop()


def recall_ids(service: Service, question: str, mode: str, k: int = 10) -> tuple[list[str], bool]:
    """Ask /v1/recall as the reader; the results' dia_ids (from `source`) and the degraded flag.

    Mode vector asks the service for its vector leg alone (ranking=vector), to compare the legs. A
    degraded vector or hybrid answer (the query's embedding timed out on a loaded machine) is asked
    again, up to DEGRADED_RETRIES times.
    """
    for _ in range(DEGRADED_RETRIES):
        ids, degraded = ask(service, question, mode, k)
        if not degraded or mode == "keyword":
            break
        time.sleep(0.5)
    return ids, degraded


DEGRADED_RETRIES = 3


def ask(service: Service, question: str, mode: str, k: int) -> tuple[list[str], bool]:
    """One /v1/recall as the reader: the results' dia_ids and the degraded flag."""
    ranking = "vector" if mode == "vector" else "auto"
    query = urllib.parse.urlencode(
        {"agent": READER, "q": question, "k": k, "scope": "shared", "tiers": "long", "ranking": ranking}
    )
    status, body = service.request("GET", f"/v1/recall?{query}")
    if status != 200:
        raise RuntimeError(f"recall answered {status}: {body}")
    results = body.get("results", body.get("memories", []))
    return [r.get("source") for r in results], bool(body.get("degraded"))


def write_turns(service: Service, turns: list[Turn], agents: dict[str, str], copy: int = 0) -> None:
    """Store turns as long facts; copy > 0 makes the texts and topics distinct copies (latency runs)."""
    mark = f" #{copy}" if copy else ""
    for turn in turns:
        fact = {
            "agent": agents[turn.speaker],
            "topic": (turn.date or f"session {turn.session}") + mark,
            "fact": turn.fact + mark,
            "source": turn.dia_id,
            "confidence": 1.0,
            "tags": ["locomo", f"session_{turn.session}"],
        }
        status, body = service.request("POST", "/v1/long", fact)
        if status not in (200, 201):
            raise RuntimeError(f"write of {turn.dia_id} answered {status}: {body}")


def prepare(service: Service, mode: str, timeout_s: float = 900.0) -> None:
    """In hybrid mode, return once every long row has its vector: run the backfill command if
    the CLI has one, then wait until /v1/stats counts as many long vectors as long rows and the
    service's own worker is done too (/health embedder_state "ready", where it says one): until
    then recall answers "catching up" (degraded), even when the backfill command did the work."""
    if mode == "keyword":
        return
    service.backfill()
    deadline = time.monotonic() + timeout_s
    while True:
        stats = service.request("GET", "/v1/stats")[1]
        rows, vectors = stats.get("rows", {}).get("long"), stats.get("vectors", {}).get("long")
        state = service.request("GET", "/health")[1].get("embedder_state", "ready")
        if rows is None or vectors is None or (vectors >= rows and state == "ready"):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{vectors} of {rows} long rows have vectors, embedder {state}, after {timeout_s:.0f} s")
        time.sleep(0.2)
