#!/usr/bin/env python3
"""One legitimate but expensive call: its CPU, and the other agents' recall p50 while it runs, this tree beside another.

    python3 bench/heavy_calls.py [--base main] [--size 100k] [--reps 10] [--seconds 3] [--only recall-64-words,stats]

Why: agents recall on every turn, and one valid call that costs a second of CPU stalls every other agent's turn
on a 2-core host. Each call here is valid input at or near its documented bounds: the 64 words a question keeps
(the most frequent words of the episodic index under half its rows), the longest q of ordinary words, every
tier with k=100, the best rows 16k-character values full of ids and names (40 added to the copy, as a fleet
writer's), the archive, tags at their count, events read from the start of a long log with a filter
that matches nothing, an as-of recall, stats (the status page's source).

Each tree serves its own copy of the cached fleet database (gen_db.py, keyword ranking: the embedder adds a
thread of its own, not the keyword leg's cost), one after the other. Per call: two warm-up calls (the service
counts new query words in the background: its first answer to a new question is the tree before's), then
`--reps` calls, one at a time, each call's CPU as the service process's threads' run time (/proc schedstat, all
threads: the call's own and whatever it starts); then an ordinary agent (k=5 recalls of short questions on a
kept-alive connection of its own) recalls for `--seconds` alone and again while another connection repeats the
call, and its p50 both ways is printed. The machine's load is printed first; the figures are one run's, on a
shared machine. Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import gen_db
from harness import ROOT, Client, base_tree, machine_note, start_service

sys.path.insert(0, str(ROOT))
import solos_rank  # noqa: E402

CALLER = "atlas"
ORDINARY = ("backup gateway certificate renew", "rollback after failed deploy", "dns outage region", "kernel patch")
ALL_TIERS = "long,short,episodic,durable"


def heavy_words(db: Path, count: int = 64) -> str:
    """The most frequent words of the episodic index under half its rows, stop words out: the costliest q."""
    conn = sqlite3.connect(db)
    try:
        conn.execute("CREATE VIRTUAL TABLE temp.words USING fts5vocab(main, 'memory_episodic_fts', 'row')")
        half = conn.execute("SELECT count(*) FROM memory_episodic").fetchone()[0] // 2
        terms = [t for (t,) in conn.execute("SELECT term FROM temp.words WHERE doc < ? ORDER BY doc DESC", (half,))]
    finally:
        conn.close()
    return " ".join([t for t in terms if t.isalpha() and t not in solos_rank.STOP_WORDS][:count])


LONG_VALUE = " ".join(f"INC-{n} Ilse Vermeer pay-app-{n % 97} Q{n % 4 + 1} staging" for n in range(500))[:16_000]
LONG_ROWS_Q = "What did Ilse Vermeer say about INC-2207 on pay-app-01 in Q3 staging kestrel?"


def add_long_rows(db: Path, count: int = 40) -> None:
    """Short values of 16k characters full of ids and names, all matching LONG_ROWS_Q, as a fleet writer's."""
    conn = sqlite3.connect(db)
    with conn:
        conn.executemany(
            "INSERT INTO memory_short (agent, key, value, expires_at) VALUES ('sol', ?, ?, '2031-01-01T00:00:00.000Z')",
            [(f"heavy-{n}", f"kestrel {n} {LONG_VALUE}") for n in range(count)],
        )
    conn.close()


def calls(db: Path) -> dict[str, tuple[str, str, dict]]:
    """name -> (method, path, query): each at or near a documented bound."""
    costly = heavy_words(db)
    ops = "deploy backup gateway certificate cluster node service database migration rollback latency error".split()
    long_q = " ".join(ops[i % len(ops)] for i in range(900))[:10_000]
    recall = "/v1/recall"
    return {
        "recall-ordinary": ("GET", recall, {"q": ORDINARY[0], "k": 5}),
        "recall-64-words": ("GET", recall, {"q": costly, "k": 5, "tiers": "long,short,episodic"}),
        "recall-64-words-all": ("GET", recall, {"q": costly, "k": 100, "tiers": ALL_TIERS}),
        "recall-10k-q-all": ("GET", recall, {"q": long_q, "k": 100, "tiers": ALL_TIERS}),
        "recall-long-rows": ("GET", recall, {"q": LONG_ROWS_Q, "k": 5, "tiers": "short"}),
        "recall-archive": ("GET", recall, {"q": costly, "k": 100, "tiers": "episodic", "archive": "true"}),
        "recall-tags-32": ("GET", recall, {"q": costly, "k": 100, "tags": ",".join(f"t{i}" for i in range(32))}),
        "events-nothing-from-0": ("GET", "/v1/events", {"since": 0, "limit": 1000, "q": "zzqqxx"}),
        "events-from-0": ("GET", "/v1/events", {"since": 0, "limit": 1000, "tiers": ALL_TIERS}),
        "as-of-recall": ("GET", "/v1/recall/as_of", {"q": costly, "k": 100, "as_of": time_ago(3600)}),
        "stats": ("GET", "/v1/stats", {}),
    }


