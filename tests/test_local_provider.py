"""The embedded provider against the real model: what it produces and its batch lifecycle."""

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from llm_assets.resources.providers.base import ItemResult, RequestItem, ShardState, ShardSubmission
from llm_assets.resources.providers.local import BatchNotEndedError, LocalProvider
from llm_assets.resources.providers.local_engine import ELLIPSIS, LocalEngine
from llm_assets.resources.providers.local_plans import local_spec_problems
from llm_assets.resources.storage import ArtifactStorage
from llm_assets.results.validation import parse_output
from llm_assets.spec.model import PipelineSpec

LABELS = ["billing", "technical_issue", "account_access", "shipping", "product_feedback"]

TICKETS: list[tuple[str, str]] = [
    (
        "billing",
        "Subject: Charged twice this month\nHi, I was charged twice for my subscription in "
        "March. Please refund the duplicate payment to my credit card.\nThanks, Ana",
    ),
    (
        "billing",
        "My invoice shows the wrong amount. I was billed $49 instead of the $29 plan I signed "
        "up for. Can you correct the charge?",
    ),
    (
        "technical_issue",
        "The app crashes every time I open the settings page on Android. I've reinstalled it "
        "twice and it still shows an error and closes.",
    ),
    (
        "technical_issue",
        "Subject: Error 500 on export\nWhen I click Export to CSV the page hangs and then "
        "returns a server error 500. This is a bug that started after yesterday's update.",
    ),
    (
        "account_access",
        "I can't log in to my account. The password reset email never arrives and I'm locked "
        "out after too many attempts.",
    ),
    (
        "account_access",
        "Two-factor authentication codes are not accepted, so I cannot sign in. Please help me "
        "regain access to my account.",
    ),
    (
        "shipping",
        "My package was supposed to arrive last Tuesday but the tracking number hasn't updated "
        "in a week. Where is my order?",
    ),
    (
        "shipping",
        "Subject: Wrong delivery address\nThe courier delivered my parcel to the wrong address. "
        "Can you reship the order or contact the carrier?",
    ),
    (
        "product_feedback",
        "I love the new dashboard design! It would be great if you could add a dark mode and "
        "let us customize the widgets.",
    ),
    (
        "product_feedback",
        "Feature request: please add an option to export reports as PDF. Overall the product "
        "is great and my team enjoys using it.",
    ),
]

LONG_TICKET = """Subject: Re: Re: Ongoing problems
Hello support team,
I hope you are doing well. I have been using your service for about three years now at our \
company, and most of the time it has been reliable for our daily work. Our team of twelve \
people relies on it for sharing documents with clients, so this matters a lot to us.
Since last Thursday, however, things have gone wrong. Every time one of us tries to upload a \
file larger than 10 MB, the upload bar gets stuck at 99% and then the app shows "Error 500: \
internal server error". We tried different browsers (Chrome, Firefox and Safari), cleared the \
cache, and even reinstalled the desktop client, but nothing helped. The desktop sync also \
stopped working: files saved on our laptops never appear in the web app, and the log file \
shows repeated connection timeout messages.
We checked our network and firewall with our IT department and nothing changed on our side. \
Other websites work fine. A colleague in another office has exactly the same issue, so it \
does not seem to be local to one machine.
Could you please look into this bug as soon as possible? We have a client deadline on Friday \
and need the uploads to work. I can send screenshots and the full log files if that helps \
your engineers debug the crash.
Thank you in advance for your help,
Best regards,
Maria Gonzalez
IT coordinator"""

SYSTEM = "Classify the support ticket and summarize it in one or two sentences."
TICKET_SCHEMA: dict[str, Any] = {
    "category": {"type": "str", "isin": LABELS},
    "confidence": {"type": "float", "ge": 0, "le": 1},
    "summary": {"type": "str", "min_length": 10, "max_length": 200},
}


