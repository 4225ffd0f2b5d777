#!/usr/bin/env python3
"""Recall under load: recalls/s, p50 and p99 at 1, 4, 16 and 64 concurrent clients, this tree beside another.

    python3 bench/load.py [--base main] [--rows 5k] [--levels 1,4,16,64] [--seconds 5] [--rounds 1] [--modes keyword]
                          [--workers 1,2] [--worker-socket shared,reuseport] [--variant a2="--admit 2"] [--hog 1]
    HF_HUB_OFFLINE=1 .venv/bin/python bench/load.py --modes keyword,hybrid

Why: a fleet's turns come in bursts, and recall throughput fell from 4 to
16 clients instead of levelling off. The data: LoCoMo's turns
as long facts (locomo_shape.py; 5k rows, `--rows 100k` for the larger one, `--rows 5k,100k` both),
its real questions, k=5, tiers long. Hybrid runs on a copy whose every row has
a vector (harness.with_vectors, cached) with the service's default model dir;
it needs the embedder's packages, so run it with .venv/bin/python.

Both trees serve copies of one database at once, loopback only; for each
level the base, then this tree, take the same load, so whatever else loads
the machine loads both alike. `--base` is a git revision (its tree is
`git archive`d into a temporary folder) or a checkout's folder; `--base none`
measures this tree alone.

The clients are one separate process (this file, `--client`): a selector
loop over one kept-alive socket per client sending prebuilt requests, no
threads and no JSON parsing, so the clients cost the two shared cores as
little as they can. Each level prints what the client process used (CPU ms
per recall and cores) beside the service's own CPU (from /proc), so a reader
can see when the service, not the clients, holds the cores. A level stops
after `--seconds` or `--max-requests`, whichever comes first; a client
process that does not report within its deadline is killed. `--rounds N`
sweeps every level N times and pools each level's runs: the bars compare
levels measured a minute apart, and on a shared machine the share the
service gets drifts within a minute; pooled rounds give every level the
same spread of that drift.

`--workers 1,2` serves this tree once per count (`serve --workers N`, named
`this`, `w2`, ...; with several `--worker-socket` modes, `w2-shared`, ...),
each beside the base; a row then says how the requests spread over the
workers (from each answer's X-Memory-Worker), and the service's CPU is the
supervisor's and its workers'.

`--variant NAME=ARGS` (repeatable) serves this tree once more with those
serve arguments added, e.g. `--variant a2="--admit 2"` or
`--variant w2="--workers 2"`: settings measured side by side, in turn.
`--serve-args ARGS` gives every service, the base too, those arguments
first: one setting, e.g. `--serve-args "--workers 2 --pin-threads on
--admit 1"`, measured on this tree beside the tree before.

`--hog N` runs N busy processes beside the services while their levels are
measured: the agents' own work on the host, on demand, the same for every
tree (pinned workers against unpinned when a core is taken).

`/health` at each level, on this tree, is the transport's ceiling: the most
requests per second this server answers when the operation costs nothing.
Asserts nothing; prints the acceptance criteria beside the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlencode

import gen_db
import locomo_shape
from harness import ROOT, Client, Process, base_tree, machine_note, percentiles, with_vectors
from locomo_data import DEFAULT_DATA

K = 5  # as the acceptance criteria measure it
QUESTIONS = 200  # real LoCoMo questions, cycled by every client from its own offset
# Recalls per worker before the first level: every question once, so each worker has logged the deliveries of
# its answers (once per reader, row and clock hour: solos_provenance.WINDOW_S) before any level is timed. With
# 40, a worker's first levels wrote what later levels skip: 0.2-0.4 delivery writes a recall, and with 2 workers
# across processes (SQLite's busy handler sleeps) up to 11 ms of a hybrid recall's wall at 64 clients.
WARMUP = QUESTIONS
WARM_WAIT_S = 120  # how long warm() tries to reach every worker
CLIENT_GRACE_S = 30  # past --seconds, when a client process that has not reported is killed
HOG_MOST_S = 900  # a --hog process stops by itself after this, whatever happens to the bench


# ==== The client process ====


def run_clients(port: int, paths: list[str], clients: int, seconds: float, limit: int, service_pid: int) -> dict:
    """`clients` kept-alive connections, each sending its next request as its answer arrives.

    Returns latencies, status counts, answers without the expected marker, and the CPU this process
    and the service used over the timed window.
    """
    selector = selectors.DefaultSelector()
    requests = [
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: application/json\r\n\r\n".encode() for path in paths
    ]
    state = []
    for n in range(clients):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        entry = {"sock": sock, "next": n * 7 % len(requests), "buf": bytearray(), "sent": 0.0}
        state.append(entry)
        selector.register(sock, selectors.EVENT_READ, entry)
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    by_worker: dict[str, int] = {}
    marker_missing = 0
    marker = os.environ.get("LOAD_MARKER", "").encode()

    def send(entry: dict) -> None:
        request = requests[entry["next"] % len(requests)]
        entry["next"] += 1
        entry["sent"] = time.perf_counter()
        entry["sock"].sendall(request)  # small: fits the socket buffer at once

    service_cpu_0 = service_cpu(service_pid)
    cpu_0, wall_0 = time.process_time(), time.perf_counter()
    deadline = wall_0 + seconds
    for entry in state:
        send(entry)
    open_count = clients
    while open_count:
        for key, _ in selector.select(timeout=1.0):
            entry = key.data
            chunk = entry["sock"].recv(65536)
            if not chunk:
                raise RuntimeError("the service closed a kept-alive connection")
            buf = entry["buf"]
            buf += chunk
            head_end = buf.find(b"\r\n\r\n")
            if head_end < 0:
                continue
            head = bytes(buf[:head_end]).decode("latin-1")
            length = next(
                int(line.split(":", 1)[1]) for line in head.split("\r\n") if line.lower().startswith("content-length:")
            )
            if len(buf) < head_end + 4 + length:
                continue
            finished = time.perf_counter()
            body = bytes(buf[head_end + 4 : head_end + 4 + length])
            del buf[: head_end + 4 + length]
            status = head.split(" ", 2)[1]
            statuses[status] = statuses.get(status, 0) + 1
            worker = next(
                (line[16:].strip() for line in head.split("\r\n") if line[:16].lower() == "x-memory-worker:"), ""
            )
            by_worker[worker] = by_worker.get(worker, 0) + 1
            if marker and marker not in body:
                marker_missing += 1
            latencies.append(finished - entry["sent"])
            if finished < deadline and len(latencies) < limit:
                send(entry)
            else:
                selector.unregister(entry["sock"])
                entry["sock"].close()
                open_count -= 1
    wall = time.perf_counter() - wall_0
    cpu = time.process_time() - cpu_0
    return {
        "latencies": latencies,
        "statuses": statuses,
        "by_worker": by_worker,
        "marker_missing": marker_missing,
        "wall_s": wall,
        "client_cpu_s": cpu,
        "service_cpu_s": service_cpu(service_pid) - service_cpu_0,
    }


def service_cpu(pid: int) -> float:
    """CPU seconds (user + system, all threads) a process and its children (workers) have used, from /proc; NaN
    where there is none. A worker that exited within the window is missed (none should)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return float("nan")
    own = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return own + sum(service_cpu(int(child)) for child in children)


