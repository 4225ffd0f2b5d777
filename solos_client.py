#!/usr/bin/env python3
"""solos_client: a bounded, stdlib-only client for the solos-memory service.

For A2A agents, scripts and the Hermes provider (solos_hermes.py). It imports
nothing but the standard library and nothing of the service, so it runs on a
bare python3 and is copied as is into a Hermes plugin folder.

    from solos_client import Client, turn_context, record_turn
    memory = Client.from_env(best_effort=True)          # SOLOS_MEMORY_URL, _AGENT, _TOKEN, _TOKEN_FILE
    context = turn_context(memory, incoming_text)        # turn start: top-3 shared recall, prompt-ready
    record_turn(memory, incoming_text, reply, turn_id=message_id)   # turn end: queued, one episodic row

As a command (also `python3 solos-memory.pyz client ...`), printing JSON:

    python3 solos_client.py --agent sol recall "when do backups run"
    python3 solos_client.py --agent sol remember "Backups run at 02:00 UTC" --topic ops
    python3 solos_client.py --agent sol event deploy "Deployed gateway v2" --idempotency-key gw-v2
    python3 solos_client.py install-hermes --hermes-home ~/.hermes

Exit status: 0 done, 2 bad usage, 3 the service refused the call (4xx: the
error JSON names the field), 4 the service is unavailable (down, timed out,
5xx, or an answer that is not the service's JSON). With --best-effort it is
0 whenever the arguments parse, with an empty result on failure.

Every call is bounded: a connect timeout, then one total deadline for the
whole call (retry included), enforced by a watchdog that shuts the socket, so
a server that accepts and never answers, or trickles bytes, costs at most the
deadline. Idempotent calls (recall, remember, an event with an
idempotency_key) are retried at most once, only for a failure that is not
the service's refusal, and only inside the same deadline, never before the
answer's Retry-After. A call that finds the service unavailable opens a
circuit breaker: for the next 15 s (`breaker_cooldown`) every call fails at
once, then one call tries again. So a hung service costs one deadline per
cooldown, not one per call. A 503 with a Retry-After (busy: 1 s) opens it for
that long instead, and a call whose deadline outlasts the wait waits it out.

record_turn does not wait: it queues the write for one background thread
(64 queued at most; a full queue drops the turn and counts it in
`client.background.counts`), which is flushed for at most 2 s at exit.

Settings (a flag beats the environment, which beats the default):
  --url         SOLOS_MEMORY_URL         http://127.0.0.1:8437
  --agent       SOLOS_MEMORY_AGENT       (none: every call must name one)
  --token       SOLOS_MEMORY_TOKEN       (none: loopback trust)
  --token-file  SOLOS_MEMORY_TOKEN_FILE  (none); the token is the file's first line
"""

from __future__ import annotations

import argparse
import atexit
import hashlib
import http.client
import json
import logging
import os
import queue
import socket
import sys
import threading
import time
import unicodedata
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

# solos_store.__version__, repeated: this file is copied alone (to Hermes, to agents) and never imports the
# service, so it cannot read it from there; tests/test_release.py fails when the two differ.
__version__ = "0.3.0"

# ==== Configuration ====

DEFAULT_URL = "http://127.0.0.1:8437"
# Loopback connects take well under a millisecond; a quarter second means the
# host is gone or its accept queue is full, and waiting longer will not help.
CONNECT_TIMEOUT_S = 0.25
# Recall sits on an agent's turn: a p99 recall is a few ms on loopback
# (bench/recall_latency.py), so 0.8 s is generous yet still well under a second.
RECALL_TIMEOUT_S = 0.8
# Writes happen off the turn (Hermes's worker, an A2A agent after replying);
# a busy database answers 503 after --busy-timeout-ms (5 s), so 2 s gives up first.
WRITE_TIMEOUT_S = 2.0
# The most a caller may give one call: past it, no bound at all (inf once crashed the socket's timeout).
MAX_TIMEOUT_S = 3600.0
RETRY_PAUSE_S = 0.05  # a refused connect retried at once meets the same restart
# After a call finds the service unavailable, calls fail at once for this long; then one tries.
# A restart takes a few seconds; a hung service should cost a turn once, not every turn.
BREAKER_COOLDOWN_S = 15.0
# record_turn's background queue: minutes of turns behind a dead service; past that, drop and count.
WRITE_QUEUE_SIZE = 64
EXIT_FLUSH_S = 2.0  # at exit, queued writes get this long (one write's deadline), then are dropped with a log line
# The service's own cap on a request body (MAX_BODY_BYTES in solos_memory.py);
# the largest recall answer (100 rows of 16 KiB) fits well under 4 MiB.
MAX_ANSWER_BYTES = 4 * 1024 * 1024
ENV_PREFIX = "SOLOS_MEMORY_"
# Each call's path and method, as the service's operation table has them
# (tests/test_client.py checks them against solos_memory.OPERATIONS).
ROUTES = {
    "recall": ("GET", "/v1/recall"),
    "write_long": ("POST", "/v1/long"),
    "write_episodic": ("POST", "/v1/episodic"),
    "forget": ("DELETE", "/v1/memory"),
    "read_notices": ("GET", "/v1/notices"),
    "ack_notices": ("POST", "/v1/notices/ack"),
}
# What the service answers a write (WRITE_OUTPUT in solos_memory.py): its tier (forget names the one asked
# for) and the statuses it gives; tests/test_client.py checks them against the operation table.
WRITE_ANSWERS = {
    "write_long": ("long", frozenset({"created", "updated", "unchanged"})),
    "write_episodic": ("episodic", frozenset({"created", "unchanged"})),
    "forget": (None, frozenset({"forgotten"})),
}
A2A_RECALL_K = 3  # the fleet spec's turn-start recall: top 3, shared scope
# Rows less likely than this to answer stay out of a turn's prompt (turn_context, and so the Hermes prefetch):
# solos_rank.RELEVANCE_FLOOR, the judge's floor (bench/judge_fit.py: the highest that keeps 0.8 of the answers on
# both the fleet's facts and LoCoMo's chats); the service's API keeps every match unless asked.
TURN_MIN_RELEVANCE = 0.08
TURN_REASON_CHARS = 160  # of a degraded recall's reason, in a turn's prompt
A2A_EVENT_TYPE = "a2a_turn"
SUMMARY_CHARS = 4_096  # write_episodic's summary maxLength
DETAILS_CHARS = 16_384  # write_episodic's details maxLength

