"""The LoCoMo data set as the benches read it: its conversations, the metrics, and the reference BM25.

Stdlib only. bench/locomo.py drives the service with it; bench/locomo_simulate.py simulates the service on
it. The data lives outside the repository (../shared/data/locomo beside it): a missing file stops the bench
with one line naming it. Metric definitions: ../shared/data/locomo/README.md.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DATA = (REPO / ".." / "shared" / "data" / "locomo" / "locomo-dev.json").resolve()
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
METRICS = ("hit@1", "hit@5", "hit@10", "all@5", "all@10", "frac@5", "frac@10", "MRR")
AGENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")

# ==== Data ====


@dataclass
class Turn:
    dia_id: str
    speaker: str
    text: str
    caption: str
    session: int
    date: str

    @property
    def fact(self) -> str:
        """The text stored as the memory: the turn, plus the shared image's caption."""
        return f"{self.text} [image: {self.caption}]" if self.caption else self.text


@dataclass
class Query:
    question: str
    category: int
    evidence: list[str]


@dataclass
class Conversation:
    sample_id: str
    speakers: list[str]
    turns: list[Turn]
    queries: list[Query] = field(default_factory=list)


def normalise_evidence(raw: list[str], known: set[str]) -> list[str]:
    """Fix malformed evidence ids ("D8:6; D9:17", "D:11:26", "D30:05") and drop unknown ones."""
    ids: list[str] = []
    for item in raw:
        for session, turn in re.findall(r"(\d+)\s*:\s*(\d+)", str(item)):
            dia_id = f"D{int(session)}:{int(turn)}"
            if dia_id in known and dia_id not in ids:
                ids.append(dia_id)
    return ids


def load_conversations(path: Path) -> list[Conversation]:
    """Parse a LoCoMo file; queries without any valid evidence are left out.

    The data set lives outside the repository: a missing file stops the bench with one line naming it.
    """
    if not Path(path).is_file():
        raise SystemExit(f"LoCoMo data not found: {path} (give its path with --data)")
    conversations = []
    for sample in json.loads(Path(path).read_text()):
        conv = sample["conversation"]
        sessions = sorted((int(m.group(1)), key) for key in conv if (m := re.fullmatch(r"session_(\d+)", key)))
        turns = [
            Turn(t["dia_id"], t["speaker"], t["text"], t.get("blip_caption") or "", n, conv.get(f"{key}_date_time", ""))
            for n, key in sessions
            for t in conv[key]
        ]
        known = {t.dia_id for t in turns}
        queries = []
        for qa in sample["qa"]:
            evidence = normalise_evidence(qa.get("evidence") or [], known)
            if evidence:
                queries.append(Query(str(qa["question"]), int(qa["category"]), evidence))
        conversations.append(Conversation(sample["sample_id"], [conv["speaker_a"], conv["speaker_b"]], turns, queries))
    return conversations


def agent_name(speaker: str) -> str:
    """A speaker's name as a registrable agent name (^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$): "Éva" -> "Eva"."""
    ascii_name = unicodedata.normalize("NFKD", speaker).encode("ascii", "ignore").decode()
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", ascii_name).strip("_.-")[:64] or "speaker"
    return name if AGENT_NAME.match(name) else f"s{name}"[:64]


def agent_names(speakers: list[str]) -> dict[str, str]:
    """Each speaker's agent name, made distinct when two speakers normalise alike."""
    names: dict[str, str] = {}
    for speaker in dict.fromkeys(speakers):
        name, n = agent_name(speaker), 1
        while name in names.values():
            n += 1
            name = f"{agent_name(speaker)[:60]}-{n}"
        names[speaker] = name
    return names


# ==== Metrics ====


def score(ranked: list[str], evidence: list[str]) -> dict[str, float]:
    """The metrics of one query: ranked dia_ids (best first) against its evidence ids."""
    wanted = set(evidence)
    top = {k: set(ranked[:k]) & wanted for k in (1, 5, 10)}
    first = next((i for i, d in enumerate(ranked[:10]) if d in wanted), None)
    return {
        "hit@1": float(bool(top[1])),
        "hit@5": float(bool(top[5])),
        "hit@10": float(bool(top[10])),
        "all@5": float(top[5] == wanted),
        "all@10": float(top[10] == wanted),
        "frac@5": len(top[5]) / len(wanted),
        "frac@10": len(top[10]) / len(wanted),
        "MRR": 0.0 if first is None else 1.0 / (first + 1),
    }


def summarise(rows: list[tuple[int, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Mean of each metric per category name and "overall"; "n" is the query count."""
    groups: dict[str, list[dict[str, float]]] = defaultdict(list)
    for category, metrics in rows:
        groups[CATEGORIES.get(category, str(category))].append(metrics)
        groups["overall"].append(metrics)
    order = [*CATEGORIES.values(), "overall"]
    return {
        name: {"n": len(groups[name]), **{m: sum(r[m] for r in groups[name]) / len(groups[name]) for m in METRICS}}
        for name in order
        if groups[name]
    }


def format_table(title: str, summary: dict[str, dict[str, float]]) -> str:
    """A fixed-width table of a summary, categories as rows."""
    lines = [title, f"{'category':<12}{'n':>6}" + "".join(f"{m:>9}" for m in METRICS)]
    for name, row in summary.items():
        lines.append(f"{name:<12}{row['n']:>6}" + "".join(f"{row[m]:>9.3f}" for m in METRICS))
    return "\n".join(lines)


# ==== Reference: plain Okapi BM25 on the raw turn text ====


def tokens(text: str) -> list[str]:
    """Lower-cased word tokens, no stemming, no stop words."""
    return re.findall(r"\w+", text.lower())


class BM25:
    """Okapi BM25 over a list of documents (token lists), idf = ln(1 + (N - n + 0.5) / (n + 0.5))."""

    def __init__(self, docs: list[list[str]], k1: float = 1.2, b: float = 0.75) -> None:
        self.k1, self.b = k1, b
        self.tf = [Counter(d) for d in docs]
        self.lengths = [len(d) for d in docs]
        self.avg = sum(self.lengths) / max(len(docs), 1)
        df = Counter(t for d in docs for t in set(d))
        self.idf = {t: math.log(1 + (len(docs) - n + 0.5) / (n + 0.5)) for t, n in df.items()}

    def scores(self, query: list[str]) -> list[float]:
        """One score per document; each distinct query term counts once."""
        out = [0.0] * len(self.tf)
        for term in set(query):
            idf = self.idf.get(term)
            if idf is None:
                continue
            for i, tf in enumerate(self.tf):
                f = tf.get(term)
                if f:
                    norm = self.k1 * (1 - self.b + self.b * self.lengths[i] / self.avg)
                    out[i] += idf * f * (self.k1 + 1) / (f + norm)
        return out


def rank_bm25(conv: Conversation, question: str, index: BM25, k: int = 10) -> list[str]:
    """Top-k dia_ids of the reference BM25 (ties broken by turn order)."""
    scores = index.scores(tokens(question))
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    return [conv.turns[i].dia_id for i in order[:k] if scores[i] > 0]


def run_reference(conversations: list[Conversation]) -> dict[str, dict[str, float]]:
    """Score the reference BM25 on the raw turn text (no caption, no speaker, no date)."""
    rows = []
    for conv in conversations:
        index = BM25([tokens(t.text) for t in conv.turns])
        rows += [(q.category, score(rank_bm25(conv, q.question, index), q.evidence)) for q in conv.queries]
    return summarise(rows)
