"""The judge: the probability that a recalled row answers the question.

Today's `relevance` (solos_rank.calibrated_relevance) reads the reranker's logit, the question's stems the row
covers and the cosine. It cannot tell a near miss from an answer: a service's port when memory holds another
service's, the commander of an incident memory names only by number. The judge reads the question and each
row together, over recall's bounded head (the rows after fusion and rerank), with features that logistic
lacks:

- the IDF-weighted share of the question's content words the row lacks, the IDF taken over the candidates
  themselves (a word every candidate holds says nothing; one no candidate holds is a specific memory lacks);
- the share of the question's identifiers (ids like INC-2207, numbers, dates, quarters like Q3, hosts,
  hyphenated names, capitalised names) the row lacks, and the share no candidate holds at all, a row holding
  what its text or its agent holds (on LoCoMo the agent is the speaker a question names);
- whether the row holds the kind of thing asked for: a number for "how many / what port", a date for "when",
  a person for "who", a host or place for "where";
- the cosine (hybrid only) and its gap to the best candidate's; today's relevance, as a logit;
- whether the row holds the attribute the question asks about (its head noun: port, cap, commander, owner,
  approver, version, ...), and whether any candidate does;
- whether the row holds a rival of a specific the question names, and not the question's own, by family
  (conflicts(): another period, incident id, service name, person or scope: Q2 for Q3, search-api's port for
  payments-api's). A row that only lacks the specific is weak evidence (an answer may too); a rival is strong.

A logistic regression over those, per mode: `hybrid` reads the cosine, `keyword` (no embedder) does not. Its
weights live in models/judge/judge.json, fitted by bench/judge_fit.py; the file's sha256 is JUDGE_SHA256 and
is checked at load. A missing, changed or unreadable file never raises: `load()` returns a judge that passes
the rows' own relevance through, named `relevance`, with the reason. Figures: bench/judge_eval.py.

In hybrid mode the features judge's probabilities of the first rows are combined with a cross-encoder's
(solos_cross_encoder: it reads the question and each row together; the combination also reads some of the
features judge's features, a conflict above all), named `cross-encoder@…+features-hybrid@…`;
when the cross-encoder is skipped (the features judge sure: its meta's cascade) or cannot run (its files
missing or changed, onnxruntime missing, a run failing or too slow) the features judge's stand, with the reason.
SOLOS_MEMORY_JUDGE=features turns the cross-encoder off.

    judge = solos_judge.load()                       # once; never raises
    verdict = judge.judge(question, rows, "hybrid")  # rows: dicts with text, topic, agent, relevance, cosine
    verdict.probabilities, verdict.name, verdict.reason

Stdlib only (no numpy): about 40-50 microseconds of CPU per row, the conflicts about 10 of them.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import solos_cross_encoder
from solos_cross_encoder import logit, read_pinned
from solos_rank import RANKED_TEXT_CHARS, STOP_WORDS, logistic

JUDGE_PATH = Path(__file__).resolve().parent / "models" / "judge" / "judge.json"
# The sha256 of JUDGE_PATH as bench/judge_fit.py wrote it (the script rewrites this line).
JUDGE_SHA256 = "8277df0a836d5475e9ed15fbaa218346604e9c4013579608bbe4d30c6dd262af"
JUDGE_FORMAT = 1
OFF_VARIABLE = "SOLOS_MEMORY_JUDGE"
SWITCHES = ("off", "features", "on")  # OFF_VARIABLE's values; unset or empty is on
CROSS_META_PATH = solos_cross_encoder.META_PATH
MODES = ("hybrid", "keyword")
STEM_LENGTH = 5  # solos_rank's coverage stems: a stemmer's poor cousin (approve/approved/approval)

# ==== Reading a question and a row ====

_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/-]*[A-Za-z0-9]|[A-Za-z0-9]")
_WORD = re.compile(r"\w+")
_DIGIT = re.compile(r"\d")
_PARTS = re.compile(r"[.:/-]")  # what joins an identifier's parts (INC-2207, pay-app-01.eu)
_MONTHS = (
    "january february march april may june july august september october november december "
    "jan feb mar apr jun jul aug sep sept oct nov dec"
).split()
_WEEKDAYS = "monday tuesday wednesday thursday friday saturday sunday weekend".split()
_DATE = re.compile(
    r"\b(?:(?:19|20)\d\d-\d\d(?:-\d\d)?|\d{1,2}/\d{1,2}(?:/\d{2,4})?|(?:19|20)\d\d|q[1-4]|h[12]|\d{1,2}:\d\d|"
    rf"(?:{'|'.join(_MONTHS + _WEEKDAYS)})s?|yesterday|today|tomorrow|tonight|morning|afternoon|evening|noon|"
    r"midnight|daily|weekly|monthly|quarterly|nightly)\b",
    re.IGNORECASE,
)
_NUMBER = re.compile(r"\d")
# A person: two capitalised words (Priya Raman, Anouk de Vries), or a role naming one ("IC Elif", "Owner: Tom").
_ROLE = r"(?i:commander|commanded by|ic|owner|owned by|approver|approved by|lead|led by|signed by|scribe)"
_FULL_NAME = r"\b[A-Z][a-z]+ (?:(?:de|van|von|da|del) )?[A-Z][a-z]+\b"
_NAME = re.compile(rf"{_FULL_NAME}|\b{_ROLE}\b:? (?:is |was )?[A-Z][a-z]+")
# A port: "port 8443", "tp.hx.internal:3080", "listens on 8088", "gRPC 8001", "(443)".
_PORT = re.compile(
    r"\bports? (?:is |are |of )?\d{2,5}\b|:\d{2,5}\b|\b(?:listens?|listening|serves?|answers?|runs?) (?:on|at) "
    r"(?:port )?\d{2,5}\b|\b(?:https?|grpc|tcp|udp|metrics|ui|api|admin|submission) (?:on )?\d{2,5}\b|\(\d{2,5}\)",
    re.I,
)
_PLACE = re.compile(
    r"[a-z0-9-]+\.(?:internal|com|net|io|org)\b|\b[a-z]+-?\d+[a-z0-9-]*\b|\b(?:rack|dc|region|office|floor|room|"
    r"city|country|host|cluster|zone)\b|\b[A-Z][a-z]{2,}\b",
)
# What a question asks for, first match wins: (pattern, kind). Read only in the question's opening words, so
# "a call or a message when something breaks" does not ask for a date.
ASK_WORDS = 6
_ASKS = (
    (re.compile(r"\b(what|which) ports?\b", re.I), "port"),
    (
        re.compile(
            r"\b(when|what (date|day|days|time|year|month)|which (date|day|days|year|month)|by what|since when|"
            r"how long ago|at what (hour|time))\b",
            re.I,
        ),
        "date",
    ),
    (
        re.compile(
            r"\b(how (many|much|long|big|large|often|fast|old)|what (version|number|percentage|share|"
            r"rate|limit|cap|size|amount|price|cost|budget|count|threshold|ttl|timeout|latency))\b",
            re.I,
        ),
        "number",
    ),
    (re.compile(r"\b(who|whom|whose)\b", re.I), "person"),
    (
        re.compile(
            r"\b(where|(which|what) (host|hosts|server|region|city|country|rack))\b",
            re.I,
        ),
        "place",
    ),
)


# The attributes a fleet question asks about: its head noun ("what PORT", "who was the COMMANDER", "the Q3
# CAP"). A near miss is a row on the right topic that holds another attribute of it, or the same attribute of
# something else: the row must hold the word (as a 5-letter stem: approve/approver/approved).
ATTRIBUTES = frozenset(
    word[:STEM_LENGTH]
    for word in (
        "port host hosts cap budget commander owner approver approved lead version limit quota retention "
        "deadline rotation timeout ttl replica replicas region rack cluster database schedule window threshold "
        "contract vendor renewal price cost salary preference prefers favourite language editor channel "
        "cause root follow"
    ).split()
)


def asked_kind(question: str) -> str:
    """What the question asks for: port, date, number, person, place, or "" for anything else."""
    opening = " ".join(question.split()[:ASK_WORDS])
    for pattern, kind in _ASKS:
        if pattern.search(opening):
            return kind
    return ""


def holds_kind(text: str, kind: str) -> bool:
    """Whether a row's text holds a thing of that kind (crudely: a digit, a date word, a name, a host)."""
    if kind == "date":
        return bool(_DATE.search(text))
    if kind == "number":
        return bool(_NUMBER.search(text))
    if kind == "port":
        return bool(_PORT.search(text))
    if kind == "person":
        return bool(_NAME.search(text))
    if kind == "place":
        return bool(_PLACE.search(text))
    return True


