"""The fleet's database: additive schema, startup checks, admin CLI, the acceptance story."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, call, refused_at_start, service, skip_or_fail, wait_until

import solos_memory
import solos_store

FLEET_SCHEMA = """
CREATE TABLE agent_registry (agent TEXT PRIMARY KEY, role TEXT, created_at TEXT);
CREATE TABLE memory_durable (id INTEGER PRIMARY KEY, key TEXT UNIQUE, value TEXT, updated_at TEXT);
CREATE TABLE memory_longterm (id INTEGER PRIMARY KEY, agent TEXT, topic TEXT, fact TEXT, source TEXT,
    confidence REAL, tags TEXT, embedding BLOB, created_at TEXT, updated_at TEXT, extra_fleet_column TEXT);
CREATE TABLE memory_episodic (id INTEGER PRIMARY KEY, agent TEXT, event_type TEXT, summary TEXT, details TEXT,
    outcome TEXT, duration_s REAL, timestamp TEXT);
INSERT INTO agent_registry (agent) VALUES ('atlas'), ('sol');
INSERT INTO memory_longterm (agent, topic, fact, updated_at)
    VALUES ('atlas', 'legacy', 'pre-existing fact about gliders', '2026-01-01T00:00:00.000Z');
INSERT INTO memory_episodic (agent, event_type, summary, timestamp)
    VALUES ('sol', 'task', 'pre-existing episode about kites', '2026-01-01T00:00:00.000Z');
PRAGMA user_version = 42;
"""


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "solos_memory.py"), *args], capture_output=True, text=True, timeout=60, cwd=cwd
    )


def fleet_db(path: Path, schema: str = FLEET_SCHEMA) -> Path:
    conn = sqlite3.connect(path)
    conn.executescript(schema)
    conn.close()
    return path


def test_schema_sql_is_additive_only():
    sql = (ROOT / "schema.sql").read_text()
    code = re.sub(r"--[^\n]*", "", sql)
    statements = [
        s.strip() for s in re.split(r";\s*(?:\n|$)", re.sub(r"BEGIN.*?END;", "TRIGGER;", code, flags=re.S)) if s.strip()
    ]
    own_tables = set(re.findall(r"CREATE TABLE IF NOT EXISTS (\w+)", code))
    for statement in statements:
        if statement == "TRIGGER":
            continue
        # A backfill may fill a table this file creates, once (OR IGNORE), never touch an existing one.
        backfill = re.match(r"INSERT OR IGNORE INTO (\w+)", statement)
        if backfill:
            assert backfill.group(1) in own_tables, statement
            continue
        assert re.match(r"CREATE (TABLE|INDEX|VIRTUAL TABLE|TRIGGER) IF NOT EXISTS", statement), statement
    assert not re.search(r"\b(ALTER|DROP)\b", code, re.I)


# Each release's commit (the repository has no tags): a database its service wrote must serve on this one.
RELEASES = {"0.1.0": "1eb6e3d", "0.2.0": "aee26a7", "0.3.0": "b7aa5ee"}
GROWING = {"memory_activity"}  # per-minute counters: this service adds its own calls to the same minute


def table_rows(db: Path) -> dict[str, set[tuple]]:
    """Every ordinary table's rows (the keyword indexes' shadow tables left out)."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        names = [
            row[0]
            for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND sql NOT LIKE '%VIRTUAL%'")
            if not row[0].startswith("sqlite_") and "_fts" not in row[0]
        ]
        return {name: set(conn.execute(f'SELECT * FROM "{name}"')) for name in names}


