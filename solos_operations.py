"""solos_operations: what an operation row is, and the schema pieces rows share.

Each capability module declares its rows one way: `OPERATION_ROWS`, a tuple of `Operation(...)` literals beside
its operations (the spine's own operations too; tests/test_shape.py checks it). The spine assembles them with
`table`; REST routes, MCP tools, `/openapi.json` and the README's API table come from that table. Imports only
the validation rules; never the spine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from solos_validation import NO_NUL


@dataclass(frozen=True)
class Operation:
    """One capability: a REST route and an MCP tool over the same function and schema."""

    name: str
    method: str
    path: str
    function: Callable[[Any, dict], dict]  # (memory, args) -> answer
    input_schema: dict
    output_schema: dict
    writes: bool
    idempotent: bool
    destructive: bool = False
    title: str = ""
    operator: bool = False  # the operator token may call it (an agent's token always may)

    @property
    def description(self) -> str:
        return " ".join((self.function.__doc__ or "").split())


def object_schema(properties: dict, required: tuple[str, ...] = ("agent",)) -> dict:
    return {"type": "object", "properties": properties, "required": list(required), "additionalProperties": False}


def result_schema(properties: dict) -> dict:
    """An output schema: these fields always present, more may follow."""
    return {"type": "object", "properties": properties, "required": list(properties)}


NULLABLE_STRING = {"type": ["string", "null"]}


def text_field(description: str, max_length: int, min_length: int = 0) -> dict:
    """A stored text field's schema: a string without NUL, of bounded length."""
    bounds = {"minLength": min_length} if min_length else {}
    return {"type": "string", "pattern": NO_NUL, **bounds, "maxLength": max_length, "description": description}


WRITE_OUTPUT = result_schema(
    {
        "tier": {"type": "string", "enum": ["short", "long", "episodic"]},
        "agent": {"type": "string"},
        "id": {"type": "integer"},
        "status": {
            "type": "string",
            "enum": ["created", "updated", "unchanged", "deleted"],
            "description": "What the write did; REST answers 201 for created, else 200.",
        },
    }
)


def table(*groups: Sequence[Operation]) -> dict[str, Operation]:
    """The operation table: every group's rows by name, in order; a name declared twice stops the start."""
    rows = [row for group in groups for row in group]
    names = [row.name for row in rows]
    if len(set(names)) != len(names):
        raise ValueError(f"operations declared twice: {sorted({name for name in names if names.count(name) > 1})}")
    return {row.name: row for row in rows}
