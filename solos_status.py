"""The operator's status page of solos-memory, and the recall counters it shows.

`render_page(health, stats)` turns what `/health` and `/v1/stats` answer into
one HTML page: standard library only, no script, no external asset, so it
works offline and on a phone. It is built from the stats operation's answer
for the same caller, so it never shows what the API would refuse that caller,
and it never holds memory text: stats carry counts, not rows. Every value is
escaped.

`Activity` counts recalls per agent and rows read per (reader, writer) in
minute buckets over the last day, in memory: a restart starts them afresh
(the page says since when). Writes per agent come from the tables instead.

Imports nothing from the service; `solos_memory.py` mounts it at `/` and `/status`.
"""

from __future__ import annotations

import base64
import threading
import time
from collections import Counter
from collections.abc import Callable
from html import escape
from typing import Any

REFRESH_S = 15  # the page reloads itself this often; each load costs a few COUNT queries
WINDOWS = {"hour": 3600, "day": 86400}
MAX_REJECTIONS_SHOWN = 20


class Activity:
    """Recall calls per agent and foreign rows read per (reader, writer), for the last hour and day."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.started = time.time()
        self.minutes: dict[int, Counter] = {}  # minute since the epoch -> Counter of keys below

    def recalled(self, reader: str, writers: list[str]) -> None:
        """One recall by reader that returned rows written by writers (one entry per row)."""
        now = int(time.time() // 60)
        with self.lock:
            bucket = self.minutes.setdefault(now, Counter())
            bucket[("recall", reader)] += 1
            bucket.update(("read", reader, writer) for writer in writers if writer != reader)
            for minute in [m for m in self.minutes if m <= now - WINDOWS["day"] // 60]:
                del self.minutes[minute]

    def snapshot(self, writes: dict[str, tuple[int, int]], agent: str | None = None) -> dict:
        """Per window: writes (rows per writer, from the tables), recalls per agent, reads reader -> writer.

        With an agent (its own view), only what concerns it: its writes and recalls, its reads of others'
        rows and others' reads of its rows.
        """
        mine = lambda *names: agent is None or agent in names  # noqa: E731
        now = int(time.time() // 60)
        with self.lock:
            buckets = dict(self.minutes)
        answer: dict[str, Any] = {"recalls_counted_since": iso(self.started)}
        for position, (window, seconds) in enumerate(WINDOWS.items()):
            total: Counter = Counter()
            for minute, bucket in buckets.items():
                if minute > now - seconds // 60:
                    total.update(bucket)
            answer[window] = {
                "writes": {
                    name: counts[position] for name, counts in sorted(writes.items()) if counts[position] and mine(name)
                },
                "recalls": {key[1]: n for key, n in sorted(total.items()) if key[0] == "recall" and mine(key[1])},
                "reads": [
                    {"reader": key[1], "writer": key[2], "rows": n}
                    for key, n in sorted(total.items())
                    if key[0] == "read" and mine(key[1], key[2])
                ],
            }
        return answer


def iso(seconds: float) -> str:
    """A time as the schema's timestamps read (UTC, milliseconds, 'Z')."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{int(seconds % 1 * 1000):03d}Z"


def bearer_from_basic(authorization: str | None) -> str | None:
    """A browser logs in with Basic (any user name, the agent token as password): read it as that Bearer token."""
    if not authorization or authorization[:6].lower() != "basic ":
        return authorization
    try:
        _, _, token = base64.b64decode(authorization[6:].strip(), validate=True).decode("utf-8").partition(":")
    except (ValueError, UnicodeDecodeError):
        return None
    return "Bearer " + token


# ---- the page ----

STYLE = """
body{font:15px/1.4 system-ui,sans-serif;margin:0 auto;max-width:60rem;padding:.5rem;color:#222}
h1{font-size:1.3rem;margin:.3rem 0}h2{font-size:1.05rem;margin:1.2rem 0 .3rem}
.ok{color:#0a6b2d}.bad{color:#a4161a}.note{color:#666;font-size:.85rem}
.scroll{overflow-x:auto}table{border-collapse:collapse;min-width:100%}
th,td{text-align:left;padding:.2rem .5rem;border-bottom:1px solid #ddd;vertical-align:top}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}#rejections td,#verdict{overflow-wrap:anywhere}
"""


