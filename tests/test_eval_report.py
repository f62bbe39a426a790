"""The eval report beyond labels: a number scored as 1 − MAE/span, free text by length and
embedding similarity, sampled items without a reference or still open, and a number scored
against the baseline. Six reviews of one day run through the fake OpenAI server, whose
answers per review are fixed below so every score is computed by hand."""

import contextlib
import datetime as dt
import json
import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from llm_assets.evaluation.replay import Replay
from llm_assets.evaluation.report import EvalReport, Scoring, VariantReport, build_report
from llm_assets.evaluation.report_markdown import render_markdown
from llm_assets.evaluation.similarity import similarities
from llm_assets.spec.model import PipelineSpec
from tests.eval_harness import EvalWorld, eval_settings, write_reviews_with
from tests.fakes.openai_server import FakeOpenAI, user_text
from tests.harness import review_spec

# One database (PostgreSQL in CI): the replay drives the steps the pipeline tests cover on
# both databases.
pytestmark = pytest.mark.one_database

DAY = dt.date(2026, 11, 2)
REVIEWS = 6
"""Every review of the day is sampled (the sample asks for more)."""
OFF = "Answer off the cuff."
"""In the `off` variant's system prompt: the fake then gives that variant's answers."""

HUMAN_STARS = "human_stars"
STARS = [1, 2, 3, 4, 5, 3]
"""The reference: review n's stars as a human gave them."""
CLOSE_STARS = [1, 2, 4, 4, 4, 3]
"""The baseline's answers: one star off on reviews 2 and 4."""
FAR_STARS = [3, 4, 5, 2, 3, 1]
"""The off variant's answers: two stars off on every review."""
BOUNDS = {"ge": 1, "le": 5}
"""The declared range of stars: a span of 4."""

HUMAN_SUMMARY = "human_summary"
SUMMARIES = [
    "A good blender with a quiet motor.",
    "The kettle is terrible and the delivery was slow.",
    "Great headphones for the price.",
    "An awful router that took an hour to set up.",
    "The kids find the tablet case excellent.",
    "A disappointing blender, though its motor is quiet.",
]
"""The reference summaries of the reviews (tests.harness.write_reviews' texts)."""
PARAPHRASES = [
    "The blender works well and its motor runs quietly.",
    "Slow delivery, and the kettle is awful.",
    "These headphones are excellent value for money.",
    "The router was bad and slow to set up.",
    "Children love this tablet case.",
    "The blender disappoints, but the motor is silent.",
]
UNRELATED = [
    "Penguins live on the ice of Antarctica.",
    "The stock market closed higher on Friday.",
    "Bake the bread for forty minutes.",
    "Jupiter is the largest planet of the solar system.",
    "The orchestra tuned its violins before the concert.",
    "Rain is expected on Tuesday afternoon.",
]


def review_number(body: dict[str, Any]) -> int:
    """n of the review "... Order {1000 + n} arrived." (tests.harness.write_reviews)."""
    return int(user_text(body).split("Order ")[1].split(" ")[0]) - 1000


def is_off(body: dict[str, Any]) -> bool:
    system = next((m["content"] for m in body["messages"] if m.get("role") == "system"), "")
    return OFF in str(system)


def stars_answer(body: dict[str, Any]) -> str:
    answers = FAR_STARS if is_off(body) else CLOSE_STARS
    return json.dumps({"stars": answers[review_number(body)]})


def summary_answer(body: dict[str, Any]) -> str:
    answers = UNRELATED if is_off(body) else PARAPHRASES
    return answers[review_number(body)]


def stars_spec(reference: str | None, bounds: dict[str, int], **prompt: str) -> dict[str, Any]:
    spec = review_spec(
        "openai",
        "gpt-4o-mini",
        name="stars",
        prompt={"system": "Rate the review from 1 to 5 stars. Return JSON.", **prompt},
        output={"format": "json", "schema": {"stars": {"type": "int", **bounds}}},
    )
    spec["eval"] = {"reference_field": reference} if reference else {}
    return spec


def summary_spec(**prompt: str) -> dict[str, Any]:
    spec = review_spec(
        "openai",
        "gpt-4o-mini",
        name="summaries",
        prompt={"system": "Summarize the review in one sentence.", **prompt},
        output={"format": "text", "schema": {}},
    )
    spec["eval"] = {"reference_field": HUMAN_SUMMARY}
    return spec


def with_off_variant(make: Callable[..., dict[str, Any]], *args: Any) -> dict[str, PipelineSpec]:
    """The baseline made by `make(*args)`, and the variant `off`: prompt v2 telling the fake to
    give the off answers."""
    baseline = make(*args)
    off = make(*args, version="v2", system=f"{baseline['prompt']['system']} {OFF}")
    return {
        "baseline": PipelineSpec.model_validate(baseline),
        "off": PipelineSpec.model_validate(off),
    }


