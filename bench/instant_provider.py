"""An OpenAI batch provider that answers at once, for benchmarks of our side of a day.

`submit` reads the shard and writes the OpenAI batch output and error files a real batch
would produce (the provider's work, timed apart in `generation_seconds`); `poll` says
completed; `result_blocks` hands those files' lines to the import as the real adapter does
(in blocks of whole lines, read by its `read_line`), so reading and parsing results is
counted as ours. Request lines are built by the real `OpenAIBatchProvider.request_line`.

Every path runs, chosen per custom_id by a hash so that runs are reproducible:

| share | first round (r00) | later rounds |
|---|---|---|
| 1.0% | HTTP 500 in the error file (transient, retried) | answered |
| 1.0% | HTTP 429 in the error file (transient, retried) | answered |
| 1.0% | HTTP 400 (deterministic, dead letter) | - |
| 0.2% | no line at all (missing result, retried) | answered |
| 0.1% | `batch_expired` line (expired, retried) | answered |
| 0.5% | answer that is not JSON (quality) | same |
| 0.5% | category outside the set (quality) | same |
| 0.5% | summary under min_length (quality) | same |
| 0.3% | cut at max_tokens, finish_reason length (quality) | same |
| 0.1% | the answer twice (duplicate line) | same |
"""

import json
import re
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import PrivateAttr

from llm_assets.resources.providers.base import (
    BatchStatus,
    ItemResult,
    ShardState,
    ShardSubmission,
)
from llm_assets.resources.providers.openai_batch import OpenAIBatchProvider
from llm_assets.resources.providers.openai_lines import normalize_line, read_line
from llm_assets.resources.storage import line_blocks
from llm_assets.results.rows import Answered, block_lines

if TYPE_CHECKING:
    from llm_assets.resources.storage import ArtifactStorage

CATEGORIES = ("billing", "technical_issue", "account_access", "shipping", "product_feedback")
_ROUND = re.compile(r"-r(\d+)-s\d+$")

# Cumulative thresholds out of 10,000 (see the table above).
_FAULTS = (
    (100, "500"),
    (200, "429"),
    (300, "400"),
    (320, "missing"),
    (330, "expired"),
    (380, "not_json"),
    (430, "bad_label"),
    (480, "short_summary"),
    (510, "truncated"),
    (520, "duplicate"),
)
_RETRYABLE = frozenset({"500", "429", "missing", "expired"})
_SUMMARIES = (
    "The customer reports {w} and asks for help resolving it before the end of the week.",
    "Customer writes about {w}; they have tried the usual steps without success.",
    "A follow-up about {w}, the customer wants a clear answer and a timeline.",
    "The ticket describes {w} and includes the order number for reference.",
)
_WORDS = (
    "a duplicate charge",
    "a login loop",
    "a late parcel",
    "an app crash on start",
    "a missing invoice",
    "a feature request for exports",
)


def fault_of(custom_id: str, round_no: int) -> str | None:
    bucket = zlib.crc32(custom_id.encode()) % 10_000
    for limit, fault in _FAULTS:
        if bucket < limit:
            if fault in _RETRYABLE and round_no > 0:
                return None
            return fault
    return None


def _answer(custom_id: str, fault: str | None) -> str:
    h = zlib.crc32(custom_id.encode(), 7)
    if fault == "not_json":
        return "Sure! The category is billing and the customer wants a refund."
    category = "refund_request" if fault == "bad_label" else CATEGORIES[h % len(CATEGORIES)]
    summary = (
        "Refund."
        if fault == "short_summary"
        else _SUMMARIES[h % len(_SUMMARIES)].format(w=_WORDS[(h >> 4) % len(_WORDS)])
    )
    confidence = round(0.2 + (h % 800) / 1000, 3)
    text = json.dumps({"category": category, "confidence": confidence, "summary": summary})
    return text[: len(text) // 2] if fault == "truncated" else text


def _success(custom_id: str, body: dict[str, Any], fault: str | None, n: int) -> dict[str, Any]:
    content = _answer(custom_id, fault)
    user = body["messages"][-1]["content"]
    prompt_tokens = len(user) // 4 + 40  # the provider's own count; approximate is enough
    out_tokens = body.get("max_tokens", 200) if fault == "truncated" else len(content) // 4 + 1
    return {
        "id": f"batch_req_{n:024x}",
        "custom_id": custom_id,
        "response": {
            "status_code": 200,
            "request_id": f"{n:032x}",
            "body": {
                "id": f"chatcmpl-{n:029x}",
                "object": "chat.completion",
                "created": 1793577600,
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "message": {
                            "role": "assistant",
                            "content": content,
                            "refusal": None,
                            "annotations": [],
                        },
                        "logprobs": None,
                        "finish_reason": "length" if fault == "truncated" else "stop",
                    }
                ],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": out_tokens,
                    "total_tokens": prompt_tokens + out_tokens,
                    "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
                    "completion_tokens_details": {
                        "reasoning_tokens": 0,
                        "audio_tokens": 0,
                        "accepted_prediction_tokens": 0,
                        "rejected_prediction_tokens": 0,
                    },
                },
                "service_tier": "default",
                "system_fingerprint": "fp_bench000000",
            },
        },
        "error": None,
    }


