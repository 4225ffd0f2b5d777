#!/usr/bin/env python3
"""Write and recall latency with the Qdrant mirror on and Qdrant down or hung, against no mirror, in one run.

    .venv/bin/python bench/qdrant_outage_writes.py [--writes 600]

Three in-process services on fresh databases: one without a Qdrant option, one
mirroring to a local-mode folder this script holds locked (so every drain
fails at once), one mirroring to a loopback server that takes connections and
never answers (each drain waits out the client's timeouts). Writes of long
facts alternate between them, each followed by a recall; prints p50/p95 of
each and the mirrors' backlogs afterwards (every write queued, none lost).
Asserts nothing.
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
from conftest import FaultServer, start_server, stop_server  # noqa: E402

import solos_qdrant  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--writes", type=int, default=600, help="writes per service (default: %(default)s)")
    parser.add_argument("--fact-chars", type=int, default=2000, help="characters per fact (default: %(default)s)")
    args = parser.parse_args()
    from qdrant_client import QdrantClient

    print(machine_note())
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        holder = QdrantClient(path=str(root / "qdrant"))  # local mode admits one client: Qdrant is "down"
        holder.create_collection("long_term", vectors_config={})
        hung = FaultServer(("hang",))  # accepts, reads the request, never answers
        servers = {
            "no mirror": start_server(root / "a.db"),
            "mirror, Qdrant down": start_server(root / "b.db", qdrant=solos_qdrant.Target(path=str(root / "qdrant"))),
            "mirror, Qdrant hung": start_server(root / "c.db", qdrant=solos_qdrant.Target(url=hung.url)),
        }
        writes: dict[str, list[float]] = {name: [] for name in servers}
        recalls: dict[str, list[float]] = {name: [] for name in servers}
        padding = " and more" * (args.fact_chars // 9)
        try:
            for i in range(args.writes):
                for name, server in servers.items():
                    started = time.perf_counter()
                    reply = server.post("/v1/long", {"agent": "atlas", "fact": f"Fact {i} for {name}{padding}"})
                    writes[name].append(time.perf_counter() - started)
                    assert reply.status == 201, reply.body
                    started = time.perf_counter()
                    assert server.recall("sol", f"Fact {i}", k=3).status == 200
                    recalls[name].append(time.perf_counter() - started)
            backlogs = {name: servers[name].get("/v1/stats").body["qdrant"]["backlog"] for name in list(servers)[1:]}
        finally:
            for server in servers.values():
                stop_server(server)
            holder.close()
            hung.close()
    for label, samples in (("write", writes), ("recall", recalls)):
        base = percentiles(samples["no mirror"])
        for name, values in samples.items():
            p = percentiles(values)
            ratio = p["p50"] / base["p50"]
            print(f"{name:22s} {label:6s} p50 {p['p50']:6.3f} ms  p95 {p['p95']:6.3f} ms  ({ratio:4.2f}x)")
    for name, backlog in backlogs.items():
        print(f"outbox backlog after {args.writes} writes, {name}: {backlog}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
