"""The fake Gemini's batch lifecycle: a GenerateContentBatch as the long-running Operation
the API returns, its state machine, and the responses file it ends with.

Wire shape (checked against google-genai's `_BatchJob_from_mldev`, which reads `name` and
`metadata.{displayName,state,createTime,updateTime,endTime,model,output}`, and against
Operations recorded from the live API in public client code):

    {"name": "batches/<id>",
     "metadata": {"@type": ".../GenerateContentBatch", "model": "models/<m>",
                  "displayName", "inputConfig": {"fileName"}, "createTime", "updateTime",
                  "endTime"?, "batchStats": {"requestCount": "9", ...},
                  "state": "BATCH_STATE_*", "name", "output": {"responsesFile"}?},
     "done": true?, "response": {"@type": ".../GenerateContentBatchOutput",
                                 "responsesFile": "files/batch-<id>"}?, "error"?}

batchStats counts are int64, so strings, and zero counts are left out (proto3 JSON). The
SDK maps BATCH_STATE_* to JobState JOB_STATE_*.
"""

import json
import random
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

from tests.fakes.common import PrefixCache
from tests.fakes.gemini_model import (
    LINE_FAULTS,
    answer_line,
    blocked_line,
    default_responder,
    embedding_line,
    error_line,
    rfc3339,
    system_text,
)

JSON = dict[str, Any]
ACTIVE = ("BATCH_STATE_PENDING", "BATCH_STATE_RUNNING")
OUTCOMES = ("succeeded", "failed", "expired", "cancelled_after_partial")
_TYPES = "type.googleapis.com/google.ai.generativelanguage.v1main."
BATCH_TYPES = {"generate": f"{_TYPES}GenerateContentBatch", "embed": f"{_TYPES}EmbedContentBatch"}
OUTPUT_TYPES = {
    "generate": f"{_TYPES}GenerateContentBatchOutput",
    "embed": f"{_TYPES}EmbedContentBatchOutput",
}


def operation(batch: JSON) -> JSON:
    """The Operation the API answers for a batch."""
    meta: JSON = {
        "@type": BATCH_TYPES[batch["kind"]],
        "model": batch["model"],
        "displayName": batch["displayName"],
        "inputConfig": {"fileName": batch["inputFile"]},
        "createTime": batch["createTime"],
        "updateTime": batch["updateTime"],
    }
    if batch.get("endTime"):
        meta["endTime"] = batch["endTime"]
    stats = {"requestCount": batch["requests"], **batch["counts"]}
    meta["batchStats"] = {name: str(n) for name, n in stats.items() if n}
    meta["state"] = batch["state"]
    meta["name"] = batch["name"]
    if batch.get("responsesFile"):
        meta["output"] = {"responsesFile": batch["responsesFile"]}
    op: JSON = {"name": batch["name"], "metadata": meta}
    if batch["state"] not in ACTIVE:
        op["done"] = True
        if batch.get("error"):
            op["error"] = batch["error"]
        elif batch.get("responsesFile"):
            output_type = OUTPUT_TYPES[batch["kind"]]
            op["response"] = {"@type": output_type, "responsesFile": batch["responsesFile"]}
    return op


def parse_input(data: bytes) -> tuple[list[JSON], str | None]:
    """(request lines, problem) of a batch input file: each line `{"key", "request"}`."""
    lines: list[JSON] = []
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except ValueError:
            return [], f"Line {number} of the input file is not valid JSON."
        if not isinstance(obj, dict) or not isinstance(obj.get("request"), dict):
            return [], f"Line {number} of the input file has no `request` object."
        lines.append(obj)
    if not lines:
        return [], "The input file has no requests."
    return lines, None


