"""solos_workers: one process serving, or `serve --workers N`: N processes answering on one port, one database.

Why: one process holds one GIL, so recall under load waits for one core however many the host has
(docs/load.md). With --workers N a supervisor (the process systemd starts) binds the port, forks N workers
and keeps them: a worker that dies is started again, so is one that hangs (its accept loop no longer beats,
`check_beats`), SIGTERM stops them all. The workers never talk to one
another; they share what copies of the service over PostgreSQL share, the database, and reuse that
machinery (solos_copies, the store's `shared_by_copies`): the event hub reads what any worker committed
(streams resume gapless on any worker, by id), a retraction another worker made drops this worker's kept
texts and encoded events before its next recall answers (`EventHub.retracted_since`), and the vector index
reads the vectors other workers committed since its snapshot before it searches (`VectorIndex.catch_up`).
What only a host has, the supervisor provides: the file of stream seats every worker holds (`Seats`: the
per-agent cap and the total are the service's, not each worker's), and beside it every worker's stream filters
and the removed rows that matched them (`Filters`: a filtered stream hears of a removal any worker made). Each
worker reads the tokens file again when it changes (solos_tokens), and embeds its share of the fleet's direct
writes (`Store.embed_share`), and the rows its own writes could not embed in time.

Two ways to share the port, `--worker-socket`: `shared` (one listening socket, inherited: the worker holding
the fewest connections takes the next, counted in memory the supervisor shares with its workers; the default,
see docs/load.md for the measurement) or `reuseport` (SO_REUSEPORT: each worker binds its own, the kernel
spreads connections by a hash of their addresses).

Unless the operator says otherwise (`settled`, `places`), SQLite workers with a core each run pinned, one place a
core: on 2 cores, more recalls a second from 4 clients on in both modes, one client level (docs/load.md, "Pinned by
default").

Imports only the store (its log lines and the database's shown name), and solos_connections' default --admit.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import fcntl
import json
import mmap
import os
import select
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import solos_connections
import solos_malloc
import solos_sqlite
import solos_store
from solos_store import log_event
from solos_validation import number_in, on_off

# ==== Configuration ====

SOCKET_MODES = ("shared", "reuseport")
STOP_WAIT_S = 20.0  # after SIGTERM, how long the workers get to finish their requests before SIGKILL
# A worker that dies within this of its start is restarted after a pause that doubles each time, up to
# RESTART_PAUSE_S[1], so a worker that cannot start (a broken database) is not forked in a tight loop.
QUICK_DEATH_S = 10.0
RESTART_PAUSE_S = (0.5, 30.0)
# A worker that dies quickly this many times within the window is not going to serve: the supervisor stops the
# others and exits 1, so systemd sees the failure (restarts the unit, and past its start limit, OnFailure=)
# instead of a service that retries every 30 s for ever. 5 quick deaths take about 8 s (pauses 0.5 to 4 s).
GIVE_UP_AFTER = (5, 120.0)  # (quick deaths, within seconds)
# A serving worker's accept loop beats at least every half second (socketserver's poll); one silent this long
# hangs (stopped, deadlocked): the supervisor kills it and starts another. Left, it kept taking (SO_REUSEPORT: the
# kernel's hash still sent it about half the newcomers, which waited for ever) or slowing (shared) connections.
STUCK_S = 10.0
PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent dies
# Shared socket: a worker holding more connections than the least busy declines a newcomer (pausing this long each
# time, so its accept loop does not spin) and leaves it to that worker; past TURN_WAIT_S it takes it anyway, so
# a worker that is stuck never stops the others. Free-for-all, a burst of 4 clients landed 3 to 1 in 2 of 5 tries
# and 16 clients 14 to 2 once, and a worker with 3 clients answers each 3x slower (docs/load.md).
TURN_PAUSE_S = 0.001
TURN_WAIT_S = 0.25
TURN_GAP_S = 0.05  # declines further apart than this were for different newcomers


# ==== One process: the serve loop (single, or a worker) ====


def process_cores() -> list[int]:
    """The cores this process may run on (its affinity, not the host's)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


MAX_WORKERS = 64  # each is a process with its own connections (and, hybrid, ~145 MiB of model): 999 forked here


def count(raw: str) -> int:
    """--workers: a number from 1 to MAX_WORKERS, or `auto`, one worker per core this process may run on."""
    if raw.strip().lower() == "auto":
        return len(process_cores())
    try:
        return int(number_in(1, MAX_WORKERS, "SOLOS_MEMORY_WORKERS")(raw))
    except argparse.ArgumentTypeError as error:
        raise argparse.ArgumentTypeError(f"{error}; or auto, one a core") from None


def add_arguments(parser: Any, env_default: Callable[[str, str | None], str | None]) -> None:
    """serve's --workers, --worker-socket and --pin-threads."""
    workers_help = "processes on the port, one database; 1: this process alone; auto: one a core (default: %(default)s)"
    parser.add_argument("--workers", type=count, default=env_default("WORKERS", "1"), help=workers_help)
    parser.add_argument(
        "--worker-socket",
        choices=SOCKET_MODES,
        default=env_default("WORKER_SOCKET", "shared"),
        help="how workers share the port: one inherited socket, or SO_REUSEPORT (default: %(default)s)",
    )
    parser.add_argument(
        "--pin-threads",
        type=on_off,
        metavar="on|off",
        default=env_default("PIN_THREADS", None),  # None: not said, so settled() decides
        help="with --workers, each worker's connection threads on its own share of the cores (default: on for "
        "SQLite workers, at most one a core; else off)",
    )


# ==== Pinned, one place a core: the default for SQLite workers ====


def pinned_by_default(workers: int, db: str, cores: int) -> bool:
    """--pin-threads where the operator said nothing: on for 2 or more workers over SQLite with a core each.

    Pinned, each of 2 SQLite workers answered more at every level in both modes, and one client's hybrid recall
    lost nothing (docs/load.md). Over PostgreSQL a recall waits on the network with its place held, which one
    place a core would serialise; more workers than cores would share a core pinned, which nobody measured."""
    return hasattr(os, "sched_setaffinity") and 2 <= workers <= cores and not solos_store.is_postgres(db)


def settled(config: Any) -> Any:
    """The service's Config with --pin-threads decided: the operator's (flag or SOLOS_MEMORY_PIN_THREADS), else
    pinned_by_default's. --admit is each process's, decided where it is built (places)."""
    if config.pin_threads is not None:
        return config
    pinned = pinned_by_default(config.workers, config.db, len(process_cores()))
    return dataclasses.replace(config, pin_threads=pinned)


def places(config: Any, worker: Worker | None = None) -> int:
    """This process's --admit: the operator's (flag or SOLOS_MEMORY_ADMIT); else, for a SQLite worker with its
    connection threads pinned, one place per core they run on (with a core each, 1: no two recalls of one worker
    take Python's lock in turns); else solos_connections' 2 per core."""
    if config.admit is not None:
        return int(config.admit)
    if worker is not None and config.pin_threads and not solos_store.is_postgres(config.db):
        return len(worker_cores(worker.index, worker.count, process_cores()))
    return solos_connections.default_admit()


def run(server: Any, config: Any, worker: Worker | None = None) -> int:
    """Serve until SIGTERM (systemd's stop) or Ctrl-C, then close the database; say so in the log."""
    signal.signal(signal.SIGINT, signal.default_int_handler)  # serving now: Ctrl-C drains (not the start's exit)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    fields = {
        "host": config.host,
        "port": server.port,
        "db": solos_store.shown(config.db),
        "version": solos_store.__version__,
        "auth": "tokens" if server.tokens else "loopback-trust",
        **server.memory.embedder_state(paths=True),
        "judge": server.memory.judge.state(),  # as /health says it
        "sqlite_memory_statistics": solos_sqlite.state(),
        "malloc_arenas": solos_malloc.state(),
        "pin_threads": "on" if config.pin_threads else "off",
        "admit": server.admission.most,  # this process's places (a worker's own: places())
    }
    if worker is None:
        log_event("listening", **fields)
        notify(f"READY=1\nSTATUS=listening on {config.host}:{server.port}")
    else:
        pinned: dict[str, Any] = {"pin_threads": fields["pin_threads"], "admit": fields["admit"]}
        if config.pin_threads:
            pinned["connection_threads_on_cores"] = sorted(pin_connection_threads(server, worker))
            fields.update(pinned)
        server.memory.serving.update(pinned)  # /health and /v1/stats say them too
        log_event("worker_listening", worker=worker.index, workers=worker.count, pid=os.getpid(), **pinned)
        worker.ready(fields)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        if worker is None:
            notify("STOPPING=1")
        else:
            worker.holding(-1)  # accepting no more: the others' turns no longer wait for this one
            worker.beat(serving=False)  # nor does the supervisor expect its loop to go round
        try:
            unanswered = server.drain()  # the requests in flight answered before the database closes
        except KeyboardInterrupt:  # a second Ctrl-C: the operator wants out now, unanswered or not
            unanswered = len(server.handling)
        # Closing waits at most for a round holding the lock (the busy timeout): cut short, its traceback is all
        # an operator would get. Another Ctrl-C now waits with it.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        server.server_close()
        log_event("stopped", port=server.port, unanswered=unanswered, **({"worker": worker.index} if worker else {}))
        if worker is not None and os.getppid() != worker.supervisor:
            worker.orphaned()
    return 0