def content_stems(text: str) -> set[str]:
    """The text's content words as solos_rank's 5-letter stems, stop words dropped."""
    return {w[:STEM_LENGTH] for w in _WORD.findall(text.lower()) if w not in STOP_WORDS}


# Attributes a row holds without naming them: "listens on 8088" holds a port, "IC Elif Kaya" a commander.
_IMPLIED = (
    (_PORT, "port"),
    (re.compile(r"\b(?:IC|(?i:led by|commanded by|incident lead))\b"), "comma"),
    (re.compile(r"\b(?i:approved|signed off|signed by)\b"), "appro"),
    (re.compile(r"\b(?i:owned by|owns)\b"), "owner"),
)


IMPLIED_STEMS = frozenset(implied for _, implied in _IMPLIED)


def row_stems(text: str, wanted: set[str] | frozenset[str] = IMPLIED_STEMS) -> set[str]:
    """A row's content stems and those of the `wanted` attributes it implies (see _IMPLIED)."""
    return content_stems(text) | {stem for pattern, stem in _IMPLIED if stem in wanted and pattern.search(text)}


def identifiers(question: str) -> set[str]:
    """The question's specifics, lower-cased: tokens with a digit (INC-2207, 8443, Q3, 2026-03-11), hyphenated or
    dotted names (payments-api, pay-app-01), and capitalised words past the first (names, places)."""
    found = set()
    for i, match in enumerate(_TOKEN.finditer(question)):
        token = match.group().rstrip(".:/")
        if _DIGIT.search(token) or "-" in token or "." in token or (i > 0 and token[:1].isupper()):
            if token.lower() not in STOP_WORDS:
                found.add(token.lower())
    return found


