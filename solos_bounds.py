"""Bounds every answer keeps to: the largest integer a field takes, and the bytes one answer's rows may fill.

Unbounded, a 1,480-byte MCP batch of read_events calls built a 1.5 GB answer,
and one recall with k=100 answered 29 MB. Counts alone do not bound bytes (a
row can hold 21 KiB of text, and JSON's \\uXXXX escapes grow it up to 12x), so
lists of rows are cut where their JSON would pass ANSWER_BYTES, and the answer
says where to continue. Stdlib only; imports nothing from the service.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

MAX_ID = 2**63 - 1  # SQLite's largest integer: every row id and event id is below it
# One answer's rows, as JSON: 1 MiB. MCP sends a result twice (text and structuredContent, the text escaped
# once more), so a tools/call stays near 2-3 MiB, under the client's 4 MiB cap (solos_client.MAX_ANSWER_BYTES).
ANSWER_BYTES = 1 << 20
WORST_BYTES_PER_CHAR = 12  # an astral character is \\udXXX\\udXXX in ASCII JSON; repr() shows it as 1+ characters


def json_bytes(value: Any) -> int:
    """The size of value as the REST transport encodes it (ASCII JSON)."""
    return len(json.dumps(value, default=str))


def fitting(rows: Sequence[Any], budget: int = ANSWER_BYTES) -> int:
    """How many rows, from the first, fit in budget bytes of JSON; at least one, so a reader always moves on.

    A cheap upper bound (repr's length times the worst escape) spares the JSON encoding of the usual small
    answer; only an answer that might not fit is measured row by row.
    """
    if sum(len(repr(row)) for row in rows) * WORST_BYTES_PER_CHAR <= budget:
        return len(rows)
    used = 0
    for count, row in enumerate(rows):
        used += json_bytes(row) + 1
        if used > budget and count:
            return count
    return len(rows)


def cut(rows: list[Any], budget: int = ANSWER_BYTES) -> tuple[list[Any], dict | None]:
    """The rows that fit (`fitting`), and what an answer says of the rest (None when all fit)."""
    kept = fitting(rows, budget)
    if kept == len(rows):
        return rows, None
    left = len(rows) - kept
    return rows[:kept], {
        "left_out": left,
        "max_bytes": budget,
        "message": f"the next {left} results would pass {budget} bytes; ask with a narrower q, tiers or scope",
    }
