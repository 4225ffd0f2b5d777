"""Every operation's bad input, derived from its own input schema, through REST and MCP.

The operation table is read here, so a new operation (or field) is covered without editing this file. For each
field, invalid values come from the field's schema (its type, bounds, lengths, enum, pattern, format, items),
plus lone surrogates, the field given twice, an unknown field, each required field left out and arguments that
are not an object. Each is sent with an otherwise valid call, as JSON (MCP tools/call, REST bodies) or as a
query string (REST GET and DELETE, and read_events' stream door), and must get a 4xx naming the field (REST) or
an `isError` result whose error names it (MCP: the bridge's convention for a rule violation, so the agent can
read it and retry; JSON it cannot parse, or arguments that are not an object, are JSON-RPC errors), never a
500, with a bounded message, and must leave every table's rows as they were (read in one transaction of a
separate connection before and after each call). An independent validator (jsonschema, patterns read as
ECMA-262) confirms each JSON case is invalid by the schema the service advertises, each schema keyword is one
the validator enforces, and each operation's valid call succeeds, so the harness cannot pass by being broken.
Values at the schemas' edges (bounds, full lengths, odd text) must never fault either.
"""

from __future__ import annotations

import datetime
import hashlib
import http.client
import json
import re
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import pytest
from conftest import Reply, raw_exchange, start_server, stop_server
from jsonschema import Draft202012Validator, ValidationError, validators

import solos_bounds
import solos_memory
import solos_provenance
import solos_validation

OPERATIONS = solos_memory.OPERATIONS
JSON_TYPE_SAMPLES: dict[str, Any] = {
    "string": "7",
    "integer": 7,
    "number": 7.5,
    "boolean": True,
    "array": ["7"],
    "object": {"7": 7},
}
MAX_REQUEST_LINE = 65_536  # http.server's limit: a longer request line is a 414, before any field is read
MAX_MESSAGE = 1_000  # an error says what is wrong; it does not echo the caller's 300 KB back (nor log it)
HUGE = 2**63  # one past the largest 64-bit integer
# Invalid by the house rules, not by the schema alone: a lone surrogate is valid JSON (an escape) and a JSON Schema
# string, but no UTF-8 store can keep it; 1.0 is a JSON Schema integer, but the service wants an integer's JSON.
BEYOND_SCHEMA = ("lone high surrogate", "lone low surrogate in text", "float with no fraction for integer")
RAW = "__raw_json_{}__"  # a placeholder json.dumps leaves alone, replaced by JSON text Python cannot produce


def now_stamp() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")


# Valid examples for the patterns the schemas use; a new pattern fails the valid-call test until one is added.
PATTERN_EXAMPLES = {
    solos_validation.AGENT_PATTERN: lambda: "atlas",
    solos_validation.NO_NUL: lambda: "x",
    solos_provenance.TIMESTAMP: now_stamp,
}
# Strings a pattern may refuse: each is a case wherever the field's own pattern, read as JSON Schema reads it
# (ECMA-262: \d is 0-9, $ is the end), refuses it.
PATTERN_PROBES = (
    "",
    " ",
    "-x",
    "a b",
    "x\n",
    "\nx",
    "x\x00",
    "x\x01\x1f",
    "ätlas",
    "x" * 65,
    "٢٠٢٦-١٢-٠١T٠٠:٠٠:٠٠Z",  # Arabic-Indic digits: \d in Python, not in JSON Schema
    "2026-12-01T00:00:00Z\n",
    "2026-12-01",
    "2026-12-01T00:00:00",
    "2026-12-01 00:00:00Z",
)
IMPOSSIBLE_TIMES = ("2026-13-01T00:00:00Z", "2026-02-30T00:00:00Z", "2026-12-01T24:00:00Z", "2026-12-01T00:60:00Z")


