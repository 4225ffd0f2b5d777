"""Rollout checks for a running solos-memory: the fleet spec's acceptance list as a pass/fail table.

Run:   python3 solos_memory.py check --a2a-record       # before a rollout: the A2A mesh's baseline
       python3 solos_memory.py check --url http://127.0.0.1:8437 [--writer atlas --reader sol] [--expect hybrid]
       python3 solos_memory.py check --cleanup --db PATH    # remove what the checks wrote

The checks talk to the service over HTTP only (nothing is imported from
solos_memory), except the loopback check, which reads this host's listening
sockets from /proc/net/tcp and /proc/net/tcp6 as `ss -ltn` does, so run it on
the service's host. The mesh check asks each of the fleet's A2A agents on
loopback for its agent card and compares with the answers recorded before the
rollout (--a2a-record): an agent that answered 200 then and does not now, or
the service on one of the mesh's ports, fails it. Every fact they write is a long-term fact with source
"solos-check" and tags ["solos-check", <run id>]; --cleanup deletes those.

Environment: SOLOS_CHECK_WRITER_TOKEN, SOLOS_CHECK_READER_TOKEN (bearer tokens,
needed when the service runs with a tokens file; /health says "auth": "tokens").
"""

from __future__ import annotations

import argparse
import http.client
import ipaddress
import json
import os
import re
import secrets
import sqlite3
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import solos_client
import solos_store
from solos_validation import number_in

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
EXPECTATIONS = ("any", "hybrid", "keyword")  # --expect: which recall the operator rolled out
# The fleet's A2A agents answer on loopback 8300-8307; 8305 is known dead. A2A serves each agent's card here.
A2A_PORTS, A2A_SKIP, A2A_PATH = "8300-8307", "8305", "/.well-known/agent.json"
A2A_TIMEOUT_S = 1.0  # per agent: one on loopback that takes longer is not answering
CLEANUP_HINT = "The facts these checks wrote are tagged solos-check; remove them with: {command} (the service's --db)"


@dataclass(frozen=True)
class CheckResult:
    """One row of the table: which check, whether it passed (with a warning or not), and what it saw."""

    name: str
    ok: bool
    detail: str
    warning: bool = False


class CheckFailed(Exception):
    """A check's expectation was not met; the message is the table's detail."""


class CheckWarning(Exception):
    """A check passed in a way the operator should know of (keyword-only recall, no mesh baseline)."""


@dataclass(frozen=True)
class Mesh:
    """The fleet's A2A agents: their loopback ports (skipped ones still count as the mesh's), the path each
    answers, and the file holding their answers from before the rollout."""

    ports: tuple[int, ...]
    skip: tuple[int, ...]
    path: str
    baseline: Path

    @property
    def swept(self) -> list[int]:
        return [port for port in self.ports if port not in self.skip]


@dataclass
class Reply:
    """One HTTP answer: status, lower-cased headers, parsed JSON body (None if not JSON)."""

    status: int
    headers: dict[str, str]
    body: Any


class Client:
    """The service over HTTP, one connection per request, with each agent's bearer token."""

    def __init__(self, url: str, timeout: float, tokens: dict[str, str | None]):
        try:
            parts, port = urlsplit(url), 80
            port = parts.port or port  # ValueError outside 0-65535, as urlsplit's for a broken [IPv6] host
        except ValueError:
            parts = None
        if parts is None or parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"--url must look like http://127.0.0.1:8437, got {url!r}")
        self.host, self.port = parts.hostname, port
        # A CRLF environment file's "\r" stripped; a token no header carries named, never printed as
        # http.client's refusal prints it (into the rollout's log).
        self.tokens = {agent: token.strip() if token else None for agent, token in tokens.items()}
        for agent, token in self.tokens.items():
            if token and not solos_client.header_safe(token):
                raise ValueError(f"{agent}'s token (--writer-token / --reader-token): {solos_client.UNSENDABLE}")
        self.timeout, self.facts_written = timeout, 0

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
    expect: str = "any",
    mesh: Mesh | None = None,
) -> CheckResults:
    """Run every check in order (the mesh's only when given one); one failing does not stop the others."""
    client = Client(url, timeout, {writer: writer_token, reader: reader_token})
    run_id = "run" + secrets.token_hex(5)
    checks: list[tuple[str, Callable[[], str]]] = [
        ("loopback only", lambda: check_loopback_only(client.port)),
        ("health", lambda: check_health(client, reader)),
        ("cross-agent echo", lambda: check_cross_agent_echo(client, writer, reader, run_id)),
        ("long row delta", lambda: check_long_row_delta(client, writer, run_id)),
        ("mcp tools", lambda: check_mcp_tools(client, reader)),
        ("degraded mode", lambda: check_degraded_mode(client, reader, run_id, expect)),
    ]
    if mesh is not None:
        checks.append(("a2a mesh", lambda: check_a2a_mesh(client.port, mesh)))
    results = CheckResults()
    for name, check in checks:
        try:
            results.append(CheckResult(name, True, check()))
        except CheckWarning as warning:
            results.append(CheckResult(name, True, str(warning), warning=True))
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


