"""Bedrock's record formats: a request's `modelInput` (an Anthropic Messages body for
`anthropic.*` models, else the Converse format), and a result record (a `.out` line of a
batch job, or an on-demand answer) normalized to an ItemResult."""

from typing import TYPE_CHECKING, Any, Literal

from llm_assets.results.rows import ItemResult

if TYPE_CHECKING:
    from llm_assets.resources.providers.base import RequestItem
    from llm_assets.spec.model import PipelineSpec

ANTHROPIC_VERSION = "bedrock-2023-05-31"


def input_format(spec: "PipelineSpec") -> Literal["anthropic", "converse"]:
    """The request format: `model.options.format`, else by the model's name."""
    chosen = spec.model.options.get("format")
    if chosen in ("anthropic", "converse"):
        return chosen
    return "anthropic" if ".anthropic." in f".{spec.model.name}" else "converse"


def model_input(spec: "PipelineSpec", item: "RequestItem") -> dict[str, Any]:
    """The `modelInput` of an item's record in the spec's format."""
    if input_format(spec) == "anthropic":
        body: dict[str, Any] = {
            "anthropic_version": ANTHROPIC_VERSION,
            "max_tokens": spec.model.max_output_tokens,
            "temperature": spec.model.temperature,
            "messages": [{"role": "user", "content": item.user}],
        }
        if item.system:
            body["system"] = item.system
        return body
    body = {
        "messages": [{"role": "user", "content": [{"text": item.user}]}],
        "inferenceConfig": {
            "maxTokens": spec.model.max_output_tokens,
            "temperature": spec.model.temperature,
        },
    }
    if item.system:
        body["system"] = [{"text": item.system}]
    return body


def normalize_record(line: dict[str, Any]) -> ItemResult | None:
    """One `.out` line → ItemResult (Anthropic Messages or Converse output, or an error)."""
    record_id = line.get("recordId")
    if not record_id:
        return None
    error = line.get("error")
    if error:
        code = error.get("errorCode") if isinstance(error, dict) else None
        message = error.get("errorMessage") if isinstance(error, dict) else str(error)
        status = int(code) if isinstance(code, int | str) and str(code).isdigit() else None
        transient = status is not None and (status == 429 or status >= 500)
        return ItemResult(
            custom_id=record_id,
            succeeded=False,
            status_code=status,
            error_class="transient" if transient else "deterministic",
            error_code=str(code) if code is not None else "error",
            error_message=str(message or "record failed"),
        )
    output = line.get("modelOutput") or {}
    if "output" in output:  # Converse
        blocks = (output.get("output") or {}).get("message", {}).get("content") or []
        text = "".join(b.get("text", "") for b in blocks if isinstance(b, dict))
        usage = output.get("usage") or {}
        stop = output.get("stopReason")
        input_tokens = int(usage.get("inputTokens") or 0)
        output_tokens = int(usage.get("outputTokens") or 0)
        cached = int(usage.get("cacheReadInputTokens") or 0)
        written = 0
    else:  # Anthropic Messages
        blocks = output.get("content") or []
        text = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
        usage = output.get("usage") or {}
        stop = output.get("stop_reason")
        cached = int(usage.get("cache_read_input_tokens") or 0)
        written = int(usage.get("cache_creation_input_tokens") or 0)
        input_tokens = int(usage.get("input_tokens") or 0) + cached + written
        output_tokens = int(usage.get("output_tokens") or 0)
    return ItemResult(
        custom_id=record_id,
        succeeded=True,
        status_code=200,
        output_text=text,
        finish_reason="length" if stop in ("max_tokens", "length") else "stop",
        input_tokens=input_tokens,
        cached_input_tokens=cached,
        cache_write_input_tokens=written,
        output_tokens=output_tokens,
    )
