"""The personal-data detectors scored on the independent labelled texts of bench/pii_texts/:
`development.jsonl` and `development_more.jsonl` (two writers; what misses are looked at) and
`heldout.jsonl` (figures only; its texts are not read to tune the detectors).

Per entity type: recall (labelled values a detection of the same type overlaps), whole (of
those, the share a detection covers entirely: a value half redacted is half sent), precision
(detections that overlap a labelled value of the same type). "sent" counts the labelled cards
and credentials whose text the default policy would send (it blocks both).

    .venv/bin/python bench/pii_heldout.py [--cases development]
"""

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llm_assets.compliance.detect import scan  # noqa: E402
from llm_assets.compliance.policy import screen  # noqa: E402
from llm_assets.compliance.spec import DEFAULT_PII, ENTITIES  # noqa: E402

TEXTS = Path(__file__).resolve().parent / "pii_texts"
DEVELOPMENT = ("development", "development_more")


def load(name: str) -> list[dict[str, Any]]:
    """The texts of one file, each label given its span (the n-th occurrence of a value
    listed n times)."""
    cases = []
    for line in (TEXTS / f"{name}.jsonl").read_text(encoding="utf-8").splitlines():
        case = json.loads(line)
        seen: Counter[tuple[str, str]] = Counter()
        spans = []
        for label in case["labels"]:
            key = (label["entity"], label["value"])
            at = -1
            for _ in range(seen[key] + 1):
                at = case["text"].index(label["value"], at + 1)
            seen[key] += 1
            spans.append((label["entity"], at, at + len(label["value"]), label["value"]))
        cases.append({**case, "spans": spans})
    return cases


def evaluate(cases: list[dict[str, Any]]) -> dict[str, Any]:
    found = scan([c["text"] for c in cases])
    screened = screen([c["text"] for c in cases], DEFAULT_PII)
    labelled, hit, whole, detected, correct, sent = (Counter() for _ in range(6))
    missed, wrong = [], []
    for case, findings, out in zip(cases, found, screened, strict=True):
        for entity, start, end, value in case["spans"]:
            labelled[entity] += 1
            same = [f for f in findings if f.entity == entity and f.start < end and start < f.end]
            if same:
                hit[entity] += 1
                whole[entity] += any(f.start <= start and end <= f.end for f in same)
            else:
                missed.append((case["id"], entity, value))
            if entity in ("card", "credential") and out.text is not None:
                sent[entity] += 1
        for f in findings:
            detected[f.entity] += 1
            if any(e == f.entity and f.start < end and s < f.end for e, s, end, _ in case["spans"]):
                correct[f.entity] += 1
            else:
                wrong.append((case["id"], f.entity, f.value))
    return {
        "texts": len(cases),
        "labelled": labelled,
        "hit": hit,
        "whole": whole,
        "detected": detected,
        "correct": correct,
        "sent": sent,
        "missed": missed,
        "wrong": wrong,
    }


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f}" if whole else "–"


def table(results: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| set | texts | " + " | ".join(ENTITIES) + " | cards sent | credentials sent |",
        "|---|---|" + "---|" * (len(ENTITIES) + 2),
    ]
    for name, r in results.items():
        cells = [
            f"{_pct(r['hit'][e], r['labelled'][e])} / {_pct(r['correct'][e], r['detected'][e])}"
            f" ({r['labelled'][e]})"
            for e in ENTITIES
        ]
        lines.append(
            f"| {name} | {r['texts']} | {' | '.join(cells)} | {r['sent']['card']} "
            f"| {r['sent']['credential']} |"
        )
    lines.append("")
    lines.append(
        "Found whole (of the values found): "
        + "; ".join(
            f"{name}: "
            + ", ".join(f"{e} {_pct(r['whole'][e], r['hit'][e])}%" for e in ENTITIES if r["hit"][e])
            for name, r in results.items()
        )
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--cases", choices=DEVELOPMENT, help="list a development file's misses and wrong flags"
    )
    args = parser.parse_args()
    results = {name: evaluate(load(name)) for name in (*DEVELOPMENT, "heldout")}
    print("Cells: recall / precision in % (labelled values).")
    print(table(results))
    if args.cases:
        r = results[args.cases]
        print(f"\nmissed ({len(r['missed'])}):")
        for case_id, entity, value in r["missed"]:
            print(f"  {case_id}  {entity}  {value!r}")
        print(f"wrongly flagged ({len(r['wrong'])}):")
        for case_id, entity, value in r["wrong"]:
            print(f"  {case_id}  {entity}  {value!r}")


if __name__ == "__main__":
    main()
