"""Rollout checks for a running solos-memory: the fleet spec's acceptance list as a pass/fail table.

Run:   python3 solos_memory.py check --url http://127.0.0.1:8437 [--writer atlas --reader sol]
       python3 solos_memory.py check --cleanup --db PATH    # remove what the checks wrote

The checks talk to the service over HTTP only (nothing is imported from
solos_memory), except the loopback check, which reads this host's listening
sockets from /proc/net/tcp and /proc/net/tcp6 as `ss -ltn` does, so run it on
the service's host. Every fact they write is a long-term fact with source
"solos-check" and tags ["solos-check", <run id>]; cleanup() deletes those.

Environment: SOLOS_CHECK_WRITER_TOKEN, SOLOS_CHECK_READER_TOKEN (bearer tokens,
needed when the service runs with a tokens file; /health says "auth": "tokens").
"""

from __future__ import annotations

import argparse
import http.client
import ipaddress
import json
import os
import secrets
import sqlite3
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

EMBED_WAIT_S = 10.0  # how long the degraded check waits for the background embedder to reach the run's facts
DEFAULT_URL = "http://127.0.0.1:8437"
CHECK_TAG = CHECK_SOURCE = "solos-check"
MCP_PROTOCOL_VERSION = "2025-11-25"
EXPECTED_TOOLS = ("recall", "write_short", "write_long", "write_episodic", "delete_short", "stats")
# Delta check: 3 distinct facts in 5 writes, so the two repeats must update rather than insert.
DELTA_WRITE_ORDER = (0, 1, 0, 2, 1)
PROC_NET_TCP = ("/proc/net/tcp", "/proc/net/tcp6")
TCP_LISTEN = "0A"  # include/net/tcp_states.h: TCP_LISTEN = 10
TOKEN_HINT = " (pass --writer-token and --reader-token, or SOLOS_CHECK_WRITER_TOKEN / SOLOS_CHECK_READER_TOKEN)"
CLEANUP_HINT = "The facts these checks wrote are tagged solos-check; remove them with: {command} (the service's --db)"


@dataclass(frozen=True)
class CheckResult:
    """One row of the table: which check, whether it passed, and what it saw."""

    name: str
    ok: bool
    detail: str


class CheckFailed(Exception):
    """A check's expectation was not met; the message is the table's detail."""


@dataclass
class Reply:
    """One HTTP answer: status, lower-cased headers, parsed JSON body (None if not JSON)."""

    status: int
    headers: dict[str, str]
    body: Any


class Client:
    """The service over HTTP, one connection per request, with each agent's bearer token."""

    def __init__(self, url: str, timeout: float, tokens: dict[str, str | None]):
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"--url must look like http://127.0.0.1:8437, got {url!r}")
        self.host, self.port = parts.hostname, parts.port or 80
        self.timeout, self.tokens = timeout, tokens
        self.facts_written = 0

    def request(
        self,
        method: str,
        path: str,
        agent: str | None = None,
        query: dict | None = None,
        body: Any = None,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        headers = dict(headers or {})
        token = self.tokens.get(agent) if agent else None
        if token:
            headers["Authorization"] = f"Bearer {token}"
        payload = None
        if body is not None:
            payload = json.dumps(body).encode()
            headers.setdefault("Content-Type", "application/json")
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            conn.request(method, path + ("?" + urlencode(query) if query else ""), body=payload, headers=headers)
            response = conn.getresponse()
            data = response.read()
        finally:
            conn.close()
        try:
            parsed = json.loads(data) if data else None
        except ValueError:
            parsed = None
        return Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, parsed)

    def expect(self, statuses: tuple[int, ...], method: str, path: str, agent: str | None = None, **kw: Any) -> Reply:
        """The reply, or CheckFailed naming the call and the service's own error message."""
        reply = self.request(method, path, agent, **kw)
        if reply.status not in statuses:
            error = reply.body.get("error", {}) if isinstance(reply.body, dict) else {}
            as_agent = f" as {agent}" if agent else ""
            hint = TOKEN_HINT if reply.status == 401 else ""
            raise CheckFailed(f"{method} {path}{as_agent}: {reply.status} {error.get('message', '')}".rstrip() + hint)
        return reply


class CheckResults(list):
    """The results in order, and how many facts the checks wrote (the cleanup hint shows only when there are some)."""

    facts_written = 0


