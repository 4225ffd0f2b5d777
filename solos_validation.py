"""solos_validation: arguments checked once, at the edge, against the JSON Schema each operation advertises.

REST query strings are coerced to the schema's types first; MCP arguments
arrive typed. Every refusal is a BadRequest naming the field, what it must be
and what arrived. Imports only the store (for the errors) and the bounds.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import json
import math
import os
import re
from email.message import Message
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import mcp_bridge
import solos_bounds
from solos_store import BadRequest

# Fields are checked once, here, against the same JSON Schema MCP advertises.
AGENT_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
NO_NUL = "^[^\\u0000]*$"  # stored text: C-string consumers of the database would cut it at a NUL
TAGS_SCHEMA = {
    "type": "array",
    "maxItems": 32,
    "items": {"type": "string", "minLength": 1, "maxLength": 64, "pattern": NO_NUL},
    "description": "Labels, at most 32 strings of 1-64 characters.",
}
AGENT_SCHEMA = {
    "type": "string",
    "pattern": AGENT_PATTERN,
    "description": "The calling agent, as registered in agent_registry.",
}
JSON_TYPES: dict[str, type | tuple[type, ...]] = {
    "string": str,
    "integer": int,
    "number": (int, float),
    "boolean": bool,
    "array": list,
    "object": dict,
}


def describe(value: Any) -> str:
    """A short rendering of a bad value for an error message, whatever the value (deep, huge, odd)."""
    try:
        text = json.dumps(value) if not isinstance(value, str) else repr(value)
    except (RecursionError, ValueError):  # nesting past the recursion limit; ints past 4,300 digits
        text = f"a deeply nested {type(value).__name__}" if isinstance(value, (list, dict)) else "a huge number"
    return text if len(text) <= 60 else text[:57] + "..."


def fully_matches(pattern: str, value: str) -> bool:
    """The whole value matches an anchored schema pattern (`$` alone would admit a trailing newline)."""
    return re.fullmatch(pattern.removeprefix("^").removesuffix("$"), value) is not None


LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # valid in a JSON escape, not encodable as UTF-8


def check_value(name: str, schema: dict, value: Any) -> Any:
    """Check one value against its schema; raise BadRequest naming the field.

    `name` may point inside the field (`tags[2]`); the error's field is the top-level name.
    """
    try:
        return check_one(name, schema, value)
    except BadRequest as error:
        error.field = name.split("[")[0]
        raise


def check_one(name: str, schema: dict, value: Any) -> Any:
    kind = schema["type"]
    is_bool = isinstance(value, bool)
    right_type = isinstance(value, JSON_TYPES[kind])  # kept apart: mypy would narrow value to object
    if not right_type or (is_bool and kind != "boolean"):
        raise BadRequest(f"{name} must be {article(kind)} {kind}, got {describe(value)}", name)
    if isinstance(value, float) and not math.isfinite(value):
        raise BadRequest(f"{name} must be a finite number, got {describe(value)}", name)
    if kind == "integer" and not -solos_bounds.MAX_ID - 1 <= value <= solos_bounds.MAX_ID:
        raise BadRequest(
            f"{name} must be a 64-bit integer (at most {solos_bounds.MAX_ID}), got {describe(value)}", name
        )
    if kind in ("integer", "number"):
        low, high = schema.get("minimum"), schema.get("maximum")
        low_open = schema.get("exclusiveMinimum")
        if (
            (low is not None and value < low)
            or (high is not None and value > high)
            or (low_open is not None and value <= low_open)
        ):
            raise BadRequest(f"{name} must be {kind_range(schema)}, got {describe(value)}", name)
    if kind == "string":
        if LONE_SURROGATE.search(value):
            raise BadRequest(f"{name} must be valid Unicode text: it holds a lone surrogate (\\ud800-\\udfff)", name)
        if "enum" in schema and value not in schema["enum"]:
            raise BadRequest(f"{name} must be one of {', '.join(schema['enum'])}, got {describe(value)}", name)
        if len(value) < schema.get("minLength", 0) or len(value) > schema.get("maxLength", 1 << 30):
            raise BadRequest(
                f"{name} must be {schema.get('minLength', 0)}-{schema.get('maxLength')} characters, got {len(value)}",
                name,
            )
        if "pattern" in schema and not fully_matches(schema["pattern"], value):
            if schema["pattern"] == NO_NUL:
                raise BadRequest(f"{name} must not contain NUL characters", name)
            raise BadRequest(f"{name} must match {schema['pattern']}, got {describe(value)}", name)
        if schema.get("format") == "date-time" and not is_date_time(value):
            raise BadRequest(f"{name} must be a date and time that exists, got {describe(value)}", name)
    if kind == "array":
        if len(value) > schema.get("maxItems", 1 << 30):
            raise BadRequest(f"{name} must have at most {schema['maxItems']} items, got {len(value)}", name)
        value = [check_one(f"{name}[{i}]", schema["items"], item) for i, item in enumerate(value)]
        if schema.get("uniqueItems"):  # as advertised: a repeat is refused, not dropped (items are scalars)
            seen: set = set()
            for item in value:
                if item in seen:
                    raise BadRequest(f"{name} must not repeat an item, got {describe(item)} more than once", name)
                seen.add(item)
    return value


def is_date_time(text: str) -> bool:
    """An RFC 3339 time that exists (no month 13, no 24:00); the schema's pattern holds its shape."""
    try:
        datetime.datetime.fromisoformat(text)
    except ValueError:
        return False
    return True