def render_page(health: dict, stats: dict, refresh_s: int = REFRESH_S) -> bytes:
    """The whole page as UTF-8 HTML."""
    degraded = health["degraded"]
    verdict = (
        f'<p id="verdict" class="bad">Recall is degraded: {escape(str(health["degraded_reason"]))}</p>'
        if degraded
        else '<p id="verdict" class="ok">Healthy: hybrid recall (keywords and embeddings).</p>'
    )
    sections = [
        f'<h1>solos-memory <span id="health" class="{"bad" if degraded else "ok"}">'
        f"{escape(health['status'])}{' (degraded)' if degraded else ''}</span></h1>",
        verdict,
        facts(health, stats),
        tiers_table(stats),
        activity_tables(stats.get("activity") or {}),
        rejections_tables(stats),
        f'<p class="note" id="footer">Version {escape(str(stats.get("version", health["version"])))}, up '
        f"{duration(stats.get('uptime_s', 0))}, auth {escape(health['auth'])}. Generated {escape(iso(time.time()))}; "
        f"reloads every {int(refresh_s)} s. Counts only: this page never shows what memory says.</p>",
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<link rel="icon" href="data:,">'  # no favicon request: it would be a 404 in the rejections
        f'<meta http-equiv="refresh" content="{int(refresh_s)}">'
        f"<title>solos-memory: {'degraded' if degraded else 'ok'}</title><style>{STYLE}</style></head>\n"
        "<body>\n" + "\n".join(sections) + "\n</body></html>\n"
    ).encode("utf-8")


def serve_page(
    authorization: str | None, read_stats: Callable[[dict], dict], health: Callable[[], dict], refused: type[Exception]
) -> tuple[int, bytes, dict[str, str]]:
    """One request for the page: (status, body, headers). The page shows what `read_stats` (the stats
    operation, run for the caller this Authorization names) answers; a refusal (`refused`) asks for a login."""
    authorization = bearer_from_basic(authorization) or ""
    try:
        stats = read_stats({"Authorization": authorization})
    except refused as error:
        login = {"WWW-Authenticate": 'Basic realm="solos-memory status", charset="UTF-8"'}
        return 401, render_refusal(401, str(error)), login
    return 200, render_page(health(), stats), {}


def render_refusal(status: int, message: str) -> bytes:
    """A small page for a refused status page (no token, unknown token)."""
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>solos-memory: {status}</title></head>'
        f'<body><h1>{status}</h1><p id="refusal">{escape(message)}</p>'
        "<p>With tokens on, log in with any user name and an agent's token as the password.</p></body></html>\n"
    ).encode()


def facts(health: dict, stats: dict) -> str:
    """Embedder, backlog and the service-wide counters, one per row."""
    rejections = stats.get("rejections") or {}
    items = [
        ("embedder", f"{stats.get('embedder') or 'none'} ({health.get('embedder_state')})"),
        ("rows without a vector yet", "-" if health.get("embed_backlog") is None else health["embed_backlog"]),
        ("duplicates suppressed", stats.get("duplicates_suppressed", 0)),
        ("recalls with no result", stats.get("recall_empty", 0)),
        ("busy: database locked (503)", rejections.get("busy", 0)),
        ("busy: too many connections (503)", rejections.get("too_many_connections", 0)),
        # Refused connections are turned away before a request is read, so they are not among the answered.
        ("503 in all", int(stats.get("answered_503", 0)) + int(rejections.get("too_many_connections", 0))),
    ]
    cell = lambda value: f'<td class="n">{value}</td>' if isinstance(value, int) else f"<td>{escape(str(value))}</td>"  # noqa: E731
    rows = "".join(f"<tr><th>{escape(name)}</th>{cell(value)}</tr>" for name, value in items)
    return f'<h2>Service</h2><div class="scroll"><table id="service"><tbody>{rows}</tbody></table></div>'


