"""Gemini Batch Mode (the Gemini Developer API) through the official google-genai SDK.

A shard's JSONL file is uploaded through the Files API and becomes one batch job whose
`display_name` is the shard id (`batches.create`, or `batches.create_embeddings` when the
spec's output is an embedding). The create call has no idempotency key: after a crash
between create and record, or a create whose answer was lost, the adapter lists the
project's batch jobs and adopts the one named for the shard; two such jobs stop the run for
an operator. The SDK's own retries stay off (its retry of a create that took effect would
pay for a second batch); control-plane calls are retried here.

The key and base URL come from the SDK's own variables unless the resource sets them:
GOOGLE_API_KEY, else GEMINI_API_KEY, and GOOGLE_GEMINI_BASE_URL. The SDK drops a batch's
request counts and error from what it returns, so statuses carry the state alone; each
result line says how its request went.
"""

import functools
import tempfile
import warnings
from collections.abc import Callable, Iterator
from typing import IO, TYPE_CHECKING, Any, ClassVar, Literal

from llm_assets.resources.providers.base import (
    AmbiguousSubmission,
    BatchStatus,
    ItemResult,
    RequestItem,
    ShardFiles,
    ShardState,
    ShardSubmission,
)
from llm_assets.resources.providers.gemini_lines import read_line
from llm_assets.resources.providers.gemini_requests import (
    gemini_spec_problems,
    is_embedding,
    request_line,
)
from llm_assets.resources.providers.remote import RemoteBatchProvider
from llm_assets.resources.providers.retrying import is_transient
from llm_assets.resources.storage_lines import line_blocks
from llm_assets.results.rows import Answered

if TYPE_CHECKING:
    from llm_assets.resources.storage import ArtifactStorage
    from llm_assets.spec.model import PipelineSpec

API_VERSION = "v1beta"
"""Batch Mode's API version (the SDK's default, v1, has no batches)."""
STATUS_MAP = {
    "JOB_STATE_QUEUED": ShardState.SUBMITTED,
    "JOB_STATE_PENDING": ShardState.SUBMITTED,
    "JOB_STATE_RUNNING": ShardState.RUNNING,
    "JOB_STATE_UPDATING": ShardState.RUNNING,
    "JOB_STATE_PAUSED": ShardState.RUNNING,
    "JOB_STATE_CANCELLING": ShardState.RUNNING,
    # A job that succeeded may still hold failed lines: each is judged when imported.
    "JOB_STATE_SUCCEEDED": ShardState.COMPLETED,
    "JOB_STATE_PARTIALLY_SUCCEEDED": ShardState.COMPLETED,
    "JOB_STATE_FAILED": ShardState.FAILED,
    "JOB_STATE_CANCELLED": ShardState.CANCELLED,
    "JOB_STATE_EXPIRED": ShardState.EXPIRED,
}
_NOT_ADOPTED = ("JOB_STATE_FAILED", "JOB_STATE_CANCELLED", "JOB_STATE_CANCELLING")
"""A job in these states is never taken for a shard's lost one: an operator resolves two
candidates by cancelling the one that is not the shard's."""
_CHUNK = 1 << 20


def state_of(batch: Any) -> str:
    """A BatchJob's state as the SDK names it (JOB_STATE_*)."""
    state = batch.state
    return str(getattr(state, "value", state) or "JOB_STATE_UNSPECIFIED")


