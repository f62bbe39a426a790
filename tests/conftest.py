"""Shared fixtures: every ledger test runs on SQLite and on PostgreSQL.

PostgreSQL comes from LLM_ASSETS_TEST_DATABASE_URL (set by .ci/run). On a laptop without it
the PostgreSQL half is skipped with a visible reason; under CI=true it is required.
"""

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest
import sqlalchemy as sa

from tests.moto_server import start_moto_server

PG_URL = os.environ.get("LLM_ASSETS_TEST_DATABASE_URL")
IN_CI = os.environ.get("CI", "").lower() == "true"


def pytest_configure(config: pytest.Config) -> None:
    if IN_CI and not PG_URL:
        raise pytest.UsageError(
            "CI=true but LLM_ASSETS_TEST_DATABASE_URL is not set: the PostgreSQL half of the "
            "suite is required in CI (.ci/run sets it after starting the server)"
        )


DATABASES = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param(
        "postgresql",
        id="postgresql",
        marks=[]
        if PG_URL
        else [
            pytest.mark.skip(
                reason="LLM_ASSETS_TEST_DATABASE_URL is not set; PostgreSQL half skipped"
            )
        ],
    ),
]


@pytest.fixture
def one_database_url(tmp_path: Path) -> Iterator[str]:
    """PostgreSQL when the suite has it (as in CI), else SQLite: for slow end-to-end tests
    where the storage layer is not what is being compared."""
    if PG_URL is None:
        yield f"sqlite:///{tmp_path / 'ledger.db'}"
        return
    yield from _pg_schema_url()


def _pg_schema_url() -> Iterator[str]:
    assert PG_URL is not None
    schema = f"t_{uuid.uuid4().hex[:16]}"
    admin = sa.create_engine(PG_URL)
    with admin.begin() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    url = sa.engine.make_url(PG_URL).update_query_dict({"options": f"-csearch_path={schema}"})
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        from llm_assets.resources.ledger import _engines

        for key in [k for k in _engines if schema in k]:
            _engines.pop(key).dispose()
        with admin.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture(params=DATABASES)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty ledger database: a SQLite file, or a new PostgreSQL schema."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'ledger.db'}"
        return
    yield from _pg_schema_url()


@dataclass(frozen=True)
class MotoS3:
    endpoint_url: str
    bucket: str

    def client(self) -> Any:
        return boto3.client("s3", endpoint_url=self.endpoint_url)


@pytest.fixture(scope="session")
def moto_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoS3]:
    endpoint_url, stop = start_moto_server()
    isolated = tmp_path_factory.mktemp("aws") / "absent"
    try:
        with pytest.MonkeyPatch.context() as mp:
            for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
                mp.delenv(name, raising=False)
            mp.setenv("AWS_CONFIG_FILE", str(isolated))
            mp.setenv("AWS_SHARED_CREDENTIALS_FILE", str(isolated))
            mp.setenv("AWS_ENDPOINT_URL", endpoint_url)
            mp.setenv("AWS_ACCESS_KEY_ID", "testing")
            mp.setenv("AWS_SECRET_ACCESS_KEY", "testing")
            mp.setenv("AWS_DEFAULT_REGION", "us-east-1")
            s3 = MotoS3(endpoint_url=endpoint_url, bucket="llm-assets-test")
            s3.client().create_bucket(Bucket=s3.bucket)
            yield s3
    finally:
        stop()