@dataclass(frozen=True)
class Case:
    """One bad call: the field its error must name, what is wrong, and the arguments or query pairs."""

    op: str
    field: str
    what: str
    args: Any = None  # JSON arguments (MCP, and REST bodies); not an object in the whole-argument cases
    pairs: tuple[tuple[str, str], ...] | None = None  # REST query pairs (GET and DELETE routes)
    raw: dict[str, str] = field(default_factory=dict)  # placeholders -> JSON text
    schema_checked: bool = True  # jsonschema must call it invalid (False: JSON text Python's json cannot make)
    twice: tuple[str, Any] | None = None  # the field given once more, first, in the same JSON object
    unencoded: bool = False  # the query's bytes sent as they are, not percent-encoded (curl sends what is typed)

    def body(self) -> bytes:
        text = json.dumps(self.args)
        for placeholder, literal in self.raw.items():
            text = text.replace(json.dumps(placeholder), literal)
        if self.twice is not None:
            text = "{" + json.dumps(self.twice[0]) + ": " + json.dumps(self.twice[1]) + ", " + text[1:]
        return text.encode()

    def __str__(self) -> str:
        return f"{self.op}.{self.field[:24]}: {self.what}"


# ==== Valid values, from the schema ====


def example(spec: dict) -> Any:
    """A valid value for a field's schema."""
    kind = spec["type"]
    if spec.get("default") not in (None, [], ""):
        return spec["default"]  # ttl_s: a row that outlives the run (an expiry would write events meanwhile)
    if "enum" in spec:
        return spec["enum"][0]
    if kind == "string":
        if "pattern" in spec:
            if spec["pattern"] not in PATTERN_EXAMPLES:
                pytest.fail(f"no example for pattern {spec['pattern']}: add one to PATTERN_EXAMPLES")
            return PATTERN_EXAMPLES[spec["pattern"]]()
        return "x" * max(1, spec.get("minLength", 0))
    if kind == "integer":
        return max(spec.get("minimum", 1), 1) if spec.get("maximum", 1) >= 1 else spec["minimum"]
    if kind == "number":
        if "minimum" in spec:
            return spec["minimum"]
        return spec["exclusiveMinimum"] + 1 if "exclusiveMinimum" in spec else 0.5
    if kind == "boolean":
        return True
    if kind == "array":
        return [example(spec["items"])]
    pytest.fail(f"no example for a {kind}")


def valid_args(op_name: str) -> dict:
    """The operation's required fields, and the agent wherever it may be named (some views need one)."""
    schema = OPERATIONS[op_name].input_schema
    names = [name for name in schema["properties"] if name in schema["required"] or name == "agent"]
    return {name: example(schema["properties"][name]) for name in names}


# ==== Invalid values, from the schema ====


def ecma_refuses(pattern: str, value: str) -> bool:
    """The pattern refuses the value as JSON Schema reads it: ECMA-262, where \\d is 0-9 and $ ends the text."""
    body = pattern.removeprefix("^").removesuffix("$")
    return re.fullmatch(body, value, flags=re.ASCII) is None


def bad_values(spec: dict, required: bool) -> Iterator[tuple[str, Any, dict[str, str]]]:
    """(what, value, raw) for each value the field's schema refuses; raw maps placeholders to JSON text."""
    kind = spec["type"]
    for other, sample in JSON_TYPE_SAMPLES.items():
        if other != kind and not (kind == "number" and other == "integer"):
            yield f"{other} for {kind}", sample, {}
    if kind in ("integer", "number"):
        yield f"bool for {kind}", False, {}
        yield f"string number for {kind}", "1", {}
        for name in ("NaN", "Infinity", "-Infinity"):
            yield f"string {name}", name, {}
        yield "number past a double (1e400)", RAW.format(0), {RAW.format(0): "1e400"}
        yield "2**63", HUGE, {}
        yield "-2**63 - 1", -HUGE - 1, {}
        yield "10**30", 10**30, {}
        yield "1e300", 1e300, {}
        step = 1 if kind == "integer" else 0.5
        if "minimum" in spec:
            yield "below minimum", spec["minimum"] - step, {}
            if spec["minimum"] >= 0:
                yield "negative", -1, {}
        if "exclusiveMinimum" in spec:
            yield "at exclusiveMinimum", spec["exclusiveMinimum"], {}
            yield "negative", -1, {}
        if "maximum" in spec:
            yield "above maximum", spec["maximum"] + step, {}
    if kind == "integer":
        yield "float for integer", 1.5, {}
        yield "float with no fraction for integer", RAW.format(1), {RAW.format(1): "1.0"}
    if kind == "string":
        good = example(spec)
        if "maxLength" in spec:
            yield "over maxLength", "x" * (spec["maxLength"] + 1), {}
            yield "over maxLength in astral characters", "\U0001f600" * (spec["maxLength"] + 1), {}
        if spec.get("minLength", 0) >= 1:
            yield "empty under minLength", "", {}
        yield "lone high surrogate", "\ud800", {}
        yield "lone low surrogate in text", "ok\udfffok", {}
        if "enum" in spec:
            yield "outside the enum", "nope", {}
            yield "enum value in upper case", spec["enum"][0].upper(), {}
            yield "enum value with a space", spec["enum"][0] + " ", {}
        if "pattern" in spec:
            probes = [*PATTERN_PROBES, good + "\n", " " + good, good + "\x00"]
            for probe in dict.fromkeys(probes):
                if ecma_refuses(spec["pattern"], probe):
                    yield f"pattern refuses {probe[:24]!r}", probe, {}
        if spec.get("format") == "date-time":  # the shape is right, the time does not exist
            for probe in IMPOSSIBLE_TIMES:
                yield f"format refuses {probe!r}", probe, {}
    if kind == "array":
        items = spec["items"]
        if "maxItems" in spec:
            yield "over maxItems", [example(items)] * (spec["maxItems"] + 1), {}
        if spec.get("uniqueItems"):
            yield "duplicate items (uniqueItems)", [example(items)] * 2, {}
        for what, item, raw in bad_values(items, True):
            yield f"item: {what}", [item], raw
    if required:
        yield "null for a required field", None, {}