def notify(state: str) -> None:
    """Tell systemd the service's state (the unit is Type=notify): READY=1 once the port answers, STOPPING=1 as a
    stop begins; the main process only, a no-op without NOTIFY_SOCKET. `systemctl start` so returns when the
    service answers (a first start builds the embedder's model, 4-10 s), and reports a start that fails."""
    path = os.environ.get("NOTIFY_SOCKET", "")
    if not path.startswith(("/", "@")):
        return
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect("\0" + path[1:] if path.startswith("@") else path)  # @: an abstract socket
            sock.sendall(state.encode())
    except OSError as error:  # systemd then times the start out: say why in the journal
        log_event("warning", message=f"could not tell systemd {state.splitlines()[0]}: {error}")


def worker_cores(index: int, count: int, cores: list[int]) -> set[int]:
    """The cores worker `index` (1..count) runs its connections on: every count-th of the process's, or one
    core, shared round the workers, where there are more workers than cores."""
    if count > len(cores):
        return {cores[(index - 1) % len(cores)]}
    return set(cores[index - 1 :: count])


def pin_connection_threads(server: Any, worker: Worker) -> set[int]:
    """--pin-threads: each connection's thread runs on this worker's cores only, so one worker's handler threads
    hand the GIL to each other on one core, not across two (docs/load.md). The process keeps every core: the
    question's embedding thread is started here, before any connection, so it keeps them too, and the
    embedder's own threads were started with the model."""
    cores = worker_cores(worker.index, worker.count, process_cores())
    pool = server.memory.query_pool
    if pool is not None:
        pool.submit(int).result()  # its one thread, started now with the process's cores

    def pin() -> None:
        with contextlib.suppress(OSError):  # a core taken from the process since: the thread keeps the process's
            os.sched_setaffinity(0, cores)

    server.on_connection_thread = pin
    return cores


