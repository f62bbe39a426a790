"""Residency: a spec with `compliance.allowed_regions` sends nothing to, and writes nothing in,
a place outside them. Spec-alone cases fail `validate-spec`; the rest block the day at the
step that would write or send (Dagster failure with gate `residency`, CLI exit 2), with the
fakes and the moto server seeing no upload and no create."""

import contextlib
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml
from click.testing import CliRunner

from llm_assets import steps
from llm_assets.cli.main import main
from llm_assets.compliance import residency
from llm_assets.compliance.places import Place, endpoint_place, jurisdiction_of, region_allowed
from llm_assets.compliance.residency import (
    bucket_region,
    forget_bucket_regions,
    provider_places,
    refusal,
    residency_problems,
)
from llm_assets.defs.run_failures import StepFailed
from llm_assets.resources.providers.anthropic_batch import AnthropicBatchProvider
from llm_assets.resources.providers.azure_openai import AzureOpenAIBatchProvider
from llm_assets.resources.providers.bedrock import BedrockBatchProvider
from llm_assets.resources.providers.gemini_batch import GeminiBatchProvider
from llm_assets.resources.providers.local import LocalProvider
from llm_assets.resources.providers.online import OnlineProvider
from llm_assets.resources.providers.openai_batch import OpenAIBatchProvider
from llm_assets.resources.providers.remote import RemoteBatchProvider
from llm_assets.resources.storage import ArtifactStorage
from llm_assets.spec.model import PipelineSpec
from tests import cli_process
from tests.conftest import MotoS3
from tests.fakes.bedrock_server import FakeBedrock
from tests.fakes.openai_server import FakeOpenAI
from tests.harness import (
    CLI,
    DAY,
    POSITIVE,
    Harness,
    cli_env,
    fake_harness,
    open_harness,
    review_spec,
    truthful,
    write_reviews,
)

pytestmark = pytest.mark.one_database

EU = {"allowed_regions": ["eu"]}
BEDROCK_MODEL = "anthropic.claude-3-5-haiku-20241022-v1:0"
ROLE = "arn:aws:iam::123456789012:role/BedrockBatchInference"


def spec_of(provider: str, model: str, **overrides: Any) -> PipelineSpec:
    return PipelineSpec.model_validate(review_spec(provider, model, **overrides))


def bucket_in(moto_s3: MotoS3, region: str) -> str:
    """A new bucket of the moto server in `region`."""
    name = f"residency-{region}-{uuid.uuid4().hex[:8]}"
    client = boto3.client("s3", endpoint_url=moto_s3.endpoint_url, region_name=region)
    if region == "us-east-1":
        client.create_bucket(Bucket=name)
    else:
        client.create_bucket(Bucket=name, CreateBucketConfiguration={"LocationConstraint": region})
    return name


def objects_in(moto_s3: MotoS3, bucket: str) -> list[str]:
    listing = moto_s3.client().list_objects_v2(Bucket=bucket)
    return [o["Key"] for o in listing.get("Contents", [])]


def bedrock_truthful(model_input: dict[str, Any]) -> str:
    text = json.dumps(model_input["messages"])
    label = "positive" if any(word in text.lower() for word in POSITIVE) else "negative"
    return json.dumps({"label": label, "summary": "A customer review."})


# The mapping of regions to jurisdictions, and of endpoints to regions


@pytest.mark.parametrize(
    ("region", "allowed", "passes"),
    [
        ("eu-central-1", ["eu"], True),
        ("eu-west-1", ["eu"], True),
        ("europe-west4", ["eu"], True),
        ("us-east-1", ["eu"], False),
        ("us-gov-west-1", ["us"], True),
        ("northamerica-northeast1", ["ca"], True),
        ("eu-central-1", ["eu-central-1"], True),
        ("eu-west-1", ["eu-central-1"], False),
        # Known only as "somewhere in the eu": an exact region cannot vouch for it.
        ("eu", ["eu-central-1"], False),
        ("eu", ["eu"], True),
        ("ap-southeast-2", ["us", "eu"], False),
    ],
)
def test_a_jurisdiction_allows_its_regions_and_a_region_only_itself(
    region: str, allowed: list[str], passes: bool
) -> None:
    assert region_allowed(region, allowed) is passes


