"""The fleet domain (bench/data/fleet) as the reranker sees it: each question's head rows and their features.

A library for bench/ltr_fit.py (ranking fitted on both domains), with a CLI that prints the fleet's figures.
The first batch's 320 facts (RANK_CLUSTERS) go into a scratch service run in this process (the real
solos_memory server on a temp database, its embedder on for hybrid, --model-dir off for keyword); every
question is asked through REST as its asker with k 20. While the service reranks, solos_rank.head_logits is
wrapped to record each head row's solos_rank.ltr_features: the very inputs the service's reranker reads,
so a refit on them serves as fitted. Fusion weights can be varied (solos_rank.LEG_WEIGHTS, patched in this
process only) since the head and its first-pass features depend on them.

The ranking reads the data set's first batch only (16 clusters, 8 per half): the shipped weights
(solos_rank.LTR_*_WEIGHTS) were fitted on it and tests/test_rank_weights.py holds them to it. The second batch
(ten more `fit` clusters, bench/data/fleet/README.md) was written for the judge; refitting the ranking on it
moves the hybrid weights and the candidates the judge was fitted on, a change to measure on its own.

Fleet facts are long facts whose topics are all distinct: no row has a topic neighbour, so the chat-structure
features (neighbours, previous row asks, first of topic) are constant there.

    .venv/bin/python bench/fleet_rank.py [--keyword-weight 0.7]     # about 30 s with the embedder
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import urllib.parse
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import http.client  # noqa: E402

from judge_data import CALIBRATE, fleet_data  # noqa: E402

import solos_memory  # noqa: E402
import solos_rank  # noqa: E402
import solos_store  # noqa: E402

K = 20
RANK_CLUSTERS = frozenset(
    ("payments", "search", "identity", "observability", "data-platform", "mobile", "ci-build", "office-it")
    + ("notifications", "storage", "edge", "ml-platform", "secops", "billing", "geo", "support")
)  # the first batch: every `score` cluster and the `fit` clusters the ranking weights were fitted on


def load_fleet(every: bool = False) -> tuple[list[dict], list[dict]]:
    """The fleet's facts and questions of RANK_CLUSTERS (every: of both batches of the `fit` and `score` halves,
    as bench/judge_data.py asks them; never the `calibrate` split, which no fit reads)."""
    facts, questions = fleet_data()
    ranked = lambda x: x["split"] != CALIBRATE and (every or x["domain_topic"] in RANK_CLUSTERS)  # noqa: E731
    return [f for f in facts if ranked(f)], [q for q in questions if ranked(q)]


class Capture:
    """solos_rank.head_logits wrapped: the last call's head row texts and each one's features; and
    solos_rank.fuse wrapped: the last call's texts in the order of each leg and of fusion, and the head's size."""

    def __init__(self) -> None:
        self.heads: list[tuple[list[str], list[dict]]] = []
        self.fusions: list[dict] = []
        self.original: Callable = solos_rank.head_logits
        self.original_fuse: Callable = solos_rank.fuse

    def __enter__(self) -> Capture:
        original, feature_fn, fuse = self.original, solos_rank.ltr_features, self.original_fuse

        def fused_recorded(candidates, similar, ranking, stems=frozenset()):
            by_keyword = sorted(
                (r for r in candidates.values() if r["keyword"] is not None), key=lambda r: -r["keyword"]
            )
            by_vector = sorted((key for key in similar if key in candidates), key=lambda key: -similar[key])
            keyword = [r["text"] for r in by_keyword]  # before fuse pops each row's keyword score
            fused = fuse(candidates, similar, ranking, stems)
            texts = [r["text"] for r in fused.rows]
            vector = [candidates[key]["text"] for key in by_vector]
            self.fusions.append({"keyword": keyword, "vector": vector, "fused": texts, "head": fused.head})
            return fused

        solos_rank.fuse = fused_recorded

        def head_logits(question, fused, rows, around, similar):
            seen: list[dict] = []

            def recorded(*args):
                features = feature_fn(*args)
                seen.append(features)
                return features

            solos_rank.ltr_features = recorded
            try:
                logits = original(question, fused, rows, around, similar)
            finally:
                solos_rank.ltr_features = feature_fn
            self.heads.append(([r["text"] for r in fused.rows[: fused.head]], seen))
            return logits

        solos_rank.head_logits = head_logits
        return self

    def __exit__(self, *exc) -> None:
        solos_rank.head_logits = self.original
        solos_rank.fuse = self.original_fuse


def request(port: int, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, data, {"Content-Type": "application/json"} if data else {})
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"{}")
    finally:
        conn.close()


def capture(
    mode: str, weights: tuple[float, float] | None = None, cosine: bool = False, every: bool = False
) -> list[dict]:
    """Per fleet question (in file order): its record and, when the reranker ran, the head's texts, features,
    labels (1 for an answer row) and the fact ids of the rows the service returned (k 20, min_relevance 0);
    `stages`: each leg's, fusion's and the head's fact ids, and with `cosine` (hybrid) every fact by cosine.
    `every`: both batches' facts and questions (load_fleet), not the ranking's first batch."""
    facts, questions = load_fleet(every)
    by_text = {f["fact"]: f["id"] for f in facts}
    agents = sorted({f["agent"] for f in facts} | {q["asker"] for q in questions})
    saved = solos_rank.LEG_WEIGHTS["hybrid"]
    if weights is not None:
        solos_rank.LEG_WEIGHTS["hybrid"] = weights
    with tempfile.TemporaryDirectory(prefix="fleet-rank-") as tmp:
        config = solos_memory.Config(
            db=str(Path(tmp) / "solos.db"), port=0, log_requests=False, model_dir="off" if mode == "keyword" else None
        )
        server = solos_memory.build_server(config, agents)
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        thread.start()
        port = server.server_address[1]
        out = []
        try:
            for f in facts:
                row = {"agent": f["agent"], "topic": f["topic"], "fact": f["fact"], "tags": f["tags"]}
                status, body = request(port, "POST", "/v1/long", row | {"source": "fleet-bench", "confidence": 0.9})
                assert status in (200, 201), body
            if mode == "hybrid":
                solos_memory.solos_embed_worker.embed_missing(server.memory.store, server.memory.embedder)
            with Capture() as seen:
                for q in questions:
                    query = {"agent": q["asker"], "q": q["question"], "k": K, "scope": "shared", "tiers": "long"}
                    query |= {"min_relevance": 0, "ranking": mode}
                    before = len(seen.heads)
                    status, body = request(port, "GET", "/v1/recall?" + urllib.parse.urlencode(query))
                    assert status == 200 and body["ranking"] == mode, body
                    assert mode == "keyword" or not body["degraded"], body["degraded_reason"]
                    record = {**q, "returned": [by_text[r["text"]] for r in body["results"]]}
                    if seen.fusions:
                        record["stages"] = {
                            k: [by_text[t] for t in v] for k, v in seen.fusions[-1].items() if k != "head"
                        }
                        record["stages"]["head"] = record["stages"]["fused"][: seen.fusions[-1]["head"]]
                        seen.fusions.clear()
                    if cosine and mode == "hybrid":
                        record["stages"]["cosine"] = by_cosine(server.memory.embedder, facts, q["question"])
                    if len(seen.heads) > before:
                        texts, features = seen.heads[-1]
                        ids = [by_text[t] for t in texts]
                        record |= {"head": ids, "features": features, "labels": [int(i in q["answers"]) for i in ids]}
                    out.append(record)
        finally:
            solos_rank.LEG_WEIGHTS["hybrid"] = saved
            server.shutdown()
            server.server_close()
            server.memory.close()
    return out


def by_cosine(embedder, facts: list[dict], question: str) -> list[str]:
    """Every fact's id, best cosine to the question first, over the very text the service embeds for it."""
    key = id(facts)
    if key not in EMBEDDED:
        EMBEDDED.clear()
        texts = [solos_store.TIER_TABLE["long"].embedding_text(f) for f in facts]
        EMBEDDED[key] = np.stack([np.frombuffer(blob, dtype="<f4") for blob in embedder.embed(texts)])
    cosine = EMBEDDED[key] @ np.frombuffer(embedder.embed([question])[0], dtype="<f4")
    return [facts[i]["id"] for i in np.argsort(-cosine, kind="stable")]


