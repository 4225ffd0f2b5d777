"""solos_telemetry: what the service counts and says about itself.

Stats (calls, rejections and their latest reasons, recall hits, requests and
their latency by route), the Prometheus exposition of them with the database's
counts (`/metrics`), and the OpenAPI document generated from the operation
table (`/openapi.json`). Counts only, never memory text. Imports the store,
never the spine.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import solos_jobs
import solos_qdrant
from solos_store import ServiceError, log_event, utc_now
from solos_validation import describe

# ==== Counters ====

LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


@dataclass
class Stats:
    """Counters since start; /v1/stats shows them so a green 200 is never mistaken for working recall."""

    started: float = field(default_factory=time.time)
    lock: threading.Lock = field(default_factory=threading.Lock)
    calls: Counter = field(default_factory=Counter)
    rejections: Counter = field(default_factory=Counter)
    busy_reasons: Counter = field(default_factory=Counter)  # the 503 busy refusals by Busy.reason; "locked": none
    recall_hits: Counter = field(default_factory=Counter)
    recall_empty: int = 0
    duplicates_suppressed: int = 0
    recent_rejections: list = field(default_factory=list)
    requests: Counter = field(default_factory=Counter)  # (route, method, status) -> count
    latency: dict = field(default_factory=dict)  # route -> [count per LATENCY_BUCKETS_S bucket..., +Inf, sum]
    load: Callable[[], dict] | None = None  # the server's in-flight requests and queueing (solos_connections)

    def observe(self, route: str, method: str, status: int, seconds: float) -> None:
        """Count one answered request and its latency, for /metrics."""
        with self.lock:
            self.requests[(route, method, status)] += 1
            buckets = self.latency.setdefault(route, [0] * (len(LATENCY_BUCKETS_S) + 1) + [0.0])
            buckets[bisect.bisect_left(LATENCY_BUCKETS_S, seconds)] += 1
            buckets[-1] += seconds

    def count(self, counter: str, key: str, amount: int = 1) -> None:
        with self.lock:
            getattr(self, counter)[key] += amount

    def reject(self, agent: str | None, operation: str, error: ServiceError, claimed: Any = None) -> None:
        """Log and count a refused call: the caller (its token's holder when tokens are on), operation, reason."""
        record = {"agent": agent, "operation": operation, "code": error.code, "reason": error.message}
        if claimed is not None and claimed != agent:
            record["claimed_agent"] = describe(claimed)
        error.counted = True
        log_event("rejected", **record)
        with self.lock:
            self.rejections[error.code] += 1
            if error.code == "busy":  # the store's lock waits give no reason; the queue, a stop and the caps do
                self.busy_reasons[error.reason or "locked"] += 1
            self.recent_rejections = [{"ts": utc_now(), **record}, *self.recent_rejections[:19]]

    def record_recall(self, results: list[dict], suppressed: int) -> None:
        """One recall's rows per tier, whether it found nothing, and the duplicates it collapsed."""
        with self.lock:
            self.duplicates_suppressed += suppressed
            self.recall_hits.update(r["tier"] for r in results)
            self.recall_empty += not results

    def snapshot(self) -> dict:
        load = self.load() if self.load else {}
        with self.lock:
            return {
                "load": load,
                "uptime_s": round(time.time() - self.started, 1),
                "calls": dict(self.calls),
                "rejections": dict(self.rejections),
                "busy_reasons": dict(self.busy_reasons),
                "recent_rejections": list(self.recent_rejections),
                "recall_hits": dict(self.recall_hits),
                "recall_empty": self.recall_empty,
                "duplicates_suppressed": self.duplicates_suppressed,
                "answered_503": sum(n for (_, _, status), n in self.requests.items() if status == 503),
            }


# ==== Documents ====


def openapi_document(operations: Mapping[str, Any], version: str, error_schema: dict) -> dict:
    """OpenAPI 3.1 for /v1, generated from the operation table so it cannot drift."""
    paths: dict[str, dict] = {
        "/health": {
            "get": {
                "operationId": "health",
                "summary": "Liveness, auth mode and degraded state",
                "responses": {
                    "200": {"description": "Up", "content": {"application/json": {"schema": {"type": "object"}}}}
                },
            }
        }
    }
    errors = {
        str(status): {"description": phrase, "content": {"application/json": {"schema": error_schema}}}
        for status, phrase in (
            (400, "A field is missing or invalid; the error names it"),
            (401, "Tokens are enabled and the token is missing or unknown"),
            (403, "Not allowed for this agent"),
            (404, "No such row"),
            (409, "Idempotency key reused for another event"),
            (413, "Body over the size cap"),
            (415, "Body is not application/json"),
            (422, "The agent is not registered"),
            (503, "Database locked past the retry budget; see Retry-After"),
        )
    }
    for op in operations.values():
        spec: dict[str, Any] = {
            "operationId": op.name,
            "summary": op.title,
            "description": op.description,
            "responses": {
                "200": {"description": "OK", "content": {"application/json": {"schema": op.output_schema}}},
                **errors,
            },
        }
        if op.name == "read_events":
            spec["responses"]["200"]["content"]["text/event-stream"] = {"schema": {"type": "string"}}
        if op.writes and op.method == "POST":
            spec["responses"]["201"] = {
                "description": "Created",
                "content": {"application/json": {"schema": op.output_schema}},
            }
        if op.method in ("GET", "DELETE"):
            spec["parameters"] = [
                {
                    "name": name,
                    "in": "query",
                    "required": name in op.input_schema["required"],
                    "schema": schema,
                    **({"style": "form", "explode": False} if schema["type"] == "array" else {}),
                }
                for name, schema in op.input_schema["properties"].items()
            ]
        else:
            spec["requestBody"] = {"required": True, "content": {"application/json": {"schema": op.input_schema}}}
        paths.setdefault(op.path, {})[op.method.lower()] = spec
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "solos-memory",
            "version": version,
            "description": "Shared, attributed memory for an agent fleet. MCP is served at /mcp.",
        },
        "servers": [{"url": "/"}],
        "paths": paths,
    }


