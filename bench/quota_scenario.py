"""A day under a provider quota nobody declared, against one that was declared and none.

Run by hand: `.venv/bin/python bench/quota_scenario.py [--mode learned] [--days 1]`. It starts
the fake OpenAI server from tests/ on loopback, where a batch runs in about `--batch-seconds`
(by the clock, however often it is polled) and the enqueued-token limit admits about
`--at-once` shards' prompt tokens per model (over it, a batch fails `token_limit_exceeded`,
as OpenAI's do). Each mode starts from an empty ledger:

- `none`: the server has no limit;
- `declared`: the spec's `quota.max_enqueued_tokens` is the server's limit;
- `learned`: the limit is neither declared nor known: submission learns it.

One day runs as `llm-assets run --wait` runs it (a Dagster run per step, polls at most 30 s
apart); several days (`--days 5`) start together, each in its own thread with its own ledger
connections, as a backfill's runs do. Prints the wall time, batches created and refused, and
what was learned.
"""

import argparse
import datetime as dt
import sys
import tempfile
import threading
import time
from pathlib import Path

import dagster as dg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llm_assets import steps  # noqa: E402
from llm_assets.defs.runner import PartitionRunner
from llm_assets.resources.ledger import LedgerResource, QuotaKey  # noqa: E402
from llm_assets.resources.providers.openai_batch import OpenAIBatchProvider  # noqa: E402
from llm_assets.resources.storage import ArtifactStorage  # noqa: E402
from llm_assets.spec.model import PipelineSpec
from llm_assets.steps.in_process import InProcessRuns  # noqa: E402
from llm_assets.util.settings import Settings
from tests.fakes.openai_batches import prompt_tokens  # noqa: E402
from tests.fakes.openai_server import FakeOpenAI  # noqa: E402
from tests.harness import DAY, review_spec, truthful, write_reviews  # noqa: E402

MODEL = "gpt-4o-mini"


def tokens_per_shard(spec: PipelineSpec, settings: Settings, provider: OpenAIBatchProvider) -> int:
    """The prompt tokens the server counts in one of the day's shards (built aside)."""
    ledger = LedgerResource(database_url=f"sqlite:///{settings.home / 'probe.db'}")
    storage = ArtifactStorage(base_url=str(settings.home / "probe"))
    ctx = steps.StepContext(spec, DAY, ledger, storage, provider)
    steps.take_snapshot(ctx, settings.resolve_source_uri(spec.source.uri))
    steps.build_shards(ctx)
    first = ledger.shards(ctx.job_id)[0]
    data = b"".join(line + b"\n" for line in storage.open_lines(first.input_uri))
    return prompt_tokens("/v1/chat/completions", data)


