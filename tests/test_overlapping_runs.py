"""One day, many writers: three `llm-assets run --wait` of the same day started together, and
an import run the batch-status sensor requests while they work, against the fake OpenAI
batch server with transient, missing, expired, duplicated and refused answers. Every run
ends well, every item is sent once per attempt and billed once unless the provider lost its
answer, and the ledger holds one row per item and one output per success."""

import json
import subprocess
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from llm_assets import names
from llm_assets.defs.factory import asset_key
from llm_assets.resources.ledger import output_table
from tests import cli_process
from tests.fakes.openai_server import FakeOpenAI
from tests.harness import CLI, DAY, fake_harness, first_time, truthful
from tests.test_sensors import tick

pytestmark = pytest.mark.slow

REVIEWS = 150
FAULTS = {
    **{n: "5xx" for n in range(3, REVIEWS, 17)},
    **{n: "missing" for n in range(5, REVIEWS, 23)},
    **{n: "expire" for n in range(7, REVIEWS, 29)},
    **{n: "duplicate" for n in range(11, REVIEWS, 31)},
    **{n: "429" for n in range(13, REVIEWS, 37)},
    42: "4xx",
}
"""Review n's answer on its first submission; each later submission is answered well."""
RETRIED = {n for n, kind in FAULTS.items() if kind in ("5xx", "missing", "expire", "429")}


def _review(custom_id: str) -> int:
    """The review number n of a custom_id (its source id is R-<date>-<n>)."""
    return int(custom_id.rsplit("-", 1)[-1])


def test_three_runs_and_the_sensor_on_one_day_send_and_bill_each_item_once(
    tmp_path: Path, database_url: str
) -> None:
    sharding = {"max_requests_per_shard": 20}
    with (
        FakeOpenAI(tmp_path / "fake") as fake,
        fake_harness(tmp_path, database_url, fake, REVIEWS, sharding=sharding) as harness,
    ):
        fake.responder = truthful
        fake.line_fault = first_time(FAULTS)
        in_flight = threading.Event()

        def outcome(batch: dict[str, Any]) -> str:
            in_flight.set()  # asked when a created batch leaves validating
            return "completed"

        fake.batch_outcome = outcome
        env = harness.cli_env(fake)
        command = [CLI, "run", harness.spec.name, "--date", DAY.isoformat(), "--wait"]
        runs = [
            cli_process.Popen(
                [*command, "--poll-interval", "0.05", "--json"],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(3)
        ]
        # The batch-status sensor, in the middle of it: it polls the day's batches and
        # runs the import it asks for while the three runs poll and import the same day.
        assert in_flight.wait(300), [run.poll() for run in runs]
        sensor_imports = 0
        while sensor_imports == 0 and any(run.poll() is None for run in runs):
            for request in tick(harness).run_requests:
                if asset_key(harness.spec, names.BATCH_RESULTS) in request.asset_selection:
                    selected = [key.path[-1] for key in request.asset_selection]
                    assert harness.materialize(*selected).success
                    sensor_imports += 1
        said = [run.communicate(timeout=600) for run in runs]
        creates = [
            c for c in fake.calls.entries() if c["method"] == "POST" and c["path"] == "/v1/batches"
        ]
        submitted = Counter(fake.submitted_custom_ids())
        billed, dropped = Counter(fake.billed), Counter(fake.dropped)
        rows = harness.rows()
        shards = harness.ledger.shards(harness.job_id())
        with harness.ledger.engine.connect() as conn:
            outputs = (
                conn.execute(
                    sa.select(output_table.c.custom_id).where(
                        output_table.c.job_id == harness.job_id()
                    )
                )
                .scalars()
                .all()
            )
        assert fake.server_errors == []

    for run, (out, err) in zip(runs, said, strict=True):
        assert run.returncode == 0, err
        [outcome] = json.loads(out)
        assert (outcome["open_items"], outcome["total"]) == (0, REVIEWS)
    assert sensor_imports == 1

    # One row per item, each terminal; the refused one a dead letter, the rest answered.
    assert len(rows) == REVIEWS
    by_review = {_review(r["source_id"]): r for r in rows.values()}
    assert {n: r["status"] for n, r in by_review.items() if r["status"] != "succeeded"} == {
        42: "dead_letter"
    }
    assert sorted(outputs) == sorted(c for c, r in rows.items() if r["status"] == "succeeded")

    # Each shard got one batch; each item was in as many sent files as attempts it took:
    # two for those whose first answer was lost or failed, one for all the others.
    assert len(creates) == len({c["metadata"]["shard_id"] for c in creates})
    assert len(creates) == sum(1 for s in shards if s.provider_batch_id is not None)
    for custom_id, row in rows.items():
        n = _review(row["source_id"])
        assert submitted[custom_id] == row["attempts"] == (2 if n in RETRIED else 1), n
        # Billed once, unless the provider ran it and then lost the answer.
        assert billed[custom_id] <= 1 + dropped[custom_id], n
        assert billed[custom_id] == (0 if n == 42 else 1) + dropped[custom_id], n
    print(
        f"{REVIEWS} items, {len(shards)} shards, {len(creates)} batches created, "
        f"{sum(submitted.values())} requests sent, {sum(billed.values())} requests billed "
        f"({sum(dropped.values())} of them answers the provider lost)"
    )