# ==== A worker's view of the supervisor ====


@dataclass
class Worker:
    """What a forked worker is given: which it is, the socket (shared) or port (reuseport), the seats file."""

    index: int  # 1..count
    count: int
    port: int
    listener: socket.socket | None  # the supervisor's listening socket (shared), or None: bind with SO_REUSEPORT
    seats_path: str
    ready_fd: int
    supervisor: int = 0  # its pid: a worker whose parent is another has outlived it
    held: Any = None  # every worker's open connections (a memoryview of int64 on shared memory; -1: not serving)
    beats: Any = None  # when each worker's accept loop last went round (time.monotonic(); 0: not serving), shared
    seats: Seats | None = None

    def holding(self, connections: int) -> None:
        """Tell the other workers how many connections this one holds."""
        if self.held is not None:
            self.held[self.index - 1] = connections

    def beat(self, serving: bool = True) -> None:
        """Tell the supervisor this worker's accept loop goes round (or, not serving, that it need not)."""
        if self.beats is not None:
            self.beats[self.index - 1] = time.monotonic() if serving else 0.0

    def my_turn(self) -> bool:
        """Whether this worker should take the next connection: none of the serving workers holds fewer."""
        if self.held is None:
            return True
        serving = [count for count in self.held.tolist() if count >= 0]
        return not serving or self.held[self.index - 1] <= min(serving)

    def ready(self, fields: dict) -> None:
        """Tell the supervisor this worker serves (one line on the pipe: atomic under PIPE_BUF)."""
        line = json.dumps({"worker": self.index, **fields}, default=str)
        if len(line.encode()) >= select.PIPE_BUF:  # one write, whole: the fields the listening line repeats can go
            line = json.dumps({"worker": self.index})
        self.holding(0)
        self.beat()
        with contextlib.suppress(OSError):
            os.write(self.ready_fd, line.encode() + b"\n")
            os.close(self.ready_fd)

    def orphaned(self) -> None:
        """The supervisor died without its clean-up (SIGKILL): the workers, stopping with it, remove the seats
        file and its folder, the last to stop succeeding (under systemd, PrivateTmp= removes them anyway)."""
        remove_shared_files(self.seats_path)

    def describe(self) -> dict:
        """For /health and /v1/stats: how many workers, and which one answered."""
        return {"workers": self.count, "worker": self.index, "worker_pid": os.getpid()}