def test_regions_and_jurisdictions_that_mean_nothing_are_spec_problems() -> None:
    assert jurisdiction_of("europe") is None
    spec = spec_of(
        "local",
        "all-MiniLM-L6-v2",
        compliance={"allowed_regions": ["Europe"], "endpoint_regions": {"vllm.internal": "mars"}},
    )

    problems = residency_problems(spec)

    assert [field for field, _ in problems] == [
        "compliance.allowed_regions",
        "compliance.endpoint_regions.vllm.internal",
    ]
    assert "'europe' is neither a jurisdiction" in problems[0][1]
    assert "'mars'" in problems[1][1]


def test_openai_hosts_and_mapped_hosts_have_their_regions() -> None:
    assert endpoint_place("OpenAI", "https://api.openai.com/v1", {}).describe() == (
        "OpenAI endpoint https://api.openai.com/v1 (us)"
    )
    eu = endpoint_place("OpenAI", "https://eu.api.openai.com/v1", {})
    assert (eu.region, eu.allowed_by(["eu"])) == ("eu", True)
    proxy = endpoint_place(
        "OpenAI",
        "https://user:secret@llm-proxy.example.com/v1?key=k",
        {"LLM-Proxy.example.com": "EU-Central-1"},
    )
    assert proxy.describe() == (
        "OpenAI endpoint https://llm-proxy.example.com/v1 in eu-central-1 (eu)"
    )
    assert proxy.allowed_by(["eu-central-1"])
    # A host nobody named is of unknown region, also on loopback (a proxy forwards anywhere).
    local = endpoint_place("online", "http://localhost:8000/v1", {})
    assert local.status == "unknown" and not local.allowed_by(["eu"])
    assert "compliance.endpoint_regions (localhost: <region>)" in local.describe()