def client_main(spec: str) -> int:
    """--client: run one level and print its result as one JSON line."""
    job = json.loads(spec)
    result = run_clients(job["port"], job["paths"], job["clients"], job["seconds"], job["limit"], job["pid"])
    print(json.dumps(result))
    return 0


# ==== The parent ====


def level(port: int, pid: int, paths: list[str], clients: int, args: argparse.Namespace, marker: str = "") -> dict:
    """One level in a separate client process; its figures."""
    return figures([run_level(port, pid, paths, clients, args, marker)])


def run_level(port: int, pid: int, paths: list[str], clients: int, args: argparse.Namespace, marker: str) -> dict:
    """One level in a separate client process: what it reports (latencies, counts, CPU)."""
    job = {"port": port, "paths": paths, "clients": clients, "seconds": args.seconds, "limit": args.max_requests}
    job["pid"] = pid
    done = subprocess.run(
        [sys.executable, __file__, "--client", json.dumps(job)],
        capture_output=True,
        text=True,
        timeout=args.seconds + CLIENT_GRACE_S,
        env={**os.environ, "LOAD_MARKER": marker},
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"client process exited {done.returncode}: {done.stderr.strip()[-500:]}")
    return json.loads(done.stdout)


def figures(runs: list[dict]) -> dict:
    """The figures of one level from one or more runs of it (--rounds), pooled: every latency, every count,
    every second and every CPU second of them together."""
    result: dict = {"statuses": {}, "by_worker": {}}
    for run in runs:
        for key in ("statuses", "by_worker"):
            for name, count in run[key].items():
                result[key][name] = result[key].get(name, 0) + count
    for key in ("marker_missing", "wall_s", "client_cpu_s", "service_cpu_s"):
        result[key] = sum(run[key] for run in runs)
    stats = percentiles([latency for run in runs for latency in run["latencies"]])
    n = stats["n"]
    return {
        **result,
        **stats,
        "per_s": n / result["wall_s"],
        "in_mode_per_s": (n - result["marker_missing"]) / result["wall_s"],  # answers ranked as asked
        "client_ms_per_req": result["client_cpu_s"] / max(n, 1) * 1000,
        "client_cores": result["client_cpu_s"] / result["wall_s"],
        "service_cores": result["service_cpu_s"] / result["wall_s"],
        "service_ms_per_req": result["service_cpu_s"] / max(n, 1) * 1000,
        "errors": sum(count for status, count in result["statuses"].items() if status != "200"),
    }