UNSENDABLE = "it holds a space, a control character or a non-ASCII one, which an HTTP header cannot carry"
UNSENDABLE_TOKEN = (
    f"the token: {UNSENDABLE}; check SOLOS_MEMORY_TOKEN or the token file (Client(token=...)) against what "
    "`solos-memory token` printed"
)
NO_AGENT = (
    "no agent: pass --agent NAME or set SOLOS_MEMORY_AGENT (Client(agent=...)); "
    "it must be registered in the service (solos-memory agents add NAME)"
)

LOG = logging.getLogger("solos_client")


# ==== Errors ====


class SolosError(Exception):
    """Base for what a call can raise; `status` is the HTTP status when there was one."""

    status: int | None = None
    code = "error"
    field: str | None = None

    def as_dict(self) -> dict:
        body: dict[str, Any] = {"code": self.code, "message": str(self)}
        if self.status is not None:
            body["status"] = self.status
        if self.field:
            body["field"] = self.field
        return {"error": body}


class Unavailable(SolosError):
    """No usable answer: refused, reset, timed out, 5xx, or not the service's JSON. Worth retrying later."""

    code = "unavailable"

    def __init__(self, message: str, status: int | None = None, retry_after: float | None = None):
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after  # the service's Retry-After, seconds: it said when to come back


class UsageError(SolosError):
    """The call cannot be made as configured (no agent and no token); nothing was sent."""

    code = "usage"


