"""Shared fixtures: the ledger database, the fake provider servers and their SDK clients, and
a real S3 endpoint.

`database_url` runs a test on SQLite and on PostgreSQL; a module marked `one_database` gets
one database instead, PostgreSQL when the suite has it. PostgreSQL comes from
LLM_ASSETS_TEST_DATABASE_URL (set by .ci/run). On a laptop without it the PostgreSQL half is
skipped with a visible reason; under CI=true it is required.

`fake` is the fake provider server a module names with its `fake_server` marker, e.g.
`pytestmark = pytest.mark.fake_server("openai", responder=truthful)`: started on loopback
with the marker's knobs set, and the test fails if the fake itself crashed.
"""

import contextlib
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import boto3
import openai
import pytest
import sqlalchemy as sa
from google import genai
from google.genai import types as genai_types

from tests.fakes.anthropic_server import FakeAnthropic
from tests.fakes.azure_openai_server import FakeAzureOpenAI
from tests.fakes.base import FakeServer
from tests.fakes.bedrock_server import FakeBedrock
from tests.fakes.gemini_server import FakeGemini
from tests.fakes.online_server import FakeOnline
from tests.fakes.openai_model import count_tokens
from tests.fakes.openai_server import FakeOpenAI
from tests.moto_server import start_moto_server

PG_URL = os.environ.get("LLM_ASSETS_TEST_DATABASE_URL")
IN_CI = os.environ.get("CI", "").lower() == "true"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "one_database: database_url is one database, PostgreSQL when there is one"
    )
    config.addinivalue_line(
        "markers",
        "slow: an end-to-end file of half a minute or more; the suite starts these first",
    )
    config.addinivalue_line(
        "markers",
        "fake_server(kind, state_dir=None, **knobs): the fake provider server the `fake` "
        "fixture starts (openai, azure_openai, anthropic, bedrock, gemini or online) and the knobs "
        "it sets on it",
    )
    if IN_CI and not PG_URL:
        raise pytest.UsageError(
            "CI=true but LLM_ASSETS_TEST_DATABASE_URL is not set: the PostgreSQL half of the "
            "suite is required in CI (.ci/run sets it after starting the server)"
        )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files marked slow first, each file's tests kept together and in order: the test
    workers (`make test` runs pytest-xdist with --dist loadfile) take files in this order, so
    the long ones start at once and the short ones fill in, instead of one long file left
    running alone at the end."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


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


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """`database_url` once per database, unless the test is marked `one_database` or names its
    databases itself (`parametrize("database_url", ..., indirect=True)`)."""
    if "database_url" not in metafunc.fixturenames:
        return
    if metafunc.definition.get_closest_marker("one_database") is not None:
        return
    for mark in metafunc.definition.iter_markers("parametrize"):
        names = mark.args[0]
        if "database_url" in (
            [n.strip() for n in names.split(",")] if isinstance(names, str) else names
        ):
            return
    metafunc.parametrize("database_url", DATABASES, indirect=True)


@pytest.fixture(autouse=True)
def every_tick_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    """In process, the batch-status sensor polls every batch at every tick instead of on the
    lifecycle's schedule, whose first poll comes a second after submission: tests tick right
    after submitting and count polls per tick. test_sensors.py checks the schedule itself."""
    from llm_assets.defs import sensors

    monkeypatch.setattr(sensors, "POLL_EVERY_SECONDS", 0.0)


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
        from llm_assets.resources.ledger import _engines, dispose_engines

        for engine_url in {engine_url for engine_url, _ in _engines if schema in engine_url}:
            dispose_engines(engine_url)
        with admin.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty ledger database: a SQLite file, or a new PostgreSQL schema (see
    pytest_generate_tests); for a test marked `one_database`, `one_database_url`."""
    kind = getattr(request, "param", None)
    if kind is None:
        yield request.getfixturevalue("one_database_url")
        return
    if kind == "sqlite":
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


def _new_fake(kind: str, request: pytest.FixtureRequest, state_dir: Path) -> FakeServer:
    if kind == "openai":
        return FakeOpenAI(state_dir)
    if kind == "azure_openai":
        return FakeAzureOpenAI(state_dir)
    if kind == "anthropic":
        return FakeAnthropic(state_dir)
    if kind == "bedrock":
        moto: MotoS3 = request.getfixturevalue("moto_s3")
        return FakeBedrock(moto.endpoint_url)
    if kind == "gemini":
        return FakeGemini(state_dir)
    if kind == "online":
        count_tokens("warm up", "gpt-4o-mini")  # load the BPE now, not in the first timed request
        return FakeOnline()
    raise pytest.UsageError(
        f"fake_server({kind!r}): expected openai, azure_openai, anthropic, bedrock, gemini or "
        "online"
    )


@contextlib.contextmanager
def running_fake(
    kind: str, request: pytest.FixtureRequest, state_dir: Path, knobs: dict[str, Any]
) -> Iterator[Any]:
    """The fake provider server of `kind` running, its knobs set; on the way out the test
    fails if the fake itself crashed."""
    server = _new_fake(kind, request, state_dir)
    for knob, value in knobs.items():
        if not hasattr(server, knob):
            raise pytest.UsageError(f"{type(server).__name__} has no knob {knob!r}")
        setattr(server, knob, value)
    with server:
        yield server
        assert server.server_errors == []


@pytest.fixture
def fake(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """The running fake server the test's `fake_server` marker names, its knobs set. A fake
    that keeps state does so in tmp_path/fake_<kind>, or in tmp_path/<state_dir> when the
    marker names one."""
    marker = request.node.get_closest_marker("fake_server")
    if marker is None:
        raise pytest.UsageError(f"{request.node.nodeid} uses `fake` without a fake_server marker")
    kind, knobs = marker.args[0], dict(marker.kwargs)
    state_dir = tmp_path / knobs.pop("state_dir", f"fake_{kind}")
    with running_fake(kind, request, state_dir, knobs) as server:
        yield server


@pytest.fixture
def client(fake: FakeServer) -> Iterator[Any]:
    """The official SDK pointed at `fake`, with no retries of its own (google-genai retries
    only when `HttpOptions.retry_options` is set)."""
    if isinstance(fake, FakeGemini):
        options = genai_types.HttpOptions(base_url=fake.base_url, api_version="v1beta")
        with genai.Client(api_key="test-key", http_options=options) as sdk:
            yield sdk
        return
    if isinstance(fake, FakeAnthropic):
        with anthropic.Anthropic(api_key="test", base_url=fake.base_url, max_retries=0) as sdk:
            yield sdk
        return
    assert isinstance(fake, FakeOpenAI | FakeOnline), f"no SDK client for {fake!r}"
    with openai.OpenAI(api_key="test", base_url=fake.base_url, max_retries=0) as sdk:
        yield sdk
