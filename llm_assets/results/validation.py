"""From a spec's output schema to the pydantic model each result is parsed with."""

import dataclasses
import functools
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from llm_assets.spec.model import FieldSpec, OutputSpec, PipelineSpec
from llm_assets.util.fastjson import json_loads

_PY_TYPES: dict[str, Any] = {
    "str": str,
    "int": int,
    "float": float,
    "bool": bool,
    "list[str]": list[str],
    "list[float]": list[float],
}
_BOUNDS = ("min_length", "max_length", "ge", "le", "gt", "lt")


def _annotation(field: FieldSpec) -> Any:
    if field.isin is not None:
        return Literal[tuple(field.isin)]
    return _PY_TYPES[field.type]


def _field_info(field: FieldSpec) -> Any:
    """The pydantic Field of an output field: its description and its bounds, which FieldSpec
    names as pydantic does."""
    bounds = {name: getattr(field, name) for name in _BOUNDS}
    return Field(description=field.description or None, **bounds)


@functools.cache
def _output_model(output_json: str, name: str) -> type[BaseModel]:
    output = OutputSpec.model_validate_json(output_json)
    fields: dict[str, Any] = {}
    for field_name, field in output.output_schema.items():
        annotation = _annotation(field)
        if field.nullable:
            annotation = annotation | None
        fields[field_name] = (annotation, _field_info(field))
    return create_model(
        f"{name}_output",
        __config__=ConfigDict(extra="forbid", strict=False),
        **fields,
    )


@functools.cache
def _output_json_schema(output_json: str, name: str) -> dict[str, Any]:
    return _output_model(output_json, name).model_json_schema()


_serialized: dict[str, tuple[OutputSpec, str]] = {}


def _output_key(spec: PipelineSpec) -> tuple[str, str]:
    """The cache key of a spec's output section: its JSON, serialized once per spec object
    (these are asked for every item; specs are frozen, so the same object, the same JSON)."""
    seen = _serialized.get(spec.name)
    if seen is None or seen[0] is not spec.output:
        seen = (spec.output, spec.output.model_dump_json(by_alias=True))
        _serialized[spec.name] = seen
    return seen[1], spec.name


def output_model(spec: PipelineSpec) -> type[BaseModel]:
    """The pydantic model of one JSON output; built once per output section."""
    return _output_model(*_output_key(spec))


def output_json_schema(spec: PipelineSpec) -> dict[str, Any]:
    """JSON Schema sent to providers that accept structured output (shared: do not modify)."""
    return _output_json_schema(*_output_key(spec))


def chat_response_format(spec: PipelineSpec) -> dict[str, Any]:
    """The chat-completions `response_format` that asks for the spec's JSON schema."""
    return {
        "type": "json_schema",
        "json_schema": {"name": spec.name, "schema": output_json_schema(spec), "strict": True},
    }


@dataclasses.dataclass(slots=True)
class ParsedOutput:
    """A plain dataclass: validation makes one per result, and a pydantic model costs more to
    build than the output's own validation."""

    ok: bool
    value: dict[str, Any] | None = None
    rule: str | None = None
    message: str | None = None


SHOWN_CHARS = 60
"""How much of an offending value a dead-letter message quotes."""


def describe_value(value: Any, *, length_rule: bool = False) -> str:
    """The offending value as a failure message shows it: its length for a length rule
    ("length 412"), else the value, cut to SHOWN_CHARS with its full length when longer."""
    if length_rule and isinstance(value, str | list | tuple | dict):
        return f"length {len(value)}"
    text = value if isinstance(value, str) else str(value)
    if len(text) <= SHOWN_CHARS:
        return repr(text) if isinstance(value, str) else text
    return f"{text[:SHOWN_CHARS]!r}… ({len(text)} chars)"


_LENGTH_ERRORS = ("string_too_short", "string_too_long", "too_short", "too_long")


def parse_output(spec: PipelineSpec, text: str | None, finish_reason: str | None) -> ParsedOutput:
    """Parse one result's text; a failure names the rule it broke and the offending value."""
    if finish_reason == "length":
        return ParsedOutput(ok=False, rule="truncated", message="output stopped at max tokens")
    if text is None or not text.strip():
        return ParsedOutput(ok=False, rule="empty_output", message="the model returned no text")
    if spec.output.format == "text":
        field = spec.output.output_schema.get("text")
        if field is not None:
            if field.min_length is not None and len(text) < field.min_length:
                return ParsedOutput(
                    ok=False, rule="text.min_length", message=f"{len(text)} < {field.min_length}"
                )
            if field.max_length is not None and len(text) > field.max_length:
                return ParsedOutput(
                    ok=False, rule="text.max_length", message=f"{len(text)} > {field.max_length}"
                )
        return ParsedOutput(ok=True, value={"text": text})
    try:
        raw = json_loads(text)
    except json.JSONDecodeError as exc:
        return ParsedOutput(ok=False, rule="invalid_json", message=f"{exc}: {describe_value(text)}")
    try:
        value = output_model(spec).model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "-"
        return ParsedOutput(
            ok=False,
            rule=f"{where}.{first['type']}",
            message=f"{first['msg']}; got "
            + describe_value(first.get("input"), length_rule=first["type"] in _LENGTH_ERRORS),
        )
    # The fields are flat (strings, numbers, booleans, lists of them): the validated values
    # are the output, without model_dump's serializer (as long as the validation itself).
    return ParsedOutput(ok=True, value=dict(value.__dict__))
