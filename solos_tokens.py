"""solos_tokens: per-agent bearer tokens, kept as sha256 hashes in a tokens file (SQLite) or in the database
(PostgreSQL, so every copy of the service agrees), and the `token` command that issues them.

Imports only the store and the validation rules; the spine checks each request with Tokens.agent_for.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import os
import re
import secrets
import stat
import threading
import time
from collections.abc import Callable
from typing import Any

import solos_store
from solos_store import Unauthorized
from solos_validation import AGENT_PATTERN, fully_matches

OPERATOR = "@operator"  # the holder of the operator token: not an agent name (those start alphanumeric)


class Tokens:
    """Optional per-agent bearer tokens: the token, not the request body, names the caller.

    The file holds one `<sha256 hex of token> <agent>` per line (`@operator` for the operator view); it
    must not be readable by group or others. Tokens themselves are never stored or logged. The file is read
    again whenever it changes (a stat per request), so a token added or a line removed holds at the next
    request, in every worker of the service at once; a file changed into one that cannot be used refuses
    every request (503, saying why) until it is fixed, rather than keep tokens that were meant to go.
    """

    def __init__(self, by_hash: dict[str, str], path: str | None = None):
        self.by_hash, self.path = by_hash, path
        self.seen = file_state(path) if path else None
        self.broken: str | None = None
        self.lock = threading.Lock()

    @classmethod
    def load(cls, path: str) -> Tokens:
        if not path:  # SOLOS_MEMORY_TOKENS_FILE= asks for tokens: starting in loopback trust would open the door
            raise SystemExit("--tokens-file is empty: give the tokens file's path, or leave it out for loopback trust")
        try:
            return cls(read_tokens(path), path)
        except OSError as error:  # missing, a folder, unreadable: one line, not a traceback
            raise SystemExit(f"--tokens-file {path}: cannot be read: {error.strerror or error}") from None
        except ValueError as error:
            raise SystemExit(str(error)) from None

    def current(self) -> dict[str, str]:
        """The tokens as the file says now: read again if it changed since."""
        if self.path is not None and file_state(self.path) != self.seen:
            with self.lock:
                state = file_state(self.path)
                if state != self.seen:
                    try:
                        self.by_hash, self.broken = read_tokens(self.path), None
                    except (OSError, ValueError) as error:
                        solos_store.log_event("tokens_unusable", path=self.path, reason=str(error))
                        # Every caller reads why, unauthenticated ones too: the file's name, not where it lives.
                        self.broken = str(error).replace(self.path, os.path.basename(self.path))
                    self.seen = state
        if self.broken is not None:
            raise solos_store.StorageUnavailable(f"the tokens file changed and cannot be used: {self.broken}")
        return self.by_hash

    def agent_for(self, authorization: str | None) -> str:
        """The agent a bearer token belongs to; compared in constant time."""
        by_hash = self.current()
        # The scheme is case-insensitive and any whitespace ends it (RFC 9110 11.1): `bearer <token>` is one too.
        scheme_and_token = (authorization or "").split(None, 1)
        if len(scheme_and_token) != 2 or scheme_and_token[0].lower() != "bearer":
            # Worded without the scheme name: Hermes redacts "Bearer <word>" from error text.
            raise Unauthorized("this service needs the calling agent's token in the Authorization header")
        digest = hashlib.sha256(scheme_and_token[1].strip().encode("utf-8")).hexdigest()
        found = None
        for known, agent in by_hash.items():
            if hmac.compare_digest(known, digest):
                found = agent
        if found is None:
            raise Unauthorized("the bearer token is not known")
        return found

    def confirm(self, authorization: str | None, agent: str) -> None:
        """For a call that lasts (an event stream): the token still names `agent`; else Unauthorized, so a token
        revoked (or given to another agent) stops what it opened at its next delivery, not only its next request;
        and once tokens are on (the first one kept in the database), one opened without them stops too."""
        if self and self.agent_for(authorization) != agent:
            raise Unauthorized("the bearer token no longer names this stream's agent")


def file_state(path: str) -> tuple | None:
    """What changes when a file is written or replaced (None: it is gone)."""
    try:
        status = os.stat(path)
    except OSError:
        return None
    return status.st_ino, status.st_size, status.st_mtime_ns, status.st_ctime_ns


def read_tokens(path: str) -> dict[str, str]:
    """The tokens file's hashes and holders; ValueError says what is wrong with it."""
    mode = os.stat(path).st_mode
    if stat.S_ISDIR(mode):  # before the mode check: a folder's 755 is no tokens file's mode to fix
        raise IsADirectoryError(errno.EISDIR, "it is a folder", path)
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ValueError(f"{path}: tokens file must not be accessible by group or others (chmod 600)")
    by_hash: dict[str, str] = {}
    lines: dict[str, int] = {}  # each hash's first line, to name it
    with open(path, encoding="utf-8-sig") as handle:  # -sig: a Windows editor's BOM is no part of line 1
        for number, line in enumerate(handle, 1):
            if not line.strip() or line.startswith("#"):
                continue
            parts = line.split()
            parts[0] = parts[0].lower()  # the same sha256, as PowerShell's Get-FileHash prints it
            if len(parts) != 2 or not re.fullmatch(r"[0-9a-f]{64}", parts[0]) or not names_holder(parts[1]):
                raise ValueError(f"{path}:{number}: expected '<sha256 hex> <agent>'")
            if by_hash.get(parts[0], parts[1]) != parts[1]:  # which line wins would be a guess: neither does
                raise ValueError(
                    f"{path}:{number}: this hash is on line {lines[parts[0]]} too, for {by_hash[parts[0]]!r}, "
                    f"here for {parts[1]!r}: one token speaks for one agent"
                )
            by_hash[parts[0]] = parts[1]
            lines.setdefault(parts[0], number)
    return by_hash


