"""One day of N items through every step, on SQLite and PostgreSQL: where the time goes.

Synthetic support tickets (about 200 characters of body, a few percent of bad rows) go
through the real step functions: snapshot → shards → submit (to an instant fake OpenAI
batch provider, bench/instant_provider.py) → import → the retry round → validation (with
the read-back check the validated_outputs asset runs) → dead letters → cost report. Then, on
the same data: the import again after a crash between upsert and `imported` (an idempotent
no-op), and the naive import (one single-row upsert statement per output line, each
committed, as the seed script did) into a copy of the job.

The provider's own time (writing its answers, done during submit) is measured apart and
left out; reading and parsing its output lines (`normalize_line`) is ours and counted in
import. Each (items, database) configuration runs in a fresh subprocess so that its peak
RSS is its own; the PostgreSQL database `llm_assets_bench` is dropped and created for each.

    .venv/bin/python bench/pipeline_scale.py --items 10000 100000 1000000 \
        --db sqlite postgres [--profile DIR] [--naive-sample 20000] [--slices 8 --workers 2] \
        [--slice-pool P] [--day-only]

`--slices N --workers W` builds and validates each day in N slices (sharding.slices), each
slice on one of W worker processes (as Celery workers run slice steps), and joins them in the
bench's process; the other steps run as without slices. A build slice renders and counts its
rows in its own process, as a slice step does by default; `--slice-pool P` gives each P worker
processes of its own (LLM_ASSETS_SLICE_WORKERS). `--day-only` leaves out the re-import
and the naive import after the day (at 10M the naive import's copy of the job takes longer
than the day).

`--profile DIR` runs every step under pyinstrument (tree, flat self and flat total time per
step in DIR/<items>-<db>/, and an HTML report); profiled timings are slower than
unprofiled ones. `--max-seconds S` stops a configuration after S seconds and reports the
steps it finished and the one it was in. PostgreSQL: LLM_ASSETS_BENCH_PG_ADMIN_URL (default
postgres@127.0.0.1:5432) and LLM_ASSETS_BENCH_PG_DATABASE (default llm_assets_bench); a run
holds an advisory lock so that two runs never drop each other's database.
"""

import argparse
import datetime as dt
import gc
import hashlib
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DAY = dt.date(2026, 11, 2)
PIPELINE = "bench_tickets"
PG_ADMIN_URL = os.environ.get(
    "LLM_ASSETS_BENCH_PG_ADMIN_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432/postgres"
)
PG_DATABASE = os.environ.get("LLM_ASSETS_BENCH_PG_DATABASE", "llm_assets_bench")

# Steps of the day itself: their sum is "end to end". A day in slices has no "validate
# read-back" of its own: each slice reads its part back within "validate".
DAY_STEPS = (
    "snapshot",
    "shards",
    "submit",
    "import",
    "retry submit",
    "retry import",
    "validate",
    "validate read-back",
    "dead letters",
    "cost report",
)

# ---------------------------------------------------------------------------------------
# Source data

_SUBJECTS = (
    "Charged twice for my subscription",
    "Cannot log in after password reset",
    "Package marked delivered but not here",
    "App crashes when I open settings",
    "Refund still not received",
    "Two-factor code never arrives",
    "Wrong address on my order",
    "Feature request: export to CSV",
    "Invoice shows the wrong VAT number",
    "Sync stopped working on Android",
    "Tracking number does not work",
    "Account locked after travel",
    "Dark mode would be great",
    "Damaged box, broken item inside",
    "Price went up without notice",
    "Error 502 on the dashboard",
)
_OPENERS = (
    "Hi, order {o} is the problem.",
    "Hello support team, about order {o}:",
    "Ticket for account {a}.",
    "Hi there, this is the third time I write about order {o}.",
    "Good morning, customer {a} here.",
    "Hey, quick one about {a}.",
)
_DETAILS = (
    "I was charged twice on the same day and my bank shows both payments.",
    "After the update the app closes as soon as I tap on settings, on every try.",
    "The tracking page has said out for delivery for six days now.",
    "The reset email arrives, but the new password is rejected every time.",
    "The code from the authenticator app is refused, even after syncing the time.",
    "The parcel arrived with the box crushed and the glass inside broken.",
    "The invoice lists my old company name and the wrong VAT id.",
    "I would love a way to export all my reports to a spreadsheet at once.",
    "My phone stopped syncing with the web version since Tuesday.",
    "The dashboard shows an error 502 when I open the monthly view.",
    "The renewal price is 30% higher than last year and nobody told me.",
    "I moved last month and the order still went to my old address.",
)
_CLOSERS = (
    "Please help.",
    "Thanks in advance.",
    "Can you look into this today?",
    "I need this fixed before Friday.",
    "Regards, Sam.",
    "Thank you!",
)
_CHANNELS = ("email", "chat", "web", "phone")


