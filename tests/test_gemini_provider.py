"""The gemini adapter through the official google-genai SDK against the fake Gemini server."""

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from llm_assets.resources.providers.gemini_lines import normalize_line
from llm_assets.resources.providers.registry import provider_spec_problems
from llm_assets.spec.model import PipelineSpec
from tests.fakes.gemini_model import request_text
from tests.fakes.gemini_server import FakeGemini
from tests.harness import POSITIVE, Harness, open_harness, provider_for, review_spec

pytestmark = [pytest.mark.one_database, pytest.mark.fake_server("gemini")]


def truthful(request: dict[str, Any]) -> str:
    """Answers a GenerateContentRequest like a good model: the label the review implies."""
    text = request_text(request)
    label = "positive" if any(word in text.lower() for word in POSITIVE) else "negative"
    return json.dumps({"label": label, "summary": text.split(".")[0][:200]})


@pytest.fixture
def harness(tmp_path: Path, database_url: str, fake: FakeGemini) -> Iterator[Harness]:
    fake.responder = truthful
    spec = review_spec("gemini", "gemini-2.5-flash")
    with open_harness(tmp_path, database_url, spec, provider_for(fake)) as harness:
        yield harness


def test_request_lines_carry_the_prompt_and_the_output_schema(
    harness: Harness, fake: FakeGemini
) -> None:
    assert harness.materialize("input_snapshot", "request_shards").success
    shard = harness.ledger.shards(harness.job_id())[0]
    line = json.loads(next(iter(harness.storage.open_lines(shard.input_uri))))
    assert set(line) == {"key", "request"}
    request = line["request"]
    assert request["systemInstruction"] == {"parts": [{"text": harness.spec.prompt.system}]}
    assert request["contents"][0]["role"] == "user"
    config = request["generationConfig"]
    assert config["maxOutputTokens"] == 100
    assert config["responseMimeType"] == "application/json"
    schema = config["responseSchema"]
    assert schema["type"] == "OBJECT"
    assert schema["propertyOrdering"] == ["label", "summary"]
    assert schema["properties"]["label"] == {"type": "STRING", "enum": ["positive", "negative"]}
    assert schema["properties"]["summary"] == {"type": "STRING", "minLength": 1, "maxLength": 200}
    assert "additionalProperties" not in schema


def test_a_refusal_s_prompt_is_billed_and_a_refused_request_is_not(
    harness: Harness, fake: FakeGemini
) -> None:
    """Gemini answers a blocked candidate (SAFETY) with the prompt's usage, and an invalid
    request with an error line and no usage: only the first is paid for."""
    faults = {"Order 1005 ": "safety", "Order 1007 ": "invalid_argument"}
    fake.line_fault = lambda key, request: next(
        (kind for marker, kind in faults.items() if marker in request_text(request)), None
    )
    assert harness.materialize("input_snapshot", "request_shards").success
    shard = harness.ledger.shards(harness.job_id())[0]
    batch_id = harness.provider.submit(harness.submission(shard.shard_id), harness.storage)
    while not harness.provider.poll(batch_id).ended:
        pass  # each poll is one get; the fake's batch moves on with every one

    results = list(harness.provider.results(batch_id))

    sources = {r["custom_id"]: r["source_id"] for r in harness.rows().values()}
    by_review = {sources[r.custom_id][-4:]: r for r in results}
    refusal, refused = by_review["0005"], by_review["0007"]
    assert (refusal.error_code, refusal.input_tokens > 0) == ("finish_SAFETY", True)
    assert (refused.error_code, refused.input_tokens, refused.output_tokens) == (
        "INVALID_ARGUMENT",
        0,
        0,
    )


def test_an_embeddings_day_runs_as_embeddings_batches(
    tmp_path: Path, database_url: str, fake: FakeGemini
) -> None:
    spec = review_spec(
        "gemini",
        "gemini-embedding-001",
        output={"format": "json", "schema": {"embedding": {"type": "list[float]"}}},
    )
    spec["output"] = {"format": "json", "schema": {"embedding": {"type": "list[float]"}}}
    with open_harness(tmp_path, database_url, spec, provider_for(fake)) as harness:
        outcome = harness.run_day()

        assert outcome.succeeded == len(harness.truth)
        assert {b["kind"] for b in fake.batches.values()} == {"embed"}
        vectors = [json.loads(r["result_json"])["embedding"] for r in harness.rows().values()]
        assert all(len(v) == 8 and abs(sum(x * x for x in v) - 1) < 1e-9 for v in vectors)


def test_spec_validation_knows_the_limits_of_gemini() -> None:
    spec = review_spec(
        "gemini",
        "gemini-2.5-flash",
        sharding={"max_requests_per_shard": 200_001},
        model={"options": {"temperature_x": 1}},
    )
    problems = dict(provider_spec_problems(PipelineSpec.model_validate(spec)))
    assert "at most 200000 requests" in problems["sharding.max_requests_per_shard"]
    assert "temperature_x" in problems["model.options"]
    fine = review_spec("gemini", "gemini-2.5-pro", sharding={"max_requests_per_shard": 200_000})
    assert provider_spec_problems(PipelineSpec.model_validate(fine)) == []


def test_result_lines_are_read_one_by_one() -> None:
    usage = {"promptTokenCount": 10, "candidatesTokenCount": 4, "thoughtsTokenCount": 6}
    parts = [{"text": "thinking...", "thought": True}, {"text": "an answer"}]
    answered = normalize_line(
        {
            "key": "a",
            "response": {
                "candidates": [{"content": {"parts": parts}, "finishReason": "MAX_TOKENS"}],
                "usageMetadata": {**usage, "cachedContentTokenCount": "3"},
            },
        }
    )
    assert answered is not None
    assert (answered.output_text, answered.finish_reason) == ("an answer", "length")
    assert (answered.input_tokens, answered.cached_input_tokens, answered.output_tokens) == (
        10,
        3,
        10,
    )
    for code, status, expected in [
        (429, "RESOURCE_EXHAUSTED", "transient"),
        (500, "INTERNAL", "transient"),
        (503, "UNAVAILABLE", "transient"),
        (504, "DEADLINE_EXCEEDED", "transient"),
        (400, "INVALID_ARGUMENT", "deterministic"),
        (404, "NOT_FOUND", "deterministic"),
    ]:
        failed = normalize_line(
            {"key": "b", "error": {"code": code, "message": "m", "status": status}}
        )
        assert failed is not None and not failed.succeeded
        assert failed.error_class == expected, code
    assert normalize_line({"response": {}}) is None  # no key: not ours
    recitation = normalize_line(
        {"key": "c", "response": {"candidates": [{"finishReason": "RECITATION"}]}}
    )
    assert recitation is not None
    assert (recitation.error_class, recitation.error_code) == ("deterministic", "finish_RECITATION")


def test_the_readme_example_of_a_gemini_model_section_is_a_valid_spec() -> None:
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    blocks = [b.split("```", 1)[0] for b in readme.split("```yaml\n")[1:]]
    [example] = [b for b in blocks if "provider: gemini" in b]
    spec = review_spec("gemini", "gemini-2.5-flash", **yaml.safe_load(example))
    assert provider_spec_problems(PipelineSpec.model_validate(spec)) == []
