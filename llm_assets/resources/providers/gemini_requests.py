"""Gemini Batch Mode request lines and what a spec may ask of them.

A shard is a JSONL file of `{"key": custom_id, "request": GenerateContentRequest}` (an
EmbedContentRequest when the spec's output is one embedding). JSON outputs ask for the
spec's schema through `responseMimeType: application/json` and `responseSchema`, the
OpenAPI subset Gemini reads: our JSON Schema with `$ref`s resolved, types in capitals,
`anyOf [T, null]` as `nullable`, and what the subset lacks (additionalProperties, titles)
left out.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llm_assets.resources.providers.base import RequestItem
    from llm_assets.spec.model import PipelineSpec

MAX_REQUESTS = 200_000
"""Requests per batch job."""
MAX_BYTES = 2 * 1024**3
"""The Files API's limit per file, and so per batch input file."""
OPTIONS = {
    "top_p": "topP",
    "top_k": "topK",
    "stop_sequences": "stopSequences",
    "seed": "seed",
}
"""`model.options` and the generationConfig field each becomes (thinking_budget aside)."""
_SCHEMA_KEYS = (
    "description",
    "enum",
    "format",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "required",
)


def is_embedding(spec: "PipelineSpec") -> bool:
    """Whether the spec's output is one embedding: then its shards are embeddings batches."""
    fields = spec.output.output_schema
    return spec.output.format == "json" and list(fields) == ["embedding"]


def gemini_spec_problems(spec: "PipelineSpec") -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    unknown = set(spec.model.options) - set(OPTIONS) - {"thinking_budget"}
    if unknown:
        problems.append(("model.options", f"unknown option(s) for gemini: {sorted(unknown)}"))
    if spec.model.name.startswith("models/"):
        problems.append(("model.name", "name the model without 'models/', e.g. gemini-2.5-flash"))
    if spec.sharding.max_requests_per_shard > MAX_REQUESTS:
        problems.append(
            (
                "sharding.max_requests_per_shard",
                f"Gemini takes at most {MAX_REQUESTS} requests per batch job",
            )
        )
    if spec.sharding.max_bytes_per_shard > MAX_BYTES:
        problems.append(
            (
                "sharding.max_bytes_per_shard",
                f"Gemini takes input files of at most {MAX_BYTES} bytes (2 GB)",
            )
        )
    fields = spec.output.output_schema
    if is_embedding(spec):
        if fields["embedding"].type != "list[float]":
            problems.append(("output.schema.embedding", "embeddings are list[float]"))
    else:
        for name, field in fields.items():
            if field.type == "list[float]":
                problems.append(
                    (
                        f"output.schema.{name}",
                        "an embedding is the only field of a Gemini embeddings batch's output",
                    )
                )
    return problems


def request_line(spec: "PipelineSpec", item: "RequestItem") -> dict[str, Any]:
    """The item's line of a shard file."""
    if is_embedding(spec):
        # An EmbedContentRequest as the SDK sends inline ones: the model is the batch's.
        return {"key": item.custom_id, "request": {"content": {"parts": [{"text": item.user}]}}}
    config: dict[str, Any] = {
        "maxOutputTokens": spec.model.max_output_tokens,
        "temperature": spec.model.temperature,
    }
    for option, field in OPTIONS.items():
        if option in spec.model.options:
            config[field] = spec.model.options[option]
    if "thinking_budget" in spec.model.options:
        config["thinkingConfig"] = {"thinkingBudget": spec.model.options["thinking_budget"]}
    if spec.output.format == "json":
        from llm_assets.results.validation import output_json_schema

        config["responseMimeType"] = "application/json"
        config["responseSchema"] = response_schema(output_json_schema(spec))
    request: dict[str, Any] = {
        "contents": [{"role": "user", "parts": [{"text": item.user}]}],
        "generationConfig": config,
    }
    if item.system:
        request["systemInstruction"] = {"parts": [{"text": item.system}]}
    return {"key": item.custom_id, "request": request}


def response_schema(json_schema: dict[str, Any]) -> dict[str, Any]:
    """A JSON Schema of ours as Gemini's `responseSchema`."""
    return _convert(json_schema, json_schema.get("$defs") or {})


def _convert(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if isinstance(ref, str):
        return _convert(defs[ref.rsplit("/", 1)[-1]], defs)
    variants = schema.get("anyOf")
    if isinstance(variants, list):
        kept = [v for v in variants if v.get("type") != "null"]
        converted: dict[str, Any] = (
            _convert(kept[0], defs) if len(kept) == 1 else {"type": "STRING"}
        )
        if len(kept) < len(variants):
            converted["nullable"] = True
        return converted
    out: dict[str, Any] = {}
    kind = schema.get("type")
    if isinstance(kind, str):
        out["type"] = kind.upper()
    for key in _SCHEMA_KEYS:
        if key in schema:
            out[key] = schema[key]
    if isinstance(schema.get("properties"), dict):
        properties = schema["properties"]
        out["properties"] = {name: _convert(sub, defs) for name, sub in properties.items()}
        # Gemini answers in this order; without it, in alphabetical order.
        out["propertyOrdering"] = list(properties)
    if isinstance(schema.get("items"), dict):
        out["items"] = _convert(schema["items"], defs)
    return out