def make_spec(
    schema: dict[str, Any] | None = None,
    *,
    output_format: str = "json",
    name: str = "all-MiniLM-L6-v2",
    options: dict[str, Any] | None = None,
) -> PipelineSpec:
    return PipelineSpec.model_validate(
        {
            "name": "support_tickets",
            "source": {
                "kind": "jsonl",
                "uri": "tickets/*.jsonl",
                "id_field": "ticket_id",
                "date_field": "created_at",
                "fields": ["body"],
            },
            "prompt": {"version": "v1", "system": SYSTEM, "template": "{body}"},
            "model": {"provider": "local", "name": name, "options": options or {}},
            "output": {
                "format": output_format,
                "schema": TICKET_SCHEMA if schema is None else schema,
            },
            "partitions": {"start_date": "2024-01-01"},
        }
    )


def normalized(text: str) -> str:
    return " ".join(text.split())


def assert_extractive(summary: str, source: str) -> None:
    """Every sentence of the summary is a sentence (or the cut head of one) of the source."""
    flat = normalized(source)
    for piece in re.split(r"(?<=[.!?…])\s+", summary):
        fragment = piece.removesuffix(ELLIPSIS).rstrip(".,!?")
        assert fragment, summary
        assert fragment in flat, f"{fragment!r} is not in the source"


@pytest.fixture(scope="module")
def engine() -> LocalEngine:
    return LocalEngine.shared()


@pytest.fixture
def storage(tmp_path: Path) -> ArtifactStorage:
    return ArtifactStorage(base_url=str(tmp_path / "artifacts"))


@pytest.fixture
def provider(tmp_path: Path) -> LocalProvider:
    return LocalProvider(
        state_dir=str(tmp_path / "local_provider"), work_budget_seconds=0.0, chunk_size=4
    )


def write_shard(
    tmp_path: Path, lines: list[dict[str, Any]] | list[str], shard_id: str = "shard-1"
) -> ShardSubmission:
    path = tmp_path / f"{shard_id}.jsonl"
    path.write_text(
        "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines),
        encoding="utf-8",
    )
    return ShardSubmission(
        shard_id=shard_id,
        job_id="job-1",
        pipeline="support_tickets",
        input_uri=str(path),
        item_count=len(lines),
    )


def ticket_lines(provider: LocalProvider, spec: PipelineSpec) -> list[dict[str, Any]]:
    items = [
        RequestItem(custom_id=f"t-{i}", system=SYSTEM, user=text)
        for i, (_, text) in enumerate(TICKETS)
    ]
    items.append(RequestItem(custom_id="t-long", system=SYSTEM, user=LONG_TICKET))
    items.append(RequestItem(custom_id="t-empty", system=SYSTEM, user="  \n"))
    items.append(RequestItem(custom_id="t-huge", system=SYSTEM, user="word " * 9000))
    return [provider.request_line(spec, item) for item in items]


def batch_dir(provider: LocalProvider, batch_id: str) -> Path:
    return Path(provider.state_dir) / "batches" / batch_id


def test_classifies_clear_tickets(engine: LocalEngine) -> None:
    texts = [text for _, text in TICKETS] + [LONG_TICKET]
    expected = [label for label, _ in TICKETS] + ["technical_issue"]
    predictions = engine.classify(texts, LABELS)
    right = sum(label == want for (label, _), want in zip(predictions, expected, strict=True))
    assert right >= 9, predictions
    assert predictions[-1][0] == "technical_issue", "a long ticket classifies by its content"
    assert all(0.0 <= confidence <= 1.0 for _, confidence in predictions)


def test_label_descriptions_steer_classification(engine: LocalEngine) -> None:
    descriptions = {
        "refund": "the customer wants money back for a charge",
        "bug": "software crashes, errors or broken features",
    }
    got = engine.classify([TICKETS[0][1], TICKETS[2][1]], ["refund", "bug"], descriptions)
    assert [label for label, _ in got] == ["refund", "bug"]