def write_source(path: Path, count: int) -> dict[str, int]:
    """`count` tickets for DAY, deterministic; a few bad rows of each kind on purpose."""
    rng = random.Random(20261102)
    path.parent.mkdir(parents=True, exist_ok=True)
    bad = {"empty_body": 0, "duplicate_id": 0, "bad_date": 0}
    choice = rng.choice
    with path.open("w", encoding="utf-8") as out:
        write = out.write
        previous = ""
        for n in range(count):
            ticket_id = f"T{n:08d}"
            second = n * 86_399 // max(count, 1)
            created = f"{DAY}T{second // 3600:02d}:{second // 60 % 60:02d}:{second % 60:02d}Z"
            body = " ".join(
                (
                    choice(_OPENERS).format(o=100_000 + n, a=f"ACME-{n % 9973:04d}"),
                    choice(_DETAILS),
                    choice(_DETAILS),
                    choice(_CLOSERS),
                )
            )
            if n % 500 == 499:
                body, bad["empty_body"] = "", bad["empty_body"] + 1
            elif n % 1000 == 998 and previous:
                ticket_id, bad["duplicate_id"] = previous, bad["duplicate_id"] + 1
            elif n % 2000 == 1234:
                created, bad["bad_date"] = "sometime last week", bad["bad_date"] + 1
            previous = ticket_id
            write(
                json.dumps(
                    {
                        "ticket_id": ticket_id,
                        "created_at": created,
                        "subject": choice(_SUBJECTS),
                        "body": body,
                        "channel": choice(_CHANNELS),
                    }
                )
            )
            write("\n")
    return bad


def spec_dict(source_uri: str, slices: int = 1) -> dict[str, Any]:
    return {
        "name": PIPELINE,
        "description": "Benchmark: support tickets through the instant OpenAI fake.",
        "source": {
            "kind": "jsonl",
            "uri": source_uri,
            "id_field": "ticket_id",
            "date_field": "created_at",
            "fields": ["subject", "body", "channel"],
            "required_fields": ["body"],
        },
        "prompt": {
            "version": "v1",
            "system": "You triage customer support tickets. Return JSON with the ticket's "
            "category, your confidence between 0 and 1, and a one or two sentence summary "
            "of the customer's problem.",
            "template": "Subject: {subject}\n\n{body}",
        },
        "model": {
            "provider": "openai",
            "name": "gpt-4o-mini",
            "max_output_tokens": 200,
            "temperature": 0,
        },
        "output": {
            "format": "json",
            "schema": {
                "category": {
                    "type": "str",
                    "isin": [
                        "billing",
                        "technical_issue",
                        "account_access",
                        "shipping",
                        "product_feedback",
                    ],
                },
                "confidence": {"type": "float", "ge": 0, "le": 1},
                "summary": {"type": "str", "min_length": 10, "max_length": 240},
            },
        },
        "quality": {"max_failure_rate": 0.05, "min_confidence": 0.3},
        "retry": {"max_attempts": 3, "backoff_seconds": 0},
        "sharding": {"slices": slices},
        "partitions": {"start_date": "2026-11-01", "timezone": "UTC"},
        # The instant provider's files are the bench's own, read again by the re-import;
        # its parent's deletion would go to OpenAI's API.
        "retention": {"provider_files": "keep"},
    }


# ---------------------------------------------------------------------------------------
# Measuring


def _status_kb(field: str, pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field):
                return int(line.split()[1])
    return 0


def rss_mb() -> float:
    return _status_kb("VmRSS:") / 1024


def step_peak_mb() -> float:
    return _status_kb("VmHWM:") / 1024


def _child_pids() -> list[int]:
    pids: list[int] = []
    for children in Path("/proc/self/task").glob("*/children"):
        try:
            pids += [int(pid) for pid in children.read_text().split()]
        except OSError:
            continue
    return pids


def children_rss_mb() -> float:
    """Resident memory of this process's children (the worker processes of
    llm_assets.util.parallel). A child being spawned shares this process's pages until it
    execs; until then its command line is ours, and it is not counted (its pages are this
    process's). Read from /proc/<pid>/status, which costs the kernel microseconds: the PSS of
    smaps_rollup walks every page of the child (10 ms for 700 MB), and sampled every 50 ms it
    takes a fifth of a core per child from the day being measured. RSS counts the shared
    libraries in each child: the sum errs high."""
    total = 0
    ours = Path("/proc/self/cmdline").read_bytes()
    for pid in _child_pids():
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes() == ours:
                continue
            total += _status_kb("VmRSS:", pid)
        except OSError:
            continue
    return total / 1024


class TreeSampler:
    """The peak of this process's RSS plus its children's, sampled every 50 ms: VmHWM alone
    leaves out the worker processes."""

    def __init__(self) -> None:
        import threading

        self.peak = 0.0
        self.children_peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            children = children_rss_mb()
            self.children_peak = max(self.children_peak, children)
            self.peak = max(self.peak, rss_mb() + children)

    def __enter__(self) -> "TreeSampler":
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        self._thread.join()


def reset_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux ≥ 4.0), so each step's peak is its own."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