def start(tree: Path, db: Path, hybrid: bool, extra: list[str]) -> Process:
    argv = [sys.executable, str(tree / "solos_memory.py"), "serve", "--db", str(db), "--port", "0"]
    argv += ["--no-request-log"] + ([] if hybrid else ["--model-dir", "off"]) + extra
    return Process(argv, {**os.environ, "HF_HUB_OFFLINE": "1"})


def serving(args: argparse.Namespace, base: Path | None) -> list[tuple[str, Path, list[str]]]:
    """(name, tree, extra serve arguments) of each service to measure: the base, then this tree once per
    --workers count (and --worker-socket mode, when several are given), then once per --variant; every one with
    --serve-args first."""
    common = shlex.split(args.serve_args)
    found: list[tuple[str, Path, list[str]]] = [("base", base, common)] if base else []
    for count in args.workers:
        if count == 1:
            found.append(("this", ROOT, common))
            continue
        for mode in args.worker_socket:
            name = f"w{count}" + (f"-{mode[:5]}" if len(args.worker_socket) > 1 else "")
            found.append((name, ROOT, [*common, "--workers", str(count), "--worker-socket", mode]))
    for variant in args.variant:
        name, _, extra = variant.partition("=")
        found.append((name, ROOT, [*common, *shlex.split(extra)]))
    return found


def worker_count(extra: list[str]) -> int:
    """How many workers these serve arguments start (auto: this host's cores)."""
    if "--workers" not in extra:
        return 1
    given = extra[len(extra) - 1 - extra[::-1].index("--workers") + 1]  # the last one given, as argparse takes it
    return os.cpu_count() or 1 if given == "auto" else int(given)


def recall_paths(questions: list[str]) -> list[str]:
    return [
        "/v1/recall?" + urlencode({"agent": locomo_shape.READER, "q": q, "tiers": "long", "k": K}) for q in questions
    ]


def warm(port: int, paths: list[str], mode: str, workers: int = 1) -> None:
    """WARMUP recalls on a connection to each worker; stops if the service answers otherwise than in `mode`.

    New connections go to the worker holding the fewest, so after one is warmed the next usually reaches
    another; a worker still busy starting (a large database) is retried until WARM_WAIT_S."""
    warmed: set[str] = set()
    deadline = time.monotonic() + WARM_WAIT_S
    while time.monotonic() < deadline:
        client = Client(port)
        try:
            status, health = client.json("GET", "/health")
            if str(health.get("worker", 1)) in warmed:
                continue
            for path in paths[:WARMUP]:
                status, answer = client.json("GET", path)
                if status != 200 or answer.get("ranking") != mode:
                    raise RuntimeError(f"warm-up recall answered {status}, ranking {answer.get('ranking')}: {answer}")
            warmed.add(str(health.get("worker", 1)))
        finally:
            client.close()
        if len(warmed) == workers:
            return
    raise RuntimeError(f"warmed workers {sorted(warmed)} of {workers}")


def row(tree: str, clients: int, figures: dict) -> str:
    extra = f"  errors {figures['errors']}" if figures["errors"] else ""
    if figures.get("marker_missing"):
        extra += f"  other ranking {figures['marker_missing']} ({figures['in_mode_per_s']:.1f}/s as asked)"
    spread = {worker: n for worker, n in figures.get("by_worker", {}).items() if worker}
    if spread:
        total = sum(spread.values())
        extra += "  by worker " + " ".join(f"{w}:{n / total:.0%}" for w, n in sorted(spread.items()))
    return (
        f"  {tree:<8} {clients:>3} clients {figures['per_s']:8.1f}/s  p50 {figures['p50']:7.1f} ms"
        f"  p99 {figures['p99']:7.1f} ms  n {figures['n']:>6}  service {figures['service_cores']:4.2f} cores"
        f" ({figures['service_ms_per_req']:.2f} ms/req)"
        f"  client {figures['client_cores']:4.2f} cores ({figures['client_ms_per_req']:.3f} ms/req){extra}"
    )