class BatchLifecycle:
    """PENDING -> RUNNING -> SUCCEEDED | FAILED | EXPIRED | CANCELLED, one state per
    `polls_per_state` gets; the lines run when the batch leaves RUNNING (or is cancelled
    while running), and the responses file is written then."""

    polls_per_state: int
    line_fault: Callable[[str, JSON], str | None] | None
    batch_outcome: Callable[[JSON], str] | None
    shuffle_output: bool
    responder: Callable[[JSON], str] | None
    prefix_cache: PrefixCache
    billed: Counter[str]
    batches: dict[str, JSON]
    _lock: threading.RLock

    def read_input(self, file_name: str) -> bytes:
        raise NotImplementedError

    def write_output(self, batch: JSON, content: bytes) -> str:
        raise NotImplementedError

    def advance(self, batch: JSON) -> None:
        """Count one poll, moving the batch on when its state has lasted long enough."""
        while batch["state"] in ACTIVE and batch["_served"] >= self.polls_per_state:
            self._step(batch)
            batch["_served"] = 0
        batch["_served"] += 1

    def _step(self, batch: JSON) -> None:
        now = rfc3339()
        batch["updateTime"] = now
        if batch["state"] == "BATCH_STATE_PENDING":
            lines, problem = parse_input(self.read_input(batch["inputFile"]))
            if problem is not None:
                self._fail(batch, 400, problem, "INVALID_ARGUMENT")
                return
            outcome = self.batch_outcome(operation(batch)) if self.batch_outcome else "succeeded"
            if outcome not in OUTCOMES:
                raise ValueError(f"batch_outcome returned {outcome!r}; expected one of {OUTCOMES}")
            batch["_outcome"] = outcome
            batch["requests"] = len(lines)
            if outcome == "failed":
                self._fail(batch, 500, "The batch failed while processing.", "INTERNAL")
                return
            batch["state"] = "BATCH_STATE_RUNNING"
            batch["counts"] = {"pendingRequestCount": len(lines)}
            return
        outcome = batch["_outcome"]
        if outcome == "expired":
            self.finish(batch, "BATCH_STATE_EXPIRED")
        elif outcome == "cancelled_after_partial":
            self.finish(batch, "BATCH_STATE_CANCELLED")
        else:
            self.finish(batch, "BATCH_STATE_SUCCEEDED")

    def _fail(self, batch: JSON, code: int, message: str, status: str) -> None:
        batch.update(
            state="BATCH_STATE_FAILED",
            endTime=rfc3339(),
            error={"code": code, "message": message, "status": status},
        )

    def finish(self, batch: JSON, state: str) -> None:
        """Run the lines (only the first half when the batch expires or is cancelled part
        way: the rest never run and have no line), then write the responses file."""
        lines, _ = parse_input(self.read_input(batch["inputFile"]))
        done = len(lines) if state == "BATCH_STATE_SUCCEEDED" else len(lines) // 2
        output: list[JSON] = []
        succeeded = failed = 0
        for line in lines[:done]:
            key, request = str(line.get("key", "")), line["request"]
            fault = self.line_fault(key, request) if self.line_fault else None
            if fault is not None and fault not in LINE_FAULTS:
                raise ValueError(f"line_fault returned {fault!r}; expected None or {LINE_FAULTS}")
            if fault in ("invalid_argument", "429", "500"):
                output.append(error_line(key, fault))
                failed += 1
                continue
            self.billed[key] += 1
            succeeded += 1
            if fault in ("safety", "prompt_blocked"):
                output.append(blocked_line(key, request, fault, batch["model"])[0])
                continue
            if fault == "missing":
                continue
            if batch["kind"] == "embed":
                result = embedding_line(key, request)
            else:
                text = (self.responder or default_responder)(request)
                prefix = system_text(request)
                cached = self.prefix_cache.read(batch["model"], prefix, len(prefix.split()))
                result, _, _ = answer_line(key, request, text, batch["model"], cached)
            output += [result, result] if fault == "duplicate" else [result]
        self.prefix_cache.settle()
        if self.shuffle_output and len(output) > 1:
            original = list(output)
            random.Random(batch["name"]).shuffle(output)
            if output == original:
                output.append(output.pop(0))
        content = "".join(json.dumps(line) + "\n" for line in output).encode()
        batch["responsesFile"] = self.write_output(batch, content) if lines[:done] else None
        counts = {"successfulRequestCount": succeeded, "failedRequestCount": failed}
        if done < len(lines):
            counts["pendingRequestCount"] = len(lines) - done
        now = rfc3339()
        batch.update(state=state, counts=counts, endTime=now, updateTime=now)
