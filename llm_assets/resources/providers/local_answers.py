"""How the local provider answers request lines: which lines it refuses before running any
(as OpenAI validates a whole file), which requests it rejects with a 400, and the output and
error lines it writes, in the OpenAI Batch API's shapes.

Convention: the system message carries the instructions and the user message is the document
to work on; the engine classifies, summarizes or embeds the user message only. JSON outputs
are produced whole, whatever `max_tokens` says, so `finish_reason` is always "stop".
"""

import hashlib
import json
import time
from typing import Any, NamedTuple

from llm_assets.resources.providers.base import ItemResult
from llm_assets.resources.providers.local_engine import CONTEXT_WINDOW, MODEL_NAME, LocalEngine
from llm_assets.resources.providers.local_files import ENDPOINT
from llm_assets.resources.providers.local_plans import OutputPlan, plan_request


class RequestRejected(Exception):
    """A request the provider answers with a 400 instead of a completion."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class _Accepted(NamedTuple):
    """A request that passed its checks, waiting for the engine."""

    number: int
    request: dict[str, Any]
    user: str
    prompt_tokens: int
    plan: OutputPlan


def request_hash(*parts: str) -> str:
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()


def line_problem(raw: bytes, seen: set[str]) -> tuple[str, str] | None:
    try:
        request = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return "invalid_json_line", f"not valid JSON ({exc.msg if hasattr(exc, 'msg') else exc})"
    if not isinstance(request, dict):
        return "invalid_request", "a request line must be a JSON object"
    custom_id = request.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return "missing_custom_id", "custom_id is missing or not a non-empty string"
    if custom_id in seen:
        return "duplicate_custom_id", f"duplicate custom_id {custom_id!r}"
    seen.add(custom_id)
    if request.get("url") != ENDPOINT:
        return "invalid_url", f"url must be {ENDPOINT}, got {request.get('url')!r}"
    method = request.get("method", "POST")
    if method != "POST":
        return "invalid_method", f"method must be POST, got {method!r}"
    body = request.get("body")
    if not isinstance(body, dict):
        return "missing_body", "body is missing or not an object"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "missing_messages", "body.messages is missing or empty"
    if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
        return "invalid_messages", "every entry of body.messages must be an object with a role"
    if body.get("model", MODEL_NAME) != MODEL_NAME:
        return "model_not_found", f"model {body.get('model')!r} is not served; use {MODEL_NAME}"
    return None


def _message_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def execute(
    engine: LocalEngine, batch_id: str, chunk: list[tuple[int, dict[str, Any]]]
) -> tuple[list[bytes], list[bytes]]:
    """Answer one chunk as (output lines, error lines), batching model calls across its
    requests."""
    error_lines: list[bytes] = []
    accepted: list[_Accepted] = []
    for number, request in chunk:
        try:
            accepted.append(_accept(engine, number, request))
        except RequestRejected as rejected:
            error_lines.append(_error_line(batch_id, number, request, rejected))
    contents = _produce(engine, [(item.user, item.plan) for item in accepted])
    ok_lines = [
        _output_line(batch_id, item, content, engine.count_tokens(content))
        for item, content in zip(accepted, contents, strict=True)
    ]
    return ok_lines, error_lines


def _accept(engine: LocalEngine, number: int, request: dict[str, Any]) -> _Accepted:
    """The request's user text, prompt tokens and output plan; RequestRejected when the
    provider answers it with a 400."""
    body = request["body"]
    messages = body["messages"]
    system = "\n".join(
        _message_text(m.get("content")) for m in messages if m.get("role") == "system"
    )
    users = [_message_text(m.get("content")) for m in messages if m.get("role") == "user"]
    user = users[-1] if users else ""
    if not user.strip():
        raise RequestRejected("empty_input", "the user message is empty")
    prompt_tokens = engine.count_tokens(f"{system}\n{user}" if system else user)
    if prompt_tokens > CONTEXT_WINDOW:
        raise RequestRejected(
            "context_length_exceeded",
            f"This model's maximum context length is {CONTEXT_WINDOW} tokens. However, "
            f"your messages resulted in {prompt_tokens} tokens.",
        )
    try:
        plan = plan_request(body)
    except (AttributeError, TypeError, ValueError) as exc:
        raise RequestRejected("invalid_request", f"malformed request body: {exc}") from exc
    if plan.problems:
        raise RequestRejected(
            "unsupported_output_schema",
            "the local provider cannot produce "
            + "; ".join(f"{name}: {why}" for name, why in plan.problems),
        )
    return _Accepted(number, request, user, prompt_tokens, plan)


def _output_line(batch_id: str, item: _Accepted, content: str, completion_tokens: int) -> bytes:
    custom_id = item.request["custom_id"]
    return encode_line(
        {
            "id": f"batch_req_{item.number}",
            "custom_id": custom_id,
            "response": {
                "status_code": 200,
                "request_id": "req_" + request_hash(batch_id, custom_id)[:24],
                "body": {
                    "id": "chatcmpl-" + request_hash(batch_id, str(item.number))[:24],
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": item.request["body"].get("model", MODEL_NAME),
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": content},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": {
                        "prompt_tokens": item.prompt_tokens,
                        "completion_tokens": completion_tokens,
                        "total_tokens": item.prompt_tokens + completion_tokens,
                    },
                },
            },
            "error": None,
        }
    )


def _produce(engine: LocalEngine, work: list[tuple[str, OutputPlan]]) -> list[str]:
    """Each request's content; texts needing the same model call are sent together."""
    values = _call_engine(engine, work, _group_calls(work))
    return [_content(plan, got) for (_, plan), got in zip(work, values, strict=True)]


