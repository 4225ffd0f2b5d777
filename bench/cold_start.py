#!/usr/bin/env python3
"""Cold start of the .pyz: process start to the first /health 200, and its RSS then.

    python3 bench/cold_start.py [--runs N] [--pyz PATH]

Builds the archive into a temp folder (unless --pyz is given) and makes a venv
with no packages, so the service runs keyword-only as on a bare host. Then,
on that venv's python, in the same run and interleaved:

  python -c pass   the interpreter's start-up alone
  http.server      a stdlib HTTP server to its first 200: the floor for any
                   Python service, found the same way (its port from a JSON
                   log line on stderr, then GET /health)
  pyz serve        the service on a fresh database each run (schema created)

Prints the median and worst times, RSS (VmRSS at the first 200) and the
service's ratio to each floor, and checks the targets: 300 ms, 40 MB. Exits 1
if the median misses one.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_MS = 300
TARGET_RSS_MB = 40
START_TIMEOUT_S = 30
FLOOR_SERVER = r"""
import http.server, json, sys

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass

server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(json.dumps({"event": "listening", "port": server.server_address[1]}), file=sys.stderr, flush=True)
server.serve_forever()
"""


def rss_mb(pid: int) -> float:
    """Resident set size of a process, from /proc, in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def time_command(argv: list[str]) -> tuple[float, float]:
    """Milliseconds for a command to run to completion (no RSS: it has exited)."""
    start = time.perf_counter()
    subprocess.run(argv, check=True)
    return (time.perf_counter() - start) * 1000, 0.0


def time_server(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Milliseconds from spawn to the first /health 200, and the RSS in MB at that moment."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        port = None
        for line in proc.stderr:
            record = json.loads(line) if line.startswith("{") else {}
            if record.get("event") == "listening":
                port = record["port"]
                break
        if port is None:
            raise RuntimeError(f"{argv} exited {proc.wait()} without a listening line")
        while True:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=START_TIMEOUT_S)
            try:
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    break
            finally:
                conn.close()
            if time.perf_counter() - start > START_TIMEOUT_S:
                raise RuntimeError(f"{argv}: no /health 200 in {START_TIMEOUT_S} s")
        elapsed = (time.perf_counter() - start) * 1000
        return elapsed, rss_mb(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def bare_venv(folder: Path) -> Path:
    """A venv with no packages; returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    return folder / "bin" / "python"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Cold start and RSS of solos-memory.pyz against stdlib floors.")
    parser.add_argument("--runs", type=int, default=15, help="runs of each (default: %(default)s)")
    parser.add_argument("--pyz", type=Path, help="archive to time (default: build one from this tree)")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="solos-bench-") as tmp:
        work = Path(tmp)
        pyz = args.pyz
        if pyz is None:
            pyz = work / "solos-memory.pyz"
            subprocess.run(
                [sys.executable, str(ROOT / "pyz_build.py"), "--out", str(pyz)], check=True, stdout=subprocess.DEVNULL
            )
        python = str(bare_venv(work / "venv"))
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        cases = {
            "python -c pass": lambda i: time_command([python, "-c", "pass"]),
            "http.server": lambda i: time_server([python, "-c", FLOOR_SERVER], env),
            "pyz serve": lambda i: time_server(
                [python, str(pyz), "serve", "--port", "0"], {**env, "SOLOS_MEMORY_DB": str(work / f"run{i}.db")}
            ),
        }
        for case in cases.values():  # warm the page cache once; not counted
            case(-1)
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
        for i in range(args.runs):
            for name, case in cases.items():
                samples[name].append(case(i))

    print(f"cold start, {args.runs} runs each, bare venv of {sys.version.split()[0]}, {pyz.name}")
    print(f"{'':16} {'median ms':>10} {'max ms':>8} {'RSS MB':>7}")
    medians = {}
    for name, rows in samples.items():
        ms = [row[0] for row in rows]
        rss = statistics.median(row[1] for row in rows)
        medians[name] = (statistics.median(ms), rss)
        print(f"{name:16} {medians[name][0]:10.1f} {max(ms):8.1f} {rss if rss else float('nan'):7.1f}")
    service_ms, service_rss = medians["pyz serve"]
    floor_ms, floor_rss = medians["http.server"]
    print(f"pyz serve / http.server: {service_ms / floor_ms:.2f}x time, {service_rss / floor_rss:.2f}x RSS")
    print(f"pyz serve / python -c pass: {service_ms / medians['python -c pass'][0]:.2f}x time")
    ok_ms, ok_rss = service_ms <= TARGET_MS, service_rss <= TARGET_RSS_MB
    print(
        f"target {TARGET_MS} ms: {'PASS' if ok_ms else 'MISS'} ({service_ms:.0f} ms); "
        f"target {TARGET_RSS_MB} MB: {'PASS' if ok_rss else 'MISS'} ({service_rss:.1f} MB)"
    )
    return 0 if ok_ms and ok_rss else 1


if __name__ == "__main__":
    sys.exit(main())