class Meter:
    def __init__(self, provider: Any, profile_dir: Path | None, progress: Path | None) -> None:
        self.provider = provider
        self.profile_dir = profile_dir
        self.progress = progress
        self.rows: list[dict[str, Any]] = []

    def run(self, name: str, items: int | Callable[[Any], int], fn: Callable[[], Any]) -> Any:
        gc.collect()
        exact_peak = reset_peak()
        start_rss = rss_mb()
        provider_before = self.provider.generation_seconds
        profiler = None
        if self.profile_dir is not None:
            from pyinstrument import Profiler

            profiler = Profiler(interval=0.001)
            profiler.start()
        started = time.perf_counter()
        with TreeSampler() as tree:
            result = fn()
        wall = time.perf_counter() - started
        if profiler is not None:
            profiler.stop()
            self._write_profile(name, profiler)
        provider = self.provider.generation_seconds - provider_before
        count = items(result) if callable(items) else items
        row = {
            "step": name,
            "seconds": wall - provider,
            "provider_seconds": provider,
            "items": count,
            "rss_start_mb": start_rss,
            "rss_end_mb": rss_mb(),
            "peak_mb": step_peak_mb() if exact_peak else float("nan"),
            # With worker processes: this process's peak plus theirs at that moment.
            "tree_peak_mb": max(tree.peak, step_peak_mb() if exact_peak else 0.0),
            "workers_peak_mb": tree.children_peak,
        }
        self.rows.append(row)
        if self.progress is not None:
            with self.progress.open("a") as handle:
                handle.write(json.dumps(row) + "\n")
        print(
            f"  {name:<20} {row['seconds']:8.2f} s  {count:>9} items  "
            f"{count / row['seconds'] if row['seconds'] else 0:>10.0f}/s  "
            f"rss {start_rss:6.0f} → peak {row['peak_mb']:6.0f} MB"
            + (
                f" (+ workers {row['workers_peak_mb']:.0f}: {row['tree_peak_mb']:.0f})"
                if row["workers_peak_mb"]
                else ""
            )
            + (f"  (+{provider:.1f} s provider)" if provider else ""),
            file=sys.stderr,
            flush=True,
        )
        return result

    def _write_profile(self, name: str, profiler: Any) -> None:
        assert self.profile_dir is not None
        self.profile_dir.mkdir(parents=True, exist_ok=True)
        stem = self.profile_dir / name.replace(" ", "_")
        stem.with_suffix(".tree.txt").write_text(profiler.output_text(show_all=False))
        stem.with_suffix(".total.txt").write_text(
            profiler.output_text(flat=True, flat_time="total", show_all=True)
        )
        stem.with_suffix(".self.txt").write_text(
            profiler.output_text(flat=True, flat_time="self", show_all=True)
        )
        stem.with_suffix(".full.txt").write_text(
            profiler.output_text(show_all=True, processor_options={"filter_threshold": 0.005})
        )
        stem.with_suffix(".html").write_text(profiler.output_html())


# ---------------------------------------------------------------------------------------
# One configuration (runs in its own process)


def database_url(db: str, home: Path, name: str = PG_DATABASE, *, fresh: bool = True) -> str:
    """A ledger for one configuration: SQLite under `home`, or PostgreSQL database `name`
    dropped and created anew (as it is, when not `fresh`)."""
    if db == "sqlite":
        return f"sqlite:///{home / 'ledger.db'}"
    import sqlalchemy as sa

    if not fresh:
        return sa.engine.make_url(PG_ADMIN_URL).set(database=name).render_as_string(False)
    admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        conn.execute(sa.text(f"CREATE DATABASE {name}"))
    admin.dispose()
    return sa.engine.make_url(PG_ADMIN_URL).set(database=name).render_as_string(False)


SERVER_SETTINGS = ("shared_buffers", "max_wal_size", "checkpoint_timeout", "wal_compression")
"""PostgreSQL settings that move a large day's time (docs/operations.md): printed with the
figures, which are only comparable on the same ones."""


def server_activity(ledger: Any) -> dict[str, Any] | None:
    """The server's SERVER_SETTINGS, the WAL it has written and the checkpoints it has made
    (all databases: the bench's runs alone on the server); None for SQLite."""
    import sqlalchemy as sa

    if ledger.engine.dialect.name != "postgresql":
        return None
    with ledger.engine.connect() as conn:
        settings = dict(
            conn.execute(
                sa.text(
                    "SELECT name, current_setting(name) FROM pg_settings WHERE name = ANY(:names)"
                ),
                {"names": list(SERVER_SETTINGS)},
            ).all()
        )
        wal = conn.execute(sa.text("SELECT wal_bytes FROM pg_stat_wal")).scalar_one()
        checkpoints = conn.execute(
            sa.text("SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter")
        ).scalar_one()
    return {"settings": settings, "wal_bytes": int(wal), "checkpoints": int(checkpoints)}


def server_during(before: dict[str, Any] | None, after: dict[str, Any] | None) -> Any:
    """The server's settings, and the WAL (GB) and checkpoints of the day, from the
    server_activity before and after it."""
    if before is None or after is None:
        return None
    return {
        "settings": after["settings"],
        "wal_gb": round((after["wal_bytes"] - before["wal_bytes"]) / 1e9, 2),
        "checkpoints": after["checkpoints"] - before["checkpoints"],
    }