def article(kind: str) -> str:
    return "an" if kind[0] in "aeiou" else "a"


def kind_range(schema: dict) -> str:
    """'a number in (0, 31536000]' style description of a numeric range."""
    low = schema.get("minimum", schema.get("exclusiveMinimum"))
    left = "[" if "minimum" in schema else "("
    return f"{article(schema['type'])} {schema['type']} in {left}{low}, {schema.get('maximum')}]"


def check_args(schema: dict, args: Any) -> dict:
    """Validate an argument object; return it with defaults filled in."""
    if not isinstance(args, dict):
        raise BadRequest(f"arguments must be a JSON object, got {describe(args)}", "body")
    properties = schema["properties"]
    unknown = sorted(set(args) - set(properties))
    if unknown:
        # describe: a name is the caller's text, up to the body's 320 KB; the message and the log keep 60 characters
        raise BadRequest(f"{describe(unknown[0])} is not a known field (known: {', '.join(properties)})", unknown[0])
    checked = {}
    for name, spec in properties.items():
        if name in args and args[name] is not None:
            checked[name] = check_value(name, spec, args[name])
        elif name in schema.get("required", ()):
            raise BadRequest(f"{name} is required", name)
        else:
            checked[name] = spec.get("default")
    return checked


# A query-string integer: ASCII digits (\d admits '١٢', which int() reads), as long as any integer MCP takes
# (solos_bounds.MAX_ID has 19) and some past it, so the schema's range check names the field, not a type error.
# Bounded: int() of a long digit string costs quadratic time, and 4,300 digits raise.
REST_INTEGER = re.compile(r"-?[0-9]{1,40}")
# A query-string number as a program prints one: Python's repr of a float has up to 17 significant digits
# (0.42358799999999996) and small ones take an exponent (1e-05). Bounded like the integer.
REST_NUMBER = re.compile(r"-?[0-9]{1,20}(\.[0-9]{1,20})?([eE][-+]?[0-9]{1,3})?")


UNDECODED = re.compile("[\udc80-\udcff]")  # surrogateescape's stand-ins for bytes that are not UTF-8


def query_pairs(query: str) -> list[tuple[str, str]]:
    """A query string's pairs, percent-decoded as strict UTF-8; bytes that are not UTF-8 are refused naming their
    field (a lone surrogate's bytes among them), never replaced with U+FFFD.

    http.server reads the request line as Latin-1, so UTF-8 sent unencoded (curl sends `q=café` as typed) came
    as 'cafÃ©' and matched nothing: such bytes are read as the UTF-8 they are, or refused like escaped ones.
    """
    if not query.isascii():
        query = query.encode("latin-1").decode("utf-8", "surrogateescape")
    pairs = parse_qsl(query, keep_blank_values=True, errors="surrogateescape")
    for name, value in pairs:
        if UNDECODED.search(name + value):
            field = "query" if UNDECODED.search(name) else name
            raise BadRequest(f"{field} must be UTF-8 text, percent-encoded: it holds bytes that are not", field)
    return pairs


def coerce_query(schema: dict, pairs: list[tuple[str, str]]) -> dict:
    """Turn query-string pairs into typed arguments, per the operation's schema.

    REST clients send `k=5` and `tiers=long,short`; MCP clients send 5 and
    ["long", "short"]. Both then meet the same check_args.
    """
    args: dict[str, Any] = {}
    for name, raw in pairs:
        if name in args:
            raise BadRequest(f"{describe(name)} is given more than once", name)
        kind = schema["properties"].get(name, {}).get("type")
        if kind == "integer":
            args[name] = int(raw) if re.fullmatch(REST_INTEGER, raw) else raw
        elif kind == "number":
            args[name] = float(raw) if re.fullmatch(REST_NUMBER, raw) else raw
        elif kind == "boolean":
            args[name] = {"true": True, "false": False}.get(raw, raw)
        elif kind == "array":
            args[name] = [part.strip() for part in raw.split(",") if part.strip()]
        else:
            args[name] = raw
    return args


# Headers the service acts on as one value (Content-Length has read_body's own rule, which names the values).
SINGLE_VALUED_HEADERS = (
    "Host Origin Authorization Content-Type MCP-Protocol-Version Mcp-Method Mcp-Name Last-Event-ID".split()
)