def _failure(custom_id: str, fault: str, n: int) -> dict[str, Any]:
    if fault == "expired":
        return {
            "id": f"batch_req_{n:024x}",
            "custom_id": custom_id,
            "response": None,
            "error": {
                "code": "batch_expired",
                "message": "This request could not be executed before the completion window "
                "expired.",
            },
        }
    status, kind, code, message = {
        "500": (
            500,
            "server_error",
            None,
            "The server had an error while processing your request.",
        ),
        "429": (429, "requests", "rate_limit_exceeded", "Rate limit reached for requests."),
        "400": (400, "invalid_request_error", "invalid_value", "Invalid request (bench)."),
    }[fault]
    return {
        "id": f"batch_req_{n:024x}",
        "custom_id": custom_id,
        "response": {
            "status_code": status,
            "request_id": f"{n:032x}",
            "body": {"error": {"message": message, "type": kind, "param": None, "code": code}},
        },
        "error": None,
    }


class InstantOpenAIProvider(OpenAIBatchProvider):
    """OpenAI request lines; batches that end the moment they are submitted."""

    refuses_after_create: ClassVar[bool] = False
    """No quota: nothing is refused, so submission need not start slowly."""

    output_dir: str

    _stats: dict[str, float] = PrivateAttr(default_factory=dict)

    @property
    def generation_seconds(self) -> float:
        """Time spent producing the provider's answers (not ours; excluded from the bench)."""
        return self._stats.get("generation_seconds", 0.0)

    def _paths(self, batch_id: str) -> tuple[Path, Path, Path]:
        folder = Path(self.output_dir)
        return (
            folder / f"{batch_id}.output.jsonl",
            folder / f"{batch_id}.error.jsonl",
            folder / f"{batch_id}.meta.json",
        )

    def submit(self, shard: ShardSubmission, storage: "ArtifactStorage") -> str:
        batch_id = f"instant-{shard.shard_id}"
        output, errors, meta = self._paths(batch_id)
        if meta.exists():
            return batch_id
        started = time.perf_counter()
        match = _ROUND.search(shard.shard_id)
        round_no = int(match.group(1)) if match else 0
        output.parent.mkdir(parents=True, exist_ok=True)
        counts = {"total": 0, "completed": 0, "failed": 0}
        with output.open("w") as out, errors.open("w") as err:
            for n, raw in enumerate(storage.open_lines(shard.input_uri)):
                request = json.loads(raw)
                cid = request["custom_id"]
                fault = fault_of(cid, round_no)
                counts["total"] += 1
                if fault == "missing":
                    continue
                if fault in ("500", "429", "400", "expired"):
                    err.write(json.dumps(_failure(cid, fault, n)) + "\n")
                    counts["failed"] += 1
                    continue
                line = json.dumps(_success(cid, request["body"], fault, n)) + "\n"
                out.write(line + line if fault == "duplicate" else line)
                counts["completed"] += 1
        meta.write_text(json.dumps(counts))
        self._stats["generation_seconds"] = self.generation_seconds + time.perf_counter() - started
        return batch_id

    def _status_of(self, batch_id: str) -> BatchStatus:
        counts = json.loads(self._paths(batch_id)[2].read_text())
        return BatchStatus(
            provider_batch_id=batch_id,
            state=ShardState.COMPLETED,
            raw_status="completed",
            total=counts["total"],
            completed=counts["completed"],
            failed=counts["failed"],
        )

    def poll(self, provider_batch_id: str) -> BatchStatus:
        return self._status_of(provider_batch_id)

    def cancel(self, provider_batch_id: str) -> BatchStatus:
        return self._status_of(provider_batch_id)

    def output_blocks(self, provider_batch_id: str) -> Iterator[bytes]:
        """The raw provider lines of a batch, output file then error file, in blocks of whole
        lines as they are read."""
        output, errors, _ = self._paths(provider_batch_id)
        for path in (output, errors):
            with path.open("rb") as handle:
                yield from line_blocks(iter(lambda: handle.read(1 << 20), b""))

    def output_lines(self, provider_batch_id: str) -> Iterator[bytes]:
        return block_lines(self.output_blocks(provider_batch_id))

    def result_blocks(
        self, provider_batch_id: str
    ) -> tuple[Iterator[bytes], Callable[[bytes], Answered | ItemResult | None]]:
        return self.output_blocks(provider_batch_id), read_line

    def results(self, provider_batch_id: str) -> Iterator[ItemResult]:
        for raw in self.output_lines(provider_batch_id):
            result = normalize_line(raw)
            if result is not None:
                yield result