def run(args: argparse.Namespace, root: Path) -> None:
    days = [DAY + dt.timedelta(days=n) for n in range(args.days)]
    settings = Settings(
        home=root / "home",
        database_url=args.db or f"sqlite:///{root / 'ledger.db'}",
        pipelines_dir=root,
        storage_url=str(root / "artifacts"),
        dagster_home=root / "dagster",
    )
    for day in days:
        write_reviews(settings.home, day, args.items)
    with FakeOpenAI(root / "fake") as fake:
        fake.responder = truthful
        fake.seconds_per_state = args.batch_seconds / 3  # validating, in_progress, finalizing
        provider = OpenAIBatchProvider(api_key="bench", base_url=fake.base_url)
        plain = review_spec("openai", MODEL, sharding={"max_requests_per_shard": args.per_shard})
        shard_tokens = tokens_per_shard(PipelineSpec.model_validate(plain), settings, provider)
        limit = int(shard_tokens * (args.at_once + 0.15))
        if args.mode != "none":
            fake.enqueued_token_limit = limit
            fake.token_limit_stated = not args.unstated
        quota = {"quota": {"max_enqueued_tokens": limit}} if args.mode == "declared" else {}
        spec = PipelineSpec.model_validate(plain | quota)
        print(
            f"{args.mode}: {args.days} day(s) of {args.items:,} items in shards of "
            f"{args.per_shard}, ~{shard_tokens:,} prompt tokens a shard, server limit "
            f"{limit:,} ({args.at_once} shards) {'on' if args.mode != 'none' else 'off'}, "
            f"batches of ~{args.batch_seconds:.0f} s"
        )
        started = time.perf_counter()
        if args.days == 1:
            (root / "dagster").mkdir(exist_ok=True)
            with dg.instance_for_test(temp_dir=str(root / "dagster")) as instance:
                runner = PartitionRunner(
                    settings,
                    spec,
                    instance,
                    resources={
                        "ledger": LedgerResource(database_url=settings.database_url),
                        "storage": ArtifactStorage(base_url=settings.storage_url),
                        "openai_provider": provider,
                    },
                    poll_interval=30.0,
                )
                outcome = runner.run_day(DAY, wait=True)
            done = outcome.succeeded
            dead = outcome.dead_letters
        else:
            done, dead = run_together(spec, settings, provider, days)
        wall = time.perf_counter() - started
        creates = sum(
            1
            for c in fake.calls.entries()
            if c["method"] == "POST" and c["path"].endswith("/batches") and c["status"] == 200
        )
        refused = sum(
            1 for b in fake.store.all_batches() if "token_limit_exceeded" in str(b.get("errors"))
        )
        billed_twice = sum(1 for n in fake.billed.values() if n > 1)
        ledger = LedgerResource(database_url=settings.database_url)
        learned = ledger.quota_record(
            QuotaKey(
                provider="openai",
                account=provider.quota_account(),
                model_name=MODEL,
                kind=provider.quota_kind,
            )
        )
        print(
            f"  wall {wall:.1f} s; {done:,} of {args.items * args.days:,} succeeded, {dead} dead "
            f"letters; {creates} creates, {refused} refused; billed twice: {billed_twice}; "
            f"peak enqueued {fake.peak_enqueued_tokens.get(MODEL, 0):,} tokens"
        )
        print(
            f"  learned limit: {learned.learned_limit} ({learned.how or 'nothing refused'}), "
            f"{learned.refusals} refusals, most admitted at once {learned.admitted_peak:,}"
        )


def run_together(
    spec: PipelineSpec, settings: Settings, provider: OpenAIBatchProvider, days: list[dt.date]
) -> tuple[int, int]:
    source_uri = settings.resolve_source_uri(spec.source.uri)
    storage = ArtifactStorage(base_url=settings.storage_url)
    errors: list[BaseException] = []

    def one(n: int, day: dt.date) -> None:
        url = f"{settings.database_url}{'&' if '?' in settings.database_url else '?'}"
        ledger = LedgerResource(database_url=f"{url}application_name=backfill-{n}")
        if settings.database_url.startswith("sqlite"):
            ledger = LedgerResource(database_url=settings.database_url)
        ctx = steps.StepContext(spec, day, ledger, storage, provider, created_by=f"backfill-{n}")
        driver = steps.DayDriver(ctx, runs=InProcessRuns(source_uri), poll_every=30.0)
        try:
            steps.drive([driver], max_imports=200)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(n, day)) for n, day in enumerate(days)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    ledger = LedgerResource(database_url=settings.database_url)
    done = dead = 0
    for day in days:
        counts = ledger.refresh_job(steps.existing_job(spec, day, ledger).job_id)
        done += counts.succeeded
        dead += counts.dead_letters
    return done, dead


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("none", "declared", "learned"), default="learned")
    parser.add_argument("--days", type=int, default=1)
    parser.add_argument("--items", type=int, default=2000, help="Items a day.")
    parser.add_argument("--per-shard", type=int, default=100)
    parser.add_argument("--at-once", type=int, default=3, help="Shards the limit admits.")
    parser.add_argument("--batch-seconds", type=float, default=7.0)
    parser.add_argument(
        "--unstated", action="store_true", help="The server's refusals do not name its limit."
    )
    parser.add_argument("--db", default=None, help="Ledger URL (default: SQLite in a temp dir).")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="quota-bench-") as root:
        run(args, Path(root))


if __name__ == "__main__":
    main()