def row_tokens(text: str) -> set[str]:
    """Every token of a row (identifiers whole, and their parts), lower-cased, for identifier lookups."""
    tokens = set()
    for match in _TOKEN.finditer(text):
        token = match.group().rstrip(".:/").lower()
        tokens.add(token)
        if _PARTS.search(token):  # most tokens are one part, already added: a recall's 20 rows split 0.6 ms less
            tokens.update(part for part in _PARTS.split(token) if part)
    return tokens


def agent_tokens(agent: str) -> set[str]:
    """A row's agent as identifier tokens: who wrote it is part of what it holds. On LoCoMo the agent is the
    speaker, a name the question asks by ("What did Caroline research?") that the turn's own text seldom holds;
    the ranking reads it the same way (solos_rank.NAME_BOOST, covered_stems). An agent name's "_" joins words
    (bench/locomo_data.agent_name: "Anouk de Vries" is Anouk_de_Vries)."""
    return row_tokens(agent.replace("_", " "))


def has_identifier(tokens: set[str], identifier: str) -> bool:
    """An identifier is in a row when the row holds it whole, or every part of it (INC-2207 in "INC 2207")."""
    if identifier in tokens:
        return True
    parts = [p for p in _PARTS.split(identifier) if p]
    return len(parts) > 1 and all(p in tokens for p in parts)