class Rejected(SolosError):
    """The service refused the call (4xx); the message and field are the service's own."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None):
        super().__init__(message)
        self.status, self.code, self.field = status, code, field


# ==== Client ====


def header_safe(token: str) -> bool:
    """Whether an HTTP header can carry the token: visible ASCII only. Else http.client refuses the header with a
    message that quotes it, and that message would reach logs and error text."""
    return all("!" <= char <= "~" for char in token)


def read_token_file(path: str) -> str:
    """The first line of a token file; an empty file is an error, not anonymous access."""
    token = Path(path).expanduser().read_text(encoding="utf-8-sig").strip().splitlines()  # -sig: Notepad's BOM
    if not token or not token[0].strip():
        raise ValueError(f"token file {path} is empty")
    return token[0].strip()


def empty_result(operation: str, error: SolosError) -> dict:
    """What best-effort mode returns for a failed call: no rows, and why."""
    empty = {"recall": {"results": [], "count": 0}, "read_notices": {"notices": [], "count": 0}}
    result: dict[str, Any] = empty.get(operation, {"status": None})
    return {**result, **error.as_dict()}


class Client:
    """Calls to one solos-memory service as one agent; see the module docstring for the timeouts."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        agent: str | None = None,
        token: str | None = None,
        *,
        connect_timeout: float = CONNECT_TIMEOUT_S,
        recall_timeout: float = RECALL_TIMEOUT_S,
        write_timeout: float = WRITE_TIMEOUT_S,
        best_effort: bool = False,
        breaker_cooldown: float = BREAKER_COOLDOWN_S,
        write_queue_size: int = WRITE_QUEUE_SIZE,
    ):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"url must be http://host[:port] or https://..., got {url!r}")
        self.url = url.rstrip("/")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.base_path = parts.path.rstrip("/")
        self.connection_class = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        self.agent = agent
        self.token = str(token).strip() if token else token  # a CRLF .env's "\r": the header unsendable
        self.connect_timeout = connect_timeout
        self.recall_timeout = recall_timeout
        self.write_timeout = write_timeout
        self.best_effort = best_effort
        self.breaker = Breaker(breaker_cooldown)
        self.background = Background(write_queue_size)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Client:
        """A client from SOLOS_MEMORY_URL, _AGENT, _TOKEN or _TOKEN_FILE; keyword arguments win."""
        env = os.environ if environ is None else environ
        settings: dict[str, Any] = {
            "url": env.get(ENV_PREFIX + "URL") or DEFAULT_URL,
            "agent": env.get(ENV_PREFIX + "AGENT") or None,
            "token": env.get(ENV_PREFIX + "TOKEN") or None,
        }
        # A token_file argument (the --token-file flag) beats the environment's token, as every flag does:
        # otherwise a shell exporting another agent's token would make the call as that agent.
        token_file = overrides.pop("token_file", None)
        if token_file and not overrides.get("token"):
            settings["token"] = read_token_file(token_file)
        elif not settings["token"] and env.get(ENV_PREFIX + "TOKEN_FILE"):
            settings["token"] = read_token_file(env[ENV_PREFIX + "TOKEN_FILE"])
        settings.update({key: value for key, value in overrides.items() if value is not None})
        return cls(**settings)

    # -- the calls -------------------------------------------------------------

    def recall(
        self,
        q: str = "",
        *,
        agent: str | None = None,
        k: int = 5,
        scope: str = "shared",
        tiers: list[str] | None = None,
        min_relevance: float | None = None,
        tags: list[str] | None = None,
        timeout: float | None = None,
    ) -> dict:
        """Recall rows for q; each row says who wrote it and whether it is foreign to the caller.

        min_relevance: leave out rows less likely to be relevant (None: the service's default floor);
        tags: only rows carrying any of them."""
        query: dict[str, Any] = {"agent": self.agent_for(agent), "q": q, "k": k, "scope": scope}
        if tiers:
            query["tiers"] = ",".join(tiers)
        if tags:
            query["tags"] = ",".join(tags)
        if min_relevance is not None:
            query["min_relevance"] = min_relevance
        return self.call("recall", query=query, timeout=timeout or self.recall_timeout, idempotent=True)

    def remember(
        self,
        fact: str,
        *,
        agent: str | None = None,
        topic: str | None = None,
        source: str | None = None,
        confidence: float | None = None,
        tags: list[str] | None = None,
        timeout: float | None = None,
    ) -> dict:
        """Write a long-term fact. Keyed by its text, so a retry updates the one row: retried once."""
        body = drop_none(
            {
                "agent": self.agent_for(agent),
                "fact": fact,
                "topic": topic,
                "source": source,
                "confidence": confidence,
                "tags": tags,
            }
        )
        return self.call("write_long", body=body, timeout=timeout or self.write_timeout, idempotent=True)

    def event(
        self,
        event_type: str,
        summary: str,
        *,
        agent: str | None = None,
        details: str | None = None,
        outcome: str | None = None,
        duration_s: float | None = None,
        idempotency_key: str | None = None,
        timeout: float | None = None,
    ) -> dict:
        """Append an episodic event; retried once only when it carries an idempotency_key."""
        body = drop_none(
            {
                "agent": self.agent_for(agent),
                "event_type": event_type,
                "summary": summary,
                "details": details,
                "outcome": outcome,
                "duration_s": duration_s,
                "idempotency_key": idempotency_key,
            }
        )
        return self.call(
            "write_episodic", body=body, timeout=timeout or self.write_timeout, idempotent=bool(idempotency_key)
        )

    def forget(self, tier: str, row_id: int, *, agent: str | None = None, timeout: float | None = None) -> dict:
        """Forget one of the agent's own rows by id; a retry after a lost answer gets the same answer again
        (`forgotten`, the same retraction), so a retry is safe."""
        query = {"agent": self.agent_for(agent), "tier": tier, "id": row_id}
        return self.call("forget", query=query, timeout=timeout or self.write_timeout, idempotent=True)

    def notices(self, *, agent: str | None = None, timeout: float | None = None) -> dict:
        """Open retraction notices: rows this agent was delivered that were since forgotten or replaced."""
        query = {"agent": self.agent_for(agent)}
        return self.call("read_notices", query=query, timeout=timeout or self.recall_timeout, idempotent=True)

    def ack_notices(self, ids: list[int], *, agent: str | None = None, timeout: float | None = None) -> dict:
        """Acknowledge notices by id, so they are not returned again."""
        body = drop_none({"agent": self.agent_for(agent), "ids": list(ids)})
        return self.call("ack_notices", body=body, timeout=timeout or self.write_timeout, idempotent=True)

    def agent_for(self, agent: str | None) -> str | None:
        """The agent a call names; None only with a token, which the service binds to its agent."""
        return agent or self.agent

    # -- one bounded call ------------------------------------------------------

    def call(
        self, operation: str, *, query: dict | None = None, body: dict | None = None, timeout: float, idempotent: bool
    ) -> dict:
        """Run one operation within `timeout` seconds; in best-effort mode, failures return empty_result.

        A timeout that bounds nothing (not above 0, past MAX_TIMEOUT_S, nan) is the caller's ValueError, raised
        even in best-effort mode: like record_turn's TypeError, it is a mistake in the code, not an outage."""
        check_timeout(timeout)
        try:
            return self.call_or_raise(operation, query=query, body=body, timeout=timeout, idempotent=idempotent)
        except SolosError as error:
            if not self.best_effort:
                raise
            LOG.warning(
                "solos_client: %s as %s failed: %s: %s; carrying on without memory",
                operation,
                (body or query or {}).get("agent"),
                error.code,
                error,
            )
            return empty_result(operation, error)
        except Exception as error:  # best effort means a bug in here must not cost the agent its turn either
            if not self.best_effort:
                raise
            LOG.warning("solos_client: %s failed unexpectedly (%r); carrying on without memory", operation, error)
            return empty_result(operation, Unavailable(f"client error: {error!r}"))

    def call_or_raise(
        self, operation: str, *, query: dict | None, body: dict | None, timeout: float, idempotent: bool
    ) -> dict:
        """One attempt, and for an idempotent call one retry if the first was Unavailable and time remains."""
        if not (query or body or {}).get("agent") and not self.token:
            raise UsageError(NO_AGENT)
        if self.token and not header_safe(self.token):
            raise UsageError(UNSENDABLE_TOKEN)
        deadline = time.monotonic() + timeout
        self.breaker.check(timeout)
        method, path = ROUTES[operation]
        target = (
            self.base_path
            + path
            + ("?" + urlencode({k: v for k, v in query.items() if v is not None}) if query else "")
        )
        payload = json.dumps(body, ensure_ascii=False).encode() if body is not None else None
        try:
            answer = self.attempt(operation, method, target, payload, deadline)
        except Unavailable as first:
            pause = max(RETRY_PAUSE_S, first.retry_after or 0.0)  # never back before the service said to come
            if not idempotent or deadline - time.monotonic() <= pause + 0.01:
                self.breaker.failed(first)
                raise
            time.sleep(pause)
            try:
                answer = self.attempt(operation, method, target, payload, deadline)
            except Unavailable as second:
                self.breaker.failed(second)
                retried = f"{second} (after one retry; first: {first})"
                raise Unavailable(retried, second.status, second.retry_after) from second
        except Rejected:
            self.breaker.succeeded()  # the service answered
            raise
        self.breaker.succeeded()
        return answer

    def submit(self, what: str, job: Callable[[], Any]) -> bool:
        """Queue a write for the background thread; False if the queue was full (the write is dropped, counted)."""
        return self.background.submit(what, job)

    def attempt(self, operation: str, method: str, target: str, payload: bytes | None, deadline: float) -> dict:
        """One request and its checked answer."""
        status, data, retry_after = self.exchange(method, target, payload, deadline)
        try:
            answer = parse_answer(status, data)
        except Unavailable as error:
            error.retry_after = retry_after
            raise
        if operation == "recall":
            check_recall(answer)
        elif operation == "read_notices":
            check_notices(answer, data, status)
        elif operation == "ack_notices":
            if not isinstance(answer.get("acked"), int):
                raise Unavailable(f"acknowledgement lacks its count: {snippet(data)}", status)
        else:
            check_write(operation, answer, data, status)
        return answer

    def exchange(
        self, method: str, target: str, payload: bytes | None, deadline: float
    ) -> tuple[int, bytes, float | None]:
        """Send one request and read the answer, all before `deadline` (a monotonic time): (status, body, the
        answer's Retry-After in seconds or None)."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise Unavailable("no time left for the call")
        headers = {"Accept": "application/json", "Connection": "close"}
        if payload is not None:
            headers["Content-Type"] = "application/json"
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        conn = self.connection_class(self.host, self.port, timeout=min(self.connect_timeout, remaining))
        # Socket timeouts bound each recv, not the call: a server that trickles a
        # byte at a time would never trip them. The watchdog shuts the socket at
        # the deadline, which wakes whatever read is blocked.
        watchdog = threading.Timer(remaining, abort, (conn,))
        watchdog.daemon = True
        watchdog.start()
        try:
            conn.connect()
            conn.sock.settimeout(max(deadline - time.monotonic(), 0.001))
            conn.request(method, target, body=payload, headers=headers)
            response = conn.getresponse()
            data = response.read(MAX_ANSWER_BYTES + 1)
        except (OSError, http.client.HTTPException, ValueError) as error:
            late = time.monotonic() >= deadline
            raise Unavailable(f"{self.url}: {'timed out' if late else describe(error)}") from error
        finally:
            watchdog.cancel()
            conn.close()
        if time.monotonic() > deadline:
            raise Unavailable(f"{self.url}: timed out")
        if len(data) > MAX_ANSWER_BYTES:
            raise Unavailable(f"answer is over {MAX_ANSWER_BYTES} bytes", response.status)
        return response.status, data, retry_after_s(response.getheader("Retry-After"))


def retry_after_s(value: str | None) -> float | None:
    """A Retry-After of delay-seconds (what the service sends); None for none, or an HTTP date."""
    return float(value) if value and value.strip().isdigit() else None


class Breaker:
    """Stops calling a service that just failed: for `cooldown` seconds calls fail at once, then one call tries.

    A failure that came with the service's Retry-After (503 busy: 1 s) opens it for that long instead (at most
    the cooldown): the service said when to come back, and a turn's write queued behind a busy recall must not
    be lost for 15 s. A call whose deadline outlasts that wait waits it out."""

    def __init__(self, cooldown: float):
        self.cooldown = cooldown
        self.lock = threading.Lock()
        self.open_until = 0.0
        self.told = False  # open for the service's own Retry-After
        self.failures = 0
        self.last_error = ""

    def check(self, budget: float) -> None:
        """Raise Unavailable while open (unless told when, and `budget` seconds outlast it: then wait); once the
        cooldown is over, let this one call through and hold the rest."""
        with self.lock:
            if not self.failures:
                return
            now = time.monotonic()
            wait = self.open_until - now
            if self.told and 0 < wait and wait + RETRY_PAUSE_S < budget:
                pass  # waited out below, outside the lock
            elif now < self.open_until:
                raise Unavailable(
                    f"not called: the service failed {self.failures}x, last: {self.last_error}; "
                    f"next try in {self.open_until - now:.1f} s"
                )
            else:
                self.open_until = now + self.cooldown  # this call is the try; concurrent ones wait it out
                self.told = False
                return
        time.sleep(wait)

    def failed(self, error: Exception) -> None:
        told = getattr(error, "retry_after", None)
        with self.lock:
            self.failures += 1
            self.last_error = str(error)[:200]
            self.told = told is not None
            self.open_until = time.monotonic() + (self.cooldown if told is None else min(told, self.cooldown))

    def succeeded(self) -> None:
        with self.lock:
            self.failures = 0


class Background:
    """One daemon thread running queued writes in order; a full queue drops the write and counts it."""

    def __init__(self, size: int = WRITE_QUEUE_SIZE):
        self.jobs: queue.Queue = queue.Queue(maxsize=size)
        self.counts = {"queued": 0, "written": 0, "failed": 0, "dropped": 0}
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None

    def submit(self, what: str, job: Callable[[], Any]) -> bool:
        with self.lock:
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self.run, name="solos-client-writes", daemon=True)
                self.thread.start()
                atexit.register(self.flush_at_exit)
            try:
                self.jobs.put_nowait((what, job))
            except queue.Full:
                self.counts["dropped"] += 1
                LOG.warning("solos_client: write queue full (%d); dropped a %s", self.jobs.maxsize, what)
                return False
            self.counts["queued"] += 1
            return True

    def run(self) -> None:
        while True:
            what, job = self.jobs.get()
            try:
                answer = job()
                failed = isinstance(answer, dict) and "error" in answer  # best-effort mode's empty result
            except Exception as error:
                failed = True
                LOG.warning("solos_client: queued %s not written: %s", what, error)
            finally:
                with self.lock:
                    self.counts["failed" if failed else "written"] += 1
                self.jobs.task_done()

    def flush(self, timeout: float) -> bool:
        """Wait until every queued write is done, for at most `timeout` seconds; True if they all are."""
        deadline = time.monotonic() + timeout
        with self.jobs.all_tasks_done:
            while self.jobs.unfinished_tasks:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self.jobs.all_tasks_done.wait(remaining)
        return True

    def flush_at_exit(self) -> None:
        if not self.flush(EXIT_FLUSH_S):
            LOG.warning(
                "solos_client: %d queued writes not written at exit (waited %s s)",
                self.jobs.unfinished_tasks,
                EXIT_FLUSH_S,
            )


def abort(conn: http.client.HTTPConnection) -> None:
    """Shut a connection's socket from the watchdog thread; a blocked read returns at once."""
    sock = conn.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already closed: the call finished as the deadline came


