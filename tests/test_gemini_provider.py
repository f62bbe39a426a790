"""The gemini adapter through the official google-genai SDK against the fake Gemini server."""

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.gemini_model import request_text
from tests.fakes.gemini_server import FakeGemini
from tests.harness import POSITIVE, Harness, open_harness, provider_for, review_spec

pytestmark = [pytest.mark.one_database, pytest.mark.fake_server("gemini")]


def truthful(request: dict[str, Any]) -> str:
    """Answers a GenerateContentRequest like a good model: the label the review implies."""
    text = request_text(request)
    label = "positive" if any(word in text.lower() for word in POSITIVE) else "negative"
    return json.dumps({"label": label, "summary": text.split(".")[0][:200]})


def first_time(faults: dict[int, str]) -> Callable[[str, dict[str, Any]], str | None]:
    """The fake's line_fault for review n (`faults[n]`) on its first submission only."""
    seen: set[str] = set()

    def fault(key: str, request: dict[str, Any]) -> str | None:
        text = request_text(request)
        for n, kind in faults.items():
            if f"Order {1000 + n} " in text and key not in seen:
                seen.add(key)
                return kind
        return None

    return fault


@pytest.fixture
def harness(tmp_path: Path, database_url: str, fake: FakeGemini) -> Iterator[Harness]:
    fake.responder = truthful
    spec = review_spec("gemini", "gemini-2.5-flash")
    with open_harness(tmp_path, database_url, spec, provider_for(fake)) as harness:
        yield harness


def test_a_day_completes(harness: Harness, fake: FakeGemini) -> None:
    outcome = harness.run_day()
    assert outcome.open_items == 0
    rows = harness.rows()
    assert len(rows) == len(harness.truth)
    assert all(r["status"] == "succeeded" for r in rows.values())
    assert harness.labels() == harness.truth
