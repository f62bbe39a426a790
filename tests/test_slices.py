"""A day's shard building in slices (sharding.slices): steps of their own joined before
submission, with the outcome of a build in one step, whatever the rows and however they
fall into slices."""

import array
import concurrent.futures
import dataclasses
import datetime as dt
import json
import tempfile
import threading
from collections import Counter
from pathlib import Path
from typing import Any
from unittest import mock

import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llm_assets import names, steps
from llm_assets.defs.factory import asset_key
from llm_assets.defs.run_failures import StepFailed
from llm_assets.items import ids as custom_ids
from llm_assets.resources.ledger import JobRecord, LedgerResource, output_table
from llm_assets.resources.providers.openai_batch import OpenAIBatchProvider
from llm_assets.resources.storage import ArtifactStorage
from llm_assets.resources.storage_lines import line_blocks
from llm_assets.spec.model import PipelineSpec
from llm_assets.steps import judge, validate
from llm_assets.steps import shards as shard_steps
from llm_assets.steps.lifecycle import SLICE_JOIN_GRACE, UNJOINED
from llm_assets.steps.shards import slice_blocks
from tests.fakes.openai_server import FakeOpenAI, user_text
from tests.harness import DAY, fake_harness, review_spec, truthful
from tests.test_crash import assert_provider_invariants

pytestmark = pytest.mark.fake_server("openai", responder=truthful)

_IDS = ("a", "b", "c", "d", "e", "f", "g")


@st.composite
def _rows(draw: st.DrawFn) -> list[str]:
    """Source lines of one day: few distinct ids so that some repeat (within a slice and
    across slices), rows without an id, with a bad date, an empty text, personal data, and
    lines that are not JSON."""
    lines = []
    for n in range(draw(st.integers(1, 30))):
        kind = draw(st.sampled_from(["ok"] * 6 + ["no_id", "bad_date", "empty", "email", "junk"]))
        if kind == "junk":
            lines.append("{not json")
            continue
        record: dict[str, Any] = {
            "review_id": draw(st.sampled_from(_IDS)) + draw(st.sampled_from(["", "1"])),
            "created_at": f"{DAY.isoformat()}T00:00:{n % 60:02d}Z",
            "text": f"Review {n}: the kettle is good.",
        }
        if kind == "no_id":
            del record["review_id"]
        elif kind == "bad_date":
            record["created_at"] = "someday"
        elif kind == "empty":
            record["text"] = " "
        elif kind == "email":
            record["text"] += f" Write to buyer{n}@example.com."
        lines.append(json.dumps(record))
    return lines


def _day_of(home: Path, lines: list[str], **sharding: Any) -> steps.StepContext:
    """The context of a review pipeline with `sharding` whose day is `lines`, under `home`:
    a SQLite ledger, local artifacts, a provider never called."""
    (home / "reviews").mkdir(parents=True)
    (home / "reviews" / f"reviews-{DAY}.jsonl").write_text("\n".join(lines) + "\n")
    spec = PipelineSpec.model_validate(
        review_spec(
            "openai",
            "gpt-4o-mini",
            sharding=sharding,
            source={"uri": str(home / "reviews" / "*.jsonl")},
        )
    )
    ledger = LedgerResource(database_url=f"sqlite:///{home / 'ledger.db'}", id_key="k" * 32)
    storage = ArtifactStorage(base_url=str(home / "artifacts"))
    provider = OpenAIBatchProvider(api_key="unused", base_url="http://127.0.0.1:9/v1")
    return steps.StepContext(spec, DAY, ledger, storage, provider)


