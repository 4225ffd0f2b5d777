"""solos_connections: a thread per connection, at most MAX_CONNECTIONS, and the slowest waiting ones make room.

A mixin for ThreadingHTTPServer. A connection is evictable while it waits for
its next request head, sends a body or is sent its answer, and not while it
works on a request. When every slot is taken, a newcomer evicts the slowest
waiting connection and takes its slot; the accept loop never sleeps. The
handler reports each phase (idle, receiving, received, sending, forget); the server builds the 503 answer for a
newcomer nothing can be made room for (`refusal()`). `load()` says how busy
it is: requests being handled now and the most at once, connections open,
newcomers waiting for a slot, refused and evicted (/v1/stats and the
status page show it), and the admission queue's. At a stop, `drain()` shuts
the waiting connections and answers the requests in flight before the
database closes.

`Admission` caps the requests that run at once (`--admit`, about two per core):
the rest wait their turn in a bounded FIFO queue, and a request the queue
cannot hold, or that waited past ADMIT_WAIT_S, gets 503 `busy` naming why.
Imports only solos_errors.
"""

from __future__ import annotations

import http.client
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from http import HTTPStatus
from typing import Any
from urllib.parse import urlsplit

from solos_errors import Busy

# A request's header lines in all: http.server caps each line (64 KiB) and their count (100), not their sum, so
# one head held 6.4 MB in memory, and 128 connections 1.3 GB. nginx's default admits 32 KiB; our own clients
# send under 1 KiB.
MAX_HEAD_BYTES = 64 * 1024
KEEPALIVE_IDLE_S = 30  # a connection idle (or dripping a request head) this long is closed, freeing its thread
MAX_CONNECTIONS = 128  # one thread each; a newcomer past this evicts the slowest waiting connection
# An answer's write is evictable once it has run this long: a written answer leaves at once (the kernel takes it),
# so one still going is stuck behind a client that reads nothing; one just begun may be a write's acknowledgment.
SENDING_GRACE_S = 1.0
SLOT_WAIT_S = 1.0  # how long a newcomer waits for the slot of the connection it evicted
# A stop (SIGTERM, Ctrl-C) waits this long for the requests in flight to be answered: past a write's busy timeout
# (5 s) and its 1 s embedding, under the supervisor's STOP_WAIT_S (20 s) and systemd's TimeoutStopSec (90 s).
DRAIN_S = 10.0
# Requests running at once, by default: the service's Python holds one core (the GIL), and past a few running
# threads each recall costs more CPU and waits at every SQLite call to take the GIL back (docs/load.md: at most 4
# at once kept 16 and 64 clients at 98% and 93% of 4 clients' throughput, against 88% and 72% without).
ADMIT_PER_CORE = 2
# Requests waiting for a place: half the connection slots, so a burst of every connection at once is told at once
# that the service is full rather than queued behind a minute of work; 64 clients on 2 cores fit (60 queued).
ADMIT_QUEUE_MOST = 64
# The longest a request waits for a place before 503: the client's own write timeout (solos_client, 2 s), and the
# as-of calls' wait for theirs; past it the caller has most likely given up, and work done for it is lost.
ADMIT_WAIT_S = 2.0
ADMIT_WAITS_KEPT = 1024  # the most recent admissions' waits, for load()'s p50 and p99
# Writes have a lane of their own, this many places per --admit place. A write spends most of its time waiting,
# off the GIL, for the write lock and the commit of the writes queued before it, and group commit batches only
# the writes that have queued: 4 places cut bench/write_throughput.py's 16 writers from 1,718-1,814 to
# 1,149-1,217 acknowledged writes/s; a lane of 16 gave 1,805-1,843 beside the uncapped tree's 1,824-1,909.
ADMIT_WRITES_PER_PLACE = 4


def default_admit() -> int:
    """Requests running at once unless --admit says otherwise: ADMIT_PER_CORE per core."""
    return ADMIT_PER_CORE * (os.cpu_count() or 1)


