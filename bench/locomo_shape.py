"""LoCoMo-shaped databases for the speed benches: long conversational turns and real questions.

    python3 bench/locomo_shape.py [--rows 10k] [--data LOCOMO.json]

The generated fleet data (gen_db.py) has short texts and 2-3 word queries;
chat memory has long turns and questions of ten words or more, which cost
recall more. Here every turn of the LoCoMo file becomes a long fact
of its speaker (topic: the session's date, tags: locomo and the session), as
bench/locomo.py writes them through REST; past the file's 2,760 turns they
repeat, each pass with a " (copy N)" suffix on fact and topic, so a larger
database holds the same text many times over, as a fleet that repeats itself
does. Rows go in with plain INSERTs (the schema's triggers index them as they
would the fleet's own writers), with their write keys, into a temp file
renamed into place under .cache/bench/, keyed by rows, data and schema.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sqlite3
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import gen_db
from locomo_data import DEFAULT_DATA, Conversation, agent_names, load_conversations

READER = "locomo-reader"
BATCH = 20_000


def cache_path(rows: int, data: Path) -> Path:
    schema = hashlib.sha256((gen_db.ROOT / "schema.sql").read_bytes()).hexdigest()[:8]
    source = hashlib.sha256(Path(data).read_bytes()).hexdigest()[:8]
    return gen_db.CACHE_DIR / f"locomo-v1-{schema}-{source}-{gen_db.size_label(rows)}.db"


def turn_rows(conversations: list[Conversation], rows: int) -> Iterator[tuple[str, str, str, str, str]]:
    """(agent, topic, fact, source, tags) for `rows` long facts: the file's turns, then copies of them."""
    turns = [t for c in conversations for t in c.turns]
    agents = agent_names([t.speaker for t in turns])
    for n in range(rows):
        turn, copy = turns[n % len(turns)], n // len(turns)
        mark = f" (copy {copy})" if copy else ""
        topic = (turn.date or f"session {turn.session}") + mark
        tags = json.dumps(["locomo", f"session_{turn.session}"])
        yield agents[turn.speaker], topic, turn.fact + mark, turn.dia_id, tags


def generate(path: Path, rows: int, conversations: list[Conversation], log: Callable = print) -> None:
    started = time.monotonic()
    gen_db.solos_memory.Store(str(path)).migrate()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA synchronous=OFF")  # a scratch build: durability comes from the final rename
    conn.execute("PRAGMA cache_size=-262144")
    speakers = agent_names([t.speaker for c in conversations for t in c.turns])
    conn.execute("BEGIN")
    conn.executemany("INSERT INTO agent_registry (agent, role) VALUES (?, 'bench')", [(a,) for a in speakers.values()])
    conn.execute("INSERT INTO agent_registry (agent, role) VALUES (?, 'bench')", (READER,))
    conn.execute("COMMIT")
    produced = turn_rows(conversations, rows)
    done = 0
    while done < rows:
        batch = [next(produced) for _ in range(min(BATCH, rows - done))]
        conn.execute("BEGIN")
        conn.executemany(
            "INSERT INTO memory_longterm (agent, topic, fact, source, confidence, tags) VALUES (?, ?, ?, ?, 1.0, ?)",
            batch,
        )
        conn.execute("COMMIT")
        done += len(batch)
        log(f"  long: {done:,}/{rows:,} rows, {time.monotonic() - started:.0f} s")
    gen_db.finish(conn)


def ensure_db(rows: int, data: Path = DEFAULT_DATA, log: Callable = print) -> Path:
    """The cached LoCoMo-shaped database of `rows` long facts, generated if missing."""
    conversations = load_conversations(data)  # a missing file stops here, in one line naming it
    path = cache_path(rows, data)
    if path.exists():
        return path
    gen_db.CACHE_DIR.mkdir(parents=True, exist_ok=True)
    scratch = path.with_suffix(f".tmp{os.getpid()}")
    log(f"generating {path.name} ({rows:,} LoCoMo turns as long facts)")
    generate(scratch, rows, conversations, log)
    os.replace(scratch, path)
    for leftover in (Path(f"{scratch}-wal"), Path(f"{scratch}-shm")):
        leftover.unlink(missing_ok=True)
    return path


def questions(data: Path, count: int, seed: int) -> list[str]:
    """`count` real LoCoMo questions (those with evidence), drawn with `seed`."""
    asked = [q.question for c in load_conversations(data) for q in c.queries]
    return random.Random(seed).sample(asked, min(count, len(asked)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="10k", help="long facts: 1k, 10k, 100k, 1m or N (default: %(default)s)")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="LoCoMo file (default: %(default)s)")
    args = parser.parse_args()
    print(ensure_db(gen_db.parse_size(args.rows), args.data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
