#!/usr/bin/env python3
"""How `serve --workers N` spreads kept-alive connections over its workers, per --worker-socket mode.

    python3 bench/worker_balance.py [--workers 2] [--levels 2,4,16,64] [--trials 30]

Why: a kept-alive connection stays with the worker that accepted it, so how the connections of a burst are
spread decides how evenly the workers share the load (bench/load.py prints the spread of its requests).
For each mode (`shared`: one inherited listening socket; `reuseport`: SO_REUSEPORT), one keyword-only service
on an empty database; each trial opens `clients` connections at once (as bench/load.py's clients do), asks
each which worker it reached (/health), then closes them all. Prints, per level, the mean share of the
busiest worker (1/N is even) and how often a worker got no connection at all. Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import tempfile
from pathlib import Path
from statistics import mean

from harness import ROOT, Process, machine_note


def spread(port: int, clients: int) -> dict[int, int]:
    """Open `clients` connections, then ask each which worker holds it; connections per worker."""
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(clients)]
    found: dict[int, int] = {}
    try:
        for sock in socks:
            sock.sendall(f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
        for sock in socks:
            data = b""
            while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
            worker = json.loads(data.split(b"\r\n\r\n", 1)[1])["worker"]
            found[worker] = found.get(worker, 0) + 1
    finally:
        for sock in socks:
            sock.close()
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2, help="workers per service (default: %(default)s)")
    parser.add_argument("--levels", default="2,4,16,64", help="connections opened at once (default: %(default)s)")
    parser.add_argument("--trials", type=int, default=30, help="per level and mode (default: %(default)s)")
    args = parser.parse_args()
    levels = [int(n) for n in args.levels.split(",")]
    print(machine_note())
    with tempfile.TemporaryDirectory(prefix="solos-balance-") as scratch:
        for mode in ("shared", "reuseport"):
            argv = [sys.executable, str(ROOT / "solos_memory.py"), "serve", "--db", str(Path(scratch) / f"{mode}.db")]
            argv += ["--port", "0", "--model-dir", "off", "--no-request-log", "--workers", str(args.workers)]
            with Process([*argv, "--worker-socket", mode]) as service:
                for clients in levels:
                    trials = [spread(service.port, clients) for _ in range(args.trials)]
                    busiest = mean(max(found.values()) / clients for found in trials)
                    idle = sum(len(found) < args.workers for found in trials)
                    print(
                        f"  {mode:<9} {clients:>3} connections: busiest worker {busiest:.0%} on average "
                        f"(even: {1 / args.workers:.0%}); a worker left without any in {idle} of {args.trials}",
                        flush=True,
                    )
    print(machine_note())
    return 0


if __name__ == "__main__":
    sys.exit(main())
