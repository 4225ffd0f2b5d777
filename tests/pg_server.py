"""A throwaway PostgreSQL server for the tests: its own data directory in a temp dir, a free loopback
port, a fresh empty database per test, and stop, kill and start for the fault tests.

It needs the server binaries (scripts/setup_postgres.sh installs Debian's) and psycopg. `initdb` and `postgres`
refuse to run as root, so as root they run as the `postgres` user: Popen's user and group switch, which is what
`runuser -u postgres` does without a PAM session in between, and which keeps the postmaster our own child. The
postmaster is asked to die with the thread that started it (PR_SET_PDEATHSIG), so even a test run killed with
SIGKILL leaves no server behind; a normal exit stops it and removes its directory (close(), also at exit), and
the next run removes the directories of runs that were killed.

Only the standard library is imported at the top: conftest imports this module in every run, with or without
psycopg, and asks `unavailable_reason()` before starting anything.
"""

from __future__ import annotations

import atexit
import ctypes
import itertools
import os
import pwd
import queue
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

SERVER_USER = "postgres"  # the Debian package's system user; initdb refuses root
DEBIAN_VERSIONS = Path("/usr/lib/postgresql")  # a <major version>/bin directory per installed server
DIR_PREFIX = "solos-pg-"  # then our pid and a dash: a later run removes the dirs of dead runs
READY_TIMEOUT_S = 15.0  # a start (crash recovery included) is well under a second here
STOP_TIMEOUT_S = 15.0
START_ATTEMPTS = 3  # a free port can be taken between our probe and postgres's bind: try another
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def find_bin_dir() -> Path | None:
    """The directory holding initdb and postgres: PATH's initdb first (resolved: Debian puts only symlinks on
    PATH, if anything), else the newest major version under /usr/lib/postgresql."""
    candidates = []
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)
    numbered = DEBIAN_VERSIONS.glob("*/bin")
    candidates += sorted(numbered, key=lambda path: major_version(path.parent.name), reverse=True)
    for directory in candidates:
        if all(os.access(directory / tool, os.X_OK) for tool in ("initdb", "postgres")):
            return directory
    return None


def major_version(name: str) -> tuple[int, ...]:
    """'15' -> (15,), '9.6' -> (9, 6); anything else sorts first."""
    return tuple(int(part) for part in name.split(".")) if re.fullmatch(r"\d+(\.\d+)*", name) else ()


def unavailable_reason() -> str | None:
    """Why a throwaway server cannot run here (missing binaries, psycopg or, as root, the postgres user); None
    when it can."""
    if find_bin_dir() is None:
        where = f"on PATH or in {DEBIAN_VERSIONS}/*/bin"
        return f"no PostgreSQL server (initdb and postgres) {where}; run scripts/setup_postgres.sh"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed; pip install -r requirements-test.txt"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(SERVER_USER)
        except KeyError:
            return f"running as root needs a {SERVER_USER!r} user to run the server as; run scripts/setup_postgres.sh"
    return None