def table(table_id: str, head: list[str], rows: list[list[Any]], empty: str) -> str:
    """A table whose numeric cells are right-aligned; `empty` stands in for no rows."""
    if not rows:
        return f'<p class="note" id="{table_id}">{escape(empty)}</p>'
    numeric = [all(isinstance(row[i], int) for row in rows) for i in range(len(head))]
    cells = lambda row: "".join(  # noqa: E731
        f'<td class="n">{value}</td>' if numeric[i] else f"<td>{escape(str(value))}</td>" for i, value in enumerate(row)
    )
    heads = "".join(
        f'<th class="n">{escape(h)}</th>' if numeric[i] else f"<th>{escape(h)}</th>" for i, h in enumerate(head)
    )
    body = "".join(f"<tr>{cells(row)}</tr>" for row in rows)
    return (
        f'<div class="scroll"><table id="{table_id}"><thead><tr>{heads}</tr></thead><tbody>{body}</tbody></table></div>'
    )


def tiers_table(stats: dict) -> str:
    """Rows, vectors and recall hits per tier."""
    rows, vectors, hits = stats.get("rows") or {}, stats.get("vectors") or {}, stats.get("recall_hits") or {}
    body = [
        [tier, int(rows.get(tier, 0)), int(vectors.get(tier, 0)), int(hits.get(tier, 0))]
        for tier in ("short", "long", "episodic", "durable")
    ]
    note = f'<p class="note">Short: live rows; {int(rows.get("short_expired", 0))} expired wait for purge.</p>'
    return "<h2>Tiers</h2>" + table("tiers", ["tier", "rows", "vectors", "recall hits"], body, "") + note


def activity_tables(activity: dict) -> str:
    """Writes and recalls per agent, and who read whose rows, over the last hour and day."""
    hour, day = activity.get("hour") or {}, activity.get("day") or {}
    agents = sorted({*day.get("writes", {}), *day.get("recalls", {})})
    per_agent = [
        [
            agent,
            hour.get("writes", {}).get(agent, 0),
            day.get("writes", {}).get(agent, 0),
            hour.get("recalls", {}).get(agent, 0),
            day.get("recalls", {}).get(agent, 0),
        ]
        for agent in agents
    ]
    hour_reads = {(r["reader"], r["writer"]): r["rows"] for r in hour.get("reads", [])}
    reads = [
        [r["reader"], r["writer"], hour_reads.get((r["reader"], r["writer"]), 0), r["rows"]]
        for r in day.get("reads", [])
    ]
    since = activity.get("recalls_counted_since")
    return (
        "<h2>Agents</h2>"
        + table(
            "agents",
            ["agent", "writes 1 h", "writes 24 h", "recalls 1 h", "recalls 24 h"],
            per_agent,
            "No activity in the last day.",
        )
        + '<p class="note">Writes: rows created or changed, by the tables\' timestamps (any writer). '
        f"Recalls and reads: counted by this service since {escape(str(since))}.</p>"
        + "<h2>Who reads whom</h2>"
        + table(
            "reads",
            ["reader", "writer", "rows 1 h", "rows 24 h"],
            reads,
            "No agent recalled another's rows in the last day.",
        )
    )


def rejections_tables(stats: dict) -> str:
    """Refusals by code, then the last ones with their reasons, newest first."""
    counts = [[code, int(n)] for code, n in sorted((stats.get("rejections") or {}).items())]
    recent = [
        [r.get("ts", ""), r.get("agent") or "-", r.get("operation", ""), r.get("code", ""), r.get("reason", "")]
        for r in (stats.get("recent_rejections") or [])[:MAX_REJECTIONS_SHOWN]
    ]
    return (
        "<h2>Rejections</h2>"
        + table("rejection-counts", ["code", "count"], counts, "No call was refused since the start.")
        + (table("rejections", ["time", "agent", "operation", "code", "reason"], recent, "") if recent else "")
    )


def duration(seconds: float) -> str:
    """An uptime as '3 d 4 h', '5 h 2 min' or '42 s'."""
    seconds = int(seconds)
    days, hours, minutes = seconds // 86400, seconds % 86400 // 3600, seconds % 3600 // 60
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    return f"{minutes} min {seconds % 60} s" if minutes else f"{seconds} s"
