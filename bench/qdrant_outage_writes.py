#!/usr/bin/env python3
"""Write latency with the Qdrant mirror on and Qdrant down, against no mirror at all, in one run.

    .venv/bin/python bench/qdrant_outage_writes.py [--writes 600]

Two in-process services on fresh databases: one without a Qdrant option, one
mirroring to a local-mode folder this script holds locked (so every drain
fails). Writes alternate between them; prints p50/p95 of each and the
mirror's backlog afterwards (every write queued, none lost). Asserts nothing.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from harness import ROOT, machine_note, percentiles

sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
from conftest import start_server, stop_server  # noqa: E402

import solos_qdrant  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--writes", type=int, default=600, help="writes per service (default: %(default)s)")
    args = parser.parse_args()
    from qdrant_client import QdrantClient

    print(machine_note())
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        holder = QdrantClient(path=str(root / "qdrant"))  # local mode admits one client: Qdrant is "down"
        holder.create_collection("long_term", vectors_config={})
        servers = {
            "no mirror": start_server(root / "a.db"),
            "mirror, Qdrant down": start_server(root / "b.db", qdrant=solos_qdrant.Target(path=str(root / "qdrant"))),
        }
        samples: dict[str, list[float]] = {name: [] for name in servers}
        try:
            for i in range(args.writes):
                for name, server in servers.items():
                    started = time.perf_counter()
                    reply = server.post("/v1/long", {"agent": "atlas", "fact": f"Fact {i} for {name}"})
                    samples[name].append(time.perf_counter() - started)
                    assert reply.status == 201, reply.body
            backlog = servers["mirror, Qdrant down"].get("/v1/stats").body["qdrant"]["backlog"]
        finally:
            for server in servers.values():
                stop_server(server)
            holder.close()
    base = percentiles(samples["no mirror"])
    for name, values in samples.items():
        p = percentiles(values)
        print(f"{name:22s} write p50 {p['p50']:6.3f} ms  p95 {p['p95']:6.3f} ms  ({p['p50'] / base['p50']:4.2f}x)")
    print(f"outbox backlog after {args.writes} writes with Qdrant down: {backlog}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
