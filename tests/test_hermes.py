"""Real Hermes Agent against the live /mcp: the fleet spec's definition of done, minus the LLM.

Hermes runs in its own venv (.venv-hermes, made by scripts/setup_hermes.sh)
because hermes-agent 0.19.0 pins mcp 1.26 and installs top-level modules named
`agent` and `tools`; tests/hermes_probe.py is the script it runs there, doing
what a Hermes profile with `mcp_servers: solos-memory: {url, headers}` does.
These tests skip without that venv unless SOLOS_TEST_REQUIRE_ALL=1, as under
`make test`.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # Hermes Agent in its own venv, a process per test

ROOT = Path(__file__).resolve().parent.parent
HERMES_PYTHON = ROOT / ".venv-hermes" / "bin" / "python"
PROBE = Path(__file__).resolve().parent / "hermes_probe.py"
TOOL_PREFIX = "mcp__solos_memory__"
TOOLS = ["recall", "write_short", "write_long", "write_episodic", "delete_short", "stats", "set_sharing", "read_audit"]
FACT = {
    "agent": "atlas",
    "topic": "ops",
    "source": "runbook",
    "confidence": 0.9,
    "tags": [],
    "fact": "The staging cluster's backup window moved to 03:40 UTC after the quokka migration",
}
# A probe run takes about a second on loopback; its own --deadline (60 s) stops
# it first, so this limit only catches a probe that cannot even start.
PROBE_TIMEOUT = 90


@pytest.fixture(scope="module")
def hermes_python() -> Path:
    """The Hermes venv's python, or a skip (a failure under SOLOS_TEST_REQUIRE_ALL=1)."""
    if not HERMES_PYTHON.exists():
        reason = f"Hermes venv missing at {HERMES_PYTHON}: run scripts/setup_hermes.sh"
        if os.environ.get("SOLOS_TEST_REQUIRE_ALL") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return HERMES_PYTHON


def run_hermes(hermes_python: Path, server, *calls: tuple[str, dict], headers: dict | None = None) -> dict:
    """Run the probe in the Hermes venv against the server's /mcp; return its JSON report."""
    # Beside the server's database, so a failure leaves Hermes's logs/ to read.
    home = Path(server.db_path).parent / "hermes-home"
    argv = [str(hermes_python), str(PROBE), server.url + "/mcp", "--deadline", "60", "--home", str(home)]
    if headers:
        argv += ["--headers", json.dumps(headers)]
    for name, arguments in calls:
        argv += ["--call", name, json.dumps(arguments)]
    # A minimal environment: nothing of the project's venv leaks into Hermes's
    # imports, and no proxy variable sends httpx's loopback requests elsewhere.
    # HERMES_DISABLE_LAZY_INSTALLS: Hermes installs no optional package into its venv during a test run.
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "NO_PROXY": "*",
        "no_proxy": "*",
        "LANG": "C.UTF-8",
        "HERMES_DISABLE_LAZY_INSTALLS": "1",
    }
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT, env=env, cwd=str(ROOT / "tests"), check=False
    )
    assert done.returncode == 0, (
        f"probe exited {done.returncode} (logs in {home})\n{done.stdout}\n{done.stderr[-4000:]}"
    )
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert [row["status"] for row in report["status"]] == ["connected"], report["status"]
    return report


def tool_result(call: dict) -> dict:
    """The structured result of one successful Hermes tool call, checked against its text block."""
    parsed = call["parsed"]
    assert isinstance(parsed, dict) and "error" not in parsed, f"{call['tool']} failed in Hermes: {call['raw']}"
    # Hermes hands the model {"result": <text blocks>, "structuredContent": <object>}.
    assert "structuredContent" in parsed, f"no structuredContent reached Hermes: {call['raw']}"
    assert json.loads(parsed["result"]) == parsed["structuredContent"], "text block and structuredContent differ"
    return parsed["structuredContent"]


def tool_error(call: dict) -> str:
    """The text of one isError tool result, as Hermes hands it to the model."""
    assert isinstance(call["parsed"], dict) and set(call["parsed"]) == {"error"}, call["raw"]
    return call["parsed"]["error"]


def rows_with_text(result: dict, text: str) -> list[dict]:
    return [row for row in result["results"] if row["text"] == text]