def run_checks(
    url: str,
    writer: str,
    reader: str,
    timeout: float = 5.0,
    *,
    writer_token: str | None = None,
    reader_token: str | None = None,
) -> CheckResults:
    """Run every check in order; one failing does not stop the others."""
    client = Client(url, timeout, {writer: writer_token, reader: reader_token})
    run_id = "run" + secrets.token_hex(5)
    checks: list[tuple[str, Callable[[], str]]] = [
        ("loopback only", lambda: check_loopback_only(client.port)),
        ("health", lambda: check_health(client)),
        ("cross-agent echo", lambda: check_cross_agent_echo(client, writer, reader, run_id)),
        ("long row delta", lambda: check_long_row_delta(client, writer, run_id)),
        ("mcp tools", lambda: check_mcp_tools(client, reader)),
        ("degraded mode", lambda: check_degraded_mode(client, reader, run_id)),
    ]
    results = CheckResults()
    for name, check in checks:
        try:
            results.append(CheckResult(name, True, check()))
        except CheckFailed as failure:
            results.append(CheckResult(name, False, str(failure)))
        except (OSError, http.client.HTTPException) as error:
            results.append(CheckResult(name, False, f"cannot talk to {url}: {error}"))
        except (KeyError, TypeError) as error:  # a reply without the fields this version of the service sends
            results.append(CheckResult(name, False, f"unexpected reply from {url}: missing or wrong {error}"))
    results.facts_written = client.facts_written
    return results


# ==== The checks: each returns its detail or raises CheckFailed ====


def check_loopback_only(port: int) -> str:
    """Every listener on the port is a loopback address; a wildcard bind would expose every agent's memory."""
    listeners = listening_addresses(port)
    if not listeners:
        raise CheckFailed(
            f"no listener on port {port} in {' or '.join(PROC_NET_TCP)}: "
            "run the check on the service's host (same network namespace)"
        )
    exposed = [address for address in listeners if not is_loopback(address)]
    found = ", ".join(f"{describe_address(address)}:{port}" for address in listeners)
    if exposed:
        raise CheckFailed(f"listening beyond loopback: {found}")
    return f"listening on {found}"


def check_health(client: Client) -> str:
    """/health answers 200 and says which auth mode and ranking the service runs with."""
    health = client.expect((200,), "GET", "/health").body
    degraded = f"degraded {str(health['degraded']).lower()}"
    if health["degraded"]:
        degraded += f" ({health['degraded_reason']})"
    return f"200 {health['status']}, version {health['version']}, auth {health['auth']}, {degraded}"


def check_cross_agent_echo(client: Client, writer: str, reader: str, run_id: str) -> str:
    """A fact one agent writes comes back to another, attributed to its writer and marked foreign."""
    fact = f"{CHECK_SOURCE} {run_id}: cross-agent echo written by {writer} for {reader}"
    written = write_check_fact(client, writer, run_id, fact).body
    recalled = client.expect(
        (200,),
        "GET",
        "/v1/recall",
        reader,
        query={"agent": reader, "q": run_id, "scope": "shared", "tiers": "long", "k": 10},
    ).body
    match = next((r for r in recalled["results"] if r["id"] == written["id"] and r["tier"] == "long"), None)
    if match is None:
        raise CheckFailed(
            f"{reader} did not recall {writer}'s fact #{written['id']} ({recalled['count']} other results)"
        )
    if match["agent"] != writer or match["foreign"] is not True:
        raise CheckFailed(
            f"fact #{written['id']} came back as agent={match['agent']}, "
            f"foreign={json.dumps(match['foreign'])}; "
            f"expected agent={writer}, foreign=true"
        )
    return f"{reader} recalled {writer}'s fact #{written['id']} as agent={writer}, foreign=true"


def check_long_row_delta(client: Client, writer: str, run_id: str) -> str:
    """Repeated writes update, distinct ones insert: the row count grows by the distinct facts only.

    Other fleet writers share the table, so a write of theirs between the two
    counts is told apart from a bug by trying once more.
    """
    distinct = len(set(DELTA_WRITE_ORDER))
    deltas = []
    for attempt in (1, 2):
        before = long_row_count(client, writer)
        for index in DELTA_WRITE_ORDER:
            write_check_fact(client, writer, run_id, f"{CHECK_SOURCE} {run_id}: delta attempt {attempt} fact {index}")
        deltas.append(long_row_count(client, writer) - before)
        if deltas[-1] == distinct:
            retried = f" (on retry; first delta {deltas[0]})" if attempt == 2 else ""
            return f"{len(DELTA_WRITE_ORDER)} writes of {distinct} distinct facts: rows.long +{distinct}{retried}"
    raise CheckFailed(
        f"{len(DELTA_WRITE_ORDER)} writes of {distinct} distinct facts changed rows.long by "
        f"{deltas[0]}, then by {deltas[1]} on retry; expected {distinct} "
        "(concurrent fleet writers can disturb this count)"
    )