@pytest.mark.slow
@pytest.mark.parametrize("release", sorted(RELEASES))
def test_serve_on_a_database_an_earlier_release_wrote_keeps_every_row_and_adds_the_new_tables(tmp_path, release):
    """docs/upgrading.md's promise, run: stop the old service, start this one on its file. Nothing it wrote is
    lost or changed (but the schema version and the counters of the minute), and this schema's tables appear."""
    old = tmp_path / "old"
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", RELEASES[release]], capture_output=True, timeout=60)
    if archive.returncode:
        skip_or_fail(f"release {release} ({RELEASES[release]}) is not in this checkout")
    old.mkdir()
    subprocess.run(["tar", "-x", "-C", str(old)], input=archive.stdout, check=True, timeout=60)
    db = tmp_path / "solos.db"
    environ = {**os.environ, "SOLOS_MEMORY_MODEL_DIR": "off"}
    argv = ["serve", "--db", str(db), "--port", "0"]
    with service(
        [sys.executable, str(old / "solos_memory.py"), *argv, "--register", "atlas,sol"], environ, tmp_path
    ) as (
        port,
        _,
    ):
        for path, body in (
            ("/v1/long", {"agent": "atlas", "topic": "infra", "fact": "The staging database moved to host kestrel."}),
            ("/v1/episodic", {"agent": "sol", "event_type": "deploy", "summary": "sol deployed build 42"}),
            ("/v1/short", {"agent": "atlas", "key": "mood", "value": "calm weather"}),
        ):
            assert call(port, "POST", path, body)[0] == 201
        assert call(port, "PUT", "/v1/sharing", {"agent": "sol", "episodic": True})[0] in (200, 201)
        assert call(port, "GET", "/v1/recall?agent=atlas&q=deployed+build&tiers=episodic")[1]["count"] == 1
    before = table_rows(db)

    with service([sys.executable, str(ROOT / "solos_memory.py"), *argv, "--model-dir", "off"], cwd=tmp_path) as (
        port,
        _,
    ):
        for query, text in (
            ("q=staging+database", "kestrel"),
            ("q=deployed+build&tiers=episodic", "build 42"),
            ("q=mood&tiers=short", "calm weather"),
        ):
            results = call(port, "GET", f"/v1/recall?agent=sol&{query}")[1]["results"]
            assert [row for row in results if text in row["text"]], (query, results)
    after = table_rows(db)

    changed = {
        name: sorted(rows - after.get(name, set()))
        for name, rows in before.items()
        if name not in GROWING and rows - after.get(name, set())
    }
    if "solos_memory_meta" in changed:  # the one value a start may change: the schema's version
        changed["solos_memory_meta"] = [row for row in changed["solos_memory_meta"] if row[0] != "schema_version"]
    assert not {name: rows for name, rows in changed.items() if rows}, changed
    own = set(re.findall(r"CREATE TABLE IF NOT EXISTS (\w+)", (ROOT / "schema.sql").read_text()))
    assert own <= set(after), sorted(own - set(after))


def test_existing_fleet_database_is_adopted_without_changing_its_tables(make_server, tmp_path):
    path = fleet_db(tmp_path / "fleet.db")
    before = sqlite3.connect(path)
    columns_before = {
        t: before.execute(f"SELECT sql FROM sqlite_master WHERE name = '{t}'").fetchone()[0]
        for t in ("agent_registry", "memory_durable", "memory_longterm", "memory_episodic")
    }
    before.close()
    server = make_server("fleet.db")
    reply = server.recall("sol", "gliders")
    assert [(r["agent"], r["text"]) for r in reply.body["results"]] == [("atlas", "pre-existing fact about gliders")]
    assert server.request("PUT", "/v1/sharing", body={"agent": "sol", "episodic": True}).status == 201
    episodes = server.recall("atlas", "kites", tiers="episodic")
    assert [r["text"] for r in episodes.body["results"]] == ["pre-existing episode about kites"]
    with server.db() as conn:
        for table, sql in columns_before.items():
            assert conn.execute("SELECT sql FROM sqlite_master WHERE name = ?", (table,)).fetchone()[0] == sql
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 42  # the fleet's, untouched
        assert (
            conn.execute("SELECT value FROM solos_memory_meta WHERE key = 'schema_version'").fetchone()[0]
            == solos_store.SCHEMA_VERSION
        )
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


