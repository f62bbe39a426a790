"""What the Azure OpenAI adapter does beyond the provider contract (which it keeps, see
tests/test_provider_contract.py): it is addressed by endpoint, api-version and deployment,
authenticates with a key or a Microsoft Entra ID token, and its spec options are checked.
Each case runs the official SDK's Azure client against the fake Azure OpenAI server."""

from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from llm_assets.resources import build_resources
from llm_assets.resources.providers.azure_openai import AzureOpenAIBatchProvider
from llm_assets.resources.providers.base import RequestItem, ShardState, ShardSubmission
from llm_assets.resources.providers.registry import provider_spec_problems
from llm_assets.resources.providers.retrying import QuotaRefused
from llm_assets.resources.storage import ArtifactStorage
from llm_assets.spec.model import PipelineSpec
from llm_assets.util.settings import Settings
from tests.fakes.azure_openai_server import FakeAzureOpenAI
from tests.harness import review_spec, truthful
from tests.provider_kits import AZURE_DEPLOYMENT

pytestmark = pytest.mark.fake_server(
    "azure_openai", responder=truthful, deployments={AZURE_DEPLOYMENT: "gpt-4o-mini"}
)
ENTRA_TOKEN = "entra-token-for-tests"
AZURE_VARIABLES = (
    "AZURE_OPENAI_ENDPOINT",
    "AZURE_OPENAI_API_KEY",
    "AZURE_OPENAI_AD_TOKEN",
    "OPENAI_API_VERSION",
    "LLM_ASSETS_AZURE_AD_TOKEN_PROVIDER",
)


def entra_token() -> str:
    """The token provider the Entra ID case names: what azure-identity would return."""
    return ENTRA_TOKEN


@pytest.fixture(autouse=True)
def no_azure_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in AZURE_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def spec_with(**options: Any) -> PipelineSpec:
    model = {"options": {"deployment": AZURE_DEPLOYMENT, **options}}
    return PipelineSpec.model_validate(review_spec("azure_openai", "gpt-4o-mini", model=model))


def adapter(fake: FakeAzureOpenAI, **settings: Any) -> AzureOpenAIBatchProvider:
    defaults: dict[str, Any] = {
        "api_key": "test-key",
        "azure_endpoint": fake.base_url,
        "retry_base_seconds": 0.01,
        "retry_cap_seconds": 0.05,
    }
    return AzureOpenAIBatchProvider(**{**defaults, **settings})


def shard_of(
    provider: AzureOpenAIBatchProvider, spec: PipelineSpec, tmp_path: Path
) -> tuple[ShardSubmission, ArtifactStorage]:
    storage = ArtifactStorage(base_url=str(tmp_path / "artifacts"))
    lines = [
        provider.encode_request(
            spec, RequestItem(custom_id=f"s-{n}", system=spec.prompt.system, user=f"good {n}")
        )
        for n in range(3)
    ]
    written = storage.write_lines("shards/s.jsonl", lines)
    shard = ShardSubmission(
        shard_id="s", job_id="j", pipeline=spec.name, input_uri=written.uri, item_count=3
    )
    return shard, storage


def run(provider: AzureOpenAIBatchProvider, spec: PipelineSpec, tmp_path: Path) -> Any:
    shard, storage = shard_of(provider, spec, tmp_path)
    batch_id = provider.submit(shard, storage)
    for _ in range(20):
        status = provider.poll(batch_id)
        if status.ended:
            return status, list(provider.results(batch_id))
    raise AssertionError(f"{batch_id} did not end")


def test_lines_name_the_deployment_and_azure_paths(fake: FakeAzureOpenAI, tmp_path: Path) -> None:
    provider = adapter(fake)
    spec = spec_with()

    status, results = run(provider, spec, tmp_path)

    line = provider.request_line(spec, RequestItem(custom_id="x", system="s", user="u"))
    assert (line["url"], line["body"]["model"]) == ("/chat/completions", AZURE_DEPLOYMENT)
    assert status.state == ShardState.COMPLETED and all(r.succeeded for r in results)
    calls = fake.calls.entries()
    assert {c["path"].split("/")[1] for c in calls} == {"openai"}
    assert {(c["api_version"], c["auth"]) for c in calls} == {("2024-10-21", "api-key")}


