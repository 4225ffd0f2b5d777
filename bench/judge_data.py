"""Recall's own candidates per question, labelled, for fitting and scoring the judge.

Two domains, each loaded into a scratch service through REST (as bench/locomo.py runs one) and asked every
question with k=20 and min_relevance=0, so every row the reranker's head holds comes back with its `score`
(the reranker's probability) and its `relevance` (today's calibration: the service runs with the judge off,
SOLOS_MEMORY_JUDGE=off, since the judge reads that calibration and must not be fitted on its own output):

- fleet (bench/data/fleet): the facts as long facts by their agents (source `fleet-bench`, confidence 0.9
  for every row, so neither carries a signal), asked every question as its asker. A row is positive when it is
  one of the question's `answers`; an unanswerable question's rows are all negatives. The `fit` and `score`
  halves' questions are asked of a memory without the `calibrate` split's facts (the 520 of both halves), so
  no fitted or scored record meets a calibration fact; the `calibrate` split's questions (for choosing and
  calibrating the combination only: bench/cross_encoder.py's `fleet_role`) of a memory holding every fact.
- LoCoMo (the dev split): each conversation stored as bench/locomo.py stores it (one long fact per turn), asked
  its own questions (a row is positive when it is an evidence turn) and a seeded sample of the other
  conversations' questions (foreign: they play the unanswerable role, every row negative).

Both ranking modes are asked (hybrid: the embedder on; keyword: a service started with --model-dir off). Each
row also gets the raw cosine of the question and the row's embedded text (`Tier.embedding_text`: writer,
topic, text) from the same embedder, computed here, in both modes (the keyword rows' cosine is for analysis
only: the keyword judge does not read it).

One JSON object per (question, mode) in .cache/bench/judge-data-v2.jsonl; a second run reads the cache
(--refresh builds it again). About 6 minutes on 2 shared cores.

`--split calibrate --onto BASE --out F` asks only the fleet questions of that split (no LoCoMo) and writes F as
BASE's bytes unchanged followed by the new records: a cache whose fitted and scored records are BASE's, byte for
byte, with more calibration records (the held-out figures of a fixed combination read the same on both).

    .venv/bin/python bench/judge_data.py [--refresh] [--foreign-per-conversation 60] [--modes hybrid,keyword]
    .venv/bin/python bench/judge_data.py --split calibrate --onto .cache/bench/judge-data-v2.jsonl \
        --out .cache/bench/judge-data-v2-cal.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Collection, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from locomo_data import DEFAULT_DATA, REPO, agent_names, load_conversations  # noqa: E402
from locomo_service import Service, prepare, write_turns  # noqa: E402

import solos_judge  # noqa: E402

FLEET = REPO / "bench" / "data" / "fleet"
CACHE = REPO / ".cache" / "bench" / "judge-data-v2.jsonl"  # v2: relevance recorded with the judge off
DEPTH = 20  # the reranker's head (solos_rank.RERANK_DEPTH): every row there carries its relevance
READER = "locomo-reader"
SEED = 33


def recall_rows(service: Service, agent: str, question: str, mode: str, judged: bool = False) -> list[dict]:
    """Recall's rows for one question, best first, with every row of the reranked head (min_relevance 0).
    judged: the service's judge may set `relevance` (a side-by-side of what a caller gets), else it must be off."""
    query = urllib.parse.urlencode(
        {"agent": agent, "q": question, "k": DEPTH, "scope": "shared", "tiers": "long", "min_relevance": 0}
        | ({"ranking": "keyword"} if mode == "keyword" else {})
    )
    for _ in range(5):  # a degraded hybrid answer (the query's embedding timed out on a busy machine): ask again
        status, body = service.request("GET", f"/v1/recall?{query}")
        if status != 200:
            raise RuntimeError(f"recall answered {status}: {body}")
        if mode == "keyword" or not body.get("degraded"):
            break
        time.sleep(0.5)
    else:
        raise RuntimeError(f"hybrid recall stayed degraded: {body.get('degraded_reason')}")
    legs = body.get("receipt", {}).get("legs", [])
    if not judged and body.get("receipt", {}).get("judge") not in (
        None,
        "relevance",
    ):  # the judge reads the calibration, not itself
        raise RuntimeError(
            f"recall was judged by {body.get('receipt', {}).get('judge')!r}: start it with the judge off"
        )
    if mode == "hybrid" and (body.get("ranking") != "hybrid" or "vector" not in legs):
        # A service without its embedder answers keyword-only: such rows must never be cached as hybrid.
        raise RuntimeError(f"a hybrid recall answered ranking {body.get('ranking')!r} with legs {legs}")
    return [
        {
            "agent": r["agent"],
            "topic": r.get("topic") or "",
            "text": r["text"],
            "source": r.get("source"),
            "score": r["score"],
            "relevance": r.get("relevance"),
        }
        for r in body["results"]
    ]


