"""Day summaries for people: what a finished or failed day did, and when to worry.

A `PartitionSummary` is built from the ledger (`summarize`). The cost report carries the
day's summary as its metadata (`day_summary`, `outcome`), and every path that finishes a day
announces it with the same summary: the notification sensors (defs/notification_sensors.py)
for the code location's runs, `run_days` (defs/runner.py) for `llm-assets run` and the demo.
`announce` claims the summary's fingerprint in the ledger, and only the claimer posts it, when
the spec's webhook variable is set, as Slack-compatible JSON (`{"text": ...}`, which Slack,
Mattermost, Rocket.Chat and Teams' incoming-webhook bridges accept). So one day state is
announced once, whichever paths, runs and ticks see it; a day that changes (a requeue
finishes it again with other counts, a failure after it finished) is announced again.
A failed run is the day's outcome only when nothing under way finishes the day (`under_way`).
"""

import datetime as dt
import hashlib
import json
import os
import urllib.error
import urllib.request
from typing import Any, Literal

from pydantic import BaseModel

from llm_assets.items import ids
from llm_assets.resources.ledger import JobCounts, LedgerResource, utcnow
from llm_assets.resources.providers.base import IN_FLIGHT_STATES
from llm_assets.spec.model import PipelineSpec
from llm_assets.steps.lifecycle import GATED
from llm_assets.util.secrecy import webhook_url_problem
from llm_assets.util.words import dead_letter_words, plural

Outcome = Literal["finished", "failed", "in progress"]

_TIMING = frozenset({"duration_seconds", "run_id"})
"""What a summary of the same day state says differently each time it is made."""


class PartitionSummary(BaseModel):
    pipeline: str
    date: dt.date
    outcome: Outcome
    """"finished" (every item terminal, the cost report written), "failed" (a run failed
    and nothing under way finishes the day) or "in progress" (a cost report of a day with
    items still open)."""
    job_id: str | None = None
    items: int = 0
    succeeded: int = 0
    dead_letters: int = 0
    dead_letters_by_class: dict[str, int] = {}
    open_items: int = 0
    cost_usd: float = 0.0
    duration_seconds: float | None = None
    dead_letter_rate: float = 0.0
    alerts: list[str] = []
    blocked: str | None = None
    """Why the day was not published, e.g. "blocked by quality_failure_rate (25.8% > 5.0%)"."""
    reason: str | None = None
    run_id: str | None = None

    def lines(self) -> list[str]:
        head = f"{self.pipeline} {self.date}: {self.outcome}"
        if self.blocked:
            head += ", not published"
        if self.alerts:
            head = f"ALERT {head} ({'; '.join(self.alerts)})"
        parts = [
            head,
            f"{plural(self.items, 'item')}: {self.succeeded:,} succeeded, "
            + dead_letter_words(self.dead_letters, self.dead_letters_by_class)
            + (f", {self.open_items:,} still open" if self.open_items else ""),
            f"cost ${self.cost_usd:.4f}"
            + (
                f", {self.duration_seconds / 60:.1f} min since the day's job was created"
                if self.duration_seconds is not None
                else ""
            ),
        ]
        if self.blocked:
            parts.append(f"publication {self.blocked}")
        if self.reason:
            parts.append(f"reason: {self.reason}")
        if self.run_id:
            parts.append(f"run {self.run_id}")
        return parts

    def text(self) -> str:
        """The summary as the webhook and the sensor's log show it."""
        return "\n".join(self.lines())

    def markdown(self) -> str:
        """The same lines for the Dagster UI (cost_report's `day_summary`)."""
        return "\n\n".join(self.lines())

    def fingerprint(self) -> str:
        """What the summary says about the day, without when it was made or by which run:
        equal for repeated reports of the same state, different once the day changes (its
        counts, cost, alerts, outcome, block or failure)."""
        state = self.model_dump(mode="json", exclude=set(_TIMING) | {"dead_letter_rate"})
        state["cost_usd"] = f"{self.cost_usd:.4f}"
        return hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()


def summarize(
    spec: PipelineSpec,
    day: dt.date,
    ledger: LedgerResource,
    *,
    outcome: Outcome,
    reason: str | None = None,
    run_id: str | None = None,
    blocked: str | None = None,
    counts: JobCounts | None = None,
) -> PartitionSummary:
    """The day's summary from its job's items (`counts`, when the caller has just refreshed
    them), with the alerts of automation.notify."""
    summary = PartitionSummary(
        pipeline=spec.name,
        date=day,
        outcome=outcome,
        reason=reason,
        run_id=run_id,
        blocked=blocked,
    )
    job = ledger.get_job(
        ids.job_id(spec.name, day, spec.prompt.version, spec.model.provider, spec.model.name)
    )
    if job is None:
        return summary
    counts = counts or ledger.refresh_job(job.job_id)
    rate = counts.dead_letters / counts.total if counts.total else 0.0
    alerts = []
    notify = spec.automation.notify
    if notify.max_dead_letter_rate is not None and rate > notify.max_dead_letter_rate:
        alerts.append(
            f"dead-letter rate {rate:.1%} over automation.notify.max_dead_letter_rate "
            f"{notify.max_dead_letter_rate:.1%}"
        )
    if notify.max_cost_usd is not None and counts.cost_usd > notify.max_cost_usd:
        alerts.append(
            f"cost ${counts.cost_usd:.2f} over automation.notify.max_cost_usd "
            f"${notify.max_cost_usd:.2f}"
        )
    return summary.model_copy(
        update={
            "job_id": job.job_id,
            "items": counts.total,
            "succeeded": counts.succeeded,
            "dead_letters": counts.dead_letters,
            "dead_letters_by_class": counts.dead_letters_by_class,
            "open_items": counts.open,
            "cost_usd": counts.cost_usd,
            "duration_seconds": (utcnow() - job.created_at).total_seconds(),
            "dead_letter_rate": rate,
            "alerts": alerts,
        }
    )


