"""The day's lifecycle under interleavings nobody listed: hypothesis drives one day at a time
through the executor (the eval's in-process path) with crashes at every submission and
import point, cancels of the day and of shards, pauses and resumes, quota refusals, answers
billed far over their estimate (the spend breaker), requeues, and batches that complete,
answer in part, expire, fail or are cancelled by the provider.

After every step, and at every batch the provider is asked to create:
- no item is in two live batches, and nothing already answered is sent again;
- nothing is sent while the pipeline is paused or after the day or the shard was cancelled;
- nothing is sent whose upper bound takes the day's committed cost past its cap;
- each item has one ledger row, in a known status.
At the end the operator resumes, approves and lets every batch finish: every item ends in
exactly one terminal state, every batch the provider made is recorded, and no item was
answered twice.
"""

import datetime as dt
import itertools
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from llm_assets import steps
from llm_assets.resources.ledger import TERMINAL, LedgerResource
from llm_assets.resources.providers.base import ShardSubmission
from llm_assets.resources.storage import ArtifactStorage
from llm_assets.spec.model import PipelineSpec
from llm_assets.steps.in_process import InProcessRuns
from llm_assets.util import failpoints
from tests.fakes.memory_provider import OUTCOMES, MemoryProvider
from tests.harness import review_spec

pytestmark = pytest.mark.slow

EXAMPLES = 250
"""Interleavings tried in the normal suite."""
STEPS = 12
CRASH_POINTS = tuple(
    p for p in failpoints.POINTS if p.split(".")[0] in ("submit", "import", "retry")
)
SELDOM_PASSED = ("import.after_upsert", "import.after_shard", "retry.after_file")
"""Passed only by a run that finds ended batches (and, for the retry, failed items)."""
CRASHES = st.sampled_from((None, *CRASH_POINTS, *SELDOM_PASSED * 2))
"""Whether a run dies, and where: the points seldom passed are drawn three times as often,
so that the few runs that pass one die there often enough for every point to be reached."""
STATUSES = {"pending", "submitted", "retry", *TERMINAL}
FIRST_DAY = dt.date(2026, 1, 1)
UNTIL_TERMINAL = frozenset(steps.Step) - {steps.Step.VALIDATE, steps.Step.REPORT}
"""The end of an interleaving drives the day until every item is terminal; validating and
reporting it, which the pipeline tests cover, would double the test's time."""


class SimulatedCrash(BaseException):
    """The process died here: nothing after this point of the step ran (its locks are let
    go as they are when a process dies)."""


class World:
    """What every interleaving shares: one ledger, one storage, the provider, the spec. Each
    interleaving works on a day of its own."""

    def __init__(self, tmp_path: Path) -> None:
        self.home = tmp_path
        self.ledger = LedgerResource(database_url=f"sqlite:///{tmp_path / 'ledger.db'}")
        self.storage = ArtifactStorage(base_url=str(tmp_path / "artifacts"))
        self.provider = MemoryProvider()
        self.days = itertools.count()
        probe = self._spec(cap=None)
        self.cap = 3 * 9 * self._upper_per_item(probe)
        self.spec = self._spec(cap=self.cap)

    @staticmethod
    def _spec(cap: float | None) -> PipelineSpec:
        spec = review_spec(
            "openai",
            "gpt-4o-mini",
            name="lifecycle",
            sharding={"max_requests_per_shard": 3},
            retry={"max_attempts": 3, "backoff_seconds": 0},
            budget={"max_usd_per_partition": cap} if cap else {},
        )
        return PipelineSpec.model_validate(spec)

    def source(self, day: dt.date, items: int) -> str:
        path = self.home / "reviews" / f"{day.isoformat()}.jsonl"
        path.parent.mkdir(exist_ok=True)
        stamp = dt.datetime.combine(day, dt.time(12, 0)).isoformat() + "Z"
        rows = [
            {"review_id": f"R-{day:%Y%m%d}-{n}", "created_at": stamp, "text": f"Review {n}."}
            for n in range(items)
        ]
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        return str(path)

    def _upper_per_item(self, spec: PipelineSpec) -> float:
        ctx = steps.StepContext(spec, FIRST_DAY, self.ledger, self.storage, self.provider)
        steps.take_snapshot(ctx, self.source(FIRST_DAY, 9))
        steps.build_shards(ctx)
        return self.ledger.committed_cost(ctx.job_id) / 9

    def context(self, day: dt.date) -> steps.StepContext:
        return steps.StepContext(
            self.spec, day, self.ledger, self.storage, self.provider, created_by="property"
        )