@pytest.mark.slow
@pytest.mark.parametrize(
    "table,column",
    [
        ("memory_longterm", "fact"),
        ("memory_episodic", "summary"),
        ("agent_registry", "agent"),
        ("memory_durable", "key"),
    ],
)
def test_startup_refuses_a_database_missing_a_needed_column(tmp_path, table, column):
    schema = FLEET_SCHEMA.split("INSERT")[0]
    broken = re.sub(
        rf"(CREATE TABLE {table} \(.*?)\b{column} [A-Z]+( UNIQUE| PRIMARY KEY)?,?", r"\1", schema, flags=re.S
    )
    broken = broken.replace(", )", ")").replace(",)", ")")
    assert broken != schema
    path = fleet_db(tmp_path / "broken.db", broken)
    run = cli("serve", "--db", str(path), "--port", "0")
    assert run.returncode != 0
    assert f"table {table} has no column {column}" in run.stderr
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT count(*) FROM sqlite_master WHERE name = 'memory_short'").fetchone()[0] == 0
    conn.close()


@pytest.mark.slow
def test_agents_add_and_list(tmp_path):
    db = str(tmp_path / "solos.db")
    added = cli("agents", "add", "atlas", "sol", "--db", db)
    assert added.returncode == 0 and "registered 2 new of 2" in added.stdout
    again = cli("agents", "add", "sol", "nova", "--db", db)
    assert "registered 1 new of 2: nova" in again.stdout
    assert cli("agents", "list", "--db", db).stdout.split() == ["atlas", "nova", "sol"]
    bad = cli("agents", "add", "not valid!", "--db", db)
    assert bad.returncode != 0 and "not valid!" in bad.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["agents", "--db", "{db}", "add", "atlas"],
        ["agents", "add", "--db", "{db}", "atlas"],
        ["agents", "add", "atlas", "--db", "{db}"],
        ["agents", "--db", "{elsewhere}", "add", "--db", "{db}", "atlas"],  # the nearer one wins
    ],
)
def test_agents_add_writes_the_db_it_is_given_wherever_the_flag_stands(tmp_path, monkeypatch, argv):
    monkeypatch.chdir(tmp_path)  # a regression wrote ./solos.db: make that visible
    db, elsewhere = tmp_path / "given.db", tmp_path / "elsewhere.db"
    argv = [part.format(db=db, elsewhere=elsewhere) for part in argv]
    assert solos_memory.main(argv) == 0
    assert not (tmp_path / "solos.db").exists() and not elsewhere.exists()
    conn = sqlite3.connect(db)
    assert [row[0] for row in conn.execute("SELECT agent FROM agent_registry")] == ["atlas"]
    conn.close()


@pytest.mark.parametrize("command", [["agents", "list"], ["purge"], ["reindex"], ["agents", "--db", "{db}", "list"]])
def test_every_admin_subcommand_uses_its_db(tmp_path, monkeypatch, capsys, command):
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "given.db"
    assert solos_memory.main(["agents", "add", "nova", "--db", str(db)]) == 0
    argv = [part.format(db=db) for part in command]
    if "--db" not in argv:
        argv += ["--db", str(db)]
    assert solos_memory.main(argv) == 0
    assert not (tmp_path / "solos.db").exists()
    if command[-1] == "list":
        assert capsys.readouterr().out.split()[-1] == "nova"


def test_one_config_carries_every_flag_to_the_command(monkeypatch, tmp_path):
    seen = []
    monkeypatch.setattr(solos_memory, "load_embedder", lambda config, threads=1: seen.append(config) or (None, "-"))
    monkeypatch.setattr(solos_memory.solos_embed_worker, "backfill", lambda store, loaded, batch: 0)
    db = str(tmp_path / "solos.db")
    assert solos_memory.main(["agents", "add", "--db", db, "atlas"]) == 0  # backfill needs one there
    argv = ["backfill", "--db", db, "--busy-timeout-ms", "1234", "--model-dir", "off"]
    assert solos_memory.main(argv) == 0
    assert seen == [solos_memory.Config(db=db, busy_timeout_ms=1234, model_dir="off")]


