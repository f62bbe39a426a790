"""Secrets: an API key never appears in logs, metadata, artifacts or error messages.

The real CLI runs against the fake OpenAI and Anthropic servers with a recognizable canary key,
through per-line 4xx/5xx faults, retried control-plane 429 and 500 answers, and then a second
pipeline that fails because the fake answers 401 to everything. Afterwards everything the runs
left behind is scanned for the key and for fragments of it:

* stdout and stderr of every CLI invocation (`run ... --json`, `status ... --json`, `status`);
* every file under the test's directory: LLM_ASSETS_HOME (snapshots, shards, outputs, dead
  letters, reports), DAGSTER_HOME (run and event-log SQLite files, compute logs, IO-manager
  pickles), the SQLite ledger file and the fake server's state -- as raw bytes, and decoded
  where the bytes may hide text (every row of every SQLite table with zlib-compressed blobs
  inflated, Parquet tables, gzip);
* the Dagster instance loaded from DAGSTER_HOME: every run (tags, run config), its job and
  execution-plan snapshots, every event-log entry, every materialization's and observation's
  metadata;
* every row of every ledger table through SQLAlchemy (SQLite and PostgreSQL);
* the fake server's call log.

The scan is not vacuous: a handler wrapped around each fake counts the requests whose
Authorization / x-api-key header carried exactly the canary, and every request did.
"""

import base64
import contextlib
import gzip
import json
import os
import sqlite3
import subprocess
import uuid
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import dagster as dg
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
import yaml
from dagster._core.instance.ref import InstanceRef

from tests import cli_process
from tests.fakes.anthropic_server import FakeAnthropic
from tests.fakes.common import ControlFault
from tests.fakes.openai_server import FakeOpenAI
from tests.harness import CLI, DAY, review_spec, truthful, write_reviews

# One database is enough: the scan compares what leaks, not how the ledger stores it.
pytestmark = [pytest.mark.slow, pytest.mark.one_database]
MODELS = {"openai": "gpt-4o-mini", "anthropic": "claude-haiku-4-5"}
KEY_VARIABLES = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}
BASE_URL_VARIABLES = {"openai": "OPENAI_BASE_URL", "anthropic": "ANTHROPIC_BASE_URL"}
REVIEWS = 30
DETERMINISTIC = (4, 13)  # reviews whose lines always fail with a 4xx: dead letters
TRANSIENT = {5: 0, 9: 1, 17: 2}  # reviews whose lines fail once, transiently: retried


@dataclass(frozen=True)
class Canary:
    """A fake key nobody could mistake for anything else, and the fragments worth looking for."""

    key: str

    @classmethod
    def new(cls) -> "Canary":
        return cls(f"sk-test-LEAKCANARY-{uuid.uuid4().hex}")

    @property
    def needles(self) -> tuple[str, ...]:
        middle = self.key.removeprefix("sk-test-")
        random_part = middle.removeprefix("LEAKCANARY-")
        return (
            self.key,
            middle,
            "LEAKCANARY",
            random_part,
            random_part[:12],
            random_part[-12:],
            base64.b64encode(self.key.encode()).decode(),
        )

    def found_in(self, text: str | bytes) -> list[str]:
        if isinstance(text, bytes):
            text = text.decode("latin-1")
        lowered = text.lower()
        return [needle for needle in self.needles if needle.lower() in lowered]


@dataclass
class Scan:
    """Every place looked at, and where a fragment of the key turned up."""

    canary: Canary
    places: Counter[str] = field(default_factory=Counter)
    leaks: list[tuple[str, list[str]]] = field(default_factory=list)

    def add(self, kind: str, where: str, text: str | bytes) -> None:
        self.places[kind] += 1
        found = self.canary.found_in(text)
        if found:
            self.leaks.append((where, found))


@dataclass
class KeyCheck:
    """Counts, per request the fake received, whether it carried exactly the canary key."""

    key: str
    seen: Counter[str] = field(default_factory=Counter)

    def wrap(self, handler: type[BaseHTTPRequestHandler]) -> type[BaseHTTPRequestHandler]:
        check = self

        class Keyed(handler):  # type: ignore[valid-type, misc]
            def parse_request(self) -> bool:
                parsed = super().parse_request()
                if parsed:
                    bearer = (self.headers.get("authorization") or "").removeprefix("Bearer ")
                    sent = {bearer, self.headers.get("x-api-key") or ""}
                    check.seen["with_key" if check.key in sent else "without_key"] += 1
                return parsed

        return Keyed


def watch_keys(fake: FakeOpenAI | FakeAnthropic, key: str) -> KeyCheck:
    """Wrap the fake's request handler (before it starts) to see which key each call sent."""
    check = KeyCheck(key)
    server = fake._server
    make_handler: Callable[[], type[BaseHTTPRequestHandler]] = server.handler_factory
    server.handler_factory = lambda: check.wrap(make_handler())
    return check


