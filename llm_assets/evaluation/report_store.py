"""Where eval reports are kept: eval/<pipeline>/reports/<key>.md, .json and .request.json in
the artifact store, the key being the eval's partition of eval_report."""

import datetime as dt
import hashlib

from pydantic import BaseModel, ConfigDict

from llm_assets.evaluation.replay import Replay
from llm_assets.evaluation.report import EvalReport
from llm_assets.evaluation.report_markdown import render_markdown
from llm_assets.resources.storage import ArtifactStorage
from llm_assets.steps.context import artifact_key


class EvalRequest(BaseModel):
    """What an eval ran: enough to run it again (and to re-score it) from its report key."""

    model_config = ConfigDict(frozen=True)

    days: list[dt.date]
    sample: int
    seed: int
    variants: list[str]
    """The variants run besides the baseline."""


def report_key(result: Replay) -> str:
    """The eval's name as a partition of eval_report: its days, sample size and seed, and a
    digest of the eval pipelines its variants ran as (so a changed variant configuration is
    another eval, never a new materialization of the old one)."""
    sample = result.sample
    pipelines = ",".join(sorted(run.pipeline for run in result.variants.values()))
    digest = hashlib.sha256(f"{sample.eval_id}\x1f{pipelines}".encode()).hexdigest()[:6]
    return f"{sample.days[0]}_{sample.days[-1]}_n{sample.size}_s{sample.seed}_{digest}"


def _report_files(pipeline: str, key: str) -> dict[str, str]:
    """The artifact keys of a saved report, by kind: eval/<pipeline>/reports/<key>.*"""
    folder = artifact_key("eval", pipeline, "reports")
    suffixes = {"markdown": ".md", "json": ".json", "request": ".request.json"}
    return {kind: artifact_key(folder, f"{key}{suffix}") for kind, suffix in suffixes.items()}


def save_report(
    report: EvalReport, request: EvalRequest, key: str, storage: ArtifactStorage
) -> dict[str, str]:
    """The report as markdown and JSON, and the request that made it; their URIs by kind."""
    files = _report_files(report.pipeline, key)
    contents = {
        "markdown": render_markdown(report).encode(),
        "json": report.model_dump_json(indent=2).encode(),
        "request": request.model_dump_json().encode(),
    }
    return {kind: storage.write_bytes(files[kind], data).uri for kind, data in contents.items()}


def load_request(pipeline: str, key: str, storage: ArtifactStorage) -> EvalRequest | None:
    """The request saved with the report `key`; None when there is none."""
    uri = storage.uri(_report_files(pipeline, key)["request"])
    if not storage.exists(uri):
        return None
    return EvalRequest.model_validate_json(storage.read_bytes(uri))


def load_report(
    pipeline: str, key: str, storage: ArtifactStorage
) -> tuple[EvalReport, dict[str, str]]:
    """The report saved as `key` (save_report) and the URIs of its files."""
    uris = {kind: storage.uri(k) for kind, k in _report_files(pipeline, key).items()}
    return EvalReport.model_validate_json(storage.read_bytes(uris["json"])), uris