def token_cost_us(spec: Any, source: Path, sample: int = 5000) -> dict[str, float]:
    """Microseconds per item of the exact input-token count (o200k_base) on real rows: of
    the whole request (system prompt, user text, framing) and of the user text alone."""
    from llm_assets.items.prepare import render
    from llm_assets.items.tokens import counter_for

    counter = counter_for(spec)
    users = []
    with source.open() as handle:
        for line in handle:
            users.append(render(spec, json.loads(line)))
            if len(users) >= sample:
                break
    counter.request(spec.prompt.system, users[0])
    timings = {}
    for name, count in (
        ("request", lambda user: counter.request(spec.prompt.system, user)),
        ("user", counter.text),
    ):
        started = time.perf_counter()
        for user in users:
            count(user)
        timings[name] = (time.perf_counter() - started) / len(users) * 1e6
    return timings


def _dialect_insert(conn: Any) -> Any:
    from sqlalchemy.dialects import postgresql, sqlite

    return postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert


def naive_import(
    spec: Any, ledger: Any, provider: Any, job: Any, shards: list[Any], limit: int
) -> dict[str, Any]:
    """The seed script's import: one single-row upsert (INSERT ... ON CONFLICT DO UPDATE
    unless terminal) per output line, each committed, into a fresh copy of the job (same
    items, all `submitted`, same output lines)."""
    import sqlalchemy as sa

    from llm_assets import steps
    from llm_assets.resources.ledger import SUBMITTED, result_table, utcnow

    copy = ledger.get_or_create_job(
        job_id=f"{job.job_id}-naive",
        pipeline=f"{spec.name}_naive",
        partition_date=job.partition_date,
        task_type=job.task_type,
        provider=job.provider,
        model_name=job.model_name,
        prompt_version=job.prompt_version,
        code_version=job.code_version,
        created_by="bench",
    )
    now = utcnow()
    stamp = sa.literal(now, type_=result_table.c.created_at.type)
    columns = ["custom_id", "source_id", "shard_id", "model_name", "estimated_input_tokens"]
    select = sa.select(
        sa.literal(copy.job_id, type_=result_table.c.job_id.type),
        *[result_table.c[c] for c in columns],
        sa.literal(SUBMITTED, type_=result_table.c.status.type),
        sa.literal(1, type_=result_table.c.attempts.type),
        stamp,
        stamp,
    ).where(
        result_table.c.job_id == job.job_id,
        result_table.c.shard_id.in_([s.shard_id for s in shards]),
    )
    with ledger.begin() as conn:
        conn.execute(
            sa.insert(result_table).from_select(
                ["job_id", *columns, "status", "attempts", "created_at", "updated_at"], select
            )
        )
    ledger.analyze()
    price = steps.price_for(spec)
    total_lines = sum(1 for s in shards for _ in provider.output_lines(s.provider_batch_id))
    lines = applied = 0
    terminal = result_table.c.status.in_(["succeeded", "dead_letter"])
    started = time.perf_counter()
    for shard in shards:
        for result in provider.results(shard.provider_batch_id):
            # The seed's loop: one upsert statement per output line, committed on its own.
            row = steps.ledger_row(result, price, spec.model.name, batch=True)
            with ledger.begin() as conn:
                insert = _dialect_insert(conn)(result_table).values(
                    job_id=copy.job_id, created_at=now, updated_at=utcnow(), **row
                )
                update = {k: insert.excluded[k] for k in row if k != "custom_id"}
                applied += conn.execute(
                    insert.on_conflict_do_update(
                        index_elements=["job_id", "custom_id"],
                        set_={**update, "updated_at": insert.excluded.updated_at},
                        where=sa.not_(terminal),
                    )
                ).rowcount
            lines += 1
            if lines >= limit:
                break
        if lines >= limit:
            break
    seconds = time.perf_counter() - started
    return {
        "lines": lines,
        "applied": applied,
        "seconds": seconds,
        "total_lines": total_lines,
        "extrapolated": lines < total_lines,
        "estimated_seconds": seconds / lines * total_lines if lines else 0.0,
    }


def bench_context(args: argparse.Namespace, source: Path, *, fresh: bool = True) -> Any:
    """The StepContext of the bench day: its spec written and parsed as a user's would be,
    the ledger's schema created (outside the timings), the instant provider. Not `fresh`:
    the ledger the configuration made (a worker process's)."""
    import yaml

    from bench.instant_provider import InstantOpenAIProvider
    from llm_assets import steps
    from llm_assets.resources.ledger import LedgerResource
    from llm_assets.resources.storage import ArtifactStorage
    from llm_assets.spec.load import parse_spec

    home = Path(os.environ["LLM_ASSETS_HOME"])
    spec_path = home / "specs" / f"{PIPELINE}.yaml"
    spec_path.parent.mkdir(parents=True, exist_ok=True)
    spec_path.write_text(yaml.safe_dump(spec_dict(str(source), args.slices)))
    spec, problems = parse_spec(spec_path)
    if problems or spec is None:
        raise SystemExit(f"bench spec is invalid: {problems}")
    ledger = LedgerResource(database_url=database_url(args.db, home, fresh=fresh))
    ledger.engine  # noqa: B018  (schema created here, outside the timings)
    storage = ArtifactStorage(base_url=str(home / "artifacts"))
    provider = InstantOpenAIProvider(output_dir=str(home / "provider"))
    return steps.StepContext(spec, DAY, ledger, storage, provider, created_by="bench")