def write_references(home: Path, references: dict[str, list[Any]]) -> None:
    """The day's reviews, each with a value of every reference column (a column the prompt
    never reads); a value of `...` leaves the column out of that row."""

    def columns(n: int, *_: Any) -> dict[str, Any]:
        return {k: v[n] for k, v in references.items() if v[n] is not ...}

    write_reviews_with(home, DAY, REVIEWS, columns)


@dataclass
class World(EvalWorld):
    snapshotted: set[str] = field(default_factory=set)

    def replay(self, variants: dict[str, PipelineSpec], wait: bool = True) -> Replay:
        """The day's snapshot for the baseline's pipeline (once), then the replay of every
        review through each variant."""
        spec = variants["baseline"]
        if spec.name not in self.snapshotted:
            self.take_snapshot(spec, DAY)
            self.snapshotted.add(spec.name)
        return self.run_eval(spec, variants, [DAY], size=REVIEWS + 4, seed=7, wait=wait)

    def report(self, variants: dict[str, PipelineSpec], wait: bool = True) -> EvalReport:
        result = self.replay(variants, wait=wait)
        return build_report(variants["baseline"], result, self.ledger, self.storage)


@contextlib.contextmanager
def open_world(
    tmp_path: Path, database_url: str, references: dict[str, list[Any]]
) -> Iterator[World]:
    """The day's reviews with `references` (write_references) and the fake OpenAI server."""
    settings = eval_settings(tmp_path, database_url)
    write_references(settings.home, references)
    with FakeOpenAI(tmp_path / "fake_openai") as openai:
        yield World(settings=settings, openai=openai)
        assert openai.server_errors == []


@pytest.fixture
def world(tmp_path: Path, database_url: str) -> Iterator[World]:
    with open_world(tmp_path, database_url, {HUMAN_STARS: STARS, HUMAN_SUMMARY: SUMMARIES}) as w:
        yield w


def report_with_off(
    world: World,
    answer: Callable[[dict[str, Any]], str],
    make: Callable[..., dict[str, Any]],
    *args: Any,
) -> tuple[EvalReport, VariantReport, VariantReport]:
    """The report of the fake answering by `answer` to `make(*args)` and its off variant
    (with_off_variant), and the two variants' part of it."""
    world.openai.responder = answer
    report = world.report(with_off_variant(make, *args))
    return report, report.variant("baseline"), report.variant("off")


def mae(gold: list[int], predicted: list[int]) -> float:
    return statistics.fmean(abs(g - p) for g, p in zip(gold, predicted, strict=True))


def test_a_number_scores_one_minus_its_mean_absolute_error_over_the_declared_span(
    world: World,
) -> None:
    report, baseline, off = report_with_off(world, stars_answer, stars_spec, HUMAN_STARS, BOUNDS)

    assert report.scoring == Scoring(
        field="stars", kind="number", against=HUMAN_STARS, metric="1 − MAE/span", span=4.0
    )
    assert mae(STARS, CLOSE_STARS) == pytest.approx(2 / 6)
    assert mae(STARS, FAR_STARS) == 2.0
    for variant, expected in ((baseline, 2 / 6), (off, 2.0)):
        assert variant.mae is not None
        assert (variant.mae.n, variant.mae.unscored, variant.mae.missing) == (REVIEWS, 0, 0)
        assert variant.mae.mae == pytest.approx(expected)
        assert variant.n == REVIEWS
        assert variant.score == pytest.approx(1 - expected / 4)
        assert variant.interval is not None
        assert variant.interval.low <= variant.score <= variant.interval.high
        assert (variant.categorical, variant.kappa, variant.lengths) == (None, None, None)
    assert off.score is not None and baseline.score is not None and off.score < baseline.score
    # Every answer is in and scored: the report recommends, and notes nothing.
    assert report.notes == []
    # Both pass (no eval.min_score); the baseline's shorter prompt costs less.
    assert report.recommendation is not None and report.recommendation.chosen is not None
    assert report.recommendation.chosen.name == "baseline"
    assert "`stars` (number) scored against human_stars as 1 − MAE/span" in render_markdown(report)


def test_similarities_are_cosines_of_the_local_model_none_where_a_side_is_missing() -> None:
    same = "The kettle boils water quickly and quietly."

    scores = similarities(
        [same, same, None, "", "The delivery was late."],
        [same, None, same, same, "The parcel arrived after the promised day."],
    )

    assert scores[0] == pytest.approx(1.0, abs=1e-5)
    assert scores[1:4] == [None, None, None]
    assert scores[4] is not None and 0 < scores[4] < 1
    assert similarities([None], ["an answer"]) == [None]
    with pytest.raises(ValueError, match="differ in length"):
        similarities(["a"], [])


