"""The base of every request body: unknown fields are ignored (clients send extras), values are taken strictly
(no booleans as numbers, no strings as booleans). Strings that are not UTF-8 text (JSON's lone surrogate escapes)
are refused where the body is parsed (bodies.parse_json), before any schema sees them."""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field


class RequestBody(BaseModel):
    # strict: `true` is not the number 1 and "yes" is not a boolean; JSON numbers still fill float fields
    model_config = ConfigDict(extra="ignore", strict=True)


T = TypeVar("T")


def _non_empty(schema: dict[str, Any]) -> None:
    schema["minItems"] = 1


NonEmpty = Annotated[list[T], Field(json_schema_extra=_non_empty)]
"""A list the route refuses when empty (common.check_items, with its own message): documented as minItems 1, so
the OpenAPI document says what the server does."""


AutoTruncate = Annotated[bool | None, AfterValidator(lambda value: True if value is None else value)]
"""TEI's `truncate`: unset or null cuts at the model's limit (TEI's --auto-truncate, on by default since 1.9, and what
/info reports); only `false` makes an over-long input a 400."""


HybridWeights = Annotated[dict[str, float] | None, Field(
    description="encoderrt extension: a hybrid (bge-m3) model's weights of its dense, sparse and colbert scores, in "
                "place of its own (0.4, 0.2, 0.4; one left out weighs 0); the score is their weighted mean")]


def requires_one_of(*groups: tuple[str, ...]) -> dict[str, Any]:
    """OpenAPI for a rule a route checks in code: one of these groups of fields is given, each not null."""
    return {"anyOf": [{"required": list(group), "properties": {name: {"not": {"type": "null"}} for name in group}}
                      for group in groups]}