def row_text(row: Mapping) -> str:
    """What the judge reads of a row: its label (a long fact's topic; LoCoMo's turn date) and its text, the first
    RANKED_TEXT_CHARS characters (as the reranker reads it)."""
    topic, text = row.get("topic") or "", str(row.get("text") or "")[:RANKED_TEXT_CHARS]
    return f"{topic}: {text}" if topic else text


def probability(value: object) -> float:
    """A row's relevance as a probability: anything else (missing, not a number) reads 0."""
    try:
        p = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0.0
    return min(max(p, 0.0), 1.0) if math.isfinite(p) else 0.0


# ==== Conflicts: the row holds another value of a specific the question names ====
#
# A near miss differs from the answer by one specific: the row holds Q2 where the question asks Q3, search-api's
# port for payments-api's, Ilse Vermeer's day off for Rafael Quint's, the standard plan for the basic one. That
# a row lacks the question's identifier is weak evidence (an answer may name it by another word); that it holds
# a RIVAL of the same kind, and not the question's own, is strong. Each specific goes into a slot (its kind);
# a row conflicts in a slot when it holds a value there and none of the question's values there.

CONFLICT_FAMILIES = ("period", "id", "name", "person", "scope")
_MONTH_NAMES = [month[:3] for month in _MONTHS[:12]]  # jan ... dec, an ISO month's number - 1
# Capitalised only: "may" is a verb, "march" one too.
_MONTH = re.compile(
    r"\b(Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?|Sept?(?:ember)?|Oct(?:ober)?|"
    r"Nov(?:ember)?|Dec(?:ember)?)\b"
)
_WEEKDAY = re.compile(r"\b(Mon|Tues|Wednes|Thurs|Fri|Satur|Sun)days?\b")
_ISO_MONTH = re.compile(r"^((?:19|20)\d\d)-(0[1-9]|1[0-2])(?:-\d\d)?$")
_PERIOD_TOKENS = {"q1": "quarter", "q2": "quarter", "q3": "quarter", "q4": "quarter", "h1": "half", "h2": "half"}
_LETTER = re.compile(r"[a-z]")
_PER = re.compile(
    r"\bper[- ](user|tenant|team|key|account|org|organi[sz]ation|project|customer|ip|host|region|device|client)s?\b"
)
# Scope words that exclude each other (a question's "staging" against a row's "prod"), normalised; short and
# general on purpose.
_SCOPES = {
    word: (slot, value)
    for slot, groups in (
        ("env", (("prod", "production"), ("staging", "stage"), ("dev", "development"), ("sandbox",))),
        ("reach", (("internal",), ("external",))),
        ("tier", (("gold",), ("silver",), ("bronze",), ("platinum",))),
        ("plan", (("free",), ("basic",), ("standard",), ("premium",), ("enterprise",))),
        ("platform", (("ios",), ("android",), ("web",))),
    )
    for group in groups
    for word in group
    for value in (group[0],)
}
_PERSON = re.compile(_FULL_NAME)  # a row's person: two names


def _shape(token: str) -> str:
    """An id's shape: its letters as they are, each run of digits as 9 (INC-2207 and INC-2205: inc-9)."""
    return re.sub(r"\d+", "9", token)


