"""Online provider throughput against the fake OpenAI-compatible endpoint (tests/fakes).

1. Limited: 200 ms latency, a 600 RPM limit on the server and in the spec; achieved
   requests per minute against the limit, and how many 429s the client provoked (target:
   >= 95% of the limit, zero 429s).
2. Unlimited: throughput as concurrency grows, with a server capacity (requests processed at
   once) of 32: it grows with concurrency until the server's capacity.
3. Memory: a 100,000-item shard with no latency, peak RSS sampled while it runs, to show the
   worker's memory is flat (results stream to the ledger every checkpoint).

Each run goes through the real path: snapshot, shards, the provider_batches step with the
online worker checkpointing into a SQLite ledger.

    .venv/bin/python bench/online_throughput.py [--limited-items 600] [--memory-items 100000]
"""

import argparse
import datetime as dt
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llm_assets import steps  # noqa: E402
from llm_assets.resources.ledger import LedgerResource  # noqa: E402
from llm_assets.resources.providers.online import OnlineProvider  # noqa: E402
from llm_assets.resources.storage import ArtifactStorage  # noqa: E402
from llm_assets.spec.model import PipelineSpec
from tests.fakes.online_server import FakeOnline  # noqa: E402
from tests.harness import review_spec  # noqa: E402

DAY = dt.date(2026, 11, 2)


def write_items(home: Path, count: int) -> None:
    folder = home / "reviews"
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / f"reviews-{DAY}.jsonl").open("w") as out:
        for n in range(count):
            out.write(
                json.dumps(
                    {
                        "review_id": f"R{n:07d}",
                        "created_at": f"{DAY}T00:00:00Z",
                        "text": f"Review {n}: the kettle is good and arrived on time.",
                    }
                )
                + "\n"
            )


def peak_rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def current_rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def run(
    fake: FakeOnline, root: Path, items: int, online: dict[str, Any], shard_size: int = 50_000
) -> dict[str, Any]:
    home = Path(tempfile.mkdtemp(dir=root))
    write_items(home, items)
    raw = review_spec(
        "online",
        "gpt-4o-mini",
        online={"base_url": fake.base_url, **online},
        sharding={"max_requests_per_shard": shard_size},
    )
    spec = PipelineSpec.model_validate(raw)
    ledger = LedgerResource(database_url=f"sqlite:///{home / 'ledger.db'}")
    storage = ArtifactStorage(base_url=str(home / "artifacts"))
    provider = OnlineProvider(base_url=fake.base_url)
    ctx = steps.StepContext(spec, DAY, ledger, storage, provider)
    steps.take_snapshot(ctx, str(home / "reviews" / "*.jsonl"))
    steps.build_shards(ctx)
    fake.reset()
    samples: list[float] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.5):
            samples.append(current_rss_mb())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.monotonic()
    steps.submit_shards(ctx)
    elapsed = time.monotonic() - started
    done.set()
    sampler.join()
    ok = fake.count(200)
    return {
        "items": items,
        "seconds": elapsed,
        "per_minute": ok / elapsed * 60,
        "ok": ok,
        "429": fake.rate_limited(),
        "max_in_1s": fake.max_in_window(1.0, status=200),
        "rss_samples": samples,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--limited-items", type=int, default=600)
    parser.add_argument("--memory-items", type=int, default=100_000)
    parser.add_argument("--only-limited", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, FakeOnline() as fake:
        root = Path(tmp)
        print("## 1. 600 RPM limit, 200 ms latency, concurrency 8\n")
        fake.latency_seconds, fake.rpm_limit = 0.2, 600
        result = run(fake, root, args.limited_items, {"rpm": 600, "concurrency": 8})
        print(
            f"{result['ok']} requests in {result['seconds']:.1f} s = "
            f"{result['per_minute']:.0f} per minute ({result['per_minute'] / 600:.1%} of the "
            f"limit); 429s: {result['429']}; most 200s in any 1 s window: {result['max_in_1s']}\n"
        )
        if args.only_limited:
            os._exit(0)
        print("## 2. No limit, 200 ms latency, server capacity 32\n")
        print("| concurrency | requests/s | 429s |")
        print("|---|---|---|")
        fake.rpm_limit, fake.capacity = None, 32
        for concurrency in (1, 2, 4, 8, 16, 32, 64):
            items = max(40, concurrency * 10)
            result = run(fake, root, items, {"concurrency": concurrency})
            print(f"| {concurrency} | {result['ok'] / result['seconds']:.1f} | {result['429']} |")
        print(f"\n## 3. Memory: {args.memory_items:,} items in one shard, no latency\n")
        fake.latency_seconds, fake.capacity = 0.0, None
        base = current_rss_mb()
        result = run(
            fake,
            root,
            args.memory_items,
            {"concurrency": 16, "checkpoint_every": 25},
            shard_size=args.memory_items,
        )
        samples = result["rss_samples"] or [current_rss_mb()]
        quarter = max(1, len(samples) // 4)
        print(
            f"{result['ok']:,} requests in {result['seconds']:.0f} s "
            f"({result['ok'] / result['seconds']:.0f}/s); RSS before {base:.0f} MB, "
            f"first quarter of the run {max(samples[:quarter]):.0f} MB, last quarter "
            f"{max(samples[-quarter:]):.0f} MB, peak {peak_rss_mb():.0f} MB"
        )
        assert fake.server_errors == [], fake.server_errors
    os._exit(0)


if __name__ == "__main__":
    main()
