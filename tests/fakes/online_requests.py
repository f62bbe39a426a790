"""A chat completions request body checked as the Chat Completions API checks it."""

import json
from dataclasses import dataclass
from typing import Any

from tests.fakes.openai_model import ApiError, prompt_tokens_of

JSON = dict[str, Any]
ROLES = ("system", "assistant", "user", "function", "tool", "developer")
# Reasoning models refuse `max_tokens` and want `max_completion_tokens`, as the real API does.
_MAX_COMPLETION_ONLY = ("o1", "o3", "o4", "gpt-5")


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a decimal"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _invalid_type(param: str, expected: str, value: Any) -> ApiError:
    return ApiError(
        400,
        f"Invalid type for '{param}': expected {expected}, but got {_type_name(value)} instead.",
        param=param,
        code="invalid_type",
    )


def _missing(param: str) -> ApiError:
    return ApiError(
        400,
        f"Missing required parameter: '{param}'.",
        param=param,
        code="missing_required_parameter",
    )


@dataclass(frozen=True)
class ChatRequest:
    """What the fake needs of a valid chat request body."""

    body: JSON
    model: str
    prompt_tokens: int
    max_tokens: int | None
    n: int

    @property
    def estimated_tokens(self) -> int:
        """What OpenAI counts against the token limit on arrival: prompt plus max output."""
        return self.prompt_tokens + (self.max_tokens or 0) * self.n


def parse_chat_request(raw: bytes) -> ChatRequest:
    """The request body checked as the Chat Completions API checks it; ApiError(400) if not."""
    try:
        body = json.loads(raw or b"")
    except (ValueError, UnicodeDecodeError):
        body = None
    if not isinstance(body, dict):
        raise ApiError(
            400,
            "We could not parse the JSON body of your request. (HINT: This likely means you "
            "aren't using your HTTP library correctly. The OpenAI API expects a JSON payload, "
            "but what was sent was not valid JSON. If you have trouble figuring out how to fix "
            "this, please contact us through our help center at help.openai.com.)",
        )
    model = body.get("model")
    if model is None or model == "":
        raise ApiError(400, "you must provide a model parameter")
    if not isinstance(model, str):
        raise _invalid_type("model", "a string", model)
    messages = body.get("messages")
    if messages is None:
        raise _missing("messages")
    if not isinstance(messages, list):
        raise _invalid_type("messages", "an array of objects", messages)
    if not messages:
        raise ApiError(
            400,
            "Invalid 'messages': empty array. Expected an array with minimum length 1, but got "
            "an empty array instead.",
            param="messages",
            code="empty_array",
        )
    _check_messages(messages)
    if body.get("stream") is True:
        raise ApiError(
            400,
            "The fake online server does not implement streaming; send 'stream': false.",
            param="stream",
            code="unsupported_value",
        )
    if "max_tokens" in body and model.startswith(_MAX_COMPLETION_ONLY):
        raise ApiError(
            400,
            "Unsupported parameter: 'max_tokens' is not supported with this model. Use "
            "'max_completion_tokens' instead.",
            param="max_tokens",
            code="unsupported_parameter",
        )
    limits = _limits(body)
    return ChatRequest(
        body=body,
        model=model,
        prompt_tokens=prompt_tokens_of(body, model),
        max_tokens=limits.get("max_completion_tokens", limits.get("max_tokens")),
        n=limits.get("n", 1),
    )


def _check_messages(messages: list[Any]) -> None:
    """Each message's role and content, as the API checks them."""
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise _invalid_type(where, "an object", message)
        role = message.get("role")
        if role is None:
            raise _missing(f"{where}.role")
        if role not in ROLES:
            supported = ", ".join(f"'{r}'" for r in ROLES[:-1]) + f", and '{ROLES[-1]}'"
            raise ApiError(
                400,
                f"Invalid value: '{role}'. Supported values are: {supported}.",
                param=f"{where}.role",
                code="invalid_value",
            )
        if "content" not in message and role != "assistant":
            raise _missing(f"{where}.content")
        content = message.get("content")
        if not (
            isinstance(content, str)
            or (isinstance(content, list) and all(isinstance(p, dict) for p in content))
            or (content is None and role == "assistant")
        ):
            raise _invalid_type(f"{where}.content", "one of a string or array of objects", content)


def _limits(body: JSON) -> dict[str, int]:
    """max_tokens, max_completion_tokens and n, where given, each checked."""
    limits: dict[str, int] = {}
    for name, low, high in (
        ("max_tokens", 1, None),
        ("max_completion_tokens", 1, None),
        ("n", 1, 128),
    ):
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise _invalid_type(name, "an integer", value)
        if value < low:
            raise ApiError(
                400,
                f"Invalid '{name}': integer below minimum value. Expected a value >= {low}, but "
                f"got {value} instead.",
                param=name,
                code="integer_below_min_value",
            )
        if high is not None and value > high:
            raise ApiError(
                400,
                f"Invalid '{name}': integer above maximum value. Expected a value <= {high}, "
                f"but got {value} instead.",
                param=name,
                code="integer_above_max_value",
            )
        limits[name] = value
    return limits
