"""solos-memory as a Hermes Agent 0.19.0 memory provider (MemoryProvider).

Installed, not imported: `solos_client.py install-hermes` writes this file as
$HERMES_HOME/plugins/solos/__init__.py with solos_client.py beside it (Hermes
loads the folder's other modules as submodules, hence `from . import`), and
`hermes config set memory.provider solos` selects it. It never imports the
service; every call goes through solos_client over HTTP.

Settings, under `plugins: solos:` in config.yaml, else the environment:
  url         SOLOS_MEMORY_URL         http://127.0.0.1:8437
  agent       SOLOS_MEMORY_AGENT       the Hermes profile's name ("hermes" for the default profile)
  token       SOLOS_MEMORY_TOKEN       (a secret: Hermes keeps it in $HERMES_HOME/.env)
  token_file  SOLOS_MEMORY_TOKEN_FILE  (none); in config.yaml it beats SOLOS_MEMORY_TOKEN
  recall_k    SOLOS_MEMORY_RECALL_K    3

What each hook does, and how it fails:
  prefetch         recall (top recall_k, shared scope) before the turn, as prompt lines;
                   trivial prompts skipped. Fails soft: one line saying recall failed, and
                   why (not "", which would read as nothing known), and one log line.
  sync_turn        the finished turn as one episodic event, from a bounded queue and a
                   worker thread; a full queue drops the turn (counted), a dead worker is
                   restarted on the next hook. Never blocks, never raises.
  on_delegation    a subagent's task and result as one episodic event, via the same queue.
  on_memory_write  a MEMORY.md / USER.md entry added becomes a long fact of the agent; a
                   removal forgets the fact written for that entry; a replace is that
                   forget plus a write. Hermes 0.19.0 names the entry only by old_text, a
                   substring, so each fact's row id is kept per entry in
                   $HERMES_HOME/solos-entries.json.
  on_pre_compress  the transcript archived as episodic events keyed by sha256(agent, content),
                   so a retry is a no-op. Fails closed: raises ArchiveFailed when the archive
                   is not committed (whatever went wrong), after spooling the transcript to
                   $HERMES_HOME/solos-spool/ (Hermes 0.19.0 swallows the exception and
                   compacts anyway; see README "Hermes memory provider").
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.memory_provider import MemoryProvider

if TYPE_CHECKING:  # mypy reads the checkout's copy; Hermes loads the one installed beside this file
    import solos_client
else:
    from . import solos_client

LOG = logging.getLogger(__name__)

PROVIDER_NAME = "solos"
DEFAULT_RECALL_K = 3
# Turns wait here for the one worker. 256 turns is hours of a busy session
# behind a dead service; past that, dropping (and counting) beats memory growth.
QUEUE_SIZE = 256
# Archiving happens once per compaction and Hermes waits for it: a healthy service takes
# milliseconds per 16 KiB part, so 5 s covers a megabyte of transcript on a loaded host.
ARCHIVE_TIMEOUT_S = 5.0
SHUTDOWN_WAIT_S = 2.0
SPOOL_DIR = "solos-spool"
ENTRIES_FILE = "solos-entries.json"  # topic -> {entry text: long row id}, for on_memory_write's forgets
ARCHIVE_EVENT = "transcript_archive"
TURN_EVENT = "hermes_turn"
MEMORY_TOPICS = {"memory": "MEMORY.md", "user": "USER.md"}

try:
    # Hermes 0.19.0's own acknowledgement test (ok, thanks, got it, ...), from
    # its supermemory provider: the only one it ships. Empty input and slash
    # commands are checked here first; the manager already drops bare /skill turns.
    from plugins.memory.supermemory import _is_trivial_message as hermes_is_trivial
except ImportError:  # a later Hermes may move it; then only empty input and slash commands are skipped
    hermes_is_trivial = None


def is_trivial_prompt(text: str) -> bool:
    """True for prompts not worth a recall: empty, a slash command, or an acknowledgement."""
    stripped = (text or "").strip()
    if not stripped or stripped.startswith("/"):
        return True
    return bool(hermes_is_trivial and hermes_is_trivial(stripped))


class ArchiveFailed(RuntimeError):
    """The transcript could not be committed to the service before compaction."""


class SolosMemoryProvider(MemoryProvider):
    """Shared fleet memory: recall before the turn, the turn recorded after, transcripts archived."""

    name = PROVIDER_NAME

    def __init__(self) -> None:
        self.agent = "hermes"
        self.session_id = ""
        self.hermes_home = Path(os.environ.get("HERMES_HOME") or Path.home() / ".hermes")
        self.recall_k = DEFAULT_RECALL_K
        self.writes_enabled = True
        self.soft: solos_client.Client | None = None  # best effort: prefetch and the recall tool
        self.strict: solos_client.Client | None = None  # raises: the worker, the archive, the remember tool
        self.jobs: queue.Queue = queue.Queue(maxsize=QUEUE_SIZE)
        self.worker: threading.Thread | None = None
        self.worker_lock = threading.Lock()
        self.counts = {"queued": 0, "written": 0, "dropped": 0, "failed": 0, "worker_restarts": 0, "archived": 0}
        self.counts_lock = threading.Lock()

    # -- configuration ---------------------------------------------------------

    def settings(self) -> dict[str, Any]:
        """plugins.solos from config.yaml over SOLOS_MEMORY_* over defaults; no network."""
        section: dict[str, Any] = {}
        try:
            from hermes_cli.config import cfg_get, load_config

            section = cfg_get(load_config(), "plugins", PROVIDER_NAME, default={}) or {}
        except Exception as error:  # an unreadable config must not stop Hermes starting
            LOG.warning("solos: cannot read plugins.%s from config.yaml: %s", PROVIDER_NAME, error)
        env = os.environ

        def pick(key: str) -> Any:
            value = section.get(key)
            return value if value not in (None, "") else env.get(solos_client.ENV_PREFIX + key.upper()) or None

        settings = {key: pick(key) for key in ("url", "agent", "token", "token_file", "recall_k")}
        if section.get("token_file") and not section.get("token"):
            # The config's token file beats the environment's token (as config.yaml beats it for every
            # setting): a shell exporting another agent's token would make every call that agent's, and 403.
            settings["token"] = None
        return settings

    def is_available(self) -> bool:
        """Configured well enough to try: the URL parses (no network here, as the ABC asks)."""
        try:
            solos_client.Client(self.settings()["url"] or solos_client.DEFAULT_URL)
        except ValueError as error:
            LOG.warning("solos: %s", error)
            return False
        return True

    def initialize(self, session_id: str, **kwargs: Any) -> None:
        """Read the settings, build the two clients, start the worker; no network call."""
        settings = self.settings()
        self.session_id = session_id
        self.hermes_home = Path(kwargs.get("hermes_home") or self.hermes_home)
        profile = kwargs.get("agent_identity") or ""
        self.agent = settings["agent"] or (profile if profile not in ("", "default") else "hermes")
        self.recall_k = check_recall_k(settings["recall_k"])
        # The ABC: cron and flush contexts must not write (their prompts are not the user's).
        self.writes_enabled = kwargs.get("agent_context", "primary") == "primary"
        token = settings["token"]
        if not token and settings["token_file"]:
            token = solos_client.read_token_file(settings["token_file"])
        url = settings["url"] or solos_client.DEFAULT_URL
        self.soft = solos_client.Client(url, self.agent, token, best_effort=True)
        self.strict = solos_client.Client(url, self.agent, token)
        self.ensure_worker()
        if self.writes_enabled and self.spooled():
            self.submit("archive spooled transcripts", self.drain_spool)

    def on_session_switch(self, new_session_id: str, **kwargs: Any) -> None:
        """/new, /resume, /branch and compaction rotate the session id; later turns and archives name the new one."""
        self.session_id = new_session_id

    def system_prompt_block(self) -> str:
        return (
            f"Shared fleet memory (solos-memory) is on; you are agent '{self.agent}'. Rows recalled for a "
            "turn name their writer, and 'foreign' marks another agent's. Tools: solos_recall, solos_remember."
        )

    # -- before the turn -------------------------------------------------------

    def prefetch(self, query: str, *, session_id: str = "") -> str:
        """The top recall_k shared rows for this prompt at or above the relevance floor (turn_context's), as prompt
        lines; "" for trivial prompts or nothing relevant; for a failed recall, one line saying so and why.

        Before them, "facts you relied on were retracted": notices of rows this agent was shown that were
        since forgotten or replaced (acknowledged once injected), whatever the prompt.
        """
        if self.soft is None:
            return ""
        if is_trivial_prompt(query):
            return solos_client.retraction_context(self.soft)
        return solos_client.turn_context(self.soft, query, k=self.recall_k)  # the notices first, read once

    # -- after the turn: the queue and its worker ------------------------------

    def sync_turn(
        self,
        user_content: str,
        assistant_content: str,
        *,
        session_id: str = "",
        messages: list[dict[str, Any]] | None = None,
    ) -> None:
        """Queue the finished turn as one episodic event; never blocks."""
        if not self.writes_enabled or self.strict is None:
            return
        session = session_id or self.session_id
        turn_id = hashlib.sha256(f"{session}\0{user_content}\0{assistant_content}".encode()).hexdigest()
        client = self.strict
        self.submit(
            "turn",
            lambda: solos_client.write_turn(
                client, user_content, assistant_content, turn_id=turn_id, outcome="answered", event_type=TURN_EVENT
            ),
        )

    def on_delegation(self, task: str, result: str, *, child_session_id: str = "", **kwargs: Any) -> None:
        """Queue a subagent's task and result as one event. Nothing here says it was verified, so nothing claims it."""
        if not self.writes_enabled or self.strict is None:
            return
        key = "delegation-" + hashlib.sha256(f"{self.agent}\0{child_session_id}\0{task}".encode()).hexdigest()[:40]
        client = self.strict
        self.submit(
            "delegation",
            lambda: client.event(
                "delegation",
                " ".join((task or "(no task)").split())[: solos_client.SUMMARY_CHARS],
                details=(result or "")[: solos_client.DETAILS_CHARS],
                outcome="returned",
                idempotency_key=key,
            ),
        )

    def on_memory_write(self, action: str, target: str, content: str, metadata: dict[str, Any] | None = None) -> None:
        """Mirror Hermes's MEMORY.md / USER.md changes: add writes a fact, remove forgets it, replace does both.

        Hermes 0.19.0 calls a remove with empty content and the entry's
        substring in metadata["old_text"]; the entry is then gone from its file.
        """
        if not self.writes_enabled or self.strict is None:
            return
        topic = MEMORY_TOPICS.get(target, target or "memory")
        old_text = str((metadata or {}).get("old_text") or "").strip()
        new_text = (content or "").strip()
        if action in ("replace", "remove") and old_text:
            still_there = entries_on_disk(target)  # now, before later writes change the file
            self.submit("memory removal", lambda: self.forget_entry(topic, old_text, still_there))
        if action in ("add", "replace") and new_text:
            self.submit("memory write", lambda: self.write_entry(topic, new_text))

    def write_entry(self, topic: str, text: str) -> dict:
        """Write an entry as a long fact and note its row id (run by the worker)."""
        assert self.strict is not None, "written before initialize"
        answer = self.strict.remember(text, topic=topic, source=f"hermes {topic}", tags=["hermes-memory"])
        entries = self.entries()
        entries.setdefault(topic, {})[text] = answer["id"]
        self.save_entries(entries)
        return answer

    def forget_entry(self, topic: str, old_text: str, still_there: set[str]) -> dict | None:
        """Forget the facts written for entries holding old_text that left the file (run by the worker)."""
        assert self.strict is not None, "forgotten before initialize"
        entries = self.entries()
        written = entries.get(topic, {})
        gone = [text for text in written if old_text in text and text not in still_there]
        if not gone:
            LOG.warning("solos: no fact written for the %s entry matching %r; nothing to forget", topic, old_text[:80])
            return None
        answer = None
        for text in gone:
            try:
                answer = self.strict.forget("long", written[text])
            except solos_client.Rejected as error:
                if error.status != 404:  # 404: already forgotten (a retried job, or by hand)
                    raise
            del written[text]
            self.save_entries(entries)
        return answer

    def entries(self) -> dict[str, dict[str, int]]:
        path = self.hermes_home / ENTRIES_FILE
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}

    def save_entries(self, entries: dict[str, dict[str, int]]) -> None:
        path = self.hermes_home / ENTRIES_FILE
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(entries, ensure_ascii=False), encoding="utf-8")
        temporary.replace(path)

    def submit(self, what: str, job: Any) -> None:
        """Hand a job to the worker without waiting; a full queue drops it and counts the drop."""
        self.ensure_worker()
        try:
            self.jobs.put_nowait((what, job))
        except queue.Full:
            self.count("dropped")
            LOG.warning(
                "solos: queue full (%d); dropped a %s (%d dropped so far)", QUEUE_SIZE, what, self.counts["dropped"]
            )
            return
        self.count("queued")

    def ensure_worker(self) -> None:
        """Start the worker, or restart it if it died."""
        with self.worker_lock:
            if self.worker is not None and self.worker.is_alive():
                return
            if self.worker is not None:
                self.count("worker_restarts")
                LOG.warning("solos: the write worker had died; restarted it")
            self.worker = threading.Thread(target=self.work, name="solos-memory-writer", daemon=True)
            self.worker.start()

    def work(self) -> None:
        """Run queued jobs in order; a failed write is logged and counted, never raised into Hermes."""
        while True:
            what, job = self.jobs.get()
            if job is None:
                return
            try:
                answer = job()
            except solos_client.SolosError as error:
                self.count("failed")
                LOG.warning("solos: %s not recorded: %s: %s", what, error.code, error)
            except Exception:
                self.count("failed")
                LOG.exception("solos: %s not recorded", what)
            else:
                if isinstance(answer, dict):  # a write the service answered; flushes and the spool drain return None
                    self.count("written")

    def count(self, name: str) -> None:
        with self.counts_lock:
            self.counts[name] += 1

    def flush(self, timeout: float = SHUTDOWN_WAIT_S) -> bool:
        """Wait until the queue is empty and the worker idle; True if it got there in time."""
        done = threading.Event()
        self.ensure_worker()
        try:
            self.jobs.put(("flush", done.set), timeout=timeout)
        except queue.Full:
            return False
        return done.wait(timeout)

    def shutdown(self) -> None:
        """Let the worker finish what is queued, for at most SHUTDOWN_WAIT_S."""
        worker = self.worker
        if worker is None or not worker.is_alive():
            return
        try:
            self.jobs.put(("stop", None), timeout=SHUTDOWN_WAIT_S)
        except queue.Full:
            LOG.warning("solos: shutting down with %d writes still queued", self.jobs.qsize())
            return
        worker.join(SHUTDOWN_WAIT_S)

    # -- before compaction: the one fail-closed path ---------------------------

    def on_pre_compress(self, messages: list[dict[str, Any]]) -> str:
        """Archive the transcript before Hermes compacts it; raise ArchiveFailed if it is not committed."""
        if self.strict is None:
            raise ArchiveFailed("solos provider not initialized; transcript not archived")
        content = json.dumps(messages, ensure_ascii=False, sort_keys=True, default=str)
        try:
            digest = archive(self.strict, self.agent, content, self.session_id, len(messages))
        except Exception as error:  # whatever failed, the transcript must reach the spool before Hermes compacts
            try:
                spooled: Path | str = self.spool(content)
            except OSError as spool_error:
                spooled = f"nowhere ({spool_error})"
            reason = getattr(error, "code", type(error).__name__)
            failure = f"transcript ({len(messages)} messages) not archived: {reason}: {error}; spooled to {spooled}"
            # Hermes 0.19.0 logs a raising on_pre_compress at DEBUG only, then compacts anyway: say it here.
            LOG.error("solos: %s", failure)
            raise ArchiveFailed(failure) from error
        self.count("archived")
        return (
            f"The full transcript before this compaction is archived in solos-memory as agent '{self.agent}' "
            f"(episodic, event_type {ARCHIVE_EVENT}, sha256 {digest[:16]})."
        )

    def spool(self, content: str) -> Path:
        """Keep a transcript the service did not take, on disk (fsynced), for drain_spool to send later."""
        folder = self.hermes_home / SPOOL_DIR
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        folder.chmod(0o700)  # the agent's own memory: its user's alone (a folder an older version made was 755)
        target = folder / f"{salted_digest(self.agent, content)}.json"
        temporary = target.with_suffix(".tmp")
        temporary.unlink(missing_ok=True)  # a leftover keeps its mode through O_CREAT: made anew, 600
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with open(descriptor, "w", encoding="utf-8") as handle:
            json.dump({"agent": self.agent, "session_id": self.session_id, "content": content}, handle)
            handle.flush()
            os.fsync(handle.fileno())
        temporary.replace(target)
        return target

    def spooled(self) -> list[Path]:
        return sorted((self.hermes_home / SPOOL_DIR).glob("*.json"))

    def drain_spool(self) -> None:
        """Archive spooled transcripts, in name order; each file is removed once its archive is committed."""
        assert self.strict is not None, "drained before initialize"
        for path in self.spooled():
            record = json.loads(path.read_text(encoding="utf-8"))
            count = len(json.loads(record["content"]))
            archive(self.strict, record["agent"], record["content"], record["session_id"], count)
            path.unlink()
            self.count("archived")

    # -- tools for the model ---------------------------------------------------

    def get_tool_schemas(self) -> list[dict[str, Any]]:
        return [RECALL_TOOL, REMEMBER_TOOL]

    def handle_tool_call(self, tool_name: str, args: dict[str, Any], **kwargs: Any) -> str:
        """Run solos_recall (its rows, whether the service says it is degraded and why, how many rows were left
        out by size, its receipt; empty on failure, with the reason) or solos_remember (an error the model can read)."""
        from tools.registry import tool_error

        if self.soft is None or self.strict is None:
            return tool_error("solos memory is not initialized")
        if tool_name == RECALL_TOOL["name"]:
            k = 5 if args.get("k") is None else args["k"]  # k=0 goes to the service, which names the field
            answer = self.soft.recall(str(args.get("query") or ""), k=k, scope=args.get("scope") or "shared")
            # What the answer means; the receipt says who judged the rows and which words the keyword leg left out.
            told = ("results", "count", "degraded", "degraded_reason", "truncated", "receipt", "error")
            return json.dumps({key: answer[key] for key in told if key in answer})
        if tool_name == REMEMBER_TOOL["name"]:
            try:
                return json.dumps(self.strict.remember(str(args.get("fact") or ""), topic=args.get("topic")))
            except solos_client.SolosError as error:
                return tool_error(f"not remembered: {error}", field=error.field)
        return tool_error(f"solos has no tool {tool_name!r}")

    # -- setup and backup ------------------------------------------------------

    def get_config_schema(self) -> list[dict[str, Any]]:
        return [
            {"key": "url", "description": "solos-memory service URL", "default": solos_client.DEFAULT_URL},
            {"key": "agent", "description": "agent name registered in the service (default: the profile name)"},
            {
                "key": "token",
                "description": "this agent's bearer token, when the service has a tokens file",
                "secret": True,
                "env_var": "SOLOS_MEMORY_TOKEN",
            },
            {"key": "token_file", "description": "or: a file holding the token"},
            {"key": "recall_k", "description": "rows recalled before each turn", "default": str(DEFAULT_RECALL_K)},
        ]

    def save_config(self, values: dict[str, Any], hermes_home: str) -> None:
        """Write the non-secret settings under plugins.solos in config.yaml."""
        import yaml

        path = Path(hermes_home) / "config.yaml"
        config = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}) if path.exists() else {}
        config.setdefault("plugins", {})[PROVIDER_NAME] = {k: v for k, v in values.items() if k != "token"}
        path.write_text(yaml.safe_dump(config, default_flow_style=False), encoding="utf-8")

    def backup_paths(self) -> list[str]:
        """The token file, when it lives outside HERMES_HOME (the spool is inside, so backed up already)."""
        token_file = self.settings()["token_file"]
        if not token_file:
            return []
        path = Path(token_file).expanduser().resolve()
        home = Path(os.environ.get("HERMES_HOME") or self.hermes_home).expanduser().resolve()
        return [] if home in path.parents else [str(path)]