class WorkerSocket:
    """ThreadingHTTPServer mixin: a worker serves the supervisor's socket, or binds its own with SO_REUSEPORT.

    Set `worker` before the server's __init__ binds."""

    worker: Worker | None = None
    socket: socket.socket
    allow_reuse_port: bool
    declined_since: float | None = None  # when this worker first declined the connection now waiting
    declined_last = 0.0  # when it last declined one
    worker_lock: threading.Lock  # the accept loop's and the handler threads' view of open_connections
    open_connections: set[Any]

    def server_bind(self) -> None:
        worker = self.worker
        self.worker_lock, self.open_connections = threading.Lock(), set()
        if worker is not None and worker.listener is not None:
            self.socket.close()
            # Non-blocking: every idle worker wakes for a new connection and one accepts it; the others'
            # accept fails (BlockingIOError, which socketserver passes over) and they return to select.
            worker.listener.setblocking(False)
            self.socket = worker.listener
            self.server_address = self.socket.getsockname()  # type: ignore[misc]
            self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])
            return
        if worker is not None:
            self.allow_reuse_port = True
        super().server_bind()  # type: ignore[misc]

    def server_activate(self) -> None:
        if self.worker is None or self.worker.listener is None:
            super().server_activate()  # type: ignore[misc]

    def service_actions(self) -> None:
        """Each round of the accept loop (serve_forever): the worker beats (Supervisor.check_beats)."""
        super().service_actions()  # type: ignore[misc]
        if self.worker is not None:
            self.worker.beat()

    def get_request(self) -> tuple[Any, Any]:
        """Accept, on a shared socket only in this worker's turn (Worker.my_turn) or past TURN_WAIT_S of declining;
        an OSError here makes socketserver go back to waiting for the socket."""
        worker = self.worker
        if worker is not None and worker.listener is not None:
            now = time.monotonic()
            if worker.my_turn():
                self.declined_since = None
            else:
                # Declining again soon after the last time: the same newcomer is still waiting. After a gap, the
                # one declined before was taken by another worker, and this is a new one.
                if self.declined_since is None or now - self.declined_last > TURN_GAP_S:
                    self.declined_since = now
                self.declined_last = now
                if now - self.declined_since < TURN_WAIT_S:
                    time.sleep(TURN_PAUSE_S)
                    raise BlockingIOError("another worker holds fewer connections")
        request, address = super().get_request()  # type: ignore[misc]
        if worker is not None:
            self.counted(request, True)
        return request, address

    def shutdown_request(self, request: Any) -> None:
        super().shutdown_request(request)  # type: ignore[misc]
        if self.worker is not None:
            self.counted(request, False)

    def counted(self, request: Any, held: bool) -> None:
        """The connections this worker holds, accepted and not yet shut, published for the others' turns."""
        assert self.worker is not None
        with self.worker_lock:
            (self.open_connections.add if held else self.open_connections.discard)(request)
            self.worker.holding(len(self.open_connections))


# ==== Stream seats: the caps across workers ====


class Seats:
    """Every worker's open event streams, in one file under an exclusive lock: the total cap and the per-agent
    share are decided over all of them (solos_events.choose_victim), as one process decides over its own.

    A stream another worker holds that a newcomer here replaces is moved to `cut` in the file; its worker
    reads that on its event hub's next round, within 50 ms while it holds streams (`cut_for`), and drops it.
    The supervisor removes a dead worker's seats.
    """

    def __init__(self, path: str, worker: int):
        self.path, self.worker = path, worker
        self.changed: tuple[int, int] | None = None  # the file's (mtime_ns, size) when cut_for last read it
        self.filters = Filters(filters_path(path), worker)

    @contextlib.contextmanager
    def locked(self) -> Iterator[dict]:
        """The file's content, written back after the block if it changed; under an exclusive lock."""
        with locked_json(self.path, {"open": [], "cut": [], "serial": 0}) as state:
            yield state

    def take(self, agent: str, decide: Callable[[list[tuple[str, float, Any]], str], Any]) -> tuple[Any, Any]:
        """A seat for a newcomer stream of `agent`: (its seat id, or None if refused; the seat it replaced, if
        any, as (worker, seat id)). `decide(streams, agent)` is one process's rule over (agent, opened, key)."""
        with self.locked() as state:
            streams = [(seat["agent"], seat["opened"], (seat["worker"], seat["id"])) for seat in state["open"]]
            victim = decide(streams, agent)
            if victim == "refuse":
                return None, None
            if victim is not None:
                state["open"] = [s for s in state["open"] if (s["worker"], s["id"]) != victim]
                if victim[0] != self.worker:
                    state["cut"].append(list(victim))
            state["serial"] += 1
            seat = state["serial"]
            state["open"].append({"worker": self.worker, "id": seat, "agent": agent, "opened": time.time()})
            return seat, victim

    def leave(self, seat: int) -> None:
        with self.locked() as state:
            state["open"] = [s for s in state["open"] if (s["worker"], s["id"]) != (self.worker, seat)]

    def cut_for(self) -> list[int]:
        """Seats of this worker another worker's newcomer replaced since the last look (removed from the file)."""
        try:
            status = os.stat(self.path)
        except FileNotFoundError:
            return []
        changed = (status.st_mtime_ns, status.st_size)
        if changed == self.changed:
            return []
        with self.locked() as state:
            mine = [seat for worker, seat in state["cut"] if worker == self.worker]
            state["cut"] = [cut for cut in state["cut"] if cut[0] != self.worker]
        self.changed = None if mine else changed  # our own write moved it: look once more next time
        return mine

    def count(self) -> dict:
        """Streams open on every worker, for /v1/stats."""
        with self.locked() as state:
            return {"open_all_workers": len(state["open"])}

    def vacate(self, worker: int) -> None:
        """The supervisor: a dead worker's seats are free."""
        with self.locked() as state:
            state["open"] = [s for s in state["open"] if s["worker"] != worker]
            state["cut"] = [cut for cut in state["cut"] if cut[0] != worker]
        Filters(filters_path(self.path), worker).vacate()


