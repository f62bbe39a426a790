"""The fake Gemini's wire vocabulary: Google's error envelope, timestamps, the fake model's
GenerateContentResponse, and the result lines of a batch's responses file.

Result lines are `{"key": ..., "response": GenerateContentResponse}` or `{"key": ...,
"error": {"code", "message", "status"}}`. Sources: the Batch Mode guide (ai.google.dev,
"each line is either a GenerateContentResponse or a status object", input lines `{"key",
"request"}`), the v1beta reference (GenerateContentBatchOutput.responsesFile), and result
lines recorded from the live API in public client code (a success line with `candidates`,
`finishReason`, `usageMetadata`, `modelVersion`, `responseId`). Per-line error codes are
HTTP-style (400, 429, 500) as users report them; whether the live error object also carries
`status` is not documented, so clients must not depend on it.
"""

import hashlib
import secrets
import string
from datetime import UTC, datetime
from typing import Any

from tests.fakes.openai_model import answer_text, first_sentence, schema_instance, stable_pick

# Helpers tests use to predict the fake model's answers.
__all__ = ["first_sentence", "schema_instance", "stable_pick"]

JSON = dict[str, Any]

STATUS_NAMES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ALREADY_EXISTS",
    412: "FAILED_PRECONDITION",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
MESSAGES = {
    429: "Resource has been exhausted (e.g. check quota).",
    500: "An internal error has occurred. Please retry or report in "
    "https://developers.generativeai.google/guide/troubleshooting",
    503: "The model is overloaded. Please try again later.",
    504: "The request timed out. Please try again.",
}
LINE_FAULTS = ("invalid_argument", "safety", "prompt_blocked", "429", "500", "missing", "duplicate")
_ALPHABET = string.ascii_lowercase + string.digits


class ApiError(Exception):
    """An error answer: the HTTP status and Google's `{"error": {...}}` body."""

    def __init__(self, status: int, message: str, status_name: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = error_body(status, message, status_name)


def error_body(code: int, message: str, status_name: str | None = None) -> JSON:
    """Google's JSON error envelope, as every googleapis.com REST API answers."""
    return {
        "error": {
            "code": code,
            "message": message,
            "status": status_name or STATUS_NAMES.get(code, "UNKNOWN"),
        }
    }


def new_id(length: int) -> str:
    """A resource id as the Gemini API spells them: lowercase letters and digits."""
    return "".join(secrets.choice(_ALPHABET) for _ in range(length))


def rfc3339(moment: datetime | None = None) -> str:
    """A google.protobuf.Timestamp in JSON: UTC, nanosecond digits, `Z`."""
    moment = moment or datetime.now(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond:06d}000Z"


def request_text(request: JSON) -> str:
    """The text of the last user turn of a GenerateContentRequest."""
    contents = request.get("contents")
    if not isinstance(contents, list):
        return ""
    for content in reversed(contents):
        if isinstance(content, dict) and content.get("role", "user") == "user":
            parts = content.get("parts") or []
            texts = [p.get("text") for p in parts if isinstance(p, dict)]
            return " ".join(t for t in texts if isinstance(t, str) and t)
    return ""


def prompt_words(request: JSON) -> int:
    """The fake's prompt token count: the whitespace words of every text part, system
    instruction included."""
    words = 0
    turns = list(request.get("contents") or [])
    system = request.get("systemInstruction") or request.get("system_instruction")
    if isinstance(system, dict):
        turns.append(system)
    for content in turns:
        for part in content.get("parts") or [] if isinstance(content, dict) else []:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                words += len(part["text"].split())
    return words


def response_schema_of(request: JSON) -> JSON | None:
    """generationConfig.responseJsonSchema (or the OpenAPI-subset responseSchema)."""
    config = request.get("generationConfig") or request.get("generation_config") or {}
    for name in ("responseJsonSchema", "response_json_schema", "responseSchema", "response_schema"):
        schema = config.get(name) if isinstance(config, dict) else None
        if isinstance(schema, dict):
            return _lower_types(schema)
    return None


def _lower_types(schema: Any) -> Any:
    """responseSchema spells types in capitals (STRING, OBJECT); JSON Schema does not."""
    if isinstance(schema, dict):
        return {
            k: (v.lower() if k == "type" and isinstance(v, str) else _lower_types(v))
            for k, v in schema.items()
        }
    if isinstance(schema, list):
        return [_lower_types(v) for v in schema]
    return schema


def default_responder(request: JSON) -> str:
    """The fake model: a schema instance for structured output, else the user's first sentence."""
    return answer_text(request_text(request), response_schema_of(request))


def usage_metadata(prompt: int, answer: int, cached: int = 0) -> JSON:
    """A response's usage; `cachedContentTokenCount` (part of the prompt) only when the
    prompt read something from the cache, as Gemini reports it."""
    found: JSON = {
        "promptTokenCount": prompt,
        "candidatesTokenCount": answer,
        "totalTokenCount": prompt + answer,
    }
    if cached:
        found["cachedContentTokenCount"] = min(cached, prompt)
    return found


def system_text(request: JSON) -> str:
    """The system instruction's text: the prefix a batch's requests repeat."""
    system = request.get("systemInstruction") or request.get("system_instruction")
    parts = system.get("parts") or [] if isinstance(system, dict) else []
    return " ".join(
        p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)
    )