def time_ago(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - seconds))


def run_ns(pid: int) -> int:
    """The process's threads' time on a CPU, nanoseconds (/proc/PID/task/*/schedstat; live threads)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            pass  # a thread that ended meanwhile
    return total


def ask(client: Client, method: str, path: str, query: dict) -> tuple[int, bytes]:
    status, _, body = client.request(method, path, query={"agent": CALLER, **query})
    return status, body


def ordinary_p50(port: int, seconds: float) -> tuple[float, int]:
    client, took = Client(port), []
    deadline = time.monotonic() + seconds
    n = 0
    while time.monotonic() < deadline:
        started = time.perf_counter()
        status, _ = ask(client, "GET", "/v1/recall", {"q": ORDINARY[n % len(ORDINARY)], "k": 5})
        took.append(time.perf_counter() - started)
        n += 1
        assert status == 200, status
    client.close()
    return statistics.median(took) * 1000, len(took)


def measure(
    label: str, tree: Path, source: Path, names: list[str], reps: int, seconds: float, folder: Path
) -> dict[str, dict]:
    db = folder / f"{label}.db"
    source_conn = sqlite3.connect(source)
    target = sqlite3.connect(db)
    source_conn.backup(target)  # a consistent copy, whatever WAL sits beside the cache
    source_conn.close()
    target.close()
    add_long_rows(db)
    table = calls(db)
    out: dict[str, dict] = {}
    with start_service(db, model_dir="off", tree=tree) as service:
        pid, client = service.popen.pid, Client(service.port, timeout=120)
        for name in names:
            method, path, query = table[name]
            for _ in range(2):
                status, body = ask(client, method, path, query)
            time.sleep(0.5)  # the words' background count
            cpu, wall = [], []
            for _ in range(reps):
                before, started = run_ns(pid), time.perf_counter()
                status, body = ask(client, method, path, query)
                wall.append(time.perf_counter() - started)
                cpu.append((run_ns(pid) - before) / 1e6)
            answer = json.loads(body) if body[:1] == b"{" else {}
            note = f"{status}"
            if "receipt" in answer:
                note += f" left out {len(answer['receipt'].get('words_left_out') or [])} words"
            alone, _ = ordinary_p50(service.port, seconds)
            stop = threading.Event()

            def repeat(method: str = method, path: str = path, query: dict = query, stop=stop) -> None:
                heavy = Client(service.port, timeout=120)
                while not stop.is_set():
                    ask(heavy, method, path, query)
                heavy.close()

            hog = threading.Thread(target=repeat, daemon=True)
            hog.start()
            beside, n = ordinary_p50(service.port, seconds)
            stop.set()
            hog.join()
            out[name] = {
                "cpu": statistics.median(cpu),
                "wall": statistics.median(wall),
                "alone": alone,
                "beside": beside,
                "n": n,
                "note": note,
            }
            print(
                f"  {label:>4} {name:24s} cpu {out[name]['cpu']:8.1f} ms  others' p50 {alone:6.1f} -> "
                f"{beside:6.1f} ms  {note}",
                flush=True,
            )
        client.close()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default="main", help="a git revision or a checkout's folder; none: this tree only")
    parser.add_argument("--size", default="100k")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--only", default="", help="comma-separated call names")
    args = parser.parse_args()
    source = gen_db.ensure_db(gen_db.parse_size(args.size))
    print(machine_note(), flush=True)
    with tempfile.TemporaryDirectory(prefix="heavy-calls-") as scratch:
        folder = Path(scratch)
        base = base_tree(args.base, folder)
        trees = ([("base", base)] if base else []) + [("this", ROOT)]
        names = args.only.split(",") if args.only else CALL_NAMES
        results = {label: measure(label, tree, source, names, args.reps, args.seconds, folder) for label, tree in trees}
    print(
        f"\n{args.size} fleet rows, keyword ranking; CPU per call (median of {args.reps}); an ordinary agent's "
        f"recall p50 alone -> while the call repeats on another connection"
    )
    head = "".join(f" | {label:>4} cpu ms (x ordinary) | others' p50 ms" for label, _ in trees)
    print(f"{'call':24s}{head}")
    ordinary = {label: results[label].get("recall-ordinary", {}).get("cpu") for label, _ in trees}
    for name in names:
        line = f"{name:24s}"
        for label, _ in trees:
            got = results[label][name]
            ratio = f"{got['cpu'] / ordinary[label]:5.0f}x" if ordinary[label] else ""
            line += f" | {got['cpu']:7.1f} {ratio} | {got['alone']:5.1f} -> {got['beside']:6.1f}"
        print(line)
    print(machine_note())
    return 0


CALL_NAMES = [
    "recall-ordinary",
    "recall-64-words",
    "recall-64-words-all",
    "recall-10k-q-all",
    "recall-long-rows",
    "recall-archive",
    "recall-tags-32",
    "events-nothing-from-0",
    "events-from-0",
    "as-of-recall",
    "stats",
]


if __name__ == "__main__":
    sys.exit(main())
