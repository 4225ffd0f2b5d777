#!/usr/bin/env python3
"""Event latency from commit to delivery with 8 SSE subscribers while 16 clients write; write throughput with and
without the subscribers, as a ratio, in one run.

    python3 bench/events.py [--clients 16] [--subscribers 8] [--seconds 5]

The service runs as a subprocess on a fresh database. Three phases of
--seconds each, on the same service: writers alone, writers with the
subscribers streaming, writers alone again (the ratio uses the mean of the two
phases without, so drift on a shared machine shows up rather than hides).
Writers are bench/write_throughput.py's: kept-alive REST clients writing
long facts, episodes and short keys with unique content.

Each subscriber is a GET /v1/events stream (Accept: text/event-stream) for a
reader agent, default filter (long and short tiers, everyone's rows), so it
receives every long and short write. Latency is the subscriber's clock at
receipt minus the event's `ts`, which SQLite stamps inside the write's
transaction (millisecond resolution, same machine clock): commit to
delivery, give or take a millisecond. Also counted: events each subscriber
should have had (the long and short writes acknowledged during its phase)
against those it got, and subscribers dropped. Not a pass/fail bench; it
prints figures.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import multiprocessing
import socket
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness import Client, machine_note, percentiles, start_service
from write_throughput import AGENTS, drive


def event_time(ts: str) -> float:
    return datetime.strptime(ts, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()


class Subscriber(threading.Thread):
    """One SSE stream; records (event id, latency) for every data message."""

    def __init__(self, port: int, agent: str):
        super().__init__(daemon=True)
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.conn.request("GET", f"/v1/events?agent={agent}", headers={"Accept": "text/event-stream"})
        self.sock = self.conn.sock
        self.response = self.conn.getresponse()
        assert self.response.status == 200, self.response.read()
        self.received: list[tuple[int, float]] = []
        self.cut = False

    def run(self) -> None:
        try:
            for line in iter(self.response.readline, b""):
                if line.startswith(b"data: "):
                    now = time.time()
                    event = json.loads(line[6:])
                    self.received.append((event["id"], now - event_time(event["ts"])))
        except OSError:
            self.cut = True

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.conn.close()


def subscribe(port: int, readers: list[str], ready: Any, stop: Any, results: Any) -> None:
    """The subscribers, in a process of their own: the writers' threads must not starve them of the GIL."""
    subscribers = [Subscriber(port, reader) for reader in readers]
    for subscriber in subscribers:
        subscriber.start()
    ready.set()
    stop.wait()
    time.sleep(0.5)  # the last deliveries
    for subscriber in subscribers:
        subscriber.close()
    results.put([(s.received, s.cut) for s in subscribers])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=16, help="concurrent writers (default: %(default)s)")
    parser.add_argument("--subscribers", type=int, default=8, help="SSE streams (default: %(default)s)")
    parser.add_argument("--seconds", type=float, default=5, help="length of each phase (default: %(default)s)")
    args = parser.parse_args()
    print(machine_note())
    readers = [f"reader{n + 1}" for n in range(args.subscribers)]
    with tempfile.TemporaryDirectory(prefix="solos-bench-") as scratch:
        db = Path(scratch) / "solos.db"
        with start_service(db, register=",".join(AGENTS + tuple(readers))) as service:
            before, before_s = drive(service.port, args.clients, args.seconds, first_client=1000)
            ready, stop, results = multiprocessing.Event(), multiprocessing.Event(), multiprocessing.Queue()
            watcher = multiprocessing.Process(target=subscribe, args=(service.port, readers, ready, stop, results))
            watcher.start()
            ready.wait(30)
            time.sleep(0.3)
            during, during_s = drive(service.port, args.clients, args.seconds, first_client=2000)
            stop.set()
            received = results.get(timeout=60)
            watcher.join()
            counters = json.loads(Client(service.port).request("GET", "/v1/stats")[2])["event_streams"]
            after, after_s = drive(service.port, args.clients, args.seconds, first_client=3000)

    rates = [len(t.acked) / s for t, s in ((before, before_s), (during, during_s), (after, after_s))]
    without = (rates[0] + rates[2]) / 2
    expected = sum(1 for path, _, _ in during.acked if path in ("/v1/long", "/v1/short"))
    latencies = [latency for events, _ in received for _, latency in events]
    got = [len(events) for events, _ in received]
    stats = percentiles([max(0.0, x) for x in latencies])
    print(f"{args.clients} writers, {args.subscribers} SSE subscribers, {args.seconds:g} s per phase")
    print(
        f"  write throughput without subscribers {rates[0]:7.0f} and {rates[2]:7.0f} writes/s (mean {without:.0f}); "
        f"with {args.subscribers} subscribers {rates[1]:7.0f} writes/s: ratio with/without {rates[1] / without:.2f}"
    )
    print(
        f"  event latency commit -> delivery (ms, 1 ms resolution): p50 {stats['p50']:.1f}  p95 {stats['p95']:.1f}  "
        f"p99 {stats['p99']:.1f}  max {stats['max']:.1f}  over {stats['n']:,} deliveries"
    )
    print(
        f"  deliveries per subscriber: min {min(got):,} max {max(got):,} of {expected:,} long/short writes acked "
        f"; streams cut: {sum(cut for _, cut in received)}; the service's count: {counters}"
    )
    five_xx = sum(count for t in (before, during, after) for status, count in t.statuses.items() if status >= 500)
    print(f"  5xx during the run: {five_xx}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
