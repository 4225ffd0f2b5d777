"""solos_langgraph: the LangGraph node's store_memory, the fleet's one writer of long facts, over REST.

The LangGraph node `store_memory` used to write straight into the Qdrant
collection `long_term`, keyed by `uuid5(NAMESPACE_URL, f"{agent_id}:{topic}:{content[:100]}")`
with the text cut to 2,000 characters. Its body becomes one call:

    from solos_langgraph import store_memory

    def store_memory_node(agent_id, topic, content, memory_scope="shared", importance_score=0.5):
        return store_memory(agent_id, topic, content, memory_scope, importance_score)

The service stores the fact in solos.db and, when it mirrors to Qdrant,
writes the point under `point_id(agent, "long", content)`: uuid5 of
`agent:tier:sha256(full text)`, never truncated. Standard library only; it
never imports the service. The URL and token come from the arguments, else
SOLOS_MEMORY_URL / SOLOS_MEMORY_TOKEN, else http://127.0.0.1:8437 and none.
Like solos_client, it never goes through a proxy (http_proxy and the like
are ignored): the fact and the token go to the service and nowhere else.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import urllib.error
import urllib.request
import uuid

DEFAULT_URL = "http://127.0.0.1:8437"
SOURCE = "store_memory"
TIMEOUT_S = 10.0
# urlopen's default opener follows http_proxy even to 127.0.0.1; this one has no proxy at all.
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
# The node's scope for its agent's own memory. The service keeps no private long facts (every agent reads them);
# import-qdrant leaves such points out for the same reason.
PRIVATE_SCOPE = "private"


class StoreMemoryError(Exception):
    """The service refused the write, could not be reached, or something else answered (a proxy's page): the
    message says which (the service's own words where it answered)."""

    def __init__(self, message: str, status: int | None = None, field: str | None = None):
        super().__init__(message)
        self.status, self.field = status, field


def point_id(agent: str, tier: str, text: str) -> str:
    """The Qdrant point id of a memory: uuid5 of agent:tier:sha256(full text). Two texts never share one."""
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"{agent}:{tier}:{digest}"))


def legacy_point_id(agent_id: str, topic: str, content: str) -> str:
    """The id the old node derived: facts sharing their first 100 characters collide. For migration only."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"{agent_id}:{topic}:{content[:100]}"))


def store_memory(
    agent_id: str,
    topic: str,
    content: str,
    memory_scope: str = "shared",
    importance_score: float = 0.5,
    *,
    url: str | None = None,
    token: str | None = None,
    timeout: float = TIMEOUT_S,
) -> str:
    """Write one long-term fact for agent_id through POST /v1/long; return its point id.

    Arguments as the LangGraph node took them: importance_score (0-1) becomes
    the fact's confidence, memory_scope a `scope:<value>` tag. Nothing is
    truncated: a fact over the service's limit is refused (StoreMemoryError,
    status 400), never cut. Writing the same fact again updates one row.
    memory_scope "private" is refused (StoreMemoryError, field memory_scope),
    nothing sent: a long fact is read by every agent.
    """
    if isinstance(memory_scope, str) and memory_scope.strip().casefold() == PRIVATE_SCOPE:  # `Private` too
        raise StoreMemoryError(
            "memory_scope 'private' cannot be kept as a long fact: every agent reads long facts; "
            "write the agent's own memory as an episode (POST /v1/episodic), private unless it shares episodes",
            field="memory_scope",
        )
    body = {
        "agent": agent_id,
        "topic": topic,
        "fact": content,
        "source": SOURCE,
        "confidence": importance_score,
        "tags": [f"scope:{memory_scope}"],
    }
    base = (url or os.environ.get("SOLOS_MEMORY_URL") or DEFAULT_URL).rstrip("/")
    headers = {"Content-Type": "application/json"}
    token = (token or os.environ.get("SOLOS_MEMORY_TOKEN") or "").strip()  # a CRLF environment file's "\r" too
    if token and not all("!" <= char <= "~" for char in token):  # http.client's refusal would quote it
        raise StoreMemoryError(
            "the token holds a space, a control character or a non-ASCII one, which an HTTP header cannot carry; "
            "check SOLOS_MEMORY_TOKEN against what `solos-memory token` printed",
            field="token",
        )
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(base + "/v1/long", json.dumps(body).encode(), headers, method="POST")
    try:
        with DIRECT.open(request, timeout=timeout) as response:
            writer = json.loads(response.read())["agent"]
        if not isinstance(writer, str):
            raise TypeError("agent is not a string")
    except urllib.error.HTTPError as error:
        raise refusal(error) from None
    except (urllib.error.URLError, OSError) as error:
        raise StoreMemoryError(f"solos-memory at {base} is unreachable: {error}") from None
    except (http.client.HTTPException, ValueError, LookupError, TypeError) as error:  # a proxy's page, another server
        raise StoreMemoryError(
            f"{base} answered with something that is not the service's JSON ({type(error).__name__}: {error}); "
            "the fact may not be stored"
        ) from None
    return point_id(writer, "long", content)


def refusal(error: urllib.error.HTTPError) -> StoreMemoryError:
    """The service's error JSON as an exception naming the field."""
    try:
        detail = json.loads(error.read())["error"]
        return StoreMemoryError(detail["message"], error.code, detail.get("field"))
    except (ValueError, KeyError, TypeError):
        return StoreMemoryError(f"solos-memory answered HTTP {error.code}", error.code)