def check_health(client: Client, agent: str) -> str:
    """/health answers 200 and says which auth mode and ranking the service runs with; a warning when recall
    cannot use its judge or cross-encoder (relevance then means less than the docs say); a failure while its
    storage fails (a call met a full disk or a lost server in the last minute), or while a daily job's last run
    failed or it has not succeeded within its period (/v1/stats, as agent: the jobs are the database's)."""
    health = client.expect((200,), "GET", "/health").body
    degraded = f"degraded {str(health['degraded']).lower()}"
    if health["degraded"]:
        degraded += f" ({health['degraded_reason']})"
    seen = f"200 {health['status']}, version {health['version']}, auth {health['auth']}, {degraded}"
    judge = health.get("judge") or {}  # an older service does not say
    unusable = [
        f"{name} unavailable ({judge.get(reason)})"
        for name, state, reason in (
            ("judge", "state", "reason"),
            ("cross-encoder", "cross_encoder", "cross_encoder_reason"),
        )
        if judge.get(state) == "unavailable"
    ]
    storage = health.get("storage") or {}  # an older service does not say
    if storage.get("state") == "failing":
        last = storage.get("last_failure") or {}
        raise CheckFailed(f"{seen}; storage failing (last at {last.get('at')}: {last.get('reason')})")
    stats = client.expect((200, 401), "GET", "/v1/stats", agent, query={"agent": agent})  # 401: the echo says why
    jobs = (stats.body.get("jobs") if stats.status == 200 else None) or {}
    problems = [f"{job} {state['state']}: {state['detail']}" for job, state in jobs.items() if state.get("problem")]
    if problems:
        raise CheckFailed(f"{seen}; {'; '.join(problems)}")
    if unusable:
        raise CheckWarning(f"{seen}; {'; '.join(unusable)}")
    return seen


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


