#!/usr/bin/env python3
"""Where concurrent recalls lose their time: each phase's wall and CPU per recall, at several client counts.

    python3 bench/load_profile.py [--levels 4,16] [--seconds 5] [--rows 5k] [--workers 2]
    HF_HUB_OFFLINE=1 .venv/bin/python bench/load_profile.py --hybrid

The service runs in this process (solos_memory.build_server, as the tests
start it) on a copy of the LoCoMo-shaped database load.py uses; the clients
are load.py's client process. Each phase of a request is wrapped to record
its wall time and the handler thread's own CPU time (time.thread_time):
wall minus CPU is time spent waiting (for the GIL, a lock, SQLite, the
socket). Also counted: new SQLite connections opened (Store.connect) per
recall, and how many requests were in a Store.read at once.

With --workers N the service is `serve --workers N` forked from this
process (the supervisor and its workers inherit the wrapped phases); after
each level every worker writes its phases and samples to a file when told
(SIGUSR1), and the report sums them over the workers.

The instrumented service runs a little slower than the real one; compare
levels with each other, not with load.py's figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

import gen_db
import load
import locomo_shape
from harness import ROOT, machine_note, with_vectors
from locomo_data import DEFAULT_DATA

sys.path.insert(0, str(ROOT))
import solos_connections  # noqa: E402
import solos_cross_encoder  # noqa: E402
import solos_malloc  # noqa: E402
import solos_memory  # noqa: E402
import solos_recall  # noqa: E402
import solos_sqlite  # noqa: E402
import solos_store  # noqa: E402
import solos_workers  # noqa: E402


class Phases:
    """Wall and thread CPU per phase name, summed over every request."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.wall: dict[str, float] = defaultdict(float)
        self.cpu: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.in_read = 0
        self.in_read_hist: dict[int, int] = defaultdict(int)

    def add(self, name: str, wall: float, cpu: float, calls: int = 1) -> None:
        with self.lock:
            self.wall[name] += wall
            self.cpu[name] += cpu
            self.calls[name] += calls

    def taken(self) -> dict:
        """What was recorded since the last reset, as JSON for the bench (a worker's share); then reset."""
        with self.lock:
            found = {"wall": self.wall, "cpu": self.cpu, "calls": self.calls, "in_read_hist": self.in_read_hist}
            self.reset()
        return found

    def merge(self, found: dict) -> None:
        """Add a worker's share (taken())."""
        for name, wall in found["wall"].items():
            self.add(name, wall, found["cpu"][name], found["calls"][name])
        for depth, count in found["in_read_hist"].items():
            self.in_read_hist[int(depth)] += count


PHASES = Phases()
ORDER = [
    "handle_one_request (head, route)",
    "request (route)",
    "read body",
    "waiting for admission",
    "invoke",
    "plan_recall",
    "rank",
    "Store.read",
    "Store.checkout",
    "Store.connect (new connection)",
    "wait for the question's vector",
    "embedder.embed (its own thread)",
    "cross-encoder run",
    "present",
    "Store.write",
    "respond (JSON, write)",
]


def timed(name: str, function):
    """function, recording its wall and thread CPU under name."""

    def wrapper(*args, **kwargs):
        wall_0, cpu_0 = time.perf_counter(), time.thread_time()
        try:
            return function(*args, **kwargs)
        finally:
            PHASES.add(name, time.perf_counter() - wall_0, time.thread_time() - cpu_0)

    return wrapper