# ---------------------------------------------------------------------------------------
# Slices on worker processes

_slice_ctx: Any = None


def _slice_process(db: str, source: str, slices: int, pool: int | None) -> None:
    """A worker process's setup (outside the timings): the steps' modules and the day's
    context, as a Celery worker has them loaded when it takes a step; `pool` worker
    processes of its own for a slice step's rows (LLM_ASSETS_SLICE_WORKERS; None: the
    default, none)."""
    global _slice_ctx
    if pool is not None:
        os.environ["LLM_ASSETS_SLICE_WORKERS"] = str(pool)
    from llm_assets import steps

    steps.build_slice  # noqa: B018
    _slice_ctx = bench_context(argparse.Namespace(db=db, slices=slices), Path(source), fresh=False)


def _warm(_: int) -> None:
    time.sleep(0.5)  # every worker process started before the timings, not only the first


def _validate_slice(number: int) -> dict[str, float]:
    """Validate one slice, as a worker runs a validation slice step; its process's peaks."""
    from llm_assets import steps

    steps.validate_slice(_slice_ctx, number)
    return {
        "process_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "pool_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
    }


def _build_slice(number: int) -> dict[str, float]:
    """Build one slice, as a worker runs a slice step; its process's and its pool's peaks."""
    from llm_assets import steps

    steps.build_slice(_slice_ctx, number)
    return {
        "process_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "pool_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
    }


def reimport_problems(ctx: Any, meter: "Meter", counts: Any) -> tuple[Any, list[str]]:
    """Import the first round again (its shards marked completed): nothing may change."""
    from llm_assets import steps

    ledger = ctx.ledger
    job = ctx.job()
    for shard in ledger.shards(job.job_id):
        if shard.round == 0:
            ledger.update_shard(shard.shard_id, status="completed")
    again = meter.run(
        "re-import (no-op)", lambda r: r.lines.received, lambda: steps.import_results(ctx)
    )
    after = ledger.counts(job.job_id)
    # A float column summed by PostgreSQL in another row order differs in the last bits.
    same = (
        after.model_copy(update={"cost_usd": 0.0}) == counts.model_copy(update={"cost_usd": 0.0})
        and abs(after.cost_usd - counts.cost_usd) < 1e-9
    )
    if not same or again.lines.applied or again.retry_shards:
        return again, [
            f"re-import changed the ledger: applied {again.lines.applied}, "
            f"retry shards {again.retry_shards}, counts {counts} -> {after}"
        ]
    return again, []


