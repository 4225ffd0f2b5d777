"""Peak RSS of the running service with hybrid recall on a LoCoMo conversation: this tree against another checkout.

    .venv/bin/python bench/service_rss.py --base DIR [--conversation N] [--copies N] [--data LOCOMO.json]

DIR is another checkout of solos-memory, such as the last commit with the
fastembed loader: `git archive <commit> | tar -x -C DIR` (its embedder needs
fastembed==0.9.1 in this interpreter). Per tree, on a fresh database:

1. A keyword-only service of that tree (`--model-dir off`) takes the
   conversation's turns as long facts over REST and stops: rows, no vectors
   (--copies N: N distinct copies of the turns, for a larger vector matrix).
   This tree's keyword-only service also answers every question: the floor.
2. `solos_memory.py backfill` on a copy of the database (its own process,
   every core): rows/s, from its `backfilled` line (load not included).
3. The service starts with its embedder (seconds to the listening line, RSS
   then) and embeds the rows in its background worker (one thread, as in
   service): catch-up rows/s, from the listening line to `embed_backlog` 0.
4. Every question goes to /v1/recall as the reader (hybrid, long tier,
   shared scope; none may come back degraded): p50/p99.
5. VmHWM (peak RSS) and VmRSS from /proc/PID/status, then it stops.

Then a child process per tree loads its embedder as the service does
(threads=1) and embeds each question alone: the query embedding's p50/p99.
Prints one column per tree and the ratio this/base. Findings:
bench/RESULTS-locomo.md, "Embedder memory".
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import ROOT, Client, Process, machine_note, percentiles
from locomo_data import DEFAULT_DATA, agent_names, load_conversations
from locomo_service import READER, recall_ids, write_turns

CATCH_UP_TIMEOUT_S = 900
OFFLINE = {**os.environ, "HF_HUB_OFFLINE": "1"}
QUERY_EMBED_CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import solos_embed
questions = json.load(sys.stdin)
embedder = solos_embed.load_embedder(None, threads=1)  # as the service loads it
embedder.embed(questions[:5])
samples = []
for question in questions:
    started = time.perf_counter()
    embedder.embed([question])
    samples.append(time.perf_counter() - started)
print(json.dumps({"model": embedder.model_id, "samples": samples}))
"""


class Rest:
    """What locomo_service.write_turns and recall_ids call: request(method, path, body) -> (status, JSON)."""

    def __init__(self, port: int) -> None:
        self.client = Client(port, timeout=60)

    def request(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        return self.client.json(method, path, body)


def memory_mib(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM (the peak) of a process, in MiB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0]) / 1024
    return fields


def serve(tree: Path, db: Path, extra: list[str]) -> Process:
    argv = [sys.executable, str(tree / "solos_memory.py"), "serve", "--db", str(db), "--port", "0", "--no-request-log"]
    return Process(argv + extra, OFFLINE)


def cli(tree: Path, db: Path, *args: str) -> str:
    """Run a solos_memory.py command of tree on db; its stderr."""
    argv = [sys.executable, str(tree / "solos_memory.py"), *args, "--db", str(db)]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, env=OFFLINE)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr[-2000:]}")
    return done.stderr


def ask(rest: Rest, questions: list[str], mode: str = "hybrid") -> tuple[dict, int]:
    """Every question through /v1/recall; latency percentiles and how many answers were degraded."""
    samples, degraded = [], 0
    for question in questions:
        started = time.perf_counter()
        degraded += recall_ids(rest, question, mode)[1]
        samples.append(time.perf_counter() - started)
    return percentiles(samples), degraded