def check_degraded_mode(client: Client, agent: str, run_id: str, expect: str = "any") -> str:
    """Recall returns rows either way, and says in body and header whether ranking is keyword-only.

    With an embedder loaded, the run's fresh facts get their vectors in the
    background: ask again for a few seconds before reporting it degraded.
    Keyword-only recall is a supported way to run, but not the one an operator
    who rolled out hybrid recall expects: a warning, a failure under
    `expect="hybrid"`, a plain pass under `expect="keyword"`.
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
    if not degraded:
        if expect == "keyword":
            raise CheckFailed("expected keyword-only recall, but an embedder is loaded (degraded false)")
        return f"embedder loaded (degraded false): {reply.body['count']} rows, X-Memory-Degraded false"
    reason = reply.body.get("degraded_reason")
    if embedder_loaded:
        seen = f"{reply.body['count']} rows, degraded true after {EMBED_WAIT_S:g} s, X-Memory-Degraded true ({reason})"
        if expect == "any":
            raise CheckWarning(seen)
        raise CheckFailed(f"expected {expect} recall: {seen}")
    seen = f"keyword-only recall: {reply.body['count']} rows, degraded true, X-Memory-Degraded true ({reason})"
    if expect == "hybrid":
        raise CheckFailed(f"expected hybrid recall, got {seen}")
    if expect == "any":
        raise CheckWarning(f"{seen}; --expect hybrid makes this a failure, --expect keyword a pass")
    return seen


def check_a2a_mesh(service_port: int, mesh: Mesh) -> str:
    """The mesh is untouched: every agent that answered 200 before the rollout still does, and the service
    holds none of the mesh's ports (a skipped one included)."""
    if service_port in mesh.ports:
        raise CheckFailed(
            f"the memory service listens on {service_port}, a port of the A2A mesh ({describe_ports(mesh)})"
        )
    now = sweep(mesh)
    try:
        recorded = json.loads(mesh.baseline.read_text())
        before = {int(port): answer for port, answer in recorded["answers"].items()}
    except FileNotFoundError:
        raise CheckWarning(
            f"no baseline at {mesh.baseline} to compare with (record one with check --a2a-record before a rollout); "
            f"now: {describe_answers(now)}"
        ) from None
    except (ValueError, KeyError, AttributeError, TypeError) as error:
        raise CheckFailed(f"the baseline {mesh.baseline} is not one check --a2a-record wrote ({error})") from None
    lost = {port: answer for port, answer in now.items() if before.get(port) == 200 and answer != 200}
    if lost:
        raise CheckFailed(
            f"answered 200 before the rollout ({recorded.get('recorded_at')}), not now: {describe_answers(lost)}"
        )
    unknown = [port for port in now if port not in before]
    note = f"; not in the baseline: {', '.join(map(str, unknown))}" if unknown else ""
    return f"as before the rollout ({recorded.get('recorded_at')}): {describe_answers(now)}{note}"


def record_mesh(mesh: Mesh) -> dict[int, int | str]:
    """Ask every agent of the mesh now and keep the answers as the baseline the mesh check compares with."""
    answers = sweep(mesh)
    mesh.baseline.parent.mkdir(parents=True, exist_ok=True)
    recorded = {
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "path": mesh.path,
        "answers": {str(port): answer for port, answer in answers.items()},
    }
    partial = mesh.baseline.with_name(mesh.baseline.name + ".partial")
    partial.write_text(json.dumps(recorded, indent=1) + "\n")
    partial.replace(mesh.baseline)
    return answers


# ==== Helpers ====


def sweep(mesh: Mesh) -> dict[int, int | str]:
    """Each swept port's answer to GET mesh.path on loopback: its status, or why there was none."""
    answers: dict[int, int | str] = {}
    for port in mesh.swept:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=A2A_TIMEOUT_S)
        try:
            conn.request("GET", mesh.path, headers={"Accept": "application/json"})
            response = conn.getresponse()
            response.read()
            answers[port] = response.status
        except ConnectionRefusedError:
            answers[port] = "refused"
        except TimeoutError:
            answers[port] = "timed out"
        except (OSError, http.client.HTTPException) as error:
            answers[port] = type(error).__name__
        finally:
            conn.close()
    return answers


def describe_answers(answers: dict[int, int | str]) -> str:
    """'8300 200, 8301 refused, ...'."""
    return ", ".join(f"{port} {answer}" for port, answer in answers.items()) or "no ports swept"


def describe_ports(mesh: Mesh) -> str:
    skipped = f", {', '.join(map(str, mesh.skip))} skipped" if mesh.skip else ""
    return f"{min(mesh.ports)}-{max(mesh.ports)}{skipped}" if mesh.ports else "none"


def parse_ports(text: str) -> tuple[int, ...]:
    """'8300-8307', '8300,8302,8310-8312' or 'none' as ports, in order."""
    if text.strip().lower() in ("none", ""):
        return ()
    ports: list[int] = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d{1,5})\s*(?:-\s*(\d{1,5})\s*)?", part)
        if not match:
            raise argparse.ArgumentTypeError(f"expected ports like 8300-8307 or 8300,8302, got {text!r}")
        first, last = int(match[1]), int(match[2] or match[1])
        if not 1 <= first <= last <= 65535:
            raise argparse.ArgumentTypeError(f"expected ports between 1 and 65535, low to high, got {part.strip()!r}")
        ports.extend(range(first, last + 1))
    return tuple(dict.fromkeys(ports))