def test_the_check_db_help_says_it_must_exist(capsys):
    with pytest.raises(SystemExit):
        solos_memory.main(["check", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "must exist" in help_text and "created" not in help_text


@pytest.mark.slow
def test_purge_deletes_only_expired_short_rows(server):
    server.post("/v1/short", {"agent": "atlas", "key": "old", "value": "v", "ttl_s": 0.01})
    server.post("/v1/short", {"agent": "atlas", "key": "new", "value": "v", "ttl_s": 600})
    import time

    time.sleep(0.05)
    run = cli("purge", "--db", str(server.db_path))
    assert run.returncode == 0
    assert json.loads(run.stderr.strip().splitlines()[-1])["rows"] == 1
    with server.db() as conn:
        assert [r[0] for r in conn.execute("SELECT key FROM memory_short")] == ["new"]


@pytest.mark.slow
def test_purge_fails_loudly_when_the_database_is_locked(server):
    """A fleet writer holds the lock past the purge's busy timeout: the purge fails, and once the lock is free
    (its record waits for it) exits 1 with a `failed` line."""
    command = [sys.executable, str(ROOT / "solos_memory.py"), "purge", "--db", str(server.db_path)]
    with server.db() as conn:
        conn.execute("BEGIN EXCLUSIVE")
        purge = subprocess.Popen([*command, "--busy-timeout-ms", "200"], stderr=subprocess.PIPE, text=True)
        time.sleep(1.0)  # the lock held well past the busy timeout: the purge itself fails
        conn.execute("ROLLBACK")
    _, stderr = purge.communicate(timeout=60)
    assert purge.returncode == 1
    assert json.loads(stderr.strip().splitlines()[-1])["event"] == "failed"


def test_serve_refuses_a_non_loopback_address_without_the_flag(tmp_path):
    run = cli("serve", "--db", str(tmp_path / "x.db"), "--host", "0.0.0.0", "--port", "0")
    assert run.returncode != 0 and "refusing to bind 0.0.0.0" in run.stderr and "--allow-remote" in run.stderr


def test_main_returns_the_exit_status(tmp_path):
    assert solos_memory.main(["agents", "add", "atlas", "--db", str(tmp_path / "m.db")]) == 0
    with pytest.raises(SystemExit):
        solos_memory.main(["nonsense"])


def test_acceptance_story_atlas_writes_sol_recalls(server):
    """The fleet spec's story: atlas writes, sol recalls it as atlas's, foreign; rows rise by distinct writes."""
    with server.db() as conn:
        before = conn.execute("SELECT count(*) FROM memory_longterm").fetchone()[0]
    facts = [
        "The fleet's staging cluster is called heron.",
        "Backups are verified every Sunday.",
        "The fleet's staging cluster is called heron.",
    ]  # the third is a repeat: one row, updated
    for fact in facts:
        assert server.post("/v1/long", {"agent": "atlas", "topic": "fleet", "fact": fact}).status in (200, 201)
    reply = server.recall("sol", "staging cluster heron")
    top = reply.body["results"][0]
    assert (top["agent"], top["foreign"], top["text"]) == ("atlas", True, facts[0])
    with server.db() as conn:
        after = conn.execute("SELECT count(*) FROM memory_longterm").fetchone()[0]
    assert after - before == len(set(facts))


def test_check_command_is_part_of_the_service_cli(server, capsys):
    argv = ["check", "--url", server.url, "--writer", "atlas", "--reader", "sol", "--a2a-ports", "none"]
    assert solos_memory.main(argv) == 0
    table = capsys.readouterr().out
    assert "6/6 checks passed" in table
    assert solos_memory.main(["check", "--cleanup", "--db", str(server.db_path)]) == 0
    with server.db() as conn:
        assert conn.execute("SELECT count(*) FROM memory_longterm WHERE source = 'solos-check'").fetchone()[0] == 0


@pytest.mark.slow
def test_sigterm_stops_the_service_cleanly(tmp_path):
    import signal

    process = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "solos_memory.py"),
            "serve",
            "--db",
            str(tmp_path / "s.db"),
            "--port",
            "0",
            "--model-dir",
            "off",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        listening = json.loads(process.stderr.readline())
        assert listening["event"] == "listening"
        assert listening["judge"]["state"] == "ready"  # the startup line says what recall's relevance is
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
        assert json.loads(process.stderr.readline())["event"] == "stopped"
    finally:
        process.kill()


@pytest.mark.parametrize("workers", ["1", "2"])
def test_serve_tells_systemd_it_is_ready_once_it_answers_and_that_it_stops(tmp_path, workers):
    """The unit is Type=notify: `systemctl start` returns at READY=1, sent once the port answers, so the install
    steps' `check` right after it finds the service (a first start builds the model for 4-10 s), and a start that
    fails is reported failed, not `active`. With Type=simple it was `active` from the fork on."""
    import signal
    import socket
    import urllib.request

    notify_path = tmp_path / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
        notify.bind(str(notify_path))
        notify.settimeout(30)
        command = [sys.executable, str(ROOT / "solos_memory.py"), "serve", "--db", str(tmp_path / "r.db")]
        process = subprocess.Popen(
            [*command, "--port", "0", "--model-dir", "off", "--workers", workers],
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "NOTIFY_SOCKET": str(notify_path)},
        )
        try:
            ready = notify.recv(4096).decode()
            assert ready.splitlines()[0] == "READY=1", ready
            lines = iter(process.stderr)  # type: ignore[arg-type]
            listening = next(line for line in map(json.loads, lines) if line["event"] == "listening")
            health = urllib.request.urlopen(f"http://127.0.0.1:{listening['port']}/health", timeout=10)
            assert health.status == 200 and f"STATUS=listening on 127.0.0.1:{listening['port']}" in ready
            process.send_signal(signal.SIGTERM)
            assert notify.recv(4096).decode().splitlines()[0] == "STOPPING=1"
            assert process.wait(timeout=30) == 0
            notify.settimeout(0.5)
            with pytest.raises(TimeoutError):  # the main process alone speaks: no worker's READY or STOPPING
                print(notify.recv(4096))
        finally:
            process.kill()
            process.wait()