def order_number(text: str) -> int | None:
    for n in range(REVIEWS):
        if f"Order {1000 + n} " in text:
            return n
    return None


def fault_by_order(
    deterministic: str, transient: tuple[str, str, str]
) -> Callable[[str, dict[str, Any]], str | None]:
    """A fake's per-request fault, in the fake's own names: `deterministic` every time for the
    DETERMINISTIC reviews; for a TRANSIENT one, the first time only, the kind from `transient`
    that TRANSIENT picks."""
    seen: set[str] = set()

    def fault(custom_id: str, body: dict[str, Any]) -> str | None:
        n = order_number(json.dumps(body["messages"]))
        if n in DETERMINISTIC:
            return deterministic
        if n in TRANSIENT and custom_id not in seen:
            seen.add(custom_id)
            return transient[TRANSIENT[n]]
        return None

    return fault


def control_faults(provider: str) -> list[ControlFault]:
    """Transient control-plane answers the adapters retry; Retry-After 0 keeps them quick."""
    if provider == "openai":
        return [
            ControlFault("POST", "/v1/files", status=500, retry_after=0),
            ControlFault("POST", "/v1/batches", status=429, retry_after=0),
            ControlFault("GET", "/v1/batches/", status=500, retry_after=0),
            ControlFault("GET", "/content", status=429, retry_after=0),
        ]
    return [
        ControlFault("POST", "/v1/messages/batches", status=429, retry_after=0),
        ControlFault("GET", "/v1/messages/batches/", status=500, retry_after=0),
        ControlFault("GET", "/v1/messages/batches/", status=429, retry_after=0),
    ]


def denied_everywhere() -> list[ControlFault]:
    return [
        ControlFault(method, "/v1/", status=401, times=10_000)
        for method in ("GET", "POST", "DELETE")
    ]


@dataclass
class Invocation:
    label: str
    done: subprocess.CompletedProcess[str]


@dataclass
class Workspace:
    tmp_path: Path
    database_url: str
    env: dict[str, str]
    invocations: list[Invocation] = field(default_factory=list)

    @property
    def home(self) -> Path:
        return self.tmp_path / "home"

    @property
    def dagster_home(self) -> Path:
        return self.tmp_path / "dagster"

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        done = cli_process.run(
            [CLI, *args], env=self.env, capture_output=True, text=True, timeout=600, check=False
        )
        self.invocations.append(Invocation(" ".join(args), done))
        return done

    def run(self, pipeline: str) -> subprocess.CompletedProcess[str]:
        day = DAY.isoformat()
        return self.cli(
            "run", pipeline, "--date", day, "--wait", "--poll-interval", "0.05", "--json"
        )

    def status(self, pipeline: str, *, as_json: bool = True) -> subprocess.CompletedProcess[str]:
        flags = ["--json"] if as_json else []
        return self.cli("status", pipeline, "--date", DAY.isoformat(), *flags)


def workspace(
    tmp_path: Path, database_url: str, provider: str, base_url: str, canary: Canary
) -> tuple[Workspace, str, str]:
    """Specs for a pipeline that succeeds and one that will be denied, reviews, environment."""
    specs = tmp_path / "specs"
    specs.mkdir()
    good = review_spec(provider, MODELS[provider])
    denied = review_spec(provider, MODELS[provider], name=f"{good['name']}_denied")
    for spec in (good, denied):
        (specs / f"{spec['name']}.yaml").write_text(yaml.safe_dump(spec))
    ws = Workspace(
        tmp_path,
        database_url,
        {
            **{k: v for k, v in os.environ.items() if k not in KEY_VARIABLES.values()},
            "LLM_ASSETS_HOME": str(tmp_path / "home"),
            "LLM_ASSETS_DATABASE_URL": database_url,
            "LLM_ASSETS_PIPELINES": str(specs),
            "DAGSTER_HOME": str(tmp_path / "dagster"),
            BASE_URL_VARIABLES[provider]: base_url,
            KEY_VARIABLES[provider]: canary.key,
        },
    )
    write_reviews(ws.home, DAY, REVIEWS)
    return ws, good["name"], denied["name"]