def check_head(headers: Message) -> None:
    """Every header line is `name: value`, and a header the service reads as one value is given once.

    Python's parser ends the head at a line that is not (a space before the colon, no colon, a control character
    in the name) and drops the lines after it: a Content-Length or an Origin there went unseen, so a GET's body ran
    as the next request and a foreign page's write passed the Origin rule. Of a header given twice the service read
    the first, where a proxy in front may read the last (HTTP/1.1: a second Host is 400).
    """
    if headers.defects:
        line = str(headers.get_payload()).split("\r\n")[0]
        raise BadRequest(
            f"every header line must be `name: value` (no space before the colon), got {describe(line)}", "headers"
        )
    for name in SINGLE_VALUED_HEADERS:
        if len(headers.get_all(name, ())) > 1:
            raise BadRequest(f"{name} must be given once, got {len(headers.get_all(name, ()))} lines", name)


def reject_constant(name: str) -> None:
    """json.loads hook: NaN and Infinity are not JSON."""
    raise BadRequest(f"body must be valid JSON: {name} is not a JSON number", "body")


def parse_json_body(body: bytes) -> Any:
    """Decode a request body as strict UTF-8 JSON, each name once per object (the query string refuses a
    repeated field too), as the MCP bridge reads its messages."""
    try:
        return json.loads(
            body.decode("utf-8"), parse_constant=reject_constant, object_pairs_hook=mcp_bridge.one_value_per_name
        )
    except mcp_bridge.RepeatedName as error:
        raise BadRequest(f"{describe(error.name)} is given more than once in one object", error.name) from None
    except UnicodeDecodeError:
        raise BadRequest("body must be UTF-8 encoded JSON", "body") from None
    except RecursionError:
        raise BadRequest("body nests too deeply", "body") from None
    except json.JSONDecodeError as error:
        raise BadRequest(
            f"body must be valid JSON: {error.msg} at line {error.lineno} column {error.colno}", "body"
        ) from None
    except ValueError:  # an integer past Python's 4,300-digit conversion limit
        raise BadRequest("body holds a number too long to read", "body") from None


def on_off(text: str) -> bool:
    """A command-line switch (`--rerank on|off`); argparse converts a string default too, so a bad environment
    value stops startup."""
    if text not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"expected on or off, got {text!r}")
    return text == "on"


def number_in(low: float, high: float | None = None, variable: str | None = None, whole: bool = True) -> Any:
    """An argparse type for a number from `low` to `high` (None: no top); a string default (the environment's
    SOLOS_MEMORY_*, named by `variable`) is checked alike. A port past 65535 was a traceback at bind, a negative
    --admit a silent "no cap": each stops startup naming the option and the range instead."""

    def shown(bound: float) -> str:
        return str(int(bound)) if whole else f"{bound:g}"

    span = f"{shown(low)}-{shown(high)}" if high is not None else f"{shown(low)} or more"
    said = f" (flag or {variable})" if variable else ""

    def convert(text: str) -> float:
        try:
            value = int(text) if whole else float(text)
        except ValueError:
            value = None
        if value is None or not math.isfinite(value) or value < low or (high is not None and value > high):
            kind = "a whole number" if whole else "a number"
            raise argparse.ArgumentTypeError(f"must be {kind} {span}{said}, got {text!r}")
        return value

    return convert


def web_origin(text: str) -> str:
    """--allowed-origin: an Origin as browsers send it, http(s)://host[:port] and nothing after; anything else
    never matched (a trailing slash, no scheme), and its empty host name let in a request whose Host was ""."""
    try:
        parts = urlsplit(text)
        port = parts.port  # a port that is no number raises here
    except ValueError:
        parts, port = None, None
    if (
        parts is None
        or parts.scheme not in ("http", "https")
        or not parts.hostname
        or parts.username is not None
        or f"{parts.scheme}://{parts.netloc}".lower() != text.lower()  # the service compares them lower-case
        or (port is None and parts.netloc.endswith(":"))
    ):
        raise argparse.ArgumentTypeError(
            f"must be an origin as a browser sends it, scheme://host[:port] (http or https, no path), got {text!r}"
        )
    return text


def folder_or_off(text: str) -> str:
    """--model-dir: `off`, or a folder that exists (whether it holds the model's files is the embedder's to say,
    degrading honestly). A mistyped path served keyword-only as if the embedder were not installed."""
    if text != "off" and not os.path.isdir(text):
        state = "is no folder" if os.path.exists(text) else "does not exist"
        raise argparse.ArgumentTypeError(f"must be a folder or off, got {text!r}, which {state}")
    return text


def is_loopback(host: str) -> bool:
    """localhost, or any address of 127.0.0.0/8 or ::1: only this host can reach it (SECURITY.md)."""
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def copy_name(text: str) -> str:
    """--copy-name: "" keeps the default (host:port); blanks or a control character would be an unreadable copy in
    /health, /metrics and the page."""
    if text and (not text.strip() or not text.isprintable()):
        raise argparse.ArgumentTypeError(f"must be a readable name, or unset for host:port, got {text!r}")
    return text


def database_name(text: str) -> str:
    """--db: a file path or a postgresql:// URL. "" (an empty SOLOS_MEMORY_DB= line) was a traceback in serve,
    and it and :memory: were told "WAL could not be enabled (is the folder writable?)" by the admin commands."""
    if not text.strip() or text == ":memory:":
        raise argparse.ArgumentTypeError(f"must name a database file or a postgresql:// URL, got {text!r}")
    return text