@pytest.mark.parametrize("command", [["agents", "add"], ["agents", "list"], ["serve"], ["purge"], ["backfill"]])
def test_every_database_command_prints_its_help(command, capsys):
    """`agents add --help` failed with KeyError: its options have no default for %(default)s to show."""
    with pytest.raises(SystemExit) as exit_info:
        solos_memory.main([*command, "--help"])
    assert exit_info.value.code == 0
    assert "--db" in capsys.readouterr().out


BAD_NUMBERS = [
    (["serve", "--port", "70000"], {}, "--port", "0-65535"),
    (["serve", "--port", "-1"], {}, "--port", "0-65535"),
    (["serve"], {"SOLOS_MEMORY_PORT": "65536"}, "--port", "SOLOS_MEMORY_PORT"),
    (["serve", "--port", "0", "--busy-timeout-ms", "-5"], {}, "--busy-timeout-ms", "0-2147483647"),
    (["serve", "--port", "0", "--busy-timeout-ms", "3000000000"], {}, "--busy-timeout-ms", "0-2147483647"),
    (["serve", "--port", "0"], {"SOLOS_MEMORY_BUSY_TIMEOUT_MS": "-1"}, "--busy-timeout-ms", "SOLOS_MEMORY_BUSY"),
    (["serve", "--port", "0", "--admit", "-1"], {}, "--admit", "0 or more"),  # was: no cap, silently
    (["serve", "--port", "0"], {"SOLOS_MEMORY_ADMIT": "-4"}, "--admit", "SOLOS_MEMORY_ADMIT"),
    (["purge"], {"SOLOS_MEMORY_ARCHIVE_AFTER_DAYS": "thirty"}, "--archive-after-days", "SOLOS_MEMORY_ARCHIVE"),
    (["purge", "--archive-after-days", "-3"], {}, "--archive-after-days", "0 or more"),  # was: never, silently
    (["purge", "--archive-after-days", "nan"], {}, "--archive-after-days", "0 or more"),
    (["backfill", "--batch", "0", "--model-dir", "off"], {}, "--batch", "1 or more"),  # was: nothing, exit 0
    (["backfill", "--batch", "-1", "--model-dir", "off"], {}, "--batch", "1 or more"),
    (["serve", "--port", "0", "--workers", "0"], {}, "--workers", "1-64"),
    (["serve", "--port", "0", "--workers", "999"], {}, "--workers", "1-64"),  # was: 999 processes forked
    (["serve", "--port", "0"], {"SOLOS_MEMORY_WORKERS": "65"}, "--workers", "1-64"),
]