def default_baseline() -> Path:
    """Where --a2a-record keeps the mesh's answers: the user's state folder (XDG), not the working directory."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "solos-memory" / "a2a-baseline.json"


def write_check_fact(client: Client, writer: str, run_id: str, fact: str) -> Reply:
    """Write one long fact tagged so --cleanup can find it."""
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
    """One line per check, PASS/WARN/FAIL, and a summary."""
    width = max(len(result.name) for result in results)
    for result in results:
        verdict = "FAIL" if not result.ok else "WARN" if result.warning else "PASS"
        print(f"{result.name:<{width}}  {verdict}  {result.detail}")
    passed, warned = sum(result.ok for result in results), sum(result.warning for result in results)
    print(f"{passed}/{len(results)} checks passed" + (f", {warned} with a warning" if warned else ""))


# ==== Cleanup ====


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
    seconds = number_in(0.001, None, whole=False)  # 0 or less: the socket's "Timeout value out of range", unnamed
    parser.add_argument("--timeout", type=seconds, default=5.0, help="seconds per HTTP request (default: %(default)s)")
    parser.add_argument(
        "--expect",
        choices=EXPECTATIONS,
        default="any",
        help="the recall rolled out: hybrid fails on keyword-only, keyword on an embedder, any warns "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--a2a-ports",
        type=parse_ports,
        default=A2A_PORTS,
        help="the fleet's A2A agents on loopback, e.g. 8300-8307 or 8300,8302; none: no mesh check "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--a2a-skip",
        type=parse_ports,
        default=A2A_SKIP,
        help="mesh ports not asked (known dead) (default: %(default)s)",
    )
    parser.add_argument("--a2a-path", default=A2A_PATH, help="what each A2A agent is asked for (default: %(default)s)")
    parser.add_argument(
        "--a2a-baseline",
        type=Path,
        default=default_baseline(),
        help="the mesh's answers from before the rollout (default: %(default)s)",
    )
    parser.add_argument(
        "--a2a-record",
        action="store_true",
        help="instead of checking, ask the mesh now and record the answers as --a2a-baseline (before a rollout)",
    )
    parser.add_argument(
        "--cleanup",
        action="store_true",
        help="instead of checking, delete the rows earlier checks wrote to --db (default: check)",
    )


def run(args: argparse.Namespace) -> int:
    """Run the checks (or the cleanup) the parsed arguments ask for; 0 when all is well."""
    if args.cleanup:
        return cleanup_database(args.db)
    mesh = Mesh(args.a2a_ports, args.a2a_skip, args.a2a_path, args.a2a_baseline) if args.a2a_ports else None
    if args.a2a_record:
        if mesh is None:
            print("--a2a-record needs mesh ports (--a2a-ports)", file=sys.stderr)
            return 2
        answers = record_mesh(mesh)
        answered = sum(answer == 200 for answer in answers.values())
        print(f"A2A mesh ({describe_ports(mesh)}): {describe_answers(answers)}")
        print(f"recorded {answered} of {len(answers)} answering 200 in {mesh.baseline}")
        return 0
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
            expect=args.expect,
            mesh=mesh,
        )
    except ValueError as error:
        print(error, file=sys.stderr)
        return 2
    print_table(results)
    if results.facts_written:
        print(CLEANUP_HINT.format(command=args.cleanup_command))
    return 0 if all(result.ok for result in results) else 1


def cleanup_database(path: str) -> int:
    """Delete the long facts these checks wrote, from an existing database file (mode=rw: a mistyped path is
    an error, not a new file). A row is the checks' only if both its source and a JSON tag say solos-check."""
    try:
        conn = sqlite3.connect(Path(path).resolve().as_uri() + "?mode=rw", uri=True, isolation_level=None, timeout=5)
        try:
            removed = solos_store.SQLITE.delete_tagged_facts(conn, CHECK_SOURCE, CHECK_TAG)
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
