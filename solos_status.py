"""The operator's status page of solos-memory, and the recall counters it shows.

`render_page(health, stats)` turns what `/health` and `/v1/stats` answer into
one HTML page: standard library only, no script, no external asset, so it
works offline and on a phone; its charts are inline SVG drawn here. It is
built from the stats operation's answer for the same caller, so it never
shows what the API would refuse that caller, and it never holds memory text:
stats carry counts, not rows. Every value is escaped, and absolute paths in
messages are cut to their last part (the journal and the API keep them whole).

`Activity` counts recalls, their latency and the rows each agent read of
another's, per minute over the last day. The counts are saved to the
database's memory_activity table every minute and at shutdown, and read back
at start, so a restart keeps the hour and the day. Writes per agent come from
the database's event log instead (`Store.writes_by_hour`).

Imports nothing from the service; `solos_memory.py` mounts it at `/` and `/status`.
"""

from __future__ import annotations

import base64
import bisect
import logging
import os
import re
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from html import escape
from typing import Any

import solos_jobs

REFRESH_S = 15  # the page reloads itself this often; each load costs a few COUNT queries
WINDOWS = {"hour": 3600, "day": 86400}
HOURS = 24  # the charts' bars: one per hour of the last day
MAX_REJECTIONS_SHOWN = 20
SAVE_EVERY_S = 60  # a crash loses at most this much of the counts; a clean stop loses none
KEPT_MINUTES = 25 * 60  # the day, and the hour the oldest bar reaches into
# Recall latency is counted in buckets, by upper bound (ms): p50 and p99 read as "at most". The last
# bucket holds everything slower.
LATENCY_BOUNDS_MS = (
    *(0.25, 0.5, 0.75, 1, 1.5, 2, 3, 4, 5, 7.5, 10, 15, 20, 30, 40, 50, 75, 100),
    *(150, 200, 300, 500, 750, 1000, 1500, 2000, 3000, 5000, 10000, 60000),
)

log = logging.getLogger(__name__)


def latency_bucket(seconds: float) -> str:
    """The bucket (its upper bound in ms, as stored) a recall of this duration counts in."""
    index = bisect.bisect_left(LATENCY_BOUNDS_MS, seconds * 1000)
    return f"{LATENCY_BOUNDS_MS[min(index, len(LATENCY_BOUNDS_MS) - 1)]:g}"


def quantile_ms(buckets: Counter, q: float) -> float | None:
    """The smallest bucket bound that at least q of the recalls stayed within; None without recalls."""
    total = sum(buckets.values())
    if not total:
        return None
    seen = 0
    for bound in sorted(buckets, key=float):
        seen += buckets[bound]
        if seen >= q * total:
            return float(bound)
    return None  # not reached: the counts sum to total


