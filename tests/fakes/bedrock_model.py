"""What the fake Bedrock model makes of one body, the same for a batch record and a runtime call:
the model's input checks (Anthropic Messages for InvokeModel, Converse for Converse), and its
answer with usage (four characters a token) and a stop reason.
"""

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.fakes.anthropic_model import approx_tokens, default_responder
from tests.fakes.bedrock_api import AwsError, Violations

JSON = dict[str, Any]
Responder = Callable[[JSON], str]
ANTHROPIC_VERSION = "bedrock-2023-05-31"

ANTHROPIC_KEYS = frozenset(
    {
        "anthropic_version",
        "anthropic_beta",
        "max_tokens",
        "messages",
        "system",
        "stop_sequences",
        "temperature",
        "top_p",
        "top_k",
        "tools",
        "tool_choice",
        "thinking",
        "metadata",
    }
)
CONVERSE_KEYS = frozenset(
    {
        "messages",
        "system",
        "inferenceConfig",
        "toolConfig",
        "guardrailConfig",
        "additionalModelRequestFields",
        "additionalModelResponseFieldPaths",
        "promptVariables",
        "requestMetadata",
        "performanceConfig",
    }
)

# What each body style answers when the body is not an object, or has a key it does not know.
ANTHROPIC_SHAPE_ERRORS = (
    "Malformed input request: #: expected type: JSONObject, please reformat your input",
    "{key}: Extra inputs are not permitted",
)
CONVERSE_SHAPE_ERRORS = (
    "Malformed input request: the record's modelInput is not a JSON object",
    "Malformed input request: extraneous key [{key}] is not permitted",
)


def anthropic_model_name(model_id: str) -> str:
    """The `model` an Anthropic body answers with: `anthropic.claude-x-v1:0` -> `claude-x`."""
    name = model_id.rsplit("/", 1)[-1]
    if "anthropic." in name:
        name = name.split("anthropic.", 1)[1]
    return re.sub(r"-v\d+(:\d+)?$", "", name)


@dataclass
class ModelAnswer:
    """What the model makes of one body: a rejection message, or its output and usage."""

    error: str | None = None
    output: JSON | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    latency_ms: int = 0


