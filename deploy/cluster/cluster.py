#!/usr/bin/env python3
"""A highly available PostgreSQL for solos-memory on one machine.

Three etcd members, three PostgreSQL 15 nodes run by Patroni with
`synchronous_mode: true`, and HAProxy sending one port to the current primary
and another to the replicas; optionally N copies of the service on top. All of
it binds 127.0.0.1 and lives in one state folder; nothing is installed or
written elsewhere.

    python3 deploy/cluster/cluster.py up [--state DIR] [--services N]
    python3 deploy/cluster/cluster.py status
    python3 deploy/cluster/cluster.py kill-leader [--whole-node]
    python3 deploy/cluster/cluster.py revive
    python3 deploy/cluster/cluster.py down

Needs Debian 12's `patroni`, `etcd-server`, `etcd-client`, `haproxy` and
`postgresql-15`. Run as root, etcd, Patroni and HAProxy run as `--user`
(postgres), since initdb refuses root; run as anyone else, as that user. Standard library only.
Every wait has a deadline, and `down` leaves no process behind. README.md
beside this file says how to run it across hosts.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import string
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

# ==== Configuration ====

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
DEFAULT_STATE = Path("/tmp/solos-cluster")
# Below the kernel's ephemeral range (32768-60999), so no outgoing connection
# holds one of them, and far from the dev server on 55432.
DEFAULT_BASE_PORT = 27400
DEFAULT_PG_BIN = Path("/usr/lib/postgresql/15/bin")
# The PostgreSQL store needs psycopg, which the checkout's .venv has.
DEFAULT_PYTHON = REPO / ".venv/bin/python" if (REPO / ".venv/bin/python").exists() else Path(sys.executable)
NODES = 3
# haproxy is in /usr/sbin, off a normal user's PATH.
SEARCH_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DATABASE = "solos"

# How long each stage may take before `up` gives up. Measured here, on 2
# shared cores: etcd healthy in 1-5 s, Patroni bootstrapped and streaming to
# both replicas 7-15 s later, HAProxy on the leader alone within 2 s.
ETCD_TIMEOUT_S = 30
PATRONI_TIMEOUT_S = 120
HAPROXY_TIMEOUT_S = 30
SERVICE_TIMEOUT_S = 90
STOP_TIMEOUT_S = 30


def plan_ports(base: int, services: int) -> dict:
    """Every port the cluster binds, from one base."""
    return {
        "etcd_client": [base + 1 + i for i in range(NODES)],
        "etcd_peer": [base + 11 + i for i in range(NODES)],
        "pg": [base + 21 + i for i in range(NODES)],
        "rest": [base + 31 + i for i in range(NODES)],
        "primary": base + 40,
        "replicas": base + 41,
        "stats": base + 42,
        "services": [base + 51 + i for i in range(services)],
    }


def all_ports(ports: dict) -> list[int]:
    """The plan's ports as one flat list."""
    flat: list[int] = []
    for value in ports.values():
        flat.extend(value if isinstance(value, list) else [value])
    return flat


class ClusterError(Exception):
    """Something the operator has to look at; the message says what."""


class Exited(ClusterError):
    """A process we wait on has died: no point waiting any longer."""


# ==== Processes ====


def proc_start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks, None if gone or a zombie.

    Recorded beside each pid so a recycled pid is never mistaken for ours.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":
        return None
    return int(fields[19])


def alive(record: dict) -> bool:
    """Whether the process a record names still runs (and is the same one)."""
    return proc_start_ticks(record["pid"]) == record["ticks"]


def spawn(name: str, argv: list[str], log: Path, user: str | None, cwd: Path, env: dict | None = None) -> dict:
    """Start a daemon in its own session, output to log; return its record."""
    # Popen switches user itself (as runuser would), so the pid we keep is the
    # daemon's own, not that of a runuser waiting on it.
    account = pwd.getpwnam(user) if user else None
    base_env = {
        "PATH": SEARCH_PATH,
        "LANG": "C.UTF-8",
        "HOME": account.pw_dir if account else os.environ.get("HOME", "/"),
    }
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=cwd,
            env={**base_env, **(env or {})},
            user=user,
            group=account.pw_gid if account else None,
            extra_groups=[] if account else None,
        )
    return {"name": name, "pid": proc.pid, "ticks": proc_start_ticks(proc.pid), "log": str(log)}