def test_summaries_are_extractive_bounded_and_never_empty(engine: LocalEngine) -> None:
    texts = [text for _, text in TICKETS] + [LONG_TICKET, "Refund please", "Subject: Hi"]
    for min_chars, max_chars in ((10, 200), (0, 60), (0, 25), (80, 400)):
        summaries = engine.summarize(texts, min_chars, max_chars)
        for summary, text in zip(summaries, texts, strict=True):
            assert summary.strip(), text
            assert len(summary) <= max_chars
            if len(normalized(text)) >= min_chars + 20:
                assert len(summary) >= min(min_chars, max_chars), (summary, text)
            assert_extractive(summary, text)
    cut = engine.summarize([TICKETS[2][1]], 0, 25)[0]
    assert cut.endswith(ELLIPSIS) and len(cut) <= 25
    assert engine.summarize([LONG_TICKET], 10, 200) == engine.summarize([LONG_TICKET], 10, 200)
    assert "Subject" not in engine.summarize([TICKETS[3][1]], 0, 400)[0]


def test_embeddings_and_token_counts(engine: LocalEngine) -> None:
    vectors = engine.embed([TICKETS[0][1], LONG_TICKET, "x"])
    assert vectors.shape == (3, 384) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert engine.count_tokens("word " * 1000) == 1000
    assert engine.count_tokens("") == 0


def test_request_line_is_openai_batch_shape(provider: LocalProvider) -> None:
    spec = make_spec(options={"label_descriptions": {"billing": "payments and invoices"}})
    line = provider.request_line(spec, RequestItem(custom_id="a", system="s", user="u"))
    assert line["url"] == "/v1/chat/completions" and line["method"] == "POST"
    body = line["body"]
    assert body["messages"] == [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
    ]
    assert body["response_format"]["type"] == "json_schema"
    assert body["response_format"]["json_schema"]["strict"] is True
    assert body["x_local"] == {"label_descriptions": {"billing": "payments and invoices"}}
    text_spec = make_spec({"text": {"type": "str", "max_length": 120}}, output_format="text")
    text_line = provider.request_line(text_spec, RequestItem(custom_id="a", system="", user="u"))
    assert "response_format" not in text_line["body"]
    assert text_line["body"]["x_local"] == {"text_min_chars": 0, "text_max_chars": 120}


def test_full_lifecycle(
    provider: LocalProvider, storage: ArtifactStorage, tmp_path: Path, engine: LocalEngine
) -> None:
    spec = make_spec()
    lines = ticket_lines(provider, spec)
    shard = write_shard(tmp_path, lines)
    batch_id = provider.submit(shard, storage)
    assert batch_id.startswith("lb_")
    first = provider.poll(batch_id)
    assert first.state is ShardState.RUNNING and first.raw_status == "in_progress"
    assert first.total == len(lines)
    assert 0 < first.completed + first.failed < first.total
    with pytest.raises(BatchNotEndedError):
        next(iter(provider.results(batch_id)))

    assert provider.submit(shard, storage) == batch_id, "submit is idempotent"
    again = provider.poll(batch_id)
    assert again.completed + again.failed > first.completed + first.failed, "no reset"

    # A poll killed mid-write leaves half a line behind.
    with (batch_dir(provider, batch_id) / "output.jsonl").open("ab") as handle:
        handle.write(b'{"id": "batch_req_99", "custom_id": "t-9", "resp')

    seen = [first.state, again.state]
    status = again
    for _ in range(20):
        status = provider.poll(batch_id)
        seen.append(status.state)
        if status.ended:
            break
    assert status.state is ShardState.COMPLETED and status.raw_status == "completed"
    assert seen.count(ShardState.RUNNING) >= 3
    assert (status.completed, status.failed) == (len(lines) - 2, 2)

    results = list(provider.results(batch_id))
    ids = [r.custom_id for r in results]
    assert sorted(ids) == sorted(line["custom_id"] for line in lines), "each exactly once"
    by_id: dict[str, ItemResult] = {r.custom_id: r for r in results}

    right = 0
    for i, (label, text) in enumerate(TICKETS):
        result = by_id[f"t-{i}"]
        assert result.succeeded and result.status_code == 200 and result.finish_reason == "stop"
        assert result.input_tokens == engine.count_tokens(f"{SYSTEM}\n{text}")
        assert result.output_tokens == engine.count_tokens(result.output_text or "")
        parsed = parse_output(spec, result.output_text, result.finish_reason)
        assert parsed.ok, parsed
        assert parsed.value is not None
        right += parsed.value["category"] == label
        assert_extractive(parsed.value["summary"], text)
    assert right >= 8
    assert parse_output(spec, by_id["t-long"].output_text, "stop").ok

    empty, huge = by_id["t-empty"], by_id["t-huge"]
    assert not empty.succeeded and empty.error_code == "empty_input"
    assert not huge.succeeded and huge.error_code == "context_length_exceeded"
    for failed in (empty, huge):
        assert failed.status_code == 400 and failed.error_class == "deterministic"
        assert failed.error_message

    assert provider.poll(batch_id) == status, "an ended batch stays put"
    assert provider.submit(shard, storage) == batch_id