def _text_of(content: Any) -> str:
    """The text of an Anthropic or Converse `content` / `system` value."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(block["text"])
            for block in content
            if isinstance(block, dict) and isinstance(block.get("text"), str)
        )
    return ""


def _input_chars(model_input: JSON) -> int:
    chars = len(_text_of(model_input.get("system")))
    for message in model_input.get("messages", []):
        if isinstance(message, dict):
            chars += len(_text_of(message.get("content")))
    return chars


def _shape_error(
    model_input: Any, allowed: frozenset[str], not_object: str, extra_key: str
) -> str | None:
    """`not_object` when the body is not a JSON object, `extra_key` (formatted with `key`)
    for its first key the model does not know, else None."""
    if not isinstance(model_input, dict):
        return not_object
    extra = next((key for key in model_input if key not in allowed), None)
    return None if extra is None else extra_key.format(key=extra)


def anthropic_input_error(model_input: Any) -> str | None:
    """Why an Anthropic Messages body would be rejected by the model, or None."""
    problem = _shape_error(model_input, ANTHROPIC_KEYS, *ANTHROPIC_SHAPE_ERRORS)
    if problem is not None:
        return problem
    version = model_input.get("anthropic_version")
    if version is None:
        return "anthropic_version: Field required"
    if version != ANTHROPIC_VERSION:
        return f"anthropic_version: Input should be '{ANTHROPIC_VERSION}'"
    max_tokens = model_input.get("max_tokens")
    if max_tokens is None:
        return "max_tokens: Field required"
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        return "max_tokens: Input should be greater than or equal to 1"
    messages = model_input.get("messages")
    if messages is None:
        return "messages: Field required"
    if not isinstance(messages, list) or not messages:
        return "messages: List should have at least 1 item after validation, not 0"
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            return f"messages.{index}.role: Input should be 'user' or 'assistant'"
        if not isinstance(message.get("content"), str | list):
            return f"messages.{index}.content: Field required"
    system = model_input.get("system")
    if system is not None and not isinstance(system, str | list):
        return "system: Input should be a valid string or a list of text blocks"
    return None


def converse_input_error(model_input: Any) -> str | None:
    """Why a Converse body would be rejected, or None (Converse's own message style)."""
    problem = _shape_error(model_input, CONVERSE_KEYS, *CONVERSE_SHAPE_ERRORS)
    if problem is not None:
        return problem
    check = Violations()
    messages = model_input.get("messages")
    if messages is None:
        check.add(None, "messages", "not be null")
    elif not isinstance(messages, list) or not messages:
        check.add(messages, "messages", "have length greater than or equal to 1")
    else:
        for where, message in check.structures(messages, "messages"):
            check.enum(message.get("role"), f"{where}.role", ("user", "assistant"))
            if message.get("role") is None:
                check.add(None, f"{where}.role", "not be null")
            content = message.get("content")
            if not isinstance(content, list) or not all(isinstance(b, dict) for b in content):
                check.add(None, f"{where}.content", "be a list of content blocks")
    system = model_input.get("system")
    if system is not None and (
        not isinstance(system, list) or not all(isinstance(b, dict) for b in system)
    ):
        check.add(None, "system", "be a list of system content blocks")
    config = model_input.get("inferenceConfig")
    if config is not None:
        if not isinstance(config, dict):
            check.add(None, "inferenceConfig", "be a structure")
        else:
            check.integer(config.get("maxTokens"), "inferenceConfig.maxTokens", 1, 1_000_000)
    try:
        check.raise_if_any()
    except AwsError as err:
        return err.message
    return None


def _as_anthropic_params(model_input: JSON) -> JSON:
    """A Converse body in the shape `default_responder` reads (content blocks with a type)."""
    messages = [
        {
            "role": message.get("role"),
            "content": [{"type": "text", "text": _text_of(message.get("content"))}],
        }
        for message in model_input.get("messages", [])
        if isinstance(message, dict)
    ]
    return {"messages": messages}


def model_answer(
    model_input: Any,
    *,
    converse: bool,
    model_id: str,
    message_key: str,
    responder: Responder | None,
) -> ModelAnswer:
    """The model's answer to one body, shared by batch records and runtime calls: the
    validation message, or the output in the shape of the body (Converse or Anthropic
    Messages) with its usage. `message_key` seeds the Anthropic message id."""
    check = converse_input_error if converse else anthropic_input_error
    problem = check(model_input)
    if problem is not None:
        return ModelAnswer(error=problem)
    if responder is not None:
        text = responder(model_input)
    else:
        text = default_responder(_as_anthropic_params(model_input) if converse else model_input)
    if converse:
        limit = (model_input.get("inferenceConfig") or {}).get("maxTokens")
    else:
        limit = model_input["max_tokens"]
    stop_reason = "end_turn"
    if limit is not None and len(text) > limit * 4:
        text, stop_reason = text[: limit * 4], "max_tokens"
    input_tokens = max(1, approx_tokens(_input_chars(model_input)))
    output_tokens = approx_tokens(len(text))
    latency_ms = 100 + output_tokens
    if converse:
        output: JSON = {
            "output": {"message": {"role": "assistant", "content": [{"text": text}]}},
            "stopReason": stop_reason,
            "usage": {
                "inputTokens": input_tokens,
                "outputTokens": output_tokens,
                "totalTokens": input_tokens + output_tokens,
            },
            "metrics": {"latencyMs": latency_ms},
        }
    else:
        digest = hashlib.sha256(message_key.encode()).hexdigest()
        output = {
            "id": f"msg_bdrk_{digest[:24]}",
            "type": "message",
            "role": "assistant",
            "model": anthropic_model_name(model_id),
            "content": [{"type": "text", "text": text}],
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
        }
    return ModelAnswer(
        output=output,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        latency_ms=latency_ms,
    )