EMBEDDED: dict[int, np.ndarray] = {}  # by_cosine's fact vectors, for the facts list they were made of
STAGES = ("cosine", "keyword", "vector", "fused", "head", "returned")  # where an answer is looked for, in order


def stage_table(records: list[dict], split: str, kinds: tuple[str, ...] = ("paraphrase",)) -> list[str]:
    """Where each answerable question's best answer sits at each stage (1-based rank, "-" absent): the cosine
    over every fact, the keyword leg, the vector leg (its candidates), fusion (its seats moved up), the
    reranker's head (fusion's top and any vector seats) and the rows returned (reranked, k 20); then the share
    of questions with an answer within 5, within 20 and anywhere at each stage."""
    lines = [f"{'q':6}{'kind':12}" + "".join(f"{name:>9}" for name in STAGES) + "  question"]
    ranks: dict[str, list[int | None]] = {name: [] for name in STAGES}
    for r in records:
        if r["split"] != split or r["kind"] not in kinds or "stages" not in r:
            continue
        found = {**r["stages"], "returned": r["returned"]}
        row = []
        for name in STAGES:
            at = [i for i, fact in enumerate(found.get(name, []), 1) if fact in r["answers"]]
            ranks[name].append(min(at) if at else None)
            row.append("-" if not at else str(min(at)))
        lines.append(f"{r['id']:6}{r['kind']:12}" + "".join(f"{x:>9}" for x in row) + f"  {r['question'][:60]}")
    for depth in (5, 20, None):
        share = {
            name: sum(1 for x in v if x is not None and (depth is None or x <= depth)) / max(len(v), 1)
            for name, v in ranks.items()
        }
        label = f"{'within':6}{depth:<12}" if depth else f"{'present':18}"
        lines.append(label + "".join(f"{share[name]:>9.3f}" for name in STAGES))
    return lines