def stop(records: list[dict], timeout: float, sig: int = signal.SIGTERM) -> list[dict]:
    """Signal the processes, wait up to timeout, SIGKILL the rest; return the killed."""
    for record in records:
        if alive(record):
            try:
                os.kill(record["pid"], sig)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(r) for r in records):
        time.sleep(0.2)
    killed = [r for r in records if alive(r)]
    for record in killed:
        try:
            os.kill(record["pid"], signal.SIGKILL)
        except ProcessLookupError:
            pass
    return killed


def postgres_in(folder: Path, pg_bin: str) -> list[dict]:
    """Live PostgreSQL processes working in the folder (or below it).

    This is how `down` and `revive` find what Patroni started on its own:
    postmasters are daemonized away from Patroni, and every PostgreSQL process
    works in its data folder. Matching the program too spares anything else
    that happens to sit there, such as an operator's shell.
    """
    found = []
    program = os.path.realpath(Path(pg_bin) / "postgres")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            exe = os.readlink(entry / "exe")
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        ticks = proc_start_ticks(int(entry.name))
        if ticks is not None and exe == program and (cwd == str(folder) or cwd.startswith(f"{folder}/")):
            found.append({"name": f"postgres in {cwd}", "pid": int(entry.name), "ticks": ticks})
    return found


def zombies_under_init() -> int:
    """Exited processes nobody reaped; some containers' PID 1 never does."""
    count = 0
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            stat = entry.read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        count += fields[0] == "Z" and fields[1] == "1"
    return count


# ==== Waiting and asking ====


def wait_until(check, timeout: float, what: str, interval: float = 0.25):
    """Poll check() until it returns something true; ClusterError after timeout."""
    deadline = time.monotonic() + timeout
    last_error = None
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
        except Exited:
            raise
        except Exception as error:  # noqa: BLE001 - anything means "not yet"
            last_error = error
        time.sleep(interval)
    detail = f" (last error: {last_error})" if last_error else ""
    raise ClusterError(f"{what}: not ready after {timeout:.0f} s{detail}")


def http_json(url: str, timeout: float = 1.0):
    """GET a loopback URL and decode its JSON; HTTP errors still return the body."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return json.load(response)
    except urllib.error.HTTPError as error:
        return json.load(error)


def port_free(port: int) -> bool:
    """Whether nothing listens on 127.0.0.1:port."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def psql(meta: dict, port: int, sql: str, database: str = "postgres") -> str:
    """One statement through psql over TCP; its unaligned output."""
    result = subprocess.run(
        [
            str(Path(meta["pg_bin"]) / "psql"),
            "-X",
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
            "-U",
            "postgres",
            "-d",
            database,
            "-v",
            "ON_ERROR_STOP=1",
            "-Atc",
            sql,
        ],
        capture_output=True,
        text=True,
        timeout=10,
        env={**os.environ, "PGCONNECT_TIMEOUT": "3"},
    )
    if result.returncode:
        raise ClusterError(result.stderr.strip() or f"psql exited {result.returncode}")
    return result.stdout.strip()


def cluster_members(meta: dict) -> list[dict]:
    """Patroni's view of the members, from the first REST API that answers."""
    last_error: Exception | None = None
    for port in meta["ports"]["rest"]:
        try:
            return http_json(f"http://127.0.0.1:{port}/cluster")["members"]
        except (OSError, ValueError, KeyError) as error:
            last_error = error
    raise ClusterError(f"no Patroni REST API answers ({last_error})")


def leader(meta: dict) -> dict | None:
    """The running leader member, or None during a switch."""
    for member in cluster_members(meta):
        if member["role"] == "leader" and member["state"] == "running":
            return member
    return None


def healthy(members: list[dict]) -> bool:
    """One running leader, one synchronous standby, and every node running."""
    roles = [m["role"] for m in members]
    return (
        len(members) == NODES
        and roles.count("leader") == 1
        and "sync_standby" in roles
        and all(m["state"] in ("running", "streaming") for m in members)
    )


