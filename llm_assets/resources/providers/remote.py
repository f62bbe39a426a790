"""What the SDK-backed batch providers share: keys, endpoints, timeouts, one retry layer, and
the submit / poll / cancel shape of a batch API that lists, retrieves and cancels batches.

A batch created just before a crash must be found again instead of paid for twice: each
adapter says how it recognizes its shard's batch (`find_existing`), and submission looks for
it before creating one and whenever a create's outcome is unknown.
"""

import datetime as dt
import functools
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import pydantic
from pydantic import PrivateAttr

from llm_assets.resources.providers.base import (
    BatchProvider,
    BatchStatus,
    ShardSubmission,
    resolve_secret,
)
from llm_assets.resources.providers.retrying import (
    MAX_RETRY_AFTER_SECONDS,
    call_with_retries,
    create_once,
    status_of,
)
from llm_assets.util.secrecy import mask_url

if TYPE_CHECKING:
    from llm_assets.resources.storage import ArtifactStorage

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
    max_retry_after_seconds: float = MAX_RETRY_AFTER_SECONDS
    """The longest one wait for a server's Retry-After lasts (a hint of hours included)."""
    reconcile_page_limit: int = pydantic.Field(
        default=100, description="Pages of batches looked through for a shard's lost batch."
    )

    _client: Any = PrivateAttr(default=None)
    _client_lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    def quota_account(self) -> str:
        return mask_url(self.base_url)[:256] if self.base_url else "default"

    def make_client(self, api_key: str | None) -> Any:
        raise NotImplementedError

    def batches_api(self) -> Any:
        """The SDK's batches resource: `list`, `retrieve` and `cancel`."""
        raise NotImplementedError

    def batch_status(self, batch: Any) -> BatchStatus:
        """A batch object of the SDK as a BatchStatus."""
        raise NotImplementedError

    def find_existing(self, shard: ShardSubmission) -> str | None:
        """The batch an earlier attempt created for this shard since `shard.intent_at`."""
        raise NotImplementedError

    def sdk_client(self, client_class: Callable[..., T], api_key: str | None) -> T:
        """The SDK's client with this resource's key, base URL and timeout, its retries off."""
        return client_class(
            api_key=api_key,
            base_url=self.base_url,
            timeout=self.timeout_seconds,
            max_retries=0,
        )

    @property
    def client(self) -> Any:
        """One client per resource, also when its first calls come from several threads at
        once (a sensor tick polls on eight): a second client made in a race would be dropped
        while its calls run, and google-genai's client closes its connections when collected."""
        if self._client is None:
            with self._client_lock:
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

    def delete_if_present(
        self, describe: str, fn: Callable[[], object], absent: tuple[int, ...] = (404,)
    ) -> bool:
        """A delete, retried as any control-plane call; False when the thing was gone already
        (a status in `absent`), so a deletion cut short can be asked for again."""
        try:
            self.call(describe, fn)
        except Exception as exc:
            if status_of(exc) in absent:
                return False
            raise
        return True

    def poll(self, provider_batch_id: str) -> BatchStatus:
        batch = self.call("retrieve", lambda: self.batches_api().retrieve(provider_batch_id))
        return self.batch_status(batch)

    def poll_briefly(self, provider_batch_id: str, timeout_seconds: float) -> BatchStatus:
        """One retrieve with the SDK's per-request timeout, not retried."""
        batch = self.batches_api().retrieve(provider_batch_id, timeout=timeout_seconds)
        return self.batch_status(batch)

    def cancel(self, provider_batch_id: str) -> BatchStatus:
        batch = self.call("cancel", lambda: self.batches_api().cancel(provider_batch_id))
        return self.batch_status(batch)

    def batch_pages(self, cursor: str) -> Iterator[list[Any]]:
        """The batches, newest first, a page at a time (at most `reconcile_page_limit`);
        `cursor` is the SDK's name for "after this id". The caller stops early by breaking."""
        after: str | None = None
        for _ in range(self.reconcile_page_limit):
            kwargs: dict[str, Any] = {"limit": 100}
            if after:
                kwargs[cursor] = after
            page = self.call("list batches", functools.partial(self.batches_api().list, **kwargs))
            batches = list(page.data)
            yield batches
            if not batches or not page.has_more:
                return
            after = batches[-1].id

    def find_submitted(self, shard: ShardSubmission) -> str | None:
        return self.find_existing(shard)

    def submit(self, shard: ShardSubmission, storage: "ArtifactStorage") -> str:
        """The batch of an earlier attempt that recorded its intent but not a batch id, else
        a new one (`create_batch`)."""
        existing = self.find_existing(shard) if shard.intent_at is not None else None
        if existing is not None:
            return existing
        return self.create_batch(shard, storage)

    def create_batch(self, shard: ShardSubmission, storage: "ArtifactStorage") -> str:
        """Create the shard's batch, through `create_reconciled`."""
        raise NotImplementedError

    def create_reconciled(self, shard: ShardSubmission, create: Callable[[], str]) -> str:
        """A create that costs money: when its outcome is unknown, the batch it may have made
        is looked for (as created since this attempt) instead of creating another."""
        attempt_at = dt.datetime.now(dt.UTC)
        return self.create_once(
            create, lambda: self.find_existing(shard.model_copy(update={"intent_at": attempt_at}))
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