@pytest.mark.parametrize("argv, environment, option, reason", BAD_NUMBERS)
def test_a_number_out_of_range_stops_the_command_naming_the_option(tmp_path, argv, environment, option, reason):
    """A bad number (flag or environment) is one line naming the option, exit 2, nothing opened: never a
    traceback (a port past 65535, a negative busy timeout) or a silent other meaning (--admit -1: no cap)."""
    db = tmp_path / "n.db"
    argv = [argv[0], "--db", str(db), *argv[1:], *(["--model-dir", "off"] * (argv[0] == "serve"))]
    last = refused_at_start(
        argv, {**{k: v for k, v in os.environ.items() if not k.startswith("SOLOS_MEMORY_")}, **environment}
    )
    assert option in last and reason in last, last
    assert not db.exists()


@pytest.mark.parametrize("command", ["serve", "backfill"])
@pytest.mark.parametrize("given", ["missing", "file"])
def test_a_model_dir_that_is_no_folder_stops_the_command(tmp_path, command, given):
    """A mistyped --model-dir (or SOLOS_MEMORY_MODEL_DIR) served keyword-only, degraded, as if the embedder were
    not installed: the operator asked for a model and got none. A folder that lacks the files still degrades."""
    folder = tmp_path / "model"
    if given == "file":
        folder.write_text("not a folder")
    argv = [
        command,
        "--db",
        str(tmp_path / "m.db"),
        "--model-dir",
        str(folder),
        *(["--port", "0"] * (command == "serve")),
    ]
    last = refused_at_start(argv)
    assert "--model-dir" in last and "a folder or off" in last and str(folder) in last, last
    assert not (tmp_path / "m.db").exists()


@pytest.mark.parametrize("switch", ["0", "false", "of", "features-only"])
def test_a_judge_switch_the_service_does_not_know_stops_serve(tmp_path, switch):
    """SOLOS_MEMORY_JUDGE takes off, features or on: `0` or `false` (meant as off) ran the judge as if unset."""
    environ = {**os.environ, "SOLOS_MEMORY_JUDGE": switch}
    argv = [sys.executable, str(ROOT / "solos_memory.py"), "serve", "--db", str(tmp_path / "j.db"), "--port", "0"]
    try:
        run = subprocess.run([*argv, "--model-dir", "off"], capture_output=True, text=True, timeout=30, env=environ)
    except subprocess.TimeoutExpired:
        pytest.fail(f"SOLOS_MEMORY_JUDGE={switch} started the service")
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    assert run.stderr.strip().splitlines()[-1] == f"SOLOS_MEMORY_JUDGE must be off, features or on, got {switch!r}"
    assert not (tmp_path / "j.db").exists()