def check_timeout(timeout: float) -> float:
    """A call's total seconds, checked: above 0 and at most MAX_TIMEOUT_S (nan fails both)."""
    if not 0 < timeout <= MAX_TIMEOUT_S:
        raise ValueError(f"timeout must be seconds above 0 and at most {MAX_TIMEOUT_S:g}, got {timeout!r}")
    return timeout


def describe(error: BaseException) -> str:
    """A short reason for a transport failure."""
    if isinstance(error, ConnectionRefusedError):
        return "connection refused"
    if isinstance(error, TimeoutError):
        return "timed out"
    return f"{type(error).__name__}: {error}".rstrip(": ")


def snippet(data: bytes) -> str:
    """The start of an unexpected answer, for a log line."""
    return repr(data[:80]) + ("…" if len(data) > 80 else "")


def parse_answer(status: int, data: bytes) -> dict:
    """The answer's JSON object; a 4xx becomes Rejected, anything else unusable becomes Unavailable."""
    try:
        answer = json.loads(data)
    except RecursionError:  # nested past the stack: no status of it can be trusted, 4xx or not
        raise Unavailable(f"answer nested too deep to read: {snippet(data)}", status) from None
    except (ValueError, UnicodeDecodeError):
        answer = None
    if 400 <= status < 500:
        error = answer.get("error") if isinstance(answer, dict) else None
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            field = error.get("field")
            raise Rejected(
                status,
                str(error.get("code") or "rejected"),
                error["message"],
                field if isinstance(field, str) else None,
            )
        raise Rejected(status, "rejected", f"HTTP {status}: {snippet(data)}")
    if not 200 <= status < 300:
        raise Unavailable(f"HTTP {status}: {snippet(data)}", status)
    if not isinstance(answer, dict):
        raise Unavailable(f"answer is not a JSON object: {snippet(data)}", status)
    return answer


