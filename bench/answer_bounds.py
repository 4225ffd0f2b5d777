"""The largest answer and the service's peak RSS for the worst requests we can build.

Fills a fresh database with rows whose JSON is as large as JSON gets (control
characters: six bytes each), then sends, one after another: read_events with
limit 1000 over REST, recall with k=100, and an MCP batch of read_events calls
(the largest batch the service takes, or 8 where it takes any). Prints each
answer's size and the service's peak RSS (VmHWM) after it, for this checkout
and, side by side, for another one (`--against DIR`, e.g. a `git worktree` of
the commit before).

    python3 bench/answer_bounds.py [--rows 120] [--against /tmp/base]
"""

from __future__ import annotations

import argparse
import http.client
import json
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEAVY = "\x01" * 8000


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def exchange(port: int, method: str, path: str, body: object = None, headers: dict | None = None) -> bytes:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    try:
        payload = None if body is None else json.dumps(body)
        conn.request(method, path, body=payload, headers={"Content-Type": "application/json", **(headers or {})})
        return conn.getresponse().read()
    finally:
        conn.close()


def measure(root: Path, rows: int) -> dict[str, tuple[int, float]]:
    """Answer bytes and peak RSS (MiB) after each worst request, against the service in `root`."""
    folder = Path(tempfile.mkdtemp(prefix="bounds-"))
    db, port = folder / "solos.db", free_port()
    python = sys.executable
    subprocess.run(
        [python, str(root / "solos_memory.py"), "agents", "add", "atlas", "sol", "--db", str(db)], check=True
    )
    service = subprocess.Popen(
        [python, str(root / "solos_memory.py"), "serve", "--db", str(db), "--port", str(port), "--model-dir", "off"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            try:
                exchange(port, "GET", "/health")
                break
            except OSError:
                time.sleep(0.1)
        exchange(port, "PUT", "/v1/sharing", {"agent": "atlas", "episodic": True})
        for n in range(rows):
            summary = f"heavy {n} " + HEAVY[:4000]
            exchange(
                port,
                "POST",
                "/v1/episodic",
                {"agent": "atlas", "event_type": "t", "summary": summary, "details": HEAVY * 2},
            )
            exchange(port, "POST", "/v1/long", {"agent": "atlas", "fact": f"heavy fact {n} " + HEAVY})
        found = {"filled": (0, peak_rss_mib(service.pid))}
        events = "/v1/events?agent=sol&since=0&limit=1000&tiers=episodic,long"
        found["REST read_events limit=1000"] = (len(exchange(port, "GET", events)), peak_rss_mib(service.pid))
        recall = "/v1/recall?agent=sol&q=heavy&k=100&tiers=long,episodic"
        found["REST recall k=100"] = (len(exchange(port, "GET", recall)), peak_rss_mib(service.pid))
        arguments = {"agent": "sol", "since": 0, "limit": 1000, "tiers": ["episodic", "long"]}
        batch = [
            {
                "jsonrpc": "2.0",
                "id": n,
                "method": "tools/call",
                "params": {"name": "read_events", "arguments": arguments},
            }
            for n in range(16)
        ]
        mcp = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-03-26"}
        answer = exchange(port, "POST", "/mcp", batch, mcp)
        if answer.startswith(b"{") and b"at most" in answer:  # a service that caps batches below 16
            answer = exchange(port, "POST", "/mcp", batch[:8], mcp)
        found["MCP batch of 16 read_events"] = (len(answer), peak_rss_mib(service.pid))
        return found
    finally:
        service.send_signal(signal.SIGTERM)
        service.wait(timeout=30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=120, help="heavy rows per tier (default: %(default)s)")
    parser.add_argument("--against", type=Path, help="another checkout to measure side by side")
    args = parser.parse_args()
    here = measure(ROOT, args.rows)
    there = measure(args.against, args.rows) if args.against else {}
    print(f"{args.rows} heavy episodes and {args.rows} heavy facts (about 150 KB / 50 KB of JSON each)")
    print(f"{'request':32} {'answer':>12} {'peak RSS':>10}" + (f" | {'against':>12} {'peak RSS':>10}" if there else ""))
    for name, (size, rss) in here.items():
        line = f"{name:32} {size / 1e6:10.2f}MB {rss:8.0f}MiB"
        if name in there:
            other_size, other_rss = there[name]
            line += f" | {other_size / 1e6:10.2f}MB {other_rss:8.0f}MiB"
            if size and other_size:
                line += f"  answer x{other_size / size:.1f}"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