def instrument() -> None:
    """Wrap the request's phases; count connections and concurrent reads."""
    handler = solos_memory.MemoryHandler
    # the request line and headers' parsing too (http.server), and the wait for the next request on the socket
    handler.handle_one_request = timed("handle_one_request (head, route)", handler.handle_one_request)
    handler.route = timed("  request (route)", handler.route)
    handler.read_body = timed("    read body", handler.read_body)
    handler.respond = timed("    respond (JSON, write)", handler.respond)
    solos_memory.invoke = timed("    invoke", solos_memory.invoke)
    for name in ("plan_recall", "rank", "present"):
        setattr(solos_recall, name, timed(f"      {name}", getattr(solos_recall, name)))
    session = solos_cross_encoder.Session
    session.logits = timed("        cross-encoder run", session.logits)
    store = solos_store.Store
    store.connect = timed("        Store.connect (new connection)", store.connect)
    store.checkout = timed("        Store.checkout", store.checkout)
    store.write = timed("        Store.write", store.write)
    original_read = store.read

    def read(self, work):
        with PHASES.lock:
            PHASES.in_read += 1
            PHASES.in_read_hist[PHASES.in_read] += 1
        try:
            return original_read(self, work)
        finally:
            with PHASES.lock:
                PHASES.in_read -= 1

    store.read = timed("        Store.read", read)
    start_embedding = solos_memory.Memory.start_embedding

    def embedding(self, text):
        vector = start_embedding(self, text)
        if self.embedder is not None and not getattr(self.embedder.embed, "timed", False):
            self.embedder.embed = timed("        embedder.embed (its own thread)", self.embedder.embed)
            self.embedder.embed.timed = True
        return timed("        wait for the question's vector", vector)

    solos_memory.Memory.start_embedding = embedding


class Sampler:
    """Every SAMPLE_S, the line each handler thread is at (innermost frame): where waiting threads wait."""

    SAMPLE_S = 0.002

    def __init__(self, sampling: bool = True) -> None:
        """sampling False: only a sum of the workers' samples (merge)."""
        self.lines: dict[str, int] = defaultdict(int)
        self.samples = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        if sampling:
            self.thread.start()

    def run(self) -> None:
        handlers = {t.ident for t in threading.enumerate() if t.name.startswith("Thread-")}
        while not self.stop.wait(self.SAMPLE_S):
            for ident, frame in sys._current_frames().items():
                thread = threading._active.get(ident)  # type: ignore[attr-defined]
                if thread is None or not thread.name.startswith("Thread-") or ident in handlers:
                    continue
                code = frame.f_code
                where = f"{Path(code.co_filename).name}:{frame.f_lineno} {code.co_name}"
                if frame.f_back is not None:
                    caller = frame.f_back.f_code
                    where += f" <- {Path(caller.co_filename).name}:{frame.f_back.f_lineno} {caller.co_name}"
                self.lines[where] += 1
                self.samples += 1

    def report(self, top: int = 12) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join()
        print(f"  where handler threads were, {self.samples} samples:")
        for where, count in sorted(self.lines.items(), key=lambda item: -item[1])[:top]:
            print(f"    {count / max(self.samples, 1):5.1%}  {where}")

    def taken(self) -> dict:
        """The samples since the last look, as JSON for the bench (a worker's share); then start afresh."""
        found, self.lines, self.samples = {"lines": self.lines, "samples": self.samples}, defaultdict(int), 0
        return found

    def merge(self, found: dict) -> None:
        for where, count in found["lines"].items():
            self.lines[where] += count
        self.samples += found["samples"]


class ThreadCpu:
    """CPU by thread of this process since the last look (/proc/self/task), named as Python names them; what
    threads that ended in between used (a level's connection threads) is the process's total less the rest."""

    def __init__(self) -> None:
        self.last, self.last_total = self.now()

    @staticmethod
    def now() -> tuple[dict[int, tuple[str, float]], float]:
        tick = os.sysconf("SC_CLK_TCK")
        names = {t.native_id: t.name for t in threading.enumerate()}
        found = {}
        for task in Path("/proc/self/task").iterdir():
            try:
                stat = (task / "stat").read_text()
            except OSError:
                continue
            comm, fields = stat[stat.index("(") + 1 : stat.rindex(")")], stat.rsplit(")", 1)[1].split()
            tid = int(task.name)
            name = names.get(tid, f"native {comm}")
            found[tid] = (group(name), (int(fields[11]) + int(fields[12])) / tick)
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        return found, (int(fields[11]) + int(fields[12])) / tick

    def taken(self) -> dict[str, float]:
        """CPU seconds by thread group since the last look."""
        found, total = self.now()
        used: dict[str, float] = defaultdict(float)
        for tid, (name, cpu) in found.items():
            used[name] += cpu - (self.last[tid][1] if tid in self.last else 0.0)
        used["threads that ended (connections)"] = (total - self.last_total) - sum(used.values())
        self.last, self.last_total = found, total
        return dict(used)