def filters_path(seats_path: str) -> str:
    return os.path.join(os.path.dirname(seats_path), "filters.json")


def remove_shared_files(seats_path: str) -> None:
    """The seats file, the filters' files and their folder, each if still there (a worker may have gone first)."""
    for path in (seats_path, *Filters.files(filters_path(seats_path))):
        with contextlib.suppress(OSError):
            os.remove(path)
    with contextlib.suppress(OSError):
        os.rmdir(os.path.dirname(seats_path))


@contextlib.contextmanager
def locked_json(path: str, empty: dict) -> Iterator[dict]:
    """A JSON file's content (`empty`'s keys at least), written back after the block if it changed; under an
    exclusive lock. A file cut short (its writer killed mid-write, a full disk) is started afresh, said once:
    left as it was, every later use failed on it."""
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        raw = b""
        while chunk := os.read(descriptor, 1 << 16):
            raw += chunk
        try:
            state = json.loads(raw) if raw.strip() else {}
        except ValueError as error:
            state = None
            log_event("warning", message=f"{path} cannot be read, started afresh: {error}")
        if not isinstance(state, dict):
            state = {}
        for name, value in empty.items():
            state.setdefault(name, value)
        yield state
        data = json.dumps(state).encode()
        if data != raw:  # unchanged, untouched: its mtime stays (Seats.cut_for need not read it again)
            os.lseek(descriptor, 0, os.SEEK_SET)
            os.ftruncate(descriptor, 0)
            written = memoryview(data)
            while written:  # a write may take only part of it
                written = written[os.write(descriptor, written) :]
    finally:
        os.close(descriptor)  # and the lock with it