def cases_for(op_name: str) -> list[Case]:
    """Every bad call of one operation, as JSON arguments."""
    schema = OPERATIONS[op_name].input_schema
    base = valid_args(op_name)
    cases = []
    for name, spec in schema["properties"].items():
        required = name in schema["required"]
        for what, value, raw in bad_values(spec, required):
            args = {**base, name: value}
            checked = not raw and not what.endswith(BEYOND_SCHEMA)
            cases.append(Case(op_name, name, what, args, raw=raw, schema_checked=checked))
        if required:
            cases.append(Case(op_name, name, "missing required field", {k: v for k, v in base.items() if k != name}))
        # JSON parsers disagree on which of two values for one name counts (RFC 8259 4): a proxy that reads the
        # first and a service that reads the last see two different calls. REST refuses a repeated query field.
        given = base.get(name, example(spec))  # jsonschema sees the parsed object: one value
        args = {**base, name: given}
        cases.append(Case(op_name, name, "given twice in one object", args, schema_checked=False, twice=(name, given)))
    for unknown in ("nope", "Agent", "\ud800", "x" * 100_000):
        cases.append(Case(op_name, unknown, f"unknown field {unknown[:12]!r}", {**base, unknown: 1}))
    return cases


NOT_OBJECTS = ([], ["agent", "atlas"], "agent=atlas", 7, True)


def whole_cases_for(op_name: str) -> list[Case]:
    """Arguments that are not a JSON object: REST names the body; MCP answers -32602 (the bridge's invalid
    params), before any operation runs."""
    return [Case(op_name, "body", f"arguments {json.dumps(value)}", value) for value in NOT_OBJECTS]


# Text every free-text field must take (stored, or searched as words): no 500 on the way.
ODD_TEXTS = (
    "\x01\x08\x0b\x1f\x7f",
    "line\u2028break\u2029\ufeff\u200b",
    "e\u0301" * 8,
    '" * ^ NEAR(a b) OR AND NOT x:y ( ) { } -a +b',
    "'; DROP TABLE memory_longterm; --",
    "%s %d {0} \\N \\u0000",
    "\U0010ffff\ufffd",
)


def edge_values(spec: dict) -> Iterator[tuple[str, Any]]:
    """(what, value): values at the edges of what the field's schema takes."""
    kind = spec["type"]
    if kind in ("integer", "number"):
        for bound in ("minimum", "maximum"):
            if bound in spec:
                yield bound, spec[bound]
        if "exclusiveMinimum" in spec:
            yield "just past exclusiveMinimum", spec["exclusiveMinimum"] + (1 if kind == "integer" else 1e-9)
        if kind == "integer" and "maximum" not in spec:
            yield "largest 64-bit", HUGE - 1
        if kind == "number":
            yield "an integer for a number", int(spec.get("minimum", 1))
    if kind == "string" and "enum" in spec:
        for value in spec["enum"]:
            yield f"enum {value}", value
    elif kind == "string" and ("pattern" not in spec or spec["pattern"] == "^[^\\u0000]*$"):
        if "maxLength" in spec:
            yield "maxLength", "y" * spec["maxLength"]
            yield "maxLength in astral characters", "\U0001f600" * spec["maxLength"]
        for text in ODD_TEXTS:
            if len(text) <= spec.get("maxLength", 1 << 30):
                yield f"text {text[:12]!r}", text
    if kind == "boolean":
        yield "false", False
    if kind == "array":
        items = spec["items"]
        if "enum" in items:
            yield "every enum value", list(items["enum"])[: spec.get("maxItems", 1 << 30)]
        elif "maxItems" in spec:
            many = spec["maxItems"]
            if items["type"] == "integer":
                yield "maxItems", list(range(1, many + 1))
            else:
                yield "maxItems", [f"a{i}" for i in range(many)]
        yield "empty", []