def serve_args(mode: str) -> list[str]:
    return ["--model-dir", "off"] if mode == "keyword" else []


CALIBRATE = "calibrate"  # the fleet split that enters no fit and no score: it chooses and calibrates the combination


def fleet_data() -> tuple[list[dict], list[dict]]:
    """The fleet's facts and questions, in file order."""
    facts, questions = (
        [json.loads(line) for line in (FLEET / name).read_text().splitlines() if line.strip()]
        for name in ("facts.jsonl", "questions.jsonl")
    )
    return facts, questions


def memories(facts: list[dict], questions: list[dict], splits: Collection[str] | None = None) -> list[tuple]:
    """(the facts a memory holds, the questions asked of it): the questions of `splits` (None: every split) but
    the calibrate split's, of a memory without the calibrate split's facts; the calibrate split's, of every fact.
    A memory with no question to ask is left out."""
    asked = [q for q in questions if splits is None or q["split"] in splits]
    plain = [q for q in asked if q["split"] != CALIBRATE]
    calibrate = [q for q in asked if q["split"] == CALIBRATE]
    out = [([f for f in facts if f["split"] != CALIBRATE], plain), (facts, calibrate)]
    return [(held, qs) for held, qs in out if qs]


def fleet_records(
    modes: list[str], tree: Path = REPO, judged: bool = False, splits: Collection[str] | None = None
) -> Iterator[dict]:
    """Every fleet question (of `splits`; None: all) asked of its memory (`memories`), in each mode (`tree`'s
    service; `judged` as recall_rows)."""
    facts, questions = fleet_data()
    by_text = {f["fact"]: f["id"] for f in facts}
    assert len(by_text) == len(facts), "fleet facts must have distinct texts (rows are matched back by text)"
    agents = sorted({f["agent"] for f in facts} | {q["asker"] for q in questions})
    for mode in modes:
        for held, asked in memories(facts, questions, splits):
            with tempfile.TemporaryDirectory(prefix="judge-fleet-") as tmp:
                service = Service(sys.executable, Path(tmp) / "solos.db", agents, serve_args(mode), tree)
                try:
                    for f in held:
                        row = {"agent": f["agent"], "topic": f["topic"], "fact": f["fact"], "tags": f["tags"]}
                        status, body = service.request(
                            "POST", "/v1/long", row | {"source": "fleet-bench", "confidence": 0.9}
                        )
                        if status not in (200, 201):
                            raise RuntimeError(f"write of {f['id']} answered {status}: {body}")
                    prepare(service, mode)
                    for q in asked:
                        rows = recall_rows(service, q["asker"], q["question"], mode, judged)
                        answers = set(q["answers"])
                        for r in rows:
                            r["row_id"] = by_text[r["text"]]
                            r["label"] = int(r["row_id"] in answers)
                        yield {
                            "domain": "fleet",
                            "mode": mode,
                            "qid": q["id"],
                            "question": q["question"],
                            "kind": q["kind"],
                            "group": q["split"],  # fit | score | calibrate
                            "answerable": bool(answers),
                            "n_answers": len(answers),
                            "rows": rows,
                        }
                finally:
                    service.close()
            print(f"  fleet {mode}: {len(asked)} questions asked of {len(held)} facts", file=sys.stderr)


def locomo_records(
    modes: list[str], foreign_per_conversation: int, conversations: list, tree: Path = REPO, judged: bool = False
) -> Iterator[dict]:
    """Each conversation's service asked its own questions and a seeded sample of the others' (`tree`, `judged`:
    as fleet_records)."""
    pick = random.Random(SEED)
    foreign: list[list[tuple[int, int]]] = []
    for ci in range(len(conversations)):
        pool = [(cj, qi) for cj, c in enumerate(conversations) if cj != ci for qi in range(len(c.queries))]
        foreign.append(sorted(pick.sample(pool, min(foreign_per_conversation, len(pool)))))
    for mode in modes:
        for ci, conv in enumerate(conversations):
            agents = agent_names(conv.speakers + [t.speaker for t in conv.turns])
            asked = [(ci, qi) for qi in range(len(conv.queries))] + foreign[ci]
            with tempfile.TemporaryDirectory(prefix="judge-locomo-") as tmp:
                readers = [*agents.values(), READER]
                service = Service(sys.executable, Path(tmp) / "solos.db", readers, serve_args(mode), tree)
                try:
                    write_turns(service, conv.turns, agents)
                    prepare(service, mode)
                    for cj, qi in asked:
                        q = conversations[cj].queries[qi]
                        evidence = set(q.evidence) if cj == ci else set()
                        rows = recall_rows(service, READER, q.question, mode, judged)
                        for r in rows:
                            r["row_id"] = r["source"]
                            r["label"] = int(r["source"] in evidence)
                        yield {
                            "domain": "locomo",
                            "mode": mode,
                            "qid": f"{conversations[cj].sample_id}/{qi}",
                            "question": q.question,
                            "kind": f"cat{q.category}" if cj == ci else "foreign",
                            "group": ci,  # the conversation whose memory answered
                            "answerable": bool(evidence),
                            "n_answers": len(evidence),
                            "rows": rows,
                        }
                finally:
                    service.close()
            print(f"  locomo {mode}: conversation {ci + 1}/{len(conversations)} asked", file=sys.stderr)


