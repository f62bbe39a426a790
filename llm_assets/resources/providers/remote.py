"""What the SDK-backed providers share: keys, endpoints, timeouts and one retry layer."""

from collections.abc import Callable
from typing import Any, TypeVar

import pydantic
from pydantic import PrivateAttr

from llm_assets.resources.providers.base import BatchProvider, resolve_secret
from llm_assets.resources.providers.retrying import call_with_retries, create_once

T = TypeVar("T")


class RemoteBatchProvider(BatchProvider):
    """A batch API reached through its official SDK, with the SDK's own retries off."""

    api_key: str | None = pydantic.Field(
        default=None, description="Unset: the SDK reads its standard key variable."
    )
    base_url: str | None = pydantic.Field(
        default=None, description="Unset: the SDK reads its standard base-URL variable."
    )
    timeout_seconds: float = 60.0
    max_attempts: int = pydantic.Field(default=6, ge=1)
    retry_base_seconds: float = 1.0
    retry_cap_seconds: float = 60.0
    max_retry_after_seconds: float = 120.0

    _client: Any = PrivateAttr(default=None)

    def make_client(self, api_key: str | None) -> Any:
        raise NotImplementedError

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = self.make_client(resolve_secret(self.api_key))
        return self._client

    def call(self, describe: str, fn: Callable[[], T]) -> T:
        """A control-plane call: transient failures retried with backoff and Retry-After."""
        return call_with_retries(
            fn,
            attempts=self.max_attempts,
            base_seconds=self.retry_base_seconds,
            cap_seconds=self.retry_cap_seconds,
            max_retry_after_seconds=self.max_retry_after_seconds,
            describe=f"{type(self).__name__} {describe}",
        )

    def create_once(self, create: Callable[[], T], find_existing: Callable[[], T | None]) -> T:
        """A create that costs money: reconciled, never blindly retried."""
        return create_once(
            create,
            find_existing,
            attempts=self.max_attempts,
            base_seconds=self.retry_base_seconds,
            cap_seconds=self.retry_cap_seconds,
            max_retry_after_seconds=self.max_retry_after_seconds,
        )
