"""Importing a large batch result: the gemini adapter's responses file against OpenAI's output
files, the import's time and peak memory at each day size asked for.

One day of synthetic support tickets (pipeline_scale's) goes through the real steps and
adapters against the fake servers of tests/fakes on loopback: snapshot → shards → submit →
wait (the fake answers on the first poll: `polls_per_state` 0, lines shuffled) → import.
Gemini takes 200,000 requests per batch job, so the day is one shard and one responses file;
OpenAI takes 50,000 per batch, so the same day is several shards and output files.

The import runs in a fresh process of its own, as the `batch_results` run does, so its memory
is the import's alone: the RSS it starts with (Python, the SDKs, the ledger), its peak
(VmHWM), and its peak with its worker processes (its RSS plus theirs, sampled every
50 ms; `llm_assets.util.parallel` starts them once the import has read 50,000 rows' worth of
results, about 50 MB).
The fake servers run in this process, so their own memory (they build a whole file before
writing it) never counts. For Gemini, the import's wall time includes the download of the
responses file into a temporary file before the first line is parsed; that download is also
timed on its own.

    .venv/bin/python bench/gemini_import.py [--items 200000 20000] [--providers gemini openai]
        [--db postgres|sqlite] [--json FILE] [--keep]

PostgreSQL: LLM_ASSETS_BENCH_PG_ADMIN_URL (default postgres@127.0.0.1:5432) and
LLM_ASSETS_BENCH_GEMINI_DATABASE (default llma_gbench), dropped and created for each
configuration.
"""

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.pipeline_scale import (  # noqa: E402
    DAY,
    TreeSampler,
    database_url,
    reset_peak,
    rss_mb,
    spec_dict,
    step_peak_mb,
    write_source,
)

PG_DATABASE = os.environ.get("LLM_ASSETS_BENCH_GEMINI_DATABASE", "llma_gbench")
MODELS = {"gemini": "gemini-2.5-flash", "openai": "gpt-4o-mini"}
SHARDING = {
    "gemini": {"max_requests_per_shard": 200_000, "max_bytes_per_shard": 2 * 1024**3},
    "openai": {"max_requests_per_shard": 50_000},
}
"""Each provider's limits per batch: a Gemini day of 200,000 requests is one shard (its
request lines carry the response schema, about 1.1 KB each: 220 MB, more than the default
100 MB per shard)."""

# ---------------------------------------------------------------------------------------
# The child processes: one prepares the day, a fresh one imports it


def _context(args: argparse.Namespace) -> Any:
    import yaml

    from llm_assets import steps
    from llm_assets.resources.ledger import LedgerResource
    from llm_assets.resources.providers.openai_batch import OpenAIBatchProvider
    from llm_assets.resources.storage import ArtifactStorage
    from llm_assets.spec.load import parse_spec

    home = Path(args.home)
    raw = spec_dict(args.source)
    raw["name"] = f"bench_{args.provider}_import"
    raw["description"] = "Benchmark: one large batch result imported."
    raw["model"].update(provider=args.provider, name=MODELS[args.provider])
    raw["sharding"] = SHARDING[args.provider]
    spec_path = home / "specs" / f"{raw['name']}.yaml"
    spec_path.parent.mkdir(parents=True, exist_ok=True)
    spec_path.write_text(yaml.safe_dump(raw))
    spec, problems = parse_spec(spec_path)
    if problems or spec is None:
        raise SystemExit(f"bench spec is invalid: {problems}")
    adapter = timed_gemini() if args.provider == "gemini" else OpenAIBatchProvider
    provider = adapter(api_key="bench", base_url=args.base_url, timeout_seconds=600)
    ledger = LedgerResource(database_url=args.db_url)
    storage = ArtifactStorage(base_url=str(home / "artifacts"))
    return steps.StepContext(spec, DAY, ledger, storage, provider, created_by="bench")


DOWNLOADS: list[tuple[float, int]] = []
"""(seconds, bytes) of each responses file the gemini adapter downloaded."""


def timed_gemini() -> type:
    from llm_assets.resources.providers.gemini_batch import GeminiBatchProvider

    class Timed(GeminiBatchProvider):
        """The gemini adapter, its download of responses files timed."""

        def _download(self, file_name: str, spool: Any) -> None:
            started = time.perf_counter()
            super()._download(file_name, spool)
            DOWNLOADS.append((time.perf_counter() - started, spool.tell()))

    return Timed


