#!/usr/bin/env python3
"""Validate the fleet memory dataset (facts.jsonl, questions.jsonl). Stdlib only.

    python3 bench/data/fleet/check.py   # prints the counts per kind and split; exit 0 when every check passes

Checks: ids unique; every answer / near_miss id exists and lies in the
question's split; answerable kinds have answers, multi has two or more,
unanswerable has none and names a near miss; each domain_topic cluster sits in
one split; minima (>=300 facts, >=240 questions, >=80 unanswerable in the fit and
score splits together, >=6 writer agents, every kind in both fit and score);
paraphrase questions share no content-word stem with the text or topic of any
of their answer facts. The third split, calibrate, follows the same rules per
row and per cluster but counts toward no minimum.
"""

import json
import os
import re
import sys
from collections import Counter, defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
KINDS = ("keyword", "entity", "paraphrase", "multi", "temporal", "unanswerable")
SPLITS = ("fit", "score", "calibrate")
MAIN = ("fit", "score")  # the minima and "every kind present" apply to these
MIN_FACTS, MIN_QUESTIONS, MIN_UNANSWERABLE, MIN_AGENTS = 300, 240, 80, 6

STOP = set(
    """
a an the and or but nor so yet of to in on at by for with from into onto over under
about after before between during since until upon via per as than then that this these
those there here what which who whom whose when where why how is are was were be been
being am do does did doing done has have had having will would shall should can could
may might must it its it's they them their theirs we us our ours you your yours he him
his she her hers i me my mine not no yes any all some each every both either neither
if else also just only very too more most less least much many such own same other
another again ever still even out up down off one's get gets got s t d ll re ve m
""".split()
)

SUFFIXES = (
    "ational",
    "ations",
    "ation",
    "ments",
    "ment",
    "ings",
    "ing",
    "ies",
    "ied",
    "ers",
    "er",
    "ed",
    "es",
    "al",
    "ly",
    "s",
)


def stem(word):
    """A crude suffix stripper: enough to catch approve/approved/approval."""
    for suf in SUFFIXES:
        if word.endswith(suf) and len(word) - len(suf) >= 3:
            word = word[: -len(suf)]
            if suf in ("ies", "ied"):
                word += "y"
            break
    if word.endswith("e") and len(word) > 3:
        word = word[:-1]
    return word


def content_stems(text):
    toks = re.findall(r"[a-z0-9]+", text.lower())
    return {stem(t) for t in toks if t not in STOP and len(t) > 1}


def load(name):
    rows = []
    with open(os.path.join(HERE, name), encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except ValueError as e:
                    rows.append({"id": f"<{name}:{n} bad json: {e}>"})
    return rows


def main():
    errors = []
    facts = load("facts.jsonl")
    questions = load("questions.jsonl")

    by_id = {}
    for f in facts:
        if f.get("id") in by_id:
            errors.append(f"duplicate fact id {f.get('id')}")
        by_id[f.get("id")] = f
        for key in ("agent", "topic", "fact", "tags", "split", "domain_topic"):
            if not f.get(key):
                errors.append(f"fact {f.get('id')}: missing {key}")
        if f.get("split") not in SPLITS:
            errors.append(f"fact {f.get('id')}: bad split {f.get('split')!r}")

    cluster_split = defaultdict(set)
    for f in facts:
        cluster_split[f.get("domain_topic")].add(f.get("split"))

    seen_q = set()
    paraphrase_bad = []
    for q in questions:
        qid = q.get("id")
        if qid in seen_q:
            errors.append(f"duplicate question id {qid}")
        seen_q.add(qid)
        kind, split, answers = q.get("kind"), q.get("split"), q.get("answers")
        if kind not in KINDS:
            errors.append(f"{qid}: bad kind {kind!r}")
        if split not in SPLITS:
            errors.append(f"{qid}: bad split {split!r}")
        if not q.get("question") or not q.get("asker"):
            errors.append(f"{qid}: missing question or asker")
        if not isinstance(answers, list):
            errors.append(f"{qid}: answers is not a list")
            continue
        for a in answers:
            if a not in by_id:
                errors.append(f"{qid}: answer {a} does not exist")
            elif by_id[a]["split"] != split:
                errors.append(f"{qid}: answer {a} is in split {by_id[a]['split']}, question in {split}")
        if kind == "unanswerable":
            nm = q.get("near_miss")
            if answers:
                errors.append(f"{qid}: unanswerable with answers")
            if nm not in by_id:
                errors.append(f"{qid}: near_miss {nm!r} does not exist")
            elif by_id[nm]["split"] != split:
                errors.append(f"{qid}: near_miss {nm} in the other split")
        else:
            if not answers:
                errors.append(f"{qid}: {kind} without answers")
            if kind == "multi" and len(answers) < 2:
                errors.append(f"{qid}: multi with fewer than two answers")
        if q.get("domain_topic") is not None:
            cluster_split[q["domain_topic"]].add(split)
        if kind == "paraphrase":
            qs = content_stems(q.get("question", ""))
            for a in answers:
                if a in by_id:
                    shared = qs & content_stems(by_id[a]["fact"] + " " + by_id[a]["topic"])
                    if shared:
                        paraphrase_bad.append(f"{qid} shares {sorted(shared)} with {a}")

    for c, s in cluster_split.items():
        if len(s) != 1:
            errors.append(f"cluster {c} spans splits {sorted(s)}")

    agents = Counter(f.get("agent") for f in facts)
    fact_split = Counter(f.get("split") for f in facts)
    table = Counter((q.get("kind"), q.get("split")) for q in questions)
    n_facts = sum(fact_split[s] for s in MAIN)
    n_questions = sum(table[(k, s)] for k in KINDS for s in MAIN)
    if n_facts < MIN_FACTS:
        errors.append(f"{n_facts} fit+score facts < {MIN_FACTS}")
    if n_questions < MIN_QUESTIONS:
        errors.append(f"{n_questions} fit+score questions < {MIN_QUESTIONS}")
    n_un = sum(table[("unanswerable", s)] for s in MAIN)
    if n_un < MIN_UNANSWERABLE:
        errors.append(f"{n_un} unanswerable < {MIN_UNANSWERABLE}")
    if len(agents) < MIN_AGENTS:
        errors.append(f"{len(agents)} writer agents < {MIN_AGENTS}")
    for k in KINDS:
        for s in MAIN:
            if not table[(k, s)]:
                errors.append(f"no {k} question in split {s}")

    print(
        f"facts: {len(facts)} ({', '.join(f'{s} {fact_split[s]}' for s in SPLITS)}); "
        f"clusters: {len(cluster_split)}; writers: {len(agents)} "
        f"({', '.join(f'{a} {n}' for a, n in agents.most_common())})"
    )
    print(f"questions: {len(questions)}")
    print(f"{'kind':<14}" + "".join(f"{s:>10}" for s in SPLITS) + f"{'total':>7}")
    for k in KINDS:
        print(f"{k:<14}" + "".join(f"{table[(k, s)]:>10}" for s in SPLITS) + f"{sum(table[(k, s)] for s in SPLITS):>7}")
    print(f"{'all':<14}" + "".join(f"{sum(table[(k, s)] for k in KINDS):>10}" for s in SPLITS) + f"{len(questions):>7}")

    for line in paraphrase_bad:
        print("paraphrase:", line)
    for e in errors:
        print("error:", e)
    ok = not errors and not paraphrase_bad
    print("OK" if ok else f"FAILED: {len(errors)} errors, {len(paraphrase_bad)} paraphrase overlaps")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
