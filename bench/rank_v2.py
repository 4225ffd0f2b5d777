"""Recall v2 ranking prototype (issue 13): the functions as they would live in the service.

Pure stdlib (re, math, datetime): every function here runs on a bare python3,
so the keyword-only mode gets all of it. bench/recall_v2_research.py measures
each piece on the LoCoMo dev split; the constants name the result that chose
them (bench/RESULTS-locomo.md, "Recall v2").
"""

from __future__ import annotations

import datetime
import math
import re
from collections import Counter

FTS_TOKENIZER = "porter unicode61 remove_diacritics 2"
MAX_QUERY_TERMS = 64

# ==== Query words ====

# The issue-6 list (the service's STOP_WORDS today).
STOP_WORDS_V1 = frozenset(
    """
a an and are as at be been by did do does for from had has have he her his how i in is it its me my of on or
she so that the their them they this to was we were what when where which who whom why will with would you your
""".split()
)
# v2 adds question scaffolding ("what kind of", "would X likely"), modal verbs and the "s" of
# possessives ("Caroline's" -> "caroline", "s": "s" matches every "it's" and "that's").
STOP_WORDS = STOP_WORDS_V1 | frozenset(
    """
s t about also any anything both can could ever if into just kind likely many might much not no other ought should
some something sort still than then there these those type yet based considered mentioned according answer yes
""".split()
)


def query_words(text: str) -> list[str]:
    """The distinct lower-cased words of free text, at most MAX_QUERY_TERMS."""
    return list(dict.fromkeys(word.lower() for word in re.findall(r"\w+", text)))[:MAX_QUERY_TERMS]


def make_fts_query(words: list[str], stop: frozenset[str] = STOP_WORDS) -> str | None:
    """Quote each word for FTS5 MATCH, OR-ed, stop words dropped unless nothing else is left."""
    kept = [word for word in words if word not in stop] or words
    if not kept:
        return None
    return " OR ".join('"' + word.replace('"', '""') + '"' for word in kept)


# ==== Dates: the window a question names, against the row's date ====

MONTHS = {
    name: n
    for n, names in enumerate(
        (
            ("january", "jan"),
            ("february", "feb"),
            ("march", "mar"),
            ("april", "apr"),
            ("may",),
            ("june", "jun"),
            ("july", "jul"),
            ("august", "aug"),
            ("september", "sep", "sept"),
            ("october", "oct"),
            ("november", "nov"),
            ("december", "dec"),
        ),
        start=1,
    )
    for name in names
}
_MONTH = r"(January|February|March|April|May|June|July|August|September|October|November|December)"
# "13 October 2023", "1 February, 2023", "October 13, 2023", "May 23 2023"
_DAY_MONTH_YEAR = re.compile(rf"\b(\d{{1,2}})(?:st|nd|rd|th)?\s+{_MONTH},?\s+((?:19|20)\d\d)\b")
_MONTH_DAY_YEAR = re.compile(rf"\b{_MONTH}\s+(\d{{1,2}})(?:st|nd|rd|th)?,?\s+((?:19|20)\d\d)\b")
_MONTH_YEAR = re.compile(rf"\b{_MONTH},?\s+((?:19|20)\d\d)\b")
# A bare month only after a preposition, capitalised: "in June", not the verb "may".
_MONTH_ONLY = re.compile(rf"\b(?:in|during|of|since|by|early|late|mid)\s+{_MONTH}\b")
_YEAR_ONLY = re.compile(r"\b(?:in|during|of|since|by)\s+((?:19|20)\d\d)\b")
ROW_DATE = re.compile(r"\b(\d{1,2})\s+([A-Za-z]+),?\s+((?:19|20)\d\d)\b|\b((?:19|20)\d\d)-(\d\d)-(\d\d)")


def _day(year: int, month: int, day: int) -> int | None:
    try:
        return datetime.date(year, month, day).toordinal()
    except ValueError:
        return None