def measure(tree: Path, folder: Path, conv, copies: int, floor: bool) -> dict:
    """Steps 1-5 above for one tree; the floor's figures too when asked."""
    db = folder / "solos.db"
    agents = agent_names(conv.speakers + [t.speaker for t in conv.turns])
    questions = [q.question for q in conv.queries]
    cli(tree, db, "agents", "add", *agents.values(), READER)
    result: dict = {}
    with serve(tree, db, ["--model-dir", "off"]) as keyword:
        rest = Rest(keyword.port)
        for copy in range(copies):
            write_turns(rest, conv.turns, agents, copy)
        if floor:
            result["floor_recall"], _ = ask(rest, questions, "keyword")  # degraded by design: never asked again
            result["floor_peak"] = memory_mib(keyword.popen.pid)["VmHWM"]
        rest.client.close()
    copy = folder / "backfill.db"
    shutil.copy(db, copy)
    done = [json.loads(line) for line in cli(tree, copy, "backfill").splitlines() if line.startswith("{")]
    backfilled = next(record for record in done if record.get("event") == "backfilled")
    result["backfill_per_s"] = backfilled["rows"] / max(backfilled["seconds"], 0.1)

    started = time.monotonic()
    with serve(tree, db, []) as service:
        listening = time.monotonic()
        result["start_s"] = listening - started
        result["listening_rss"] = memory_mib(service.popen.pid)["VmRSS"]
        line = next(json.loads(text) for text in service.tail if '"listening"' in text)
        backlog = line.get("embed_backlog") or 0
        rest = Rest(service.port)
        while (health := rest.request("GET", "/health")[1])["embedder_state"] != "ready":
            if health["embedder_state"] not in ("catching_up",) or time.monotonic() - listening > CATCH_UP_TIMEOUT_S:
                raise RuntimeError(f"{tree}: the embedder did not catch up: {health}")
            time.sleep(0.05)
        result["catch_up_per_s"] = backlog / max(time.monotonic() - listening, 1e-3)
        result["recall"], result["degraded"] = ask(rest, questions)
        result.update(memory_mib(service.popen.pid))
        rest.client.close()

    child = subprocess.run(
        [sys.executable, "-c", QUERY_EMBED_CHILD, str(tree)],
        input=json.dumps(questions),
        capture_output=True,
        text=True,
        check=True,
        env=OFFLINE,
    )
    embedded = json.loads(child.stdout.strip().splitlines()[-1])
    result["model"], result["query_embed"] = embedded["model"], percentiles(embedded["samples"])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=str(DEFAULT_DATA), help="LoCoMo JSON (default: %(default)s)")
    parser.add_argument("--base", type=Path, required=True, help="the other checkout (no default)")
    parser.add_argument("--conversation", type=int, default=0, help="which conversation, from 0 (default: %(default)s)")
    parser.add_argument("--copies", type=int, default=1, help="copies of its turns written (default: %(default)s)")
    args = parser.parse_args(argv)
    conv = load_conversations(Path(args.data))[args.conversation]
    print(machine_note())
    n_rows = len(conv.turns) * args.copies
    print(f"LoCoMo {conv.sample_id}: {n_rows} rows ({args.copies} x {len(conv.turns)} turns), ", end="")
    print(f"{len(conv.queries)} questions; base {args.base}")
    results = {}
    for name, tree in (("base", args.base.resolve()), ("this", ROOT)):
        with tempfile.TemporaryDirectory(prefix=f"service-rss-{name}-") as folder:
            results[name] = measure(tree, Path(folder), conv, args.copies, floor=name == "this")
    base, this = results["base"], results["this"]
    print(f"keyword-only (this tree, --model-dir off): peak RSS {this['floor_peak']:.0f} MiB, ", end="")
    print(f"recall p50 {this['floor_recall']['p50']:.1f} ms")
    print(f"models: base {base['model']}, this {this['model']}")
    rows = [
        ("peak RSS (VmHWM), MiB", "VmHWM", "{:.0f}"),
        ("RSS at the end, MiB", "VmRSS", "{:.0f}"),
        ("RSS when listening, MiB", "listening_rss", "{:.0f}"),
        ("start to listening, s", "start_s", "{:.2f}"),
        ("catch-up in service, rows/s", "catch_up_per_s", "{:.0f}"),
        ("backfill command, rows/s", "backfill_per_s", "{:.0f}"),
        ("query embedding p50, ms", ("query_embed", "p50"), "{:.2f}"),
        ("query embedding p99, ms", ("query_embed", "p99"), "{:.2f}"),
        ("hybrid recall p50, ms", ("recall", "p50"), "{:.2f}"),
        ("hybrid recall p99, ms", ("recall", "p99"), "{:.2f}"),
        ("degraded answers", "degraded", "{:.0f}"),
    ]
    print(f"{'':<30}{'base':>10}{'this':>10}{'this/base':>11}")
    for label, key, form in rows:
        b, t = (r[key[0]][key[1]] if isinstance(key, tuple) else r[key] for r in (base, this))
        ratio = f"{t / b:.2f}x" if b else "-"
        print(f"{label:<30}{form.format(b):>10}{form.format(t):>10}{ratio:>11}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
