"""Drive the solos memory provider through Hermes's own plugin discovery and MemoryManager, without an LLM.

Run by .venv-hermes/bin/python (never the project's venv), with HERMES_HOME
holding an installed plugin and `memory.provider: solos` in its config.yaml:

    .venv-hermes/bin/python tests/hermes_provider_probe.py --steps '[{"op": "prefetch", "query": "..."}]'

It does what agent/agent_init.py does at startup when memory.provider is set
(load_memory_provider, is_available, MemoryManager.add_provider,
initialize_all with agent_context "primary"), then runs each step through the
manager, the way the agent loop calls it, and prints one JSON report:

    {"provider": {"name", "class", "module"}, "discovered": [...], "steps": [{"op", ..., "result" | "raised"}]}

Steps: prefetch, sync, flush, memory_write, memory_tool (Hermes's own memory tool),
break_client, delegation, tool, schemas,
pre_compress (through the manager), pre_compress_direct and direct (the
provider's own hook, so what it raises shows), trivial, sync_many,
block_worker and release, kill_worker, counts, spooled. `compress` runs a
real AIAgent's compaction against --llm-url (an OpenAI-compatible stub the
test serves) and reports the message counts.
Exit status 0 when the provider loaded, 2 when it did not, 3 past --deadline.
"""

import argparse
import json
import sys
import threading
import time

from hermes_probe import arm_deadline  # beside this file: the MCP probe's hard stop, exit status 3

RELEASE = threading.Event()  # block_worker holds the provider's worker until the release step


def transcript(count: int, words: int) -> list:
    """A deterministic transcript: a system message, then alternating user/assistant messages."""
    messages = [{"role": "system", "content": "You are a fleet agent."}]
    for index in range(count):
        role = "user" if index % 2 == 0 else "assistant"
        messages.append({"role": role, "content": f"turn {index} " + " ".join(f"w{index}x{n}" for n in range(words))})
    return messages


def run_step(step: dict, manager, provider, module, llm_url: str) -> dict:
    """One hook call, as the agent loop makes it; its result or the exception it raised."""
    op = step["op"]
    if op == "prefetch":
        started = time.monotonic()
        text = manager.prefetch_all(step["query"])
        return {"result": text, "seconds": time.monotonic() - started}
    if op == "sync":
        started = time.monotonic()
        manager.sync_all(step["user"], step["assistant"], session_id=step.get("session_id", ""))
        return {"seconds": time.monotonic() - started}
    if op == "flush":
        return {"result": [manager.flush_pending(timeout=15), provider.flush(timeout=15)]}
    if op == "memory_write":
        # What the agent loop does after the built-in memory tool committed a write.
        args = {"action": step["action"], "target": step["target"], "content": step["content"]}
        manager.notify_memory_tool_write(json.dumps({"success": True}), args)
        return {}
    if op == "memory_tool":
        # What agent/tool_executor.py does for the model's `memory` tool call: Hermes's own tool on its own
        # store (MEMORY.md / USER.md under HERMES_HOME), then the manager's mirror of a committed write.
        from tools.memory_tool import load_on_disk_store, memory_tool

        args = {key: step[key] for key in ("action", "target", "content", "old_text") if key in step}
        result = memory_tool(**args, store=load_on_disk_store())
        manager.notify_memory_tool_write(result, args)
        return {"result": json.loads(result)}
    if op == "break_client":
        # The archive's client fails in a way no one planned for (not a SolosError).
        def broken(*args, **kwargs):
            raise MemoryError("simulated: the client blew up")

        provider.strict.call_or_raise = broken
        return {}
    if op == "delegation":
        manager.on_delegation(step["task"], step["result"], child_session_id=step.get("child_session_id", ""))
        return {}
    if op == "tool":
        raw = manager.handle_tool_call(step["name"], step["args"])
        return {"result": json.loads(raw)}
    if op == "schemas":
        return {"result": [schema["name"] for schema in manager.get_all_tool_schemas()]}
    if op in ("pre_compress", "pre_compress_direct"):
        messages = transcript(step["count"], step.get("words", 20))
        started = time.monotonic()
        try:
            hook = manager.on_pre_compress if op == "pre_compress" else provider.on_pre_compress
            return {"result": hook(messages), "seconds": time.monotonic() - started}
        except Exception as error:
            return {"raised": type(error).__name__, "message": str(error), "seconds": time.monotonic() - started}
    if op == "trivial":
        hermes = module.hermes_is_trivial
        verdicts = [[module.is_trivial_prompt(text), bool(hermes and hermes(text))] for text in step["texts"]]
        return {"result": verdicts, "hermes_predicate": getattr(hermes, "__module__", None)}
    if op == "direct":
        # The provider's own hook, not the manager (which would swallow what it raises).
        started = time.monotonic()
        try:
            result = getattr(provider, step["hook"])(*step.get("args", []), **step.get("kwargs", {}))
        except Exception as error:
            return {"raised": type(error).__name__, "message": str(error), "seconds": time.monotonic() - started}
        return {"result": result, "seconds": time.monotonic() - started}
    if op == "sync_many":
        slowest = 0.0
        for number in range(step["count"]):
            started = time.monotonic()
            provider.sync_turn(f"question {number}", f"answer {number}")
            slowest = max(slowest, time.monotonic() - started)
        return {"slowest": slowest}
    if op == "block_worker":
        provider.submit("block", lambda: RELEASE.wait(30))
        while provider.jobs.qsize():  # until the worker holds the block, so the queue's room is known
            time.sleep(0.001)
        return {}
    if op == "release":
        RELEASE.set()
        return {}
    if op == "kill_worker":

        def die() -> None:
            raise SystemExit("worker killed by the probe")

        worker = provider.worker
        provider.submit("poison", die)
        worker.join(5)
        return {"result": not worker.is_alive()}
    if op == "counts":
        return {"result": dict(provider.counts), "queue": provider.jobs.qsize()}
    if op == "spooled":
        return {"result": [path.name for path in provider.spooled()]}
    if op == "compress":
        return compress_with_agent(step, llm_url)
    raise SystemExit(f"unknown step {op!r}")