class GeminiBatchProvider(RemoteBatchProvider):
    """Files API + Batch Mode; control-plane calls retried here, not inside the SDK."""

    line_id_field = "key"
    prompt_cache: ClassVar[Literal["marked", "automatic"] | None] = "automatic"

    def make_client(self, api_key: str | None) -> Any:
        from google import genai
        from google.genai import types

        return genai.Client(
            vertexai=False,
            api_key=api_key,
            http_options=types.HttpOptions(
                api_version=API_VERSION,
                base_url=self.base_url,
                timeout=int(self.timeout_seconds * 1000),
                retry_options=None,
            ),
        )

    def batches_api(self) -> Any:
        return self.client.batches

    def spec_problems(self, spec: "PipelineSpec") -> list[tuple[str, str]]:
        return gemini_spec_problems(spec)

    def request_format(self, spec: "PipelineSpec") -> str:
        return "embeddings" if is_embedding(spec) else "generate"

    def request_line(self, spec: "PipelineSpec", item: RequestItem) -> dict[str, Any]:
        return request_line(spec, item)

    def realtime_request(self, line: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        return str(line["key"]), line["request"]

    # Submission

    def create_batch(self, shard: ShardSubmission, storage: "ArtifactStorage") -> str:
        with storage.local_copy(shard.input_uri) as path:
            # Uploads cost nothing: one whose answer was lost is simply made again.
            uploaded = self.call(
                "upload",
                lambda: self.client.files.upload(
                    file=path,
                    config={"mime_type": "application/jsonl", "display_name": shard.shard_id},
                ),
            )
        config = {"display_name": shard.shard_id}

        def create() -> str:
            if shard.format == "embeddings":
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # create_embeddings is marked experimental
                    batch = self.batches_api().create_embeddings(
                        model=shard.model, src={"file_name": uploaded.name}, config=config
                    )
            else:
                batch = self.batches_api().create(
                    model=shard.model, src=uploaded.name, config=config
                )
            return str(batch.name)

        return self.create_reconciled(shard, create)

    def batch_pages(self, cursor: str = "page_token") -> Iterator[list[Any]]:
        """The project's batch jobs a page at a time (at most `reconcile_page_limit`)."""
        token: str | None = None
        for _ in range(self.reconcile_page_limit):
            config: dict[str, Any] = {"page_size": 100}
            if token:
                config[cursor] = token
            pager = self.call(
                "list batches", functools.partial(self.batches_api().list, config=config)
            )
            yield list(pager.page)
            token = pager.config.get("page_token")
            if not token:
                return

    def find_existing(self, shard: ShardSubmission) -> str | None:
        """The live batch job named for this shard, if any. Gemini lists jobs without a
        filter, so every page is read (up to `reconcile_page_limit`): the order of the list
        is not documented, so no page can be said to be too old to hold it."""
        found = [
            str(batch.name)
            for batches in self.batch_pages()
            for batch in batches
            if batch.display_name == shard.shard_id
            and batch.name not in shard.known_batch_ids
            and state_of(batch) not in _NOT_ADOPTED
        ]
        if len(found) > 1:
            raise AmbiguousSubmission(
                f"shard {shard.shard_id} has {len(found)} Gemini batch jobs ({found}); "
                "nothing was submitted. Cancel the ones that are not this shard's, then run "
                "again"
            )
        return found[0] if found else None

    # Status

    def batch_status(self, batch: Any) -> BatchStatus:
        state = state_of(batch)
        message = None
        if STATUS_MAP.get(state) == ShardState.FAILED:
            message = "the batch job failed; Gemini's reason is in the API's batch view"
        return BatchStatus(
            provider_batch_id=str(batch.name),
            state=STATUS_MAP.get(state, ShardState.RUNNING),
            raw_status=state.removeprefix("JOB_STATE_").lower(),
            message=message,
        )

    def poll(self, provider_batch_id: str) -> BatchStatus:
        return self.batch_status(self._get(provider_batch_id))

    def poll_briefly(self, provider_batch_id: str, timeout_seconds: float) -> BatchStatus:
        """One get with a per-request timeout, not retried."""
        batch = self.batches_api().get(
            name=provider_batch_id,
            config={"http_options": {"timeout": max(1, int(timeout_seconds * 1000))}},
        )
        return self.batch_status(batch)

    def cancel(self, provider_batch_id: str) -> BatchStatus:
        self.call("cancel", lambda: self.batches_api().cancel(name=provider_batch_id))
        return self.poll(provider_batch_id)

    def _get(self, provider_batch_id: str) -> Any:
        return self.call("get", lambda: self.batches_api().get(name=provider_batch_id))

    # Results

    def result_blocks(
        self, provider_batch_id: str
    ) -> tuple[Iterator[bytes], Callable[[bytes], Answered | ItemResult | None]]:
        return self._result_blocks(provider_batch_id), read_line

    def responses_file(self, provider_batch_id: str) -> str | None:
        """The name of an ended batch job's responses file (None: it has none, as a job that
        failed before running any request)."""
        batch = self._get(provider_batch_id)
        if STATUS_MAP.get(state_of(batch)) not in (
            ShardState.COMPLETED,
            ShardState.FAILED,
            ShardState.EXPIRED,
            ShardState.CANCELLED,
        ):
            raise RuntimeError(
                f"Gemini batch {provider_batch_id} has not ended ({state_of(batch)})"
            )
        dest = batch.dest
        return str(dest.file_name) if dest is not None and dest.file_name else None

    def _result_blocks(self, provider_batch_id: str) -> Iterator[bytes]:
        """The responses file in blocks of whole lines. The SDK downloads into a stream it
        writes to, so the file goes to an anonymous temporary file first and is read from
        there: memory stays flat whatever the file's size."""
        file_name = self.responses_file(provider_batch_id)
        if file_name is None:
            return
        with tempfile.TemporaryFile(prefix="llm-assets-gemini-") as spool:
            self._download(file_name, spool)
            spool.seek(0)
            yield from line_blocks(iter(lambda: spool.read(_CHUNK), b""))

    def _download(self, file_name: str, spool: IO[bytes]) -> None:
        """The whole file into `spool`; a transient failure starts the download again."""
        for attempt in range(self.max_attempts):
            spool.seek(0)
            spool.truncate()
            try:
                self.client.files.download(file=file_name, destination=spool)
                return
            except Exception as exc:
                if not is_transient(exc) or attempt == self.max_attempts - 1:
                    raise

    # Retention

    def delete_files(self, shard: ShardFiles) -> list[str]:
        """The shard's files at Google: its uploaded input (every upload named for the
        shard, those of an upload retried after a lost answer included) and its batch job's
        responses file. The batch job, which holds neither, stays. Google answers a file that
        does not exist (deleted, or expired after its 48 hours) with 403 PERMISSION_DENIED, as
        it does a file of another project: either way nothing of ours is left to delete."""
        names: list[str] = []
        responses = self.responses_file(shard.provider_batch_id)
        if responses is not None:
            names.append(responses)
        token: str | None = None
        for _ in range(self.reconcile_page_limit):
            config: dict[str, Any] = {"page_size": 100}
            if token:
                config["page_token"] = token
            pager = self.call(
                "list files", functools.partial(self.client.files.list, config=config)
            )
            names += [str(f.name) for f in pager.page if f.display_name == shard.shard_id]
            token = pager.config.get("page_token")
            if not token:
                break
        return [
            name
            for name in names
            if self.delete_if_present(
                "delete file",
                functools.partial(self.client.files.delete, name=name),
                absent=(403, 404),
            )
        ]