def specifics(
    text: str, tokens: set[str] | None = None, question: bool = False, families: Collection[str] = CONFLICT_FAMILIES
) -> dict[str, set[str]]:
    """The text's specifics of `families` by slot ("period:quarter", "id:inc-9", "name:suffix:api", "scope:env",
    ...), values lower-cased; `tokens` the text's (row_tokens), else read here. A question's scope words count
    only as whole words (dev-portal is a name, not the dev stage); its person slot holds its capitalised words
    past the first (a name, or a thing named), as runs. A row's persons are read by conflicts(), when needed."""
    found: dict[str, set[str]] = {}

    def add(slot: str, value: str) -> None:
        found.setdefault(slot, set()).add(value)

    period, ids, names, scope = (f in families for f in ("period", "id", "name", "scope"))
    words: Collection[str] = (
        [m.group().rstrip(".:/").lower() for m in _TOKEN.finditer(text)] if tokens is None or question else tokens
    )
    for token in words:  # most are plain words: only a scope word is one of those
        if token.isalpha():
            if scope and token in _SCOPES:
                slot, value = _SCOPES[token]
                add(f"scope:{slot}", value)
            continue
        if period:
            if token in _PERIOD_TOKENS:
                add(f"period:{_PERIOD_TOKENS[token]}", token)
                continue
            if token.isdigit():
                if len(token) == 4 and token[:2] in ("19", "20"):
                    add("period:year", token)
                continue
            if token[:2] == "fy" and len(token) == 6 and token[2:].isdigit():
                add("period:year", token[2:])
                continue
            iso = _ISO_MONTH.match(token) if len(token) > 6 and token[4:5] == "-" else None
            if iso:
                add("period:year", iso.group(1))
                add("period:month", _MONTH_NAMES[int(iso.group(2)) - 1])
                continue
        if ids and _DIGIT.search(token) and _LETTER.search(token):
            add(f"id:{_shape(token)}", token)
        elif names and ("-" in token or "." in token) and token not in STOP_WORDS:
            parts = [p for p in _PARTS.split(token) if p]
            if len(parts) > 1 and all(len(p) > 1 and p.isalpha() for p in parts):  # not 15:00, not 1.4
                add(f"name:suffix:{parts[-1]}", token)
                add(f"name:prefix:{parts[0]}", token)
    if period:
        # A question's first word is no month: "May a build job ...?"
        for m in _MONTH.finditer((text.split(None, 1) or [""])[-1] if question else text):
            add("period:month", m.group(1)[:3].lower())
        for m in _WEEKDAY.finditer(text):
            add("period:weekday", m.group(1).lower())
    if scope and "per" in text:
        for m in _PER.finditer(text.lower()):
            add("scope:per", m.group(1)[:4])
    if question and "person" in families:
        run: list[str] = []
        for i, m in enumerate(_TOKEN.finditer(text + " .")):
            word = m.group()
            if (
                i > 0
                and word.isalpha()
                and word[:1].isupper()
                and not word.isupper()
                and word.lower() not in STOP_WORDS
            ):
                if not _MONTH.fullmatch(word) and not _WEEKDAY.fullmatch(word):
                    run.append(word.lower())
                    continue
            if run:
                add("person", " ".join(run))
                run = []
    return found


def _rival_person(names: set[str], text: str, tokens: set[str], agent_words: set[str]) -> bool:
    """Whether a row lacks a name the question asks by and holds another person: like against like, a full name
    (Rafael Quint) against the full names the row's text holds (Ilse Vermeer), any name against a speaker
    (Melanie); a short name matches its long form (Mel, Melanie)."""
    named = {w for name in names for w in name.split()}

    def speaks(word: str) -> bool:
        return any(a.startswith(word) or word.startswith(a) for a in agent_words)

    lacking = [name for name in names if not any(w in tokens or speaks(w) for w in name.split())]
    if not lacking:
        return False
    if agent_words and not any(speaks(w) for w in named):
        return True
    return any(" " in name for name in lacking) and any(
        not set(m.group().lower().split()) & named for m in _PERSON.finditer(text)
    )