def group(name: str) -> str:
    """A thread's name without its number: connection threads are one group."""
    if "process_request_thread" in name or "serve_connection" in name:
        return "connection threads"
    return name.rstrip("0123456789_-") or name


def report_threads(used: dict[str, float], recalls: int) -> None:
    shown = sorted(((cpu, name) for name, cpu in used.items() if abs(cpu) * 1000 / recalls >= 0.01), reverse=True)
    print("  CPU by thread (ms per recall): " + ", ".join(f"{name} {cpu * 1000 / recalls:.2f}" for cpu, name in shown))


def time_admission() -> None:
    """The service's own admission queue (--admit): each request's wait for a place, as a phase."""
    enter = solos_connections.Admission.enter

    def timed(self, *args, **kwargs):
        wall_0 = time.perf_counter()
        try:
            return enter(self, *args, **kwargs)
        finally:
            PHASES.add("    waiting for admission", time.perf_counter() - wall_0, 0.0)

    solos_connections.Admission.enter = timed  # type: ignore[method-assign]


def report_on_signal(folder: str, sample: bool) -> None:
    """In each worker (wrapping open_server): on SIGUSR1, write this worker's phases and samples since the last
    signal to folder/<pid>.json, for the bench to sum."""
    open_server = solos_memory.open_server

    def opened(*args, **kwargs):
        server = open_server(*args, **kwargs)
        sampler = Sampler() if sample else None
        threads = ThreadCpu()

        def dump(*_) -> None:
            found = {"phases": PHASES.taken(), "samples": sampler.taken() if sampler else None}
            found["threads"] = threads.taken()
            path = Path(folder) / f"{os.getpid()}.json"
            path.with_suffix(".tmp").write_text(json.dumps(found))
            path.with_suffix(".tmp").rename(path)

        signal.signal(signal.SIGUSR1, dump)
        return server

    solos_memory.open_server = opened