def _month_span(year: int, month: int) -> tuple[int, int]:
    first = datetime.date(year, month, 1)
    following = datetime.date(year + month // 12, month % 12 + 1, 1)
    return first.toordinal(), following.toordinal() - 1


def parse_row_date(text: str) -> int | None:
    """The day (proleptic ordinal) a row's date field names: '1:56 pm on 8 May, 2023' or ISO '2023-05-08'."""
    m = ROW_DATE.search(text or "")
    if not m:
        return None
    if m.group(4):
        return _day(int(m.group(4)), int(m.group(5)), int(m.group(6)))
    month = MONTHS.get(m.group(2).lower())
    return _day(int(m.group(3)), month, int(m.group(1))) if month else None


def date_window(question: str, after_days: int) -> tuple[int, int] | None:
    """The days a question names, widened by after_days (an event is told a few days later).

    A full date gives that day; "July 2023" that month; "in 2023" that year.
    Relative phrases ("last week") have no anchor in the question and give None.
    """
    for pattern, order in ((_DAY_MONTH_YEAR, "dmy"), (_MONTH_DAY_YEAR, "mdy")):
        m = pattern.search(question)
        if m:
            parts = dict(zip(order, m.groups()))
            day = _day(int(parts["y"]), MONTHS[parts["m"].lower()], int(parts["d"]))
            if day is not None:
                return day, day + after_days
    m = _MONTH_YEAR.search(question)
    if m:
        lo, hi = _month_span(int(m.group(2)), MONTHS[m.group(1).lower()])
        return lo, hi + after_days
    m = _YEAR_ONLY.search(question)
    if m:
        lo, _ = _month_span(int(m.group(1)), 1)
        _, hi = _month_span(int(m.group(1)), 12)
        return lo, hi + after_days
    return None


# ==== Pseudo-relevance feedback ====


def document_frequencies(texts: list[str]) -> Counter[str]:
    return Counter(w for text in texts for w in set(re.findall(r"\w+", text.lower())))


def feedback_terms(
    question: str, top_texts: list[str], df: Counter[str], n_docs: int, k: int, stop: frozenset[str] = STOP_WORDS
) -> list[str]:
    """The k words of the first pass's best rows with the highest tf x idf, not already in the question."""
    asked = set(query_words(question))
    weights: Counter[str] = Counter()
    for text in top_texts:
        for word, tf in Counter(re.findall(r"\w+", text.lower())).items():
            if word in stop or word in asked or len(word) < 3 or word.isdigit():
                continue
            weights[word] += tf * math.log(n_docs / max(df.get(word, 1), 1))
    return [w for w, _ in weights.most_common(k)]


# ==== Learned linear reranker over the fused top candidates ====

# How many of the first pass's best rows the reranker reorders; rows below keep the first pass's order.
# bench/ltr_research.py, held-out hybrid hit@5: 20 -> 0.826, 30 -> 0.824, 50 -> 0.826: 20 is the cheapest.
RERANK_DEPTH = 20
KEYWORD_FEATURES = (
    "fused",  # the first pass's score (min-max fusion, or the normalised keyword score alone)
    "fused_rr",  # 1 / its rank among the candidates
    "keyword",  # the keyword leg's score, min-max over its own candidates (0 when absent)
    "keyword_rr",  # 1 / the keyword rank (0 when absent)
    "neighbour_best",  # the better normalised keyword score of the topic's previous and next row
    "neighbour_prev",
    "neighbour_next",
    "writer_named",  # the question names this row's writer
    "other_named",  # the question names a writer, not this one
    "is_question",  # the row ends with "?": asking is rarely the answer
    "log_words",  # log(1 + words in the row)
    "in_date_window",  # the row's topic date falls in the window the question names (date_window, +7 days)
    "coverage",  # share of the question's content words (5-letter prefixes) in the row
    "prev_is_question",  # the previous row of the topic asks something: this row may answer it
    "answers_match",  # prev_is_question x neighbour_prev: it asks what the question asks
    "coverage_around",  # share of content words in the previous and next rows
    "first_of_topic",  # no previous row in the topic
)
# Tried on top (bench/ltr_research.py, EXTRA_FEATURES): candidates sharing the row's topic, the question asks
# "when" and the row holds a time phrase, the named writer x keyword score.
EXTRA_FEATURES = ("topic_share", "topic_best", "when_time", "named_keyword")
TIME_PHRASE = re.compile(
    r"\b(yesterday|today|tomorrow|tonight|last|next|ago|weekend|week|month|year|since|(?:19|20)\d\d|"
    r"january|february|march|april|may|june|july|august|september|october|november|december|"
    r"monday|tuesday|wednesday|thursday|friday|saturday|sunday)\b",
    re.IGNORECASE,
)
VECTOR_FEATURES = ("cosine", "vector")  # raw cosine (neighbour-smoothed), and min-max over the vector candidates


def stems(text: str) -> set[str]:
    """5-letter prefixes of the words: a stemmer's poor cousin, enough to count coverage."""
    return {word[:5] for word in re.findall(r"\w+", text.lower())}


def ltr_features(
    question_stems: set[str],
    named: set[str],
    window: tuple[int, int] | None,
    row: dict,
    previous: dict | None,
    following: dict | None,
    first_pass: dict,
) -> list[float]:
    """The reranker's inputs for one candidate, in KEYWORD_FEATURES (+ VECTOR_FEATURES when given) order.

    row/previous/following carry "text", "agent", "topic"; first_pass carries
    fused, fused_rank, keyword, keyword_rank, neighbour_prev, neighbour_next
    and, in hybrid mode, cosine and vector.
    """
    text = row["text"]
    words = stems(text)
    around = set().union(*(stems(r["text"]) for r in (previous, following) if r is not None))
    wanted = max(len(question_stems), 1)
    day = parse_row_date(row.get("topic") or "")
    prev_q = float(previous is not None and previous["text"].rstrip().endswith("?"))
    prev_k, next_k = first_pass["neighbour_prev"], first_pass["neighbour_next"]
    features = [
        first_pass["fused"],
        1.0 / first_pass["fused_rank"],
        first_pass["keyword"],
        1.0 / first_pass["keyword_rank"] if first_pass["keyword_rank"] else 0.0,
        max(prev_k, next_k),
        prev_k,
        next_k,
        float(row["agent"].lower() in named),
        float(bool(named) and row["agent"].lower() not in named),
        float(text.rstrip().endswith("?")),
        math.log1p(len(text.split())),
        float(window is not None and day is not None and window[0] <= day <= window[1]),
        len(question_stems & words) / wanted,
        prev_q,
        prev_q * prev_k,
        len(question_stems & around) / wanted,
        float(previous is None),
    ]
    if "topic_share" in first_pass:
        features += [
            first_pass["topic_share"],
            first_pass["topic_best"],
            float(first_pass["asks_when"] and bool(TIME_PHRASE.search(text))),
            features[7] * first_pass["keyword"],
        ]
    if "cosine" in first_pass:
        features += [first_pass["cosine"], first_pass["vector"]]
    return features


def ltr_score(features: list[float], weights: tuple[float, ...]) -> float:
    """weights[0] + sum of weights[1:] x features: raw (unstandardised) weights, bias first."""
    return weights[0] + sum(w * f for w, f in zip(weights[1:], features))


# Logistic-regression weights over KEYWORD_FEATURES (+ VECTOR_FEATURES), bias first, fitted on all five dev
# conversations by bench/ltr_research.py (rerank depth 20, L2 1.0). Held-out (leave one conversation out)
# hybrid hit@5 0.785 -> 0.826, MRR 0.595 -> 0.650; keyword-only 0.766 -> 0.810 (bench/RESULTS-locomo.md).
LTR_KEYWORD_WEIGHTS = (
    -7.9995,
    1.7835,
    0.7124,
    1.7835,
    0.7124,
    1.6277,
    -1.4205,
    -0.9538,
    -0.1547,
    -0.8258,
    -0.7169,
    0.5297,
    0.5966,
    1.5528,
    -0.1207,
    2.6565,
    0.6,
    0.1561,
)
LTR_HYBRID_WEIGHTS = (
    -8.2211,
    2.2354,
    0.9039,
    1.573,
    0.7989,
    1.7517,
    -1.6436,
    -1.3532,
    0.1121,
    -0.2372,
    -0.7629,
    0.5977,
    0.6889,
    0.8212,
    -0.1389,
    2.6084,
    0.4021,
    -0.0237,
    -0.1989,
    0.4871,
)


def rerank(candidates: list[dict], features: list[list[float]], hybrid: bool) -> list[dict]:
    """The first RERANK_DEPTH candidates (best first) reordered by ltr_score; the rest keep their order."""
    weights = LTR_HYBRID_WEIGHTS if hybrid else LTR_KEYWORD_WEIGHTS
    head = candidates[:RERANK_DEPTH]
    scored = sorted(zip(head, features), key=lambda pair: -ltr_score(pair[1], weights))
    return [c for c, _ in scored] + candidates[RERANK_DEPTH:]
