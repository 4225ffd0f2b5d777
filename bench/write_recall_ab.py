#!/usr/bin/env python3
"""Write and recall latency with the embedder on, this tree against another checkout, in one run.

    .venv/bin/python bench/write_recall_ab.py --base DIR [--rows 2000] [--writes 200] [--queries 300]
    .venv/bin/python bench/write_recall_ab.py --base DIR --queries 0   # serial hybrid writes only

DIR is another checkout (e.g. `git archive 30769e5 | tar -x -C DIR`). Both services load the embedder and start
on copies of one database: LoCoMo dev turns as long facts, every row embedded (the `backfill` command). Then,
alternating base and this on kept-alive connections so whatever else loads the machine loads both alike:
`--writes` serial writes of each tier in `--tiers` each (a new long fact in the topic of the one before, a
short key, an episode; each timed until its answer, which a write gives once its row is embedded or left to
the background worker, as that side does it), then `--queries` LoCoMo questions each (recall, hybrid, k=5,
each side's default floor). Prints p50/p99 and this/base per line; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import ROOT, Client, Process, machine_note, percentiles
from locomo_data import DEFAULT_DATA, agent_names, load_conversations
from locomo_service import READER


def start(tree: Path, db: Path) -> Process:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return Process(
        [sys.executable, str(tree / "solos_memory.py"), "serve", "--db", str(db), "--port", "0", "--no-request-log"],
        env,
    )


def build_db(db: Path, rows: int, conversations: list) -> tuple[list[str], list[str]]:
    """LoCoMo turns as long facts (copies marked #n past the first pass), embedded; (agents, questions)."""
    turns = [t for c in conversations for t in c.turns]
    agents = agent_names([t.speaker for t in turns])
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    script = str(ROOT / "solos_memory.py")
    subprocess.run(
        [sys.executable, script, "agents", "add", "--db", str(db), *agents.values(), READER],
        env=env,
        check=True,
        capture_output=True,
    )
    import sqlite3

    conn = sqlite3.connect(db)
    with conn:
        for n in range(rows):
            turn, copy = turns[n % len(turns)], n // len(turns)
            mark = f" #{copy}" if copy else ""
            conn.execute(
                "INSERT INTO memory_longterm (agent, topic, fact, source, confidence, tags) VALUES (?, ?, ?, ?, 1, ?)",
                (agents[turn.speaker], turn.date + mark, turn.fact + mark, turn.dia_id, '["locomo"]'),
            )
    conn.close()
    subprocess.run([sys.executable, script, "backfill", "--db", str(db)], env=env, check=True, capture_output=True)
    return list(agents.values()), [q.question for c in conversations for q in c.queries]


def wait_ready(client: Client, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while client.json("GET", "/health")[1].get("embedder_state") != "ready":
        if time.monotonic() > deadline:
            raise RuntimeError("the embedder did not get ready")
        time.sleep(0.2)


def written(tier: str, n: int, agent: str, question: str) -> tuple[str, dict]:
    """The n-th timed write of a tier: its route and body (facts of one topic, so the long tier's neighbours count)."""
    text = f"bench {tier} {n}: {question}"
    if tier == "long":
        return "/v1/long", {"agent": agent, "topic": f"bench {n // 10}", "fact": text, "tags": ["bench"]}
    if tier == "short":
        return "/v1/short", {"agent": agent, "key": f"bench-{n}", "value": text}
    return "/v1/episodic", {"agent": agent, "event_type": "bench", "summary": text}


def line(name: str, samples: dict[str, list[float]]) -> str:
    b, t = percentiles(samples["base"]), percentiles(samples["this"])
    return (
        f"  {name:<14} base p50 {b['p50']:7.2f} p99 {b['p99']:7.2f}   this p50 {t['p50']:7.2f} p99 {t['p99']:7.2f}"
        f"   this/base p50 {t['p50'] / b['p50']:4.2f}x p99 {t['p99'] / b['p99']:4.2f}x  (ms, n={t['n']})"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, required=True, help="the other checkout (no default)")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="LoCoMo JSON (default: %(default)s)")
    parser.add_argument("--rows", type=int, default=2000, help="long facts in the database (default: %(default)s)")
    parser.add_argument("--writes", type=int, default=200, help="timed writes per side (default: %(default)s)")
    parser.add_argument("--queries", type=int, default=300, help="timed recalls per side (default: %(default)s)")
    parser.add_argument("--tiers", default="long,short,episodic", help="tiers written (default: %(default)s)")
    args = parser.parse_args()
    conversations = load_conversations(args.data)  # a missing file stops here, in one line
    print(machine_note())
    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / "source.db"
        agents, questions = build_db(source, args.rows, conversations)
        dbs = {name: Path(folder) / f"{name}.db" for name in ("base", "this")}
        for db in dbs.values():
            shutil.copy(source, db)
        with start(args.base.resolve(), dbs["base"]) as base, start(ROOT, dbs["this"]) as this:
            clients = {"base": Client(base.port), "this": Client(this.port)}
            for client in clients.values():
                wait_ready(client)
            print(f"{args.rows} embedded long facts; base {args.base}, this {ROOT}")
            tiers = args.tiers.split(",")
            writes: dict[str, dict[str, list[float]]] = {tier: {"base": [], "this": []} for tier in tiers}
            for n in range(args.writes):
                for tier in tiers:
                    path, body = written(tier, n, agents[n % len(agents)], questions[n % len(questions)])
                    for name, client in clients.items():
                        started = time.perf_counter()
                        status, _ = client.json("POST", path, body)
                        writes[tier][name].append(time.perf_counter() - started)
                        assert status == 201, (name, tier, status)
            for client in clients.values():
                wait_ready(client)  # the base's worker has embedded the writes: recall compares like with like
            recalls: dict[str, list[float]] = {"base": [], "this": []}
            for q in questions[: args.queries]:
                query = {"agent": READER, "q": q, "k": 5, "tiers": "long"}
                for name, client in clients.items():
                    started = time.perf_counter()
                    status, _ = client.json("GET", "/v1/recall", query=query)
                    recalls[name].append(time.perf_counter() - started)
                    assert status == 200, (name, status)
            for tier in tiers:
                print(line(f"{tier} write", writes[tier]))
            if args.queries:
                print(line("recall", recalls))
            for client in clients.values():
                client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