def collect(folder: Path, supervisor: int, sampler: Sampler | None, threads: dict[str, float] | None = None) -> int:
    """Tell every worker to write its share, wait for them, sum them into PHASES (and sampler, and CPU by thread
    into threads); the count."""
    workers = [int(pid) for pid in Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text().split()]
    for stale in folder.glob("*.json"):
        stale.unlink()
    PHASES.reset()
    for pid in workers:
        os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + 10
    while len(list(folder.glob("*.json"))) < len(workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    for path in folder.glob("*.json"):
        found = json.loads(path.read_text())
        PHASES.merge(found["phases"])
        if sampler is not None and found["samples"]:
            sampler.merge(found["samples"])
        for name, cpu in found["threads"].items() if threads is not None else ():
            threads[name] = threads.get(name, 0.0) + cpu
    return len(workers)


PERF_EVENTS = "context-switches,cpu-migrations,page-faults"


def perf_stat(supervisor: int) -> subprocess.Popen | None:
    """`perf stat` over the workers (every thread), until perf_counts stops it; None without perf."""
    workers = Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text().split()
    if shutil.which("perf") is None:
        return None
    argv = ["perf", "stat", "-x", ",", "-e", PERF_EVENTS, "-p", ",".join(workers)]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def perf_counts(counting: subprocess.Popen) -> dict[str, float]:
    """What perf stat counted, by event, once it is stopped (SIGINT)."""
    counting.send_signal(signal.SIGINT)
    _, err = counting.communicate(timeout=10)
    found = {}
    for line in err.splitlines():
        fields = line.split(",")
        if len(fields) > 2 and fields[0].replace(".", "").isdigit():
            found[fields[2]] = float(fields[0])
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def report(clients: int, figures: dict) -> None:
    recalls = max(figures["n"], 1)
    print(
        f"{clients} clients: {figures['per_s']:.1f} recalls/s, p50 {figures['p50']:.1f} ms,"
        f" p99 {figures['p99']:.1f} ms,"
        f" service {figures['service_cores']:.2f} cores = {figures['service_cpu_s'] / recalls * 1000:.2f} ms CPU"
        f" per recall   (load {os.getloadavg()[0]:.2f})"
    )
    print(f"  {'phase':<38} {'calls/recall':>12} {'wall ms':>9} {'CPU ms':>8} {'wait ms':>8}   (per recall)")
    for name in sorted(PHASES.wall, key=lambda n: ORDER.index(n.strip()) if n.strip() in ORDER else len(ORDER)):
        wall, cpu = PHASES.wall[name] / recalls * 1000, PHASES.cpu[name] / recalls * 1000
        print(f"  {name:<38} {PHASES.calls[name] / recalls:12.2f} {wall:9.2f} {cpu:8.2f} {wall - cpu:8.2f}")
    hist = PHASES.in_read_hist
    total = sum(hist.values()) or 1
    most = max(hist) if hist else 0
    over = sum(n for depth, n in hist.items() if depth > solos_store.POOL_SIZE) / total
    print(
        f"  Store.read entered with this many in a read at once: most {most}, "
        f"{over:.0%} of entries past POOL_SIZE ({solos_store.POOL_SIZE})"
    )


def profile_workers(config, folder: Path, paths: list[str], mode: str, args: argparse.Namespace) -> int:
    """serve --workers N forked from this process, its workers' phases summed after each level."""
    reports = folder / "reports"
    reports.mkdir()
    report_on_signal(str(reports), args.sample)
    supervisor = os.fork()
    if supervisor == 0:  # the supervisor: serve() forks the workers, which inherit the wrapped phases
        status = 1
        try:
            status = solos_memory.serve(config, [])
        finally:
            os._exit(status)
    try:
        deadline = time.monotonic() + load.WARM_WAIT_S
        while True:  # the supervisor binds after opening the database once
            try:
                socket.create_connection(("127.0.0.1", config.port)).close()
                break
            except ConnectionRefusedError:
                if time.monotonic() > deadline or os.waitpid(supervisor, os.WNOHANG)[0]:
                    raise
                time.sleep(0.05)
        load.warm(config.port, paths, mode, args.workers)
        for clients in (int(n) for n in args.levels.split(",")):
            collect(reports, supervisor, None)  # the warm-up's or the last level's share: dropped
            counting = perf_stat(supervisor) if args.perf else None
            figures = load.level(config.port, supervisor, paths, clients, args)
            counted = perf_counts(counting) if counting else {}
            sampler = Sampler(sampling=False) if args.sample else None
            threads: dict[str, float] = {}
            workers = collect(reports, supervisor, sampler, threads)
            report(clients, figures)
            report_threads(threads, max(figures["n"], 1))
            if counted:
                each = ", ".join(f"{name} {count / max(figures['n'], 1):.2f}" for name, count in counted.items())
                print(f"  the workers' scheduling, per recall (perf stat): {each}")
            print(f"  summed over {workers} workers; by worker {figures['by_worker']}")
            if sampler is not None:
                sampler.report()
    finally:
        os.kill(supervisor, signal.SIGTERM)
        os.waitpid(supervisor, 0)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default="4,16", help="concurrent clients (default: %(default)s)")
    parser.add_argument("--seconds", type=float, default=5.0, help="per level (default: %(default)s)")
    parser.add_argument("--rows", default="5k", help="LoCoMo turns as long facts (default: %(default)s)")
    parser.add_argument("--hybrid", action="store_true", help="with the embedder (default: keyword)")
    parser.add_argument(
        "--admit",
        type=int,
        help="the service's --admit: requests running at once, the rest queued; 0 no cap (default: serve's, 2 per "
        "core; a pinned SQLite worker's one per core it runs on)",
    )
    parser.add_argument("--pool-size", type=int, default=0, help="trial: solos_store.POOL_SIZE (default: as is)")
    parser.add_argument("--sample", action="store_true", help="also sample where threads wait (default: no)")
    parser.add_argument(
        "--perf", action="store_true", help=f"with --workers, perf stat's {PERF_EVENTS} per recall (default: no)"
    )
    parser.add_argument("--workers", type=int, default=1, help="serve --workers N, summed over them (default: 1)")
    parser.add_argument(
        "--pin-threads",
        choices=("off", "on"),
        help="serve's --pin-threads, with --workers: each worker's connection threads on its own core (default: "
        "serve's, on for SQLite workers with a core each)",
    )
    parser.add_argument(
        "--memory-statistics",
        choices=("off", "on"),
        default="off",
        help="SQLite's memory statistics: off as serve sets them (solos_sqlite), or on, as before (default: off)",
    )
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="LoCoMo file (default: %(default)s)")
    args = parser.parse_args()
    args.max_requests = 50_000
    source = locomo_shape.ensure_db(gen_db.parse_size(args.rows), args.data)
    if args.hybrid:
        source = with_vectors(source, budget_s=1800)
        if source is None:
            return 1
    paths = load.recall_paths(locomo_shape.questions(args.data, load.QUESTIONS, 7))
    mode = "hybrid" if args.hybrid else "keyword"
    print(machine_note())
    if args.memory_statistics == "off":  # as serve does, before the service's first connection
        done, reason = solos_sqlite.statistics_off()
        print(f"SQLite memory statistics: {reason}")
        if not done:
            return 1
    else:  # and serve's own call (--workers) finds it made
        solos_sqlite.outcome = (False, "left on: bench/load_profile.py --memory-statistics on")
        print("SQLite memory statistics: left on (--memory-statistics on)")
    print(f"malloc arenas: {solos_malloc.arenas_capped()[1]}")  # as serve caps them, before the service's threads
    instrument()
    time_admission()
    admit = args.admit if args.admit is not None else solos_connections.default_admit()  # one process's, as serve's
    print(f"--admit {admit}: " + (f"at most {admit} requests run at once" if admit else "no cap"))
    if args.pool_size:
        solos_store.POOL_SIZE = args.pool_size
        print(f"trial: POOL_SIZE {args.pool_size}")
    with tempfile.TemporaryDirectory(prefix="solos-load-profile-") as folder:
        db = Path(folder) / "profile.db"
        shutil.copy(source, db)
        config = solos_memory.Config(
            db=str(db),
            port=free_port() if args.workers > 1 else 0,
            log_requests=False,
            model_dir=None if args.hybrid else "off",
            admit=args.admit,
            workers=args.workers,
            pin_threads=None if args.pin_threads is None else args.pin_threads == "on",
        )
        if args.workers > 1:
            settled = solos_workers.settled(config)  # as serve() will settle it in the supervisor
            pinned = ", connection threads pinned (--pin-threads on)" if settled.pin_threads else ""
            each = [solos_workers.places(settled, solos_workers.Worker(n, args.workers, 0, None, "", -1)) for n in
                    range(1, args.workers + 1)]  # fmt: skip
            print(f"{args.workers} workers (serve --workers), each with its own --admit {each}{pinned}")
            return profile_workers(config, Path(folder), paths, mode, args)
        server = solos_memory.build_server(config, [])
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        thread.start()
        try:
            load.warm(server.port, paths, mode)
            for clients in (int(n) for n in args.levels.split(",")):
                PHASES.reset()
                sampler = Sampler() if args.sample else None
                threads = ThreadCpu()
                figures = load.level(server.port, os.getpid(), paths, clients, args)
                report(clients, figures)
                report_threads(threads.taken(), max(figures["n"], 1))
                if sampler is not None:
                    sampler.report()
        finally:
            server.shutdown()
            server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
