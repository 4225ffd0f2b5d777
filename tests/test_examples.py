"""The docs' examples, run as written: README.md's quick start and docs/api.md's curl lines, against a live
service (the port changed, nothing else), each answer held to what the doc's comment says it returns.

tests/test_docs.py checks that the docs' names exist and runs the quick start once after the zero-install
command (slow); this runs every example in seconds, and checks the statuses and values the comments quote.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import solos_client

ROOT = Path(__file__).resolve().parent.parent
DOC_PORT = "localhost:8437"

pytestmark = pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")


def fenced_commands(doc: str, section: str | None = None) -> list[tuple[str, str]]:
    """(comment, command) for each command of the doc's ```sh blocks (of one `##`/`###` section when named),
    backslash continuations joined; the comment is the last `#` line before the command in its block."""
    text = (ROOT / doc).read_text()
    if section:
        text = text.split(f"\n{section}\n", 1)[1]
        text = re.split(r"\n#{2,3} ", text, maxsplit=1)[0]
    found: list[tuple[str, str]] = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        comment = ""
        for line in block.replace("\\\n", " ").splitlines():
            if line.startswith("#"):
                comment = line.lstrip("# ")
            elif line.strip():
                found.append((comment, line.strip()))
    return found


def run(command: str, port: int) -> tuple[int, dict]:
    """One curl line as the doc writes it, on the test's port: its HTTP status and JSON answer."""
    assert command.startswith("curl ") and DOC_PORT in command, command
    line = command.replace(DOC_PORT, f"localhost:{port}").replace("curl ", "curl -w '\\n%{http_code}' ", 1)
    done = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=15)
    assert done.returncode == 0, done.stderr
    body, status = done.stdout.rsplit("\n", 1)
    return int(status), json.loads(body)


def quoted_answer(doc: str, after: str) -> dict:
    """The `# {...}` answer the doc prints after a command (its `…` placeholders left out)."""
    text = (ROOT / doc).read_text()
    line = text.split(after, 1)[1].split("\n# ", 1)[1].split("\n", 1)[0]
    return json.loads(re.sub(r'"…"', "null", line))


def same_shape(shown: dict, got: dict) -> None:
    """Every key the doc shows is in the answer, in nested objects too (and the first of a list of them)."""
    assert set(shown) <= set(got), (shown, got)
    for key, value in shown.items():
        if isinstance(value, dict):
            same_shape(value, got[key])
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            assert got[key], (key, got)
            same_shape(value[0], got[key][0])


def test_the_quick_start_answers_what_its_comments_say(server):
    commands = fenced_commands("README.md", "## Quick start")
    assert len(commands) == 13
    answers = [(comment, *run(command, server.port)) for comment, command in commands]
    by_comment: dict[str, list[tuple[int, dict]]] = {}
    for comment, status, answer in answers:
        by_comment.setdefault(comment, []).append((status, answer))
    first = {}
    for comment, command in reversed(commands):
        first[comment] = command  # each comment's first command

    ((status, fact),) = by_comment[
        "atlas writes a long-term fact (201 created; the same fact again: 200 unchanged, one row)"
    ]
    assert (status, fact["status"], fact["agent"]) == (201, "created", "atlas")
    again = run(first[next(iter(by_comment))], server.port)  # "the same fact again"
    assert again == (200, {**fact, "status": "unchanged"})

    ((status, recall),) = by_comment["sol recalls it: labelled agent=atlas, foreign=true"]
    assert status == 200
    assert [(r["id"], r["agent"], r["foreign"]) for r in recall["results"]] == [(fact["id"], "atlas", True)]
    assert {"id", "tier", "agent", "ts", "score", "source", "foreign", "text", "relevance"} <= set(recall["results"][0])
    assert {"count", "ranking", "degraded", "receipt"} <= set(recall)

    floor = by_comment["at the floor the turn helpers use (0.08), a question memory cannot answer gets no row"]
    assert [a["min_relevance"] for _, a in floor] == [solos_client.TURN_MIN_RELEVANCE] * 2
    assert [r["agent"] for r in floor[0][1]["results"]] == ["atlas"]
    assert (floor[1][1]["q"], floor[1][1]["count"], floor[1][1]["results"]) == ("what port does the gateway use", 0, [])

    (status, short), (_, own) = by_comment["short-term key/value with a TTL in seconds; recall it with tiers=short"]
    assert (status, short["status"], short["key"]) == (201, "created", "current-task")
    assert [(r["tier"], r["key"], r["value"]) for r in own["results"]] == [
        ("short", "current-task", "rotating TLS certificates")
    ]

    ((status, event),) = by_comment["an episodic event; idempotency_key makes a retry safe"]
    assert (status, event["status"]) == (201, "created")
    retry = first["an episodic event; idempotency_key makes a retry safe"]
    assert run(retry, server.port) == (200, {**event, "status": "unchanged"})

    (_, sharing), (_, episodes), (_, audit) = by_comment[
        "atlas lets other agents read its episodes; sol reads one; atlas sees who read it"
    ]
    assert sharing["episodic"] is True
    assert [(r["id"], r["agent"], r["foreign"]) for r in episodes["results"]] == [(event["id"], "atlas", True)]
    assert [(r["reader"], r["author"], r["row_id"]) for r in audit["reads"]] == [("sol", "atlas", event["id"])]

    ((status, deleted),) = by_comment["delete one of your own short-term keys"]
    assert (status, deleted["status"], deleted["id"]) == (200, "deleted", short["id"])

    (_, stats), (_, health) = by_comment["counters, row counts, degraded state; liveness"]
    assert stats["rows"]["long"] == 1 and stats["rows"]["short"] == 0  # one row for the fact written twice
    assert "degraded" in stats and health["status"] == "ok" and "degraded" in health


