"""Gemini Batch Mode result lines → ItemResult: the parser an import's worker processes run
(see llm_assets.results.rows), importable without Dagster or an SDK.

A responses file line is `{"key": custom_id, "response": GenerateContentResponse}` (or an
EmbedContentResponse for an embeddings batch) or `{"key": custom_id, "error": Status}`.
Every line is judged on its own: a batch that ends SUCCEEDED may hold error lines, and a
response may be a refusal (a prompt blocked, a candidate stopped for safety) rather than an
answer.
"""

import json
from typing import Any, Literal

import orjson

from llm_assets.results.rows import Answered, ItemResult

TRANSIENT_CODES = frozenset({408, 429, 499, 500, 502, 503, 504})
TRANSIENT_STATUSES = frozenset(
    {"RESOURCE_EXHAUSTED", "INTERNAL", "UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED", "ABORTED"}
)
ANSWERED_FINISH = {"STOP": "stop", "MAX_TOKENS": "length", "FINISH_REASON_UNSPECIFIED": "stop"}
"""Finish reasons of an answer; any other (SAFETY, RECITATION, BLOCKLIST, PROHIBITED_CONTENT,
SPII, LANGUAGE, MALFORMED_FUNCTION_CALL, OTHER, ...) is a refusal the same request would
meet again."""


def classify_error(code: Any, status: Any) -> Literal["deterministic", "transient"]:
    """A per-line error: quota, server trouble and deadlines run again; an invalid argument,
    a permission or a missing model does not."""
    if isinstance(code, int) and code in TRANSIENT_CODES:
        return "transient"
    if isinstance(status, str) and status in TRANSIENT_STATUSES:
        return "transient"
    return "deterministic"


def read_line(raw: bytes | str | dict[str, Any]) -> Answered | ItemResult | None:
    """One responses-file line, read: an Answered for an answer (a plain success), an
    ItemResult for a failure, None for a line without a key."""
    line = raw if isinstance(raw, dict) else orjson.loads(raw)
    if not isinstance(line, dict):
        return None
    key = line.get("key")
    if not isinstance(key, str) or not key:
        return None
    error = line.get("error")
    response = line.get("response")
    if error or not isinstance(response, dict):
        return _error_result(key, error if isinstance(error, dict) else {})
    usage = response.get("usageMetadata") or {}
    tokens_in = _int(usage.get("promptTokenCount")) + _int(usage.get("toolUsePromptTokenCount"))
    cached = _int(usage.get("cachedContentTokenCount"))
    # Thinking tokens are billed as output.
    tokens_out = _int(usage.get("candidatesTokenCount")) + _int(usage.get("thoughtsTokenCount"))
    embedding = _embedding_of(response)
    if embedding is not None:
        text = json.dumps({"embedding": embedding})
        return Answered(key, 200, text, "stop", tokens_in, cached, tokens_out)
    blocked = (response.get("promptFeedback") or {}).get("blockReason")
    if blocked:
        return _refused(key, f"prompt_blocked_{blocked}", "the prompt was blocked", tokens_in)
    candidates = response.get("candidates") or []
    if not candidates or not isinstance(candidates[0], dict):
        return _refused(key, "no_candidates", "the response has no candidate", tokens_in)
    candidate = candidates[0]
    reason = str(candidate.get("finishReason") or "FINISH_REASON_UNSPECIFIED")
    finish = ANSWERED_FINISH.get(reason)
    if finish is None:
        return _refused(
            key, f"finish_{reason}", f"the answer was stopped ({reason})", tokens_in, tokens_out
        )
    parts = (candidate.get("content") or {}).get("parts") or []
    # Thought summaries are not the answer.
    text = "".join(
        p["text"] for p in parts if isinstance(p.get("text"), str) and not p.get("thought")
    )
    return Answered(key, 200, text, finish, tokens_in, cached, tokens_out)


def normalize_line(raw: bytes | str | dict[str, Any]) -> ItemResult | None:
    """One responses-file line → ItemResult (see read_line)."""
    read = read_line(raw)
    return read.result() if isinstance(read, Answered) else read


def _int(value: Any) -> int:
    """A count as proto3 JSON writes it: a number, or an int64 as a string; absent is 0."""
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def _embedding_of(response: dict[str, Any]) -> list[float] | None:
    """The vector of an EmbedContentResponse (`embedding.values`, or the first of
    `embeddings`), None for any other response."""
    embedding = response.get("embedding")
    if embedding is None and isinstance(response.get("embeddings"), list):
        embedding = (response["embeddings"] or [None])[0]
    if isinstance(embedding, dict) and isinstance(embedding.get("values"), list):
        return embedding["values"]
    return None


def _error_result(key: str, error: dict[str, Any]) -> ItemResult:
    code, status = error.get("code"), error.get("status")
    message = error.get("message") or status or f"error {code}"
    return ItemResult(
        custom_id=key,
        succeeded=False,
        status_code=code if isinstance(code, int) else None,
        error_class=classify_error(code, status),
        error_code=str(status or code or "error"),
        error_message=str(message),
    )


def _refused(key: str, code: str, message: str, tokens_in: int, tokens_out: int = 0) -> ItemResult:
    """A response the model refused to give; its tokens are billed all the same."""
    return ItemResult(
        custom_id=key,
        succeeded=False,
        status_code=200,
        error_class="deterministic",
        error_code=code,
        error_message=message,
        input_tokens=tokens_in,
        output_tokens=tokens_out,
    )