def edge_cases_for(op_name: str) -> list[Case]:
    schema = OPERATIONS[op_name].input_schema
    base = valid_args(op_name)
    return [
        Case(op_name, name, what, {**base, name: value})
        for name, spec in schema["properties"].items()
        for what, value in edge_values(spec)
    ]


# ==== The same, as a query string ====


def query_text(value: Any) -> str | None:
    """A JSON value as a REST query string carries it; None where it cannot (objects, null, nested arrays)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return value if isinstance(value, str) else json.dumps(value)
    if isinstance(value, list) and all(isinstance(item, (str, int, float)) for item in value):
        return ",".join(query_text(item) or "" for item in value)
    return None


def query_bad_values(spec: dict, required: bool) -> Iterator[tuple[str, str]]:
    """(what, text) for each query-string value the field's schema refuses once coerced as REST coerces: numbers
    and booleans from their text, a list from comma-separated text (blank items dropped), strings as they are."""
    kind = spec["type"]
    if kind in ("integer", "number"):
        for text in ("", "x", "1x", "0x10", " 1", "1 ", "true", "NaN", "Infinity", "-inf", "1e999", "١", "1_0"):
            yield f"{text!r} for {kind}", text
        if kind == "integer":
            for text in ("1.5", "1e3", "1.0", "9" * 41):
                yield f"{text[:24]!r} for integer", text
    if kind == "boolean":
        for text in ("", "yes", "1", "True", "on"):
            yield f"{text!r} for boolean", text
    for what, value, raw in bad_values(spec, required):
        if raw or value is None:
            continue  # JSON text Python's json cannot write has no query form
        if kind in ("integer", "number") and type(value) in (int, float):
            yield what, json.dumps(value)  # the range cases
        elif kind == "string" and isinstance(value, str):
            yield what, value
        elif kind == "array" and isinstance(value, list) and all(isinstance(item, str) for item in value):
            if all(item.strip() == item and item and "," not in item for item in value):
                yield what, ",".join(value)


def query_cases_for(op_name: str) -> list[Case]:
    """Every bad call of a GET or DELETE operation, as query pairs."""
    schema = OPERATIONS[op_name].input_schema
    base = {name: query_text(value) or "" for name, value in valid_args(op_name).items()}
    cases = []
    for name, spec in schema["properties"].items():
        required = name in schema["required"]
        for what, text in query_bad_values(spec, required):
            cases.append(Case(op_name, name, what, pairs=tuple({**base, name: text}.items()), schema_checked=False))
        if required:
            pairs = tuple((k, v) for k, v in base.items() if k != name)
            cases.append(Case(op_name, name, "missing required field", pairs=pairs, schema_checked=False))
        given = base.get(name, query_text(example(spec)) or "")
        twice = (*base.items(), (name, given)) if name in base else ((name, given), *base.items(), (name, given))
        cases.append(Case(op_name, name, "given twice", pairs=tuple(twice), schema_checked=False))
        # Bytes that are not UTF-8, sent without percent-encoding (\udcff: surrogateescape's byte 0xff).
        pairs = tuple({**base, name: "ok\udcff"}.items())
        cases.append(Case(op_name, name, "unencoded byte 0xff", pairs=pairs, schema_checked=False, unencoded=True))
    for unknown in ("nope", "Agent", "x" * 20_000):
        cases.append(Case(op_name, unknown, f"unknown field {unknown[:12]!r}", pairs=(*base.items(), (unknown, "1"))))
    return cases


def query_string(pairs: tuple[tuple[str, str], ...]) -> str:
    """Percent-encoded UTF-8; a lone surrogate is sent as the bytes Python's surrogatepass writes (not UTF-8)."""
    return "&".join(
        f"{quote(k.encode('utf-8', 'surrogatepass'), safe='')}={quote(v.encode('utf-8', 'surrogatepass'), safe='')}"
        for k, v in pairs
    )