class Admission:
    """At most `most` requests run at once; the rest wait their turn, first come first served (0: no cap).

    FIFO, not a semaphore: a semaphore lets a late arrival take a place freed while earlier ones sleep, so
    some requests wait many turns (docs/load.md: p99 3.8x p50 with one). Here a leaving request hands its place
    straight to the oldest waiter, and a newcomer runs at once only while nobody waits.
    """

    def __init__(self, most: int, queue_most: int = ADMIT_QUEUE_MOST, wait_s: float = ADMIT_WAIT_S) -> None:
        self.most, self.queue_most, self.wait_s = most, queue_most, wait_s
        self.lock = threading.Lock()
        self.running = 0
        self.queue: deque[threading.Event] = deque()  # each waiter's turn, oldest first; set = handed a place
        self.waits: deque[float] = deque(maxlen=ADMIT_WAITS_KEPT)  # seconds, every admission (0 for no wait)
        self.counts = {"running_max": 0, "queued_max": 0, "admitted_after_waiting": 0, "queue_wait_s_total": 0.0}
        self.counts.update(busy_queue_full=0, busy_queue_wait=0)

    @contextmanager
    def admitted(self, exempt: bool = False) -> Iterator[None]:
        """Run the body in a place, waiting for one in turn; exempt requests (health, metrics, the page) do not."""
        if exempt or self.most <= 0:
            yield
            return
        self.enter()
        try:
            yield
        finally:
            self.leave()

    def enter(self) -> None:
        """Take a place now, or wait in turn for one; Busy when the queue is full or the wait passes wait_s."""
        with self.lock:
            if self.running < self.most and not self.queue:
                self.running += 1
                self.counts["running_max"] = max(self.counts["running_max"], self.running)
                self.waits.append(0.0)
                return
            if len(self.queue) >= self.queue_most:
                self.counts["busy_queue_full"] += 1
                raise Busy(
                    f"queue full: {len(self.queue)} requests already wait for one of {self.most} places; retry shortly",
                    reason="queue_full",
                )
            turn = threading.Event()
            self.queue.append(turn)
            self.counts["queued_max"] = max(self.counts["queued_max"], len(self.queue))
        started = time.monotonic()
        turn.wait(self.wait_s)
        waited = time.monotonic() - started
        with self.lock:
            self.counts["queue_wait_s_total"] += waited
            if not turn.is_set():  # set only under the lock: not handed a place, and now never will be
                self.queue.remove(turn)
                self.counts["busy_queue_wait"] += 1
                raise Busy(
                    f"queue wait: no place among {self.most} came free within {self.wait_s:g} s; retry shortly",
                    reason="queue_wait",
                )
            self.counts["admitted_after_waiting"] += 1
            self.waits.append(waited)

    def leave(self) -> None:
        """Hand the place straight to the oldest waiter (running stays the same), else give it back."""
        with self.lock:
            if self.queue:
                self.queue.popleft().set()
            else:
                self.running -= 1

    def load(self) -> dict[str, Any]:
        """Places and the queue now, the most since start, the recent waits' p50 and p99, and the 503s."""
        with self.lock:
            waits = sorted(self.waits)
            counts = dict(self.counts, queue_wait_s_total=round(self.counts["queue_wait_s_total"], 3))
            now = {"running": self.running, "running_most": self.most, "queued": len(self.queue)}
        return {
            **now,
            "queue_most": self.queue_most,
            "queue_wait_ms_p50": quantile_ms(waits, 0.5),
            "queue_wait_ms_p99": quantile_ms(waits, 0.99),
            **counts,
        }


def quantile_ms(ordered: list[float], q: float) -> float:
    """The q-quantile of sorted seconds, in milliseconds; 0 for none."""
    return round(ordered[min(int(q * len(ordered)), len(ordered) - 1)] * 1000, 1) if ordered else 0.0