@pytest.mark.parametrize("command", ["serve", "purge", "agents list"])
@pytest.mark.parametrize("given", ["", ":memory:"])
def test_a_database_that_is_no_file_stops_the_command_naming_db(tmp_path, monkeypatch, command, given):
    """An empty SOLOS_MEMORY_DB= line (or --db "") was a ValueError traceback in serve and "WAL could not be
    enabled (is the folder writable?)" in the admin commands; :memory: was told the same."""
    monkeypatch.chdir(tmp_path)
    environ = {**os.environ, "SOLOS_MEMORY_DB": given}
    for argv in ([*command.split(), "--db", given], command.split()):  # the flag, then the environment
        last = refused_at_start([*argv, *(["--port", "0", "--model-dir", "off"] * (command == "serve"))], environ)
        assert "--db" in last and "a database file or a postgresql:// URL" in last and repr(given) in last, last
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["serve", "agents list", "purge"])
@pytest.mark.parametrize("where", ["a folder", "in no folder"])
def test_a_database_path_sqlite_cannot_open_says_why(tmp_path, command, where):
    """--db naming a folder, or a file in a folder that does not exist (a typo in SOLOS_MEMORY_DB), was "the
    database file cannot be opened (unable to open database file)": the operator was left to guess which."""
    db = tmp_path if where == "a folder" else tmp_path / "typo" / "solos.db"
    run = cli(*command.split(), "--db", str(db), *(["--port", "0", "--model-dir", "off"] * (command == "serve")))
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    last = run.stderr.strip().splitlines()[-1]
    said = "is a folder, not a database file" if where == "a folder" else f"its folder {db.parent} does not exist"
    assert said in last, last
    assert not (tmp_path / "typo").exists()


