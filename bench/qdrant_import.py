#!/usr/bin/env python3
"""Import vs federation for the fleet's Qdrant collection, measured on a collection like the fleet's.

    .venv/bin/python bench/qdrant_import.py [--points 400] [--queries 200] [--seed 7]

Seeds a qdrant-client local-mode collection `long_term` (384-dim vectors, both
payload shapes, 15.8 % of points without an agent, a few from an unregistered
writer), then measures in one run:

  import          `import-qdrant` into a fresh solos.db: first run, then a re-run (idempotent)
  recall          REST recall p50/p95 on the imported database (keyword-only service)
  federation      what recall would add per call if it read Qdrant live instead: a scroll
                  of the collection with the attribution and registry filters and a keyword
                  match in Python (the same labels and filters need every payload), and a
                  bare vector query (top 20, payloads) for comparison

Prints figures beside each other; asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import random
import re
import sys
import tempfile
import time
from pathlib import Path

from harness import ROOT, Client, machine_note, percentiles, start_service

sys.path.insert(0, str(ROOT))
import solos_memory  # noqa: E402
import solos_qdrant  # noqa: E402

AGENTS = ("atlas", "sol", "hermes", "nova")
WORDS = (
    "backup deploy gateway certificate rotation forecast cluster ingress node pool storage quota latency "
    "index schema migration token budget release rollback incident pager alert metric dashboard cache"
).split()


def seed(path: Path, count: int, rng: random.Random) -> None:
    from qdrant_client import QdrantClient, models

    client = QdrantClient(path=str(path))
    client.create_collection("long_term", vectors_config=models.VectorParams(size=384, distance=models.Distance.COSINE))
    unattributed = round(count * 63 / 400)
    points = []
    for i in range(count):
        text = " ".join(rng.choice(WORDS) for _ in range(12)) + f" (fact {i})"
        agent = "ghost" if i % 50 == 7 else AGENTS[i % 4]
        if i < unattributed:
            payload = {"topic": rng.choice(WORDS), "content": text}
        elif i % 2:
            payload = {"agent_id": agent, "topic": rng.choice(WORDS), "content": text, "importance_score": 0.5}
        else:
            payload = {"agent": agent, "topic": rng.choice(WORDS), "content": text, "fid": i}
        vector = [rng.uniform(-1, 1) for _ in range(384)]
        points.append(
            models.PointStruct(id=solos_qdrant.point_id("bench", "legacy", text), vector=vector, payload=payload)
        )
    client.upsert("long_term", points=points)
    client.close()


def timed_import(db: Path, path: Path) -> tuple[float, str]:
    out = io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        status = solos_memory.main(["import-qdrant", "--db", str(db), "--qdrant-path", str(path)])
    assert status == 0, "import-qdrant failed"
    return time.perf_counter() - started, out.getvalue().strip()


def federated_scroll(client, registered: set[str], words: list[str]) -> list:
    """One federated recall's Qdrant side: every payload, attributed and filtered, keyword-matched."""
    records, _ = client.scroll("long_term", limit=10_000, with_payload=True, with_vectors=False)
    hits = []
    for record in records:
        agent, text = solos_qdrant.attribute(record.payload or {})
        if agent in registered and text and any(word in text for word in words):
            hits.append((agent, text))
    return hits


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--points", type=int, default=400, help="points in the collection (default: %(default)s)")
    parser.add_argument("--queries", type=int, default=200, help="recalls measured (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=7, help="random seed (default: %(default)s)")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    from qdrant_client import QdrantClient

    with tempfile.TemporaryDirectory() as folder:
        db, path = Path(folder) / "solos.db", Path(folder) / "qdrant"
        seed(path, args.points, rng)
        solos_memory.register_agents(solos_memory.Config(db=str(db)), list(AGENTS))
        first_s, first = timed_import(db, path)
        again_s, again = timed_import(db, path)
        queries = [" ".join(rng.sample(WORDS, 2)) for _ in range(args.queries)]

        recall = []
        with start_service(db) as service:
            client = Client(service.port)
            for q in queries:
                started = time.perf_counter()
                status, _ = client.json("GET", "/v1/recall", query={"agent": "sol", "q": q, "k": 5})
                recall.append(time.perf_counter() - started)
                assert status == 200
            client.close()

        qdrant = QdrantClient(path=str(path))
        scroll, vector = [], []
        for q in queries:
            started = time.perf_counter()
            federated_scroll(qdrant, set(AGENTS), re.findall(r"\w+", q))
            scroll.append(time.perf_counter() - started)
            started = time.perf_counter()
            qdrant.query_points("long_term", query=[rng.uniform(-1, 1) for _ in range(384)], limit=20)
            vector.append(time.perf_counter() - started)
        qdrant.close()

    print(machine_note())
    print(f"collection: {args.points} points, 384-dim; queries: {args.queries}")
    print(f"import-qdrant first run : {first_s * 1000:8.1f} ms  {first}")
    print(f"import-qdrant re-run    : {again_s * 1000:8.1f} ms  {again}")
    for name, samples in (
        ("recall over REST (imported rows)", recall),
        ("federation: scroll+filter per recall", scroll),
        ("federation: vector query per recall", vector),
    ):
        p = percentiles(samples)
        print(f"{name:38s} p50 {p['p50']:8.3f} ms  p95 {p['p95']:8.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