def test_hermes_recalls_a_fact_another_agent_wrote(hermes_python, server):
    """Hermes registers mcp__solos_memory__*, and its recall returns atlas's REST fact as foreign."""
    written = server.post("/v1/long", FACT)
    assert written.status == 201, written.body

    report = run_hermes(hermes_python, server, ("recall", {"agent": "sol", "q": "backup window quokka migration"}))

    assert set(report["tools"]) >= {TOOL_PREFIX + name for name in TOOLS}, report["tools"]
    recall_schema = report["schemas"][TOOL_PREFIX + "recall"]["parameters"]
    assert {"agent", "q"} <= set(recall_schema["properties"]), recall_schema
    (call,) = report["calls"]
    result = tool_result(call)
    assert "degraded" in result
    hits = rows_with_text(result, FACT["fact"])
    assert hits, f"atlas's fact not recalled: {result}"
    assert hits[0]["agent"] == "atlas" and hits[0]["foreign"] is True and hits[0]["tier"] == "long"


def test_hermes_write_is_recalled_over_rest(hermes_python, server):
    """A fact Hermes writes through its tool is what another agent recalls over REST."""
    fact = "Hermes saw the marmalade deploy fail twice on the arm64 runners"
    arguments = {**FACT, "agent": "hermes", "topic": "ci", "source": "hermes", "fact": fact}

    report = run_hermes(hermes_python, server, ("write_long", arguments))

    tool_result(report["calls"][0])
    recalled = server.recall("sol", "marmalade deploy arm64")
    assert recalled.status == 200, recalled.body
    hits = rows_with_text(recalled.body, fact)
    assert hits and hits[0]["agent"] == "hermes" and hits[0]["foreign"] is True, recalled.body


def test_every_tool_succeeds_through_hermes(hermes_python, server):
    """Each tool's result passes Hermes's client (mcp 1.26 checks structuredContent against outputSchema)."""
    calls = [
        ("write_short", {"agent": "hermes", "key": "scratch", "value": "draft", "ttl_s": 600, "tags": []}),
        ("delete_short", {"agent": "hermes", "key": "scratch"}),
        ("write_long", {**FACT, "agent": "hermes"}),
        (
            "write_episodic",
            {
                "agent": "atlas",
                "event_type": "deploy",
                "summary": "Deployed the gateway",
                "details": "two nodes",
                "outcome": "success",
                "duration_s": 1.5,
            },
        ),
        ("set_sharing", {"agent": "atlas", "episodic": True}),
        # A string where the schema says integer, a bare tier where it says array:
        # Hermes coerces both before sending, as it does for a model's arguments.
        ("recall", {"agent": "hermes", "q": "deployed gateway", "k": "3", "tiers": "episodic"}),
        ("read_audit", {"agent": "atlas"}),
        ("stats", {}),
    ]
    assert sorted(name for name, _ in calls) == sorted(TOOLS)

    report = run_hermes(hermes_python, server, *calls)

    results = {call["tool"]: tool_result(call) for call in report["calls"]}
    assert [row["agent"] for row in results["recall"]["results"]] == ["atlas"], results["recall"]
    assert [row["reader"] for row in results["read_audit"]["reads"]] == ["hermes"], results["read_audit"]


def test_hermes_reads_a_rule_violation_and_carries_on(hermes_python, server):
    """An unknown agent reaches Hermes as a tool error with REST's JSON; the session survives it."""
    refusal = server.recall("nobody", "anything")
    assert 400 <= refusal.status < 500, refusal.body

    report = run_hermes(hermes_python, server, ("recall", {"agent": "nobody", "q": "anything"}), ("stats", {}))

    error_call, stats_call = report["calls"]
    assert json.loads(tool_error(error_call)) == refusal.body
    tool_result(stats_call)


def test_hermes_bearer_token_header_binds_the_caller(hermes_python, make_server, tmp_path):
    """With per-agent tokens, the `headers` in Hermes's server config decide who Hermes is."""
    tokens = {agent: secrets.token_urlsafe(32) for agent in ("atlas", "hermes")}
    tokens_file = tmp_path / "tokens"
    descriptor = os.open(tokens_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.writelines(f"{hashlib.sha256(token.encode()).hexdigest()} {agent}\n" for agent, token in tokens.items())
    server = make_server(tokens_file=str(tokens_file))
    written = server.post("/v1/long", FACT, headers={"Authorization": f"Bearer {tokens['atlas']}"})
    assert written.status == 201, written.body

    report = run_hermes(
        hermes_python,
        server,
        ("recall", {"agent": "hermes", "q": "backup window quokka migration"}),
        ("recall", {"agent": "sol", "q": "backup window quokka migration"}),
        headers={"Authorization": f"Bearer {tokens['hermes']}"},
    )

    own, impersonation = report["calls"]
    hits = rows_with_text(tool_result(own), FACT["fact"])
    assert hits and hits[0]["agent"] == "atlas" and hits[0]["foreign"] is True
    assert "'hermes'" in tool_error(impersonation)
