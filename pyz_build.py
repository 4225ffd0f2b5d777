#!/usr/bin/env python3
"""Build dist/solos-memory.pyz, the service as one file for `python3 solos-memory.pyz serve`.

    python3 pyz_build.py [--out PATH] [--root DIR]

The archive holds the service's modules, schema.sql, the tokenizer files under
models/all-MiniLM-L6-v2/ and a __main__.py that exits with solos_memory.main().
Only stdlib code goes in: onnxruntime and tokenizers have native parts that
cannot load from a zip, so solos_embed imports them from the interpreter's
site-packages.

Same inputs give the same bytes: entries sorted, fixed timestamps and
permissions. The archive is zipapp's format (a shebang line, then a zip) but
written here with zipfile, because 3.11's zipapp.create_archive(directory)
walks in directory order and stamps each file's local-time mtime and mode, so
two checkouts give two archives; and handing it a prepared zip instead only
prepends the shebang, leaving offsets that `unzip -l` warns about.

The archive is written to a temp file beside the target, run with --version on
an interpreter without site-packages (so a third-party import at start-up
fails the build), and only then renamed into place: a failed build never
replaces a working archive.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent
DEFAULT_OUT = Path("dist") / "solos-memory.pyz"
INTERPRETER = "/usr/bin/env python3"
# solos_client.py runs as `solos-memory.pyz client ...`; solos_hermes.py is only read, by `client install-hermes`.
REQUIRED_FILES = (
    "solos_memory.py",
    "mcp_bridge.py",
    "solos_check.py",
    "solos_status.py",
    "solos_client.py",
    "solos_hermes.py",
    "schema.sql",
    "solos_qdrant.py",
    "solos_lifecycle.py",
    "solos_rank.py",
    "solos_connections.py",
    "solos_events.py",
    "solos_forget.py",
    "solos_store.py",
    "solos_errors.py",  # the store's: the service's errors and log lines
    "solos_validation.py",
    "solos_operations.py",
    "solos_embed_worker.py",
    "solos_recall.py",
    "solos_judge.py",  # recall's judge of whether a row answers, and its fitted weights (checked by sha256)
    "models/judge/judge.json",
    # The cross-encoder's code and meta; its 19 MB model stays out (a 0.5 MB archive would grow to 15 MB, for the
    # few who run the .pyz with an embedder): the .pyz's hybrid recall keeps the features judge and its receipt's
    # judge_reason says the model is not there.
    "solos_cross_encoder.py",
    "models/judge/cross-encoder.json",
    "solos_telemetry.py",
    "solos_snapshot.py",
    "solos_jobs.py",
    "solos_bounds.py",
    "solos_provenance.py",
    "solos_tokens.py",
    "solos_sqlite.py",  # serve's SQLite library settings (memory statistics off), before its first connection
    "solos_malloc.py",  # serve's C library settings (malloc arenas one per core), before its first thread
    "solos_workers.py",  # serve --workers N: the supervisor and what workers share on one host
    "solos_store_pg.py",  # imported only for a postgresql:// URL, where psycopg must be installed
    "solos_copies.py",  # solos_store_pg's: copies of the service sharing one PostgreSQL database
    "solos_pg_keyword.py",  # solos_store_pg's: each copy's own keyword index over PostgreSQL
    "schema_pg.sql",
    "solos_migrate.py",
)
# The embedder is optional; when it ships, its tokenizer files must ship with it.
EMBEDDER = "solos_embed.py"
MODEL_DIR = "models/all-MiniLM-L6-v2"
MAIN_PY = b"""\
# Entry point of solos-memory.pyz, written by pyz_build.py.
import os
import sys

# Before any module of the service: on an older python3 (Ubuntu 22.04's 3.10) they fail at an import, in a traceback
# that never says the interpreter is too old. %-formatting, so an older Python still reads this line.
if sys.version_info < (3, 11):
    sys.exit("solos-memory needs Python 3.11 or later; %s is %s" % (sys.executable, sys.version.split()[0]))

# The modules read the archive's own files (schema.sql, the judge's weights) through their loader, by a path some
# resolve: imported from the archive's real path, the loader knows that path even when a symlink led here.
if sys.path and sys.path[0] == os.path.dirname(__file__):
    sys.path[0] = os.path.realpath(sys.path[0])