def test_text_and_embedding_outputs(
    provider: LocalProvider, storage: ArtifactStorage, tmp_path: Path
) -> None:
    work = LocalProvider(state_dir=provider.state_dir, work_budget_seconds=5.0)
    specs = {
        "text": make_spec({"text": {"type": "str", "max_length": 90}}, output_format="text"),
        "embedding": make_spec({"embedding": {"type": "list[float]"}}),
    }
    for kind, spec in specs.items():
        lines = [
            work.request_line(spec, RequestItem(custom_id=f"{kind}-{i}", system="", user=text))
            for i, (_, text) in enumerate(TICKETS[:3])
        ]
        batch_id = work.submit(write_shard(tmp_path, lines, shard_id=kind), storage)
        assert work.poll(batch_id).state is ShardState.COMPLETED
        for result in work.results(batch_id):
            parsed = parse_output(spec, result.output_text, result.finish_reason)
            assert parsed.ok and parsed.value is not None, parsed
            if kind == "embedding":
                assert len(parsed.value["embedding"]) == 384
            else:
                assert 0 < len(parsed.value["text"]) <= 90


def test_duplicate_custom_id_fails_validation(
    provider: LocalProvider, storage: ArtifactStorage, tmp_path: Path
) -> None:
    lines: list[Any] = ticket_lines(provider, make_spec())[:3]
    lines.append(dict(lines[1]))
    lines.append("{not json")
    batch_id = provider.submit(write_shard(tmp_path, lines), storage)
    status = provider.poll(batch_id)
    assert status.state is ShardState.FAILED and status.raw_status == "failed"
    assert status.message is not None
    assert "line 4" in status.message and "duplicate custom_id 't-1'" in status.message
    assert "line 5" in status.message
    assert list(provider.results(batch_id)) == []
    assert not (batch_dir(provider, batch_id) / "output.jsonl").exists()


def test_spec_problems() -> None:
    assert local_spec_problems(make_spec()) == []
    assert local_spec_problems(make_spec({"text": {"type": "str"}}, output_format="text")) == []
    schema = {**TICKET_SCHEMA, "priority": {"type": "int", "ge": 1, "le": 5}}
    problems = dict(
        local_spec_problems(
            make_spec(
                schema,
                name="gpt-4o-mini",
                options={"temperature_boost": 1, "label_descriptions": {"refunds": "x"}},
            )
        )
    )
    assert "cannot produce int fields" in problems["output.schema.priority"]
    assert "labels (str with isin)" in problems["output.schema.priority"]
    assert "temperature_boost" in problems["model.options"]
    assert "refunds" in problems["model.options.label_descriptions"]
    assert "all-MiniLM-L6-v2" in problems["model.name"]
    lonely = dict(local_spec_problems(make_spec({"score": {"type": "float", "ge": 0, "le": 1}})))
    assert "needs a label field" in lonely["output.schema.score"]
    odd = {
        "flag": {"type": "bool"},
        "tags": {"type": "list[str]"},
        "level": {"type": "int", "isin": [1, 2]},
        "amount": {"type": "float"},
        "label": {"type": "str", "isin": ["a", "b"], "nullable": True},
        "vector": {"type": "list[float]", "nullable": True},
    }
    found = dict(local_spec_problems(make_spec(odd)))
    assert set(found) == {
        "output.schema.flag",
        "output.schema.tags",
        "output.schema.level",
        "output.schema.amount",
    }