def prepare(args: argparse.Namespace) -> dict[str, Any]:
    """Snapshot, shards, submit, then poll until every batch has ended (the fake writes its
    results on that first poll)."""
    from llm_assets import steps
    from llm_assets.resources.providers.base import IN_FLIGHT_STATES

    ctx = _context(args)
    timings: dict[str, float] = {}
    started = time.perf_counter()
    steps.take_snapshot(ctx, args.source)
    timings["snapshot"] = time.perf_counter() - started
    started = time.perf_counter()
    built = steps.build_shards(ctx)
    steps.budget_gate(ctx)
    timings["shards"] = time.perf_counter() - started
    started = time.perf_counter()
    steps.submit_shards(ctx)
    timings["submit"] = time.perf_counter() - started
    started = time.perf_counter()
    job = ctx.job()
    while True:
        shards = steps.poll_shards(
            ctx.ledger, ctx.batch_provider, ctx.ledger.shards(job.job_id, IN_FLIGHT_STATES)
        )
        if not any(s.status in IN_FLIGHT_STATES for s in shards):
            break
        time.sleep(0.5)
    timings["provider"] = time.perf_counter() - started
    shards = ctx.ledger.shards(job.job_id)
    return {
        "shards": len(built.shards_created),
        "requests": sum(s.item_count for s in shards),
        "input_bytes": sum(
            Path(s.input_uri.removeprefix("file://")).stat().st_size for s in shards
        ),
        "timings": timings,
    }


def import_day(args: argparse.Namespace) -> dict[str, Any]:
    """The import step, measured: wall time, RSS at the start, peak, peak with workers, and
    the RSS every half second."""
    from llm_assets import steps

    ctx = _context(args)
    ctx.ledger.engine  # noqa: B018  (connected before the timings)
    gc.collect()
    exact = reset_peak()
    start_rss = rss_mb()
    samples: list[float] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.5):
            samples.append(round(rss_mb(), 1))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.perf_counter()
    with TreeSampler() as tree:
        result = steps.import_results(ctx)
    seconds = time.perf_counter() - started
    done.set()
    sampler.join()
    peak = step_peak_mb() if exact else float("nan")
    return {
        "seconds": seconds,
        "lines": result.lines.received,
        "applied": result.lines.applied,
        "shards_imported": len(result.imported_shards),
        "retry_shards": len(result.retry_shards),
        "rss_start_mb": start_rss,
        "peak_mb": peak,
        "tree_peak_mb": max(tree.peak, peak if exact else 0.0),
        "workers_peak_mb": tree.children_peak,
        "rss_samples_mb": samples,
        "download_seconds": sum(s for s, _ in DOWNLOADS),
        "downloaded_bytes": sum(b for _, b in DOWNLOADS),
    }


# ---------------------------------------------------------------------------------------
# The driver


def result_files(fake: Any) -> dict[str, int]:
    """The result files a fake holds: name → bytes."""
    from tests.fakes.gemini_server import FakeGemini

    if isinstance(fake, FakeGemini):
        return {
            name: int(f["sizeBytes"])
            for name, f in fake.files.items()
            if f["source"] == "GENERATED"
        }
    return {f["id"]: f["bytes"] for f in fake.store.all_files() if f["purpose"] == "batch_output"}


def run_child(mode: str, common: list[str], env: dict[str, str], out: Path) -> dict[str, Any]:
    command = [sys.executable, str(Path(__file__).resolve()), "--child", mode, *common]
    subprocess.run([*command, "--result", str(out)], env=env, cwd=REPO, check=True)
    return json.loads(out.read_text())


def run_config(
    fake: Any, provider: str, items: int, db: str, source: Path, root: Path
) -> dict[str, Any]:
    home = root / f"{items}-{provider}"
    home.mkdir()
    db_url = database_url(db, home, PG_DATABASE)
    before = result_files(fake)
    common = [
        "--provider",
        provider,
        "--base-url",
        fake.base_url,
        "--db-url",
        db_url,
        "--source",
        str(source),
        "--home",
        str(home),
    ]
    env = {**os.environ, "LLM_ASSETS_HOME": str(home)}
    env.pop("LLM_ASSETS_FAILPOINT", None)
    print(f"{items} items, {provider}, {db}: preparing", file=sys.stderr, flush=True)
    prepared = run_child("prepare", common, env, home / "prepare.json")
    files = {k: v for k, v in result_files(fake).items() if k not in before}
    print(
        f"  {prepared['requests']} requests in {prepared['shards']} shards; result files "
        f"{sum(files.values()) / 1e6:.0f} MB; importing",
        file=sys.stderr,
        flush=True,
    )
    imported = run_child("import", common, env, home / "import.json")
    print(
        f"  import {imported['seconds']:.1f} s, {imported['lines']} lines, RSS "
        f"{imported['rss_start_mb']:.0f} → peak {imported['peak_mb']:.0f} MB, with workers "
        f"{imported['tree_peak_mb']:.0f} MB",
        file=sys.stderr,
        flush=True,
    )
    return {
        "items": items,
        "provider": provider,
        "model": MODELS[provider],
        "db": db,
        **prepared,
        "result_files": len(files),
        "result_bytes": sum(files.values()),
        "largest_file_bytes": max(files.values(), default=0),
        "import": imported,
    }