class StoredTokens(Tokens):
    """Tokens kept in the database (PostgreSQL): read again at most every REREAD_S, so a token issued while the
    copies run, the first one included, holds on every copy within that time. Tokens are on from the first one
    a copy reads, and stay on: once the last is revoked every call is refused (401) until one is issued, never
    trusted as it was before the first (that takes a restart). A failed read keeps the last set (the operation
    itself then meets the same database)."""

    REREAD_S = 5.0

    def __init__(self, read: Callable[[], dict[str, str]]):
        super().__init__(read())
        self.read, self.read_at = read, time.monotonic()
        self.on = bool(self.by_hash)

    def current(self) -> dict[str, str]:
        if time.monotonic() - self.read_at >= self.REREAD_S:
            had = bool(self.by_hash)
            try:
                self.by_hash = self.read()
            except solos_store.ServiceError:
                pass
            self.read_at = time.monotonic()
            if had and not self.by_hash:
                solos_store.log_event("tokens_none_left", reason="every call is refused until a token is issued")
            self.on = self.on or bool(self.by_hash)
        return self.by_hash

    def __bool__(self) -> bool:
        self.current()
        return self.on


def names_holder(name: str) -> bool:
    return fully_matches(AGENT_PATTERN, name) or name == OPERATOR


def issue_token(agent: str, tokens_file: str | None, db: str, open_store: Callable[[], Any]) -> int:
    """Print a new token once; only its sha256 is kept: in a file readable by the owner alone, or in the
    PostgreSQL database `open_store` opens (as its admin)."""
    if not names_holder(agent):
        raise SystemExit(f"agent name {agent!r} must match {AGENT_PATTERN}")
    if not tokens_file and not solos_store.is_postgres(db):
        raise SystemExit("token: give --tokens-file, or --db with a postgresql:// URL (the copies share it)")
    token = secrets.token_urlsafe(32)
    digest = hashlib.sha256(token.encode()).hexdigest()
    if not tokens_file:  # a tokens file wins, as it does for serve, over the database SOLOS_MEMORY_DB names
        store = open_store()
        try:
            store.keep_token(digest, agent)
        finally:
            store.close()
    else:
        try:
            if os.path.isfile(tokens_file):  # a file the service would refuse gets no token it cannot honour
                read_tokens(tokens_file)
        except (OSError, ValueError) as error:
            raise SystemExit(f"{error}; no token was issued") from None
        try:
            descriptor = os.open(tokens_file, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
            with os.fdopen(descriptor, "a+b") as handle:
                size, line = handle.seek(0, os.SEEK_END), f"{digest} {agent}\n".encode()
                if size and os.pread(descriptor, 1, size - 1) != b"\n":  # a last line edited by hand, left open:
                    line = b"\n" + line  # glued to it, the hash would be its third word and the file unusable
                handle.write(line)
        except OSError as error:  # no folder, a folder, read-only: one line, and no token printed as if kept
            raise SystemExit(f"--tokens-file {tokens_file}: cannot be written: {error.strerror or error}") from None
    print(token)
    return 0
