#!/usr/bin/env python3
"""A seeded, realistic fleet database for the benches, cached by size and seed.

    python3 bench/gen_db.py [--size 10k|100k|1m|N] [--seed 7] [--vocab zipf|30] [--force]

Size N means N episodic rows, N/10 long facts and N/100 short rows (at least
100), so "1m" is 100k long + 1M episodic. Written by 11 agents with
a Zipf-like share of the writing. Text is drawn from a Zipf-distributed
vocabulary (s = 1.07 over ~40k words: English function words and ops terms at
the head, a synthetic long tail), so a content word matches a few rows and a
function word most of them, as in real notes. About 4% of long facts repeat
another agent's fact word for word, 1% of episodes repeat an earlier summary,
half of the short rows are expired. Three agents opt in to episodic sharing;
each agent has a persona/<agent> durable record.

`--vocab 30` is the worst case: 30 words, uniform, so every
term matches ~40% of rows.

The schema is the service's own (`solos_memory.Store(path).migrate()`); rows go
in with plain INSERTs in large transactions so the schema's FTS5 triggers
index them as they would index the fleet's writers. Timestamps are anchored
to a fixed date so the file is the same on every run; live short rows expire
in 2031, expired ones before the anchor. The database is cached under
.cache/bench/ (gitignored) and built into a temp file renamed into place.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import random
import sqlite3
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import solos_memory  # noqa: E402

GEN_VERSION = 1  # bump when the generated content changes, so caches rebuild
CACHE_DIR = ROOT / ".cache" / "bench"
AGENTS = ("atlas", "sol", "hermes", "nova", "orion", "vega", "lyra", "castor", "pollux", "rigel", "deneb")
SHARING_AGENTS = ("hermes", "vega", "deneb")
ANCHOR = 1_780_000_000.0  # 2026-05-28: every generated time is before it, so files are reproducible
LIVE_EXPIRY = "2031-01-01T00:00:00.000Z"
BATCH = 20_000
ZIPF_S = 1.07

FUNCTION_WORDS = (
    "the to of and a in for is on was with at by from that it this as be after not but are we were or "
    "before when if all has have so no new an into out up then because can will should than its over "
    "still only now also again about until there which what while each more one two some during against"
).split()
OPS_WORDS = (
    "deploy backup gateway certificate cluster node service database migration rollback latency error "
    "timeout disk memory cpu queue worker job cron schedule release build test pipeline config secret "
    "token rotate renew expire alert page incident outage restart upgrade patch kernel network dns proxy "
    "cache index replica shard snapshot restore retention log metric trace dashboard threshold quota "
    "limit rate request response client server api endpoint route handler thread lock write read query "
    "schema table row vector embedding model prompt agent task plan review merge branch commit tag "
    "version staging production canary traffic load balancer firewall port tls ssh key user account "
    "permission role policy audit compliance budget cost invoice report summary meeting customer ticket "
    "escalation runbook oncall handoff nightly weekly daily hourly utc region zone volume bucket storage "
    "object upload download sync async retry backoff failure success partial degraded healthy unhealthy"
).split()
TOPICS = (
    "infra backups deploys security networking databases billing customers oncall releases "
    "monitoring storage identity scheduling models prompts compliance costs hiring docs"
).split()
TAGS = (
    "ops prod staging urgent followup decision policy howto bug fix perf security cost customer "
    "infra data ml release oncall weekly"
).split()
SOURCES = ("runbook", "slack", "postmortem", "ticket", "meeting-notes", "agent-observation", "docs", None)
EVENT_TYPES = (
    "task",
    "deploy",
    "incident",
    "review",
    "meeting",
    "backup",
    "alert",
    "migration",
    "test",
    "handoff",
    "research",
    "purchase",
    "rollback",
    "upgrade",
    "audit",
)
OUTCOMES = ("success", "success", "success", "failure", "partial", None)
SIZES = {"10k": 10_000, "100k": 100_000, "1m": 1_000_000}
VOCAB_30 = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar "
    "papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu amber cobalt ivory jade"
).split()
SYLLABLES = (
    "ka ro mi ten sa lu vo ri na de po fi ga tu le ms bre cor dan el fa gri hol ix jun "
    "kel mor nex ob pra quen rus sil tor ul ven wy xan yor zel"
).split()


def parse_size(text: str) -> int:
    text = text.lower()
    if text in SIZES:
        return SIZES[text]
    if text.endswith("k"):
        return int(float(text[:-1]) * 1000)
    if text.endswith("m"):
        return int(float(text[:-1]) * 1_000_000)
    return int(text)


def size_label(size: int) -> str:
    for label, value in SIZES.items():
        if value == size:
            return label
    return str(size)


class Vocabulary:
    """Words ranked most frequent first, drawn with Zipf weights (1/rank^s)."""

    def __init__(self, rng: random.Random, kind: str):
        if kind == "30":
            self.words = list(VOCAB_30)
            weights = [1.0] * len(self.words)
        else:
            tail = set()
            while len(tail) < 40_000:
                tail.add("".join(rng.choice(SYLLABLES) for _ in range(rng.choice((2, 2, 3, 3, 4)))))
            tail -= set(FUNCTION_WORDS) | set(OPS_WORDS)
            tail = sorted(tail)
            rng.shuffle(tail)
            head = list(FUNCTION_WORDS)
            ops = list(OPS_WORDS)
            rng.shuffle(ops)
            # Function words lead, ops terms interleave the upper ranks, the synthetic tail follows.
            self.words = (
                head[:20]
                + [w for pair in itertools.zip_longest(head[20:], ops[: len(head) - 20]) for w in pair if w]
                + ops[len(head) - 20 :]
                + tail
            )
            weights = [1.0 / (rank**ZIPF_S) for rank in range(1, len(self.words) + 1)]
        self.cumulative = list(itertools.accumulate(weights))
        self.rank = {word: i for i, word in enumerate(self.words)}

    def draw(self, rng: random.Random, count: int) -> list[str]:
        return rng.choices(self.words, cum_weights=self.cumulative, k=count)


class Writer:
    """Makes the rows; one rng so the whole database follows from the seed."""

    def __init__(self, seed: int, vocab: str):
        self.rng = random.Random(seed)
        self.vocab = Vocabulary(self.rng, vocab)
        self.agent_weights = list(itertools.accumulate(1.0 / (i + 1) ** 0.8 for i in range(len(AGENTS))))
        self.counter = itertools.count(1)

    def agent(self) -> str:
        return self.rng.choices(AGENTS, cum_weights=self.agent_weights)[0]

    def sentence(self, low: int, high: int) -> str:
        """Words with an occasional entity (host, version, ticket) and punctuation."""
        rng = self.rng
        words = self.vocab.draw(rng, rng.randint(low, high))
        if rng.random() < 0.5:
            words.insert(
                rng.randrange(len(words) + 1),
                rng.choice(
                    (
                        f"db-{rng.randint(1, 40):02d}",
                        f"v{rng.randint(1, 9)}.{rng.randint(0, 30)}",
                        f"INC-{rng.randint(100, 9999)}",
                        f"{rng.randint(0, 23):02d}:{rng.choice(('00', '15', '30', '45'))}",
                        f"gw-{rng.randint(1, 12)}",
                        f"{rng.randint(1, 500)}ms",
                    )
                ),
            )
        text = " ".join(words)
        if len(words) > 12 and rng.random() < 0.6:
            cut = text.find(" ", len(text) // 2)
            if cut > 0:
                text = text[:cut] + rng.choice((",", ";", ".")) + text[cut:]
        return text[0].upper() + text[1:] + "."

    def iso(self, epoch: float) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(epoch)) + f".{int(epoch % 1 * 1000):03d}Z"

    def times(self, count: int, span_days: float) -> list[str]:
        """count increasing timestamps over the span before ANCHOR."""
        start = ANCHOR - span_days * 86400
        step = span_days * 86400 / max(count, 1)
        return [self.iso(start + i * step + self.rng.random() * step) for i in range(count)]

    def longs(self, count: int):
        rng = self.rng
        stamps = self.times(count, 365)
        recent: list[str] = []
        for stamp in stamps:
            agent = self.agent()
            if recent and rng.random() < 0.04:
                fact = rng.choice(recent)  # another agent noted the same fact
            else:
                fact = self.sentence(10, 40)
                if len(recent) < 2000:
                    recent.append(fact)
                else:
                    recent[rng.randrange(2000)] = fact
            tags = json.dumps(sorted(set(rng.sample(TAGS, rng.randint(0, 3)))))
            yield (
                agent,
                rng.choice(TOPICS),
                fact,
                rng.choice(SOURCES),
                round(rng.uniform(0.3, 1.0), 2),
                tags,
                stamp,
                stamp,
            )

    def episodes(self, count: int):
        rng = self.rng
        stamps = self.times(count, 180)
        recent: list[str] = []
        for stamp in stamps:
            if recent and rng.random() < 0.01:
                summary = rng.choice(recent)
            else:
                summary = self.sentence(6, 16)
                if len(recent) < 500:
                    recent.append(summary)
                else:
                    recent[rng.randrange(500)] = summary
            details = self.sentence(15, 60) if rng.random() < 0.8 else None
            yield (
                self.agent(),
                rng.choice(EVENT_TYPES),
                summary,
                details,
                rng.choice(OUTCOMES),
                round(rng.lognormvariate(3, 1.5), 1),
                stamp,
            )

    def shorts(self, count: int):
        rng = self.rng
        stamps = self.times(count, 20)
        for i, stamp in enumerate(stamps):
            expired = i % 2 == 0
            expires = self.iso(ANCHOR - rng.uniform(60, 10 * 86400)) if expired else LIVE_EXPIRY
            tags = json.dumps(sorted(set(rng.sample(TAGS, rng.randint(0, 2)))))
            yield (self.agent(), f"task-{i}", self.sentence(4, 15), tags, stamp, expires)


def cache_path(size: int, seed: int, vocab: str) -> Path:
    """Keyed by size, seed and vocabulary, and by the generator's and the schema's versions."""
    schema = hashlib.sha256((ROOT / "schema.sql").read_bytes()).hexdigest()[:8]
    return CACHE_DIR / f"fleet-v{GEN_VERSION}-{schema}-{size_label(size)}-seed{seed}-vocab{vocab}.db"


def generate(path: Path, size: int, seed: int, vocab: str, log=print) -> None:
    """Build the database at path (schema from the service, then bulk rows)."""
    started = time.monotonic()
    solos_memory.Store(str(path)).migrate()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA synchronous=OFF")  # a scratch build: durability comes from the final rename
    conn.execute("PRAGMA cache_size=-262144")
    writer = Writer(seed, vocab)
    conn.execute("BEGIN")
    conn.executemany("INSERT INTO agent_registry (agent, role) VALUES (?, 'bench')", [(a,) for a in AGENTS])
    conn.executemany(
        "INSERT INTO memory_durable (key, value) VALUES (?, ?)",
        [(f"persona/{a}", f"I am {a}, one of the fleet's agents. " + writer.sentence(10, 30)) for a in AGENTS],
    )
    conn.executemany("INSERT INTO episodic_sharing (agent, shared) VALUES (?, 1)", [(a,) for a in SHARING_AGENTS])
    conn.execute("COMMIT")
    plan = (
        (
            "long",
            max(size // 10, 10),
            writer.longs,
            "INSERT INTO memory_longterm (agent, topic, fact, source, confidence, tags, created_at, updated_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        ),
        (
            "episodic",
            size,
            writer.episodes,
            "INSERT INTO memory_episodic (agent, event_type, summary, details, outcome, duration_s, timestamp) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
        ),
        (
            "short",
            max(size // 100, 100),
            writer.shorts,
            "INSERT INTO memory_short (agent, key, value, tags, created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?)",
        ),
    )
    for tier, count, rows, sql in plan:
        produced = rows(count)
        done = 0
        while done < count:
            batch = list(itertools.islice(produced, BATCH))
            conn.execute("BEGIN")
            conn.executemany(sql, batch)
            conn.execute("COMMIT")
            done += len(batch)
            if done % (BATCH * 10) == 0 or done == count:
                log(f"  {tier}: {done:,}/{count:,} rows, {time.monotonic() - started:.0f} s")
    finish(conn)


def finish(conn: sqlite3.Connection) -> None:
    """Long facts written through the service carry their content key, so these get theirs; then a file
    with no WAL left and fresh planner statistics, closed."""
    conn.execute("BEGIN")
    conn.executemany(
        "INSERT OR IGNORE INTO memory_write_key (agent, tier, key, row_id) VALUES (?, 'long', ?, ?)",
        (
            (agent, hashlib.sha256(fact.encode()).hexdigest(), row_id)
            for row_id, agent, fact in conn.execute("SELECT id, agent, fact FROM memory_longterm").fetchall()
        ),
    )
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.execute("ANALYZE")
    conn.close()


def ensure_db(size: int, seed: int = 7, vocab: str = "zipf", force: bool = False, log=print) -> Path:
    """The cached database for (size, seed, vocab), generating it if missing."""
    path = cache_path(size, seed, vocab)
    if path.exists() and not force:
        return path
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    scratch = path.with_suffix(f".tmp{os.getpid()}")
    for leftover in (scratch, Path(f"{scratch}-wal"), Path(f"{scratch}-shm")):
        leftover.unlink(missing_ok=True)
    log(f"generating {path.name} ({size:,} episodic rows, vocab {vocab}, seed {seed})")
    started = time.monotonic()
    generate(scratch, size, seed, vocab, log)
    os.replace(scratch, path)
    for leftover in (Path(f"{scratch}-wal"), Path(f"{scratch}-shm")):
        leftover.unlink(missing_ok=True)
    log(f"generated in {time.monotonic() - started:.1f} s: {path.stat().st_size / 1e6:.0f} MB")
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--size", default="10k", help="10k, 100k, 1m or a number of episodic rows (default: %(default)s)"
    )
    parser.add_argument("--seed", type=int, default=7, help="generator seed (default: %(default)s)")
    parser.add_argument("--vocab", choices=("zipf", "30"), default="zipf", help="vocabulary (default: %(default)s)")
    parser.add_argument("--force", action="store_true", help="rebuild even if cached (default: reuse)")
    args = parser.parse_args()
    path = ensure_db(parse_size(args.size), args.seed, args.vocab, args.force)
    conn = sqlite3.connect(path)
    for table in ("memory_longterm", "memory_episodic", "memory_short", "agent_registry"):
        print(f"{table}: {conn.execute(f'SELECT count(*) FROM {table}').fetchone()[0]:,} rows")
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