def check_mcp_tools(client: Client, agent: str) -> str:
    """The MCP handshake works and tools/list offers the fleet's core tools."""
    headers = {"Accept": "application/json, text/event-stream"}
    initialized = mcp_call(
        client,
        agent,
        headers,
        "initialize",
        {
            "protocolVersion": MCP_PROTOCOL_VERSION,
            "capabilities": {},
            "clientInfo": {"name": "solos-check", "version": "1"},
        },
    )
    negotiated = initialized["protocolVersion"]
    listed = mcp_call(client, agent, {**headers, "MCP-Protocol-Version": negotiated}, "tools/list", {})
    names = sorted(tool["name"] for tool in listed["tools"])
    missing = [name for name in EXPECTED_TOOLS if name not in names]
    if missing:
        raise CheckFailed(f"tools/list lacks {', '.join(missing)}; it lists {', '.join(names) or 'nothing'}")
    return f"protocol {negotiated}, {len(names)} tools: {', '.join(names)}"


def check_degraded_mode(client: Client, agent: str, run_id: str) -> str:
    """Recall returns rows either way, and says in body and header whether ranking is keyword-only.

    With an embedder loaded, the run's fresh facts get their vectors in the
    background: ask again for a few seconds before reporting it degraded.
    """
    deadline = time.monotonic() + EMBED_WAIT_S
    while True:
        reply = client.expect(
            (200,),
            "GET",
            "/v1/recall",
            agent,
            query={"agent": agent, "q": run_id, "scope": "shared", "tiers": "long", "k": 10},
        )
        degraded, header = reply.body["degraded"], reply.headers.get("x-memory-degraded")
        if not reply.body["results"]:
            raise CheckFailed(f"recall of this run's facts returned no rows (degraded {str(degraded).lower()})")
        if header != str(degraded).lower():
            raise CheckFailed(f"body says degraded {str(degraded).lower()} but X-Memory-Degraded is {header!r}")
        health = client.expect((200,), "GET", "/health", agent).body  # catching_up, failing, busy: loaded
        embedder_loaded = health.get("embedder_state", "off" if health["degraded"] else "ready") != "off"
        if not degraded or not embedder_loaded or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    if degraded:
        return (
            f"{reply.body['count']} rows, degraded true, X-Memory-Degraded true ({reply.body.get('degraded_reason')})"
        )
    return f"embedder loaded (degraded false): {reply.body['count']} rows, X-Memory-Degraded false"


# ==== Helpers ====


def write_check_fact(client: Client, writer: str, run_id: str, fact: str) -> Reply:
    """Write one long fact tagged so cleanup() can find it."""
    reply = client.expect(
        (200, 201),
        "POST",
        "/v1/long",
        writer,
        body={
            "agent": writer,
            "topic": CHECK_SOURCE,
            "fact": fact,
            "source": CHECK_SOURCE,
            "tags": [CHECK_TAG, run_id],
        },
    )
    client.facts_written += 1
    return reply


def long_row_count(client: Client, agent: str) -> int:
    """rows.long from /v1/stats, asked as agent (with tokens on, every operation needs one)."""
    return client.expect((200,), "GET", "/v1/stats", agent).body["rows"]["long"]


def mcp_call(client: Client, agent: str, headers: dict[str, str], method: str, params: dict) -> dict:
    """One JSON-RPC request to /mcp; its result, or CheckFailed with the JSON-RPC error."""
    reply = client.expect(
        (200,),
        "POST",
        "/mcp",
        agent,
        headers=headers,
        body={"jsonrpc": "2.0", "id": 1, "method": method, "params": params},
    )
    answer = reply.body if isinstance(reply.body, dict) else {}
    if "result" not in answer:
        raise CheckFailed(f"/mcp {method} answered without a result: {json.dumps(answer.get('error', reply.body))}")
    return answer["result"]


def listening_addresses(port: int) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """Local addresses of TCP sockets listening on port, from /proc/net/tcp and tcp6."""
    found = []
    for path in PROC_NET_TCP:
        try:
            lines = Path(path).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue  # no IPv6 in this kernel
        for line in lines:
            fields = line.split()
            local, state = fields[1], fields[3]
            address, port_hex = local.split(":")
            if state == TCP_LISTEN and int(port_hex, 16) == port:
                found.append(decode_proc_address(address))
    return found


