"""The status page at / and /status, loaded from a running service by headless Chromium (Debian's package).

The assertions read the DOM Chromium built (--dump-dom), not the HTML string
the service sent: markup the browser would restructure, or text it would
turn into elements, shows up here. Each run leaves a screenshot in the
test's temporary folder. The layout test measures the laid-out page at a
desktop and a phone width with a script added to a copy of it (the page
itself has none).
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import socket
import struct
import subprocess
import time
from pathlib import Path

import pytest
from conftest import ROOT, Dom, WordHashEmbedder, skip_or_fail, wait_for_vectors, wait_until, write_tokens

import solos_connections
import solos_embed
import solos_memory
import solos_status

PHONE = (390, 844)  # CSS pixels of a common phone
DESKTOP = (1280, 2000)


def browse(url: str, folder: Path, size: tuple[int, int] = PHONE) -> Dom:
    """Load url in headless Chromium (phone width unless told); return its DOM, leaving a screenshot in folder."""
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
            f"--window-size={size[0]},{size[1]}",
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


def measure(page: str, size: tuple[int, int], folder: Path) -> dict:
    """The layout of page (HTML) at size: words broken in cells, the service rows, the page's width."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "measured.html").write_text(page.replace("</body>", MEASURE + "</body>"))
    (folder / "frame.html").write_text(FRAME.format(width=size[0], height=size[1]))
    frame = browse((folder / "frame.html").as_uri(), folder, (DESKTOP[0] + 20, size[1]))
    return json.loads(frame.elements("body")[0]["data-layout"])


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
    server.server.memory.worker.wake.set()  # as a sweep would: its vector comes from the background worker
    wait_for_vectors(server, 5)

    dom = browse(server.url + "/status", tmp_path / "browser")

    assert png_size(tmp_path / "browser" / "status.png")[0] == PHONE[0]
    assert {"name": "viewport", "content": "width=device-width, initial-scale=1"} in dom.elements("meta")
    assert {"http-equiv": "refresh", "content": "15"} in dom.elements("meta")
    assert not dom.elements("script") and not dom.elements("img") and not dom.elements("b")
    assert not [link for link in dom.elements("link") if link.get("rel") == "stylesheet"]  # works offline
    assert dom.text_by_id["health"] == "ok"
    assert dom.text_by_id["verdict"].startswith("Healthy")
    tiers = dom.rows("tiers")
    assert tiers["long"] == ["3", "3", "2"]  # rows (the raw row too), vectors, recall hits
    assert tiers["short"] == ["1", "1", "1"] and tiers["episodic"] == ["1", "1", "1"]
    service = dom.rows("service")
    assert service["embedder"] == ["word-hash-a (ready)"] and service["rows without a vector yet"] == ["0"]
    assert service["busy: database locked (503)"] == ["0"]
    agents = dom.rows("agents")
    assert agents["atlas"] == ["2", "2", "0", "0"]  # long + episodic
    assert agents["sol"] == ["1", "1", "2", "2"]  # writes 1 h, 24 h; recalls 1 h, 24 h
    assert agents["nova"] == ["0", "0", "1", "1"]
    assert agents["<img src=x onerror=alert(1)>"] == ["1", "1", "0", "0"]  # shown as text, not an element
    assert dom.heads["reads"] == ["reader \\ writer", "atlas", "hermes"]  # a reader x writer grid, last 24 h
    assert dom.rows("reads") == {"sol": ["2", "1"]}
    assert dom.rows("rejection-counts") == {"bad_request": ["1"]}  # no favicon 404 either
    (rejection,) = dom.tables["rejections"]
    assert rejection[1:4] == ["'<b>mallory</b>'", "recall", "bad_request"]  # the name claimed, not an agent's
    page_text = "".join(dom.text)
    assert "uneasy" not in page_text and "kestrel" not in page_text and "backup job" not in page_text
    assert f"Version {solos_memory.__version__}," in dom.text_by_id["footer"]