def _built(home: Path, lines: list[str], slices: int, keys: bool = True) -> dict[str, Any]:
    """Build the day from `lines` with `slices` slices (in this process, as the eval replay
    does), and what the ledger and the shard files then hold. Without `keys`, the snapshot is
    taken while the pipeline is not sliced yet (no slice keys beside it)."""
    ctx = _day_of(home, lines, max_requests_per_shard=3, slices=slices)
    spec, ledger, storage = ctx.spec, ctx.ledger, ctx.storage
    unsliced = spec.model_copy(update={"sharding": spec.sharding.model_copy(update={"slices": 1})})
    steps.take_snapshot(ctx if keys else dataclasses.replace(ctx, spec=unsliced), spec.source.uri)
    steps.build_shards(ctx)
    job = ctx.job()
    items = list(
        ledger.iter_items(
            job.job_id, None, columns=["custom_id", "source_id", "status", "error_code"]
        )
    )
    shards = ledger.shards(job.job_id)
    sent = set()
    for shard in shards:
        offsets = sorted(ledger.pending_offsets(shard.shard_id).values())
        sent |= set(storage.lines_at(shard.input_uri, offsets))
    ledger.engine.dispose()
    return {
        "pending": sorted(i["custom_id"] for i in items if i["status"] == "pending"),
        "dead": Counter(
            (i["source_id"], i["error_code"]) for i in items if i["status"] == "dead_letter"
        ),
        "sent": sent,
        "unjoined": [s.shard_id for s in shards if s.raw_status == UNJOINED],
        "personal_data": job.personal_data,
    }


@settings(max_examples=200, deadline=None)
@given(
    lines=st.lists(st.binary(max_size=12).map(lambda b: b.replace(b"\n", b"")), max_size=60),
    cut=st.integers(1, 40),
    last_newline=st.booleans(),
    count=st.integers(1, 4),
    seed=st.randoms(use_true_random=False),
)
def test_a_slice_reads_exactly_its_own_lines_with_their_positions(
    lines: list[bytes], cut: int, last_newline: bool, count: int, seed: Any
) -> None:
    """However the file's bytes arrive (chunks cut anywhere, empty lines, a last line with
    no newline), each slice gets the lines whose key falls to it, in order, numbered by
    their place in the file, and nothing else."""
    data = b"\n".join(lines) + (b"\n" if last_newline and lines else b"")
    if lines and not last_newline and not lines[-1]:
        lines = lines[:-1]  # an empty last line without its newline is no line
    keys = array.array("H", (seed.randrange(2**16) for _ in lines))
    chunks = list(line_blocks(data[i : i + cut] for i in range(0, len(data), cut)))
    for number in range(count):
        # Blocks of 3 lines, so that a slice's lines are cut into blocks here too.
        with mock.patch.object(shard_steps, "BLOCK_ROWS", 3):
            got = [
                (position, line)
                for positions, block in slice_blocks(chunks, keys, count, number)
                for position, line in zip(positions, block, strict=True)
            ]
        assert got == [(p, line) for p, line in enumerate(lines) if keys[p] % count == number]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=_rows(), slices=st.integers(2, 5), keys=st.booleans())
def test_a_sliced_build_ends_as_a_build_in_one_step(
    lines: list[str], slices: int, keys: bool
) -> None:
    with tempfile.TemporaryDirectory() as whole, tempfile.TemporaryDirectory() as sliced:
        one = _built(Path(whole), lines, 1)
        many = _built(Path(sliced), lines, slices, keys)
    assert many["unjoined"] == []
    assert many["pending"] == one["pending"]
    assert many["dead"] == one["dead"]
    assert many["sent"] == one["sent"]
    assert many["personal_data"] == one["personal_data"]