def check_recall_k(value: Any) -> int:
    """plugins.solos.recall_k as an integer 1-100; Hermes logs the ValueError as a failed initialize."""
    if value in (None, ""):
        return DEFAULT_RECALL_K
    try:
        k = int(value)
    except (TypeError, ValueError):
        k = 0
    if not 1 <= k <= 100 or str(value).strip() != str(k):
        raise ValueError(f"plugins.{PROVIDER_NAME}.recall_k must be an integer 1-100, got {value!r}")
    return k


def entries_on_disk(target: str) -> set[str]:
    """The entries of Hermes's MEMORY.md or USER.md as they are now (empty if Hermes's store cannot be read)."""
    try:
        from tools.memory_tool import MemoryStore

        return set(MemoryStore._read_file(MemoryStore._path_for(target)))
    except Exception as error:  # a later Hermes may move it: then every entry matching old_text counts as gone
        LOG.warning("solos: cannot read Hermes's %s entries: %s", target, error)
        return set()


def salted_digest(agent: str, content: str) -> str:
    """sha256 of the transcript salted with the agent's name: the archive's key."""
    return hashlib.sha256(f"{agent}\0{content}".encode()).hexdigest()


def archive(client: solos_client.Client, agent: str, content: str, session_id: str, count: int) -> str:
    """Write a transcript as episodic parts of at most DETAILS_CHARS; return its digest. Raises on any failure.

    Every part's key derives from the digest, so a retry after a partial failure
    finds the parts already written (`unchanged`) and adds only the missing ones.
    """
    digest = salted_digest(agent, content)
    size = solos_client.DETAILS_CHARS
    parts = [content[start : start + size] for start in range(0, len(content), size)] or [""]
    deadline = time.monotonic() + ARCHIVE_TIMEOUT_S
    for number, part in enumerate(parts, 1):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise solos_client.Unavailable(
                f"archive took over {ARCHIVE_TIMEOUT_S} s; {number - 1}/{len(parts)} parts written"
            )
        client.event(
            ARCHIVE_EVENT,
            f"Transcript of session {session_id or '?'} ({count} messages) before compaction, "
            f"part {number}/{len(parts)}, sha256 {digest[:16]}",
            agent=agent,
            details=part,
            outcome="archived",
            idempotency_key=f"archive-{digest[:48]}-{number}of{len(parts)}",
            timeout=remaining,
        )
    return digest