import signal

signal.signal(signal.SIGINT, lambda *_: sys.exit("solos-memory: interrupted"))  # as solos_memory.py's own start does

import solos_memory

sys.exit(solos_memory.main())
"""
# The earliest time a zip header can hold; any fixed value would do.
ZIP_TIME = (1980, 1, 1, 0, 0, 0)
FILE_MODE = 0o100644  # regular file, rw-r--r--, whatever the checkout's umask was
VERSION_TIMEOUT_S = 60


class BuildError(Exception):
    """The archive cannot be built or does not start; the message says why."""


def collect(root: Path) -> list[tuple[str, bytes]]:
    """The archive's entries as sorted (name, content) pairs, read from root."""
    missing = [name for name in REQUIRED_FILES if not (root / name).is_file()]
    if missing:
        raise BuildError(f"{root} lacks {', '.join(missing)}")
    names = list(REQUIRED_FILES)
    if (root / EMBEDDER).is_file():
        model_files = sorted(p for p in (root / MODEL_DIR).rglob("*") if p.is_file())
        if not model_files:
            raise BuildError(f"{EMBEDDER} is present but {root / MODEL_DIR} holds no files")
        names.append(EMBEDDER)
        names += [p.relative_to(root).as_posix() for p in model_files]
    entries = [(name, (root / name).read_bytes()) for name in names]
    entries.append(("__main__.py", MAIN_PY))
    return sorted(entries)


def archive_bytes(entries: list[tuple[str, bytes]]) -> bytes:
    """The shebang line, then a deflated zip of the entries with fixed timestamps and modes."""
    buffer = io.BytesIO()
    buffer.write(b"#!" + INTERPRETER.encode() + b"\n")
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, content in entries:
            info = zipfile.ZipInfo(name, date_time=ZIP_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.create_system = 3  # Unix, so external_attr's mode bits are read
            info.external_attr = FILE_MODE << 16
            archive.writestr(info, content)
    return buffer.getvalue()


def check_version(path: Path) -> str:
    """Run the archive with --version on a site-less interpreter; return what it printed."""
    # -I: ignore PYTHON* variables and the user's site dir; -S: no site-packages.
    cmd = [sys.executable, "-I", "-S", str(path), "--version"]
    try:
        run = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=VERSION_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        raise BuildError(f"{path} --version did not finish in {VERSION_TIMEOUT_S} s") from exc
    if run.returncode != 0:
        raise BuildError(f"{path} --version exited {run.returncode}:\n{run.stderr.strip()}")
    return (run.stdout or run.stderr).strip()


def build(root: Path, out: Path) -> tuple[str, str]:
    """Build the archive from root into out; return (sha256, version line)."""
    if out.is_dir():
        raise BuildError(f"{out} is a folder: --out names the archive file, e.g. {out / DEFAULT_OUT.name}")
    payload = archive_bytes(collect(root))
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    except OSError as error:
        raise BuildError(f"cannot write {out} into {out.parent}: {error.strerror or error}") from None
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        tmp.write_bytes(payload)
        tmp.chmod(0o755)
        version = check_version(tmp)
        tmp.replace(out)
    except OSError as error:
        raise BuildError(f"cannot write {out}: {error.strerror or error}") from None
    finally:
        tmp.unlink(missing_ok=True)
    return hashlib.sha256(out.read_bytes()).hexdigest(), version


def main(argv: list[str] | None = None) -> int:
    """Parse flags, build, print the archive's path, size, sha256 and version."""
    parser = argparse.ArgumentParser(description="Build the solos-memory zipapp.")
    parser.add_argument("--root", type=Path, default=ROOT, help="source tree (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=None, help=f"archive to write (default: ROOT/{DEFAULT_OUT})")
    args = parser.parse_args(argv)
    out = args.out or args.root / DEFAULT_OUT
    try:
        sha, version = build(args.root, out)
    except BuildError as exc:
        print(f"pyz_build: {exc}", file=sys.stderr)
        return 1
    print(f"{out}: {out.stat().st_size} bytes, sha256 {sha}, {version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
