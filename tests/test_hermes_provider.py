"""The solos memory provider inside real Hermes Agent 0.19.0, against the live service, without an LLM.

The plugin is installed by docs/integrations.md's command (`solos_client.py
install-hermes`, on a bare python3) and selected by Hermes's own
`hermes config set memory.provider solos`. tests/hermes_provider_probe.py then
runs in .venv-hermes: Hermes's discovery loads the plugin from
$HERMES_HOME/plugins/solos/, its MemoryManager initializes it as agent_init
does, and each step calls a hook the way the agent loop does. What the service
stored is read back here from its database. Skips without the Hermes venv
unless SOLOS_TEST_REQUIRE_ALL=1.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import stat
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import FaultServer, dead_url, episodic_rows, metric_samples, skip_or_fail, write_tokens
from hermes_provider_probe import transcript

pytestmark = pytest.mark.slow  # Hermes Agent in its own venv, a process per probe

ROOT = Path(__file__).resolve().parents[1]
HERMES_BIN = ROOT / ".venv-hermes" / "bin"
PROBE = Path(__file__).resolve().parent / "hermes_provider_probe.py"
FACT = "The staging cluster's backup window moved to 03:40 UTC after the quokka migration"
# A probe is about a second; the compaction one builds a whole AIAgent (5 s on a loaded host).
PROBE_TIMEOUT = 120


@pytest.fixture(scope="module")
def installed_home(tmp_path_factory) -> Path:
    """A Hermes home with the plugin installed and selected by docs/integrations.md's two commands."""
    if not (HERMES_BIN / "python").exists():
        skip_or_fail(f"Hermes venv missing at {HERMES_BIN}: run scripts/setup_hermes.sh")
    home = tmp_path_factory.mktemp("hermes") / "home"
    install = subprocess.run(
        [
            sys.executable,
            "-I",
            "-S",
            str(ROOT / "solos_client.py"),
            "install-hermes",
            "--create",
            "--hermes-home",
            str(home),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert install.returncode == 0, install.stderr
    select = subprocess.run(
        [str(HERMES_BIN / "hermes"), "config", "set", "memory.provider", "solos"],
        env=hermes_env(home),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert select.returncode == 0, select.stdout + select.stderr
    assert sorted(p.name for p in (home / "plugins" / "solos").iterdir()) == [
        "__init__.py",
        "plugin.yaml",
        "solos_client.py",
    ]
    return home


@pytest.fixture
def hermes_home(installed_home, tmp_path) -> Path:
    """A fresh copy of the installed home per test (the spool lives in it)."""
    return Path(shutil.copytree(installed_home, tmp_path / "hermes-home"))


def hermes_env(home: Path, **extra: str) -> dict:
    """Nothing of the project's venv or the caller's HOME leaks into Hermes."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HERMES_HOME": str(home),
        "HOME": str(home),
        "NO_PROXY": "*",
        "no_proxy": "*",
        "LANG": "C.UTF-8",
        "HERMES_DISABLE_LAZY_INSTALLS": "1",  # Hermes installs no optional package into its venv during a run
    }
    return {**env, **extra}


def run_probe(home: Path, url: str, steps: list[dict], *, token: str | None = None, llm_url: str = "") -> dict:
    """Run the steps through Hermes in its venv; return the probe's report (and its log in report["log"])."""
    extra = {"SOLOS_MEMORY_URL": url, **({"SOLOS_MEMORY_TOKEN": token} if token else {})}
    argv = [str(HERMES_BIN / "python"), str(PROBE), "--steps", json.dumps(steps), "--deadline", "100"]
    if llm_url:
        argv += ["--llm-url", llm_url]
    done = subprocess.run(
        argv,
        env=hermes_env(home, **extra),
        cwd=str(ROOT / "tests"),
        capture_output=True,
        text=True,
        timeout=PROBE_TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, f"probe exited {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["provider"] == {
        "name": "solos",
        "class": "SolosMemoryProvider",
        "module": "_hermes_user_memory.solos",
    }, report["provider"]
    report["log"] = done.stderr
    return report


def step(report: dict, op: str, n: int = 0) -> dict:
    """The n-th result of that step."""
    return [s for s in report["steps"] if s["op"] == op][n]


def rows(server, sql: str, *params) -> list[dict]:
    with server.db() as db:
        return [dict(row) for row in db.execute(sql, params)]


# ---- a turn, end to end ----


def test_a_turn_through_hermes_hooks(server, hermes_home):
    """Prefetch recalls atlas's fact as foreign; the turn, memory writes and a delegation land as agent hermes."""
    assert server.post("/v1/long", {"agent": "atlas", "topic": "ops", "fact": FACT}).status == 201
    # Recalled by "ok" if prefetch asked the service: an empty prefetch below means it was skipped.
    assert server.post("/v1/long", {"agent": "atlas", "fact": "Friday deploys are ok until noon"}).status == 201
    question, answer = "When is the staging backup window now?", "03:40 UTC, since the quokka migration."

    report = run_probe(
        hermes_home,
        server.url,
        [
            {"op": "schemas"},
            {"op": "prefetch", "query": question},
            {"op": "prefetch", "query": "ok"},
            {"op": "prefetch", "query": "   "},
            {"op": "sync", "user": question, "assistant": answer},
            {"op": "sync", "user": question, "assistant": answer},  # the same turn synced twice
            {"op": "memory_write", "action": "add", "target": "user", "content": "User reads times in UTC"},
            {"op": "memory_write", "action": "replace", "target": "memory", "content": "Staging runs on host quokka"},
            {"op": "delegation", "task": "Check staging disk usage", "result": "Disk at 41%", "child_session_id": "c1"},
            {"op": "flush"},
            {"op": "counts"},
        ],
    )

    assert step(report, "schemas")["result"] == ["solos_recall", "solos_remember"]
    recalled = step(report, "prefetch")["result"]
    assert f"- [atlas, foreign; long] {FACT}" in recalled, recalled
    assert step(report, "prefetch", 1)["result"] == "" and step(report, "prefetch", 2)["result"] == ""
    assert step(report, "flush")["result"] == [True, True]
    assert step(report, "counts")["result"] | {"queued": 0} == {
        "queued": 0,
        "written": 5,
        "dropped": 0,
        "failed": 0,
        "worker_restarts": 0,
        "archived": 0,
    }
    turns = episodic_rows(server, "hermes", "hermes_turn")
    assert [(t["summary"], t["details"], t["outcome"]) for t in turns] == [(question, answer, "answered")]
    facts = rows(server, "SELECT topic, fact, source FROM memory_longterm WHERE agent = 'hermes' ORDER BY id")
    assert facts == [
        {"topic": "USER.md", "fact": "User reads times in UTC", "source": "hermes USER.md"},
        {"topic": "MEMORY.md", "fact": "Staging runs on host quokka", "source": "hermes MEMORY.md"},
    ]
    (delegation,) = episodic_rows(server, "hermes", "delegation")
    assert (delegation["summary"], delegation["details"], delegation["outcome"]) == (
        "Check staging disk usage",
        "Disk at 41%",
        "returned",
    )
    assert "verif" not in json.dumps(delegation).lower()
    seen_by_sol = server.recall("sol", "user reads times").body["results"]
    assert ("hermes", True, "User reads times in UTC") in [(r["agent"], r["foreign"], r["text"]) for r in seen_by_sol]


def notices_read(server) -> int:
    """How many GET /v1/notices the service has answered (its /metrics counter)."""
    samples = metric_samples(server, "solos_memory_requests_total")
    return int(sum(n for labels, n in samples.items() if 'route="/v1/notices"' in labels and 'method="GET"' in labels))


def test_prefetch_reads_the_notices_once_a_turn(server, hermes_home):
    """One GET /v1/notices per prefetch, trivial prompt or not: the notices come first, shown once."""
    assert server.post("/v1/long", {"agent": "atlas", "topic": "ops", "fact": FACT}).status == 201
    before = notices_read(server)
    report = run_probe(
        hermes_home,
        server.url,
        [{"op": "prefetch", "query": "When is the staging backup window now?"}, {"op": "prefetch", "query": "ok"}],
    )
    assert f"- [atlas, foreign; long] {FACT}" in step(report, "prefetch")["result"]
    assert notices_read(server) - before == 2


def test_tools_for_the_model(server, hermes_home):
    """solos_recall returns rows; solos_remember writes as hermes, and bad input comes back naming the field."""
    assert server.post("/v1/long", {"agent": "atlas", "topic": "ops", "fact": FACT}).status == 201

    report = run_probe(
        hermes_home,
        server.url,
        [
            {"op": "tool", "name": "solos_recall", "args": {"query": "backup window", "k": 2}},
            {
                "op": "tool",
                "name": "solos_remember",
                "args": {"fact": "The quokka host has 64 GB of RAM", "topic": "hw"},
            },
            {"op": "tool", "name": "solos_remember", "args": {"fact": ""}},
            {"op": "tool", "name": "solos_recall", "args": {"query": "backup", "k": 500}},
            {"op": "tool", "name": "solos_recall", "args": {"query": "backup", "k": 0}},
        ],
    )

    recall, remember, empty, too_many, none = (s["result"] for s in report["steps"])
    assert [(r["agent"], r["foreign"], r["text"]) for r in recall["results"]] == [("atlas", True, FACT)]
    # The model is told what the service said of its answer: this one ranks without embeddings (keyword-only).
    assert recall["degraded"] is True and "keyword-only" in recall["degraded_reason"], recall
    assert recall["truncated"] is None
    # ... and who judged its rows (keyword-only: the features judge's keyword fit), and no word was left out.
    assert recall["receipt"]["judge"].startswith("features-keyword@") and recall["receipt"]["words_left_out"] == []
    assert remember["status"] == "created" and remember["agent"] == "hermes"
    assert empty["field"] == "fact" and "fact must be" in empty["error"]
    assert too_many["results"] == [] and too_many["error"]["field"] == "k"
    assert none["results"] == [] and none["error"]["field"] == "k"  # not quietly read as the default 5


def test_trivial_prompts_are_judged_by_hermes_own_predicate(server, hermes_home):
    cases = {
        "ok": True,
        "Thanks.": True,
        "got it": True,
        "": True,
        "   ": True,
        "/compress": True,
        "/model gpt-5": True,
        "When is the backup window?": False,
        "ok, and the quokka host?": False,
    }

    report = run_probe(hermes_home, server.url, [{"op": "trivial", "texts": list(cases)}])

    result = step(report, "trivial")
    assert result["hermes_predicate"] == "plugins.memory.supermemory"
    for (text, expected), (ours, hermes) in zip(cases.items(), result["result"]):
        assert ours is expected, text
        if text.strip() and not text.startswith("/"):
            assert ours is hermes, text


# ---- the archive: fail closed, retry without duplicates ----


def test_archive_fails_closed_and_a_retry_writes_nothing_twice(server, hermes_home):
    messages = transcript(30, 120)
    content = json.dumps(messages, ensure_ascii=False, sort_keys=True, default=str)
    digest = hashlib.sha256(f"hermes\0{content}".encode()).hexdigest()
    archive_step = {"op": "pre_compress_direct", "count": 30, "words": 120}

    down = run_probe(
        hermes_home,
        dead_url(),
        [
            archive_step,
            {"op": "pre_compress", "count": 30, "words": 120},  # through Hermes's manager
            {"op": "spooled"},
        ],
    )
    up = run_probe(
        hermes_home,
        server.url,
        [
            {"op": "flush"},  # initialize queued the spool's archive
            {"op": "spooled"},
            archive_step,
            archive_step,
            {"op": "counts"},
        ],
    )

    raised = step(down, "pre_compress_direct")
    assert raised["raised"] == "ArchiveFailed" and "connection refused" in raised["message"], raised
    assert step(down, "pre_compress")["result"] == ""  # Hermes's manager swallowed the same raise
    assert step(down, "spooled")["result"] == [f"{digest}.json"]
    assert "not archived" in down["log"]  # the provider's own ERROR line: Hermes logs it at DEBUG only

    assert step(up, "spooled")["result"] == []
    for n in (0, 1):
        assert digest[:16] in step(up, "pre_compress_direct", n)["result"]
    parts = episodic_rows(server, "hermes", "transcript_archive")
    assert len(parts) == -(-len(content) // 16_384) >= 2
    assert "".join(part["details"] for part in parts) == content
    assert all(f"sha256 {digest[:16]}" in part["summary"] for part in parts)
    assert step(up, "counts")["result"]["archived"] == 3  # the spool, then two no-op retries


class StubLLM(BaseHTTPRequestHandler):
    """An OpenAI-compatible endpoint whose every completion is a fixed summary: Hermes's compactor needs one."""

    def do_GET(self) -> None:
        self.answer({"object": "list", "data": [{"id": "stub-model", "object": "model"}]})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        message = {"role": "assistant", "content": "## Summary\nThe user and the agent went through 40 turns."}
        self.answer(
            {
                "id": "stub",
                "object": "chat.completion",
                "created": 0,
                "model": "stub-model",
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )

    def answer(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


def test_hermes_compacts_even_when_the_archive_hook_raises(hermes_home):
    """What Hermes 0.19.0 does with our raise: a real AIAgent's compaction goes ahead; only the spool keeps it."""
    llm = ThreadingHTTPServer(("127.0.0.1", 0), StubLLM)
    threading.Thread(target=llm.serve_forever, daemon=True).start()
    try:
        report = run_probe(
            hermes_home,
            dead_url(),
            [{"op": "compress", "count": 40}, {"op": "spooled"}],
            llm_url=f"http://127.0.0.1:{llm.server_address[1]}/v1",
        )
    finally:
        llm.shutdown()
        llm.server_close()

    compacted = step(report, "compress")
    assert compacted["providers"] == ["solos"]
    assert compacted["after"] < compacted["before"], compacted  # compaction went ahead...
    assert len(step(report, "spooled")["result"]) == 1  # ...although the hook raised (it spools only then)
    # An AIAgent sends logging to its own files; the provider's ERROR is there, Hermes's DEBUG line is not.
    errors = (hermes_home / "logs" / "errors.log").read_text()
    assert "solos: transcript (41 messages) not archived" in errors, errors[-2000:]


# ---- failing soft ----


@pytest.mark.parametrize("service", ["dead", "silent", "garbage"])
def test_a_broken_service_never_raises_from_a_fail_soft_hook(hermes_home, service):
    faulty = None
    if service == "dead":
        url = dead_url()
    else:
        faulty = FaultServer(("hang",) if service == "silent" else ("http", 200, b"<html>not the service</html>"))
        url = faulty.url
    hooks = [
        {"op": "direct", "hook": "prefetch", "args": ["When is the backup window?"]},
        {"op": "direct", "hook": "sync_turn", "args": ["When is the backup window?", "03:40 UTC"]},
        {"op": "direct", "hook": "on_delegation", "args": ["Check disks", "41%"], "kwargs": {"child_session_id": "c"}},
        {"op": "direct", "hook": "on_memory_write", "args": ["add", "memory", "Staging runs on quokka"]},
        {"op": "direct", "hook": "handle_tool_call", "args": ["solos_recall", {"query": "backup"}]},
        {"op": "direct", "hook": "queue_prefetch", "args": ["next question"]},
    ]
    if service != "silent":  # a silent service holds each write for its 2 s deadline; no need to wait them out
        hooks += [{"op": "flush"}, {"op": "counts"}]
    try:
        report = run_probe(hermes_home, url, hooks)
    finally:
        if faulty:
            faulty.close()

    called = [s for s in report["steps"] if s["op"] == "direct"]
    assert not [s for s in called if "raised" in s], called
    prefetch, sync, delegation, memory_write, tool, _ = called
    assert prefetch["result"].startswith("Shared memory could not be recalled this turn (unavailable: ")
    assert prefetch["seconds"] < 0.8 + 0.5
    assert max(s["seconds"] for s in (sync, delegation, memory_write)) < 0.1  # queued, not waited for
    assert json.loads(tool["result"])["results"] == [] and "error" in json.loads(tool["result"])
    if service != "silent":
        assert step(report, "counts")["result"]["failed"] == 3


def test_a_full_queue_drops_and_counts_and_a_dead_worker_is_replaced(server, hermes_home):
    report = run_probe(
        hermes_home,
        server.url,
        [
            {"op": "kill_worker"},
            {"op": "sync", "user": "After the worker died", "assistant": "still recorded"},
            {"op": "flush"},
            {"op": "block_worker"},
            {"op": "sync_many", "count": 300},
            {"op": "counts"},
            {"op": "release"},
            {"op": "flush"},
            {"op": "counts"},
        ],
    )

    assert step(report, "kill_worker")["result"] is True
    assert step(report, "sync_many")["slowest"] < 0.05  # a full queue never blocks the turn
    held = step(report, "counts")
    assert held["result"]["dropped"] == 300 - 256 and held["queue"] == 256
    final = step(report, "counts", 1)["result"]
    assert (final["worker_restarts"], final["written"], final["dropped"], final["failed"]) == (1, 1 + 256, 44, 0)
    assert len(episodic_rows(server, "hermes", "hermes_turn")) == 1 + 256


def test_token_gated_even_on_loopback(make_server, hermes_home, tmp_path):
    token = secrets.token_urlsafe(32)
    write_tokens(tmp_path / "tokens", {token: "hermes"})
    server = make_server(tokens_file=str(tmp_path / "tokens"))
    assert server.post("/v1/long", {"agent": "hermes", "fact": FACT}).status == 401
    turn = [{"op": "sync", "user": "Who holds the token?", "assistant": "hermes"}, {"op": "flush"}, {"op": "counts"}]

    with_token = run_probe(hermes_home, server.url, [{"op": "prefetch", "query": "backup window"}, *turn], token=token)
    wrong = run_probe(
        hermes_home, server.url, [{"op": "prefetch", "query": "backup window"}, *turn], token="not-" + token
    )

    assert step(with_token, "counts")["result"]["written"] == 1
    assert step(wrong, "counts")["result"]["failed"] == 1
    assert "unauthorized" in wrong["log"]
    assert [t["summary"] for t in episodic_rows(server, "hermes", "hermes_turn")] == ["Who holds the token?"]


def test_the_configs_token_file_beats_the_environments_token(make_server, hermes_home, tmp_path):
    """plugins.solos.token_file in config.yaml beats SOLOS_MEMORY_TOKEN, as config.yaml beats the environment
    for every setting: a shell exporting another agent's token made every call 403, the config's token unread."""
    hermes, atlas = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    write_tokens(tmp_path / "tokens", {hermes: "hermes", atlas: "atlas"})
    server = make_server(tokens_file=str(tmp_path / "tokens"))
    (tmp_path / "hermes.token").write_text(hermes + "\n")
    config = hermes_home / "config.yaml"
    set_token_file = subprocess.run(
        [str(HERMES_BIN / "hermes"), "config", "set", "plugins.solos.token_file", str(tmp_path / "hermes.token")],
        env=hermes_env(hermes_home),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert set_token_file.returncode == 0 and "token_file" in config.read_text(), set_token_file.stderr
    turn = [{"op": "sync", "user": "Whose token?", "assistant": "hermes's"}, {"op": "flush"}, {"op": "counts"}]

    report = run_probe(hermes_home, server.url, turn, token=atlas)

    assert step(report, "counts")["result"]["written"] == 1, report["log"][-2000:]
    assert [t["summary"] for t in episodic_rows(server, "hermes", "hermes_turn")] == ["Whose token?"]


# ---- Hermes's own memory tool, and failures nobody planned for ----


def test_hermes_memory_tool_add_replace_remove_reach_the_service(server, hermes_home):
    """The model's `memory` tool as Hermes 0.19.0 runs it: remove and replace name the entry by a substring."""
    recall = {"op": "tool", "name": "solos_recall", "args": {"query": "editor mode", "scope": "shared", "k": 10}}
    dark, light = "User prefers dark mode in every editor", "User prefers light mode in every editor"
    report = run_probe(
        hermes_home,
        server.url,
        [
            {"op": "memory_tool", "action": "add", "target": "user", "content": dark},
            {"op": "memory_tool", "action": "add", "target": "user", "content": "User works in the Lisbon office"},
            {"op": "flush"},
            recall,
            {"op": "memory_tool", "action": "replace", "target": "user", "old_text": "dark mode", "content": light},
            {"op": "flush"},
            recall,
            {"op": "memory_tool", "action": "remove", "target": "user", "old_text": "light mode"},
            {"op": "flush"},
            recall,
            {"op": "counts"},
        ],
    )
    assert all(s["result"]["success"] for s in report["steps"] if s["op"] == "memory_tool"), report["steps"]
    seen = [[r["text"] for r in step(report, "tool", n)["result"]["results"] if "mode" in r["text"]] for n in range(3)]
    assert seen == [[dark], [light], []], seen
    assert step(report, "counts")["result"]["failed"] == 0
    facts = rows(server, "SELECT topic, fact FROM memory_longterm WHERE agent = 'hermes' ORDER BY id")
    assert facts == [{"topic": "USER.md", "fact": "User works in the Lisbon office"}]
    forgotten = rows(server, "SELECT agent, tier FROM memory_retraction ORDER BY id")
    assert forgotten == [{"agent": "hermes", "tier": "long"}] * 2
    assert "hermes" not in json.dumps(server.recall("sol", "dark mode light mode editor", k=10).body["results"])


def test_the_archive_spools_on_any_failure(hermes_home):
    """A client error nobody planned for, and an answer nested past the stack: both spool, neither escapes raw."""
    deep = FaultServer(("http", 200, b"[" * 200_000 + b"]" * 200_000))
    try:
        broken = run_probe(
            hermes_home,
            deep.url,
            [{"op": "break_client"}, {"op": "pre_compress_direct", "count": 4}, {"op": "spooled"}],
        )
        nested = run_probe(
            hermes_home,
            deep.url,
            [
                {"op": "pre_compress_direct", "count": 6},
                {"op": "tool", "name": "solos_remember", "args": {"fact": "A fact"}},
                {"op": "spooled"},
            ],
        )
    finally:
        deep.close()
    failed = step(broken, "pre_compress_direct")
    assert failed["raised"] == "ArchiveFailed" and "MemoryError" in failed["message"], failed
    assert len(step(broken, "spooled")["result"]) == 1
    assert step(nested, "pre_compress_direct")["raised"] == "ArchiveFailed"
    assert "too deep" in json.dumps(step(nested, "tool")["result"])
    assert len(step(nested, "spooled")["result"]) == 2
    # A transcript is the agent's own memory: its spool is its user's alone, whatever the umask (022 here).
    spool = hermes_home / "solos-spool"
    assert stat.S_IMODE(spool.stat().st_mode) == 0o700
    assert {stat.S_IMODE(path.stat().st_mode) for path in spool.iterdir()} == {0o600}


@pytest.mark.parametrize("answer", [b'{"status": "ok"}', b'{"status": "created"}'], ids=["ok", "no id"])
def test_the_archive_trusts_only_the_services_own_answer(hermes_home, answer):
    """Another service answering JSON with a status has archived nothing: the transcript is spooled."""
    impostor = FaultServer(("http", 200, answer))
    try:
        report = run_probe(
            hermes_home,
            impostor.url,
            [{"op": "pre_compress_direct", "count": 4}, {"op": "spooled"}, {"op": "counts"}],
        )
    finally:
        impostor.close()
    archived = step(report, "pre_compress_direct")
    assert archived.get("raised") == "ArchiveFailed" and "not the service's answer" in archived["message"], archived
    assert len(step(report, "spooled")["result"]) == 1
    assert step(report, "counts")["result"]["archived"] == 0
