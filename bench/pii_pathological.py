"""Personal-data scanning on pathological input: rows made of what the patterns match in part
(digit runs, separators, key prefixes, label words, Unicode spaces), where a backtracking
pattern takes quadratic time.

1. The scan alone: CPU seconds for each kind of row at 1 MiB and 4 MiB, and their ratio (4 for
   a linear scan).
2. A day: 50 ordinary tickets, with and without one pasted 4 MB export (4,000,000 digits,
   spaces and punctuation: under source.max_line_bytes and compliance.max_scanned_chars, so
   it is read and scanned), through snapshot, shards (the scan), submit, import and validate
   with the instant provider on a SQLite ledger.

    .venv/bin/python bench/pii_pathological.py
"""

import datetime as dt
import json
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llm_assets.compliance.detect import scan  # noqa: E402

MIB = 1 << 20
DAY = dt.date(2026, 11, 2)
EXPORT_CHARS = 4_000_000


def _random(alphabet: str) -> Callable[[int], str]:
    rng = random.Random(7)
    return lambda n: "".join(rng.choice(alphabet) for _ in range(n))


def _repeat(unit: str) -> Callable[[int], str]:
    return lambda n: (unit * (n // len(unit) + 1))[:n]


ROWS: dict[str, Callable[[int], str]] = {
    "digits": _random("0123456789"),
    "zeros": _repeat("0"),
    "digits and spaces": _random("0123456789  "),
    "digits and punctuation": _random("0123456789 .-/()+"),
    "digits, NBSP and zero-width spaces": _random("0123456789\u00a0\u200b"),
    "full-width digits": _random("０１２３４５６７８９ "),
    "hex letters and digits": _random("abcdefABCDEF0123456789"),
    "'eyJ' repeated": _repeat("eyJ"),
    "'password' repeated": _repeat("password"),
    "'password' and spaces": lambda n: "password" + " " * (n - 9) + "x",
    "'password 1' repeated": _repeat("password 1"),
    "'secret=1' repeated": _repeat("secret=1"),
    "'token' repeated": _repeat("token"),
    "'://a:b' repeated": _repeat("://a:b"),
    "'a@' repeated": _repeat("a@"),
    "'x [at] ' repeated, ' dot '": lambda n: _repeat("x [at] ")(n - 5) + " dot ",
    "private key headers": _repeat("-----BEGIN RSA PRIVATE KEY-----"),
    "'SSN ' repeated": _repeat("SSN "),
}


def _cpu(text: str) -> float:
    started = time.process_time()
    scan([text])
    return time.process_time() - started


def scan_table() -> list[str]:
    lines = ["| row | 1 MiB (s) | 4 MiB (s) | ratio |", "|---|---|---|---|"]
    for name, make in ROWS.items():
        small, large = _cpu(make(MIB)), _cpu(make(4 * MIB))
        lines.append(f"| {name} | {small:.2f} | {large:.2f} | {large / max(small, 1e-3):.1f} |")
        print(lines[-1], flush=True)
    return lines


def _tickets(path: Path, with_long_row: bool) -> None:
    rng = random.Random(11)
    with path.open("w") as out:
        for n in range(50):
            body = f"Order {100000 + n} arrived late; version 2.{n}.1 crashes. Please help."
            row = {"ticket_id": f"T{n}", "created_at": f"{DAY}T10:00:00Z", "subject": "Help"}
            out.write(json.dumps({**row, "body": body, "channel": "email"}) + "\n")
        if with_long_row:
            export = "".join(rng.choice("0123456789 .-/()+") for _ in range(EXPORT_CHARS))
            row = {"ticket_id": "T-export", "created_at": f"{DAY}T11:00:00Z", "subject": "Export"}
            out.write(json.dumps({**row, "body": export, "channel": "email"}) + "\n")


def day_seconds(with_long_row: bool) -> dict[str, float]:
    import yaml

    from bench.instant_provider import InstantOpenAIProvider
    from bench.pipeline_scale import spec_dict
    from llm_assets import steps
    from llm_assets.resources.ledger import LedgerResource
    from llm_assets.resources.storage import ArtifactStorage
    from llm_assets.spec.load import parse_spec

    with tempfile.TemporaryDirectory() as folder:
        home = Path(folder)
        os.environ["LLM_ASSETS_HOME"] = str(home)
        source = home / "tickets.jsonl"
        _tickets(source, with_long_row)
        spec_dict_ = spec_dict(str(source))
        # The long row is over any context window: cut to fit after the scan.
        spec_dict_["prompt"]["truncate_to_context"] = True
        spec_dict_["retention"] = {"provider_files": "keep"}  # the instant provider has none
        spec_path = home / "spec.yaml"
        spec_path.write_text(yaml.safe_dump(spec_dict_))
        spec, problems = parse_spec(spec_path)
        assert spec is not None, problems
        ledger = LedgerResource(database_url=f"sqlite:///{home / 'ledger.db'}")
        storage = ArtifactStorage(base_url=str(home / "artifacts"))
        provider = InstantOpenAIProvider(output_dir=str(home / "provider"))
        ctx = steps.StepContext(spec, DAY, ledger, storage, provider, created_by="bench")
        timings = {}
        for name, step in (
            ("snapshot", lambda: steps.take_snapshot(ctx, str(source))),
            ("shards", lambda: steps.build_shards(ctx)),
            ("submit", lambda: steps.submit_shards(ctx)),
            ("import", lambda: steps.import_results(ctx)),
            ("validate", lambda: steps.validate_outputs(ctx)),
        ):
            started = time.perf_counter()
            step()
            timings[name] = time.perf_counter() - started
        return timings


def main() -> None:
    print("Scan alone, CPU seconds:")
    scan_table()
    print("\nA day of 50 tickets, wall seconds per step:")
    print("| day | snapshot | shards | submit | import | validate | total |")
    print("|---|---|---|---|---|---|---|")
    for label, long_row in (("50 tickets", False), ("50 tickets + one 4 MB export", True)):
        timings = day_seconds(long_row)
        cells = " | ".join(f"{timings[k]:.2f}" for k in timings)
        print(f"| {label} | {cells} | {sum(timings.values()):.2f} |", flush=True)


if __name__ == "__main__":
    main()