@pytest.mark.timeout(1200)
def test_the_lifecycle_keeps_its_promises_under_any_interleaving(tmp_path: Path) -> None:
    world = World(tmp_path)
    seen: Counter[str] = Counter()

    class Day(RuleBasedStateMachine):
        @initialize(items=st.integers(2, 9), crash=CRASHES)
        def start(self, items: int, crash: str | None) -> None:
            self.day = FIRST_DAY + dt.timedelta(days=1 + next(world.days))
            world.provider = MemoryProvider()  # each interleaving meets a provider of its own
            world.ledger.reset_quotas()  # and learns its quota afresh
            self.ctx = world.context(self.day)
            self.runs = InProcessRuns(world.source(self.day, items))
            self.driver = steps.DayDriver(self.ctx, runs=self.runs, poll_every=0.0)
            self.crash_at = crash
            world.ledger.resume_pipeline(world.spec.name, resumed_by="property")
            world.provider.watch_creates(self.check_create)
            self.attempt(lambda: self.runs.run(self.driver, steps.Action(steps.Step.BUILD)))
            self.job_id = self.ctx.job_id

        def check_create(self, shard: ShardSubmission, custom_ids: list[str]) -> None:
            """What must hold whenever the provider is asked to make a batch."""
            ledger = world.ledger
            job = ledger.get_job(shard.job_id)
            record = ledger.get_shard(shard.shard_id)
            assert job is not None and record is not None
            assert ledger.pipeline_pause(world.spec.name) is None, "sent while paused"
            assert job.cancelled_at is None, "sent after the day was cancelled"
            assert record.cancelled_at is None, "sent after its shard was cancelled"
            live = {c for b in world.provider.live() for c in b.custom_ids}
            assert not live & set(custom_ids), "an item in two live batches"
            assert not world.provider.answered.keys() & set(custom_ids), "answered, sent again"
            cap = max(world.cap, job.budget_approved_usd or 0.0)
            assert ledger.committed_cost(shard.job_id) <= cap * (1 + 1e-9), "over the cap"

        def crash(self, point: str) -> None:
            if point == self.crash_at:
                self.crash_at = None
                raise SimulatedCrash(point)

        def attempt(self, step: Any) -> None:
            """Run part of the day; a simulated crash or a gate ends it as it would a run."""
            try:
                with failpoints.handled_by(self.crash):
                    step()
            except SimulatedCrash as crashed:
                seen[f"crashed at {crashed}"] += 1
            except steps.GateBlocked as blocked:
                assert blocked.gate in ("cancelled", "budget", "pipeline_budget"), blocked
                seen[f"{blocked.gate} gate"] += 1

        @rule(crash=CRASHES)
        def run(self, crash: str | None) -> None:
            """A run drives the day until it would have to wait, or dies at `crash`."""
            self.crash_at = crash

            def rounds() -> None:
                for _ in range(6):
                    self.driver.advance()
                    if not self.driver.acted:
                        return

            self.attempt(rounds)

        @precondition(lambda self: bool(world.provider.live()))
        @rule(data=st.data(), outcome=st.sampled_from(OUTCOMES), over=st.booleans())
        def end_a_batch(self, data: st.DataObject, outcome: str, over: bool) -> None:
            """A batch ends; `over`: its answers bill far more input than was estimated."""
            batch = data.draw(st.sampled_from(sorted(b.id for b in world.provider.live())))
            world.provider.bill_input_tokens(40 * 1000 if over else 40)
            world.provider.end(batch, outcome)

        @rule()
        def cancel_the_day(self) -> None:
            unrecorded = [
                s
                for s in world.ledger.shards(self.job_id)
                if s.submit_intent_at and not s.provider_batch_id
            ]
            seen["cancel after a create left unrecorded"] += bool(unrecorded)
            seen["cancel with batches in flight"] += bool(world.provider.live())
            self.attempt(lambda: steps.cancel_day(self.ctx, reason="property"))

        @rule(data=st.data())
        def cancel_a_shard(self, data: st.DataObject) -> None:
            shards = [s.shard_id for s in world.ledger.shards(self.job_id)]
            chosen = data.draw(st.sampled_from(shards))
            self.attempt(lambda: steps.cancel_day(self.ctx, shard_ids=[chosen]))

        @rule()
        def pause(self) -> None:
            world.ledger.pause_pipeline(world.spec.name, paused_by="property", reason="p")

        @rule()
        def resume(self) -> None:
            world.ledger.resume_pipeline(world.spec.name, resumed_by="property")

        @rule()
        def refuse_the_next_create(self) -> None:
            world.provider.refuse_next_create()

        @rule()
        def requeue_the_cancelled(self) -> None:
            self.attempt(lambda: steps.requeue_dead_letters(self.ctx, classes={"cancelled"}))

        @invariant()
        def one_known_row_per_item(self) -> None:
            if not hasattr(self, "job_id"):
                return
            rows = list(world.ledger.iter_items(self.job_id, None, columns=["custom_id", "status"]))
            assert len({r["custom_id"] for r in rows}) == len(rows)
            assert {r["status"] for r in rows} <= STATUSES

        def teardown(self) -> None:
            if not hasattr(self, "job_id"):
                return
            self.finish()

        def finish(self) -> None:
            """The operator resumes, approves the day's budget and lets every batch end."""
            ledger, provider = world.ledger, world.provider
            ledger.resume_pipeline(world.spec.name, resumed_by="property")
            provider.bill_input_tokens(40)
            approved = InProcessRuns(self.runs.source_uri, approve_budget=True)
            driver = steps.DayDriver(self.ctx, runs=approved, poll_every=0.0)
            for _ in range(40):
                for batch in provider.live():
                    provider.end(batch.id, "completed")
                job = ledger.get_job(self.job_id)
                if job is not None and job.cancelled_at is None:
                    approved.submit(self.ctx)  # what `run` does first, fresh shards too
                decision = driver.advance(only=UNTIL_TERMINAL)
                if decision.done or (decision.settled and driver.counts.open == 0):
                    break
            else:
                pytest.fail(f"the day did not finish: {driver.last}")
            job = ledger.get_job(self.job_id)
            if job is not None and job.cancel_reason and "breaker" in job.cancel_reason:
                seen["spend breaker"] += 1
            rows = list(ledger.iter_items(self.job_id, None, columns=["custom_id", "status"]))
            assert {r["status"] for r in rows} <= set(TERMINAL)
            succeeded = {r["custom_id"] for r in rows if r["status"] == "succeeded"}
            assert set(provider.answered.values()) <= {1}, "an item answered twice"
            assert set(provider.answered) == succeeded
            recorded = {s.provider_batch_id for s in ledger.shards(self.job_id)}
            assert set(provider.batches) <= recorded, "a batch the provider made was not recorded"

    run_state_machine_as_test(
        Day,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=STEPS,
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
    # The search reached what it is meant to: a crash at every point, the breaker, the gates.
    print(dict(seen))
    assert {f"crashed at {point}" for point in CRASH_POINTS} <= set(seen), seen
    assert seen["spend breaker"] and seen["cancel with batches in flight"], seen
    assert seen["cancel after a create left unrecorded"], seen
