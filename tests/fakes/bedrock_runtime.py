"""The fake Bedrock's runtime plane (`bedrock-runtime`): InvokeModel and Converse, behind a
requests-per-minute gate and a model allow-list, answering what a batch record with the same
body gets.

`RuntimeCalls` is a mixin of FakeBedrock: it reads the fake's knobs (declared below).
"""

import json
import threading
from collections import deque
from collections.abc import Callable, Collection
from datetime import datetime
from typing import Any

from tests.fakes.base import Reply
from tests.fakes.bedrock_api import (
    FAULT_MESSAGES,
    RECORD_ERRORS,
    RUNTIME_OPERATIONS,
    RUNTIME_RECORD_ERRORS,
    AwsError,
)
from tests.fakes.bedrock_jobs import RecordFault
from tests.fakes.bedrock_model import Responder, model_answer
from tests.fakes.common import CallLog

JSON = dict[str, Any]


class RuntimeCalls:
    """InvokeModel and Converse: gate, model check, body, record fault, then the answer."""

    calls: CallLog
    clock: Callable[[], datetime]
    record_fault: RecordFault | None
    responder: Responder | None
    runtime_rpm: int | None
    runtime_models: Collection[str] | None
    _runtime_window: deque[float]
    _lock: threading.RLock

    def runtime_successes(self) -> dict[str, int]:
        """Record id -> how many runtime calls for it were answered 200, from `calls`.

        A call whose response a `LostResponseFault` dropped counts: the model ran (and AWS
        bills it) though the client never saw the answer. Calls without the custom id header
        are not counted. "No item succeeded twice" is `max(counts.values()) == 1`.
        """
        counts: dict[str, int] = {}
        for entry in self.calls.entries():
            record_id = entry.get("record_id")
            if (
                entry.get("operation") in RUNTIME_OPERATIONS.values()
                and entry.get("status") == 200
                and record_id is not None
            ):
                counts[record_id] = counts.get(record_id, 0) + 1
        return counts

    def _admit_runtime_call(self) -> None:
        """The `runtime_rpm` gate: a ThrottlingException once the rolling minute is full."""
        limit = self.runtime_rpm
        if limit is None:
            return
        now = self.clock().timestamp()
        with self._lock:
            window = self._runtime_window
            while window and window[0] <= now - 60:
                window.popleft()
            if len(window) >= limit:
                raise AwsError("ThrottlingException", FAULT_MESSAGES[429], 429)
            window.append(now)

    def _runtime(
        self, operation: str, model_id: str, body: bytes, request_id: str, log: JSON
    ) -> Reply:
        """InvokeModel or Converse: gate, model check, body, record fault, then the answer."""
        self._admit_runtime_call()
        if self.runtime_models is not None and model_id not in self.runtime_models:
            raise AwsError(
                "ResourceNotFoundException",
                "Could not resolve the foundation model from the provided model identifier.",
                404,
            )
        try:
            model_input = json.loads(body or b"")
        except ValueError:
            model_input = None
        if not isinstance(model_input, dict):
            message = (
                RECORD_ERRORS["error"][1]
                if operation == "InvokeModel"
                else "The request body is not a JSON object."
            )
            raise AwsError("ValidationException", message)
        record_id = log.get("record_id")
        fault = self.record_fault(record_id, model_input) if self.record_fault else None
        if fault is not None:
            if fault not in RUNTIME_RECORD_ERRORS:
                raise ValueError(f"record_fault returned {fault!r} for {record_id!r}")
            status, code, message = RUNTIME_RECORD_ERRORS[fault]
            raise AwsError(code, message, status)
        answer = model_answer(
            model_input,
            converse=operation == "Converse",
            model_id=model_id,
            message_key=request_id,
            responder=self.responder,
        )
        if answer.error is not None:
            raise AwsError("ValidationException", answer.error)
        assert answer.output is not None
        log.update(input_tokens=answer.input_tokens, output_tokens=answer.output_tokens)
        headers: dict[str, str] = {}
        if operation == "InvokeModel":
            headers = {
                "X-Amzn-Bedrock-Input-Token-Count": str(answer.input_tokens),
                "X-Amzn-Bedrock-Output-Token-Count": str(answer.output_tokens),
                "X-Amzn-Bedrock-Invocation-Latency": str(answer.latency_ms),
            }
        return Reply(200, answer.output, headers=headers)