def compress_with_agent(step: dict, llm_url: str) -> dict:
    """A real AIAgent (memory.provider from config.yaml) compacting a transcript; its summary LLM is the stub."""
    from run_agent import AIAgent

    agent = AIAgent(
        base_url=llm_url,
        api_key="stub",
        model="stub-model",
        provider="custom",
        quiet_mode=True,
        skip_context_files=True,
    )
    messages = transcript(step["count"], step.get("words", 20))
    compressed, _ = agent._compress_context(messages, "You are a fleet agent.", approx_tokens=100_000, force=True)
    manager = agent._memory_manager
    return {
        "providers": [p.name for p in manager.providers] if manager else [],
        "before": len(messages),
        "after": len(compressed),
    }


def main(argv: list | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", required=True, help="JSON list of steps (see the module docstring)")
    parser.add_argument("--session-id", default="probe-session", help="session id (default: %(default)s)")
    parser.add_argument("--identity", default="default", help="Hermes profile name (default: %(default)s)")
    parser.add_argument("--llm-url", default="", help="OpenAI-compatible stub for the compress step (default: none)")
    parser.add_argument("--deadline", type=float, default=60.0, help="hard stop, seconds (default: %(default)s)")
    args = parser.parse_args(argv)
    arm_deadline(args.deadline)
    steps = json.loads(args.steps)

    # Imported late: Hermes reads HERMES_HOME at import time.
    from agent.memory_manager import MemoryManager
    from hermes_constants import get_hermes_home
    from plugins.memory import _get_active_memory_provider, discover_memory_providers, load_memory_provider

    report: dict = {"discovered": [list(row) for row in discover_memory_providers()], "steps": []}
    name = _get_active_memory_provider()
    provider = load_memory_provider(name) if name else None
    if provider is None or not provider.is_available():
        report["provider"] = None
        print(json.dumps(report), flush=True)
        return 2
    manager = MemoryManager()
    manager.add_provider(provider)
    manager.initialize_all(
        session_id=args.session_id,
        platform="cli",
        hermes_home=str(get_hermes_home()),
        agent_context="primary",
        agent_identity=args.identity,
        agent_workspace="hermes",
    )
    module = sys.modules[type(provider).__module__]
    report["provider"] = {"name": provider.name, "class": type(provider).__name__, "module": module.__name__}
    for step in steps:
        report["steps"].append({"op": step["op"], **run_step(step, manager, provider, module, args.llm_url)})
    manager.shutdown_all()
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