def markdown(results: list[dict[str, Any]]) -> str:
    out = [
        "| items | provider | db | shards | result files (MB, largest) | lines | import (s) | "
        "lines/s | of which download (s) | RSS at start (MB) | import peak (MB) | "
        "with workers (MB) | workers (MB) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(results, key=lambda r: (r["items"], r["provider"])):
        imp = r["import"]
        download = f"{imp['download_seconds']:.1f}" if r["provider"] == "gemini" else "streamed"
        out.append(
            f"| {r['items']:,} | {r['provider']} | {r['db']} | {r['shards']} | "
            f"{r['result_bytes'] / 1e6:.0f} ({r['largest_file_bytes'] / 1e6:.0f}) | "
            f"{imp['lines']:,} | {imp['seconds']:.1f} | {imp['lines'] / imp['seconds']:,.0f} | "
            f"{download} | {imp['rss_start_mb']:.0f} | {imp['peak_mb']:.0f} | "
            f"{imp['tree_peak_mb']:.0f} | {imp['workers_peak_mb']:.0f} |"
        )
    out.append("")
    for r in sorted(results, key=lambda r: (r["items"], r["provider"])):
        t = r["timings"]
        samples = r["import"]["rss_samples_mb"]
        out.append(
            f"- {r['items']:,} {r['provider']}: request files {r['input_bytes'] / 1e6:.0f} MB; "
            f"snapshot {t['snapshot']:.1f} s, shards "
            f"{t['shards']:.1f} s, submit {t['submit']:.1f} s, provider {t['provider']:.1f} s; "
            f"import RSS every 0.5 s (MB): {samples[:: max(1, len(samples) // 12)]}"
        )
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, nargs="+", default=[200_000, 20_000])
    parser.add_argument(
        "--providers", nargs="+", choices=list(MODELS), default=["gemini", "openai"]
    )
    parser.add_argument("--db", choices=["postgres", "sqlite"], default="postgres")
    parser.add_argument("--json", help="also write the raw results to this file")
    parser.add_argument("--keep", action="store_true", help="keep the temp folder")
    parser.add_argument("--child", choices=["prepare", "import"], help=argparse.SUPPRESS)
    for hidden in ("--provider", "--base-url", "--db-url", "--source", "--home", "--result"):
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:
        result = prepare(args) if args.child == "prepare" else import_day(args)
        Path(args.result).write_text(json.dumps(result))
        return

    from tests.fakes.gemini_server import FakeGemini
    from tests.fakes.openai_server import FakeOpenAI

    root = Path(tempfile.mkdtemp(prefix="llm-assets-gemini-bench-"))
    print(f"working in {root}", file=sys.stderr)
    results: list[dict[str, Any]] = []
    began = time.monotonic()
    fakes = {"gemini": FakeGemini(root / "fake_gemini"), "openai": FakeOpenAI(root / "fake_openai")}
    try:
        for fake in fakes.values():
            fake.polls_per_state = 0
            fake.shuffle_output = True
            fake.start()
        for items in args.items:
            source = root / "data" / str(items) / f"tickets-{DAY}.jsonl"
            write_source(source, items)
            for provider in args.providers:
                results.append(run_config(fakes[provider], provider, items, args.db, source, root))
                if fakes[provider].server_errors:
                    raise SystemExit(f"the fake {provider} failed: {fakes[provider].server_errors}")
    finally:
        for fake in fakes.values():
            fake.stop()
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2))
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print(markdown(results))
    print(f"\n(bench wall time {time.monotonic() - began:.0f} s)")


if __name__ == "__main__":
    main()