def test_a_sliced_day_runs_its_slices_as_steps_and_ends_exactly_once(
    tmp_path: Path, database_url: str, fake: FakeOpenAI
) -> None:
    sharding = {"max_requests_per_shard": 6, "slices": 3}
    with fake_harness(tmp_path, database_url, fake, reviews=40, sharding=sharding) as harness:
        run = harness.materialize(*names.SUBMIT_ASSETS)
        assert run.success
        ran = {e.step_key for e in run.all_events if e.event_type_value == "STEP_SUCCESS"}
        graph = f"{harness.spec.name}__request_shards"
        assert {f"{graph}.{harness.spec.name}__slice_{n}_of_3" for n in (1, 2, 3)} | {
            f"{graph}.{harness.spec.name}__join_slices"
        } <= ran
        shards = harness.ledger.shards(harness.job_id())
        # One build round, each slice's shards numbered apart, none left held.
        assert {s.round for s in shards} == {0}
        assert {s.shard_index % 3 for s in shards} == {0, 1, 2}
        assert not [s for s in shards if s.raw_status == UNJOINED]
        [materialized] = run.asset_materializations_for_node(graph)
        assert materialized.metadata["new_items"].value == 40

        outcome = harness.run_day()

        assert outcome.open_items == 0 and outcome.succeeded == 40
        assert harness.labels() == harness.truth
        numbers = assert_provider_invariants(database_url, fake, set(harness.truth))
        assert numbers["items"] == 40


def test_shards_wait_for_their_join_and_a_build_that_stopped_is_built_again(
    tmp_path: Path, database_url: str, fake: FakeOpenAI
) -> None:
    sharding = {"max_requests_per_shard": 5, "slices": 2}
    with fake_harness(tmp_path, database_url, fake, reviews=20, sharding=sharding) as harness:
        ctx = harness.context()
        steps.take_snapshot(ctx, str(harness.home / "reviews" / "*.jsonl"))
        for number in range(2):  # the slices are built; the run dies before the join
            steps.build_slice(ctx, number)
        state = steps.load_state(ctx)
        held = [s.shard_id for s in state.shards]
        assert len(held) == 4

        # Nothing submits a held shard while its build may still join it ...
        decision = steps.decide(state)
        assert not decision.actions and set(decision.others) == set(held)
        assert decision.wait_until is not None
        # ... and once the join is late, the day is built again.
        late = steps.decide(
            dataclasses.replace(state, now=state.now + SLICE_JOIN_GRACE + dt.timedelta(seconds=1))
        )
        assert [a.step for a in late.actions] == [steps.Step.BUILD]

        outcome = harness.run_day()

        assert outcome.open_items == 0 and outcome.succeeded == 20
        shards = harness.ledger.shards(harness.job_id())
        assert not [s for s in shards if s.raw_status == UNJOINED]
        assert assert_provider_invariants(database_url, fake, set(harness.truth))["items"] == 20


def test_a_cancel_closes_the_shards_of_a_build_not_joined(
    tmp_path: Path, database_url: str, fake: FakeOpenAI
) -> None:
    sharding = {"max_requests_per_shard": 5, "slices": 2}
    with fake_harness(tmp_path, database_url, fake, reviews=12, sharding=sharding) as harness:
        ctx = harness.context()
        steps.take_snapshot(ctx, str(harness.home / "reviews" / "*.jsonl"))
        steps.build_slice(ctx, 0)
        steps.cancel_day(ctx, reason="wrong prompt")
        steps.build_slice(ctx, 1)  # the other slice ends after the cancel

        # The lifecycle (as `run --wait` and the sensor drive it) closes every held shard.
        steps.drive([harness.runner().driver(DAY, [], None)])

        counts = harness.ledger.counts(harness.job_id())
        assert counts.open == 0 and counts.dead_letters_by_class == {"cancelled": 12}
        assert fake.submitted_custom_ids() == []


def _sometimes_wrong(body: dict[str, Any]) -> str:
    """The truthful answer, but a label the spec does not allow for every review whose order
    number ends in 3 or 7."""
    answer = json.loads(truthful(body))
    if any(f"Order 10{n}" in user_text(body) for n in ("03", "07", "13", "17", "23", "27")):
        answer["label"] = "neutral"
    return json.dumps(answer)