def acceptance(results: dict[int, dict]) -> str:
    """The load criteria (16 clients keep 95% of the best lower level, p50 at 16 <= 4x p50 at 4, p99 <= 3x
    p50) on one tree's levels, and what queueing alone makes of p50 16/4; throughput counts only answers
    ranked as asked (hybrid that fell back to keyword is faster, not better). Beside each throughput ratio,
    the same ratio of the service's CPU per request (best lower level's over this one's): near 100% where
    the service's work per recall held and the throughput moved with the share of the machine it was given."""
    levels = sorted(results)
    notes = []
    for clients in levels:
        lower = [c for c in levels if c < clients]
        if clients < 16 or not lower:
            continue
        best = max(lower, key=lambda c: results[c]["in_mode_per_s"])
        cost = results[best]["service_ms_per_req"] / max(results[clients]["service_ms_per_req"], 1e-9)
        ratio = results[clients]["in_mode_per_s"] / results[best]["in_mode_per_s"]
        notes.append(f"{clients}: {ratio:.0%} of best lower (CPU/req {cost:.0%})")
    if 4 in results and 16 in results:
        # Closed-loop clients (Little's law: clients = recalls/s x time a recall): once 4 clients fill the
        # cores, 16 wait 4 x as long unless 16 get more recalls a second than 4. Queueing alone predicts this.
        queueing = 4 * results[4]["per_s"] / max(results[16]["per_s"], 1e-9)
        notes.append(
            f"p50 16/4 {results[16]['p50'] / results[4]['p50']:.1f}x (<= 4x; queueing alone, 4 x recalls/s at 4"
            f" over 16: {queueing:.2f}x)"
        )
    worst = max(levels, key=lambda c: results[c]["p99"] / results[c]["p50"])
    notes.append(f"worst p99/p50 {results[worst]['p99'] / results[worst]['p50']:.1f}x at {worst} (<= 3x)")
    return "; ".join(notes) + "  [throughput >= 95%]"


def sweep(title: str, trees: dict[str, Process], paths: list[str], args: argparse.Namespace, marker: str) -> dict:
    """Every level, each tree in turn at each level; with --rounds N, all of that N times, each level's runs
    pooled (a round's rows print as it goes, the pooled ones after)."""
    print(f"{title}   ({machine_note()})", flush=True)
    runs: dict[str, dict[int, list[dict]]] = {name: {clients: [] for clients in args.levels} for name in trees}
    for round_ in range(1, args.rounds + 1):
        if args.rounds > 1:
            print(f"  round {round_} of {args.rounds}   (load {os.getloadavg()[0]:.2f})", flush=True)
        for clients in args.levels:
            for name, service in trees.items():
                runs[name][clients].append(run_level(service.port, service.popen.pid, paths, clients, args, marker))
                print(row(name, clients, figures(runs[name][clients][-1:])), flush=True)
            compare(trees, {name: figures(runs[name][clients][-1:]) for name in trees})
    results = {name: {clients: figures(runs[name][clients]) for clients in args.levels} for name in trees}
    if args.rounds > 1:
        print(f"  pooled over {args.rounds} rounds:")
        for clients in args.levels:
            for name in trees:
                print(row(name, clients, results[name][clients]), flush=True)
            compare(trees, {name: results[name][clients] for name in trees})
    for name in trees:
        print(f"  {name} against the load criteria: {acceptance(results[name])}")
    return results


def compare(trees: dict[str, Process], level: dict[str, dict]) -> None:
    """Each tree's throughput over the base's at one level."""
    if "base" in trees and len(trees) > 1:
        ratios = [
            f"{name}/base {level[name]['per_s'] / level['base']['per_s']:4.2f}x" for name in trees if name != "base"
        ]
        print(f"        throughput {'  '.join(ratios)}   load {os.getloadavg()[0]:.2f}", flush=True)