# ==== The database, before and after ====


# solos_memory_meta keys the service's own timers move (the expiry sweep, event pruning), whatever is called.
SWEEP_MARKS = ("events_expired_through", "events_pruned_through")


def snapshot(db_path) -> dict[str, str]:
    """Each table's rows (shadow tables of the indexes included), hashed, read in one transaction of a separate
    read-only connection: in WAL mode it sees exactly what was committed."""
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, isolation_level=None, timeout=5)
    try:
        conn.execute("BEGIN")
        tables = [
            name
            for name, sql in conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table' ORDER BY name")
            if not (sql or "").upper().startswith("CREATE VIRTUAL")
        ]
        hashes = {}
        for table in tables:
            rows = conn.execute(f'SELECT * FROM "{table}"').fetchall()  # noqa: S608 - names from sqlite_master
            if table == "solos_memory_meta":
                rows = [row for row in rows if row[0] not in SWEEP_MARKS]
            hashes[table] = hashlib.sha256(repr(sorted(map(repr, rows))).encode()).hexdigest()
        conn.execute("COMMIT")
        return hashes
    finally:
        conn.close()


def settle(running) -> None:
    """What a valid call leaves buffered (deliveries, activity counts) written now, not during the next case."""
    memory = running.server.memory
    memory.deliveries.flush()
    memory.activity.save()


# ==== Sending ====


def send_rest(running, case: Case):
    op = OPERATIONS[case.op]
    if case.unencoded:  # http.client sends only ASCII targets
        return send_raw(running, op.method, op.path, case.pairs or ())
    if case.pairs is not None:
        return running.request(op.method, op.path + "?" + query_string(case.pairs))
    return running.request(op.method, op.path, raw=case.body(), headers={"Content-Type": "application/json"})


def send_raw(running, method: str, path: str, pairs: tuple[tuple[str, str], ...], headers: str = "") -> Reply:
    """A request whose target carries the pairs' bytes as they are (a surrogate escape as its byte)."""
    target = path.encode() + b"?" + b"&".join(f"{k}={v}".encode("utf-8", "surrogateescape") for k, v in pairs)
    head = f" HTTP/1.1\r\nHost: 127.0.0.1:{running.port}\r\n{headers}Connection: close\r\n\r\n".encode()
    answer = raw_exchange(running.port, method.encode() + b" " + target + head)
    status_line, _, rest = answer.partition(b"\r\n")
    data = rest.partition(b"\r\n\r\n")[2]
    try:
        parsed = json.loads(data)
    except ValueError:
        parsed = None
    return Reply(int(status_line.split()[1]), {}, parsed, data)


def send_stream(running, case: Case) -> Reply:
    """The stream's door: a refusal is JSON before any event; a 200 is the stream opening (then hung up)."""
    op = OPERATIONS[case.op]
    if case.unencoded:
        return send_raw(running, "GET", op.path, case.pairs or (), "Accept: text/event-stream\r\n")
    conn = http.client.HTTPConnection("127.0.0.1", running.port, timeout=30)
    try:
        conn.request("GET", op.path + "?" + query_string(case.pairs or ()), headers={"Accept": "text/event-stream"})
        response = conn.getresponse()
        data = b"(a stream opened)" if response.status == 200 else response.read()
        try:
            parsed = json.loads(data)
        except ValueError:
            parsed = None
        return Reply(response.status, dict(response.getheaders()), parsed, data)
    finally:
        conn.close()


def send_mcp(running, case: Case):
    rpc = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": case.op, "arguments": 0}})
    body = rpc.replace('"arguments": 0', '"arguments": ' + case.body().decode())
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2025-11-25",
    }
    return running.request("POST", "/mcp", raw=body.encode(), headers=headers)