def conflicts(asked: Mapping[str, set[str]], text: str, tokens: set[str], agent: str = "") -> set[str]:
    """The families (CONFLICT_FAMILIES) in which a row holds a rival of a specific the question names (`asked`:
    specifics(question, question=True)) and not the question's own. A row that only lacks the question's
    identifier, holding nothing else of its kind, is no conflict. A capitalised `agent` (a speaker: "Melanie")
    is a person the row holds; a lower-case one is a writer (a bot's name), not a person."""
    if not asked:
        return set()
    families = {slot.split(":", 1)[0] for slot in asked}
    held = specifics(text, tokens, families=families)
    found = set()
    for slot, values in asked.items():
        family = slot.split(":", 1)[0]
        if family in found:
            continue
        if family == "person":
            agent_words = set(agent.replace("_", " ").lower().split()) if agent[:1].isupper() else set()
            if _rival_person(values, text, tokens, agent_words):
                found.add(family)
        elif slot in held and not any(has_identifier(tokens, v) or v in held[slot] for v in values):
            found.add(family)
    return found


# The conflict features (see conflicts()): whether the row holds a rival of the question's specific, by family.
CONFLICT_FEATURES = tuple(f"conflict_{family}" for family in CONFLICT_FAMILIES)


def conflict_features(asked: Mapping[str, set[str]], text: str, tokens: set[str], agent: str) -> dict[str, float]:
    """A row's conflict features by name (CONFLICT_FEATURES): 1.0 where it holds a rival of that family."""
    found = conflicts(asked, text, tokens, agent)
    return {f"conflict_{family}": float(family in found) for family in CONFLICT_FAMILIES}


HYBRID_FEATURES = (
    "relevance_logit",
    "cosine",
    "cosine_gap",
    "missing_idf",
    "missing_ids",
    "missing_numbers",
    "ids_nowhere",
    "kind_missing",
    "kind_held",
    "coverage",
    "top",
    "attribute_missing",
    "attribute_nowhere",
    *CONFLICT_FEATURES,
)
# Keyword mode (no embedder): the same but the cosine's.
FEATURES = {"hybrid": HYBRID_FEATURES, "keyword": tuple(n for n in HYBRID_FEATURES if not n.startswith("cosine"))}


def features(question: str, rows: Sequence[Mapping], mode: str) -> list[dict[str, float]]:
    """Each row's features by name (FEATURES[mode] order), read against the other candidates."""
    texts = [row_text(r) for r in rows]
    wanted = content_stems(question)
    stems = [row_stems(t, wanted) for t in texts]
    agents = {str(r.get("agent") or "") for r in rows}  # a recall's rows come from a few agents: each read once
    by_agent = {agent: agent_tokens(agent) for agent in agents}
    tokens = [row_tokens(t) | by_agent[str(r.get("agent") or "")] for t, r in zip(texts, rows)]
    ids = identifiers(question)
    n = len(rows)
    # IDF over the candidates (smoothed so a word none holds weighs most, one all hold little).
    idf = {s: math.log((n + 1) / (sum(s in st for st in stems) + 0.5)) for s in wanted}
    total_idf = sum(idf.values()) or 1.0
    nowhere = sum(not any(has_identifier(t, i) for t in tokens) for i in ids) / len(ids) if ids else 0.0
    kind = asked_kind(question)
    attributes = {stem for stem in wanted if stem in ATTRIBUTES}
    attribute_nowhere = (
        sum(not any(a in st for st in stems) for a in attributes) / len(attributes) if attributes else 0.0
    )
    cosines = [float(r.get("cosine") or 0.0) for r in rows]
    best_cosine = max(cosines, default=0.0)
    asked = specifics(question, question=True)
    out = []
    for rank, (row, st, tk, text) in enumerate(zip(rows, stems, tokens, texts)):
        missing_ids = sum(not has_identifier(tk, i) for i in ids) / len(ids) if ids else 0.0
        numbered = [i for i in ids if _DIGIT.search(i)]
        held = holds_kind(text, kind) if kind else True
        f = {
            "relevance_logit": logit(row.get("relevance") or 0.0),
            "cosine": cosines[rank],
            "cosine_gap": cosines[rank] - best_cosine,
            "missing_idf": sum(v for s, v in idf.items() if s not in st) / total_idf,
            "missing_ids": missing_ids,
            "missing_numbers": sum(not has_identifier(tk, i) for i in numbered) / len(numbered) if numbered else 0.0,
            "ids_nowhere": nowhere,
            "kind_missing": float(bool(kind) and not held),
            "kind_held": float(bool(kind) and held),
            "coverage": len(wanted & st) / max(len(wanted), 1),
            "top": 1.0 / (rank + 1),
            "attribute_missing": sum(a not in st for a in attributes) / len(attributes) if attributes else 0.0,
            "attribute_nowhere": attribute_nowhere,
            **conflict_features(asked, text, tk, str(row.get("agent") or "")),
        }
        out.append({name: f[name] for name in FEATURES[mode]})
    return out