def haproxy_up(meta: dict, proxy: str) -> list[str]:
    """The servers HAProxy sends a proxy's new connections to, from its stats page's CSV.

    "UP 1/2" counts: one check has failed, and the server takes connections
    until `fall` checks in a row have.
    """
    with urllib.request.urlopen(f"http://127.0.0.1:{meta['ports']['stats']}/;csv", timeout=1) as response:
        rows = response.read().decode().lstrip("# ").splitlines()
    header = rows[0].split(",")
    up = []
    for line in rows[1:]:
        row = dict(zip(header, line.split(",")))
        if (
            row.get("pxname") == proxy
            and row.get("svname") not in ("FRONTEND", "BACKEND")
            and row.get("status", "").startswith("UP")
        ):
            up.append(row["svname"])
    return up


def primary_url(meta: dict) -> str:
    """The service's --db: the database behind HAProxy's primary port."""
    return f"postgresql://postgres@127.0.0.1:{meta['ports']['primary']}/{DATABASE}"


# ==== Service copies ====


def service_argv(meta: dict, port: int) -> list[str]:
    """One copy of the service on its own loopback port, over the database behind HAProxy's primary port."""
    service = meta["service"]
    argv = [
        service["python"],
        str(Path(service["repo"]) / "solos_memory.py"),
        "serve",
        "--db",
        primary_url(meta),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    return argv + (["--model-dir", service["model_dir"]] if service["model_dir"] else [])


def register_agents(meta: dict, names: list[str]) -> None:
    """`agents add` once, as the database's owner; it also applies the schema before any copy starts."""
    service = meta["service"]
    result = subprocess.run(
        [service["python"], str(Path(service["repo"]) / "solos_memory.py"), "agents", "add", "--db", primary_url(meta)]
        + names,
        capture_output=True,
        text=True,
        timeout=SERVICE_TIMEOUT_S,
        cwd=service["repo"],
    )
    if result.returncode:
        raise ClusterError(f"agents add {' '.join(names)} failed: {(result.stderr or result.stdout).strip()[-800:]}")


def start_service(meta: dict, index: int) -> dict:
    """Start copy svc<index+1>; its record (kind included)."""
    name = f"svc{index + 1}"
    folder = owned_dir(Path(meta["state"]) / name, None)
    argv = service_argv(meta, meta["ports"]["services"][index])
    # As the caller, not --user: the copies are the fleet's service, not part
    # of the database, and use the caller's interpreter and caches.
    record = spawn(name, argv, folder / "service.log", None, folder, env={"HOME": os.environ.get("HOME", "/")})
    return {**record, "kind": "service"}


def wait_for_service(record: dict, port: int) -> None:
    """Until the copy answers /health; Exited with its last log lines if it dies first."""

    def service_up():
        if not alive(record):
            tail = Path(record["log"]).read_text(errors="replace").strip().splitlines()[-5:]
            raise Exited(f"{record['name']} exited:\n  " + "\n  ".join(tail))
        return http_json(f"http://127.0.0.1:{port}/health", timeout=2)

    wait_until(service_up, SERVICE_TIMEOUT_S, f"{record['name']} on {port}")


# ==== State folder ====


def meta_path(state: Path) -> Path:
    return state / "cluster.json"


def load_meta(state: Path) -> dict:
    """What `up` recorded; ClusterError if there is no cluster here."""
    try:
        return json.loads(meta_path(state).read_text())
    except FileNotFoundError:
        raise ClusterError(f"no cluster in {state} (cluster.json missing); start one with `up`") from None


def save_meta(state: Path, meta: dict) -> None:
    """Record the cluster, written whole so a reader never sees half of it."""
    temp = meta_path(state).with_suffix(".tmp")
    temp.write_text(json.dumps(meta, indent=2) + "\n")
    temp.replace(meta_path(state))


def records(meta: dict, kind: str | None = None) -> list[dict]:
    """The recorded processes, all or of one kind (etcd, patroni, haproxy, service)."""
    return [p for p in meta["processes"] if kind is None or p["kind"] == kind]


def fresh_state(state: Path, owner: str | None) -> None:
    """Empty the state folder for a new cluster, refusing one that still runs."""
    if state.exists():
        if meta_path(state).exists():
            meta = load_meta(state)
            running = [p for p in records(meta) if alive(p)] + postgres_in(state, meta["pg_bin"])
            if running:
                raise ClusterError(f"a cluster still runs in {state} ({len(running)} processes); `down` first")
            shutil.rmtree(state)
        elif any(state.iterdir()):
            raise ClusterError(f"{state} holds files that are not a cluster's; choose another --state")
    state.mkdir(parents=True, exist_ok=True)
    if owner:
        account = pwd.getpwnam(owner)
        os.chown(state, account.pw_uid, account.pw_gid)


def owned_dir(path: Path, owner: str | None) -> Path:
    """A folder the daemons' user owns, mode 0700 (PostgreSQL insists on it for data)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if owner:
        account = pwd.getpwnam(owner)
        os.chown(path, account.pw_uid, account.pw_gid)
    return path


def render(template: str, target: Path, owner: str | None, **values) -> Path:
    """Fill a template beside this file into the state folder."""
    text = string.Template((HERE / template).read_text()).substitute(values)
    target.write_text(text)
    if owner:
        account = pwd.getpwnam(owner)
        os.chown(target, account.pw_uid, account.pw_gid)
    target.chmod(0o600)
    return target


# ==== Commands ====


def cmd_up(args) -> int:
    started = time.monotonic()
    state = args.state.resolve()
    owner = args.user if os.geteuid() == 0 else None
    pg_bin = args.pg_bin
    tools = {tool: shutil.which(tool, path=SEARCH_PATH) or "" for tool in ("etcd", "patroni", "haproxy")}
    missing = [tool for tool, path in tools.items() if not path]
    if missing:
        raise ClusterError(f"{', '.join(missing)} not found: apt-get install patroni etcd-server etcd-client haproxy")
    if not (pg_bin / "postgres").exists():
        raise ClusterError(f"{pg_bin}/postgres not found: apt-get install postgresql-15, or pass --pg-bin")
    ports = plan_ports(args.base_port, args.services)
    fresh_state(state, owner)
    taken = [p for p in all_ports(ports) if not port_free(p)]
    if taken:
        raise ClusterError(f"ports already in use on 127.0.0.1: {taken}; pass another --base-port")

    meta: dict[str, Any] = {
        "state": str(state),
        "user": owner,
        "pg_bin": str(pg_bin),
        "ports": ports,
        "tools": tools,
        "processes": [],
        "started": time.time(),
        "nodes": [],
    }
    save_meta(state, meta)

    def started_process(kind: str, record: dict) -> None:
        record["kind"] = kind
        meta["processes"].append(record)
        save_meta(state, meta)

    try:
        # etcd: three members forming one cluster, the DCS Patroni elects through.
        peers = ",".join(f"etcd{i + 1}=http://127.0.0.1:{p}" for i, p in enumerate(ports["etcd_peer"]))
        token = "solos-" + secrets.token_hex(4)
        for i in range(NODES):
            name = f"etcd{i + 1}"
            folder = owned_dir(state / name, owner)
            client = f"http://127.0.0.1:{ports['etcd_client'][i]}"
            peer = f"http://127.0.0.1:{ports['etcd_peer'][i]}"
            argv = [
                tools["etcd"],
                "--name",
                name,
                "--data-dir",
                str(folder / "data"),
                "--logger",
                "zap",
                "--listen-client-urls",
                client,
                "--advertise-client-urls",
                client,
                "--listen-peer-urls",
                peer,
                "--initial-advertise-peer-urls",
                peer,
                "--initial-cluster",
                peers,
                "--initial-cluster-token",
                token,
                "--initial-cluster-state",
                "new",
            ]
            started_process("etcd", spawn(name, argv, folder / "etcd.log", owner, folder))
        for port in ports["etcd_client"]:
            wait_until(
                lambda port=port: http_json(f"http://127.0.0.1:{port}/health").get("health") == "true",
                ETCD_TIMEOUT_S,
                f"etcd on {port}",
            )
        print(f"etcd: 3 members healthy ({time.monotonic() - started:.1f} s)", flush=True)

        # Patroni: the first node to take the leader key runs initdb, the
        # others clone it with pg_basebackup and stream from it.
        etcd_hosts = ",".join(f"127.0.0.1:{p}" for p in ports["etcd_client"])
        password = secrets.token_hex(12)
        for i in range(NODES):
            name = f"pg{i + 1}"
            folder = owned_dir(state / name, owner)
            config = render(
                "patroni.yml.in",
                folder / "patroni.yml",
                owner,
                name=name,
                rest_port=ports["rest"][i],
                etcd_hosts=etcd_hosts,
                pg_port=ports["pg"][i],
                data_dir=folder / "data",
                bin_dir=pg_bin,
                node_dir=folder,
                replication_password=password,
            )
            meta["nodes"].append(
                {
                    "name": name,
                    "data_dir": str(folder / "data"),
                    "config": str(config),
                    "pg_port": ports["pg"][i],
                    "rest_port": ports["rest"][i],
                }
            )
            started_process(
                "patroni", spawn(name, [tools["patroni"], str(config)], folder / "patroni.log", owner, folder)
            )
        wait_until(
            lambda: healthy(cluster_members(meta)),
            PATRONI_TIMEOUT_S,
            "Patroni: a leader, a sync standby and 3 running nodes",
        )
        print(
            f"patroni: leader {(leader(meta) or {}).get('name')}, sync standby up ({time.monotonic() - started:.1f} s)",
            flush=True,
        )

        # HAProxy: health-checks each node's REST API, routes to the primary.
        def servers() -> str:
            return "\n".join(
                f"    server pg{i + 1} 127.0.0.1:{ports['pg'][i]} check port {ports['rest'][i]}" for i in range(NODES)
            )

        folder = owned_dir(state / "haproxy", owner)
        config = render(
            "haproxy.cfg.in",
            folder / "haproxy.cfg",
            owner,
            stats_port=ports["stats"],
            primary_port=ports["primary"],
            replica_port=ports["replicas"],
            primary_servers=servers(),
            replica_servers=servers(),
        )
        started_process(
            "haproxy",
            spawn("haproxy", [tools["haproxy"], "-db", "-f", str(config)], folder / "haproxy.log", owner, folder),
        )
        # HAProxy counts a server as up until its checks have failed `fall`
        # times, so for its first seconds the primary port round-robins over
        # all three nodes. Ready means the leader alone is up there.
        wait_until(
            lambda: haproxy_up(meta, "primary") == [(leader(meta) or {}).get("name")],
            HAPROXY_TIMEOUT_S,
            f"HAProxy primary port {ports['primary']} on the leader alone",
        )
        if psql(meta, ports["primary"], f"select 1 from pg_database where datname = '{DATABASE}'") != "1":
            psql(meta, ports["primary"], f"create database {DATABASE}")
        print(
            f"haproxy: primary 127.0.0.1:{ports['primary']}, replicas 127.0.0.1:{ports['replicas']},"
            f" database {DATABASE} ({time.monotonic() - started:.1f} s)",
            flush=True,
        )

        # The service copies, each on its own loopback port, all on one database.
        # The agents are registered once, before any copy starts (a copy's own
        # --register would do it three times over, racing the others).
        meta["service"] = {"python": str(args.python), "repo": str(args.repo), "model_dir": args.model_dir}
        names = [name for name in args.register.split(",") if name]
        if ports["services"] and names:
            register_agents(meta, names)
        for i in range(len(ports["services"])):
            started_process("service", start_service(meta, i))
        for record, port in zip(records(meta, "service"), ports["services"]):
            wait_for_service(record, port)
        if ports["services"]:
            print(
                f"services: {len(ports['services'])} copies on {ports['services']}"
                f" ({time.monotonic() - started:.1f} s)",
                flush=True,
            )
    except (ClusterError, OSError, subprocess.SubprocessError) as error:
        print(f"up failed: {error}\n(logs under {state}; `down` stops what started)", file=sys.stderr)
        return 1

    meta["up_seconds"] = round(time.monotonic() - started, 1)
    save_meta(state, meta)
    print(f"up in {meta['up_seconds']} s: --db {primary_url(meta)}")
    return 0


def cmd_down(args) -> int:
    state = args.state.resolve()
    meta = load_meta(state)
    began = time.monotonic()
    # Top down: services before the database, Patroni before etcd (a Patroni
    # that loses etcd demotes its primary instead of stopping cleanly).
    stop(records(meta, "service"), 10)
    stop(records(meta, "haproxy"), 5)
    stop(records(meta, "patroni"), STOP_TIMEOUT_S)
    # Postmasters whose Patroni is gone (kill-leader --whole-node) still run:
    # SIGQUIT is PostgreSQL's immediate shutdown.
    stop(postgres_in(state, meta["pg_bin"]), 10, signal.SIGQUIT)
    # One at a time: a stopping etcd leader first hands leadership to a
    # member still running; with all three stopping at once that hand-over
    # waits out its timeout (7 s here).
    for record in records(meta, "etcd"):
        stop([record], 10)
    left = [p for p in records(meta) if alive(p)] + postgres_in(state, meta["pg_bin"])
    killed = stop(left, 5, signal.SIGKILL)
    busy = [p for p in all_ports(meta["ports"]) if not port_free(p)]
    print(
        f"down in {time.monotonic() - began:.1f} s: {len(killed)} processes left"
        f" ({', '.join(str(p['pid']) for p in killed) or 'none'}); ports still bound: {busy or 'none'}"
    )
    zombies = zombies_under_init()
    if zombies and os.getpid() != 1:
        print(f"note: {zombies} exited processes wait for PID 1 to reap them (it does not, in this container)")
    return 0 if not killed and not busy else 1


def cmd_status(args) -> int:
    state = args.state.resolve()
    meta = load_meta(state)
    ports = meta["ports"]
    ok = True
    print(f"state {state}, up {time.time() - meta['started']:.0f} s ago")
    for record in records(meta):
        running = alive(record)
        ok &= running
        print(f"  {record['kind']:8} {record['name']:8} pid {record['pid']:<8} {'running' if running else 'gone'}")
    try:
        members = cluster_members(meta)
        for m in members:
            print(
                f"  member   {m['name']:8} {m['role']:13} {m['state']:10} timeline {m.get('timeline', '-')}"
                f" lag {m.get('lag', 0)} port {m['port']}"
            )
        ok &= healthy(members)
    except ClusterError as error:
        print(f"  patroni: {error}")
        ok = False
    try:
        port = psql(meta, ports["primary"], "select inet_server_port()")
        primary, replicas = haproxy_up(meta, "primary"), haproxy_up(meta, "replicas")
        ok &= len(primary) == 1
        print(
            f"  haproxy  primary 127.0.0.1:{ports['primary']} -> PostgreSQL on {port} (up: {','.join(primary)});"
            f" replicas 127.0.0.1:{ports['replicas']} (up: {','.join(replicas) or 'none'})"
        )
    except (ClusterError, subprocess.TimeoutExpired, OSError) as error:
        print(f"  haproxy  primary 127.0.0.1:{ports['primary']}: {error}")
        ok = False
    print(f"  --db {primary_url(meta)}")
    print("healthy" if ok else "not healthy")
    return 0 if ok else 1


def kill_leader(meta: dict, whole_node: bool = False) -> dict:
    """kill -9 the leader's postmaster (and with whole_node its Patroni first); what was killed."""
    member = leader(meta)
    if member is None:
        raise ClusterError("no running leader to kill")
    node = next(n for n in meta["nodes"] if n["name"] == member["name"])
    killed = {"name": member["name"]}
    if whole_node:
        # Patroni first, or it restarts the postmaster in place (crash recovery)
        # and keeps the leader key: then nothing fails over.
        patroni = next(p for p in records(meta, "patroni") if p["name"] == member["name"])
        if alive(patroni):
            os.kill(patroni["pid"], signal.SIGKILL)
            killed["patroni_pid"] = patroni["pid"]
    pid = int(Path(node["data_dir"], "postmaster.pid").read_text().split()[0])
    if Path(f"/proc/{pid}/cwd").resolve() != Path(node["data_dir"]).resolve():
        raise ClusterError(f"postmaster.pid names {pid}, which is not {member['name']}'s postmaster")
    os.kill(pid, signal.SIGKILL)
    killed["postmaster_pid"] = pid
    killed["at"] = time.time()
    return killed


def cmd_revive(args) -> int:
    state = args.state.resolve()
    meta = load_meta(state)
    began = time.monotonic()
    revived = []
    for index, record in enumerate(meta["processes"]):
        if record["kind"] != "patroni" or alive(record):
            continue
        node = next(n for n in meta["nodes"] if n["name"] == record["name"])
        # A postmaster left behind by its killed Patroni would hold the data folder.
        stop(postgres_in(Path(node["data_dir"]), meta["pg_bin"]), 10, signal.SIGQUIT)
        folder = Path(node["config"]).parent
        fresh = spawn(
            record["name"], [meta["tools"]["patroni"], node["config"]], folder / "patroni.log", meta["user"], folder
        )
        meta["processes"][index] = {**fresh, "kind": "patroni"}
        save_meta(state, meta)
        revived.append(record["name"])
    copies = []
    for index, record in enumerate(meta["processes"]):
        if record["kind"] == "service" and not alive(record):
            number = int(record["name"].removeprefix("svc")) - 1
            meta["processes"][index] = start_service(meta, number)
            save_meta(state, meta)
            copies.append((meta["processes"][index], meta["ports"]["services"][number]))
    if not revived and not copies:
        print("revive: every Patroni and service copy runs; nothing to do")
        return 0
    if revived:
        # The old leader rewinds (pg_rewind) onto the new timeline and follows.
        wait_until(lambda: healthy(cluster_members(meta)), PATRONI_TIMEOUT_S, f"{', '.join(revived)} rejoining")
    for record, port in copies:
        wait_for_service(record, port)
    names = revived + [record["name"] for record, _ in copies]
    print(f"revived {', '.join(names)}: healthy again in {time.monotonic() - began:.1f} s")
    return 0


def cmd_kill_leader(args) -> int:
    meta = load_meta(args.state.resolve())
    killed = kill_leader(meta, args.whole_node)
    print(
        f"killed leader {killed['name']}: postmaster {killed['postmaster_pid']}"
        + (f", patroni {killed['patroni_pid']}" if "patroni_pid" in killed else "")
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cluster.py", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--state",
        type=Path,
        default=DEFAULT_STATE,
        help=f"the cluster's folder: configs, data, logs, pids (default: {DEFAULT_STATE})",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="start etcd, Patroni/PostgreSQL, HAProxy (and service copies)")
    up.add_argument(
        "--base-port",
        type=int,
        default=DEFAULT_BASE_PORT,
        help=f"ports are planned from this one, see plan_ports (default: {DEFAULT_BASE_PORT})",
    )
    up.add_argument(
        "--services", type=int, default=0, help="copies of the service to start over the cluster (default: 0)"
    )
    up.add_argument(
        "--register",
        default="atlas,sol",
        help="agents registered once before the copies start, comma-separated (default: atlas,sol)",
    )
    # Off by default: until backfill claims rows with SKIP LOCKED, three
    # copies with embedders would each embed every row on one machine's cores.
    up.add_argument(
        "--model-dir",
        default="off",
        help="the copies' --model-dir; 'off' is keyword-only recall, '' the service's own default,"
        " the carried embedder (default: off)",
    )
    up.add_argument(
        "--repo", type=Path, default=REPO, help=f"checkout whose solos_memory.py the copies run (default: {REPO})"
    )
    up.add_argument(
        "--python", default=str(DEFAULT_PYTHON), help=f"interpreter for the copies (default: {DEFAULT_PYTHON})"
    )
    up.add_argument(
        "--pg-bin", type=Path, default=DEFAULT_PG_BIN, help=f"PostgreSQL's programs (default: {DEFAULT_PG_BIN})"
    )
    up.add_argument(
        "--user", default="postgres", help="when run as root, the user every process runs as (default: postgres)"
    )
    commands.add_parser("down", help="stop everything `up` started; nothing is left running")
    commands.add_parser("status", help="processes, Patroni's members, where HAProxy routes")
    commands.add_parser(
        "revive", help="restart every node whose Patroni is gone (it rejoins as a replica) and every dead service copy"
    )
    kill = commands.add_parser("kill-leader", help="kill -9 the leader's postmaster")
    kill.add_argument(
        "--whole-node",
        action="store_true",
        help="kill its Patroni too, so another node must take over (default: postmaster only)",
    )
    args = parser.parse_args(argv)
    handler = {
        "up": cmd_up,
        "down": cmd_down,
        "status": cmd_status,
        "kill-leader": cmd_kill_leader,
        "revive": cmd_revive,
    }
    try:
        return handler[args.command](args)
    except ClusterError as error:
        print(f"{args.command}: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
