"""The environment contract of DESIGN §6, read in one place."""

import os
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict

REPO_ROOT = Path(__file__).resolve().parents[2]
EXECUTORS = ("in_process", "celery")
"""LLM_ASSETS_EXECUTOR's choices."""
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")
"""The URLs LLM_ASSETS_RATE_LIMIT_REDIS may hold (redis-py's `Redis.from_url`)."""


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
    rate_limit_redis: str | None = None
    """LLM_ASSETS_RATE_LIMIT_REDIS: the Redis that holds the online path's RPM/TPM windows,
    shared by every process (`rate_limit_redis_url`); None keeps them in each process."""

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
            rate_limit_redis=rate_limit_redis_url(env),
        )

    def resolve_source_uri(self, uri: str) -> str:
        """Source uris are relative to LLM_ASSETS_HOME unless absolute or s3://."""
        if uri.startswith("s3://") or Path(uri).is_absolute():
            return uri
        return str(self.home / uri)


def rate_limit_redis_url(env: Mapping[str, str]) -> str | None:
    """LLM_ASSETS_RATE_LIMIT_REDIS, or under LLM_ASSETS_EXECUTOR=celery the result backend
    when that is a Redis: the workers of several machines then keep to one RPM/TPM limit
    instead of each using all of it. None when neither is set (the limit is per process)."""
    url = env.get("LLM_ASSETS_RATE_LIMIT_REDIS")
    if url:
        if not url.startswith(REDIS_SCHEMES):
            from llm_assets.util.secrecy import mask_url

            raise ValueError(
                f"LLM_ASSETS_RATE_LIMIT_REDIS={mask_url(url)!r} is not a Redis URL: give one "
                f"starting with {', '.join(REDIS_SCHEMES)} (e.g. redis://host:6379/0)"
            )
        return url
    backend = env.get("LLM_ASSETS_CELERY_BACKEND") or ""
    if env.get("LLM_ASSETS_EXECUTOR") == "celery" and backend.startswith(("redis://", "rediss://")):
        return backend
    return None


def sensor_interval(settings: Settings | None, default: int) -> int:
    """A sensor's minimum interval: LLM_ASSETS_SENSOR_INTERVAL_SECONDS when set, else the
    sensor's own default."""
    if settings is not None and settings.sensor_interval_seconds is not None:
        return settings.sensor_interval_seconds
    return default