class Activity:
    """Recalls and their latency per agent, and rows read per (reader, writer): per minute, for the last day.

    With a store (`read(work)`, `write(work)` on a connection), the counts are read back at start and
    saved every SAVE_EVERY_S and at close(). On a database several copies of the service share (PostgreSQL),
    what stats show is every copy's: the saved counts, read per hour, plus this copy's not saved yet.
    """

    def __init__(self, store: Any = None) -> None:
        self.lock = threading.Lock()
        self.started = time.time()
        self.minutes: dict[int, Counter] = {}  # minute since the epoch -> Counter of (kind, agent, detail)
        self.unsaved: Counter = Counter()  # (minute, kind, agent, detail) -> count not yet in the database
        self.store = store
        self.shared = bool(getattr(store, "shared_by_copies", False))
        self.stopping = threading.Event()
        self.saver: threading.Thread | None = None
        if store is not None:
            self.load()
            self.saver = threading.Thread(target=self.keep_saving, name="activity-save", daemon=True)
            self.saver.start()

    def recalled(self, reader: str, writers: list[str], seconds: float) -> None:
        """One recall by reader that took seconds and returned rows written by writers (one entry per row)."""
        now = int(time.time() // 60)
        keys = [("recall", reader, ""), ("latency", reader, latency_bucket(seconds))]
        keys.extend(("read", reader, writer) for writer in writers if writer != reader)
        with self.lock:
            self.minutes.setdefault(now, Counter()).update(keys)
            self.unsaved.update((now, *key) for key in keys)
            for minute in [m for m in self.minutes if m <= now - KEPT_MINUTES]:
                del self.minutes[minute]

    def counted(self) -> dict[int, Counter]:
        """This copy's counts per minute."""
        with self.lock:
            return {minute: Counter(counts) for minute, counts in self.minutes.items()}

    def every_copy(self, now: int) -> dict[int, Counter]:
        """Every copy's counts, per hour ago (each at its hour's newest minute): what all of them saved, summed in
        the database, and this copy's not saved yet. A save under way is missed for that moment."""
        with self.lock:
            unsaved = Counter(self.unsaved)
        rows = self.store.read(
            lambda conn: conn.execute(
                "SELECT (? - minute) / 60 AS ago, kind, agent, detail, sum(n) FROM memory_activity "
                "WHERE minute > ? GROUP BY 1, 2, 3, 4",
                (now, now - HOURS * 60),
            ).fetchall()
        )
        buckets: dict[int, Counter] = {}
        for ago, kind, agent, detail, n in rows:
            buckets.setdefault(now - int(ago) * 60, Counter())[(kind, agent, detail)] += int(n)
        for (minute, kind, agent, detail), n in unsaved.items():
            buckets.setdefault(minute, Counter())[(kind, agent, detail)] += n
        return buckets

    # -- kept in the database --

    def load(self) -> None:
        """The last day's counts from the database (another run of the service counted them)."""
        since = int(time.time() // 60) - KEPT_MINUTES
        rows = self.store.read(
            lambda conn: conn.execute(
                "SELECT minute, kind, agent, detail, n FROM memory_activity WHERE minute > ?", (since,)
            ).fetchall()
        )
        for minute, kind, agent, detail, n in rows:
            self.minutes.setdefault(minute, Counter())[(kind, agent, detail)] += n
        if self.minutes:
            self.started = min(self.started, min(self.minutes) * 60)

    def save(self) -> None:
        """Add the counts not yet saved to the database, and drop what is older than 25 h; one short write."""
        with self.lock:
            unsaved, self.unsaved = self.unsaved, Counter()
        if not unsaved:  # an idle service leaves the database alone
            return
        oldest = int(time.time() // 60) - KEPT_MINUTES

        def work(conn: Any) -> None:
            conn.executemany(
                "INSERT INTO memory_activity (minute, kind, agent, detail, n) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (minute, kind, agent, detail) DO UPDATE SET n = memory_activity.n + excluded.n",
                [(*key, n) for key, n in unsaved.items()],
            )
            conn.execute("DELETE FROM memory_activity WHERE minute <= ?", (oldest,))

        try:
            self.store.write(work)
        except Exception:  # busy, or the disk: keep the counts for the next try, and say so
            log.warning("activity counts not saved; retrying in %s s", SAVE_EVERY_S, exc_info=True)
            with self.lock:
                self.unsaved.update(unsaved)

    def keep_saving(self) -> None:
        while not self.stopping.wait(SAVE_EVERY_S):
            self.save()

    def close(self) -> None:
        """Stop the saver and save what is left (before the store closes)."""
        if self.saver is not None:
            self.stopping.set()
            self.saver.join()
            self.save()

    # -- what stats show --

    def snapshot(self, writes: dict[str, list[int]], agent: str | None = None) -> dict:
        """Per window: writes (rows per writer, from the tables), recalls per agent, reads reader -> writer;
        per hour of the last day: writes, recalls and recall latency (p50, p99).

        `writes` is rows per writer per hour, index 0 the last hour. With an agent (its own view), only what
        concerns it: its writes and recalls, its reads of others' rows and others' reads of its rows.
        """
        mine = lambda *names: agent is None or agent in names  # noqa: E731
        concerns = lambda key: mine(key[1], key[2]) if key[0] == "read" else mine(key[1])  # noqa: E731
        now = int(time.time() // 60)
        buckets = self.every_copy(now) if self.shared else self.counted()
        hourly: list[Counter] = [Counter() for _ in range(HOURS)]  # index: hours ago
        for minute, counts in buckets.items():
            if 0 <= now - minute < HOURS * 60:
                hourly[(now - minute) // 60].update({key: n for key, n in counts.items() if concerns(key)})
        own_writes = {name: counts for name, counts in sorted(writes.items()) if mine(name)}
        answer: dict[str, Any] = {"recalls_counted_since": solos_jobs.stamp(self.started)}
        for window, seconds in WINDOWS.items():
            total = sum(hourly[: seconds // 3600], Counter())
            answer[window] = {
                "writes": {name: n for name, counts in own_writes.items() if (n := sum(counts[: seconds // 3600]))},
                "recalls": {key[1]: n for key, n in sorted(total.items()) if key[0] == "recall"},
                "reads": [
                    {"reader": key[1], "writer": key[2], "rows": n}
                    for key, n in sorted(total.items())
                    if key[0] == "read"
                ],
            }
        latency = [Counter({key[2]: n for key, n in counts.items() if key[0] == "latency"}) for counts in hourly]
        answer["recall_latency_ms"] = {
            window: {
                "p50": quantile_ms(sum(latency[: seconds // 3600], Counter()), 0.5),
                "p99": quantile_ms(sum(latency[: seconds // 3600], Counter()), 0.99),
            }
            for window, seconds in WINDOWS.items()
        }
        answer["hours"] = [  # oldest first, as the charts draw them
            {
                "hours_ago": ago,
                "writes": sum(counts[ago] for counts in own_writes.values() if ago < len(counts)),
                "recalls": sum(n for key, n in hourly[ago].items() if key[0] == "recall"),
                "recall_p50_ms": quantile_ms(latency[ago], 0.5),
                "recall_p99_ms": quantile_ms(latency[ago], 0.99),
            }
            for ago in reversed(range(HOURS))
        ]
        return answer


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

# Mobile first: one column; from about 44rem, the sections sit side by side. Table cells never break a word:
# names, numbers and times do not wrap at all, and free text (a reason) wraps only between its words. The Service
# table is a label and its value, left-aligned beside it; its values wrap like free text (the embedder's long name),
# so none is pushed out of its column behind a scrollbar.
STYLE = """
body{font:15px/1.45 system-ui,sans-serif;margin:0 auto;max-width:80rem;padding:.5rem .6rem 1rem;color:#1f2328}
h1{font-size:1.35rem;margin:.3rem 0}h2{font-size:1.1rem;margin:1.3rem 0 .4rem;padding-bottom:.15rem;
border-bottom:1px solid #d0d7de}h3{font-size:.95rem;margin:.8rem 0 .3rem}
.badge{display:inline-block;border-radius:1rem;padding:0 .6rem;font-size:.85rem;font-weight:600;vertical-align:.15rem}
.good{background:#dafbe1;color:#116329}.neutral{background:#eaeef2;color:#32383f}.bad{background:#ffebe9;color:#a40e26}
p.bad,ul.bad{padding:.4rem .7rem;border-radius:.3rem}ul.bad{margin:.5rem 0;padding-left:1.6rem}
.note{color:#57606a;font-size:.85rem;margin:.3rem 0}
.cols{display:grid;gap:0 2.5rem;grid-template-columns:repeat(auto-fit,minmax(min(100%,22.5rem),1fr));align-items:start}
.scroll{overflow-x:auto}table{border-collapse:collapse}
th,td{text-align:left;padding:.15rem .7rem .15rem 0;border-bottom:1px solid #eaeef2;vertical-align:top;
white-space:nowrap}th:last-child,td:last-child{padding-right:0}thead th{vertical-align:bottom;white-space:normal}
#service th,td.text{white-space:normal}#service th{min-width:10rem}#service td.n{text-align:left}
td.text{min-width:11rem}td.text span{white-space:nowrap}
th[scope=row]{font-weight:normal;color:#57606a}.n{text-align:right;font-variant-numeric:tabular-nums}
#reads th.writer{writing-mode:vertical-rl;transform:rotate(180deg);padding:.3rem .2rem;text-align:left}
#reads td{text-align:center;padding:.15rem .3rem}#reads td.self{background:#f6f8fa}
#reads tbody th{position:sticky;left:0;background:#fff}
figure{margin:0 0 .8rem}figcaption{font-weight:600;margin-bottom:.2rem}
.chart{display:flex;flex-wrap:wrap;gap:.2rem 1rem;align-items:flex-start}.plot{width:12.5rem}
.plot svg{display:block;width:100%;height:4.5rem;background:#f6f8fa}
.axis{display:flex;justify-content:space-between;color:#57606a;font-size:.75rem}
.chart table td,.chart table th{padding:0 .6rem 0 0;border:0;font-size:.9rem}
@media (max-width:40rem){#rejections thead{display:none}#rejections tr{display:block;padding:.2rem 0;
border-bottom:1px solid #eaeef2}#rejections td{display:inline-block;border:0}
#rejections td.text{display:block;min-width:0}}
"""
KEYWORD_ONLY = (
    "Keyword recall: results are ranked by the words they share with the question. To turn on hybrid recall "
    "(ranking by meaning too), start the service with make serve, which installs the embedder, and without "
    "--model-dir off."
)
MODES = {  # embedder state -> (badge, its class)
    "ready": ("hybrid recall", "good"),
    "off": ("keyword recall", "neutral"),
    "catching_up": ("catching up", "neutral"),
    "busy": ("embedder busy", "bad"),
    "failing": ("embedder failing", "bad"),
}
# A machine path (not a route like /v1/long): under one of the roots a host's files live in.
ABSOLUTE_PATH = re.compile(
    r"(?<![\w.~/])/(?:home|root|usr|tmp|var|opt|etc|srv|mnt|run|work|nix|Users|private)(?:/[^/\s'\"()]+)*/"
    r"(?=[^/\s'\"()])"
)


def without_paths(text: str) -> str:
    """A message for the page: '/home/op/SolOS/runtime/solos.db' becomes '…/solos.db'; the interpreter's folder
    goes under any root."""
    return ABSOLUTE_PATH.sub("…/", text.replace(os.path.dirname(sys.executable) + "/", "…/"))


def without_paths_in(state: dict, paths: bool = False) -> dict:
    """A state's `…reason` fields without machine paths (what anyone reaching /health may read); all of it
    with `paths` (the operator's view)."""
    if paths:
        return state
    return {k: without_paths(v) if k.endswith("reason") and isinstance(v, str) else v for k, v in state.items()}


MESSAGE_KEYS = ("reason", "error", "detail", "target")  # where a stats answer carries a message or a location


def for_caller(operator: bool, answer: Any) -> Any:
    """The stats answer for its caller: whole for the operator; an agent's without machine paths in any message,
    however deep (the embedder's error, the delivery log's, a job's, the Qdrant target), as its reasons are."""
    if operator:
        return answer
    if isinstance(answer, list):
        return [for_caller(False, item) for item in answer]
    if not isinstance(answer, dict):
        return answer
    return {
        key: without_paths(value) if isinstance(value, str) and key.endswith(MESSAGE_KEYS) else for_caller(False, value)
        for key, value in answer.items()
    }


def render_page(health: dict, stats: dict, refresh_s: int = REFRESH_S) -> bytes:
    """The whole page as UTF-8 HTML."""
    mode, mode_class = MODES.get(str(health.get("embedder_state")), ("degraded", "bad"))
    problems = problem_list(health, stats)
    worker = f", worker {int(health['worker'])} of {int(health['workers'])}" if health.get("workers") else ""
    title = f"{len(problems)} problem{'s' * (len(problems) != 1)}" if problems else "ok"
    badges = [
        '<span class="badge bad" id="health">storage failing</span>'  # /health's status says it answered, no more
        if (health.get("storage") or {}).get("state") == "failing"
        else f'<span class="badge good" id="health">{escape(health["status"])}</span>',
        f'<span class="badge {mode_class}" id="mode">{escape(mode)}</span>',
        f'<span class="badge bad" id="problem-count">{title}</span>' if problems else "",
    ]
    sections = [
        f"<h1>solos-memory {' '.join(badge for badge in badges if badge)}</h1>",
        verdict(health),
        worker_note(health),
        (
            f'<ul id="problems" class="bad">{"".join(f"<li>{escape(p)}</li>" for p in problems)}</ul>'
            if problems
            else '<p id="problems" class="note">Nothing needs attention.</p>'
        ),
        '<div class="cols"><section>'
        + facts(health, stats)
        + "</section><section>"
        + tiers_table(stats)
        + "</section><section>"
        + jobs_table(stats.get("jobs") or {})
        + "</section><section>"
        + load_table(stats.get("load") or {})
        + "</section></div>",
        charts(stats.get("activity") or {}),
        activity_tables(stats.get("activity") or {}),
        rejections_tables(stats),
        f'<p class="note" id="footer">Version {escape(str(stats.get("version", health["version"])))}'
        f"{', copy ' + escape(str(health['copy'])) if health.get('copy') else ''}{worker}, up "
        f"{duration(stats.get('uptime_s', 0))}, auth {escape(health['auth'])}. "
        f"Generated {escape(solos_jobs.stamp(time.time()))}; reloads every {int(refresh_s)} s. "
        "Counts only: this page never shows what memory says.</p>",
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<link rel="icon" href="data:,">'  # no favicon request: it would be a 404 in the rejections
        f'<meta http-equiv="refresh" content="{int(refresh_s)}">'
        f"<title>solos-memory: {title}</title><style>{STYLE}</style></head>\n"
        "<body>\n" + "\n".join(sections) + "\n</body></html>\n"
    ).encode("utf-8")


def verdict(health: dict) -> str:
    """One sentence on how recall ranks; keyword-only is a way to run, not a fault."""
    state = health.get("embedder_state")
    if state == "off":
        return f'<p id="verdict">{escape(KEYWORD_ONLY)}</p>'
    if health["degraded"]:
        reason = without_paths(str(health["degraded_reason"]))
        return (
            f'<p id="verdict" class="{MODES.get(str(state), ("", "bad"))[1]}">Recall is degraded: {escape(reason)}</p>'
        )
    return '<p id="verdict">Healthy: hybrid recall (keywords and embeddings).</p>'


def worker_note(health: dict) -> str:
    """Under `serve --workers N`: which worker drew the page, and which of its figures are that worker's alone."""
    if not health.get("workers"):
        return ""
    return (
        f'<p class="note" id="worker">Worker {int(health["worker"])} of {int(health["workers"])} answered: the '
        "Service counters, Load and Rejections are this worker's since it started, and the next load may be "
        "another's; rows, vectors, jobs and the last 24 hours are the database's, the same from every worker.</p>"
    )


def problem_list(health: dict, stats: dict) -> list[str]:
    """What needs the operator: storage that failed a call in the last minute, a job that failed or is overdue,
    an embedder that fails or hangs, a Qdrant mirror that cannot reach Qdrant, a judge or cross-encoder whose
    files recall cannot use, a cross-encoder whose runs keep failing."""
    problems = [
        f"{job} {state['state']}: {without_paths(state['detail'])}"
        for job, state in (stats.get("jobs") or {}).items()
        if state["problem"]
    ]
    storage = health.get("storage") or {}
    if storage.get("state") == "failing":
        last = storage["last_failure"]
        problems.insert(0, f"storage failing (last at {last['at']}): {without_paths(str(last['reason']))}")
    if health.get("embedder_state") in ("failing", "busy"):
        problems.append(without_paths(str(health["degraded_reason"])))
    qdrant = stats.get("qdrant") or {}
    if qdrant.get("configured") and qdrant.get("consecutive_failures"):
        problems.append(
            f"Qdrant mirror failing ({qdrant['consecutive_failures']} attempts in a row; {qdrant.get('backlog')} "
            f"changes queued): {without_paths(str(qdrant.get('last_error')))}"
        )
    judge = health.get("judge") or {}
    for state, reason in (
        (judge.get("state"), judge.get("reason")),
        (judge.get("cross_encoder"), judge.get("cross_encoder_reason")),
    ):
        if state == "unavailable":
            problems.append(without_paths(str(reason)))
        elif state == "failing":
            problems.append(f"cross-encoder failing: {without_paths(str(reason))}")
    return problems


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


def cell(value: Any, free_text: bool = False) -> str:
    """A table cell: a number right-aligned; free text wraps between its words only; the rest does not wrap."""
    if isinstance(value, int):
        return f'<td class="n">{value}</td>'
    if free_text:  # each word held together, the lines broken between them
        return f'<td class="text">{" ".join(held(word) for word in str(value).split())}</td>'
    return f"<td>{escape(str(value))}</td>"


def held(word: str) -> str:
    """One word that does not wrap, but for a break before an @: a model's name and its hash
    (all-MiniLM-L6-v2-dynint8@9e8025153763) is wider than a phone's column for the Service table."""
    return "<wbr>".join(f"<span>{escape(part)}</span>" for part in re.split(r"(?=@)", word) if part)


def facts(health: dict, stats: dict) -> str:
    """Embedder, backlog and the service-wide counters: a label, its value right beside it."""
    rejections = stats.get("rejections") or {}
    items = [
        ("embedder", f"{stats.get('embedder') or 'none'} ({health.get('embedder_state')})"),
        ("rows without a vector yet", "-" if health.get("embed_backlog") is None else health["embed_backlog"]),
        ("duplicates suppressed", stats.get("duplicates_suppressed", 0)),
        ("recalls with no result", stats.get("recall_empty", 0)),
        ("busy: database locked (503)", (stats.get("busy_reasons") or {}).get("locked", 0)),
        ("busy: too many connections (503)", rejections.get("too_many_connections", 0)),
        # Refused connections are turned away before a request is read, so they are not among the answered.
        ("503 in all", int(stats.get("answered_503", 0)) + int(rejections.get("too_many_connections", 0))),
        *delivery_facts(stats.get("delivery_log") or {}),
    ]
    rows = "".join(f'<tr><th scope="row">{escape(name)}</th>{cell(value, True)}</tr>' for name, value in items)
    return f'<h2>Service</h2><div class="scroll"><table id="service"><tbody>{rows}</tbody></table></div>'


def load_table(load: dict) -> str:
    """Requests in flight, connections queueing for a thread slot and requests for a place to run."""
    if "in_flight" not in load:
        return ""
    items = [
        ("requests in flight now", load["in_flight"]),
        ("most in flight at once", load["in_flight_max"]),
        ("connections open now", f"{load['connections']} of {load['connection_slots']}"),
        ("most connections at once", load["connections_max"]),
        ("waiting for a slot now", load["waiting_for_slot"]),
        ("refused: no slot (503)", load["refused"]),
        ("connections evicted (idle, or not reading)", load["evicted"]),
    ]
    if load.get("running_most"):  # the admission cap (--admit; 0: none), its two lanes: "reads / writes"
        lanes = (load, load["writes"]) if "writes" in load else (load,)
        pair = lambda pattern: " / ".join(pattern.format(**lane) for lane in lanes)  # noqa: E731
        items += [
            ("running now, reads / writes", pair("{running} of {running_most}")),
            ("waiting for a place now", pair("{queued} of {queue_most}")),
            ("most waiting at once", pair("{queued_max}")),
            ("wait for a place, p50-p99", pair("{queue_wait_ms_p50}-{queue_wait_ms_p99} ms")),
            ("admitted after waiting", pair("{admitted_after_waiting}")),
            ("refused: queue full (503)", pair("{busy_queue_full}")),
            ("refused: waited too long (503)", pair("{busy_queue_wait}")),
        ]
    rows = "".join(f'<tr><th scope="row">{escape(name)}</th>{cell(value, True)}</tr>' for name, value in items)
    return f'<h2>Load</h2><div class="scroll"><table id="load"><tbody>{rows}</tbody></table></div>'


def delivery_facts(log: dict) -> list[tuple[str, Any]]:
    """The delivery log's size and rate: rows kept, rows added in the last hour, repeats not logged."""
    if "rows" not in log:
        return []
    return [
        ("delivery log rows", log["rows"]),
        ("delivery log, last hour", log.get("logged_last_hour", 0)),
        ("repeat deliveries not logged", log.get("repeats_skipped", 0)),
        ("open retraction notices", log.get("open_notices", 0)),
    ]


def table(table_id: str, head: list[str], rows: list[list[Any]], empty: str, free_text: tuple[int, ...] = ()) -> str:
    """A table whose numeric columns are right-aligned, and those in free_text wrap; `empty` stands in for no rows."""
    if not rows:
        return f'<p class="note" id="{table_id}">{escape(empty)}</p>'
    numeric = [all(isinstance(row[i], int) for row in rows) for i in range(len(head))]
    heads = "".join(
        f'<th class="n">{escape(h)}</th>' if numeric[i] else f"<th>{escape(h)}</th>" for i, h in enumerate(head)
    )
    body = "".join(f"<tr>{''.join(cell(value, i in free_text) for i, value in enumerate(row))}</tr>" for row in rows)
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


def jobs_table(jobs: dict) -> str:
    """Each daily job: when it last succeeded, the rows its last run touched, and its state."""
    now = time.time()
    body = []
    for job, state in jobs.items():
        run, success = state.get("last_run") or {}, state.get("last_success_at")
        shown = "no run yet" if state["state"] == "waiting" else state["state"]  # the problems above say why
        last = f"{duration(now - solos_jobs.seconds(success))} ago" if success else "never"
        body.append([job, last, "-" if run.get("rows") is None else int(run["rows"]), shown])
    return (
        "<h2>Jobs</h2>"
        + table("jobs", ["job", "last success", "rows", "state"], body, "No jobs are known.")
        + '<p class="note">Daily, by the systemd timers; a job without a success in a day (and 2 h) is a problem.</p>'
    )


def bars(values: list[float | None], shade: str, scale: float, describe: Callable[[float], str]) -> str:
    """One SVG bar per hour, oldest first, under the scale's label in a 240 x 72 box; 0 and None draw nothing."""
    shapes = []
    for index, value in enumerate(values):
        if not value:
            continue
        height = max(1.0, 58 * value / scale)
        shapes.append(
            f'<rect x="{index * 10 + 1}" y="{72 - height:.1f}" width="8" height="{height:.1f}" fill="{shade}">'
            f"<title>{escape(describe(value))} {hours_ago(HOURS - 1 - index)}</title></rect>"
        )
    return "".join(shapes)


def hours_ago(hours: int) -> str:
    return "in the last hour" if hours == 0 else f"{hours} to {hours + 1} h ago"


def chart(chart_id: str, caption: str, shapes: str, scale_label: str, numbers: list[tuple[str, str]]) -> str:
    """A figure: the bars with the hours under them, and the numbers beside."""
    rows = "".join(f'<tr><th scope="row">{escape(name)}</th><td class="n">{escape(v)}</td></tr>' for name, v in numbers)
    return (
        f'<figure id="{chart_id}"><figcaption>{escape(caption)}</figcaption><div class="chart"><div class="plot">'
        f'<svg viewBox="0 0 240 72" role="img" aria-label="{escape(caption)}, per hour over the last day">'
        f'<text x="3" y="10" font-size="9" fill="#57606a">{escape(scale_label)}</text>'
        f'<line x1="0" y1="71.5" x2="240" y2="71.5" stroke="#d0d7de"/>{shapes}</svg>'
        '<div class="axis"><span>24 h ago</span><span>now</span></div></div>'
        f'<table id="{chart_id}-numbers"><tbody>{rows}</tbody></table></div></figure>'
    )


def count_chart(chart_id: str, noun: str, counts: list[int], shade: str) -> str:
    """Writes or recalls per hour: the bars, and the last hour, the day and the busiest hour beside them."""
    return chart(
        chart_id,
        f"{noun.capitalize()} per hour",
        bars(list(counts), shade, max(counts), lambda v: f"{int(v)} {noun}"),
        f"peak {max(counts)}",
        [("last hour", str(counts[-1])), ("last 24 h", str(sum(counts))), ("busiest hour", str(max(counts)))],
    )


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value:g} ms"


def charts(activity: dict) -> str:
    """Writes, recalls and recall latency (p50, p99) per hour over the last day, with the numbers beside."""
    hours = activity.get("hours") or []
    if not hours:
        return ""
    p50 = [hour["recall_p50_ms"] for hour in hours]
    p99 = [hour["recall_p99_ms"] for hour in hours]
    latency = activity.get("recall_latency_ms") or {}
    top = max([0, *(v for v in p99 if v is not None)])
    figures = [
        count_chart("chart-writes", "writes", [hour["writes"] for hour in hours], "#0969da"),
        count_chart("chart-recalls", "recalls", [hour["recalls"] for hour in hours], "#8250df"),
        chart(
            "chart-latency",
            "Recall latency per hour (p99 light, p50 dark)",
            bars(p99, "#f0b37e", top, lambda v: f"p99 at most {v:g} ms")
            + bars(p50, "#bc4c00", top, lambda v: f"p50 at most {v:g} ms"),
            f"top {ms(top)}",
            [
                ("p50, 1 h", ms((latency.get("hour") or {}).get("p50"))),
                ("p99, 1 h", ms((latency.get("hour") or {}).get("p99"))),
                ("p50, 24 h", ms((latency.get("day") or {}).get("p50"))),
                ("p99, 24 h", ms((latency.get("day") or {}).get("p99"))),
            ],
        ),
    ]
    return (
        '<h2>Last 24 hours</h2><div class="cols">'
        + "".join(figures)
        + '</div><p class="note">Latency is counted in buckets: each figure is the bucket\'s upper bound '
        "(at most that long), timed inside the service.</p>"
    )


def activity_tables(activity: dict) -> str:
    """Writes and recalls per agent, and a reader x writer grid of the rows one read of another's, last day."""
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
    since = activity.get("recalls_counted_since")
    return (
        '<div class="cols"><section><h2>Agents</h2>'
        + table(
            "agents",
            ["agent", "writes 1 h", "writes 24 h", "recalls 1 h", "recalls 24 h"],
            per_agent,
            "No activity in the last day.",
        )
        + '<p class="note">Writes: rows created or changed, by the event log (any writer; one deleted since '
        "still counts). "
        f"Recalls, reads and latency: counted by this service since {escape(str(since))}, "
        "kept in the database (saved every minute), so a restart keeps them.</p></section>"
        + "<section><h2>Who reads whom</h2>"
        + read_grid(hour.get("reads", []), day.get("reads", []))
        + "</section></div>"
    )


def read_grid(hour_reads: list[dict], day_reads: list[dict]) -> str:
    """Rows each reader (a row) recalled of each writer (a column) in the last day; the last hour on hover."""
    if not day_reads:
        return '<p class="note" id="reads">No agent recalled another\'s rows in the last day.</p>'
    day = {(r["reader"], r["writer"]): r["rows"] for r in day_reads}
    hour = {(r["reader"], r["writer"]): r["rows"] for r in hour_reads}
    readers, writers = sorted({r for r, _ in day}), sorted({w for _, w in day})
    heads = "".join(f'<th class="writer" scope="col">{escape(w)}</th>' for w in writers)
    body = []
    for reader in readers:
        cells = []
        for writer in writers:
            rows = day.get((reader, writer))
            if reader == writer:
                cells.append('<td class="self"></td>')
            elif rows is None:
                cells.append("<td></td>")
            else:
                hint = (
                    f"{reader} read {rows} of {writer}'s rows in 24 h, {hour.get((reader, writer), 0)} in the last hour"
                )
                cells.append(f'<td class="n" title="{escape(hint)}">{rows}</td>')
        body.append(f'<tr><th scope="row">{escape(reader)}</th>{"".join(cells)}</tr>')
    return (
        '<div class="scroll"><table id="reads"><thead><tr><th>reader \\ writer</th>'
        f"{heads}</tr></thead><tbody>{''.join(body)}</tbody></table></div>"
        "<p class=\"note\">Rows of another agent's that a reader's recalls returned, last 24 h.</p>"
    )


def rejections_tables(stats: dict) -> str:
    """Refusals by code, then the last ones with their reasons, newest first."""
    counts = [[code, int(n)] for code, n in sorted((stats.get("rejections") or {}).items())]
    recent = [
        [
            str(r.get("ts", "")).replace("T", " ")[:19],
            r.get("agent") or r.get("claimed_agent") or "-",  # a name that is none: as claimed, quoted and cut
            r.get("operation", ""),
            r.get("code", ""),
            without_paths(str(r.get("reason", ""))),
        ]
        for r in (stats.get("recent_rejections") or [])[:MAX_REJECTIONS_SHOWN]
    ]
    latest = (
        "<h3>Latest, newest first (UTC)</h3>"
        + table("rejections", ["time", "agent", "operation", "code", "reason"], recent, "", free_text=(4,))
        if recent
        else ""
    )
    return (
        "<h2>Rejections</h2><h3>By code, since the start</h3>"
        + table("rejection-counts", ["code", "count"], counts, "No call was refused since the start.")
        + latest
    )


def duration(seconds: float) -> str:
    """A span as '3 d 4 h', '5 h 2 min' or '42 s'."""
    seconds = int(seconds)
    days, hours, minutes = seconds // 86400, seconds % 86400 // 3600, seconds % 3600 // 60
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    return f"{minutes} min {seconds % 60} s" if minutes else f"{seconds} s"