def label(value: Any) -> str:
    """A Prometheus label value, escaped per the text exposition format (backslash, quote, newline)."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def metrics_text(memory: Any) -> bytes:
    """Prometheus text exposition: which copy, requests, latency, rejections, degraded state, rows per tier.

    The counters are this copy's; rows, jobs and the mirror are the database's, the same from every copy."""
    stats, lines = memory.stats, []

    def family(name: str, kind: str, help_text: str) -> None:
        lines.extend([f"# HELP solos_memory_{name} {help_text}", f"# TYPE solos_memory_{name} {kind}"])

    rows = memory.store.counts()["rows"]
    with stats.lock:
        requests, latency = dict(stats.requests), {k: list(v) for k, v in stats.latency.items()}
        rejections, hits = dict(stats.rejections), dict(stats.recall_hits)
        suppressed = stats.duplicates_suppressed
    family("copy_info", "gauge", "Which copy of the service (and which of its workers) answered.")
    serving = memory.serving  # under `serve --workers N`: which worker's counters these are
    worker = f',worker="{int(serving["worker"])}",workers="{int(serving["workers"])}"' if serving.get("workers") else ""
    lines.append(f'solos_memory_copy_info{{copy="{label(memory.copy)}"{worker}}} 1')
    family("requests_total", "counter", "HTTP requests answered, by route, method and status.")
    for (route, method, status), count in sorted(requests.items()):
        lines.append(
            f'solos_memory_requests_total{{route="{label(route)}",method="{label(method)}",status="{status}"}} {count}'
        )
    family("request_duration_seconds", "histogram", "Time from request line to response written.")
    for route, buckets in sorted(latency.items()):
        cumulative = 0
        for bound, count in zip((*LATENCY_BUCKETS_S, "+Inf"), buckets[:-1]):
            cumulative += count
            lines.append(
                f'solos_memory_request_duration_seconds_bucket{{route="{label(route)}",le="{bound}"}} {cumulative}'
            )
        lines.append(f'solos_memory_request_duration_seconds_sum{{route="{label(route)}"}} {buckets[-1]:.6f}')
        lines.append(f'solos_memory_request_duration_seconds_count{{route="{label(route)}"}} {cumulative}')
    family("rejections_total", "counter", "Refused calls by reason (error code).")
    for reason, count in sorted(rejections.items()):
        lines.append(f'solos_memory_rejections_total{{reason="{label(reason)}"}} {count}')
    family("recall_hits_total", "counter", "Rows returned by recall, by tier.")
    for tier, count in sorted(hits.items()):
        lines.append(f'solos_memory_recall_hits_total{{tier="{label(tier)}"}} {count}')
    family("duplicates_suppressed_total", "counter", "Identical texts collapsed out of recall results.")
    lines.append(f"solos_memory_duplicates_suppressed_total {suppressed}")
    family("degraded", "gauge", "1 while recall is not full hybrid (no embedder, or rows without vectors).")
    lines.append(f"solos_memory_degraded {int(memory.embedder_state()['degraded'])}")
    judge = memory.judge.state()
    family("judge_unavailable", "gauge", "1 while the judge's file cannot be used: relevance is the reranker's.")
    lines.append(f"solos_memory_judge_unavailable {int(judge['state'] == 'unavailable')}")
    family("cross_encoder_unavailable", "gauge", "1 while hybrid recall's cross-encoder cannot load: features only.")
    lines.append(f"solos_memory_cross_encoder_unavailable {int(judge['cross_encoder'] == 'unavailable')}")
    family("cross_encoder_failing", "gauge", "1 while most of the cross-encoder's recent runs fell back.")
    lines.append(f"solos_memory_cross_encoder_failing {int(judge['cross_encoder'] == 'failing')}")
    family("cross_encoder_runs_total", "counter", "The cross-encoder's runs by outcome (this process's).")
    for outcome, count in judge["cross_encoder_runs"].items():
        lines.append(f'solos_memory_cross_encoder_runs_total{{outcome="{outcome}"}} {count}')
    family("storage_failing", "gauge", "1 for a minute after a storage failure (full disk, lost server).")
    lines.append(f"solos_memory_storage_failing {int(memory.store.storage_state()['state'] == 'failing')}")
    family("rows", "gauge", "Rows per tier (short: live only).")
    for tier, count in rows.items():
        lines.append(f'solos_memory_rows{{tier="{label(tier)}"}} {count}')
    streams = memory.events.stats()
    family("event_streams", "gauge", "Open event streams.")
    lines.append(f"solos_memory_event_streams {streams['open']}")
    family("event_cache_bytes", "gauge", "Encoded events kept for the streams (bounded by bytes).")
    lines.append(f"solos_memory_event_cache_bytes {streams['cache_bytes']}")
    lines.extend(solos_qdrant.metrics_lines(solos_qdrant.mirror_status(memory.store, memory.mirror)))
    lines.extend(
        solos_jobs.metrics_lines(memory.store.read(lambda conn: solos_jobs.status(memory.store.queries, conn)))
    )
    return ("\n".join(lines) + "\n").encode()