def run_config(args: argparse.Namespace) -> dict[str, Any]:
    from llm_assets import steps

    source = Path(args.source)
    ctx = bench_context(args, source)
    spec, ledger, provider = ctx.spec, ctx.ledger, ctx.provider
    profile_dir = Path(args.profile) / f"{args.items}-{args.db}" if args.profile else None
    meter = Meter(provider, profile_dir, Path(args.result).with_suffix(".steps.jsonl"))
    n = args.items
    print(f"{n} items on {args.db}:", file=sys.stderr, flush=True)
    # The steps load their modules (pandas, pandera, ...) on first use; loading them here
    # keeps a step's seconds its work on the day, as when the package loaded every step at once.
    for step in (
        "take_snapshot",
        "build_shards",
        "budget_gate",
        "submit_shards",
        "import_results",
        "validate_outputs",
        "published_frame_failures",
        "export_dead_letters",
        "cost_report",
    ):
        getattr(steps, step)
    server_before = server_activity(ledger)
    started_all = time.perf_counter()

    meter.run("snapshot", n, lambda: steps.take_snapshot(ctx, str(source)))

    slice_peaks: list[dict[str, float]] = []
    workers = None
    if args.slices > 1:
        # Slices run as steps on worker processes (a Celery worker runs a step's code in its
        # own process), `args.workers` at once; the join runs here.
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        workers = ProcessPoolExecutor(
            args.workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_slice_process,
            initargs=(args.db, str(source), args.slices, args.slice_pool),
        )
        list(workers.map(_warm, range(args.workers)))

    # A sliced step's seconds in its slices (on the worker processes) and in its join.
    parts: dict[str, dict[str, float]] = {}

    def in_slices(
        step: str, run: Callable[[int], dict[str, float]], join: Callable[[], Any]
    ) -> Any:
        assert workers is not None
        started = time.perf_counter()
        slice_peaks.extend(workers.map(run, range(args.slices)))
        joined_at = time.perf_counter()
        result = join()
        parts[step] = {
            "slices": joined_at - started,
            "join": time.perf_counter() - joined_at,
        }
        print(
            f"    {step}: slices {parts[step]['slices']:.2f} s, join {parts[step]['join']:.2f} s",
            file=sys.stderr,
            flush=True,
        )
        return result

    def shards() -> Any:
        if workers is None:
            result = steps.build_shards(ctx)
        else:
            result = in_slices("shards", _build_slice, lambda: steps.join_slices(ctx))
        steps.budget_gate(ctx)
        return result

    built = meter.run("shards", n, shards)
    meter.run("submit", n, lambda: steps.submit_shards(ctx))
    first = meter.run("import", lambda r: r.lines.received, lambda: steps.import_results(ctx))
    retried = sum(s.item_count for s in ledger.shards(first.job_id) if s.round > 0)
    meter.run("retry submit", retried, lambda: steps.submit_shards(ctx))
    second = meter.run(
        "retry import", lambda r: r.lines.received, lambda: steps.import_results(ctx)
    )

    slices_read_back: list[dict[str, Any]] = []

    def validate() -> Any:
        if workers is None:
            return steps.validate_outputs(ctx)
        joined = in_slices("validate", _validate_slice, lambda: steps.join_validation(ctx))
        slices_read_back.extend(joined.read_back_failures)
        return joined.result

    validated = meter.run("validate", n, validate)
    if workers is not None:
        workers.shutdown()
        # Each slice read its part back against the frame schema, as the sliced asset does.
        read_back = slices_read_back
    else:
        read_back = meter.run(
            "validate read-back",
            validated.valid_rows,
            lambda: steps.published_frame_failures(ctx, validated.uri),
        )
    dead = meter.run("dead letters", lambda r: r.rows, lambda: steps.export_dead_letters(ctx))
    report = meter.run("cost report", n, lambda: steps.cost_report(ctx))
    day_seconds = time.perf_counter() - started_all
    server_after = server_activity(ledger)

    job = ctx.job()
    counts = ledger.counts(job.job_id)
    problems_found = []
    if counts.total != n:
        problems_found.append(f"ledger has {counts.total} items for {n} source rows")
    if counts.open:
        problems_found.append(f"{counts.open} items not terminal after the retry round")
    if second.retry_shards:
        problems_found.append(f"a second retry round was planned: {second.retry_shards}")
    if read_back:
        problems_found.append(f"{len(read_back)} rows fail the read-back check")
    round0 = [s for s in ledger.shards(job.job_id) if s.round == 0]
    again, naive = None, None
    if not args.day_only:
        again, changed = reimport_problems(ctx, meter, counts)
        problems_found += changed
        gc.collect()
        naive = naive_import(spec, ledger, provider, job, round0, args.naive_sample)
        print(
            f"  {'naive import':<20} {naive['seconds']:8.2f} s  {naive['lines']:>9} lines  "
            f"{naive['lines'] / naive['seconds']:>10.0f}/s"
            + (f"  (~{naive['estimated_seconds']:.0f} s for all)" if naive["extrapolated"] else ""),
            file=sys.stderr,
            flush=True,
        )
    return {
        "items": n,
        "db": args.db,
        "slices": args.slices,
        "workers": args.workers if args.slices > 1 else 1,
        "slice_pool": args.slice_pool,
        # The peak of one slice process, and of one worker process of a slice's pool.
        "slice_process_peak_mb": max((p["process_mb"] for p in slice_peaks), default=0.0),
        "slice_pool_peak_mb": max((p["pool_mb"] for p in slice_peaks), default=0.0),
        "slices_and_joins": parts,
        "steps": meter.rows,
        "token_count_us": token_cost_us(spec, source),
        "naive": naive,
        "shards": len(built.shards_created),
        "estimate": built.estimate.model_dump(),
        "counts": counts.model_dump(),
        "valid_rows": validated.valid_rows,
        "quality_failures": validated.quality_failures,
        "dead_letters": dead.rows,
        "cost_usd": report.cost_usd,
        "import_lines": first.lines.model_dump(exclude={"duplicate_ids"}),
        "reimport_lines": again and again.lines.model_dump(exclude={"duplicate_ids"}),
        "day_wall_seconds": day_seconds,
        "postgres": server_during(server_before, server_after),
        # The whole process tree: worker processes count against the memory target too.
        "peak_rss_mb": max(
            [resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024]
            + [row["tree_peak_mb"] for row in meter.rows]
        ),
        "problems": problems_found,
    }


# ---------------------------------------------------------------------------------------
# The driver


def _fmt_rate(items: int, seconds: float) -> str:
    return f"{items / seconds:,.0f}" if seconds > 0 else "-"