class SlotHandoff:
    """A thread slot passed from an evicted connection's thread straight to the newcomer that evicted it.

    Straight, not through the semaphore: there the next newcomer in the accept loop would take it first,
    and a flood that reconnects as fast as it is evicted would starve everyone else.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.passed = threading.Event()
        self.abandoned = False

    def give(self) -> bool:
        """Pass the slot on; False if the newcomer stopped waiting (the slot then goes back to the pool)."""
        with self.lock:
            if not self.abandoned:
                self.passed.set()
            return not self.abandoned

    def take(self, timeout_s: float) -> bool:
        self.passed.wait(timeout_s)
        with self.lock:
            self.abandoned = not self.passed.is_set()
            return not self.abandoned


class HeadReader:
    """The request's reader while http.server parses its header lines: past MAX_HEAD_BYTES in all it raises the
    HTTPException http.server answers with 431, and closes the connection."""

    def __init__(self, reader: Any) -> None:
        self.reader, self.left = reader, MAX_HEAD_BYTES

    def readline(self, limit: int = -1) -> bytes:
        line = self.reader.readline(limit)
        self.left -= len(line)
        if self.left < 0:
            raise http.client.HTTPException(f"the request's header lines passed {MAX_HEAD_BYTES} bytes in all")
        return line


class BoundedHead:
    """The handler mixin: its header lines are read through a HeadReader."""

    rfile: Any

    path: str

    def parse_request(self) -> bool:
        reader, self.rfile = self.rfile, HeadReader(self.rfile)
        try:
            parsed: bool = super().parse_request()  # type: ignore[misc]  # BaseHTTPRequestHandler's
        finally:
            self.rfile = reader
        if parsed:
            try:
                urlsplit(self.path)
            except ValueError:  # an unclosed IPv6 bracket (http://[::1): every answer splits the target, and raised
                self.path = ""
                self.send_error(HTTPStatus.BAD_REQUEST, "the request target is not a URL")  # type: ignore[attr-defined]
                return False
        return parsed


def http_head(status: int, fields: Mapping[str, str]) -> bytes:
    """A response's status line and header fields: every answer's head, sent in one write with its body."""
    lines = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}", *(f"{name}: {value}" for name, value in fields.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class BoundedConnections:
    """The ThreadingHTTPServer mixin: call bound_connections() in __init__, implement refusal()."""

    on_connection_thread: Callable[[], None] | None = None  # run first in each connection's thread (--pin-threads)

    def bound_connections(self, admit: int = 0) -> None:
        """`admit`: at most this many requests run at once (Admission; 0: no cap)."""
        self.admission, self.write_admission = Admission(admit), Admission(admit * ADMIT_WRITES_PER_PLACE)
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.handoffs: dict[socket.socket, SlotHandoff] = {}  # evicted connection -> the newcomer awaiting its slot
        self.waiting_lock = threading.Lock()
        # evictable connections: [since, body bytes received, has completed a request before]
        self.waiting: dict[socket.socket, list] = {}
        self.unslotted: set[socket.socket] = set()  # event streams: their slot went back at the stream's start
        # What load() shows, under waiting_lock: connections handling a request now (from its body's end
        # to its answer), newcomers waiting for an evicted connection's slot, and counts since start.
        self.handling: set[socket.socket] = set()
        self.counts = {"in_flight_max": 0, "connections": 0, "connections_max": 0, "waiting_for_slot": 0}
        self.counts.update(refused=0, evicted=0)
        self.stopping = False  # drain() began: answers close their connection, a request not yet begun is refused

    def refusal(self) -> bytes:
        raise NotImplementedError

    def load(self) -> dict[str, Any]:
        """Requests being handled now and the most at once since start; connections open and waiting; refusals;
        the admission's places and queue."""
        with self.waiting_lock:
            connections = {"in_flight": len(self.handling), **self.counts, "connection_slots": MAX_CONNECTIONS}
        return {**connections, **self.admission.load(), "writes": self.write_admission.load()}

    def admitted(self, exempt: bool = False, writes: bool = False) -> AbstractContextManager[None]:
        """A place to run the request in, waited for in turn: the writes' lane or everything else's."""
        return (self.write_admission if writes else self.admission).admitted(exempt)

    def working(self, connection: socket.socket) -> None:
        """The connection has a whole request and is being answered: in flight, never evicted. Once drain() began,
        Busy (`stopping`) instead: its connection was shut as it arrived, and nothing of it may run."""
        with self.waiting_lock:
            self.waiting.pop(connection, None)
            self.handling.add(connection)
            self.counts["in_flight_max"] = max(self.counts["in_flight_max"], len(self.handling))
        if self.stopping:
            raise Busy("the service is stopping; retry shortly", reason="stopping")

    def idle(self, connection: socket.socket, served: bool = False) -> None:
        """The connection waits for (or is still receiving) its next request head: evictable.

        `served`: it has completed a request, so it is a client keeping its connection alive for the next.
        """
        with self.waiting_lock:
            self.waiting[connection] = [time.monotonic(), 0, served]
            self.handling.discard(connection)

    def receiving(self, connection: socket.socket) -> None:
        """The connection is sending a body: evictable, the slowest first."""
        with self.waiting_lock:
            served = connection in self.waiting and self.waiting[connection][2]
            self.waiting[connection] = [time.monotonic(), 0, served]

    def sending(self, connection: socket.socket) -> None:
        """The connection's answer is being written: evictable after SENDING_GRACE_S, as a kept-alive idle one,
        the oldest first. A client that reads no answer (a flood of them, or one paused) holds its slot only
        until someone needs it."""
        with self.waiting_lock:
            self.waiting[connection] = [time.monotonic() + SENDING_GRACE_S, 0, True]  # counted from the grace's end

    def received(self, connection: socket.socket, count: int) -> None:
        with self.waiting_lock:
            if connection in self.waiting:
                self.waiting[connection][1] = count

    def unslot(self, connection: socket.socket) -> None:
        """The connection becomes a long-lived stream: its thread slot goes back now, for everyone else."""
        self.slots.release()
        self.unslotted.add(connection)
        with self.waiting_lock:
            self.handling.discard(connection)  # counted among the event streams instead

    def forget(self, connection: socket.socket) -> None:
        """The connection is working on a request (or gone): never evicted."""
        with self.waiting_lock:
            self.waiting.pop(connection, None)
            self.handling.discard(connection)

    def evict(self, older_than_s: float, handoff: SlotHandoff | None = None) -> bool:
        """Shut waiting connections past the deadline; with a handoff, at least one, the slowest, gets it.

        Connections that never completed a request go first (a flood that sends nothing, or drips a
        head); a client that kept its connection alive after a request goes last, so its next request
        finds it open (evicted first, 41 of 82 such reuses were reset). Among equals, the slowest: the fewest
        bytes per second since it began waiting, the oldest first (an idle keep-alive and a body dripping
        a byte a second both rate about zero). A newcomer (a /health probe, an agent's turn) is so never
        starved by sockets that send little or nothing.
        """
        now = time.monotonic()
        with self.waiting_lock:
            doomed = [conn for conn, (since, _, _) in self.waiting.items() if now - since > older_than_s]
            ready = [conn for conn, (since, _, _) in self.waiting.items() if since <= now]  # past a write's grace
            if handoff is not None and not doomed and ready:

                def pace(conn: socket.socket) -> tuple[bool, float, float]:
                    since, got, served = self.waiting[conn]
                    return served, got / max(now - since, 1e-3), since

                doomed = [min(ready, key=pace)]
            for conn in doomed:
                del self.waiting[conn]
            self.counts["evicted"] += len(doomed)
            if handoff is not None and doomed:
                self.handoffs[doomed[0]] = handoff  # before the shutdown: its thread may end at once
        for conn in doomed:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        return bool(doomed)

    def drain(self, within_s: float = DRAIN_S) -> int:
        """Stopping, once the accept loop has ended: shut the waiting connections (nothing of theirs has run) and
        wait up to `within_s` for the requests in flight to be answered; return how many were not.

        Without it the process ended under them: a write committed, and its client saw the connection reset.
        """
        self.stopping = True
        with self.waiting_lock:  # a connection in flight too (its answer being written) is left to finish
            waiting = [conn for conn in self.waiting if conn not in self.handling]
            for conn in waiting:
                del self.waiting[conn]
        for conn in waiting:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        deadline = time.monotonic() + within_s
        while True:
            with self.waiting_lock:
                left = len(self.handling)
            if not left or time.monotonic() >= deadline:
                return left
            time.sleep(0.01)

    def process_request(self, request: Any, client_address: Any) -> None:
        """Start the connection's thread; when every slot is taken, evict the slowest waiting one for it.

        The accept loop never sleeps: the newcomer waits for its victim's slot on its own thread.
        """
        self.evict(KEEPALIVE_IDLE_S)
        handoff = None
        if not self.slots.acquire(blocking=False):
            handoff = SlotHandoff()
            if not self.evict(KEEPALIVE_IDLE_S, handoff):
                self.refuse(request)  # every connection is working: say so at once rather than queue
                return
        thread = threading.Thread(target=self.serve_connection, args=(request, client_address, handoff), daemon=True)
        thread.start()

    def serve_connection(self, request: Any, client_address: Any, handoff: SlotHandoff | None) -> None:
        if self.on_connection_thread is not None:
            self.on_connection_thread()
        if handoff is not None:
            self.count("waiting_for_slot", 1)
            took = handoff.take(SLOT_WAIT_S)
            self.count("waiting_for_slot", -1)
            if not took:
                self.refuse(request)
                return
        self.count("connections", 1)
        try:
            self.process_request_thread(request, client_address)  # type: ignore[attr-defined]  # ThreadingMixIn's
        finally:
            with self.waiting_lock:
                successor = self.handoffs.pop(request, None)
                self.handling.discard(request)
                self.counts["connections"] -= 1
            if request in self.unslotted:  # an event stream: its slot went back when the stream began
                self.unslotted.discard(request)
            elif successor is None or not successor.give():
                self.slots.release()

    def count(self, name: str, amount: int) -> None:
        """Move one of load()'s counts; a count with a _max beside it raises its high mark."""
        with self.waiting_lock:
            self.counts[name] += amount
            if f"{name}_max" in self.counts:
                self.counts[f"{name}_max"] = max(self.counts[f"{name}_max"], self.counts[name])

    def refuse(self, request: socket.socket) -> None:
        """Every slot is busy working: say so at once rather than queue."""
        self.count("refused", 1)
        try:
            request.sendall(self.refusal())
        except OSError:
            pass
        finally:
            self.shutdown_request(request)  # type: ignore[attr-defined]  # ThreadingHTTPServer's