def test_a_deployment_the_resource_lacks_fails_its_batch(
    fake: FakeAzureOpenAI, tmp_path: Path
) -> None:
    status, results = run(adapter(fake), spec_with(deployment="not-deployed"), tmp_path)

    assert status.state == ShardState.FAILED and results == []
    assert status.message is not None and "model_not_found" in status.message
    assert not adapter(fake).ended_for_quota(status.raw_status, status.message)


def test_an_api_version_azure_does_not_serve_is_refused_at_once(
    fake: FakeAzureOpenAI, tmp_path: Path
) -> None:
    provider = adapter(fake, api_version="2023-05-15")
    shard, storage = shard_of(provider, spec_with(), tmp_path)

    with pytest.raises(openai.BadRequestError, match="API version not supported") as raised:
        provider.submit(shard, storage)

    assert not isinstance(raised.value, QuotaRefused)
    assert [c["status"] for c in fake.calls.entries()] == [400]
    assert fake.store.all_batches() == []


def test_an_entra_id_token_provider_authenticates_every_call(
    fake: FakeAzureOpenAI, tmp_path: Path
) -> None:
    fake.accepted_tokens = {ENTRA_TOKEN}
    provider = adapter(
        fake, api_key=None, azure_ad_token_provider=f"{__name__}:{entra_token.__name__}"
    )

    status, _ = run(provider, spec_with(), tmp_path)

    assert status.state == ShardState.COMPLETED
    assert {c["auth"] for c in fake.calls.entries()} == {"bearer"}
    both = adapter(fake, azure_ad_token_provider=f"{__name__}:{entra_token.__name__}")
    with pytest.raises(ValueError, match="API key and an Entra ID token provider"):
        both.poll("batch_any")


def test_the_environment_names_endpoint_key_and_api_version(
    fake: FakeAzureOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AZURE_OPENAI_ENDPOINT", fake.base_url)
    monkeypatch.setenv("AZURE_OPENAI_API_KEY", "test-key")
    monkeypatch.setenv("OPENAI_API_VERSION", "2025-03-01-preview")
    settings = Settings.from_env({"LLM_ASSETS_HOME": str(tmp_path / "home")})
    provider = build_resources(settings)["azure_openai_provider"]

    status, _ = run(provider, spec_with(), tmp_path)

    assert status.state == ShardState.COMPLETED
    assert "test-key" not in repr(provider), "the key is an EnvVar, never a value"
    assert {(c["api_version"], c["auth"]) for c in fake.calls.entries()} == {
        ("2025-03-01-preview", "api-key")
    }


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"endpoint": "/v1/chat/completions"}, "model.options.endpoint"),
        ({"deployment": "a"}, "model.options.deployment"),
        ({"deployment_type": "regional"}, "model.options.deployment_type"),
        ({"deployment_type": "data_zone"}, "model.options.data_zone"),
        ({"deployment_type": "data_zone", "data_zone": "asia"}, "model.options.data_zone"),
        ({"data_zone": "eu"}, "model.options.data_zone"),
        ({"temperature_boost": 1}, "model.options"),
    ],
)
def test_deployment_options_the_adapter_cannot_serve_are_spec_problems(
    options: dict[str, Any], field: str
) -> None:
    assert [f for f, _ in provider_spec_problems(spec_with(**options))] == [field]


def test_a_data_zone_deployment_with_its_zone_is_no_spec_problem() -> None:
    spec = spec_with(deployment_type="data_zone", data_zone="eu", endpoint="/embeddings")
    assert [f for f, _ in provider_spec_problems(spec)] == ["output.schema"]
    assert provider_spec_problems(spec_with(deployment_type="data_zone", data_zone="us")) == []


def test_the_docs_example_of_an_azure_model_section_is_a_valid_spec() -> None:
    text = (Path(__file__).parent.parent / "docs" / "spec.md").read_text()
    blocks = [b.split("```", 1)[0] for b in text.split("```yaml\n")[1:]]
    [example] = [b for b in blocks if "provider: azure_openai" in b]
    spec = review_spec("azure_openai", "gpt-4o-mini", **yaml.safe_load(example))
    assert provider_spec_problems(PipelineSpec.model_validate(spec)) == []