def hog() -> subprocess.Popen:
    """One busy process (--hog): what an agent's own work does to the cores the service runs on. It spins for
    at most HOG_MOST_S by itself, and is killed when its mode's levels end."""
    spin = f"import time\nend = time.monotonic() + {HOG_MOST_S}\nwhile time.monotonic() < end:\n    pass"
    return subprocess.Popen([sys.executable, "-c", spin])


def measure(
    args: argparse.Namespace,
    base: Path | None,
    folder: Path,
    source: Path,
    mode: str,
    rows: str,
    paths: list[str],
    health: bool,
) -> None:
    """One mode on one database: every tree served from its own copy, warmed, swept, then stopped."""
    db = source if mode == "keyword" else with_vectors(source, budget_s=1800)
    if db is None:
        return
    trees: dict[str, Process] = {}
    hogs: list[subprocess.Popen] = []
    try:
        for name, tree, extra in serving(args, base):
            copy = folder / f"{name}-{mode}-{rows}.db"
            shutil.copy(db, copy)
            trees[name] = start(tree, copy, mode == "hybrid", extra)
            warm(trees[name].port, paths, mode, worker_count(extra))
        hogs = [hog() for _ in range(args.hog)]
        sweep(f"{mode} recall, {rows} rows", trees, paths, args, f'"ranking": "{mode}"')
        if health and not args.no_health:
            sweep("/health (the transport's ceiling)", trees, ["/health"], args, "")
    finally:
        for process in hogs:
            process.kill()
            process.wait()
        for service in trees.values():
            service.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="main", help="git revision, checkout folder or none (default: %(default)s)")
    parser.add_argument(
        "--rows", default="5k", help="LoCoMo turns as long facts: 5k, 100k or both, 5k,100k (default: %(default)s)"
    )
    parser.add_argument("--levels", default="1,4,16,64", help="concurrent clients (default: %(default)s)")
    parser.add_argument("--seconds", type=float, default=5.0, help="per level and tree (default: %(default)s)")
    parser.add_argument(
        "--rounds", type=int, default=1, help="sweeps of every level, each level pooled over them (default: 1)"
    )
    parser.add_argument("--max-requests", type=int, default=50_000, help="per level and tree (default: %(default)s)")
    parser.add_argument("--modes", default="keyword,hybrid", help="keyword, hybrid or both (default: %(default)s)")
    parser.add_argument("--no-health", action="store_true", help="skip the /health ceiling (default: measure it)")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="LoCoMo file (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=7, help="question sample seed (default: %(default)s)")
    parser.add_argument("--workers", default="1", help="this tree's worker counts, e.g. 1,2 (default: %(default)s)")
    parser.add_argument(
        "--worker-socket", default="shared", help="shared, reuseport or both, for counts over 1 (default: %(default)s)"
    )
    parser.add_argument(
        "--variant", action="append", default=[], help='this tree again with more serve arguments: NAME="ARGS"'
    )
    parser.add_argument(
        "--serve-args",
        default="",
        help="serve arguments for every service, the base's too, e.g. '--workers 2 --admit 1' (default: none)",
    )
    parser.add_argument(
        "--hog", type=int, default=0, help="busy processes beside the services while they are measured (default: 0)"
    )
    parser.add_argument("--client", help=argparse.SUPPRESS)  # the client process's job (JSON)
    args = parser.parse_args()
    if args.client:
        return client_main(args.client)
    args.levels = [int(n) for n in args.levels.split(",")]
    args.workers = [int(n) for n in args.workers.split(",")]
    args.worker_socket = [m.strip() for m in args.worker_socket.split(",") if m.strip()]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    sizes = [r.strip() for r in args.rows.split(",") if r.strip()]
    sources = {rows: locomo_shape.ensure_db(gen_db.parse_size(rows), args.data) for rows in sizes}
    paths = recall_paths(locomo_shape.questions(args.data, QUESTIONS, args.seed))
    print(machine_note())
    with tempfile.TemporaryDirectory(prefix="solos-load-") as scratch:
        folder = Path(scratch)
        base = base_tree(args.base, folder)
        print(f"this: {ROOT}  base: {args.base}" + (f" ({base})" if base else ""))
        for rows, source in sources.items():
            print(f"data: {source.name}, {len(paths)} LoCoMo questions, k={K}, tiers long")
            for mode in modes:
                measure(args, base, folder, source, mode, rows, paths, health=mode == modes[0] and rows == sizes[0])
    print(machine_note())
    return 0


if __name__ == "__main__":
    sys.exit(main())
