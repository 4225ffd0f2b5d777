#!/usr/bin/env python3
"""A writer's latency with and without a reader paging the long facts, and the delivery log rows gained, side by
side in one run.

    python3 bench/delivery_log.py [--facts 1000] [--seconds 10] [--readers 4]

The service runs as a subprocess on a fresh SQLite database in a temporary folder, on loopback. atlas writes
--facts small long facts. Then two phases of --seconds each: sol writes a short row every 0.2 s alone, then
again while nova pages `GET /v1/events?since=0&limit=1000&tiers=long` in --readers threads as fast as the service
answers. Printed per phase: the writer's p50/p95/max, the reader's pages, and the rows the delivery log gained
(read from the database file). Measured before the log was bounded: p50 4.6 ms alone, 1.1-1.24 s with
the reader, and 220,000-380,000 rows gained in 20 s. Not a pass/fail bench; it prints figures.
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
import threading
import time
from pathlib import Path

from harness import Client, machine_note, percentiles, start_service


def log_rows(db: Path) -> int:
    with sqlite3.connect(db, timeout=30) as conn:
        return conn.execute("SELECT count(*) FROM memory_delivery").fetchone()[0]


def write_for(port: int, seconds: float) -> list[float]:
    """sol writes a short row every 0.2 s; each write's latency in seconds."""
    client, took, end, n = Client(port), [], time.monotonic() + seconds, 0
    while time.monotonic() < end:
        started = time.perf_counter()
        status, _ = client.json("POST", "/v1/short", {"agent": "sol", "key": f"k{n % 50}", "value": f"value {n}"})
        took.append(time.perf_counter() - started)
        assert status in (200, 201), status
        n += 1
        time.sleep(max(0.0, 0.2 - (time.perf_counter() - started)))
    client.close()
    return took


def page(port: int, stop: threading.Event, pages: list[int]) -> None:
    """nova pages every long fact from the start, again and again, until stopped."""
    client, query = Client(port, timeout=120), {"agent": "nova", "since": 0, "limit": 1000, "tiers": "long"}
    while not stop.is_set():
        status, _ = client.json("GET", "/v1/events", query=query)
        assert status == 200, status
        pages.append(1)
    client.close()


def phase(port: int, db: Path, seconds: float, readers: int) -> dict:
    before, stop, pages = log_rows(db), threading.Event(), []  # type: ignore[var-annotated]
    threads = [threading.Thread(target=page, args=(port, stop, pages), daemon=True) for _ in range(readers)]
    for thread in threads:
        thread.start()
    took = write_for(port, seconds)
    stop.set()
    for thread in threads:
        thread.join(timeout=120)
    return {**percentiles(took), "pages": len(pages), "gained": log_rows(db) - before}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--facts", type=int, default=1000, help="small long facts written first (default 1000)")
    parser.add_argument("--seconds", type=float, default=10, help="each phase's length (default 10)")
    parser.add_argument("--readers", type=int, default=4, help="threads paging the events (default 4)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        db = Path(folder) / "solos.db"
        with start_service(db, register="atlas,sol,nova") as service:
            client = Client(service.port)
            for n in range(args.facts):
                status, _ = client.json("POST", "/v1/long", {"agent": "atlas", "fact": f"small fact number {n}"})
                assert status == 201, status
            client.close()
            alone = phase(service.port, db, args.seconds, 0)
            paged = phase(service.port, db, args.seconds, args.readers)
    print(machine_note())
    print(f"{args.facts} long facts; {args.seconds:g} s per phase; the reader in {args.readers} threads")
    print(f"{'':26}{'alone':>12}{'with reader':>14}")
    for name, key, unit in (
        ("writer p50", "p50", "ms"),
        ("writer p95", "p95", "ms"),
        ("writer max", "max", "ms"),
    ):
        print(f"{name + ' (' + unit + ')':26}{alone[key]:12.1f}{paged[key]:14.1f}")
    print(f"{'writes':26}{alone['n']:12d}{paged['n']:14d}")
    print(f"{'reader pages of 1000':26}{alone['pages']:12d}{paged['pages']:14d}")
    print(f"{'delivery log rows gained':26}{alone['gained']:12d}{paged['gained']:14d}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
