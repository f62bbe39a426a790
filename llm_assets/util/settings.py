"""The environment contract of DESIGN §6, read in one place."""

import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict

REPO_ROOT = Path(__file__).resolve().parents[2]
EXECUTORS = ("in_process", "celery")
"""LLM_ASSETS_EXECUTOR's choices."""


class Settings(BaseModel):
    """Where state, specs and artifacts live; resolved from the environment."""

    model_config = ConfigDict(frozen=True)

    home: Path
    database_url: str
    pipelines_dir: Path
    storage_url: str
    dagster_home: Path
    sensor_interval_seconds: int | None = None
    """LLM_ASSETS_SENSOR_INTERVAL_SECONDS: how often the sensors may run (default: each
    sensor's own, 30–60 s); tests and demos set a few seconds."""
    executor: str = "in_process"
    """LLM_ASSETS_EXECUTOR: `in_process` (a run's steps in its own process) or `celery` (each
    step a Celery task on any worker: LLM_ASSETS_CELERY_BROKER, LLM_ASSETS_CELERY_BACKEND)."""

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> "Settings":
        env = os.environ if environ is None else environ
        home = Path(env.get("LLM_ASSETS_HOME") or "./.llm_assets").expanduser().resolve()
        executor = env.get("LLM_ASSETS_EXECUTOR") or "in_process"
        if executor not in EXECUTORS:
            raise ValueError(
                f"LLM_ASSETS_EXECUTOR={executor!r}: choose one of {', '.join(EXECUTORS)}"
            )
        return cls(
            home=home,
            database_url=env.get("LLM_ASSETS_DATABASE_URL") or f"sqlite:///{home / 'ledger.db'}",
            pipelines_dir=Path(
                env.get("LLM_ASSETS_PIPELINES") or REPO_ROOT / "pipelines"
            ).resolve(),
            storage_url=env.get("LLM_ASSETS_STORAGE_URL") or str(home / "artifacts"),
            dagster_home=Path(env.get("DAGSTER_HOME") or home / "dagster").resolve(),
            sensor_interval_seconds=int(env["LLM_ASSETS_SENSOR_INTERVAL_SECONDS"])
            if env.get("LLM_ASSETS_SENSOR_INTERVAL_SECONDS")
            else None,
            executor=executor,
        )

    def resolve_source_uri(self, uri: str) -> str:
        """Source uris are relative to LLM_ASSETS_HOME unless absolute or s3://."""
        if uri.startswith("s3://") or Path(uri).is_absolute():
            return uri
        return str(self.home / uri)


def sensor_interval(settings: Settings | None, default: int) -> int:
    """A sensor's minimum interval: LLM_ASSETS_SENSOR_INTERVAL_SECONDS when set, else the
    sensor's own default."""
    if settings is not None and settings.sensor_interval_seconds is not None:
        return settings.sensor_interval_seconds
    return default
