"""Every error path answers with the one JSON error shape and the right status; none crashes the server."""

from __future__ import annotations

import dataclasses
import json

import pytest
from conftest import raw_exchange

import solos_memory


def assert_error(reply, status: int, code: str, field: str | None = None) -> None:
    assert reply.status == status, (reply.status, reply.raw)
    assert reply.headers["content-type"] == "application/json"
    error = reply.body["error"]
    assert set(error) <= {"code", "status", "message", "field"}
    assert error["code"] == code and error["status"] == status and error["message"]
    if field:
        assert error["field"] == field
    assert b"Traceback" not in reply.raw and b".py" not in reply.raw


def test_unknown_route_is_404(server):
    assert_error(server.get("/v1/nothing"), 404, "not_found")
    assert_error(server.get("/v2"), 404, "not_found")  # "/" is the status page


def test_wrong_method_is_405_with_allow(server):
    reply = server.request("PATCH", "/v1/long", body={})
    assert_error(reply, 405, "method_not_allowed")
    assert reply.headers["allow"] == "POST"
    short = server.request("GET", "/v1/short")
    assert_error(short, 405, "method_not_allowed")
    assert set(short.headers["allow"].split(", ")) == {"POST", "DELETE"}
    assert_error(server.request("POST", "/health", body={}), 405, "method_not_allowed")


def test_a_patch_without_a_body_is_405_with_allow_not_411(server):
    for path, allow in (("/v1/long", "POST"), ("/status", "GET, HEAD")):
        response = raw_exchange(
            server.port, b"PATCH %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % (path.encode(), server.port)
        )
        assert response.startswith(b"HTTP/1.1 405 "), response[:200]
        assert f"\r\nAllow: {allow}\r\n".encode() in response


def test_malformed_json_is_400_naming_the_body(server):
    reply = server.request("POST", "/v1/long", raw=b'{"agent": "atlas",', headers={"Content-Type": "application/json"})
    assert_error(reply, 400, "bad_request", "body")


@pytest.mark.parametrize("raw", [b"[]", b'"text"', b"42", b"null"])
def test_body_must_be_an_object(server, raw):
    reply = server.request("POST", "/v1/long", raw=raw, headers={"Content-Type": "application/json"})
    assert_error(reply, 400, "bad_request", "body")


def test_nan_is_not_json(server):
    raw = b'{"agent": "atlas", "fact": "f", "confidence": NaN}'
    assert_error(
        server.request("POST", "/v1/long", raw=raw, headers={"Content-Type": "application/json"}),
        400,
        "bad_request",
        "body",
    )


def test_invalid_utf8_body_is_400(server):
    raw = b'{"agent": "atlas", "fact": "\xff\xfe"}'
    assert_error(
        server.request("POST", "/v1/long", raw=raw, headers={"Content-Type": "application/json"}),
        400,
        "bad_request",
        "body",
    )


def test_deeply_nested_json_is_400(server):
    raw = b"[" * 100_000 + b"]" * 100_000
    reply = server.request("POST", "/v1/long", raw=raw[:100_000], headers={"Content-Type": "application/json"})
    assert_error(reply, 400, "bad_request", "body")


def test_wrong_content_type_is_415(server):
    reply = server.request(
        "POST", "/v1/long", raw=b'{"agent":"atlas","fact":"f"}', headers={"Content-Type": "text/plain"}
    )
    assert_error(reply, 415, "unsupported_media_type", "Content-Type")


def test_empty_body_is_400_and_missing_length_is_411(server):
    assert_error(
        server.request("POST", "/v1/long", headers={"Content-Type": "application/json"}), 400, "bad_request", "body"
    )
    response = raw_exchange(
        server.port,
        b"POST /v1/long HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n"
        % server.port,
    )
    assert response.startswith(b"HTTP/1.1 411 ")


def test_body_over_the_cap_is_413(server):
    raw = json.dumps({"agent": "atlas", "fact": "x" * solos_memory.MAX_BODY_BYTES}).encode()
    reply = server.request("POST", "/v1/long", raw=raw, headers={"Content-Type": "application/json"})
    assert_error(reply, 413, "payload_too_large", "body")
    with server.db() as conn:
        assert conn.execute("SELECT count(*) FROM memory_longterm").fetchone()[0] == 0


def test_chunked_body_is_refused(server):
    response = raw_exchange(
        server.port,
        b"POST /v1/long HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n" % server.port,
    )
    assert response.startswith(b"HTTP/1.1 411 ")
    assert b'"code": "length_required"' in response


def test_bad_content_length_is_400(server):
    response = raw_exchange(
        server.port,
        b"POST /v1/long HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
        b"Content-Type: application/json\r\nContent-Length: abc\r\n\r\n{}" % server.port,
    )
    assert response.startswith(b"HTTP/1.1 400 ")


def test_garbage_request_line_gets_json_not_html(server):
    response = raw_exchange(server.port, b"\x16\x03\x01 garbage\r\n\r\n")
    assert response.startswith(b"HTTP/1.1 400 ")
    assert b"application/json" in response and b"<html" not in response.lower()


def test_duplicate_query_parameter_is_400(server):
    assert_error(server.request("GET", "/v1/recall?agent=sol&agent=atlas"), 400, "bad_request", "agent")