def check_recall(answer: dict) -> None:
    """A recall answer must hold a list of rows, each with its text and writer."""
    rows = answer.get("results")
    if not isinstance(rows, list) or not all(
        isinstance(row, dict) and isinstance(row.get("text"), str) and isinstance(row.get("agent"), str) for row in rows
    ):
        raise Unavailable(f"recall answer without a list of rows: {describe_rows(rows)}")


def check_notices(answer: dict, data: bytes, status: int) -> None:
    """A notices answer must hold a list of the service's notices, each with what format_retractions shows:
    else a proxy's JSON would raise from turn_context, through best-effort mode, and break the agent's turn."""
    notices = answer.get("notices")
    if not isinstance(notices, list) or not all(is_notice(notice) for notice in notices):
        raise Unavailable(f"notices answer is not the service's list of notices: {snippet(data)}", status)


def is_notice(notice: Any) -> bool:
    def whole(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    return (
        isinstance(notice, dict)
        and whole(notice.get("id"))
        and whole(notice.get("row_id"))
        and all(isinstance(notice.get(key), str) for key in ("kind", "writer", "tier", "at"))
        and (notice["kind"] == "forgotten" or whole(notice.get("new_id")))
    )


def check_write(operation: str, answer: dict, data: bytes, status: int) -> None:
    """A write counts as done only on the service's own answer: its tier, the row's id and a status it gives.

    Anything else that answers JSON (a proxy's or another service's `{"status": "ok"}`) is Unavailable, so
    nothing is taken as committed that the service never wrote (the Hermes archive was once lost so).
    """
    tier, statuses = WRITE_ANSWERS[operation]
    row_id = answer.get("id")
    if (
        answer.get("status") not in statuses
        or (tier is not None and answer.get("tier") != tier)
        or not isinstance(answer.get("agent"), str)
        or not isinstance(row_id, int)
        or isinstance(row_id, bool)
        or row_id < 1
    ):
        raise Unavailable(f"not the service's answer to {operation}: {snippet(data)}", status)


def describe_rows(rows: Any) -> str:
    """What a recall answer held instead of rows, briefly (never the whole, possibly hostile, value)."""
    return f"results is {type(rows).__name__}" + (f" of {len(rows)}" if isinstance(rows, list) else "")


def drop_none(fields: dict) -> dict:
    return {key: value for key, value in fields.items() if value is not None}


# ==== A2A turn pattern ====


def format_recall(answer: dict, heading: str = "Shared memory") -> str:
    """Rows as prompt lines naming each writer, with `foreign` on rows another agent wrote; "" for none.

    Every field shown is one line (prompt_text): a writer's name holding a
    newline cannot start a forged line of its own.
    """
    rows = answer.get("results") or []
    if not rows:
        return ""
    lines = [f"{heading} (most relevant first; 'foreign' rows were written by another agent):"]
    for row in rows:
        writer = prompt_text(row["agent"])
        label = f"{writer}, foreign" if row.get("foreign") else f"{writer}, own"
        tier = prompt_text(row["tier"]) if isinstance(row.get("tier"), str) else "?"
        lines.append(f"- [{label}; {tier}] {prompt_text(row['text'])}")
    return "\n".join(lines)


def prompt_text(value: str) -> str:
    """The text on one line: control characters, line and paragraph separators and runs of spaces become one space."""
    return " ".join("".join(" " if unicodedata.category(ch) in ("Cc", "Zl", "Zp") else ch for ch in value).split())


def format_retractions(answer: dict) -> str:
    """Notices as prompt lines: which rows the agent relied on were forgotten or replaced; "" for none."""
    notices = answer.get("notices") or []
    if not notices:
        return ""
    lines = ["Facts you relied on were retracted (do not rely on them any more; recall again if you need them):"]
    for notice in notices:
        what = "forgotten" if notice["kind"] == "forgotten" else f"replaced by a newer version (id {notice['new_id']})"
        writer, tier = prompt_text(str(notice["writer"])), prompt_text(str(notice["tier"]))
        lines.append(f"- {tier} row {int(notice['row_id'])} by {writer}: {what} at {prompt_text(str(notice['at']))}")
    return "\n".join(lines)


def retraction_context(client: Client, *, agent: str | None = None) -> str:
    """Open notices as prompt lines, acknowledged once read ("" for none; a failed ack shows them again).

    The acknowledgement is a write, queued for the client's background thread as record_turn's is: on the
    turn's path, a service slow to take it held the turn for a write's 2 s deadline."""
    answer = client.notices(agent=agent)
    text = format_retractions(answer)
    if text:
        ids = [n["id"] for n in answer["notices"]]
        client.submit("notices acknowledgement", lambda: client.ack_notices(ids, agent=agent))
    return text


def turn_context(
    client: Client,
    message: str,
    *,
    agent: str | None = None,
    k: int = A2A_RECALL_K,
    min_relevance: float = TURN_MIN_RELEVANCE,
    notices: bool = True,
) -> str:
    """Turn start: the agent's open retraction notices (retraction_context: shown once, then acknowledged), then
    the top-k shared rows at or above the relevance floor for the incoming message, formatted for the prompt
    ("" if neither: nothing relevant is an honest empty context; a failed recall of a best-effort client is
    one line saying so, and why). notices=False leaves the notices open."""
    retracted = retraction_context(client, agent=agent) if notices else ""
    answer = client.recall(message, agent=agent, k=k, scope="shared", min_relevance=min_relevance)
    if isinstance(answer.get("error"), dict):  # best effort's empty result: say so, not "" as if nothing matched
        recalled = not_recalled(answer["error"])
    else:
        recalled = format_recall(floor_cleared(answer, min_relevance), heading=turn_heading(answer))
    return "\n\n".join(part for part in (retracted, recalled) if part)


def not_recalled(error: dict) -> str:
    """The prompt line for a turn whose recall failed: an outage or a refusal is not an empty memory."""
    reason = prompt_text(f"{error.get('code')}: {error.get('message')}")[:TURN_REASON_CHARS]
    return f"Shared memory could not be recalled this turn ({reason}): the fleet may know more than is shown here."


def floor_cleared(answer: dict, min_relevance: float) -> dict:
    """The answer with only the rows known to clear the floor. A row without a relevance (the reranker failed,
    or the question had no words to rank by) was never judged, and the service says it could not apply the
    floor: such a row is not known to answer, so it stays out of the prompt."""
    if min_relevance <= 0:
        return answer
    return {**answer, "results": [row for row in answer.get("results") or [] if row.get("relevance") is not None]}


def turn_heading(answer: dict) -> str:
    """The prompt's heading for recalled rows; it says when recall ran degraded, and why, so that the model
    weighs the rows knowing it (e.g. keyword-only: a paraphrase of the question may have been missed)."""
    if not answer.get("degraded"):
        return "Shared memory"
    reason = prompt_text(str(answer.get("degraded_reason") or "no reason given"))
    return f"Shared memory, recalled degraded ({reason[:TURN_REASON_CHARS]})"


def record_turn(client: Client, message: str, reply: str, *, turn_id: str, **fields: Any) -> dict:
    """Turn end: queue write_turn (same arguments) for the client's background thread; never waits.

    The arguments are checked here, not in the thread: a wrong one (e.g. the old `duration_s`) raises
    TypeError at the call, where it would have lost every turn without a word.
    Returns {"status": "queued"}, or with the queue full {"status": None, "error": ...} (dropped, counted).
    """
    event = turn_event(client, message, reply, turn_id=turn_id, **fields)
    if client.submit("turn record", lambda: client.event(**event)):
        return {"status": "queued"}
    return {
        "status": None,
        "error": {"code": "dropped", "message": "the write queue is full; the turn is not recorded"},
    }


def write_turn(client: Client, message: str, reply: str, *, turn_id: str, **fields: Any) -> dict:
    """One episodic row for the turn, keyed by turn_id, so a redelivered turn writes it once (`unchanged`).

    turn_id is the A2A message or task id. Everything written is the turn's
    own (no timing measured per delivery): a redelivery brings the same
    content. A retry that brings a different reply meets the first row's key:
    the service answers 409 and the first record stands. `fields` are turn_event's.
    """
    return client.event(**turn_event(client, message, reply, turn_id=turn_id, **fields))


def turn_event(
    client: Client,
    message: str,
    reply: str,
    *,
    turn_id: str,
    agent: str | None = None,
    outcome: str = "success",
    event_type: str = A2A_EVENT_TYPE,
) -> dict:
    """Client.event's arguments for a turn; TypeError for an argument that is not a string."""
    for name, value in (
        ("message", message),
        ("reply", reply),
        ("turn_id", turn_id),
        ("outcome", outcome),
        ("event_type", event_type),
    ):
        if not isinstance(value, str):
            raise TypeError(f"{name} must be a string, got {type(value).__name__}")
    who = client.agent_for(agent) or ""
    key = "turn-" + hashlib.sha256(f"{who}\0{turn_id}".encode()).hexdigest()[:40]
    summary = " ".join(message.split())[:SUMMARY_CHARS] or "(empty message)"
    return {
        "event_type": event_type,
        "summary": summary,
        "agent": agent,
        "details": reply[:DETAILS_CHARS],
        "outcome": outcome,
        "idempotency_key": key,
    }


# ==== Hermes provider install ====

HERMES_PLUGIN_NAME = "solos"
HERMES_PLUGIN_YAML = """\
name: solos
description: "solos-memory: the fleet's shared, attributed memory (recall before a turn, the turn recorded after)"
version: "{version}"
"""


def module_source(name: str) -> str:
    """A module's source beside this one: a file in a checkout, or an entry of the same .pyz."""
    beside = Path(__file__).with_name(f"{name}.py")
    if beside.is_file():
        return beside.read_text(encoding="utf-8")
    get_source = getattr(globals().get("__loader__"), "get_source", None)  # zipimport's, inside the .pyz
    source = get_source(name) if get_source else None
    if not source:
        raise FileNotFoundError(f"{name}.py is not beside {__file__}")
    return source


def install_hermes(hermes_home: str, *, create: bool = False) -> Path:
    """Write the provider into HERMES_HOME/plugins/solos/: solos_hermes.py as __init__.py, this client beside it.

    A missing HERMES_HOME is a FileNotFoundError unless `create`: a mistyped path must not "work".
    """
    home = Path(hermes_home).expanduser()
    if not home.is_dir() and not create:
        raise FileNotFoundError(f"no Hermes home at {home} (run Hermes once, or pass --create to make it)")
    target = home / "plugins" / HERMES_PLUGIN_NAME
    target.mkdir(parents=True, exist_ok=True)
    files = {
        "__init__.py": module_source("solos_hermes"),
        "solos_client.py": module_source("solos_client"),
        "plugin.yaml": HERMES_PLUGIN_YAML.format(version=__version__),
    }
    for name, text in files.items():
        temporary = target / f".{name}.tmp"
        temporary.write_text(text, encoding="utf-8")
        temporary.replace(target / name)
    return target


def hermes_agent(hermes_home: str, environ: Mapping[str, str]) -> tuple[str, str]:
    """(agent, where it comes from) as solos_hermes would pick it: plugins.solos.agent, SOLOS_MEMORY_AGENT, profile."""
    home = Path(hermes_home).expanduser()
    configured = configured_agent(home / "config.yaml")
    if configured:
        return configured, f"plugins.solos.agent in {home / 'config.yaml'}"
    if environ.get(ENV_PREFIX + "AGENT"):
        return environ[ENV_PREFIX + "AGENT"], ENV_PREFIX + "AGENT"
    # Hermes's get_active_profile_name: ~/.hermes is "default" (the provider says "hermes"),
    # ~/.hermes/profiles/NAME is NAME, any other folder "custom".
    if home.parent.name == "profiles":
        return home.name, "the profile's name"
    if home.resolve() == (Path.home() / ".hermes").resolve():
        return "hermes", "the default profile"
    return "custom", "Hermes's name for a profile outside ~/.hermes"


def configured_agent(config: Path) -> str | None:
    """plugins: solos: agent: from a config.yaml in block style (as `hermes config set` writes it); no YAML parser."""
    try:
        lines = config.read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    path: list[tuple[int, str]] = []
    for line in lines:
        if not line.strip() or line.lstrip().startswith("#") or ":" not in line:
            continue
        indent = len(line) - len(line.lstrip())
        key, _, value = line.strip().partition(":")
        while path and path[-1][0] >= indent:
            path.pop()
        if [k for _, k in path] == ["plugins", HERMES_PLUGIN_NAME] and key == "agent" and value.strip():
            return value.strip().strip("'\"")
        path.append((indent, key))
    return None


def check_agent_known(client: Client, agent: str) -> str | None:
    """A warning when the service does not know the agent (or cannot say); None when it does."""
    try:
        client.recall("", agent=agent, k=1)
    except Rejected as error:
        if error.status == 422:
            return f"the service does not know agent {agent!r}: every call will get 422 until `agents add {agent}`"
        return f"could not check agent {agent!r}: {error}"
    except SolosError as error:
        return f"could not check agent {agent!r} at {client.url}: {error}"
    return None


# ==== CLI ====

EXIT_OK, EXIT_USAGE, EXIT_REJECTED, EXIT_UNAVAILABLE = 0, 2, 3, 4


def seconds(text: str) -> float:
    """--timeout's value: argparse names the flag in its error."""
    try:
        return check_timeout(float(text))
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error) if "timeout" in str(error) else f"not a number: {text!r}") from None