@pytest.mark.slow
def test_keyword_only_is_a_neutral_mode_with_one_sentence_on_hybrid_and_no_machine_paths(
    make_server, monkeypatch, tmp_path
):
    import sys

    for module in ("onnxruntime", "tokenizers"):
        monkeypatch.setitem(sys.modules, module, None)  # as if not installed
    server = make_server("degraded.db", model_dir=None)
    reason = server.get("/v1/stats").body["degraded_reason"]
    assert sys.executable in reason and "pip install" in reason  # the operator's stats keep the whole story
    dom = browse(server.url + "/", tmp_path / "browser")
    assert dom.text_by_id["health"] == "ok" and dom.text_by_id["mode"] == "keyword recall"
    assert {"class": "badge neutral", "id": "mode"} in dom.elements("span")  # not red: a supported way to run
    verdict = dom.text_by_id["verdict"]
    assert verdict == solos_status.KEYWORD_ONLY and "make serve" in verdict
    assert not [p for p in dom.elements("p") if p.get("id") == "verdict" and "class" in p]
    assert dom.text_by_id["problems"] == "Nothing needs attention."
    page_text = "".join(dom.text)
    assert sys.executable not in page_text and "pip" not in page_text and str(tmp_path) not in page_text
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
    assert mine.heads["reads"][1:] == ["atlas"] and mine.rows("reads") == {"sol": ["1"]}
    assert [row[1] for row in mine.tables["rejections"]] == ["atlas"]


@pytest.mark.slow
def test_with_tokens_a_browser_logs_in_with_the_token_as_password(token_server, tmp_path):
    refused = browse(token_server.url + "/status", tmp_path / "anonymous")  # headless: no one types a password
    assert not refused.tables and "agents" not in "".join(refused.text).lower()
    port = token_server.port
    dom = browse(f"http://operator:atlas-token@127.0.0.1:{port}/status", tmp_path / "logged-in")
    assert dom.text_by_id["health"] == "ok" and "tiers" in dom.tables


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
    slots = server.server.slots

    def every_slot_free() -> bool:  # the closed connections' threads give their slots back within a moment
        taken = [slots.acquire(blocking=False) for _ in range(solos_connections.MAX_CONNECTIONS)]
        for took in taken:
            if took:
                slots.release()
        return all(taken)

    wait_until(every_slot_free, "the closed connections' slots to come back")  # else the page itself is refused
    page = Dom(server.get("/status").raw.decode())
    service = page.rows("service")
    assert service["busy: too many connections (503)"] == ["1"]
    assert service["busy: database locked (503)"] == ["2"]
    assert service["503 in all"] == ["3"]


# ---- at a glance, at a desktop's width and a phone's ----

# Added to a copy of the page before </body>: measures the laid-out page and tells the frame around it.
MEASURE = """<script>
const broken = [];
for (const cell of document.querySelectorAll("td, th")) {
  const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    for (const word of node.data.matchAll(/\\S+/g)) {
      const range = document.createRange();
      range.setStart(node, word.index);
      range.setEnd(node, word.index + word[0].length);
      const pieces = [...range.getClientRects()].filter((r) => r.width > 0 && r.height > 0);
      if (pieces.length > 1) broken.push(word[0]);
    }
  }
}
const textBox = (element) => {
  const range = document.createRange();
  range.selectNodeContents(element);
  return [...range.getClientRects()].filter((r) => r.width > 0);
};
// A value is visible when every piece of its text lies inside the box that would scroll it, and inside the window.
const serviceBox = document.querySelector("#service").closest(".scroll") || document.documentElement;
const shown = serviceBox.getBoundingClientRect();
const service = [...document.querySelectorAll("#service tr")].map((row) => {
  const label = textBox(row.cells[0]), value = textBox(row.cells[1]);
  return {label: row.cells[0].textContent, lines: label.length,
          reach: Math.round(Math.max(...value.map((r) => r.right)) - label[0].left),
          visible: value.length > 0 && value.every((r) => r.left >= shown.left - 0.5 && r.right <= shown.right + 0.5
                                                          && r.right <= innerWidth + 0.5)};
});
parent.postMessage(JSON.stringify({broken, service, viewport: innerWidth,
                                   serviceScrolls: serviceBox.scrollWidth > serviceBox.clientWidth,
                                   page: document.documentElement.scrollWidth}), "*");
</script>"""
# Headless Chromium lays a page out at least 500 px wide (its screenshots alone are at the window's size):
# the copy is measured in a frame of the width asked for, which hands the result to the frame around it.
FRAME = """<!DOCTYPE html><html><body style="margin:0">
<script>addEventListener("message", (event) => document.body.setAttribute("data-layout", event.data))</script>
<iframe style="border:0;width:{width}px;height:{height}px" src="measured.html"></iframe></body></html>"""
# An absolute path as a machine would print one: an interpreter, a home, a database file.
MACHINE_PATH = re.compile(r"(?:^|[\s'\"(=])/(?:home|root|usr|tmp|var|opt|etc|srv|work|run)/")
FLEET = [f"agent-{name}" for name in "abcdefghijklm"]  # 13 agents, as found by a new user