def test_the_api_pages_examples_answer_as_shown(server):
    doc = "docs/api.md"
    port = server.port
    quoted = json.loads(re.search(r'`(\{"error": .*?\})`', (ROOT / doc).read_text())[1])  # the bad-input example
    assert quoted["error"]["field"] == "k" and "got 500" in quoted["error"]["message"]
    assert run(f"curl -s '{DOC_PORT}/v1/recall?agent=sol&q=x&k=500'", port) == (400, quoted)

    # A fact atlas wrote and sol was shown: the deliveries, forget, notices and ack examples, in the doc's order.
    write = f"curl -s -X POST {DOC_PORT}/v1/long -H 'Content-Type: application/json' -d "
    fact = run(write + """'{"agent": "atlas", "topic": "infra", "fact": "Backups run at 02:00 UTC"}'""", port)
    assert fact[0] == 201 and fact[1]["id"] == 1  # the id the forget example names
    assert run(f"curl -s '{DOC_PORT}/v1/recall?agent=sol&q=backup'", port)[1]["count"] == 1

    examples = {command: comment for comment, command in fenced_commands(doc)}
    deliveries = next(c for c in examples if "/v1/deliveries" in c)
    status, answer = run(deliveries, port)
    assert status == 200
    same_shape(quoted_answer(doc, deliveries), answer)
    assert [(d["reader"], d["writer"], d["row_id"]) for d in answer["deliveries"]] == [("sol", "atlas", 1)]

    forget = next(c for c in examples if "/v1/memory" in c)
    status, answer = run(forget, port)
    shown = quoted_answer(doc, forget)
    same_shape(shown, answer)
    assert status == 200
    assert {k: answer[k] for k in ("tier", "agent", "id", "status", "wal_checkpoint")} == {
        k: shown[k] for k in ("tier", "agent", "id", "status", "wal_checkpoint")
    }

    notices = next(c for c in examples if "/v1/notices?" in c)
    status, answer = run(notices, port)
    shown = quoted_answer(doc, notices)
    same_shape(shown, answer)
    assert (status, answer["count"]) == (200, 1)
    assert {k: answer["notices"][0][k] for k in ("id", "tier", "writer", "kind", "new_id")} == {
        k: shown["notices"][0][k] for k in ("id", "tier", "writer", "kind", "new_id")
    }
    assert answer["notices"][0]["row_id"] == 1  # the doc's notice is of its witnesses' row 12; here, the forgotten one

    ack = next(c for c in examples if "/v1/notices/ack" in c)
    assert run(ack, port) == (200, quoted_answer(doc, ack))

    by_id = next(c for c in examples if "/v1/events?" in c and "since=" in c)
    status, answer = run(by_id, port)
    assert status == 200 and {"since", "next_since", "events", "gap"} <= set(answer)

    for command in [c for c in examples if "/v1/recall/as_of" in c or "backup+window" in c]:
        assert run(command, port)[0] == 200, command