def test_a_name_given_twice_in_a_json_body_is_400(server):
    raw = b'{"agent": "atlas", "fact": "first", "fact": "second"}'
    reply = server.request("POST", "/v1/long", raw=raw, headers={"Content-Type": "application/json"})
    assert_error(reply, 400, "bad_request", "fact")
    with server.db() as conn:
        assert conn.execute("SELECT count(*) FROM memory_longterm").fetchone()[0] == 0


def test_invalid_percent_encoding_is_400_naming_its_field(server):
    assert_error(server.request("GET", "/v1/recall?agent=sol&q=%ff%fe"), 400, "bad_request", "q")
    assert_error(server.request("GET", "/v1/recall?agent=sol&q%ff=x"), 400, "bad_request", "query")
    assert_error(server.request("GET", "/v1/recall?agent=sol&q=%ed%a0%80"), 400, "bad_request", "q")  # a surrogate
    stream = server.request("GET", "/v1/events?agent=sol&q=%ff", headers={"Accept": "text/event-stream"})
    assert_error(stream, 400, "bad_request", "q")  # the stream's door too: not read as U+FFFD


def test_a_query_sent_unencoded_is_read_as_utf8_or_refused_naming_its_field(server):
    """curl sends `q=café` as typed: UTF-8 bytes in the request line, which http.server reads as Latin-1."""
    assert server.post("/v1/long", {"agent": "atlas", "fact": "café au lait daily"}).status == 201
    head = b" HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nConnection: close\r\n\r\n" % server.port
    found = raw_exchange(server.port, "GET /v1/recall?agent=atlas&q=café".encode() + head)
    assert found.startswith(b"HTTP/1.1 200 ") and json.loads(found.split(b"\r\n\r\n", 1)[1])["count"] == 1
    refused = raw_exchange(server.port, b"GET /v1/recall?agent=atlas&q=caf\xff" + head)
    assert (
        refused.startswith(b"HTTP/1.1 400 ") and json.loads(refused.split(b"\r\n\r\n", 1)[1])["error"]["field"] == "q"
    )


def test_unknown_query_parameter_is_400(server):
    assert_error(server.request("GET", "/v1/recall?agent=sol&limit=3"), 400, "bad_request", "limit")


def test_unexpected_exception_is_a_bare_500(server, monkeypatch):
    def explode(memory, args):
        raise RuntimeError("secret path /srv/solos.db and SELECT internals")

    broken = dataclasses.replace(solos_memory.OPERATIONS["stats"], function=explode)
    monkeypatch.setitem(solos_memory.ROUTES, ("GET", "/v1/stats"), broken)
    reply = server.get("/v1/stats")
    assert_error(reply, 500, "internal")
    assert b"secret" not in reply.raw and b"SELECT" not in reply.raw
    assert server.get("/health").status == 200


def test_errors_leave_no_transaction_open_and_keep_alive_works(server):
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    for body in (b"{bad", b'{"agent": "mallory", "fact": "f"}', b'{"agent": "atlas", "fact": "kept"}'):
        conn.request("POST", "/v1/long", body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
    assert response.status == 201
    conn.close()
    store = server.server.memory.store
    assert all(not c.in_transaction for c in list(store.pool.queue))
    with server.db() as direct:
        direct.execute("BEGIN IMMEDIATE")  # would fail if the service had left a write lock behind
        direct.execute("ROLLBACK")


@pytest.mark.parametrize("method", ["TRACE", "BREW", "CONNECT"])
def test_a_method_nobody_serves_is_405_not_501(server, method):
    reply = server.request(method, "/v1/long")
    assert_error(reply, 405, "method_not_allowed")
    assert "GET" in reply.headers["allow"]


def test_the_too_many_connections_refusal_is_the_one_error_shape_with_a_true_length(server):
    import socket

    ours, theirs = socket.socketpair()
    try:
        server.server.refuse(theirs)
        response = ours.recv(65536)
    finally:
        ours.close()
    head, body = response.split(b"\r\n\r\n", 1)
    headers = dict(line.split(": ", 1) for line in head.decode().split("\r\n")[1:])
    assert response.startswith(b"HTTP/1.1 503 ") and int(headers["Content-Length"]) == len(body)
    assert headers["Retry-After"] == "1" and headers["Connection"] == "close"
    assert json.loads(body) == {
        "error": {"code": "busy", "status": 503, "message": json.loads(body)["error"]["message"]}
    }


@pytest.mark.parametrize(
    "error,header",
    [
        (solos_memory.MethodNotAllowed("no", ["GET", "HEAD"]), ("Allow", "GET, HEAD")),
        (solos_memory.Busy("locked"), ("Retry-After", "1")),
        (solos_memory.StorageUnavailable("full"), ("Retry-After", "5")),
        (solos_memory.Unauthorized("who"), ("WWW-Authenticate", 'Bearer realm="solos-memory"')),
        (solos_memory.ProtocolError(431, None), None),
        (solos_memory.BadRequest("bad", "k"), None),
    ],
)
def test_each_error_carries_its_own_headers(error, header):
    assert error.headers() == (dict([header]) if header else {})
    assert error_body_shape(solos_memory.error_body(error))


def error_body_shape(body: dict) -> bool:
    error = body["error"]
    return set(error) <= {"code", "status", "message", "field"} and isinstance(error["status"], int)