class Filters:
    """Every worker's stream filters (tags and q) and the removed rows that matched them, in one locked file.

    A removal carries no text, so a filtered stream is sent one only for a row known to match (solos_events
    `note_removal`, matched while the row's text exists, in the removing transaction). The worker removing a row
    is often not the one whose stream decides: it matches the row against every worker's filters and writes
    what matched here before its transaction commits, so the deciding worker finds it when the event comes.
    The matches are appended to a file of their own (a line each, read once a batch of events), so a removal
    does not read and rewrite every match kept (one after a sweep of 10,000 took 170 ms so, in its transaction).
    Kept: each worker's newest FILTERS_KEPT filters (as many as its hub remembers, so no other worker's push out
    a filter its streams still use; a dead worker's go with it), and the newest MATCHES_KEPT matches or all
    written in the last MATCHES_FRESH_S, whichever are more (a sweep removing 10,000 rows at once keeps every
    match while the workers read its events; a stream further behind than both misses the removal, as one
    process forgets past its own bounds). The matches file is cut down to that when it doubles, or once
    MATCHES_FRESH_S after its last cut.
    """

    FILTERS_KEPT = 256
    MATCHES_KEPT = 2_000
    MATCHES_FRESH_S = 120.0

    def __init__(self, path: str, worker: int):
        self.path, self.worker = path, str(worker)  # its filters' key in the file (JSON's keys are strings)
        self.matches_path = self.files(path)[1]

    @staticmethod
    def files(path: str) -> tuple[str, str]:
        """The filters file and its matches' (under the filters file's lock)."""
        return path, path.removesuffix(".json") + "_matched.jsonl"

    def looked(self, work: Callable[[dict], Any]) -> Any:
        """work(the file's content), under its lock; what work changes is written back. A removal never fails for
        it: a file that cannot be read or written (a worker killed while writing it, the folder gone with the
        supervisor) is logged, and work sees none."""
        try:
            with locked_json(self.path, {"filters": {}, "matched": [0, 0, 0.0]}) as state:
                return work(state)
        except (OSError, ValueError, TypeError, AttributeError) as error:
            log_event("warning", message=f"stream filters shared by the workers: {self.path}: {error}")
            return work({"filters": {}, "matched": [0, 0, 0.0], "unreadable": True})

    def register(self, key: tuple, dropped: tuple | None = None) -> None:
        """A filter this worker matches removals against from now on (`dropped`: one its hub no longer does)."""
        found, gone = json.loads(json.dumps([list(key), list(dropped or ())]))

        def add(state: dict) -> None:
            mine = [kept for kept in state["filters"].get(self.worker, []) if kept not in (found, gone)]
            state["filters"][self.worker] = [*mine, found][-self.FILTERS_KEPT :]

        self.looked(add)

    def registered(self) -> list[tuple]:
        """Every worker's filters."""
        return self.looked(
            lambda state: list(
                dict.fromkeys((tuple(tags), q, match) for kept in state["filters"].values() for tags, q, match in kept)
            )
        )

    def vacate(self) -> None:
        """The supervisor: a dead worker's filters are no one's (its replacement registers its own)."""
        self.looked(lambda state: state["filters"].pop(self.worker, None))

    def matched(self, hits: list[tuple[tuple, str, int]]) -> None:
        """Removed rows that matched these filters: (filter, tier, row id)."""
        now = time.time()
        lines = "".join(json.dumps([now, list(key), tier, row_id]) + "\n" for key, tier, row_id in hits).encode()

        def add(state: dict) -> None:
            if state.get("unreadable"):
                return
            count, cut_count, cut_at = state["matched"]  # lines in the file; how many and when at its last cut
            descriptor = os.open(self.matches_path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
            with open(descriptor, "a+b") as file:  # every write appends; the filters' words are the fleet's
                end = file.seek(0, os.SEEK_END)
                if end and (file.seek(end - 1) or file.read(1)) != b"\n":
                    file.write(b"\n")  # the line of a writer killed while writing it ends here, read as none
                file.write(lines)
                count += len(hits)
                doubled = count > 2 * max(self.MATCHES_KEPT, cut_count)
                if doubled or (count > self.MATCHES_KEPT and now - cut_at > self.MATCHES_FRESH_S):
                    file.seek(0)
                    read = [(line, self.read_line(line)) for line in file.read().splitlines(keepends=True)]
                    kept = [line for line, found in read if found]
                    times = [found[0] for _, found in read if found]
                    fresh = next((n for n, at in enumerate(times) if at >= now - self.MATCHES_FRESH_S), len(kept))
                    kept = kept[min(fresh, max(0, len(kept) - self.MATCHES_KEPT)) :]
                    file.truncate(0)
                    file.write(b"".join(kept))
                    count, cut_count, cut_at = len(kept), len(kept), now
            state["matched"] = [count, cut_count, cut_at]

        if hits:
            self.looked(add)

    def matches(self) -> set[str]:
        """Every match kept, each as `entry` names it: read once for a batch of events."""

        def read(state: dict) -> set[str]:
            with contextlib.suppress(FileNotFoundError), open(self.matches_path, "rb") as file:
                return {json.dumps(line[1:]) for line in map(self.read_line, file) if line}
            return set()

        return self.looked(read)

    @staticmethod
    def read_line(line: bytes) -> list | None:
        """A line of the matches file, [time, filter, tier, row id]; None for one cut short."""
        try:
            found = json.loads(line)
        except ValueError:
            return None
        return found if isinstance(found, list) and len(found) == 4 else None

    @staticmethod
    def entry(key: tuple, row: tuple[str, int]) -> str:
        """A filter's match of a removed row as `matches` holds it."""
        return json.dumps([list(key), *row])


# ==== The supervisor ====


@dataclass
class Child:
    """One worker's place: its process now (pid 0 while dead), and when it is started again."""

    index: int
    pid: int = 0
    started: float = 0.0
    pause: float = RESTART_PAUSE_S[0]
    due: float = 0.0  # when a dead one is started again
    restarts: int = 0
    ready: bool = False
    quick_deaths: list[float] = field(default_factory=list)  # when, within GIVE_UP_AFTER's window


@dataclass
class Supervisor:
    """Binds, forks `count` workers, restarts the dead, stops them all on SIGTERM.

    `start(worker)` runs in the child and returns its exit status (it builds the server on the socket and
    serves); the supervisor itself opens no database and starts no thread, so a fork copies no lock held.
    """

    count: int
    host: str
    port: int
    mode: str
    start: Callable[[Worker], int]
    children: dict[int, Child] = field(default_factory=dict)
    stopping: bool = False
    gave_up: str = ""  # why the supervisor stopped the service by itself: a worker that cannot start
    announced: bool = False  # READY=1 sent: every worker answered once

    def bind(self) -> socket.socket:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if self.mode == "reuseport":  # held bound, never listening: it keeps the port for the workers' sockets
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((self.host, self.port))
        if self.mode == "shared":
            sock.listen(128)  # MemoryServer.request_queue_size
        return sock

    def run(self) -> int:
        try:
            self.sock = self.bind()
        except OSError as error:
            raise SystemExit(f"cannot listen on {self.host}:{self.port}: {error.strerror or error}") from None
        self.port = self.sock.getsockname()[1]
        folder = tempfile.mkdtemp(prefix="solos-workers-")  # 0700: the seats file is this service's alone
        self.seats_path = os.path.join(folder, "seats.json")
        # Every worker's open connections, -1 while it is not serving: shared, anonymous memory the forks inherit.
        self.held = memoryview(mmap.mmap(-1, 8 * self.count)).cast("q")
        self.beats = memoryview(mmap.mmap(-1, 8 * self.count)).cast("d")
        for index in range(self.count):
            self.held[index], self.beats[index] = -1, 0.0
        self.ready_read, self.ready_write = os.pipe()
        self.wake_read, self.wake_write = os.pipe()
        os.set_blocking(self.wake_write, False)
        signal.set_wakeup_fd(self.wake_write)
        for number in (signal.SIGTERM, signal.SIGINT):
            signal.signal(number, self.stop)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the loop through the wakeup fd
        pending = b""
        first: dict | None = None
        try:
            for index in range(1, self.count + 1):
                self.children[index] = Child(index)
                self.fork(self.children[index])
            while not self.stopping:
                self.reap()
                if self.stopping:  # a worker that cannot start: no more forks
                    break
                self.check_beats()
                now = time.monotonic()
                for child in self.children.values():
                    if child.pid == 0 and now >= child.due:
                        self.fork(child)
                due = [c.due - now for c in self.children.values() if c.pid == 0]
                readable, _, _ = select.select([self.ready_read, self.wake_read], [], [], max(0.0, min(due, default=1)))
                if self.wake_read in readable:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self.wake_read, 512)
                if self.ready_read in readable:
                    pending += os.read(self.ready_read, 1 << 16)
                    *lines, pending = pending.split(b"\n")
                    for line in lines:
                        found = json.loads(line)
                        self.children[found["worker"]].ready = True
                        first = first or found
                        if self.announced:  # one started again
                            self.say_status()
                    if not self.announced and all(c.ready for c in self.children.values()) and first:
                        self.announced = True
                        fields = {k: v for k, v in first.items() if k != "worker"}
                        log_event(
                            "listening", **{"host": self.host, **fields, "port": self.port, "workers": self.count}
                        )
                        self.say_status("READY=1\n")
        finally:
            notify("STOPPING=1")
            killed = self.stop_all()
            self.sock.close()
            remove_shared_files(self.seats_path)
            said = {"failed": self.gave_up} if self.gave_up else {}
            log_event("stopped", port=self.port, workers=self.count, **said, **({"killed": killed} if killed else {}))
        return 1 if self.gave_up else 0

    def stop(self, *_: Any) -> None:
        self.stopping = True

    def say_status(self, before: str = "") -> None:
        """systemd's STATUS= (`systemctl status`): the port and the workers, and while any is down, which."""
        status = f"STATUS=listening on {self.host}:{self.port}, {self.count} workers"
        down = [str(child.index) for child in self.children.values() if not child.ready]
        if down:
            serving = self.count - len(down)
            status += f"; {serving} serving, worker{'s' * (len(down) > 1)} {', '.join(down)} starting again"
        notify(before + status)

    def fork(self, child: Child) -> None:
        supervisor = os.getpid()
        pid = os.fork()
        if pid == 0:  # the worker
            status = 1
            try:
                signal.set_wakeup_fd(-1)
                for number in (signal.SIGTERM, signal.SIGCHLD):
                    signal.signal(number, signal.SIG_DFL)
                # Ctrl-C reaches the whole process group: each worker stops as one process does (KeyboardInterrupt:
                # it drains its requests in flight), not ended by the signal under a write it has not answered.
                signal.signal(signal.SIGINT, signal.default_int_handler)
                follow_parent(supervisor)
                os.close(self.ready_read)
                os.close(self.wake_read)
                os.close(self.wake_write)
                listener = self.sock if self.mode == "shared" else None
                if listener is None:
                    self.sock.close()
                worker = Worker(
                    child.index, self.count, self.port, listener, self.seats_path, self.ready_write, supervisor
                )
                worker.held, worker.beats = self.held, self.beats
                status = self.start(worker)
            except SystemExit as error:
                log_event("worker_failed", worker=child.index, reason=str(error.code))
                status = error.code if isinstance(error.code, int) else 1
            except KeyboardInterrupt:  # Ctrl-C before it served: the supervisor stops too, nothing failed
                status = 0
            except BaseException as error:
                log_event("worker_failed", worker=child.index, reason=f"{type(error).__name__}: {error}")
            finally:
                os._exit(status)
        child.pid, child.started, child.ready = pid, time.monotonic(), False
        log_event("worker_started", worker=child.index, pid=pid, restarts=child.restarts)

    def reap(self) -> None:
        """Every worker that exited: logged, its seats freed, started again after its pause."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            child = next((c for c in self.children.values() if c.pid == pid), None)
            if child is None:
                continue
            now = time.monotonic()
            lived = now - child.started
            quick = lived < QUICK_DEATH_S
            if quick:
                deaths, window = GIVE_UP_AFTER
                child.quick_deaths = [t for t in child.quick_deaths if now - t < window] + [now]
                if len(child.quick_deaths) >= deaths and not self.stopping:
                    self.gave_up = f"worker {child.index} died within {QUICK_DEATH_S:g} s of its start {deaths} times"
                    log_event("workers_failed", worker=child.index, reason=self.gave_up)
                    self.stopping = True
            child.due = time.monotonic() + (child.pause if quick else 0.0)
            child.pause = min(child.pause * 2, RESTART_PAUSE_S[1]) if quick else RESTART_PAUSE_S[0]
            child.pid, child.ready, child.restarts = 0, False, child.restarts + 1
            self.held[child.index - 1] = -1  # not serving: the others' turns no longer wait for it
            self.beats[child.index - 1] = 0.0
            Seats(self.seats_path, child.index).vacate(child.index)
            log_event(
                "worker_exited",
                worker=child.index,
                pid=pid,
                status=os.waitstatus_to_exitcode(status),
                seconds=round(lived, 1),
                restart_in_s=round(child.due - time.monotonic(), 1),
            )
            if self.announced and not self.stopping:
                self.say_status()

    def check_beats(self) -> None:
        """A serving worker whose accept loop has not gone round for STUCK_S hangs: logged, killed, started again
        by reap. Its clients see their connections reset, as a dead worker's do: a write it had not answered is
        reported failed, never answered late."""
        now = time.monotonic()
        for child in self.children.values():
            beat = self.beats[child.index - 1]
            if child.pid and beat and now - beat > STUCK_S:
                self.beats[child.index - 1] = 0.0  # once: reap starts it again
                log_event("worker_stuck", worker=child.index, pid=child.pid, silent_s=round(now - beat, 1))
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.pid, signal.SIGKILL)

    def stop_all(self) -> list[int]:
        """SIGTERM every worker, wait STOP_WAIT_S for them, SIGKILL the rest; return those killed (their indexes:
        their requests in flight were cut, unanswered)."""
        live = {c.pid for c in self.children.values() if c.pid}
        index = {c.pid: c.index for c in self.children.values() if c.pid}
        for pid in live:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_WAIT_S
        while live and time.monotonic() < deadline:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return []
            if pid:
                live.discard(pid)
            else:
                time.sleep(0.05)
        for pid in live:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, 0)
        return sorted(index[pid] for pid in live)


def follow_parent(supervisor: int) -> None:
    """A worker gets SIGTERM when the supervisor dies, even by SIGKILL (Linux's PR_SET_PDEATHSIG), so no worker
    keeps serving the port with nobody to restart or stop it; elsewhere systemd's stop still reaches them."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != supervisor:  # it died before the line above
        os.kill(os.getpid(), signal.SIGTERM)


def supervise(count: int, host: str, port: int, mode: str, start: Callable[[Worker], int]) -> int:
    """Run `count` workers on one port until SIGTERM; see Supervisor."""
    return Supervisor(count, host, port, mode, start).run()