def test_a_sliced_validation_writes_the_outputs_of_one_step(
    tmp_path: Path, database_url: str, fake: FakeOpenAI
) -> None:
    fake.responder = _sometimes_wrong
    sharding = {"max_requests_per_shard": 7, "slices": 3}
    with fake_harness(tmp_path, database_url, fake, reviews=30, sharding=sharding) as harness:
        # The join's checks see every slice's failures: 6 of 30 is over the 5% the spec allows.
        with pytest.raises(StepFailed, match=r"quality_failure_rate \(20\.0% > 5\.0%\)"):
            harness.run_day()

        wrong = {f"R-{DAY:%Y%m%d}-{n:04d}" for n in (3, 7, 13, 17, 23, 27)}
        counts = harness.ledger.counts(harness.job_id())
        assert counts.open == 0 and counts.dead_letters_by_class == {"quality": len(wrong)}
        rows = harness.rows().values()
        assert {r["source_id"] for r in rows if r["error_class"] == "quality"} == wrong
        with harness.ledger.engine.connect() as conn:
            outputs = conn.execute(sa.select(output_table.c.source_id, output_table.c.output_json))
            kept = {source: json.loads(output)["label"] for source, output in outputs}
        assert kept == {k: v for k, v in harness.truth.items() if k not in wrong}
        job = harness.ledger.get_job(harness.job_id())
        assert job is not None and job.validated_at is not None
        parquet = pq.read_table(harness.storage.uri(judge.outputs_key(harness.spec, job)))
        assert sorted(parquet.column("source_id").to_pylist()) == sorted(kept)
        # The slices ran as steps of the finishing run, and their join evaluated the checks.
        runs = harness.instance.get_runs()
        ran = {
            e.step_key
            for run in runs
            for e in harness.instance.all_logs(run.run_id)
            if e.dagster_event is not None and e.dagster_event.event_type_value == "STEP_SUCCESS"
        }
        graph = f"{harness.spec.name}__validated_outputs"
        assert {f"{graph}.{harness.spec.name}__validate_slice_{n}_of_3" for n in (1, 2, 3)} <= ran
        materialized = harness.instance.get_latest_materialization_event(
            asset_key(harness.spec, names.VALIDATED_OUTPUTS)
        )
        assert materialized is not None and materialized.asset_materialization is not None
        assert materialized.asset_materialization.partition == DAY.isoformat()
        # A slice that finds the day in flight forgets what it judged before: the join then
        # takes nothing stale, and asks for the day to be validated again.
        steps.forget_slice(harness.context(), 1)
        with pytest.raises(steps.MissingPrerequisite, match="slice 2/3"):
            steps.join_validation(harness.context())


def test_the_slices_of_a_validation_split_the_day_evenly_and_must_agree_on_their_cuts(
    tmp_path: Path, database_url: str, fake: FakeOpenAI
) -> None:
    sharding = {"max_requests_per_shard": 7, "slices": 3}
    with fake_harness(tmp_path, database_url, fake, reviews=30, sharding=sharding) as harness:
        assert harness.run_day().done
        ctx = harness.context()
        judged = [steps.validate_slice(ctx, n) for n in range(3)]
        # Ranges of the day's custom_ids cut at row positions 10 and 20, read in order.
        assert [part.judged for part in judged] == [10, 10, 10]
        assert steps.join_validation(ctx).result.valid_rows == 30
        # The day's items change after two slices judged it: the last cuts elsewhere, and
        # the join refuses to take slices that may judge an item twice and another never.
        harness.ledger.update_job(harness.job_id(), total_items=60)
        steps.validate_slice(ctx, 2)
        with pytest.raises(steps.MissingPrerequisite, match="in different places"):
            steps.join_validation(ctx)