def under_way(spec: PipelineSpec, day: dt.date, ledger: LedgerResource) -> str | None:
    """What still finishes a day one of whose runs failed, as the ledger tells it: batches in
    flight at the provider, or retry shards waiting for their backoff (the batch-status
    sensor takes them on). None when nothing does, and the failure is the day's outcome; a
    shard a gate holds waits for an operator, not for time."""
    job = ledger.get_job(
        ids.job_id(spec.name, day, spec.prompt.version, spec.model.provider, spec.model.name)
    )
    if job is None:
        return None
    waiting = [
        s for s in ledger.shards(job.job_id, ["created"]) if s.round > 0 and s.raw_status != GATED
    ]
    if ledger.shards(job.job_id, IN_FLIGHT_STATES) or waiting:
        return "items are still on their way; the batch-status sensor finishes the day"
    return None


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is an answer like any other (reported with its status), never followed: the
    summary goes only to the URL configured, over the scheme it names."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_opener = urllib.request.build_opener(_NoRedirects)


def post_webhook(url: str, summary: PartitionSummary, timeout: float = 10.0) -> str | None:
    """POST the summary; returns an error message instead of raising (a notification must
    never fail the sensor that sends it). The URL is a secret: a failure is told by the
    exception's type and the HTTP status, never by the URL or the exception's text (which
    may quote it)."""
    payload = {"text": summary.text(), "llm_assets": summary.model_dump(mode="json")}
    error = ""
    for _ in range(2):  # a 5xx or a lost connection is tried once more
        try:
            request = urllib.request.Request(
                url,
                data=json.dumps(payload).encode(),
                headers={"Content-Type": "application/json"},
                method="POST",
            )
            with _opener.open(request, timeout=timeout) as response:
                if response.status < 300:
                    return None
                error = f"webhook answered HTTP {response.status}"
        except urllib.error.HTTPError as exc:
            error = f"webhook answered HTTP {exc.code} ({type(exc).__name__})"
            if exc.code < 500:
                return error
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            reason = getattr(exc, "reason", None)
            cause = f", {type(reason).__name__}" if isinstance(reason, BaseException) else ""
            error = f"webhook unreachable: {type(exc).__name__}{cause}"
        except Exception as exc:  # a malformed URL, a broken answer: not worth another try
            return f"webhook failed: {type(exc).__name__}"
    return error


def deliver(spec: PipelineSpec, summary: PartitionSummary) -> str | None:
    """Post the summary when a webhook is set and its URL is one a webhook may have (https,
    or http to this machine); returns why it was not delivered, None when it was or when no
    webhook is set. It logs nothing: the sensor that sends it does, once."""
    variable = spec.automation.notify.webhook_env
    url = os.environ.get(variable)
    if not url:
        return None
    return webhook_url_problem(url, variable) or post_webhook(url, summary)


class Announcement(BaseModel):
    first: bool
    """Whether this call claimed the summary (and sent it); False when it was sent before."""
    error: str | None = None
    """Why the webhook did not take it, when this call sent it."""


def announce(
    spec: PipelineSpec,
    summary: PartitionSummary,
    ledger: LedgerResource,
    *,
    fingerprint: str | None = None,
    text: str | None = None,
) -> Announcement:
    """Send the summary once per day state (or per `fingerprint` given): claim the
    fingerprint in the ledger, and deliver it only when this call made the claim. `text` is
    what the ledger keeps of it (the summary's text unless given)."""
    fingerprint = fingerprint or summary.fingerprint()
    first = ledger.claim_notification(
        pipeline=summary.pipeline,
        partition_date=summary.date,
        fingerprint=fingerprint,
        outcome=summary.outcome,
        text=text or summary.text(),
        job_id=summary.job_id,
        run_id=summary.run_id,
    )
    if not first:
        return Announcement(first=False)
    error = deliver(spec, summary)
    ledger.record_delivery(summary.pipeline, summary.date, fingerprint, error)
    return Announcement(first=True, error=error)


def announce_stuck(
    spec: PipelineSpec,
    day: dt.date,
    job_id: str,
    counts: JobCounts,
    words: str,
    batch_ids: list[str],
    ledger: LedgerResource,
) -> Announcement:
    """Tell the operator, once per set of stuck batches, that a day's batches have not
    started far longer than usual (steps/stuck.py), with what to do."""
    summary = PartitionSummary(
        pipeline=spec.name,
        date=day,
        outcome="in progress",
        job_id=job_id,
        items=counts.total,
        succeeded=counts.succeeded,
        dead_letters=counts.dead_letters,
        dead_letters_by_class=counts.dead_letters_by_class,
        open_items=counts.open,
        cost_usd=counts.cost_usd,
        alerts=["batches not started"],
        reason=words,
    )
    fingerprint = hashlib.sha256(("stuck\0" + "\0".join(sorted(batch_ids))).encode()).hexdigest()
    return announce(spec, summary, ledger, fingerprint=fingerprint, text=words)
