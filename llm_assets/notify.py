"""Partition summaries for people: what a finished or failed day did, and when to worry.

The notification sensors (sensors.py) build a `PartitionSummary` from the ledger, log it and,
when the spec's webhook variable is set, post it as Slack-compatible JSON (`{"text": ...}`,
which Slack, Mattermost, Rocket.Chat and Teams' incoming-webhook bridges accept).
"""

import datetime as dt
import json
import logging
import os
import urllib.error
import urllib.request
from typing import Any

from pydantic import BaseModel

from llm_assets import steps
from llm_assets.resources.ledger import LedgerResource, utcnow
from llm_assets.secrecy import webhook_url_problem
from llm_assets.spec import PipelineSpec

log = logging.getLogger("llm_assets.notify")


class PartitionSummary(BaseModel):
    pipeline: str
    date: dt.date
    outcome: str
    """"finished" or "failed"."""
    job_id: str | None = None
    items: int = 0
    succeeded: int = 0
    dead_letters: int = 0
    dead_letters_by_class: dict[str, int] = {}
    open_items: int = 0
    cost_usd: float = 0.0
    duration_seconds: float | None = None
    error_rate: float = 0.0
    alerts: list[str] = []
    reason: str | None = None
    run_id: str | None = None

    def text(self) -> str:
        head = f"{self.pipeline} {self.date}: {self.outcome}"
        if self.alerts:
            head = f"ALERT {head} ({'; '.join(self.alerts)})"
        parts = [
            head,
            f"items {self.items}, succeeded {self.succeeded}, dead letters {self.dead_letters}"
            + (f" {self.dead_letters_by_class}" if self.dead_letters_by_class else "")
            + (f", still open {self.open_items}" if self.open_items else ""),
            f"cost ${self.cost_usd:.4f}"
            + (
                f", {self.duration_seconds / 60:.1f} min since the day's job was created"
                if self.duration_seconds is not None
                else ""
            ),
        ]
        if self.reason:
            parts.append(f"reason: {self.reason}")
        if self.run_id:
            parts.append(f"run {self.run_id}")
        return "\n".join(parts)


def summarize(
    spec: PipelineSpec,
    day: dt.date,
    ledger: LedgerResource,
    *,
    outcome: str,
    reason: str | None = None,
    run_id: str | None = None,
) -> PartitionSummary:
    summary = PartitionSummary(
        pipeline=spec.name, date=day, outcome=outcome, reason=reason, run_id=run_id
    )
    try:
        job = steps.existing_job(spec, day, ledger)
    except steps.MissingPrerequisite:
        return summary
    counts = ledger.refresh_job(job.job_id)
    error_rate = counts.dead_letters / counts.total if counts.total else 0.0
    alerts = []
    notify = spec.automation.notify
    if notify.max_error_rate is not None and error_rate > notify.max_error_rate:
        alerts.append(f"error rate {error_rate:.1%} over {notify.max_error_rate:.1%}")
    if notify.max_cost_usd is not None and counts.cost_usd > notify.max_cost_usd:
        alerts.append(f"cost ${counts.cost_usd:.2f} over ${notify.max_cost_usd:.2f}")
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
            "error_rate": error_rate,
            "alerts": alerts,
        }
    )


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
    """Log the summary (a warning when it alerts) and post it when a webhook is set and its
    URL is one a webhook may have (https, or http to this machine)."""
    text = summary.text()
    (log.warning if summary.alerts or summary.outcome == "failed" else log.info)(text)
    variable = spec.automation.notify.webhook_env
    url = os.environ.get(variable)
    if not url:
        return None
    error = webhook_url_problem(url, variable) or post_webhook(url, summary)
    if error:
        log.warning(f"{spec.name} {summary.date}: notification not delivered: {error}")
    return error
