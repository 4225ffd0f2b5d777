"""Shared pieces of the bench scripts: the service as a subprocess, floor servers, keep-alive clients, percentiles.

Not a bench itself; `python3 bench/<name>.py` imports it from its own folder.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import math
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 60

# A trivial HTTP/1.1 keep-alive server: the floor any Python service on this
# machine pays for a round trip. MODE "one" answers with one write (headers and
# body together); "split" writes headers, then body, as http.server's
# send_header/end_headers/wfile.write does, which meets Nagle + delayed ACK.
FLOOR_SERVER = r"""
import http.server, json, sys

MODE = sys.argv[1]
BODY = b'{"status": "ok"}'

class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        if MODE == "split":
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(BODY)))
            self.end_headers()
            self.wfile.write(BODY)
        else:
            head = ("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(BODY)}\r\n\r\n").encode()
            self.wfile.write(head + BODY)

    do_POST = do_GET

    def log_message(self, *args):
        pass

server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
server.daemon_threads = True
print(json.dumps({"event": "listening", "port": server.server_address[1]}), file=sys.stderr, flush=True)
server.serve_forever()
"""


class Process:
    """A server subprocess whose first JSON stderr line with "port" says where it listens.

    The rest of stderr is drained in a thread (a full pipe would stall the
    server's logging, and so the server) and the last lines kept for errors.
    """

    def __init__(self, argv: list[str], env: dict | None = None):
        self.argv = argv
        self.popen = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=ROOT
        )
        self.tail: deque[str] = deque(maxlen=50)
        self.port = self._read_port()
        self.drainer = threading.Thread(target=self._drain, daemon=True)
        self.drainer.start()

    def _read_port(self) -> int:
        deadline = time.monotonic() + START_TIMEOUT_S
        assert self.popen.stderr is not None
        while time.monotonic() < deadline:
            line = self.popen.stderr.readline()
            if not line:
                break
            text = line.decode("utf-8", "replace").strip()
            self.tail.append(text)
            try:
                record = json.loads(text)
            except ValueError:
                continue
            if isinstance(record, dict) and "port" in record:
                return int(record["port"])
        self.popen.kill()
        raise RuntimeError(f"{' '.join(self.argv)} did not report a port:\n" + "\n".join(self.tail))

    def _drain(self) -> None:
        assert self.popen.stderr is not None
        for line in self.popen.stderr:
            self.tail.append(line.decode("utf-8", "replace").rstrip())

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs, as in a crash."""
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait()

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()

    def __enter__(self) -> Process:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def start_service(
    db: str | Path, register: str = "", model_dir: str = "off", extra: list[str] = (), tree: Path = ROOT
) -> Process:
    """python3 solos_memory.py serve on port 0, request log off (`tree`: another checkout's, such as base_tree's)."""
    argv = [sys.executable, str(tree / "solos_memory.py"), "serve", "--db", str(db), "--port", "0", "--no-request-log"]
    if model_dir:
        argv += ["--model-dir", model_dir]
    if register:
        argv += ["--register", register]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return Process(argv + list(extra), env)


def base_tree(base: str, folder: Path) -> Path | None:
    """The base checkout: a folder as given, or a git revision archived into `folder`; None for 'none'."""
    if base == "none":
        return None
    if Path(base).is_dir():
        return Path(base).resolve()
    tree = folder / "base"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", base], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    return tree


def start_floor(mode: str = "one") -> Process:
    """The trivial http.server floor (see FLOOR_SERVER), answering in one write or two."""
    return Process([sys.executable, "-c", FLOOR_SERVER, mode])


class Client:
    """One kept-alive HTTP/1.1 connection; JSON in and out."""

    def __init__(self, port: int, timeout: float = 30):
        self.port = port
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)

    def request(
        self, method: str, path: str, body: Any = None, headers: dict | None = None, query: dict | None = None
    ) -> tuple[int, dict, bytes]:
        if query:
            path += "?" + urlencode(query)
        payload = None if body is None else json.dumps(body).encode()
        headers = dict(headers or {})
        if payload is not None:
            headers.setdefault("Content-Type", "application/json")
        try:
            self.conn.request(method, path, body=payload, headers=headers)
            response = self.conn.getresponse()
            data = response.read()
        except (http.client.HTTPException, OSError):
            self.conn.close()  # a fresh connection for the next call
            raise
        if response.getheader("Connection", "").lower() == "close":
            self.conn.close()
        return response.status, dict(response.getheaders()), data

    def json(self, method: str, path: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
        status, _, data = self.request(method, path, body, **kw)
        return status, json.loads(data) if data else None

    def close(self) -> None:
        self.conn.close()


def machine_note() -> str:
    """CPUs and load average: latency figures mean little on a machine busy with other work."""
    one, five, _ = os.getloadavg()
    note = f"machine: {os.cpu_count()} CPUs, load average {one:.2f} (1 min) {five:.2f} (5 min)"
    if one > (os.cpu_count() or 1) * 0.5:
        note += "  -- other work is running; figures are noisy"
    return note


def percentiles(samples_s: list[float]) -> dict[str, float]:
    """p50/p95/p99/max in milliseconds (nearest-rank)."""
    ordered = sorted(samples_s)
    if not ordered:
        return {"p50": float("nan"), "p95": float("nan"), "p99": float("nan"), "max": float("nan"), "n": 0}

    def rank(q: float) -> float:  # the ceil(q * n)-th: round() took the one below for 5 samples' p50, 30's p95
        return ordered[min(len(ordered) - 1, max(0, math.ceil(round(q * len(ordered), 9)) - 1))] * 1000

    return {
        "p50": rank(0.50),
        "p95": rank(0.95),
        "p99": rank(0.99),
        "max": ordered[-1] * 1000,
        "mean": statistics.fmean(ordered) * 1000,
        "n": len(ordered),
    }


def fmt_ms(value: float) -> str:
    return f"{value:8.3f}"


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def write_body(client_no: int, seq: int, agents: tuple[str, ...]) -> tuple[str, dict]:
    """The seq-th write of a client: unique content; long facts 50%, episodes 30% (some keyed), short keys 20%."""
    agent = agents[(client_no + seq) % len(agents)]
    kind = seq % 10
    tag = f"c{client_no}-n{seq}"
    if kind < 5:
        return "/v1/long", {
            "agent": agent,
            "topic": "bench",
            "fact": f"Fact {tag}: the gateway pool grew to {seq} workers.",
            "source": "bench",
            "confidence": 0.5,
            "tags": ["bench"],
        }
    if kind < 8:
        body = {
            "agent": agent,
            "event_type": "bench",
            "summary": f"Episode {tag} finished",
            "details": "written by a bench client",
            "outcome": "success",
            "duration_s": seq / 10,
        }
        if kind == 7:
            body["idempotency_key"] = f"key-{tag}"
        return "/v1/episodic", body
    return "/v1/short", {"agent": agent, "key": f"key-{tag}", "value": f"short value {tag}", "ttl_s": 3600}


def verify_acked(db: str | Path, acked: list[tuple[str, int, dict]]) -> list[str]:
    """Every acknowledged write (path, id, body sent) present with that content; returns what is not."""
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    checks = {
        "/v1/long": ("SELECT agent, fact FROM memory_longterm WHERE id = ?", ("agent", "fact")),
        "/v1/episodic": ("SELECT agent, summary FROM memory_episodic WHERE id = ?", ("agent", "summary")),
        "/v1/short": ("SELECT agent, key, value FROM memory_short WHERE id = ?", ("agent", "key", "value")),
    }
    problems = []
    try:
        for path, row_id, body in acked:
            sql, fields = checks[path]
            row = conn.execute(sql, (row_id,)).fetchone()
            if row is None:
                problems.append(f"{path} id {row_id}: missing")
            elif tuple(row) != tuple(body[f] for f in fields):
                problems.append(f"{path} id {row_id}: holds {json.dumps(dict(row))}, acknowledged {json.dumps(body)}")
    finally:
        conn.close()
    return problems


def with_vectors(source: Path, budget_s: float) -> Path | None:
    """A copy of source whose every row has a vector, cached beside it (the service's backfill command, once);
    None if the embedder cannot run here or the backfill does not finish within budget_s."""
    sys.path.insert(0, str(ROOT))
    import solos_embed

    try:
        model = solos_embed.load_embedder(None).model_id
    except solos_embed.EmbeddingsUnavailable as error:
        print(f"hybrid: n/a ({error})")
        return None
    cached = source.with_name(f"{source.stem}-vectors-{model.replace('@', '-')}.db")
    if cached.exists():
        return cached
    scratch = cached.with_suffix(f".tmp{os.getpid()}")
    shutil.copyfile(source, scratch)
    print(f"embedding every row of {source.name} once (cached as {cached.name})", flush=True)
    started = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, str(ROOT / "solos_memory.py"), "backfill", "--db", str(scratch)],
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
            capture_output=True,
            text=True,
            timeout=budget_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        scratch.unlink(missing_ok=True)
        print(f"hybrid: n/a (the backfill took more than {budget_s:.0f} s)")
        return None
    if done.returncode != 0:
        scratch.unlink(missing_ok=True)
        print(f"hybrid: n/a (backfill exited {done.returncode}: {done.stderr.strip()[-300:]})")
        return None
    with contextlib.closing(sqlite3.connect(scratch)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    os.replace(scratch, cached)
    for leftover in (Path(f"{scratch}-wal"), Path(f"{scratch}-shm")):
        leftover.unlink(missing_ok=True)
    print(f"  embedded in {time.perf_counter() - started:.0f} s")
    return cached
