#!/usr/bin/env python3
"""MCP `tools/call recall` against REST `GET /v1/recall`: the same query, the same service, interleaved.

    python3 bench/mcp_vs_rest.py [--size 100k] [--requests 1000] [--seed 7]

The service runs as a subprocess (keyword-only) on a copy of the generated
database (gen_db.py). Two kept-alive http.client connections send raw HTTP:
REST as `GET /v1/recall?...`, MCP as `POST /mcp` with a JSON-RPC tools/call
and `MCP-Protocol-Version: 2025-11-25`. The service is stateless, so no
initialize is needed first (mcp_bridge answers a handshake-era tools/call
without one). Requests alternate REST, MCP on the same query so drift hits
both equally. Both answers are checked to carry the same result ids.
Target: MCP p50 <= 1.2x REST p50. Exits 1 on a miss.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import gen_db
from harness import Client, machine_note, percentiles, start_service, verdict
from recall_latency import CALLER, make_queries

TARGET_RATIO = 1.2
MCP_HEADERS = {
    "Content-Type": "application/json",
    "Accept": "application/json, text/event-stream",
    "MCP-Protocol-Version": "2025-11-25",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="100k", help="generated database size (default: %(default)s)")
    parser.add_argument(
        "--requests", type=int, default=1000, help="timed requests per transport (default: %(default)s)"
    )
    parser.add_argument("--warmup", type=int, default=100, help="untimed requests first (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=7, help="generator and query seed (default: %(default)s)")
    args = parser.parse_args()
    print(machine_note())

    source = gen_db.ensure_db(gen_db.parse_size(args.size), args.seed)
    rest_samples, mcp_samples, mismatches = [], [], 0
    with tempfile.TemporaryDirectory(prefix="solos-bench-") as scratch:
        db = Path(scratch) / "solos.db"
        shutil.copyfile(source, db)
        queries = make_queries(db, args.requests + args.warmup, args.seed, "content")
        with start_service(db) as service:
            rest, mcp = Client(service.port), Client(service.port)
            for i, q in enumerate(queries):
                arguments = {"agent": CALLER, "q": q, "k": 5}
                started = time.perf_counter()
                status, rest_body = rest.json("GET", "/v1/recall", query=arguments)
                rest_elapsed = time.perf_counter() - started
                rpc = {
                    "jsonrpc": "2.0",
                    "id": i,
                    "method": "tools/call",
                    "params": {"name": "recall", "arguments": arguments},
                }
                started = time.perf_counter()
                mcp_status, _, raw = mcp.request("POST", "/mcp", body=rpc, headers=MCP_HEADERS)
                mcp_elapsed = time.perf_counter() - started
                reply = json.loads(raw)
                if status != 200 or mcp_status != 200 or reply["result"]["isError"]:
                    raise RuntimeError(f"REST {status}, MCP {mcp_status}: {raw[:300]!r}")
                ids = lambda body: [(r["tier"], r["id"]) for r in body["results"]]  # noqa: E731
                mismatches += ids(rest_body) != ids(reply["result"]["structuredContent"])
                if i >= args.warmup:
                    rest_samples.append(rest_elapsed)
                    mcp_samples.append(mcp_elapsed)
            rest.close()
            mcp.close()

    rest_stats, mcp_stats = percentiles(rest_samples), percentiles(mcp_samples)
    ratio = mcp_stats["p50"] / rest_stats["p50"]
    print(f"{args.size} database, {len(rest_samples)} requests each, interleaved, keep-alive")
    for name, stats in (("REST GET /v1/recall", rest_stats), ("MCP tools/call recall", mcp_stats)):
        print(f"  {name:<22} p50 {stats['p50']:7.3f}  p95 {stats['p95']:7.3f}  p99 {stats['p99']:7.3f} ms")
    print(
        f"  MCP / REST p50 {ratio:.2f}x  p99 {mcp_stats['p99'] / rest_stats['p99']:.2f}x   "
        f"target <= {TARGET_RATIO}x: {verdict(ratio <= TARGET_RATIO)}"
    )
    print(f"  answers with different result ids: {mismatches}")
    return 0 if ratio <= TARGET_RATIO and not mismatches else 1


if __name__ == "__main__":
    sys.exit(main())