def as_data(records: list[dict], split: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """bench/ltr_fit.build's tuple (X, y, question index, candidate index) over one split's answerable questions."""
    X, y, qs, cs = [], [], [], []
    for qi, r in enumerate(records):
        if r["split"] != split or not r["answers"] or "features" not in r:
            continue
        X += [list(f.values()) for f in r["features"]]
        y += r["labels"]
        qs += [qi] * len(r["labels"])
        cs += list(range(len(r["labels"])))
    return np.array(X), np.array(y, dtype=float), np.array(qs), np.array(cs)


def reranked_ids(record: dict, score: Callable[[dict], float] | None) -> list[str]:
    """The question's rows in the order the service would give with this scoring of the head (None: as captured
    through REST, the service's own weights)."""
    if score is None or "features" not in record:
        return record["returned"]
    logits = [score(f) for f in record["features"]]
    order = sorted(range(len(logits)), key=lambda i: -logits[i])
    return [record["head"][i] for i in order]


def hits(records: list[dict], split: str, score: Callable[[dict], float] | None, k: int = 5) -> dict[str, float]:
    """hit@k of the split's answerable questions, overall and per kind."""
    per: dict[str, list[int]] = {}
    for r in records:
        if r["split"] != split or not r["answers"]:
            continue
        got = int(bool(set(reranked_ids(r, score)[:k]) & set(r["answers"])))
        per.setdefault("all", []).append(got)
        per.setdefault(r["kind"], []).append(got)
    return {kind: sum(v) / len(v) for kind, v in per.items()}


def weights_score(weights: tuple[float, ...]) -> Callable[[dict], float]:
    return lambda features: solos_rank.ltr_score(features, weights)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keyword-weight", type=float, default=None, help="hybrid fusion's keyword weight (0.7)")
    parser.add_argument(
        "--stages",
        default=None,
        help="hybrid only: where each answer sits, stage by stage, for this split (fit or score) and --kinds",
    )
    parser.add_argument("--kinds", default="paraphrase", help="with --stages: question kinds, comma-separated")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    fusion = None if args.keyword_weight is None else (args.keyword_weight, 1 - args.keyword_weight)
    if args.stages:
        records = capture("hybrid", fusion, cosine=True)
        print("\n".join(stage_table(records, args.stages, tuple(args.kinds.split(",")))))
        return 0
    for mode in ("keyword", "hybrid"):
        records = capture(mode, fusion if mode == "hybrid" else None)
        for split in ("fit", "score"):
            figures = hits(records, split, None)
            print(f"fleet {mode} {split}: " + " ".join(f"{k} {v:.3f}" for k, v in sorted(figures.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