def _group_calls(work: list[tuple[str, OutputPlan]]) -> dict[Any, list[int]]:
    """The model calls the work needs, each with the indices of the requests it serves."""
    groups: dict[Any, list[int]] = {}
    for index, (_, plan) in enumerate(work):
        if plan.fields is None:
            groups.setdefault(("summary", plan.text_min_chars, plan.text_max_chars), []).append(
                index
            )
            continue
        for spec in plan.fields:
            if spec.kind == "label":
                key: Any = ("label", spec.name, spec.labels, plan.descriptions)
            elif spec.kind == "summary":
                key = ("summary", spec.min_chars, spec.max_chars)
            elif spec.kind == "embedding":
                key = ("embedding",)
            else:
                continue
            groups.setdefault(key, []).append(index)
    return groups


def _call_engine(
    engine: LocalEngine, work: list[tuple[str, OutputPlan]], groups: dict[Any, list[int]]
) -> list[dict[Any, Any]]:
    """Per request, each call's answer by its key (a label field: (label, confidence))."""
    values: list[dict[Any, Any]] = [{} for _ in work]
    for key, members in groups.items():
        texts = [work[i][0] for i in members]
        if key[0] == "label":
            _, name, labels, described = key
            for i, (label, confidence) in zip(
                members, engine.classify(texts, list(labels), dict(described)), strict=True
            ):
                values[i][name] = (label, confidence)
        elif key[0] == "summary":
            for i, summary in zip(members, engine.summarize(texts, key[1], key[2]), strict=True):
                values[i][key] = summary
        else:
            vectors = engine.embed(texts)
            for i, vector in zip(members, vectors, strict=True):
                values[i][key] = [round(float(v), 6) for v in vector]
    return values


def _content(plan: OutputPlan, got: dict[Any, Any]) -> str:
    """One request's message content from the answers to its calls."""
    if plan.fields is None:
        return str(got[("summary", plan.text_min_chars, plan.text_max_chars)])
    first_label = next((p for p in plan.fields if p.kind == "label"), None)
    obj: dict[str, Any] = {}
    for spec in plan.fields:
        if spec.kind == "label":
            obj[spec.name] = got[spec.name][0]
        elif spec.kind == "confidence":
            assert first_label is not None
            confidence = round(got[first_label.name][1], 4)
            obj[spec.name] = min(spec.upper, max(spec.lower, confidence))
        elif spec.kind == "summary":
            obj[spec.name] = got[("summary", spec.min_chars, spec.max_chars)]
        else:
            obj[spec.name] = got[("embedding",)]
    return json.dumps(obj, ensure_ascii=False)


def _error_line(
    batch_id: str, number: int, request: dict[str, Any], rejected: RequestRejected
) -> bytes:
    return encode_line(
        {
            "id": f"batch_req_{number}",
            "custom_id": request["custom_id"],
            "response": {
                "status_code": 400,
                "request_id": "req_" + request_hash(batch_id, request["custom_id"])[:24],
                "body": {
                    "error": {
                        "message": rejected.message,
                        "type": "invalid_request_error",
                        "param": "messages",
                        "code": rejected.code,
                    }
                },
            },
            "error": None,
        }
    )


def item_result(line: dict[str, Any]) -> ItemResult:
    response = line.get("response") or {}
    body = response.get("body") or {}
    status_code = response.get("status_code")
    if status_code == 200:
        choice = body["choices"][0]
        usage = body.get("usage") or {}
        return ItemResult(
            custom_id=line["custom_id"],
            succeeded=True,
            output_text=choice["message"]["content"],
            finish_reason=choice.get("finish_reason"),
            input_tokens=int(usage.get("prompt_tokens", 0)),
            output_tokens=int(usage.get("completion_tokens", 0)),
            status_code=200,
        )
    error = body.get("error") or line.get("error") or {}
    return ItemResult(
        custom_id=line["custom_id"],
        succeeded=False,
        status_code=status_code,
        error_class="deterministic",
        error_code=error.get("code"),
        error_message=error.get("message"),
    )


def encode_line(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, ensure_ascii=False).encode() + b"\n"