# The name the real embedder reports (what make serve shows): the widest value in the Service table.
MODEL_ID = f"all-MiniLM-L6-v2-dynint8@{solos_embed.MODEL_SHA256[:12]}"


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["keyword", "hybrid"])
def test_the_page_reads_at_a_glance_at_desktop_and_phone_width(make_server, monkeypatch, tmp_path, mode):
    import sys

    if mode == "keyword":  # keyword-only, whose reason names the interpreter's path
        for module in ("onnxruntime", "tokenizers"):
            monkeypatch.setitem(sys.modules, module, None)
        server = make_server("glance.db", model_dir=None)
    else:  # the embedder ready, under the real model's name
        embedder = WordHashEmbedder(MODEL_ID)
        monkeypatch.setattr(solos_memory, "load_embedder", lambda config, threads=1: (embedder, None))
        server = make_server("glance.db")
    assert solos_memory.main(["agents", "add", *FLEET, "--db", str(server.db_path)]) == 0
    for index, agent in enumerate(FLEET):
        for serial in range(index % 2 + 1):
            server.post("/v1/long", {"agent": agent, "topic": "ops", "fact": f"{agent} runbook step {serial}"})
    for agent in FLEET:
        assert server.recall(agent, "runbook step", k=20).body["count"] == 19  # every agent's rows
    server.recall("malloryy-the-unregistered-agent-name", "x")  # a long word in the reasons
    server.recall("agent-a", "x", k=500)
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")  # a snapshot that fails with an absolute path in its message
    assert solos_memory.main(["snapshot", "--db", str(server.db_path), "--dir", str(not_a_folder / "x")]) == 1

    page = server.get("/status").raw.decode()
    for width, height in (DESKTOP, PHONE):
        dom = browse(server.url + "/status", tmp_path / f"at-{width}", (width, height))
        assert png_size(tmp_path / f"at-{width}" / "status.png")[0] == width  # a screenshot to look at
        layout = measure(page, (width, height), tmp_path / f"measured-at-{width}")
        assert layout["broken"] == [], width  # no word is split across lines in any cell
        assert layout["page"] <= layout["viewport"] == width  # wide tables scroll in their box, not the page
        # Every value shown, none clipped or behind the table's scrollbar; a count beside its label: the row from
        # label to value spans less than a phone's width (the embedder's name is wider: it wraps, and is shown).
        assert [row["label"] for row in layout["service"] if not row["visible"]] == [], (width, layout["service"])
        assert not layout["serviceScrolls"], width
        assert max(row["reach"] for row in layout["service"] if row["label"] != "embedder") < 360, layout["service"]
        assert max(row["lines"] for row in layout["service"]) <= 2, layout["service"]
        embedder = "none (off)" if mode == "keyword" else f"{MODEL_ID} (ready)"
        assert dom.rows("service")["embedder"] == [embedder], width

        assert dom.heads["reads"][1:] == FLEET and set(dom.rows("reads")) == set(FLEET)  # a 13 x 13 grid
        assert dom.rows("reads")["agent-a"][0] == ""  # itself
        for chart in ("chart-writes", "chart-recalls", "chart-latency"):
            figure = dom.text_by_id[chart]
            assert figure and dom.tables[f"{chart}-numbers"], chart
        assert dom.rows("chart-recalls-numbers")["last 24 h"] == ["13"]
        assert dom.rows("chart-writes-numbers")["last 24 h"] == ["19"]
        assert dom.rows("chart-latency-numbers")["p50, 1 h"][0].endswith(" ms")
        assert len([rect for rect in dom.elements("rect")]) >= 4  # bars: writes, recalls, p99 and p50
        assert len(dom.elements("svg")) == 3 and not dom.elements("script")

        text = " ".join(dom.text)
        assert not MACHINE_PATH.search(text), MACHINE_PATH.search(text)
        assert sys.executable not in text and "pip" not in text
        assert "snapshot failed: NotADirectoryError" in dom.text_by_id["problems"]
        assert "…/x" in dom.text_by_id["problems"]


# ---- activity: kept in the database, charted per hour ----


