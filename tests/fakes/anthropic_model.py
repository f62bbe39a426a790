"""The Message Batches API's content: a create request checked as the real API checks it, the
error envelope, and the messages the fake model answers (deterministic, so tests can predict
them; tokens are counted at four characters a token).
"""

import hashlib
import json
import math
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

CUSTOM_ID_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
MAX_REQUESTS = 100_000
POSITIVE_WORDS = ("good", "great", "love", "excellent")

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}
ERROR_MESSAGES = {
    429: "Number of request tokens has exceeded your per-minute rate limit.",
    500: "Internal server error",
    529: "Overloaded",
}
ITEM_ERRORS = {
    "invalid_request": ("invalid_request_error", "messages: the request was invalid"),
    "api_error": ("api_error", "Internal server error"),
    "overloaded": ("overloaded_error", "Overloaded"),
}

ItemFault = Callable[[str, dict[str, Any]], str | None]
BatchOutcome = Callable[[dict[str, Any]], str]
Responder = Callable[[dict[str, Any]], str]


class ApiError(Exception):
    """Raised inside a route to answer with the API's error envelope."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def approx_tokens(chars: int) -> int:
    return math.ceil(chars / 4)


def block_text(content: Any) -> str:
    """The text of a `content` / `system` value: a string or a list of content blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(block.get("text", ""))
            for block in content
            if isinstance(block, dict) and block.get("type") == "text"
        )
    return ""


def user_text(params: dict[str, Any]) -> str:
    return "\n".join(
        block_text(message.get("content"))
        for message in params.get("messages", [])
        if isinstance(message, dict) and message.get("role") == "user"
    )


def input_chars(params: dict[str, Any]) -> int:
    messages = params.get("messages", [])
    chars = len(block_text(params.get("system")))
    return chars + sum(len(block_text(m.get("content"))) for m in messages if isinstance(m, dict))


def default_responder(params: dict[str, Any]) -> str:
    """A deterministic JSON answer, so pipelines that parse and validate output have data."""
    text = user_text(params)
    lowered = text.lower()
    label = "positive" if any(word in lowered for word in POSITIVE_WORDS) else "negative"
    match = re.match(r"\s*(.*?[.!?])(?=\s|$)", text, flags=re.DOTALL)
    first = (match.group(1) if match else text).strip()
    return json.dumps({"label": label, "summary": first[:200]})


def error_body(status: int, message: str, request_id: str) -> dict[str, Any]:
    """The API's error envelope for `status`."""
    error_type = ERROR_TYPES.get(status, "api_error")
    return {
        "type": "error",
        "error": {"type": error_type, "message": message},
        "request_id": request_id,
    }


def assistant_message(
    batch_id: str, request: dict[str, Any], responder: Responder | None
) -> dict[str, Any]:
    """The assistant message of a succeeded request, cut at `max_tokens` (4 characters each)."""
    params = request["params"]
    text = (responder or default_responder)(params)
    limit = params["max_tokens"] * 4
    stop_reason = "end_turn"
    if len(text) > limit:
        text, stop_reason = text[:limit], "max_tokens"
    digest = hashlib.sha256(f"{batch_id}/{request['custom_id']}".encode()).hexdigest()
    return {
        "id": f"msg_{digest[:24]}",
        "type": "message",
        "role": "assistant",
        "model": params["model"],
        "content": [{"type": "text", "text": text}],
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {
            "input_tokens": max(1, approx_tokens(input_chars(params))),
            "output_tokens": approx_tokens(len(text)),
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0},
            "service_tier": "batch",
        },
    }


REQUEST_COUNTS = ("processing", "succeeded", "errored", "canceled", "expired")


def counts(**given: int) -> dict[str, int]:
    """A batch's `request_counts`: every one of REQUEST_COUNTS, 0 unless given."""
    unknown = set(given) - set(REQUEST_COUNTS)
    if unknown:
        raise TypeError(f"not a request count: {sorted(unknown)}")
    return {name: given.get(name, 0) for name in REQUEST_COUNTS}


def validate_create(body: Any, max_requests: int) -> list[dict[str, Any]]:
    """The create-time checks of the real API; the first violation fails the whole batch."""
    if not isinstance(body, dict) or not isinstance(body.get("requests"), list):
        raise ApiError(400, "requests: Field required (a list of {custom_id, params})")
    requests: list[Any] = body["requests"]
    if not requests:
        raise ApiError(400, "requests: List should have at least 1 item after validation, not 0")
    if len(requests) > max_requests:
        limit = f"requests: a Message Batch holds at most {max_requests} requests"
        raise ApiError(400, f"{limit}, not {len(requests)}")
    seen: set[str] = set()
    clean: list[dict[str, Any]] = []
    for index, request in enumerate(requests):
        where = f"requests.{index}"
        if not isinstance(request, dict):
            raise ApiError(400, f"{where}: Input should be an object")
        custom_id = request.get("custom_id")
        if not isinstance(custom_id, str) or not CUSTOM_ID_RE.fullmatch(custom_id):
            raise ApiError(
                400,
                f"{where}.custom_id: String should match pattern '{CUSTOM_ID_RE.pattern}' "
                f"(got {custom_id!r})",
            )
        if custom_id in seen:
            raise ApiError(
                400,
                f"{where}.custom_id: duplicate custom_id {custom_id!r}; custom_id must be unique "
                "within a Message Batch",
            )
        seen.add(custom_id)
        params = request.get("params")
        label = f"{where}.params (custom_id {custom_id!r})"
        if not isinstance(params, dict):
            raise ApiError(400, f"{label}: Field required")
        if not isinstance(params.get("model"), str) or not params["model"]:
            raise ApiError(400, f"{label}.model: Field required")
        max_tokens = params.get("max_tokens")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ApiError(400, f"{label}.max_tokens: Input should be an integer >= 1")
        messages = params.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, f"{label}.messages: List should have at least 1 item")
        for position, message in enumerate(messages):
            if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
                raise ApiError(
                    400, f"{label}.messages.{position}.role: Input should be 'user' or 'assistant'"
                )
            if not isinstance(message.get("content"), str | list):
                raise ApiError(400, f"{label}.messages.{position}.content: Field required")
        clean.append({"custom_id": custom_id, "params": params})
    return clean
