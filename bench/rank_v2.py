"""Recall v2 ranking research (issue 13): what the service runs, plus what was tried and not kept.

The kept pieces now live in the service (solos_rank.py: stop words, date
windows, the reranker's features and weights) and are imported from there, so
the research measures the code that serves. What stays here was tried and not
kept: the issue-6 stop-word list (for comparison), pseudo-relevance feedback,
and four more reranker features. bench/recall_v2_research.py and
bench/ltr_research.py measure them (bench/RESULTS-locomo.md, "Recall v2").
"""

from __future__ import annotations

import math
import re
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from solos_rank import (  # noqa: E402, F401  (re-exported for the research scripts)
    KEYWORD_FEATURES,
    LTR_HYBRID_WEIGHTS,
    LTR_KEYWORD_WEIGHTS,
    MAX_QUERY_TERMS,
    RERANK_DEPTH,
    STOP_WORDS,
    VECTOR_FEATURES,
    date_window,
    ltr_features,
    ltr_score,
    make_fts_query,
    parse_row_date,
    query_words,
    stems,
)

FTS_TOKENIZER = "porter unicode61 remove_diacritics 2"  # schema.sql's

# The issue-6 list; the service's STOP_WORDS adds question scaffolding, modals and a possessive's "s".
STOP_WORDS_V1 = frozenset(
    """
a an and are as at be been by did do does for from had has have he her his how i in is it its me my of on or
she so that the their them they this to was we were what when where which who whom why will with would you your
""".split()
)

# ==== Pseudo-relevance feedback (not kept) ====


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


# ==== Reranker features tried on top of the service's (not kept: +0.006 +- 0.009 hit@5 held out) ====

# Candidates sharing the row's topic, the question asks "when" and the row holds a time phrase, the named
# writer x keyword score.
EXTRA_FEATURES = ("topic_share", "topic_best", "when_time", "named_keyword")
TIME_PHRASE = re.compile(
    r"\b(yesterday|today|tomorrow|tonight|last|next|ago|weekend|week|month|year|since|(?:19|20)\d\d|"
    r"january|february|march|april|may|june|july|august|september|october|november|december|"
    r"monday|tuesday|wednesday|thursday|friday|saturday|sunday)\b",
    re.IGNORECASE,
)


def extra_features(text: str, features: list[float], first_pass: dict) -> list[float]:
    """EXTRA_FEATURES of one candidate; `features` are its service features (KEYWORD_FEATURES order)."""
    return [
        first_pass["topic_share"],
        first_pass["topic_best"],
        float(first_pass["asks_when"] and bool(TIME_PHRASE.search(text))),
        features[KEYWORD_FEATURES.index("writer_named")] * first_pass["keyword"],
    ]