def test_recall_activity_and_latency_survive_a_restart(tmp_path):
    from conftest import start_server, stop_server

    first = start_server(tmp_path / "kept.db")
    first.post("/v1/long", {"agent": "atlas", "fact": "the tide turns at noon"})
    for _ in range(3):
        assert first.recall("sol", "tide").body["count"] == 1
    before = first.get("/v1/stats").body["activity"]
    stop_server(first)  # a deploy

    second = start_server(tmp_path / "kept.db")
    try:
        after = second.get("/v1/stats").body["activity"]
    finally:
        stop_server(second)
    assert after["day"]["recalls"] == before["day"]["recalls"] == {"sol": 3}
    assert after["hour"]["reads"] == [{"reader": "sol", "writer": "atlas", "rows": 3}]
    assert after["hours"][-1]["recalls"] == 3 and after["hours"][-1]["recall_p50_ms"] is not None
    assert after["recall_latency_ms"] == before["recall_latency_ms"]
    assert after["recalls_counted_since"] <= before["recalls_counted_since"]


def test_hours_count_writes_recalls_and_latency_percentiles():
    activity = solos_status.Activity()
    for _ in range(50):
        activity.recalled("sol", ["atlas"], 0.0012)  # 1.5 ms bucket
    activity.recalled("sol", [], 0.045)  # 50 ms bucket: the slowest 2 %
    activity.recalled("nova", ["sol"], 0.0003)
    writes = {"atlas": [2] + [0] * 22 + [5], "nova": [1] + [0] * 23}
    answer = activity.snapshot(writes)
    assert [hour["hours_ago"] for hour in answer["hours"]] == list(range(23, -1, -1))  # oldest first
    assert answer["hours"][0]["writes"] == 5 and answer["hours"][-1]["writes"] == 3
    assert answer["hours"][-1]["recalls"] == 52
    assert (answer["hours"][-1]["recall_p50_ms"], answer["hours"][-1]["recall_p99_ms"]) == (1.5, 50.0)
    assert answer["hours"][5]["recall_p50_ms"] is None  # no recall then: no bar
    assert answer["day"]["writes"] == {"atlas": 7, "nova": 1} and answer["hour"]["writes"] == {"atlas": 2, "nova": 1}
    assert answer["recall_latency_ms"]["day"] == {"p50": 1.5, "p99": 50.0}
    own = activity.snapshot(writes, agent="nova")  # an agent's own view: its writes, recalls and latency
    assert own["hours"][-1]["recalls"] == 1 and own["hours"][-1]["recall_p50_ms"] == 0.5
    assert own["hours"][-1]["writes"] == 1
    assert own["day"]["reads"] == [{"reader": "nova", "writer": "sol", "rows": 1}]


def test_counts_a_busy_database_refused_are_kept_for_the_next_save(tmp_path, caplog):
    import sqlite3

    class Store:
        """Reads and writes on one connection; the first write finds the database busy."""

        def __init__(self) -> None:
            self.conn = sqlite3.connect(tmp_path / "a.db", isolation_level=None)
            self.conn.executescript((ROOT / "schema.sql").read_text())
            self.busy = True

        def read(self, work):
            return work(self.conn)

        def write(self, work):
            if self.busy:
                self.busy = False
                raise sqlite3.OperationalError("database is locked")
            return work(self.conn)

    store = Store()
    activity = solos_status.Activity(store)
    activity.recalled("sol", ["atlas", "atlas"], 0.002)
    activity.save()  # refused: nothing lost, and the log says so
    assert "activity counts not saved" in caplog.text
    activity.close()  # the last save, at a stop
    saved = store.conn.execute("SELECT kind, agent, detail, n FROM memory_activity ORDER BY kind").fetchall()
    assert saved == [("latency", "sol", "2", 1), ("read", "sol", "atlas", 2), ("recall", "sol", "", 1)]
    restarted = solos_status.Activity(store)
    restarted.close()
    assert restarted.snapshot({})["day"]["recalls"] == {"sol": 1}  # read back at a start