def response_id(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:22]


def answer_line(
    key: str, request: JSON, text: str, model: str, cached: int = 0
) -> tuple[JSON, int, int]:
    """(result line, prompt tokens, answer tokens) of a request the model answered, `cached`
    of its prompt tokens read from the cache."""
    prompt, answer = prompt_words(request), len(text.split())
    response = {
        "candidates": [
            {
                "content": {"parts": [{"text": text}], "role": "model"},
                "finishReason": "STOP",
                "index": 0,
            }
        ],
        "usageMetadata": usage_metadata(prompt, answer, cached),
        "modelVersion": model.removeprefix("models/"),
        "responseId": response_id(key),
    }
    return {"key": key, "response": response}, prompt, answer


def embedding_line(key: str, request: JSON) -> JSON:
    """The result line of an EmbedContentRequest: a unit vector of 8 values drawn from the
    text, so the same text always has the same embedding."""
    content = request.get("content") or {}
    parts = content.get("parts") or [] if isinstance(content, dict) else []
    text = " ".join(p.get("text", "") for p in parts if isinstance(p, dict))
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    raw = [b - 127.5 for b in digest[:8]]
    norm = sum(v * v for v in raw) ** 0.5 or 1.0
    return {"key": key, "response": {"embedding": {"values": [v / norm for v in raw]}}}


def blocked_line(key: str, request: JSON, fault: str, model: str) -> tuple[JSON, int]:
    """(result line, prompt tokens) of a safety block: a candidate stopped with finishReason
    SAFETY and no content ("safety"), or a prompt refused outright ("prompt_blocked")."""
    prompt = prompt_words(request)
    rating = {"category": "HARM_CATEGORY_DANGEROUS_CONTENT", "probability": "HIGH", "blocked": True}
    response: JSON = {
        "usageMetadata": {"promptTokenCount": prompt, "totalTokenCount": prompt},
        "modelVersion": model.removeprefix("models/"),
        "responseId": response_id(key),
    }
    if fault == "safety":
        response["candidates"] = [{"finishReason": "SAFETY", "index": 0, "safetyRatings": [rating]}]
    else:
        response["promptFeedback"] = {"blockReason": "SAFETY", "safetyRatings": [rating]}
    return {"key": key, "response": response}, prompt


def error_line(key: str, fault: str) -> JSON:
    """A request the batch ran and the model endpoint refused."""
    if fault == "invalid_argument":
        error = error_body(400, "Request contains an invalid argument.")["error"]
    else:
        code = int(fault)
        error = error_body(code, MESSAGES[code])["error"]
    return {"key": key, "error": error}