def split_list(text: str) -> list[str]:
    """A comma list flag's items; none is an error (argparse names the flag), never "no filter": a script's
    `--tags "$TAG"` with TAG unset must not get every row as if filtered."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"needs at least one item, comma-separated, got {text!r}")
    return items


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    env = os.environ
    parser = argparse.ArgumentParser(prog="solos_client", description="Call solos-memory; prints JSON.")
    parser.add_argument("--version", action="version", version=f"solos_client {__version__}")
    parser.add_argument(
        "--url",
        default=env.get(ENV_PREFIX + "URL") or DEFAULT_URL,
        help="the service (default: %(default)s, or SOLOS_MEMORY_URL)",
    )
    parser.add_argument(
        "--agent",
        default=env.get(ENV_PREFIX + "AGENT"),
        help="the calling agent (default: SOLOS_MEMORY_AGENT, else none)",
    )
    parser.add_argument(
        "--token-file",
        default=None,
        help="file holding this agent's bearer token (default: SOLOS_MEMORY_TOKEN_FILE, "
        "or the token in SOLOS_MEMORY_TOKEN, else none)",
    )
    parser.add_argument(
        "--timeout",
        type=seconds,
        default=None,
        help=f"total seconds for the call, above 0 and at most {MAX_TIMEOUT_S:g} "
        f"(default: {RECALL_TIMEOUT_S} recall, {WRITE_TIMEOUT_S} writes)",
    )
    parser.add_argument(
        "--best-effort",
        action="store_true",
        help="never fail: log one line and print an empty result (default: fail with exit 3/4)",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    recall = commands.add_parser("recall", help="recall rows for a question")
    recall.add_argument("q", nargs="*", help="the question, in plain words (default: empty, most recent)")
    recall.add_argument("--k", type=int, default=5, help="how many rows (default: %(default)s)")
    recall.add_argument("--scope", default="shared", help="own, shared or shared_except_self (default: %(default)s)")
    recall.add_argument(
        "--tiers", type=split_list, default=None, help="comma list, e.g. long,short (default: long,short)"
    )
    recall.add_argument("--tags", type=split_list, default=None, help="only rows carrying any (default: all)")
    recall.add_argument(
        "--min-relevance",
        type=float,
        default=None,
        help=f"leave out rows less likely to answer, 0-1; the turn helpers use {TURN_MIN_RELEVANCE} "
        "(default: the service's)",
    )

    remember = commands.add_parser("remember", help="write a long-term fact")
    remember.add_argument("fact", help="the fact, one statement")
    remember.add_argument("--topic", default=None, help="what it is about (default: none)")
    remember.add_argument("--source", default=None, help="where it came from (default: none)")
    remember.add_argument("--confidence", type=float, default=None, help="0-1 (default: none)")
    remember.add_argument("--tags", type=split_list, default=None, help="comma list (default: none)")

    event = commands.add_parser("event", help="append an episodic event")
    event.add_argument("event_type", help="kind of event, e.g. deploy")
    event.add_argument("summary", help="what happened")
    event.add_argument("--details", default=None, help="more detail (default: none)")
    event.add_argument("--outcome", default=None, help="how it ended (default: none)")
    event.add_argument("--duration-s", type=float, default=None, help="how long it took (default: none)")
    event.add_argument(
        "--idempotency-key", default=None, help="same key, same event, one row; also allows one retry (default: none)"
    )

    install = commands.add_parser("install-hermes", help="install the Hermes memory provider into HERMES_HOME")
    install.add_argument(
        "--hermes-home",
        default=env.get("HERMES_HOME") or "~/.hermes",
        help="the Hermes profile's home (default: %(default)s, or HERMES_HOME)",
    )
    install.add_argument(
        "--create", action="store_true", help="create the Hermes home if it is missing (default: refuse)"
    )
    return parser.parse_args(argv)


def run_install_hermes(args: argparse.Namespace) -> int:
    """install-hermes: install, say which agent the provider will be, warn if the service does not know it."""
    try:
        target = install_hermes(args.hermes_home, create=args.create)
    except FileNotFoundError as error:
        print(json.dumps(UsageError(str(error)).as_dict()), file=sys.stderr)
        return EXIT_USAGE
    except OSError as error:  # the home, or its plugins/, is a file; a folder it may not write
        problem = UsageError(f"cannot install the provider into {Path(args.hermes_home).expanduser()}: {error}")
        print(json.dumps(problem.as_dict()), file=sys.stderr)
        return EXIT_USAGE
    agent, source = hermes_agent(args.hermes_home, os.environ)
    report: dict[str, Any] = {
        "installed": str(target),
        "agent": agent,
        "agent_from": source,
        "select_with": "hermes config set memory.provider solos",
    }
    try:
        warning = check_agent_known(Client.from_env(url=args.url, token_file=args.token_file), agent)
    except (ValueError, OSError) as error:
        warning = f"could not check agent {agent!r}: {error}"
    if warning:
        report["warning"] = warning
        print(f"warning: {warning}", file=sys.stderr)
    print(json.dumps(report))
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (see the module docstring)."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
    if args.command == "install-hermes":
        return run_install_hermes(args)
    try:
        client = Client.from_env(
            url=args.url, agent=args.agent, token_file=args.token_file, best_effort=args.best_effort
        )
    except (ValueError, OSError) as error:
        print(json.dumps({"error": {"code": "usage", "message": str(error)}}), file=sys.stderr)
        return EXIT_USAGE
    if not client.agent and not client.token:  # a usage error even with --best-effort: nothing could ever work
        print(json.dumps(UsageError(NO_AGENT).as_dict()), file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.command == "recall":
            result = client.recall(
                " ".join(args.q),
                k=args.k,
                scope=args.scope,
                tiers=args.tiers,
                tags=args.tags,
                min_relevance=args.min_relevance,
                timeout=args.timeout,
            )
        elif args.command == "remember":
            result = client.remember(
                args.fact,
                topic=args.topic,
                source=args.source,
                confidence=args.confidence,
                tags=args.tags,
                timeout=args.timeout,
            )
        else:
            result = client.event(
                args.event_type,
                args.summary,
                details=args.details,
                outcome=args.outcome,
                duration_s=args.duration_s,
                idempotency_key=args.idempotency_key,
                timeout=args.timeout,
            )
    except UsageError as error:
        print(json.dumps(error.as_dict()), file=sys.stderr)
        return EXIT_USAGE
    except SolosError as error:
        print(json.dumps(error.as_dict()), file=sys.stderr)
        return EXIT_REJECTED if isinstance(error, Rejected) else EXIT_UNAVAILABLE
    print(json.dumps(result))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
