"""Bedrock's on-demand path, and how AWS errors are classified.

A shard that merging could not bring to Bedrock's minimum records per job is, when the spec
says `bedrock.below_minimum: online`, sent request by request through `bedrock-runtime`
(InvokeModel for Anthropic bodies, Converse otherwise) by the provider_batches step, with the
online provider's worker doing the pacing, rate-limit pauses, retries and checkpoints.
"""

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from llm_assets.resources.providers.bedrock_records import input_format, normalize_record
from llm_assets.resources.providers.online import (
    OnlineSettings,
    OnlineStats,
    RateLimited,
    Transient,
)
from llm_assets.results.rows import ItemResult

if TYPE_CHECKING:
    from llm_assets.spec.model import PipelineSpec

CUSTOM_ID_HEADER = "X-Llm-Assets-Custom-Id"
"""Sent with every bedrock-runtime call, so a call can be traced back to its item."""
_RATE_LIMIT_CODES = {
    "ThrottlingException",
    "ModelNotReadyException",
    "ServiceQuotaExceededException",
}
_TRANSIENT_CODES = {
    "ThrottlingException",
    "ServiceUnavailableException",
    "InternalServerException",
    "ServiceQuotaExceededException",
    "RequestTimeout",
    "RequestTimeoutException",
}

Send = Callable[[str, dict[str, Any]], Awaitable[tuple[ItemResult, None]]]


def is_transient_aws(exc: BaseException) -> bool:
    """Whether an AWS call's error is worth retrying: connection trouble, throttling, 5xx."""
    name = type(exc).__name__
    if name in (
        "EndpointConnectionError",
        "ConnectionClosedError",
        "ReadTimeoutError",
        "ConnectTimeoutError",
    ):
        return True
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return False
    code = response.get("Error", {}).get("Code")
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
    return code in _TRANSIENT_CODES or status == 429 or status >= 500


def _client_error(custom_id: str, exc: Any) -> tuple[ItemResult, None]:
    """A runtime call's ClientError as the item's failure, or raised for the worker to pause
    (rate limit) or retry (transient)."""
    code = str(exc.response.get("Error", {}).get("Code") or "error")
    status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
    if code in _RATE_LIMIT_CODES or status == 429:
        raise RateLimited(None) from exc
    message = str(exc.response.get("Error", {}).get("Message") or exc)[:1000]
    transient = is_transient_aws(exc) or status == 408  # ModelTimeoutException
    failure = ItemResult(
        custom_id=custom_id,
        succeeded=False,
        status_code=status or None,
        error_class="transient" if transient else "deterministic",
        error_code=code,
        error_message=message,
    )
    if failure.error_class == "transient":
        raise Transient(failure) from exc
    return failure, None


class OnDemandRuntime:
    """A bedrock-runtime client for one on-demand run. boto3's own retries are off (the
    worker retries); each call carries its custom_id in a header."""

    def __init__(
        self,
        region_name: str | None,
        endpoint_url: str | None,
        settings: OnlineSettings,
        spec: "PipelineSpec",
    ) -> None:
        import boto3
        from botocore.config import Config

        self.client = boto3.client(
            "bedrock-runtime",
            region_name=region_name,
            endpoint_url=endpoint_url,
            config=Config(
                retries={"total_max_attempts": 1, "mode": "standard"},
                read_timeout=settings.timeout_seconds,
                max_pool_connections=settings.concurrency,
            ),
        )
        self.client.meta.events.register("before-call.bedrock-runtime", self._add_custom_id)
        self.concurrency = settings.concurrency
        self.converse = input_format(spec) == "converse"
        self.model = spec.model.name
        self._calling = threading.local()

    def _add_custom_id(self, params: dict[str, Any], **_: Any) -> None:
        custom_id = getattr(self._calling, "custom_id", None)
        if custom_id:
            params.setdefault("headers", {})[CUSTOM_ID_HEADER] = custom_id

    async def run(self, work: Callable[[Send], Awaitable[OnlineStats]]) -> OnlineStats:
        """Run the worker `work` with a `send` that calls bedrock-runtime on a thread pool
        (boto3 blocks: each request in flight holds one thread)."""
        pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="bedrock-runtime")
        loop = asyncio.get_running_loop()

        async def send(custom_id: str, body: dict[str, Any]) -> tuple[ItemResult, None]:
            return await loop.run_in_executor(pool, self.invoke, custom_id, body)

        try:
            return await work(send)
        finally:
            pool.shutdown(wait=True)

    def invoke(self, custom_id: str, body: dict[str, Any]) -> tuple[ItemResult, None]:
        """One request (a record's modelInput) by InvokeModel or Converse, as an ItemResult."""
        from botocore.exceptions import BotoCoreError, ClientError

        self._calling.custom_id = custom_id
        try:
            if self.converse:
                output = dict(self.client.converse(modelId=self.model, **body))
                output.pop("ResponseMetadata", None)
            else:
                answer = self.client.invoke_model(
                    modelId=self.model,
                    body=json.dumps(body).encode(),
                    contentType="application/json",
                    accept="application/json",
                )
                output = json.loads(answer["body"].read())
        except ClientError as exc:
            return _client_error(custom_id, exc)
        except BotoCoreError as exc:  # connection reset, read timeout, endpoint unreachable
            raise Transient(
                ItemResult(
                    custom_id=custom_id,
                    succeeded=False,
                    error_class="transient",
                    error_code=type(exc).__name__,
                    error_message=str(exc)[:1000],
                )
            ) from exc
        finally:
            self._calling.custom_id = None
        result = normalize_record({"recordId": custom_id, "modelOutput": output})
        assert result is not None
        return result, None