def started_service(db: Path, *extra: str) -> tuple[subprocess.Popen, int]:
    """`serve` in a process of its own on a free port, keyword-only; its port from the listening line.

    Ctrl-C reaches it as it reaches a service run in a terminal: a suite started in the background (`make test &`,
    a CI step's) ignores SIGINT, and a child inherits that, so the tests' SIGINT stopped nothing."""
    import signal

    command = [sys.executable, str(ROOT / "solos_memory.py"), "serve", "--db", str(db), "--port", "0"]
    process = subprocess.Popen(
        [*command, "--model-dir", "off", "--register", "atlas", *extra],
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    listening = json.loads(process.stderr.readline())
    assert listening["event"] == "listening", listening
    return process, listening["port"]


def a_write_in_flight(port: int) -> bool:
    """Whether the service is handling a request besides the one asking (a write waiting for the lock)."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/v1/stats")
        return json.loads(conn.getresponse().read())["load"]["in_flight"] >= 2
    finally:
        conn.close()


@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGINT"])
def test_a_stop_answers_the_write_in_flight_before_the_process_ends(tmp_path, signal_name):
    """systemd's stop (or Ctrl-C) during a write: the write is finished and answered, never cut off unanswered
    (the operator saw every in-flight write of a restart end in a connection reset, most of them committed)."""
    import http.client
    import signal
    import threading

    process, port = started_service(tmp_path / "s.db")
    try:
        locker = sqlite3.connect(tmp_path / "s.db", isolation_level=None)
        locker.execute("BEGIN IMMEDIATE")  # the fleet's writer holds the lock: the service's write waits for it
        answer: dict = {}

        def write() -> None:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            body = json.dumps({"agent": "atlas", "fact": "the boiler was serviced on tuesday"})
            try:
                conn.request("POST", "/v1/long", body, {"Content-Type": "application/json"})
                reply = conn.getresponse()
                answer.update(status=reply.status, headers=dict(reply.getheaders()), body=json.loads(reply.read()))
            except (OSError, http.client.HTTPException) as error:
                answer["error"] = repr(error)

        writer = threading.Thread(target=write)
        writer.start()
        wait_until(lambda: a_write_in_flight(port), "the write in flight, waiting for the lock")
        process.send_signal(getattr(signal, signal_name))
        time.sleep(0.5)
        locker.execute("COMMIT")  # the lock comes free within the write's busy timeout
        writer.join(30)
        assert process.wait(timeout=20) == 0
        assert answer.get("status") == 201, answer
        assert answer["headers"].get("Connection") == "close"  # told not to send another on this connection
        with sqlite3.connect(tmp_path / "s.db") as conn:
            facts = [row[0] for row in conn.execute("SELECT fact FROM memory_longterm")]
        assert facts == ["the boiler was serviced on tuesday"]
        stopped = [json.loads(line) for line in process.stderr.read().splitlines() if line.startswith("{")]
        assert stopped[-1]["event"] == "stopped" and stopped[-1]["unanswered"] == 0
    finally:
        process.kill()
        process.wait()


def test_a_second_ctrl_c_during_the_stop_ends_it_at_once_without_a_traceback(tmp_path):
    """The first Ctrl-C waits up to 10 s for the requests in flight; the second stopped that wait with a
    traceback and left the database unclosed. It ends the wait and says how many were left unanswered."""
    import http.client
    import signal
    import threading

    process, port = started_service(tmp_path / "s.db")
    locker = sqlite3.connect(tmp_path / "s.db", isolation_level=None)
    try:
        locker.execute("BEGIN IMMEDIATE")  # the service's write waits for the lock: in flight through the stop

        def write() -> None:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            body = json.dumps({"agent": "atlas", "fact": "written as the operator stops the service"})
            with contextlib.suppress(OSError, http.client.HTTPException):
                conn.request("POST", "/v1/long", body, {"Content-Type": "application/json"})
                conn.getresponse().read()

        threading.Thread(target=write, daemon=True).start()
        wait_until(lambda: a_write_in_flight(port), "the write in flight, waiting for the lock")
        process.send_signal(signal.SIGINT)
        time.sleep(0.5)
        process.send_signal(signal.SIGINT)  # while the first stop waits for the write
        time.sleep(0.2)
        process.send_signal(signal.SIGINT)  # and again while it closes
        locker.execute("COMMIT")
        assert process.wait(timeout=15) == 0
        lines = process.stderr.read().splitlines()
        assert not [line for line in lines if "Traceback" in line], lines
        stopped = [json.loads(line) for line in lines if line.startswith("{")][-1]
        assert stopped["event"] == "stopped" and stopped["unanswered"] == 1, stopped
    finally:
        locker.close()
        if process.poll() is None:
            process.kill()


def test_serve_binds_any_loopback_address_and_still_refuses_others(make_server):
    """127.0.0.0/8 is loopback (SECURITY.md: only a non-loopback address needs --allow-remote); 127.0.0.2 was
    refused as "not a loopback address"."""
    running = make_server(host="127.0.0.2")
    conn = http.client.HTTPConnection("127.0.0.2", running.port, timeout=10)
    conn.request("GET", "/health", headers={"Host": f"127.0.0.2:{running.port}"})
    assert conn.getresponse().status == 200
    for host in ("0.0.0.0", "10.1.2.3", "::", "127.example"):
        with pytest.raises(SystemExit, match=f"refusing to bind {re.escape(host)}: not a loopback address"):
            make_server(name="other.db", host=host)


@pytest.mark.parametrize("given", ["  ", "a\nb", "\t"])
def test_serve_refuses_a_copy_name_of_blanks_naming_the_flag(tmp_path, capsys, given):
    """--copy-name "  " served "  " as the copy in /health, /metrics and the page: no one could read which
    copy answered. An empty one keeps the default (host:port), as an empty SOLOS_MEMORY_COPY_NAME= line."""
    with pytest.raises(SystemExit) as stopped:
        solos_memory.main(["serve", "--db", str(tmp_path / "x.db"), "--port", "0", "--copy-name", given])
    assert stopped.value.code == 2 and "--copy-name" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    args = solos_memory.parse_args(["serve", "--copy-name", ""])
    assert solos_memory.config_from(args).copy_name == ""


@pytest.mark.parametrize("after_s", [0.1, 0.15, 0.25])
def test_ctrl_c_while_serve_starts_is_one_line_not_a_traceback(tmp_path, after_s):
    """Ctrl-C in serve's first ~0.1 s (its modules loading, the database opening) printed a KeyboardInterrupt
    traceback through whatever import it fell in; once listening it stops as it always did."""
    import signal

    command = [sys.executable, str(ROOT / "solos_memory.py"), "serve", "--db", str(tmp_path / "s.db"), "--port", "0"]
    process = subprocess.Popen([*command, "--model-dir", "off"], stderr=subprocess.PIPE, text=True)
    time.sleep(after_s)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert "Traceback" not in stderr, stderr
    if stderr and '"event": "listening"' not in stderr:  # interrupted before serving: one line, a failed exit
        assert stderr.strip().splitlines() == ["solos-memory: interrupted"], stderr
        assert process.returncode == 1