def decode_proc_address(hex_address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """/proc/net/tcp prints an address as 32-bit words in the kernel's byte order."""
    raw = bytes.fromhex(hex_address)
    words = [int.from_bytes(raw[i : i + 4], sys.byteorder).to_bytes(4, "big") for i in range(0, len(raw), 4)]
    return ipaddress.ip_address(b"".join(words))


def is_loopback(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1 from a dual-stack socket
    return address.is_loopback or bool(mapped and mapped.is_loopback)


def describe_address(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    text = str(address) if address.version == 4 else f"[{address}]"
    return text + " (all interfaces)" if address.is_unspecified else text


def print_table(results: list[CheckResult]) -> None:
    """One line per check, PASS/FAIL, and a summary."""
    width = max(len(result.name) for result in results)
    for result in results:
        print(f"{result.name:<{width}}  {'PASS' if result.ok else 'FAIL'}  {result.detail}")
    passed = sum(result.ok for result in results)
    print(f"{passed}/{len(results)} checks passed")


# ==== Cleanup ====


def cleanup(conn: sqlite3.Connection) -> int:
    """Delete the long facts these checks wrote (and their write keys); return how many.

    A row is the checks' only if both its source and a JSON tag say solos-check,
    so an agent's own fact tagged solos-check stays. One short write transaction:
    the database is shared with running agents.
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        deleted = [
            row[0]
            for row in conn.execute(
                "DELETE FROM memory_longterm WHERE source = ? AND EXISTS ("
                "  SELECT 1 FROM json_each(CASE WHEN json_valid(tags) THEN tags ELSE '[]' END) WHERE value = ?"
                ") RETURNING id",
                (CHECK_SOURCE, CHECK_TAG),
            )
        ]
        conn.executemany(
            "DELETE FROM memory_write_key WHERE tier = 'long' AND row_id = ?", [(row_id,) for row_id in deleted]
        )
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return len(deleted)


# ==== CLI ====


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The check command's options, for this module's main() and the service's `check` subcommand (which adds --db)."""
    parser.add_argument("--url", default=DEFAULT_URL, help="the running service (default: %(default)s)")
    parser.add_argument(
        "--writer", default="atlas", help="registered agent that writes the check facts (default: %(default)s)"
    )
    parser.add_argument(
        "--reader", default="sol", help="another registered agent that recalls them (default: %(default)s)"
    )
    parser.add_argument(
        "--writer-token",
        default=os.environ.get("SOLOS_CHECK_WRITER_TOKEN"),
        help="the writer's bearer token (default: $SOLOS_CHECK_WRITER_TOKEN, else none)",
    )
    parser.add_argument(
        "--reader-token",
        default=os.environ.get("SOLOS_CHECK_READER_TOKEN"),
        help="the reader's bearer token (default: $SOLOS_CHECK_READER_TOKEN, else none)",
    )
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds per HTTP request (default: %(default)s)")
    parser.add_argument(
        "--cleanup",
        action="store_true",
        help="instead of checking, delete the rows earlier checks wrote to --db (default: check)",
    )


def run(args: argparse.Namespace) -> int:
    """Run the checks (or the cleanup) the parsed arguments ask for; 0 when all is well."""
    if args.cleanup:
        return cleanup_database(args.db)
    if args.writer == args.reader:
        print("--writer and --reader must be different agents: the echo check needs a foreign reader", file=sys.stderr)
        return 2
    try:
        results = run_checks(
            args.url,
            args.writer,
            args.reader,
            args.timeout,
            writer_token=args.writer_token,
            reader_token=args.reader_token,
        )
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2
    print_table(results)
    if results.facts_written:
        print(CLEANUP_HINT.format(command=args.cleanup_command))
    return 0 if all(result.ok for result in results) else 1


def cleanup_database(path: str) -> int:
    """cleanup() on an existing database file (mode=rw: a mistyped path is an error, not a new file)."""
    try:
        conn = sqlite3.connect(Path(path).resolve().as_uri() + "?mode=rw", uri=True, isolation_level=None, timeout=5)
        try:
            removed = cleanup(conn)
        finally:
            conn.close()
    except sqlite3.Error as error:
        print(f"cleanup of {path} failed: {error}", file=sys.stderr)
        return 1
    print(f"removed {removed} solos-check rows from {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="solos_check", description="Rollout checks against a running solos-memory.")
    add_arguments(parser)
    parser.add_argument("--db", default="solos.db", help="database for --cleanup; must exist (default: %(default)s)")
    parser.set_defaults(cleanup_command=f"python3 {sys.argv[0]} --cleanup --db PATH")
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