def refusal_problem(reply, case: Case, transport: str) -> str | None:
    """Why a reply is not the refusal the house rule asks for, or None."""
    if transport == "rest" and case.pairs is None and not isinstance(case.args, dict):
        whole = (reply.body or {}).get("error") or {}
        return None if reply.status == 400 and whole.get("field") == "body" else f"{reply.status} {reply.raw[:200]!r}"
    if transport == "mcp" and case.twice is not None:
        error = (reply.body or {}).get("error") or {}
        named = repr(case.field) in error.get("message", "")
        return None if error.get("code") == -32700 and named else f"not a -32700 naming it: {reply.raw[:200]!r}"
    if transport == "mcp" and not isinstance(case.args, dict):
        code = ((reply.body or {}).get("error") or {}).get("code")
        return None if code == -32602 else f"not a -32602 error: {reply.status} {reply.raw[:200]!r}"
    if transport == "rest":
        if reply.status == 414 and len(query_string(case.pairs or ())) > MAX_REQUEST_LINE:
            return None  # http.server refuses the request line before any field is read
        if not 400 <= reply.status < 500:
            return f"status {reply.status}: {reply.raw[:200]!r}"
        error = (reply.body or {}).get("error") or {}
    else:
        if reply.status != 200 or not isinstance(reply.body, dict) or "result" not in reply.body:
            return f"not a tool result: {reply.status} {reply.raw[:200]!r}"
        result = reply.body["result"]
        if result.get("isError") is not True:
            return f"isError is not true: {reply.raw[:200]!r}"
        error = (result.get("structuredContent") or {}).get("error") or {}
        if not 400 <= error.get("status", 0) < 500:
            return f"error status {error.get('status')}: {reply.raw[:200]!r}"
    if error.get("field") != case.field:
        return f"error names {error.get('field')!r}, not {case.field[:40]!r}: {error.get('message', '')[:160]!r}"
    if not error.get("message") or b"Traceback" in reply.raw:
        return f"no clear message: {reply.raw[:200]!r}"
    if len(error["message"]) > MAX_MESSAGE:
        return f"a message of {len(error['message'])} characters: {error['message'][:80]!r}..."
    return None


# ==== The server and its rows ====

SEEDS = (
    ("POST", "/v1/short", {"agent": "atlas", "key": "x", "value": "a short value", "tags": ["x"]}),
    ("POST", "/v1/long", {"agent": "atlas", "fact": "a long fact", "topic": "x", "tags": ["x"]}),
    ("POST", "/v1/episodic", {"agent": "atlas", "event_type": "x", "summary": "an episode", "idempotency_key": "x"}),
    ("PUT", "/v1/sharing", {"agent": "atlas", "episodic": True}),
    ("POST", "/v1/long", {"agent": "sol", "fact": "sol's fact, read by atlas"}),
)


def seed(running) -> None:
    """Rows the valid calls act on (atlas's short key x, id 1 of each tier at first); idempotent, so a valid
    delete can run again after another deleted its row."""
    for method, path, body in SEEDS:
        assert running.request(method, path, body=body).status in (200, 201)


@pytest.fixture(scope="module")
def running(tmp_path_factory):
    """One server whose database holds a row of every tier (id 1, atlas's), sharing on, a notice and events."""
    server = start_server(tmp_path_factory.mktemp("bad-input") / "solos.db")
    seed(server)
    assert server.recall("atlas", "fact", tiers="long,short,episodic").status == 200
    settle(server)
    yield server
    stop_server(server)


# Operations REST also serves as a Server-Sent Events stream (Accept: text/event-stream): a third door, with
# the same checks before the first event byte.
STREAMED = ("read_events",)
REST_CASES = [
    (transport, name)
    for name, op in OPERATIONS.items()
    for transport in (
        ("rest-query", "rest-stream")
        if name in STREAMED
        else ("rest-query",)
        if op.method in ("GET", "DELETE")
        else ("rest-body",)
    )
]


def run_cases(running, cases: list[Case], transport: str) -> list[str]:
    failures = []
    for case in cases:
        before = snapshot(running.db_path)
        send = {"mcp": send_mcp, "rest-stream": send_stream}.get(transport, send_rest)
        reply = send(running, case)
        problem = refusal_problem(reply, case, "mcp" if transport == "mcp" else "rest")
        after = snapshot(running.db_path)
        changed = sorted(table for table in before if before[table] != after.get(table))
        if changed:
            problem = f"{problem or 'refused'}; the call changed rows of {changed}"
            settle(running)
        if problem:
            failures.append(f"{transport} {case}: {problem}")
    return failures