def scan_sqlite(scan: Scan, path: Path, where: str) -> None:
    """Every row of every table, compressed blobs inflated (Dagster zlib-compresses snapshots)."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for table in tables:
            for row in conn.execute(f'SELECT * FROM "{table}"'):
                for value in row:
                    if isinstance(value, bytes):
                        with contextlib.suppress(zlib.error):
                            value = zlib.decompress(value)
                    scan.add("sqlite value", f"{where} table {table}", str(value))
    finally:
        conn.close()


def scan_files(scan: Scan, root: Path) -> None:
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        where = f"file {path.relative_to(root)}"
        raw = path.read_bytes()
        scan.add("file", where, raw)
        if raw.startswith(b"SQLite format 3\x00"):
            scan_sqlite(scan, path, where)
        elif raw.startswith(b"PAR1"):
            table = pq.read_table(path)
            scan.add("parquet", where, json.dumps(table.to_pylist(), default=str))
            scan.add("parquet", f"{where} schema", str(table.schema.metadata))
        elif raw.startswith(b"\x1f\x8b"):
            scan.add("gzip", where, gzip.decompress(raw))


def scan_ledger(scan: Scan, database_url: str) -> Counter[str]:
    """Every row of every table in the ledger's database (or PostgreSQL schema)."""
    engine = sa.create_engine(database_url)
    rows: Counter[str] = Counter()
    try:
        metadata = sa.MetaData()
        metadata.reflect(bind=engine)
        with engine.connect() as conn:
            for name, table in metadata.tables.items():
                for row in conn.execute(sa.select(table)):
                    rows[name] += 1
                    scan.add("ledger row", f"ledger {name}", json.dumps(list(row), default=str))
    finally:
        engine.dispose()
    return rows


def scan_dagster(scan: Scan, dagster_home: Path) -> Counter[str]:
    """Runs, tags, snapshots, every event-log entry and all asset metadata of the instance."""
    seen: Counter[str] = Counter()
    instance = dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(dagster_home)))
    try:
        for run in instance.get_runs():
            where = f"dagster run {run.run_id}"
            seen["runs"] += 1
            scan.add("dagster run", where, dg.serialize_value(run))
            scan.add("dagster run tags", f"{where} tags", json.dumps(run.tags))
            scan.add("dagster run config", f"{where} run_config", json.dumps(run.run_config))
            if run.job_snapshot_id:
                snapshot = dg.serialize_value(instance.get_job_snapshot(run.job_snapshot_id))
                scan.add("dagster job snapshot", f"{where} job snapshot", snapshot)
                # Resource config lands here: a key given as dg.EnvVar is only its name.
                if '\\"env\\": \\"' in snapshot:
                    seen["snapshots with an EnvVar"] += 1
            if run.execution_plan_snapshot_id:
                plan = instance.get_execution_plan_snapshot(run.execution_plan_snapshot_id)
                scan.add("dagster plan snapshot", where, dg.serialize_value(plan))
            for entry in instance.all_logs(run.run_id):
                seen["event log entries"] += 1
                label = f"{where} event {entry.dagster_event_type or 'log'}"
                scan.add("dagster event", label, dg.serialize_value(entry))
                scan.add("dagster event", label, str(entry))
                for kind, event in (
                    ("materialization", entry.asset_materialization),
                    ("observation", entry.asset_observation),
                ):
                    if event is not None:
                        seen[kind] += 1
                        scan.add(f"{kind} metadata", f"{label} metadata", repr(event.metadata))
                if entry.is_dagster_event and entry.get_dagster_event().is_step_failure:
                    seen["step failures"] += 1
    finally:
        instance.dispose()
    return seen


def assert_no_leak(
    ws: Workspace, fake: FakeOpenAI | FakeAnthropic, canary: Canary
) -> tuple[Scan, Counter[str], Counter[str]]:
    scan = Scan(canary)
    for invocation in ws.invocations:
        scan.add("cli stdout", f"stdout of `llm-assets {invocation.label}`", invocation.done.stdout)
        scan.add("cli stderr", f"stderr of `llm-assets {invocation.label}`", invocation.done.stderr)
    for entry in fake.calls.entries():
        scan.add("fake call log", f"fake call {entry['method']} {entry['path']}", json.dumps(entry))
    scan_files(scan, ws.tmp_path)
    dagster_seen = scan_dagster(scan, ws.dagster_home)
    ledger_rows = scan_ledger(scan, ws.database_url)
    assert scan.leaks == [], f"the API key leaked: {scan.leaks}"
    return scan, dagster_seen, ledger_rows


def start_fake(provider: str, state_dir: Path) -> FakeOpenAI | FakeAnthropic:
    if provider == "openai":
        openai_fake = FakeOpenAI(state_dir)
        openai_fake.responder = truthful
        openai_fake.line_fault = fault_by_order("4xx", ("5xx", "expire", "missing"))
        return openai_fake
    anthropic_fake = FakeAnthropic(state_dir)
    anthropic_fake.item_fault = fault_by_order(
        "invalid_request", ("api_error", "overloaded", "expired")
    )
    return anthropic_fake