# ==== The judge ====


@dataclass(frozen=True)
class Verdict:
    """The judge's answer for one recall's rows: a probability per row (input order), who judged, and why not
    the fitted judge when it did not run."""

    probabilities: list[float]
    # The receipt's `judge`: "cross-encoder@8dc2c774+features-hybrid@1a2b3c4d", "features-hybrid@1a2b3c4d",
    # "features-keyword@…", or "relevance" (the rows' own, passed through).
    name: str
    reason: str | None = None  # why not the cross-encoder (hybrid) or why not the features judge ("relevance")


@dataclass(frozen=True)
class Model:
    mode: str
    names: tuple[str, ...]
    weights: tuple[float, ...]  # bias first, then one per name
    means: tuple[float, ...]
    scales: tuple[float, ...]

    def judged(self, question: str, rows: Sequence[Mapping]) -> tuple[list[float], list[dict[str, float]]]:
        """Each row's probability and the features it was read from (the cross-encoder's combination may read
        some of them as evidence)."""
        found, read = [], features(question, rows, self.mode)
        for f in read:
            z = self.weights[0]
            for name, w, m, s in zip(self.names, self.weights[1:], self.means, self.scales):
                z += w * (f[name] - m) / s
            found.append(logistic(z))
        return found, read


@dataclass
class Judge:
    """The fitted models by mode (none when the file did not load: then `reason` says why)."""

    models: dict[str, Model] = field(default_factory=dict)
    sha256: str = ""
    reason: str | None = None
    floor: float | None = None  # the floor bench/judge_fit.py chose on the fitting data
    cross: solos_cross_encoder.CrossEncoder | None = None  # read with the features in hybrid mode; None: never
    turned_off: bool = False  # by SOLOS_MEMORY_JUDGE=off, not for a fault

    def name(self, mode: str) -> str:
        return f"features-{mode}@{self.sha256[:8]}" if mode in self.models else "relevance"

    def state(self) -> dict:
        """What /health and /v1/stats say of the judge, as recall's receipts would: `ready`, `off` (turned off) or
        `unavailable` (its file missing, changed or malformed: relevance is then the reranker's calibration), and
        why; and the state of hybrid recall's cross-encoder (solos_cross_encoder.CrossEncoder.state; None: features
        only, by choice), and why."""
        state = "ready" if self.models else ("off" if self.turned_off else "unavailable")
        cross, why = (None, None) if self.cross is None else self.cross.state()
        return {
            "state": state,
            "name": f"features@{self.sha256[:8]}" if self.models else "relevance",
            "reason": self.reason,
            "cross_encoder": cross,
            "cross_encoder_reason": why,
            "cross_encoder_runs": {} if self.cross is None else self.cross.runs(),
        }

    def judge(self, question: str, rows: Sequence[Mapping], mode: str) -> Verdict:
        """P(row answers the question) for each row; the rows' own relevance, named `relevance`, when the
        judge is not loaded, the question has no words to judge by, or it fails on these rows. Never raises."""
        model = self.models.get(mode)
        if model is not None and not content_stems(question) and not identifiers(question):
            # "what is it?", "and then?": the fit saw no such question, and read each row as lacking nothing.
            reason = "the question has no words to judge by (only stop words)"
        elif model is not None:
            try:
                found, read = model.judged(question, rows)
            except Exception as error:  # a judge that fails must not fail the recall: keep relevance, say why
                reason = f"judge failed: {type(error).__name__}: {error}"
            else:
                if mode != "hybrid" or self.cross is None:
                    return Verdict(found, self.name(mode))
                combined, why = self.cross.combine(question, rows, found, read)
                if why is not None:
                    return Verdict(found, self.name(mode), why)
                return Verdict(combined, f"{self.cross.name}+{self.name(mode)}")
        else:
            reason = self.reason or f"judge has no {mode} model"
        return Verdict([probability(r.get("relevance")) for r in rows], "relevance", reason)