def free_loopback_port() -> int:
    """A port nobody listens on at 127.0.0.1 right now (the kernel's pick for port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


def remove_stale_dirs(parent: Path | None = None) -> list[Path]:
    """Remove the directories of runs that died without cleaning up (SIGKILL, a power cut); their servers died
    with them. A dir stays while its run, or a server in it, is alive. Returns what was removed."""
    removed = []
    for directory in Path(parent or tempfile.gettempdir()).glob(DIR_PREFIX + "*"):
        owner = re.match(re.escape(DIR_PREFIX) + r"(\d+)-", directory.name)
        if not owner or pid_alive(int(owner[1])):
            continue
        pid_file = directory / "data" / "postmaster.pid"
        try:
            postmaster = int(pid_file.read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            postmaster = None
        if postmaster is not None and pid_alive(postmaster):
            continue
        shutil.rmtree(directory, ignore_errors=True)
        removed.append(directory)
    return removed


# ==== Starting the postmaster from a thread that lives as long as the process ====
#
# PR_SET_PDEATHSIG fires when the *thread* that forked the child ends, not the process. The main thread lasts
# until exit; a test that calls start() from a short-lived thread (a timer bringing the database back) would
# see its server die with that thread, so other threads hand the spawn to one daemon thread that never ends.

# Resolved here, not in the child between fork and exec. Linux only: elsewhere close() at exit is all there is.
_PRCTL = getattr(ctypes.CDLL(None, use_errno=True), "prctl", None)
_SPAWN_REQUESTS: queue.Queue = queue.Queue()
_SPAWNER: threading.Thread | None = None
_SPAWNER_LOCK = threading.Lock()


def _spawn_dying_with_this_thread(args: list[str], kwargs: dict[str, Any]) -> subprocess.Popen:
    parent = os.getpid()

    def die_with_parent() -> None:
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGQUIT)  # SIGQUIT: postgres's immediate shutdown, children too
        if os.getppid() != parent:  # the parent died before the prctl took
            os._exit(1)

    return subprocess.Popen(args, preexec_fn=die_with_parent if _PRCTL else None, **kwargs)


def _serve_spawn_requests() -> None:
    while True:
        args, kwargs, reply = _SPAWN_REQUESTS.get()
        try:
            reply.put(_spawn_dying_with_this_thread(args, kwargs))
        except BaseException as error:  # handed to the caller, raised there
            reply.put(error)


def spawn_dying_with_us(args: list[str], **kwargs: Any) -> subprocess.Popen:
    """Popen whose child gets SIGQUIT when this process dies, however it dies."""
    global _SPAWNER
    if threading.current_thread() is threading.main_thread():
        return _spawn_dying_with_this_thread(args, kwargs)
    with _SPAWNER_LOCK:
        if _SPAWNER is None:
            _SPAWNER = threading.Thread(target=_serve_spawn_requests, name="pg-spawner", daemon=True)
            _SPAWNER.start()
    reply: queue.Queue = queue.Queue()
    _SPAWN_REQUESTS.put((args, kwargs, reply))
    outcome = reply.get()
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


# ==== The server ====


class ThrowawayPostgres:
    """One PostgreSQL server of our own: initdb into a temp dir, listening on 127.0.0.1 only, trust auth for
    the superuser `postgres` (loopback and a socket in the temp dir; it lives as long as the test run).

    Use it as a context manager, or call close(); either stops the server and removes its directory.
    """

    def __init__(self, bin_dir: Path | None = None):
        self.bin_dir = bin_dir or find_bin_dir()
        if self.bin_dir is None:
            raise RuntimeError(unavailable_reason() or "no PostgreSQL server binaries")
        remove_stale_dirs()
        self.dir = Path(tempfile.mkdtemp(prefix=f"{DIR_PREFIX}{os.getpid()}-"))
        self.data_dir = self.dir / "data"
        self.log_path = self.dir / "server.log"
        self.port = 0
        self.process: subprocess.Popen | None = None
        self._user_switch: dict[str, Any] = {}  # Popen's user/group/extra_groups when we are root
        self._admin_connection: Any = None
        self._lock = threading.RLock()
        self._database_numbers = itertools.count(1)
        atexit.register(self.close)
        try:
            self._as_server_user()
            self._initdb()
            self._start_on_a_free_port()
        except BaseException:
            self.close()
            raise

    # -- what a test uses --

    @property
    def url(self) -> str:
        """The superuser's URL of the `postgres` database."""
        return self.url_of("postgres")

    def url_of(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def fresh_database(self, template: str | None = None) -> str:
        """The URL of a new, empty database (a copy of template1, or of `template`: a database holding a schema
        already, which then must have no open connection)."""
        from psycopg import sql

        name = f"solos_test_{next(self._database_numbers)}"
        statement = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template:
            statement += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
        with self._lock:
            self._admin().execute(statement)
        return self.url_of(name)

    def drop_database(self, url: str) -> None:
        """Drop a database fresh_database made, cutting any connection a test left open (WITH FORCE)."""
        from psycopg import sql

        name = urlsplit(url).path.lstrip("/")
        with self._lock:
            self._admin().execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))

    def stop(self) -> None:
        """A clean shutdown (SIGINT: what `pg_ctl stop -m fast` sends): connections are cut, a checkpoint is
        written. start() brings it back on the same port and data."""
        self._shut_down(signal.SIGINT)

    def kill(self) -> None:
        """The database going away at once, as in a crash (SIGQUIT: postgres's immediate shutdown): connections
        are cut, no checkpoint, and the next start() runs crash recovery. Committed data survives, as it would.
        Not a SIGKILL of the postmaster alone: a backend busy in a query runs on until it notices, and a restart
        meanwhile can be refused (its old shared memory still in use); this one returns with every backend gone."""
        self._shut_down(signal.SIGQUIT)

    def start(self) -> None:
        """Start again after stop() or kill(): the same port and data directory. Returns once it accepts
        connections. Does nothing while it runs."""
        with self._lock:
            if self.running:
                return
            self._launch()
            self._wait_until_ready()

    def close(self) -> None:
        """Stop the server and remove its directory; safe to call twice (it also runs at exit)."""
        with self._lock:
            self.kill()  # no shutdown checkpoint: its data is about to go (seconds saved after many databases)
            shutil.rmtree(self.dir, ignore_errors=True)
        atexit.unregister(self.close)

    def start_standby(self, name: str) -> subprocess.Popen:
        """A streaming standby of this server (pg_basebackup into the temp dir, a free loopback port), connecting
        as application_name `name`: named in synchronous_standby_names, every commit waits for its flush, as in
        the cluster's synchronous mode (deploy/cluster/). It dies with this process; stop it with SIGINT."""
        standby_dir = self.dir / f"standby-{name}"
        command = [str(self.bin_dir / "pg_basebackup"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres"]
        command += ["-D", str(standby_dir), "-X", "stream", "-R", "--checkpoint=fast"]  # spread: minutes
        subprocess.run(command, cwd=self.dir, capture_output=True, timeout=120, check=True, **self._user_switch)
        settings = {
            "port": free_loopback_port(),
            "listen_addresses": "127.0.0.1",
            "unix_socket_directories": self.dir,
            "dynamic_shared_memory_type": "mmap",
            "primary_conninfo": f"host=127.0.0.1 port={self.port} user=postgres application_name={name}",
        }
        command = [str(self.bin_dir / "postgres"), "-D", str(standby_dir)]
        command += [part for key, value in settings.items() for part in ("-c", f"{key}={value}")]
        with open(self.dir / f"standby-{name}.log", "ab") as log:
            return spawn_dying_with_us(
                command, cwd=self.dir, stdin=subprocess.DEVNULL, stdout=log, stderr=log, **self._user_switch
            )

    def log_tail(self, lines: int = 20) -> str:
        """The end of the server's log, for failure messages."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def __enter__(self) -> ThrowawayPostgres:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- how --

    def _as_server_user(self) -> None:
        """As root, hand the temp dir to postgres and run the children as postgres; otherwise as ourselves."""
        if os.geteuid() != 0:
            return
        account = pwd.getpwnam(SERVER_USER)
        os.chown(self.dir, account.pw_uid, account.pw_gid)
        self._user_switch = {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}

    def _initdb(self) -> None:
        # C.UTF-8: Unicode-aware lower() and text search on every machine, no generated locale needed.
        # --no-sync: a throwaway cluster need not survive a power cut; the server itself keeps fsync on.
        command = [
            str(self.bin_dir / "initdb"),
            *("-D", str(self.data_dir), "-U", "postgres", "--auth=trust"),
            *("--encoding=UTF8", "--locale=C.UTF-8", "--no-sync", "--no-instructions"),
        ]
        done = subprocess.run(
            command, cwd=self.dir, capture_output=True, text=True, timeout=120, check=False, **self._user_switch
        )
        if done.returncode != 0:
            raise RuntimeError(f"initdb exited {done.returncode}:\n{done.stdout}{done.stderr}")

    def _start_on_a_free_port(self) -> None:
        for attempt in range(1, START_ATTEMPTS + 1):
            self.port = free_loopback_port()
            self._launch()
            try:
                self._wait_until_ready()
                return
            except RuntimeError:
                if attempt == START_ATTEMPTS:
                    raise

    def _launch(self) -> None:
        settings = {
            "port": self.port,
            "listen_addresses": "127.0.0.1",
            "unix_socket_directories": self.dir,  # not /var/run/postgresql: the package's own server's place
            # Dynamic shared memory as files in the data dir, not in /dev/shm: kill() (an immediate shutdown)
            # leaves its segments behind, in RAM until a reboot there, and removed with the directory here.
            "dynamic_shared_memory_type": "mmap",
        }
        command = [str(self.bin_dir / "postgres"), "-D", str(self.data_dir)]
        command += [part for name, value in settings.items() for part in ("-c", f"{name}={value}")]
        with open(self.log_path, "ab") as log:
            self.process = spawn_dying_with_us(
                command, cwd=self.dir, stdin=subprocess.DEVNULL, stdout=log, stderr=log, **self._user_switch
            )

    def _wait_until_ready(self) -> None:
        """Connect until it answers (crash recovery included), and check it is ours: whoever won the race for
        the port must not pass for our server. On failure our server is shut down and the error says why."""
        import psycopg

        deadline = time.monotonic() + READY_TIMEOUT_S
        while self.running:
            try:
                connection = psycopg.connect(self.url, autocommit=True, connect_timeout=2)
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.01)
                continue
            served_from = connection.execute("SHOW data_directory").fetchone()[0]
            if Path(served_from) == self.data_dir:
                self._admin_connection = connection
                return
            connection.close()
            self._shut_down(signal.SIGQUIT)
            raise RuntimeError(f"port {self.port} answers from {served_from}, not from {self.data_dir}")
        exited = self.process.poll() if self.process else None
        self._shut_down(signal.SIGQUIT)
        problem = f"exited {exited}" if exited is not None else f"accepted no connection in {READY_TIMEOUT_S} s"
        raise RuntimeError(f"postgres on port {self.port} {problem}:\n{self.log_tail()}")

    def _admin(self) -> Any:
        """The superuser's autocommit connection to `postgres`, kept open: CREATE DATABASE needs autocommit,
        and a new connection per call would add ~10 ms each."""
        import psycopg

        if self._admin_connection is None or self._admin_connection.closed:
            self._admin_connection = psycopg.connect(self.url, autocommit=True, connect_timeout=5)
        return self._admin_connection

    def _forget_admin(self) -> None:
        if self._admin_connection is not None:
            self._admin_connection.close()
            self._admin_connection = None

    def _shut_down(self, how: signal.Signals) -> None:
        with self._lock:
            self._forget_admin()
            process = self.process
            if process is None or process.poll() is not None:
                return
            process.send_signal(how)
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