@pytest.fixture
def canary() -> Canary:
    return Canary.new()


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_the_key_is_nowhere_after_faulty_and_denied_runs(
    tmp_path: Path, database_url: str, canary: Canary, provider: str
) -> None:
    fake = start_fake(provider, tmp_path / "fake")
    keys = watch_keys(fake, canary.key)
    with fake:
        ws, good, denied = workspace(tmp_path, database_url, provider, fake.base_url, canary)
        planned = control_faults(provider)
        for fault in planned:
            fake.faults.add(fault)

        done = ws.run(good)
        assert done.returncode == 0, done.stderr
        [outcome] = json.loads(done.stdout)
        assert ws.status(good).returncode == 0
        assert ws.status(good, as_json=False).returncode == 0
        # The error paths were exercised: every control fault answered, lines failed and retried.
        assert [f.times for f in planned] == [0] * len(planned)
        assert outcome["open_items"] == 0
        assert outcome["dead_letters_by_class"] == {"deterministic": len(DETERMINISTIC)}
        assert outcome["succeeded"] == REVIEWS - len(DETERMINISTIC)
        retried = Counter(fake.submitted_custom_ids())
        assert sorted(retried.values()).count(2) == len(TRANSIENT)

        for fault in denied_everywhere():
            fake.faults.add(fault)
        refused = ws.run(denied)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert "failed" in refused.stderr
        assert "401" in refused.stderr or "authentication" in refused.stderr.lower()
        assert canary.found_in(refused.stderr + refused.stdout) == []
        assert ws.status(denied).returncode == 0
    calls = fake.calls.entries()

    # Not vacuous: every request the fake saw carried exactly the canary key, and it answered
    # both authorized calls and the 401s of the denied run.
    assert keys.seen["with_key"] > 0 and keys.seen["without_key"] == 0, keys.seen
    assert keys.seen["with_key"] == len(calls)
    statuses = Counter(entry["status"] for entry in calls)
    assert statuses[200] > 0 and statuses[401] > 0 and statuses[429] > 0 and statuses[500] > 0

    scan, dagster_seen, ledger_rows = assert_no_leak(ws, fake, canary)
    assert dagster_seen["runs"] >= 4 and dagster_seen["step failures"] >= 1
    assert dagster_seen["event log entries"] > 0 and dagster_seen["materialization"] > 0
    assert dagster_seen["snapshots with an EnvVar"] > 0
    assert {"llm_batch_job", "llm_batch_shard", "llm_batch_result"} <= set(ledger_rows)
    assert ledger_rows["llm_batch_result"] >= REVIEWS
    for kind in ("cli stdout", "cli stderr", "file", "fake call log", "dagster event"):
        assert scan.places[kind] > 0, kind
    if database_url.startswith("sqlite"):
        assert scan.places["sqlite value"] > 0
    assert scan.places["parquet"] > 0


def test_the_scan_sees_a_key_planted_where_a_leak_could_hide(tmp_path: Path) -> None:
    """The scanners are not blind: a key compressed in SQLite and Parquet, gzipped, in a ledger
    row, a run tag and materialization metadata is found in each place."""
    import pyarrow as pa

    canary = Canary.new()
    files = tmp_path / "files"
    files.mkdir()
    (files / "plain.log").write_text(f"Authorization: Bearer {canary.key}\n")
    (files / "shard.jsonl.gz").write_bytes(gzip.compress(canary.key.encode()))
    pq.write_table(pa.table({"note": [canary.key] * 3}), files / "out.parquet", compression="gzip")
    with sqlite3.connect(files / "snap.db") as conn:
        conn.execute("CREATE TABLE snapshots (body BLOB)")
        conn.execute("INSERT INTO snapshots VALUES (?)", (zlib.compress(canary.key.encode()),))
    conn.close()
    ledger_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    engine = sa.create_engine(ledger_url)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE llm_batch_result (error_message TEXT)"))
        conn.execute(sa.text("INSERT INTO llm_batch_result VALUES (:m)"), {"m": canary.key})
    engine.dispose()
    dagster_home = tmp_path / "dagster"
    dagster_home.mkdir()
    (dagster_home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")

    @dg.asset
    def leaky() -> dg.MaterializeResult:
        return dg.MaterializeResult(metadata={"key": canary.key})

    instance = dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(dagster_home)))
    try:
        assert dg.materialize([leaky], instance=instance, tags={"k": canary.key}).success
    finally:
        instance.dispose()

    scan = Scan(canary)
    scan_files(scan, files)
    scan_ledger(scan, ledger_url)
    dagster_seen = scan_dagster(scan, dagster_home)
    where = {w for w, _ in scan.leaks}
    assert {
        "file plain.log",
        "file out.parquet",
        "file shard.jsonl.gz",
        "file snap.db table snapshots",
        "ledger llm_batch_result",
    } <= where
    assert not any(w == "file snap.db" for w in where)  # only the inflated blob shows it
    assert any(w.endswith(" tags") for w in where)
    assert any(w.endswith("ASSET_MATERIALIZATION metadata") for w in where)
    assert dagster_seen["materialization"] == 1
    assert all(canary.key in found for _, found in scan.leaks)