def add_cosines(records: list[dict]) -> None:
    """The raw cosine of each question and each row's embedded text, from the service's own embedder."""
    import solos_embed

    embedder = solos_embed.load_embedder(None, threads=1)
    texts: dict[str, None] = {}
    for rec in records:
        texts[rec["question"]] = None
        for r in rec["rows"]:
            texts[embedding_text(r)] = None
    ordered = list(texts)
    vectors: dict = {}
    for start in range(0, len(ordered), 256):
        batch = ordered[start : start + 256]
        vectors.update(zip(batch, solos_embed.decode_vectors(embedder.embed(batch))))
    for rec in records:
        q = vectors[rec["question"]]
        for r in rec["rows"]:
            r["cosine"] = round(float(vectors[embedding_text(r)] @ q), 6)


def embedding_text(row: dict) -> str:
    """solos_store.Tier.embedding_text for a long fact."""
    return f"{row['agent']} ({row['topic']}): {row['text']}" if row["topic"] else f"{row['agent']}: {row['text']}"


def load(path: Path = CACHE) -> list[dict]:
    """The cached records (run this script first)."""
    if not path.exists():
        raise SystemExit(f"{path} is missing: run .venv/bin/python bench/judge_data.py first")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--refresh", action="store_true", help="build the cache again (default: reuse it)")
    parser.add_argument("--modes", default="hybrid,keyword", help="ranking modes to ask (default: hybrid,keyword)")
    parser.add_argument(
        "--foreign-per-conversation", type=int, default=200, help="foreign LoCoMo questions per conversation (200)"
    )
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help=f"LoCoMo's file (default: {DEFAULT_DATA})")
    parser.add_argument("--out", type=Path, default=CACHE, help=f"where the JSONL goes (default: {CACHE})")
    parser.add_argument(
        "--split", help="ask only the fleet questions of these splits (comma-separated, e.g. calibrate), no LoCoMo"
    )
    parser.add_argument(
        "--onto", type=Path, help="a cache whose bytes open --out unchanged, the new records after them"
    )
    args = parser.parse_args(argv)
    os.environ[solos_judge.OFF_VARIABLE] = "off"  # the services below inherit it
    if args.out.exists() and not args.refresh:
        print(f"{args.out}: cached ({sum(1 for _ in args.out.open())} records); --refresh builds it again")
        return 0
    if args.onto is not None and (args.split is None or args.onto.resolve() == args.out.resolve()):
        raise SystemExit("--onto wants --split and another --out (the base cache is read, never rewritten)")
    base = load(args.onto) if args.onto is not None else []
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    modes = [m for m in args.modes.split(",") if m]
    started = time.monotonic()
    if args.split is not None:
        splits = {s for s in args.split.split(",") if s}
        records = list(fleet_records(modes, splits=splits))
        seen = {(r["qid"], r["mode"]) for r in base}
        if any((r["qid"], r["mode"]) in seen for r in records):
            raise SystemExit(f"{args.onto} already holds questions of --split {args.split}")
    else:
        conversations = load_conversations(args.data)  # before the fleet's half: a missing file stops at once
        records = [*fleet_records(modes), *locomo_records(modes, args.foreign_per_conversation, conversations)]
    add_cosines(records)
    write(args.out, records, args.onto)
    rows = sum(len(r["rows"]) for r in records)
    print(
        f"{args.out}: {len(records)} records, {rows} rows"
        + (f" after {args.onto}'s {len(base)}" if args.onto else "")
        + f", {time.monotonic() - started:.0f} s"
    )
    return 0


def write(out: Path, records: list[dict], onto: Path | None = None) -> None:
    """The records as JSON lines, after `onto`'s bytes unchanged (its lines are the new file's first, as they
    were), written whole or not at all."""
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".part")
    with partial.open("wb") as f:
        if onto is not None:
            head = onto.read_bytes()
            f.write(head if not head or head.endswith(b"\n") else head + b"\n")
        for rec in records:
            f.write((json.dumps(rec, sort_keys=True) + "\n").encode())
    partial.replace(out)


if __name__ == "__main__":
    sys.exit(main())
