#!/usr/bin/env python3
"""A2A turn overhead: what memory adds to each turn, the base commit's client beside this one.

    python3 bench/a2a_turns.py [--base 0f4a7dc] [--turns 20] [--model-ms 20]

Each turn is what the README's A2A example does: turn_context (recall, top 3
shared) before the model, record_turn after it, on a best-effort client. The
time around those two calls is the turn's added time; the model's own time
(--model-ms, a sleep) is left out. Three services, each against both clients
in the same run:

  up     the service (subprocess, fresh database, a few facts to recall)
  down   a loopback port nobody listens on (connection refused)
  hung   a loopback listener that accepts and never answers

The base client is `git show BASE:solos_client.py`, loaded under another
name. This one queues record_turn for a background thread and has a circuit
breaker; its queued writes are then flushed (bounded by EXIT_FLUSH_S), shown
apart as "at exit". The goal: hung, 20 turns add at most 1 s in all; up, a
turn costs about its recall alone (the "recall only" column).
"""

from __future__ import annotations

import argparse
import importlib.util
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import ModuleType

from harness import Client as HttpClient, machine_note, start_service

ROOT = Path(__file__).resolve().parents[1]
FACTS = [f"The kestrel backup job keeps {n + 7} nightly copies on volume {n}" for n in range(5)]


def load_client(name: str, source: str) -> ModuleType:
    """A solos_client module from its source text, under its own name (the two versions side by side)."""
    folder = Path(tempfile.mkdtemp(prefix=f"{name}-"))
    path = folder / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


class Hung:
    """Accepts every connection and never answers (the sockets are held until close)."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=128)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.held: list[socket.socket] = []
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self) -> None:
        while True:
            try:
                self.held.append(self.listener.accept()[0])
            except OSError:
                return

    def close(self) -> None:
        self.listener.close()
        for conn in self.held:
            conn.close()


def dead_url() -> str:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def run_turns(module: ModuleType, url: str, label: str, turns: int, model_s: float) -> dict:
    """Added seconds per turn (recall + record), the recall alone, and the exit flush where there is one."""
    client = module.Client(url, "sol", best_effort=True)
    added, recalls = [], []
    for number in range(turns):
        message = f"When does the kestrel backup job run? (turn {number})"
        started = time.perf_counter()
        context = module.turn_context(client, message)
        recalled = time.perf_counter()
        time.sleep(model_s)  # the model: not memory's cost
        resumed = time.perf_counter()
        module.record_turn(client, message, f"reply {number} using {len(context)} chars", turn_id=f"{label}-{number}")
        added.append((recalled - started) + (time.perf_counter() - resumed))
        recalls.append(recalled - started)
    flushed = None
    background = getattr(client, "background", None)
    if background is not None:
        started = time.perf_counter()
        background.flush(module.EXIT_FLUSH_S)
        flushed = time.perf_counter() - started
    return {"added": added, "recalls": recalls, "flush": flushed}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="0f4a7dc", help="the commit to compare with (default: %(default)s)")
    parser.add_argument("--turns", type=int, default=20, help="turns per service (default: %(default)s)")
    parser.add_argument("--model-ms", type=float, default=20.0, help="the model's time per turn (default: %(default)s)")
    args = parser.parse_args()
    base_source = subprocess.run(
        ["git", "show", f"{args.base}:solos_client.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    versions = {
        f"base {args.base}": load_client("solos_client_base", base_source),
        "this": load_client("solos_client_this", (ROOT / "solos_client.py").read_text()),
    }
    print(machine_note())
    with tempfile.TemporaryDirectory() as folder, start_service(Path(folder) / "a2a.db", register="sol,atlas") as up:
        writer = HttpClient(up.port)
        for fact in FACTS:
            writer.json("POST", "/v1/long", {"agent": "atlas", "topic": "ops", "fact": fact})
        writer.close()
        hung = Hung()
        services = {"up": f"http://127.0.0.1:{up.port}", "down": dead_url(), "hung": hung.url}
        results = {}
        try:
            for state, url in services.items():
                for version, module in versions.items():
                    results[state, version] = run_turns(
                        module, url, f"{state}-{version}", args.turns, args.model_ms / 1000
                    )
        finally:
            hung.close()
    base, this = versions
    print(f"\n{args.turns} turns per service; added time = recall + record_turn (the model's time left out)\n")
    print(
        f"{'service':8} {'client':14} {'total s':>8} {'p50 ms':>8} {'max ms':>8} {'recall only':>12} {'at exit s':>10}"
    )
    for state in services:
        for version in versions:
            r = results[state, version]
            flush = "-" if r["flush"] is None else f"{r['flush']:.3f}"
            print(
                f"{state:8} {version:14} {sum(r['added']):8.3f} {statistics.median(r['added']) * 1000:8.2f} "
                f"{max(r['added']) * 1000:8.1f} {statistics.median(r['recalls']) * 1000:10.2f}ms {flush:>10}"
            )
        ratio = sum(results[state, base]["added"]) / max(sum(results[state, this]["added"]), 1e-9)
        print(f"{'':8} {'base/this':14} {ratio:8.1f}x")
    hung_total = sum(results["hung", this]["added"])
    verdict = "met" if hung_total <= 1 else "NOT met"
    print(f"\ngoal, hung: {args.turns} turns add {hung_total:.3f} s in all (<= 1 s: {verdict})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