def _order(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(results, key=lambda r: (r["db"], r["items"]))


def markdown(results: list[dict[str, Any]]) -> str:
    out: list[str] = []
    out.append(
        "| items | db | end to end (s, ours) | µs/item | vs smallest | provider (s) | "
        "peak RSS (MB) | import rows/s | re-import rows/s | naive rows/s | bulk/naive | "
        "tokens µs/item (request / user text) |"
    )
    out.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
    smallest: dict[str, float] = {}
    for r in _order(results):
        by = {s["step"]: s for s in r["steps"]}
        if r.get("timed_out"):
            done = sum(s["seconds"] for s in r["steps"])
            out.append(
                f"| {r['items']:,} | {r['db']} | stopped after {r['timed_out']:.0f} s in step "
                f"'{r['stopped_in']}' ({done:.0f} s in the steps before) | | | | | "
                + (
                    _fmt_rate(by["import"]["items"], by["import"]["seconds"])
                    if "import" in by
                    else ""
                )
                + " | | | | |"
            )
            continue
        e2e = sum(by[s]["seconds"] for s in DAY_STEPS if s in by)
        per_item = e2e / r["items"] * 1e6
        smallest.setdefault(r["db"], per_item)
        provider = sum(s["provider_seconds"] for s in r["steps"])
        imp = by["import"]
        bulk_rate = imp["items"] / imp["seconds"]
        again = by.get("re-import (no-op)")
        naive = r["naive"]
        if naive is None:  # --day-only
            checks = "- | - | - | "
        else:
            naive_rate = naive["lines"] / naive["seconds"]
            checks = (
                f"{_fmt_rate(again['items'], again['seconds']) if again else '-'} | "
                f"{naive_rate:,.0f}{' (sample)' if naive['extrapolated'] else ''} | "
                f"{bulk_rate / naive_rate:.1f}x | "
            )
        out.append(
            f"| {r['items']:,} | {r['db']} | {e2e:.1f} | {per_item:.0f} | "
            f"{per_item / smallest[r['db']]:.2f}x | {provider:.1f} | {r['peak_rss_mb']:.0f} | "
            f"{bulk_rate:,.0f} | {checks}{r['token_count_us']['request']:.0f} / "
            f"{r['token_count_us']['user']:.0f} |"
        )
    out.append("")
    out.append(
        "| items | db | step | seconds | items | items/s | RSS start (MB) | step peak (MB) | "
        "with workers (MB) | RSS end (MB) |"
    )
    out.append("|---|---|---|---|---|---|---|---|---|---|")
    for r in _order(results):
        for s in r["steps"]:
            out.append(
                f"| {r['items']:,} | {r['db']} | {s['step']} | {s['seconds']:.2f} | "
                f"{s['items']:,} | {_fmt_rate(s['items'], s['seconds'])} | "
                f"{s['rss_start_mb']:.0f} | {s['peak_mb']:.0f} | "
                + (f"{s['tree_peak_mb']:.0f}" if s.get("workers_peak_mb") else "-")
                + f" | {s['rss_end_mb']:.0f} |"
            )
        if r.get("timed_out"):
            out.append(
                f"| {r['items']:,} | {r['db']} | {r['stopped_in']} (unfinished: the configuration "
                f"was stopped at --max-seconds, {r['timed_out']:.0f} s) | | | | | | | |"
            )
            continue
        naive = r["naive"]
        if naive is None:
            continue
        note = (
            f"first {naive['lines']:,} of {naive['total_lines']:,} lines; all ≈ "
            f"{naive['estimated_seconds']:.0f} s (extrapolated)"
            if naive["extrapolated"]
            else f"all {naive['lines']:,} lines"
        )
        out.append(
            f"| {r['items']:,} | {r['db']} | naive import ({note}) | {naive['seconds']:.2f} | "
            f"{naive['lines']:,} | {_fmt_rate(naive['lines'], naive['seconds'])} | | | |"
        )
    out.append("")
    for r in _order(results):
        if r.get("timed_out"):
            continue
        counts = r["counts"]
        out.append(
            f"- {r['items']:,} on {r['db']}: {r['shards']} shards; {counts['by_status']}; "
            f"dead letters by class {counts['dead_letters_by_class']}; quality failures "
            f"{r['quality_failures']}; import lines {r['import_lines']}; re-import "
            f"{r['reimport_lines']}; cost ${r['cost_usd']:.2f}"
            + (f"; PROBLEMS: {r['problems']}" if r["problems"] else "")
            + (
                f"; {r['slices']} slices on {r['workers']} worker process(es): a slice's "
                f"process peaked at {r['slice_process_peak_mb']:.0f} MB"
                # Without a pool the children's peak is only a spawn's fork, the slice's own
                # pages before its exec: no worker's memory.
                + (
                    f", a worker of its pool ({r['slice_pool']} each) at "
                    f"{r['slice_pool_peak_mb']:.0f} MB"
                    if r.get("slice_pool")
                    else ""
                )
                if r.get("slices", 1) > 1
                else ""
            )
            + (
                f"; PostgreSQL {r['postgres']['settings']}: the run wrote "
                f"{r['postgres']['wal_gb']} GB of WAL, {r['postgres']['checkpoints']} checkpoints"
                if r.get("postgres")
                else ""
            )
        )
    return "\n".join(out)


STEP_ORDER = (*DAY_STEPS[:7], "validate read-back", *DAY_STEPS[8:], "re-import (no-op)")


def run_child(
    command: list[str],
    env: dict[str, str],
    result_file: Path,
    limit: float | None,
    items: int,
    db: str,
) -> dict[str, Any]:
    """Run one configuration; past `limit` seconds stop it and keep the steps it finished."""
    started = time.monotonic()
    child = subprocess.Popen(command, env=env, cwd=REPO)
    try:
        code = child.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
        steps_file = result_file.with_suffix(".steps.jsonl")
        rows = (
            [json.loads(line) for line in steps_file.read_text().splitlines()]
            if steps_file.exists()
            else []
        )
        done = {r["step"] for r in rows}
        stopped_in = next((s for s in STEP_ORDER if s not in done), "naive import")
        elapsed = time.monotonic() - started
        print(f"  stopped after {elapsed:.0f} s, in {stopped_in}", file=sys.stderr)
        return {
            "items": items,
            "db": db,
            "steps": rows,
            "timed_out": elapsed,
            "stopped_in": stopped_in,
        }
    if code != 0:
        raise SystemExit(f"the {items} items / {db} run failed with exit code {code}")
    return json.loads(result_file.read_text())


def lock_postgres() -> Any:
    """Check the server and hold an advisory lock for the whole run: the bench drops and
    creates its database, so a second run against the same server and database must wait."""
    import sqlalchemy as sa

    try:
        engine = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
        conn = engine.connect()
    except sa.exc.OperationalError as exc:
        raise SystemExit(
            f"PostgreSQL is not reachable at {PG_ADMIN_URL} ({exc.orig}); start it or set "
            "LLM_ASSETS_BENCH_PG_ADMIN_URL to a server where the bench may drop and create "
            f"the database {PG_DATABASE}"
        ) from None
    digest = hashlib.sha256(f"pipeline_scale:{PG_DATABASE}".encode()).digest()
    key = int.from_bytes(digest[:8], "big", signed=True)
    if not conn.execute(sa.select(sa.func.pg_try_advisory_lock(key))).scalar():
        conn.close()
        raise SystemExit(
            f"another pipeline_scale run is using the database {PG_DATABASE} on this server; "
            "wait for it, or set LLM_ASSETS_BENCH_PG_DATABASE to another name"
        )
    return conn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--db", nargs="+", choices=["sqlite", "postgres"], default=["sqlite"])
    parser.add_argument("--profile", help="write pyinstrument profiles per step under this folder")
    parser.add_argument(
        "--naive-sample",
        type=int,
        default=20_000,
        help="time the naive import on at most this many lines, extrapolate beyond",
    )
    parser.add_argument(
        "--max-seconds",
        type=float,
        help="stop a configuration that runs longer than this; the table shows where it was",
    )
    parser.add_argument(
        "--slices", type=int, default=1, help="build each day's shards in this many slices"
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="with --slices: worker processes that build the slices, this many at once",
    )
    parser.add_argument(
        "--slice-pool",
        type=int,
        help="with --slices: each build slice's own worker processes "
        "(LLM_ASSETS_SLICE_WORKERS; default none)",
    )
    parser.add_argument(
        "--day-only",
        action="store_true",
        help="time the day's steps only, not the re-import and naive import after it",
    )
    parser.add_argument("--json", help="also write the raw results to this file")
    parser.add_argument("--keep", action="store_true", help="keep the temp folder")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--source", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:
        (args.items,) = args.items
        (args.db,) = args.db
        result = run_config(args)
        Path(args.result).write_text(json.dumps(result))
        return

    pg_lock = lock_postgres() if "postgres" in args.db else None
    root = Path(tempfile.mkdtemp(prefix="llm-assets-bench-"))
    print(f"working in {root}", file=sys.stderr)
    results: list[dict[str, Any]] = []
    began = time.monotonic()
    try:
        for items in args.items:
            source = root / "data" / str(items) / f"tickets-{DAY}.jsonl"
            started = time.perf_counter()
            bad = write_source(source, items)
            print(
                f"wrote {items} tickets ({bad}) in {time.perf_counter() - started:.1f} s",
                file=sys.stderr,
            )
            for db in args.db:
                home = root / f"{items}-{db}"
                home.mkdir()
                result_file = home / "result.json"
                command = [
                    sys.executable,
                    str(Path(__file__).resolve()),
                    "--child",
                    "--items",
                    str(items),
                    "--db",
                    db,
                    "--source",
                    str(source),
                    "--result",
                    str(result_file),
                    "--naive-sample",
                    str(args.naive_sample),
                    "--slices",
                    str(args.slices),
                    "--workers",
                    str(args.workers),
                    *(
                        ["--slice-pool", str(args.slice_pool)]
                        if args.slice_pool is not None
                        else []
                    ),
                    *(["--day-only"] if args.day_only else []),
                ]
                if args.profile:
                    command += ["--profile", str(Path(args.profile).resolve())]
                env = {**os.environ, "LLM_ASSETS_HOME": str(home)}
                env.pop("LLM_ASSETS_FAILPOINT", None)
                env.pop("LLM_ASSETS_PRICES", None)
                results.append(run_child(command, env, result_file, args.max_seconds, items, db))
                if not args.keep:
                    shutil.rmtree(home)
            if not args.keep:
                source.unlink()
    finally:
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2))
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
        if pg_lock is not None:
            pg_lock.close()
    print(markdown(results))
    print(f"\n(bench wall time {time.monotonic() - began:.0f} s)")


if __name__ == "__main__":
    main()