_ID_CHARS = "0123456789abcdef_xyz"


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    ids=st.lists(st.text(_ID_CHARS, max_size=60), max_size=40),
    count=st.integers(2, 12),
    total=st.integers(0, 5000),
)
def test_every_custom_id_falls_in_exactly_one_slice_whatever_its_form(
    ids: list[str], count: int, total: int
) -> None:
    """Keyed, unsent and legacy ids, or any string: the slices' ranges cover each once."""
    job = JobRecord.model_construct(partition_date=DAY, total_items=total)
    cuts = validate.slice_cuts(job, count)

    def holding(custom_id: str) -> list[int]:
        return [
            number
            for number in range(count)
            for low, high in [validate.slice_range(cuts, number)]
            if (low is None or custom_id >= low) and (high is None or custom_id < high)
        ]

    for custom_id in ids:
        assert len(holding(custom_id)) == 1, (custom_id, cuts)
    # A keyed id falls in the slice of its row's position: the slices split the rows evenly.
    for position in range(0, total, 97):
        keyed = custom_ids.custom_id(b"k" * 32, "reviews", DAY, f"R-{position}", position)
        expected = max(n for n in range(count) if n * total // count <= position)
        assert holding(keyed) == [expected], (keyed, cuts)


def test_the_slices_of_a_new_day_create_its_job_at_once(
    tmp_path: Path, database_url: str, fake: FakeOpenAI
) -> None:
    with fake_harness(tmp_path, database_url, fake, reviews=2) as harness:
        for offset in range(20):  # new days, each created by four slices at once
            ctx = harness.context(DAY + dt.timedelta(days=offset))
            start = threading.Barrier(4)

            def create(ctx: steps.StepContext = ctx, start: threading.Barrier = start) -> str:
                start.wait()
                return ctx.job_or_create().job_id

            with concurrent.futures.ThreadPoolExecutor(4) as pool:
                made = [f.result() for f in [pool.submit(create) for _ in range(4)]]
            assert made == [ctx.job_id] * 4


def test_a_slice_step_renders_in_its_own_process_unless_given_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slice step runs beside the day's other slices, which take the other cores: it
    renders and counts its rows in its own process, with a pool of its own only when
    LLM_ASSETS_SLICE_WORKERS asks for one (a build in one step keeps the step's pool), and
    its shards are the same either way."""
    from llm_assets.util import parallel

    # Small blocks and chunks, and workers started after the first rows: a "large" day.
    monkeypatch.setattr(shard_steps, "BLOCK_ROWS", 4)
    monkeypatch.setattr(parallel, "CHUNK_ROWS", 4)
    monkeypatch.setattr(parallel, "INLINE_ROWS", 4)
    monkeypatch.setenv("LLM_ASSETS_WORKERS", "1")
    pools: list[int | None] = []
    real_pool = concurrent.futures.ProcessPoolExecutor

    def counted_pool(*args: Any, **kwargs: Any) -> concurrent.futures.ProcessPoolExecutor:
        pools.append(kwargs.get("max_workers", args[0] if args else None))
        return real_pool(*args, **kwargs)

    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", counted_pool)
    lines = [
        json.dumps(
            {
                "review_id": f"r{n}",
                "created_at": f"{DAY.isoformat()}T00:00:{n % 60:02d}Z",
                "text": f"Review {n}: the kettle is {'good' if n % 2 else 'bad'}.",
            }
        )
        for n in range(60)
    ]

    def slice_shards(name: str, workers: str | None) -> list[bytes]:
        if workers is None:
            monkeypatch.delenv("LLM_ASSETS_SLICE_WORKERS", raising=False)
        else:
            monkeypatch.setenv("LLM_ASSETS_SLICE_WORKERS", workers)
        ctx = _day_of(tmp_path / name, lines, max_requests_per_shard=7, slices=2)
        steps.take_snapshot(ctx, ctx.spec.source.uri)
        pools.clear()  # the snapshot's, a step's pool on a "large" day
        built = [steps.build_slice(ctx, number) for number in range(2)]
        ctx.ledger.engine.dispose()
        return [ctx.storage.read_bytes(uri) for result in built for uri in result.shard_uris]

    alone = slice_shards("alone", None)
    assert pools == []
    assert slice_shards("pooled", "1") == alone
    assert pools == [1, 1]  # one pool per slice step
    assert sum(len(shard.splitlines()) for shard in alone) == 60
    monkeypatch.setenv("LLM_ASSETS_SLICE_WORKERS", "-1")
    with pytest.raises(ValueError, match="LLM_ASSETS_SLICE_WORKERS must be 0 or more"):
        parallel.slice_worker_count()