def check_switch() -> None:
    """serve's check before it starts (load() never raises): OFF_VARIABLE unset, empty or one of SWITCHES, else
    SystemExit saying so; `0` or `false`, meant as off, ran the judge as if unset."""
    raw = os.environ.get(OFF_VARIABLE, "")
    if raw.strip().lower() not in ("", *SWITCHES):
        raise SystemExit(f"{OFF_VARIABLE} must be off, features or on, got {raw!r}")


def load(
    path: Path | str = JUDGE_PATH, sha256: str | None = JUDGE_SHA256, cross: Path | str | None = CROSS_META_PATH
) -> Judge:
    """The judge in `path`, its sha256 checked against `sha256` (None: not checked), with the cross-encoder whose
    meta is `cross` for hybrid mode (None: features only; its model loads at its first run). Never raises: a
    missing, changed or malformed file gives a judge with no models and the reason. SOLOS_MEMORY_JUDGE=off turns
    it off (relevance is then the reranker's calibration, and the receipt says so): what bench/judge_data.py
    records, since the judge reads that calibration, never its own output; =features keeps only the features."""
    switch = os.environ.get(OFF_VARIABLE, "").strip().lower()
    if switch == "off":
        return Judge(reason=f"judge turned off ({OFF_VARIABLE}=off)", turned_off=True)
    if cross is None:
        cross_encoder = None
    elif switch == "features":
        cross_encoder = solos_cross_encoder.CrossEncoder(
            reason=f"cross-encoder turned off ({OFF_VARIABLE}=features)", turned_off=True
        )
    else:
        cross_encoder = solos_cross_encoder.load(cross)
    path = Path(path)
    raw, digest, reason = read_pinned(path, sha256, "judge file")
    if raw is None:
        return Judge(reason=reason)
    try:
        doc = json.loads(raw)
        if doc.get("format") != JUDGE_FORMAT:
            raise ValueError(f"format {doc.get('format')!r}, expected {JUDGE_FORMAT}")
        models = {}
        for mode, m in doc["models"].items():
            names = tuple(m["features"])
            if mode not in MODES or names != FEATURES[mode]:
                raise ValueError(f"{mode} features {list(names)} are not this code's {list(FEATURES.get(mode, ()))}")
            model = Model(mode, names, *(tuple(float(x) for x in m[key]) for key in ("weights", "means", "scales")))
            if not len(model.weights) == len(names) + 1 == len(model.means) + 1 == len(model.scales) + 1:
                raise ValueError(f"{mode}: {len(names)} features, {len(model.weights)} weights")
            if not all(math.isfinite(x) for x in model.weights + model.means) or min(model.scales) <= 0:
                raise ValueError(f"{mode}: weights not finite or a scale not positive")
            models[mode] = model
        floor = doc.get("floor")
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        return Judge(sha256=digest, reason=f"judge file {path.name} malformed: {error}")
    return Judge(models, digest, None, float(floor) if isinstance(floor, (int, float)) else None, cross_encoder)