def test_writes_by_hour_reads_only_the_events_logged_since_its_last_count(tmp_path):
    """Stats (and the page) counted the day's writes by scanning the day's event log at each call: 111k events,
    84 ms of CPU per call, for any agent and every page load. The counts are kept per minute, and a call reads
    only the events logged since the last one."""
    import sqlite3

    store = solos_memory.Store(str(tmp_path / "s.db"))
    store.migrate()
    conn = sqlite3.connect(tmp_path / "s.db", isolation_level=None)
    conn.executemany(
        "INSERT INTO memory_event (kind, tier, row_id, agent) VALUES (?, 'long', ?, 'atlas')",
        [("write" if n % 4 else "delete", n) for n in range(20_000)],
    )
    steps: list[int] = []
    read = store.read

    def counted(work):
        def run(c):
            n = [0]
            c.set_progress_handler(lambda: n.__setitem__(0, n[0] + 1), 100)
            try:
                return work(c)
            finally:
                c.set_progress_handler(None, 0)
                steps.append(n[0])

        return read(run)

    store.read = counted
    assert store.writes_by_hour() == {"atlas": [15_000] + [0] * 23}
    conn.executemany(
        "INSERT INTO memory_event (kind, tier, row_id, agent) VALUES ('update', 'short', 1, ?)", [("sol",)] * 5
    )
    assert store.writes_by_hour() == {"atlas": [15_000] + [0] * 23, "sol": [5] + [0] * 23}
    assert steps[1] * 100 < steps[0]  # the 5 new events, not the day's 20,005 again
    conn.execute(
        "INSERT INTO memory_event (kind, tier, row_id, agent, ts) "
        "VALUES ('write', 'long', 1, 'sol', strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-90 minutes'))"
    )
    assert store.writes_by_hour()["sol"][:3] == [5, 1, 0]
    conn.close()
    store.close()


def test_with_workers_the_page_and_metrics_say_which_worker_counted(server):
    """Under `serve --workers N` each worker answers the page and /metrics from its own counters (requests,
    rejections, busy refusals, load). The page said only the copy, the same for every worker, so two loads 15 s
    apart showed two workers' counts as one service's going up and down; /metrics could not tell them apart."""
    assert "worker" not in Dom(server.get("/").raw.decode()).text_by_id  # one process: nothing to say
    server.server.memory.serving = {"workers": 2, "worker": 2, "worker_pid": 4242}  # what open_server sets
    dom = Dom(server.get("/").raw.decode())
    note = dom.text_by_id["worker"]
    assert "Worker 2 of 2" in note and "this worker's" in note and "Rejections" in note, note
    assert "worker 2 of 2" in dom.text_by_id["footer"]
    metrics = server.get("/metrics").raw.decode()
    assert re.search(r'^solos_memory_copy_info\{copy="[^"]+",worker="2",workers="2"\} 1$', metrics, re.M), metrics


def test_the_health_badge_is_not_a_green_ok_while_storage_fails(server):
    """/health's status is always "ok" (it answered); the page showed that as a green "ok" badge at the top while
    a full disk refused every write, the problem itself further down."""
    assert {"class": "badge good", "id": "health"} in Dom(server.get("/").raw.decode()).elements("span")
    server.server.memory.store.storage_failed("the disk holding the database is full")
    dom = Dom(server.get("/").raw.decode())
    assert dom.text_by_id["health"] == "storage failing"
    assert {"class": "badge bad", "id": "health"} in dom.elements("span")


def test_a_failing_qdrant_mirror_is_a_problem_on_the_page():
    """/metrics said solos_memory_qdrant_mirror_failing 1 and /v1/stats the backlog and error, while the page,
    which has no Qdrant section, said "Nothing needs attention." as the outbox grew."""
    health = {"status": "ok", "version": "0", "auth": "loopback-trust", "embedder_state": "off", "degraded": True}
    qdrant = {"configured": True, "target": "http://127.0.0.1:6333 collection long_term", "backlog": 12}
    failing = {**qdrant, "consecutive_failures": 4, "last_error": "ConnectError: [Errno 111] Connection refused"}
    assert solos_status.problem_list(health, {"qdrant": {**qdrant, "consecutive_failures": 0}}) == []
    assert solos_status.problem_list(health, {"qdrant": {"configured": False, "backlog": 3}}) == []
    problems = solos_status.problem_list(health, {"qdrant": failing})
    assert problems == [
        "Qdrant mirror failing (4 attempts in a row; 12 changes queued): ConnectError: [Errno 111] Connection refused"
    ]
    page = Dom(solos_status.render_page(health, {"qdrant": failing}).decode())
    assert "Qdrant mirror failing" in page.text_by_id["problems"] and page.text_by_id["problem-count"] == "1 problem"