def ecma_pattern(validator: Any, pattern: str, instance: Any, schema: dict) -> Iterator[ValidationError]:
    if isinstance(instance, str) and ecma_refuses(pattern, instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


# JSON Schema's patterns are ECMA-262 regular expressions; jsonschema runs them as Python's re.search.
EcmaValidator = validators.extend(Draft202012Validator, {"pattern": ecma_pattern})


def test_every_case_is_invalid_by_the_advertised_schema():
    """The harness's own check: jsonschema refuses every JSON case, so a refusal below is owed."""
    accepted = []
    for name, op in OPERATIONS.items():
        validator = EcmaValidator(op.input_schema, format_checker=Draft202012Validator.FORMAT_CHECKER)
        assert validator.is_valid(valid_args(name)), (name, list(validator.iter_errors(valid_args(name))))
        accepted += [str(case) for case in cases_for(name) if case.schema_checked and validator.is_valid(case.args)]
    assert not accepted, accepted


@pytest.mark.parametrize("name", list(OPERATIONS))
def test_bad_json_arguments_are_refused_over_mcp(running, name):
    failures = run_cases(running, cases_for(name) + whole_cases_for(name), "mcp")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize(("transport", "name"), REST_CASES)
def test_bad_arguments_are_refused_over_rest(running, transport, name):
    cases = query_cases_for(name) if transport != "rest-body" else cases_for(name) + whole_cases_for(name)
    failures = run_cases(running, cases, transport)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("name", list(OPERATIONS))
def test_the_valid_call_each_case_starts_from_succeeds(running, name):
    """Each case differs from this call in one field; it passes on both transports (after the bad ones: forget's
    valid call forgets atlas's short row 1, and the second forget of it answers the same)."""
    op = OPERATIONS[name]
    args = valid_args(name)
    seed(running)
    if op.method in ("GET", "DELETE"):
        pairs = tuple((k, query_text(v) or "") for k, v in args.items())
        rest = send_rest(running, Case(name, "", "valid", pairs=pairs))
    else:
        rest = send_rest(running, Case(name, "", "valid", args))
    assert rest.status in (200, 201), (name, rest.raw[:300])
    seed(running)
    mcp = send_mcp(running, Case(name, "", "valid", args))
    assert mcp.status == 200 and mcp.body["result"]["isError"] is False, (name, mcp.raw[:300])
    settle(running)


def outcome(reply) -> tuple:
    """What a tool call came to, without the answer's own content: the error's code and field, or success."""
    result = reply.body.get("result") or {}
    error = (result.get("structuredContent") or {}).get("error") or {}
    return reply.status, result.get("isError"), error.get("code"), error.get("field")


@pytest.mark.parametrize("name", list(OPERATIONS))
def test_null_for_an_optional_field_reads_as_the_field_left_out(running, name):
    """The one leniency past the schema, kept on purpose: an optional field given as null is read as absent (its
    default). LLM tool callers send null for what they leave out, and import-qdrant's payloads carry it; a type
    of [T, "null"] would advertise it, but some function-calling clients refuse type arrays."""
    schema = OPERATIONS[name].input_schema
    for field_name in schema["properties"]:
        if field_name in schema["required"]:
            continue
        args = valid_args(name)
        left_out = {k: v for k, v in args.items() if k != field_name}
        seed(running)
        expected = outcome(send_mcp(running, Case(name, field_name, "left out", left_out)))
        seed(running)
        given_null = outcome(send_mcp(running, Case(name, field_name, "null", {**left_out, field_name: None})))
        assert given_null == expected, (name, field_name)
    settle(running)


# What solos_validation.check_args enforces, each keyword with a generator of bad values above; a schema that
# advertises any other keyword (minItems, multipleOf, another format) promises a bound nobody checks.
ENFORCED = {
    "object": {"type", "properties", "required", "additionalProperties"},
    "field": {"type", "description", "default", "minimum", "maximum", "exclusiveMinimum", "minLength", "maxLength"}
    | {"pattern", "enum", "items", "maxItems", "uniqueItems", "format"},
}


def fields_of(schema: dict, prefix: str) -> Iterator[tuple[str, dict]]:
    for name, spec in schema["properties"].items():
        yield f"{prefix}.{name}", spec
        if "items" in spec:
            yield f"{prefix}.{name}[]", spec["items"]


def test_every_keyword_a_schema_advertises_is_one_the_validator_enforces():
    for name, op in OPERATIONS.items():
        schema = op.input_schema
        assert set(schema) == ENFORCED["object"] and schema["additionalProperties"] is False, name
        assert set(schema["required"]) <= set(schema["properties"]), name
        for path, spec in fields_of(schema, name):
            assert set(spec) <= ENFORCED["field"], (path, set(spec) - ENFORCED["field"])
            assert spec["type"] in JSON_TYPE_SAMPLES and spec["type"] != "object", path
            assert spec.get("format", "date-time") == "date-time", path
            if spec["type"] in ("integer", "number"):  # else only the 64-bit check bounds it, unadvertised
                assert "maximum" in spec and ("minimum" in spec or "exclusiveMinimum" in spec), path


def test_every_default_is_valid_by_its_own_schema():
    """check_args fills defaults without checking them: each must pass both the schema and the validator."""
    for name, op in OPERATIONS.items():
        for path, spec in fields_of(op.input_schema, name):
            if spec.get("default") is not None:
                assert EcmaValidator(spec).is_valid(spec["default"]), path
                assert solos_validation.check_value(path, spec, spec["default"]) == spec["default"], path


def test_cases_are_enumerated_for_every_field_of_every_operation():
    """Each field of each operation has cases (a field the generator missed would go untested)."""
    for name, op in OPERATIONS.items():
        covered = {case.field for case in cases_for(name)}
        assert set(op.input_schema["properties"]) <= covered, name
        if op.method in ("GET", "DELETE"):
            assert set(op.input_schema["properties"]) <= {case.field for case in query_cases_for(name)}, name
    assert solos_bounds.MAX_ID == HUGE - 1


def server_fault(reply, transport: str) -> str | None:
    """A 5xx, or an MCP internal error: what no input may cause."""
    if transport == "mcp":
        body = reply.body if isinstance(reply.body, dict) else {}
        status = ((body.get("result") or {}).get("structuredContent") or {}).get("error", {}).get("status", 200)
        if reply.status >= 500 or (body.get("error") or {}).get("code") == -32603 or status >= 500:
            return f"{reply.status} {reply.raw[:300]!r}"
        return None
    return f"{reply.status} {reply.raw[:300]!r}" if reply.status >= 500 else None


def refused(reply, transport: str) -> bool:
    if transport == "rest":
        return 400 <= reply.status < 500
    result = reply.body.get("result") if isinstance(reply.body, dict) else None
    return result is None or result.get("isError") is True


def edge_faults(running, name: str, sqlite: bool = True) -> list[str]:
    """Faults of the edge calls; on SQLite also any refusal (a row not there, another's row) that changed rows."""
    op, failures = OPERATIONS[name], []
    for case in edge_cases_for(name):
        for transport in ("rest", "mcp"):
            seed(running)
            settle(running)
            before = snapshot(running.db_path) if sqlite else {}
            if transport == "mcp":
                reply, long_line = send_mcp(running, case), False
            elif op.method in ("GET", "DELETE"):
                pairs = tuple((k, query_text(v) or "") for k, v in case.args.items())
                reply = send_rest(running, Case(name, case.field, case.what, pairs=pairs))
                long_line = reply.status == 414 and len(query_string(pairs)) > MAX_REQUEST_LINE
            else:
                reply, long_line = send_rest(running, case), False
            if not long_line and (fault := server_fault(reply, transport)):
                failures.append(f"{transport} {case}: {fault}")
            if sqlite and refused(reply, transport):
                settle(running)
                changed = sorted(table for table, rows in snapshot(running.db_path).items() if before[table] != rows)
                if changed:
                    failures.append(f"{transport} {case}: refused, and changed rows of {changed}")
    return failures


def test_values_at_the_schemas_edges_never_fault_on_postgresql(pg_url):
    """The same edges on the PostgreSQL store, where each reaches other SQL (bigint ids, text without NUL)."""
    running = start_server(pg_url)
    try:
        failures = [failure for name in OPERATIONS for failure in edge_faults(running, name, sqlite=False)]
    finally:
        stop_server(running)
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("name", list(OPERATIONS))
def test_values_at_the_schemas_edges_never_fault(running, name):
    """The same fields at the edges of what they take (bounds, full lengths, odd text, every enum value) may be
    refused for what they mean (a row that is not there), never with a 500; on both transports. Last: these
    calls forget and promote the rows the valid calls need."""
    failures = edge_faults(running, name)
    settle(running)
    assert not failures, "\n".join(failures)