def test_the_openai_endpoint_comes_from_the_resource_else_openai_base_url(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = spec_of("openai", "gpt-4o-mini", compliance=EU)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    assert refusal(spec, provider_places(spec, OpenAIBatchProvider())) == (
        "compliance.allowed_regions [eu] refuses: OpenAI endpoint https://api.openai.com/v1 (us)"
    )
    monkeypatch.setenv("OPENAI_BASE_URL", "https://eu.api.openai.com/v1")
    assert refusal(spec, provider_places(spec, OpenAIBatchProvider())) is None
    pinned = OpenAIBatchProvider(base_url="https://api.openai.com/v1")
    assert refusal(spec, provider_places(spec, pinned)) is not None


def test_the_online_endpoint_of_the_spec_wins_over_the_resource() -> None:
    spec = spec_of(
        "online",
        "gpt-4o-mini",
        compliance={**EU, "endpoint_regions": {"vllm.eu.internal": "eu-west-1"}},
        online={"base_url": "http://vllm.eu.internal:8000/v1"},
    )
    resource = OnlineProvider(base_url="https://api.openai.com/v1")

    [place] = provider_places(spec, resource)

    assert place.what == "online endpoint http://vllm.eu.internal:8000/v1 in eu-west-1"
    assert refusal(spec, [place]) is None


def no_aws_endpoints(monkeypatch: pytest.MonkeyPatch) -> None:
    """No endpoint configured for boto3 (the moto fixture sets AWS_ENDPOINT_URL)."""
    for name in (
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_BEDROCK",
        "AWS_ENDPOINT_URL_BEDROCK_RUNTIME",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")


def test_the_bedrock_region_is_the_resource_s_else_boto3_s_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = spec_of("bedrock", BEDROCK_MODEL, compliance=EU)
    no_aws_endpoints(monkeypatch)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")

    assert [p.describe() for p in provider_places(spec, BedrockBatchProvider())] == [
        "Bedrock region us-east-1 (us)"
    ]
    assert (
        refusal(spec, provider_places(spec, BedrockBatchProvider(region_name="eu-central-1")))
        is None
    )
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    [unknown] = provider_places(spec, BedrockBatchProvider())
    assert unknown.status == "unknown" and "AWS_DEFAULT_REGION" in unknown.hint


# Endpoints a provider is pointed at: judged by host


@pytest.mark.parametrize(
    ("url", "region"),
    [
        ("https://bedrock-runtime.eu-west-1.amazonaws.com", "eu-west-1"),
        ("https://bedrock.eu-central-1.amazonaws.com", "eu-central-1"),
        ("https://bedrock-runtime.eu-west-3.amazonaws.com/openai/v1", "eu-west-3"),
        ("https://bedrock-mantle.us-east-1.api.aws/v1", "us-east-1"),
        ("https://bedrock-runtime-fips.us-gov-west-1.amazonaws.com", "us-gov-west-1"),
        (
            "https://vpce-0a1b2c3d-x1y2z3.bedrock-runtime.eu-north-1.vpce.amazonaws.com",
            "eu-north-1",
        ),
        ("https://us.api.openai.com/v1", "us"),
        ("https://jp.api.openai.com/v1", "ap"),
    ],
)
def test_regional_provider_hosts_are_where_their_names_say(url: str, region: str) -> None:
    place = endpoint_place("any", url, {})
    assert (place.status, place.region) == ("region", region)


@pytest.mark.parametrize(
    ("url", "status", "hint"),
    [
        ("https://acme-eu.openai.azure.com/openai", "unknown", "an Azure host does not say"),
        ("https://ae.api.openai.com/v1", "unknown", "(ae.api.openai.com: <region>)"),
        ("https://bedrock-runtime.eu-west-1.amazonaws.com.evil.example", "unknown", ""),
        ("https://api.anthropic.com", "no_guarantee", ""),
        ("https://generativelanguage.googleapis.com", "no_guarantee", ""),
    ],
)
def test_hosts_that_do_not_say_their_region_are_refused(url: str, status: str, hint: str) -> None:
    place = endpoint_place("any", url, {})
    assert place.status == status and not place.allowed_by(["eu", "us", "ap"])
    assert hint in place.hint
    if status == "unknown":
        assert "compliance.endpoint_regions" in place.hint


def test_endpoint_regions_name_an_azure_host() -> None:
    place = endpoint_place(
        "OpenAI", "https://acme-eu.openai.azure.com/openai", {"acme-eu.openai.azure.com": "eu"}
    )
    assert place.allowed_by(["eu"])


AZURE_HOST = "acme.openai.azure.com"


def azure_spec(allowed: list[str], regions: dict[str, str], **options: str) -> PipelineSpec:
    compliance = {"allowed_regions": allowed, "endpoint_regions": regions}
    overrides = {"model": {"options": options}, "compliance": compliance}
    return PipelineSpec.model_validate(review_spec("azure_openai", "gpt-4o-mini", **overrides))


@pytest.mark.parametrize(
    ("options", "allowed", "refused_by"),
    [
        # A global batch deployment may process in any Azure region: nothing allows it.
        ({}, ["eu", "us"], "global batch deployment reviews"),
        ({"deployment_type": "global"}, ["eu"], "global batch deployment reviews"),
        # A data-zone one processes within its zone: the jurisdiction of that name allows it,
        # one region of the zone cannot vouch for all of it.
        ({"deployment_type": "data_zone", "data_zone": "eu"}, ["eu"], None),
        ({"deployment_type": "data_zone", "data_zone": "eu"}, ["swedencentral"], "EU data zone"),
        ({"deployment_type": "data_zone", "data_zone": "us"}, ["eu"], "US data zone"),
        ({"deployment_type": "data_zone", "data_zone": "us"}, ["us"], None),
    ],
)
def test_an_azure_deployment_processes_where_its_type_says(
    options: dict[str, str], allowed: list[str], refused_by: str | None
) -> None:
    spec = azure_spec(allowed, {}, deployment="reviews", **options)

    problems = residency_problems(spec)

    if refused_by is None:
        assert problems == []
    else:
        [(field, reason)] = problems
        assert field.startswith("model.options.") and refused_by in reason


@pytest.mark.parametrize(
    ("regions", "refused"),
    [
        ({AZURE_HOST: "swedencentral"}, []),
        ({AZURE_HOST: "eu"}, []),
        ({AZURE_HOST: "eastus"}, [f"Azure OpenAI endpoint https://{AZURE_HOST} in eastus (us)"]),
        ({}, [f"Azure OpenAI endpoint https://{AZURE_HOST} (region unknown"]),
    ],
)
def test_an_azure_resource_rests_its_files_where_its_region_is_named(
    regions: dict[str, str], refused: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AZURE_OPENAI_ENDPOINT", f"https://{AZURE_HOST}/")
    spec = azure_spec(["eu"], regions, deployment_type="data_zone", data_zone="eu")

    places = provider_places(spec, AzureOpenAIBatchProvider())

    assert len(places) == 2 and places[1].allowed_by(["eu"])
    described = [p.describe() for p in places if not p.allowed_by(["eu"])]
    assert [d[: len(r)] for d, r in zip(described, refused, strict=True)] == refused
    if not regions:
        assert f"({AZURE_HOST}: <region>, e.g. swedencentral)" in places[0].hint


def test_bedrock_is_judged_by_its_endpoints_where_they_are_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An explicit endpoint decides where boto3 sends, whatever region the client signs for."""
    no_aws_endpoints(monkeypatch)
    spec = spec_of("bedrock", BEDROCK_MODEL, compliance=EU)
    resource = BedrockBatchProvider(
        region_name="us-east-1",
        endpoint_url="https://bedrock.eu-west-1.amazonaws.com",
        runtime_endpoint_url="https://bedrock-runtime.eu-west-1.amazonaws.com",
    )

    assert [p.describe() for p in provider_places(spec, resource)] == [
        "Bedrock endpoint https://bedrock.eu-west-1.amazonaws.com in eu-west-1 (eu)",
        "Bedrock runtime endpoint https://bedrock-runtime.eu-west-1.amazonaws.com in eu-west-1 "
        "(eu)",
    ]
    # Without a runtime endpoint, shards below the job minimum go to the client's region.
    control_only = resource.model_copy(update={"runtime_endpoint_url": None})
    assert refusal(spec, provider_places(spec, control_only)) == (
        "compliance.allowed_regions [eu] refuses: Bedrock region us-east-1 (us)"
    )
    merged = spec_of("bedrock", BEDROCK_MODEL, compliance=EU, bedrock={"below_minimum": "merge"})
    assert refusal(merged, provider_places(merged, control_only)) is None


def test_a_bedrock_endpoint_configured_for_boto3_is_judged_by_its_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    no_aws_endpoints(monkeypatch)
    monkeypatch.setenv("AWS_ENDPOINT_URL_BEDROCK_RUNTIME", "http://llm-gw.internal:4566")
    spec = spec_of("bedrock", BEDROCK_MODEL, compliance=EU)
    resource = BedrockBatchProvider(region_name="eu-central-1")

    assert refusal(spec, provider_places(spec, resource)) == (
        "compliance.allowed_regions [eu] refuses: Bedrock runtime endpoint "
        "http://llm-gw.internal:4566 (region unknown: name its region under "
        "compliance.endpoint_regions (llm-gw.internal: <region>))"
    )
    named = spec_of(
        "bedrock",
        BEDROCK_MODEL,
        compliance={**EU, "endpoint_regions": {"llm-gw.internal": "eu-central-1"}},
    )
    assert refusal(named, provider_places(named, resource)) is None
    monkeypatch.setenv("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "true")
    assert refusal(spec, provider_places(spec, resource)) is None


@pytest.mark.parametrize(
    ("provider", "model", "adapter", "variable"),
    [
        ("anthropic", "claude-haiku-4-5", AnthropicBatchProvider, "ANTHROPIC_BASE_URL"),
        ("gemini", "gemini-2.5-flash", GeminiBatchProvider, "GOOGLE_GEMINI_BASE_URL"),
    ],
)
def test_anthropic_and_gemini_are_judged_by_their_endpoint_when_one_is_set(
    provider: str,
    model: str,
    adapter: type[RemoteBatchProvider],
    variable: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(variable, raising=False)
    gateway = {**EU, "endpoint_regions": {"llm-gw.eu.internal": "eu-west-1"}}
    spec = spec_of(provider, model, compliance=gateway)
    [default] = provider_places(spec, adapter())
    assert default.status == "no_guarantee"

    [place] = provider_places(spec, adapter(base_url="https://llm-gw.eu.internal/v1"))
    assert refusal(spec, [place]) is None
    unnamed = spec_of(provider, model, compliance=EU)
    [unknown] = provider_places(unnamed, adapter(base_url="https://llm-gw.eu.internal/v1"))
    assert "compliance.endpoint_regions (llm-gw.eu.internal: <region>)" in unknown.describe()

    # The SDK's variable is the endpoint when the resource names none; validate-spec then
    # leaves the judgement to job start.
    monkeypatch.setenv(variable, "https://llm-gw.eu.internal/v1")
    assert refusal(spec, provider_places(spec, adapter())) is None
    assert residency_problems(unnamed) == []


def test_a_bedrock_host_behind_an_openai_compatible_endpoint_routes_as_the_model_says() -> None:
    spec = spec_of(
        "online",
        f"us.{SONNET}",
        compliance=EU,
        online={"base_url": "https://bedrock-runtime.eu-west-1.amazonaws.com/openai/v1"},
    )

    assert residency_problems(spec) == [
        (
            "online.base_url",
            "compliance.allowed_regions [eu] refuses: Bedrock US cross-region inference profile "
            f"us.{SONNET} (us)",
        )
    ]
    batch = spec_of("openai", "openai.gpt-oss-120b-1:0", compliance=EU)
    resource = OpenAIBatchProvider(
        base_url="https://bedrock-runtime.eu-central-1.amazonaws.com/openai/v1"
    )
    assert refusal(batch, provider_places(batch, resource)) is None


# validate-spec: what the spec decides alone


@pytest.mark.parametrize(
    ("provider", "model", "refused"),
    [
        ("anthropic", "claude-haiku-4-5", "Anthropic Message Batches API (no regional guarantee)"),
        ("gemini", "gemini-2.5-flash", "Gemini Developer API batch mode (no regional guarantee)"),
    ],
)
def test_a_provider_with_no_regional_guarantee_is_refused_under_restricted_regions(
    provider: str, model: str, refused: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("ANTHROPIC_BASE_URL", "GOOGLE_GEMINI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    assert residency_problems(spec_of(provider, model, compliance=EU)) == [
        ("model.provider", f"compliance.allowed_regions [eu] refuses: {refused}")
    ]
    assert residency_problems(spec_of(provider, model)) == []


SONNET = "anthropic.claude-3-5-sonnet-20240620-v1:0"
ACCOUNT = "123456789012"


def model_problems(model: str, allowed: list[str], **compliance: Any) -> list[tuple[str, str]]:
    """validate-spec's residency problems of a Bedrock spec with this model id."""
    spec = spec_of("bedrock", model, compliance={"allowed_regions": allowed, **compliance})
    return residency_problems(spec)


@pytest.mark.parametrize(
    ("model", "allowed", "refused"),
    [
        (f"eu.{SONNET}", ["eu"], None),
        (f"us.{SONNET}", ["eu"], f"Bedrock US cross-region inference profile us.{SONNET} (us)"),
        (
            f"us-gov.{SONNET}",
            ["eu"],
            f"Bedrock GovCloud (US) cross-region inference profile us-gov.{SONNET} (us)",
        ),
        (
            f"apac.{SONNET}",
            ["eu"],
            f"Bedrock APAC cross-region inference profile apac.{SONNET} (ap, me)",
        ),
        # AWS's APAC profiles also route to me-central-1 (UAE): ap alone does not allow them.
        (
            f"apac.{SONNET}",
            ["ap"],
            f"Bedrock APAC cross-region inference profile apac.{SONNET} (ap, me)",
        ),
        (f"apac.{SONNET}", ["ap", "me"], None),
        (
            "global.anthropic.claude-sonnet-4-20250514-v1:0",
            ["eu"],
            "Bedrock global cross-region inference profile "
            "global.anthropic.claude-sonnet-4-20250514-v1:0, routed to any commercial AWS "
            "region (no regional guarantee)",
        ),
        # An eu profile may route to any eu region, so one region alone does not allow it.
        (
            f"eu.{SONNET}",
            ["eu-central-1"],
            f"Bedrock EU cross-region inference profile eu.{SONNET} (eu)",
        ),
        (SONNET, ["eu"], None),  # invoked in the client's region, known at job start
    ],
)
def test_a_cross_region_inference_profile_is_judged_by_its_geography(
    model: str, allowed: list[str], refused: str | None
) -> None:
    expected = [
        ("model.name", f"compliance.allowed_regions [{', '.join(allowed)}] refuses: {refused}")
    ]
    assert model_problems(model, allowed) == (expected if refused else [])


PROFILE_ARN = f"arn:aws:bedrock:{{region}}:{ACCOUNT}:inference-profile/{{profile}}.{SONNET}"
MODEL_ARN = f"arn:aws:bedrock:{{region}}::foundation-model/{SONNET}"
APP_ARN = f"arn:aws:bedrock:{{region}}:{ACCOUNT}:application-inference-profile/k2x9hq7v1abc"


@pytest.mark.parametrize(
    ("model", "allowed", "where"),
    [
        (PROFILE_ARN.format(region="eu-central-1", profile="eu"), ["eu"], None),
        # Called in eu-central-1, but routed among every eu region.
        (
            PROFILE_ARN.format(region="eu-central-1", profile="eu"),
            ["eu-central-1"],
            " called in eu-central-1 (eu)",
        ),
        # The ARN's region is where it is called: a us source region sends the prompt there.
        (
            PROFILE_ARN.format(region="us-east-1", profile="eu"),
            ["eu"],
            " called in us-east-1 (us, eu)",
        ),
        (
            PROFILE_ARN.format(region="eu-central-1", profile="global"),
            ["eu"],
            " called in eu-central-1, routed to any commercial AWS region (no regional guarantee)",
        ),
        (MODEL_ARN.format(region="eu-west-1"), ["eu-west-1"], None),
        (MODEL_ARN.format(region="us-east-1"), ["eu"], " in us-east-1 (us)"),
        (APP_ARN.format(region="eu-central-1"), ["eu"], None),
        (
            APP_ARN.format(region="us-east-1"),
            ["eu"],
            ", taken to run in us-east-1 (if it copies a cross-region profile, name where it "
            "routes under compliance.endpoint_regions) (us)",
        ),
    ],
)
def test_a_bedrock_arn_is_called_in_its_region_and_routed_as_its_profile_says(
    model: str, allowed: list[str], where: str | None
) -> None:
    problems = model_problems(model, allowed)

    if where is None:
        assert problems == []
    else:
        [(field, reason)] = problems
        assert field == "model.name"
        assert reason.startswith(f"compliance.allowed_regions [{', '.join(allowed)}] refuses: ")
        assert reason.endswith(f"{model}{where}")


def test_an_application_inference_profile_routes_where_endpoint_regions_says() -> None:
    """Its id does not say whether it copies one region's model or a cross-region profile:
    the spec can say where it routes, keyed by its ARN."""
    arn = APP_ARN.format(region="eu-central-1")
    named = {"endpoint_regions": {arn: "eu"}}

    assert model_problems(arn, ["eu"], **named) == []
    [(field, reason)] = model_problems(arn, ["eu-central-1"], **named)
    assert (field, reason) == (
        "compliance.endpoint_regions",
        f"compliance.allowed_regions [eu-central-1] refuses: Bedrock application inference "
        f"profile {arn}, routed in eu as compliance.endpoint_regions says (eu)",
    )
    assert model_problems(arn, ["eu-central-1"]) == []  # unnamed: taken as its ARN's region


def test_validate_spec_reports_a_refused_provider(tmp_path: Path) -> None:
    spec = review_spec("anthropic", "claude-haiku-4-5", compliance=EU)
    path = tmp_path / "reviews.yaml"
    path.write_text(yaml.safe_dump(spec))

    result = CliRunner().invoke(main, ["validate-spec", str(path)], env={"COLUMNS": "300"})

    assert result.exit_code == 1
    assert (
        f"{path}: model.provider: compliance.allowed_regions [eu] refuses: Anthropic Message "
        "Batches API (no regional guarantee)"
    ) in " ".join(result.stderr.split())


# Job start: the provider and the storage as configured


def test_a_non_eu_openai_endpoint_is_refused_before_anything_is_sent(
    tmp_path: Path, database_url: str
) -> None:
    compliance = {**EU, "endpoint_regions": {"127.0.0.1": "us-east-1"}}
    with FakeOpenAI(tmp_path / "fake") as fake:
        fake.responder = truthful
        with fake_harness(tmp_path, database_url, fake, compliance=compliance) as harness:
            with pytest.raises(StepFailed) as refused:
                harness.runner().run_day(DAY, wait=True)

            assert refused.value.gate == steps.RESIDENCY
            assert (
                "request_shards: residency gate: reviews_openai 2026-11-02: "
                "compliance.allowed_regions [eu] refuses: OpenAI endpoint "
                f"{fake.base_url.rstrip('/')} in us-east-1 (us); this step wrote and sent nothing"
            ) in str(refused.value)
            with pytest.raises(steps.MissingPrerequisite):
                harness.job_id()  # request_shards made no job and wrote no shard
            assert not (harness.home / "artifacts" / "shards").exists()
        assert fake.calls.entries() == []


def test_an_eu_endpoint_named_in_endpoint_regions_passes(tmp_path: Path, database_url: str) -> None:
    compliance = {**EU, "endpoint_regions": {"127.0.0.1": "eu"}}
    with FakeOpenAI(tmp_path / "fake") as fake:
        fake.responder = truthful
        with fake_harness(tmp_path, database_url, fake, 12, compliance=compliance) as harness:
            outcome = harness.run_day()

        assert outcome.done and outcome.succeeded == 12
        assert len(fake.submitted_custom_ids()) == 12


def test_provider_batches_refuses_an_endpoint_moved_out_of_the_regions(
    tmp_path: Path, database_url: str
) -> None:
    """The submission step asks again: shards made while the endpoint was allowed are not
    sent once it is not."""
    allowed = {**EU, "endpoint_regions": {"127.0.0.1": "eu"}}
    with FakeOpenAI(tmp_path / "fake") as fake:
        with fake_harness(tmp_path, database_url, fake, compliance=allowed) as harness:
            assert harness.materialize("input_snapshot", "request_shards").success
            harness.spec = spec_of(
                "openai",
                "gpt-4o-mini",
                compliance={**EU, "endpoint_regions": {"127.0.0.1": "us-west-2"}},
            )

            result = harness.materialize("provider_batches")

            assert not result.success
            [failure] = [e for e in result.all_events if e.is_step_failure]
            data = failure.step_failure_data.user_failure_data
            assert data is not None and data.metadata["gate"].value == "residency"
            assert "in us-west-2 (us)" in (data.description or "")
            shards = harness.ledger.shards(harness.job_id())
            assert shards and {s.status for s in shards} == {"created"}
        assert fake.calls.entries() == []


def bedrock_spec(endpoint_region: str | None) -> dict[str, Any]:
    """A Bedrock spec allowing the eu, whose fake endpoint on 127.0.0.1 stands for Bedrock in
    `endpoint_region` (None: a host the spec does not name)."""
    named = {"endpoint_regions": {"127.0.0.1": endpoint_region}} if endpoint_region else {}
    return review_spec(
        "bedrock",
        BEDROCK_MODEL,
        bedrock={"min_records_per_job": 50},
        sharding={"max_requests_per_shard": 100},
        compliance={**EU, **named},
    )


def bedrock_in(fake: FakeBedrock, region: str, **settings: Any) -> BedrockBatchProvider:
    return BedrockBatchProvider(
        role_arn=ROLE,
        endpoint_url=fake.endpoint_url,
        runtime_endpoint_url=fake.endpoint_url,
        region_name=region,
        retry_base_seconds=0.01,
        **settings,
    )


@pytest.mark.fake_server("bedrock", min_records=50, responder=bedrock_truthful)
def test_a_us_bedrock_endpoint_and_staging_bucket_are_refused_and_nothing_is_created(
    tmp_path: Path, database_url: str, moto_s3: MotoS3, fake: FakeBedrock
) -> None:
    staging = bucket_in(moto_s3, "us-east-1")
    provider = bedrock_in(fake, "us-east-1", staging_uri=f"s3://{staging}/bedrock")
    spec = bedrock_spec("us-east-1")
    with (
        open_harness(tmp_path, database_url, spec, provider, reviews=60) as harness,
        pytest.raises(StepFailed) as refused,
    ):
        harness.run_day()

    assert refused.value.gate == "residency"
    assert (
        f"compliance.allowed_regions [eu] refuses: Bedrock endpoint {fake.endpoint_url} in "
        f"us-east-1 (us); Bedrock runtime endpoint {fake.endpoint_url} in us-east-1 (us); "
        f"Bedrock staging bucket {staging} in us-east-1 (us);"
    ) in str(refused.value)
    assert fake.jobs() == []
    assert objects_in(moto_s3, staging) == []


@pytest.mark.fake_server("bedrock", min_records=50, responder=bedrock_truthful)
def test_a_bedrock_endpoint_the_spec_does_not_name_is_refused(
    tmp_path: Path, database_url: str, moto_s3: MotoS3, fake: FakeBedrock
) -> None:
    """The client's region does not vouch for an endpoint that may forward anywhere."""
    provider = bedrock_in(fake, "eu-central-1")
    with (
        open_harness(tmp_path, database_url, bedrock_spec(None), provider, reviews=60) as harness,
        pytest.raises(StepFailed) as refused,
    ):
        harness.run_day()

    assert refused.value.gate == "residency"
    assert (
        f"compliance.allowed_regions [eu] refuses: Bedrock endpoint {fake.endpoint_url} (region "
        "unknown: name its region under compliance.endpoint_regions (127.0.0.1: <region>));"
    ) in " ".join(str(refused.value).split())
    assert fake.jobs() == []


@pytest.mark.fake_server("bedrock", min_records=50, responder=bedrock_truthful)
def test_an_eu_bedrock_endpoint_with_an_eu_bucket_passes(
    tmp_path: Path, database_url: str, moto_s3: MotoS3, fake: FakeBedrock
) -> None:
    bucket = bucket_in(moto_s3, "eu-west-1")
    provider = bedrock_in(fake, "eu-central-1")
    spec = bedrock_spec("eu-central-1")
    with open_harness(tmp_path, database_url, spec, provider, reviews=60) as harness:
        harness.storage = ArtifactStorage(base_url=f"s3://{bucket}/artifacts")

        result = harness.materialize("input_snapshot", "request_shards", "provider_batches")

        assert result.success
        [job] = fake.jobs()
        assert job["jobArn"].startswith("arn:aws:bedrock:eu-central-1:")
        assert any(key.startswith("artifacts/shards/") for key in objects_in(moto_s3, bucket))


def local_provider(tmp_path: Path) -> LocalProvider:
    return LocalProvider(state_dir=str(tmp_path / "local_provider"), work_budget_seconds=600.0)


def local_spec(**overrides: Any) -> dict[str, Any]:
    spec = review_spec("local", "all-MiniLM-L6-v2", **overrides)
    spec["output"] = {
        "format": "json",
        "schema": {"label": {"type": "str", "isin": ["positive", "negative"]}},
    }
    return spec


@contextlib.contextmanager
def local_day_in(
    tmp_path: Path, database_url: str, bucket: str, **overrides: Any
) -> Iterator[Harness]:
    """Six reviews for the local provider, the day's artifacts in `bucket`."""
    spec, provider = local_spec(**overrides), local_provider(tmp_path)
    with open_harness(tmp_path, database_url, spec, provider, reviews=6) as harness:
        harness.storage = ArtifactStorage(base_url=f"s3://{bucket}/artifacts")
        yield harness


def test_an_artifact_bucket_in_the_us_is_refused_before_the_snapshot_is_written(
    tmp_path: Path, database_url: str, moto_s3: MotoS3
) -> None:
    bucket = bucket_in(moto_s3, "us-east-1")
    with local_day_in(tmp_path, database_url, bucket, compliance=EU) as harness:
        result = harness.materialize("input_snapshot")

        assert not result.success
        [failure] = [e for e in result.all_events if e.is_step_failure]
        data = failure.step_failure_data.user_failure_data
        assert data is not None
        assert (
            f"compliance.allowed_regions [eu] refuses: artifact bucket {bucket} in us-east-1 (us);"
        ) in (data.description or "")
    assert objects_in(moto_s3, bucket) == []


def test_an_artifact_bucket_in_the_eu_is_accepted(
    tmp_path: Path, database_url: str, moto_s3: MotoS3
) -> None:
    bucket = bucket_in(moto_s3, "eu-west-1")
    with local_day_in(tmp_path, database_url, bucket, compliance=EU) as harness:
        outcome = harness.run_day()

    assert outcome.done and outcome.succeeded == 6
    assert any(key.startswith("artifacts/outputs/") for key in objects_in(moto_s3, bucket))


def test_an_unrestricted_spec_asks_for_no_region(
    tmp_path: Path, database_url: str, moto_s3: MotoS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = bucket_in(moto_s3, "us-east-1")
    asked: list[str] = []
    monkeypatch.setattr(residency, "bucket_region", asked.append)
    with local_day_in(tmp_path, database_url, bucket) as harness:
        outcome = harness.run_day()

    assert outcome.done and outcome.succeeded == 6
    assert asked == []


def test_a_bucket_s_region_is_asked_once_per_process(moto_s3: MotoS3) -> None:
    bucket = bucket_in(moto_s3, "eu-west-1")
    assert bucket_region(bucket) == "eu-west-1"
    moto_s3.client().delete_bucket(Bucket=bucket)

    assert bucket_region(bucket) == "eu-west-1"  # from the cache, no second call
    forget_bucket_regions()
    place = residency.bucket_place("artifact bucket", f"s3://{bucket}/x")
    assert place == Place(what=f"artifact bucket {bucket}", status="unknown", hint=place.hint)
    assert "NoSuchBucket" in place.hint


def test_cli_run_exits_2_naming_the_refused_endpoint(tmp_path: Path, database_url: str) -> None:
    spec = review_spec(
        "openai", "gpt-4o-mini", compliance={**EU, "endpoint_regions": {"127.0.0.1": "us"}}
    )
    write_reviews(tmp_path / "home", DAY, 6)
    with FakeOpenAI(tmp_path / "fake") as fake:
        done = cli_process.run(
            [CLI, "run", spec["name"], "--date", DAY.isoformat()],
            env={**cli_env(tmp_path, database_url, spec, fake), "NO_COLOR": "1", "COLUMNS": "300"},
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        calls = fake.calls.entries()

    assert done.returncode == 2, done.stderr
    stderr = " ".join(done.stderr.split())
    assert "blocked: reviews_openai__request_shards: residency gate:" in stderr
    assert (
        f"compliance.allowed_regions [eu] refuses: OpenAI endpoint {fake.base_url.rstrip('/')} (us)"
    ) in stderr
    assert calls == []