RECALL_TOOL = {
    "name": "solos_recall",
    "description": (
        "Recall from the fleet's shared memory. Each row names the agent that wrote it; foreign=true means "
        "another agent wrote it. degraded=true (degraded_reason says why) means it ranked without part of its "
        "models; truncated says how many rows were left out by size; receipt.judge says who set each row's "
        "relevance. Returns an empty list (with an error) when "
        "the memory service is unreachable."
    ),
    "parameters": {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "What to look for, in plain words."},
            "k": {"type": "integer", "minimum": 1, "maximum": 100, "description": "How many rows (default 5)."},
            "scope": {
                "type": "string",
                "enum": ["own", "shared", "shared_except_self"],
                "description": "Whose rows: own, shared (everyone's, default) or shared_except_self.",
            },
        },
        "required": ["query"],
    },
}

REMEMBER_TOOL = {
    "name": "solos_remember",
    "description": "Write one long-term fact to the fleet's shared memory, attributed to you; other agents recall it.",
    "parameters": {
        "type": "object",
        "properties": {
            "fact": {"type": "string", "description": "The fact, one statement."},
            "topic": {"type": "string", "description": "What it is about."},
        },
        "required": ["fact"],
    },
}


def register(ctx: Any) -> None:
    """Hermes's plugin entry point."""
    ctx.register_memory_provider(SolosMemoryProvider())