def test_free_text_scores_its_length_and_its_similarity_to_the_reference(world: World) -> None:
    report, baseline, off = report_with_off(world, summary_answer, summary_spec)

    assert report.scoring == Scoring(
        field="text", kind="text", against=HUMAN_SUMMARY, metric="similarity", span=None
    )
    for variant, answers in ((baseline, PARAPHRASES), (off, UNRELATED)):
        assert variant.lengths is not None
        assert (variant.lengths.n, variant.lengths.missing) == (REVIEWS, 0)
        assert variant.lengths.mean_chars == pytest.approx(statistics.fmean(map(len, answers)))
        assert variant.lengths.median_chars == statistics.median(map(len, answers))
        assert variant.n == REVIEWS
        assert variant.mae is None and variant.categorical is None
    # The score is the mean cosine of each answer to its reference summary.
    expected = similarities(SUMMARIES, PARAPHRASES)
    assert baseline.score == pytest.approx(statistics.fmean(c for c in expected if c is not None))
    assert baseline.score is not None and 0.5 < baseline.score <= 1
    assert baseline.interval is not None
    assert baseline.interval.low <= baseline.score <= baseline.interval.high
    assert off.score is not None and off.score < 0.3 < baseline.score
    # Unrelated answers' cosines fall a little below 0 too: they count as 0.
    assert min(c for c in similarities(SUMMARIES, UNRELATED) if c is not None) == 0.0
    assert report.notes == []


def test_items_without_a_reference_are_not_scored_and_the_report_names_them(
    tmp_path: Path, database_url: str
) -> None:
    # Review 1's human_stars is blank and review 4 has none; review 3's is text, as a CSV
    # gives it. With no declared bounds the span is the scored references' own range, 1..4.
    stars: list[Any] = [*STARS]
    stars[1], stars[3], stars[4] = "", str(STARS[3]), ...
    with open_world(tmp_path, database_url, {HUMAN_STARS: stars}) as world:
        report, baseline, off = report_with_off(world, stars_answer, stars_spec, HUMAN_STARS, {})

    assert report.scoring.span == 3.0
    scored = [n for n in range(REVIEWS) if n not in (1, 4)]
    for variant, answers in ((baseline, CLOSE_STARS), (off, FAR_STARS)):
        expected = statistics.fmean(abs(STARS[n] - answers[n]) for n in scored)
        assert variant.mae is not None
        assert (variant.mae.n, variant.mae.unscored) == (len(scored), 2)
        assert variant.mae.mae == pytest.approx(expected)
        assert variant.n == len(scored)
        assert variant.score == pytest.approx(1 - min(1.0, expected / 3))
    [note] = report.notes
    assert note.startswith(f"2 of {REVIEWS} sampled items have no 'human_stars'")
    assert f"- {note}" in render_markdown(report)


def test_open_items_leave_the_report_without_a_recommendation_until_they_are_in(
    world: World,
) -> None:
    world.openai.responder = stars_answer
    world.openai.polls_per_state = 1000  # batches stay in progress
    variants = with_off_variant(stars_spec, HUMAN_STARS, BOUNDS)

    report = world.report(variants, wait=False)

    for name in ("baseline", "off"):
        variant = report.variant(name)
        assert (variant.items, variant.open_items, variant.succeeded) == (REVIEWS, REVIEWS, 0)
        assert variant.failure_rate == 0.0
        assert (variant.score, variant.interval, variant.n) == (None, None, 0)
    assert report.recommendation is None
    [note] = report.notes
    assert note.startswith("items still open (")
    assert "no recommendation until every answer is in" in note
    assert "**Recommendation:**" not in render_markdown(report)

    # Carried on: every answer in, the same eval recommends.
    world.openai.polls_per_state = 0
    done = world.report(variants)

    assert done.recommendation is not None and done.notes == []
    assert done.variant("baseline").score == pytest.approx(1 - (2 / 6) / 4)


def test_without_a_reference_a_number_scores_against_the_baseline(world: World) -> None:
    report, baseline, off = report_with_off(world, stars_answer, stars_spec, None, BOUNDS)

    assert (report.scoring.against, report.scoring.kind, report.scoring.span) == (
        "baseline",
        "number",
        4.0,
    )
    assert baseline.mae is not None and baseline.mae.mae == 0.0
    assert baseline.score == 1.0
    apart = mae(CLOSE_STARS, FAR_STARS)
    assert apart == pytest.approx(10 / 6)
    assert off.mae is not None and off.mae.mae == pytest.approx(apart)
    assert off.score == pytest.approx(1 - apart / 4)
    assert report.notes == []
