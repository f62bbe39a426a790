"""Personal-data and credential detectors measured on the labelled sample of bench/pii_sample.py.

Each candidate runs in this process on the whole sample (after a warm-up on its first 100
texts) and is scored per entity type of the compliance gate (email, phone, card, iban,
national_id, ip_address, credential):

- recall: labelled values of the type that some detection of the same type overlaps;
- precision: detections of the type that overlap a labelled value of the same type. A
  detection of a type the library does not have in ours (dates, zip codes, URLs, ...) is
  dropped by its adapter; one of the wrong type (a phone inside an IBAN) counts against
  precision;
- flagged: negatives (texts that must not be flagged) and clean tickets with any detection;
- items/s: texts scanned per second, one process, the library's usual call per text (ours
  takes the whole list); the best of five passes over the whole sample;
- import: seconds to import the library and set it up, in a fresh interpreter.

A library that is not installed is reported as skipped. Runs with the repo's virtualenv and
the `pii-eval` extra, or any environment that has the libraries:

    python bench/pii_detectors.py [--only NAME ...] [--cases NAME] [--json FILE]

`--cases NAME` lists the sample's values NAME misses and the detections it gets wrong.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import subprocess
import sys
import time
import warnings
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, NamedTuple

# datafog 4.9 sends usage events only when DATAFOG_TELEMETRY=1; this makes sure it never does.
os.environ.setdefault("DATAFOG_NO_TELEMETRY", "1")
os.environ.setdefault("DO_NOT_TRACK", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

if TYPE_CHECKING:
    from pii_sample import Case

WARM_UP = 100
TIMED_RUNS = 5
ALL = ("email", "phone", "card", "iban", "national_id", "ip_address", "credential")
_OPEN = ExitStack()
atexit.register(_OPEN.close)


class Detection(NamedTuple):
    entity: str
    start: int
    end: int


Detect = Callable[[Sequence[str]], list[list[Detection]]]


class Candidate(NamedTuple):
    load: Callable[[], Detect]
    types: tuple[str, ...]
    notes: str


def _per_text(one: Callable[[str], Iterator[Detection]]) -> Detect:
    return lambda texts: [list(one(text)) for text in texts]


def load_presidio() -> Detect:
    import tldextract
    from presidio_analyzer import AnalyzerEngine, RecognizerRegistry
    from presidio_analyzer.nlp_engine import NoOpNlpEngine
    from presidio_analyzer.predefined_recognizers import (
        CreditCardRecognizer,
        EmailRecognizer,
        IbanRecognizer,
        IpRecognizer,
        PhoneRecognizer,
        UsSsnRecognizer,
    )
    from presidio_analyzer.predefined_recognizers.generic import email_recognizer

    # The e-mail recognizer checks the domain with tldextract, whose default extractor
    # downloads the public suffix list on first use; this one reads the list it ships with.
    offline = tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None)
    email_recognizer.tldextract = SimpleNamespace(extract=offline)
    recognizers = [
        EmailRecognizer(),
        PhoneRecognizer(),
        CreditCardRecognizer(),
        IbanRecognizer(),
        UsSsnRecognizer(),
        IpRecognizer(),
    ]
    engine = AnalyzerEngine(
        registry=RecognizerRegistry(recognizers=recognizers),
        nlp_engine=NoOpNlpEngine(models=[{"lang_code": "en", "model_name": "none"}]),
    )
    ours = {
        "EMAIL_ADDRESS": "email",
        "PHONE_NUMBER": "phone",
        "CREDIT_CARD": "card",
        "IBAN_CODE": "iban",
        "US_SSN": "national_id",
        "IP_ADDRESS": "ip_address",
    }

    def one(text: str) -> Iterator[Detection]:
        for r in engine.analyze(text, language="en"):
            if r.entity_type in ours:
                yield Detection(ours[r.entity_type], r.start, r.end)

    return _per_text(one)


def _datafog_types() -> dict[str, str]:
    """datafog's entity types as the gate's: the gate's own mapping, and German IBANs, which
    the gate takes from python-stdnum instead."""
    from llm_assets.compliance.detect import _DATAFOG as gate

    return {**gate, "DE_IBAN": "iban"}


_DATAFOG = _datafog_types()


def load_datafog() -> Detect:
    warnings.filterwarnings("ignore", module="datafog")
    import datafog

    def one(text: str) -> Iterator[Detection]:
        for e in datafog.scan(text, engine="regex", locales=["de"]).entities:
            if e.type in _DATAFOG:
                yield Detection(_DATAFOG[e.type], e.start, e.end)

    return _per_text(one)


def load_datafog_core() -> Detect:
    import datafog_core

    config = {"locale": "de", "entities": sorted(_DATAFOG)}

    def one(text: str) -> Iterator[Detection]:
        for f in datafog_core.scan(text, config=config):
            span = f.codepoint_range
            yield Detection(_DATAFOG[f.entity_type], span.start, span.end)

    return _per_text(one)


def load_scrubadub() -> Detect:
    import scrubadub

    scrubber = scrubadub.Scrubber()
    ours = {
        "email": "email",
        "phone": "phone",
        "credit_card": "card",
        "social_security_number": "national_id",
        "credential": "credential",
    }

    def one(text: str) -> Iterator[Detection]:
        for filth in scrubber.iter_filth(text, run_post_processors=False):
            for f in getattr(filth, "filths", None) or [filth]:
                if f.type in ours:
                    yield Detection(ours[f.type], f.beg, f.end)

    return _per_text(one)


def load_detect_secrets() -> Detect:
    from detect_secrets.core.scan import _process_line_based_plugins
    from detect_secrets.settings import default_settings

    # The plugins are configured for as long as this context is open: for the whole process.
    _OPEN.enter_context(default_settings())

    def one(text: str) -> Iterator[Detection]:
        offsets, at = [], 0
        lines = text.split("\n")
        for line in lines:
            offsets.append(at)
            at += len(line) + 1
        numbered = list(enumerate(lines, 1))
        for secret in _process_line_based_plugins(numbered, filename="ticket.txt"):
            if secret.type == "Public IP (ipv4)" or not secret.secret_value:
                continue
            line = lines[secret.line_number - 1]
            start = line.find(secret.secret_value)
            if start >= 0:
                base = offsets[secret.line_number - 1] + start
                yield Detection("credential", base, base + len(secret.secret_value))

    return _per_text(one)


def load_phonenumbers() -> Detect:
    from phonenumbers import Leniency, PhoneNumberMatcher

    regions = ("US", "GB", "DE", "FR", "IL", "IN", "CA", "BR")

    def one(text: str) -> Iterator[Detection]:
        seen: set[tuple[int, int]] = set()
        for region in regions:
            for m in PhoneNumberMatcher(text, region, leniency=Leniency.VALID):
                if (m.start, m.end) not in seen:
                    seen.add((m.start, m.end))
                    yield Detection("phone", m.start, m.end)

    return _per_text(one)


def load_ours() -> Detect:
    from llm_assets.compliance.detect import scan

    def detect(texts: Sequence[str]) -> list[list[Detection]]:
        return [[Detection(f.entity, f.start, f.end) for f in found] for found in scan(texts)]

    return detect


CANDIDATES: dict[str, Candidate] = {
    "presidio": Candidate(
        load_presidio,
        ("email", "phone", "card", "iban", "national_id", "ip_address"),
        "pattern recognizers and a no-op NLP engine: no spaCy model; phones through "
        "phonenumbers (US, GB, DE, FR, IL, IN, CA, BR); tldextract held to its bundled "
        "suffix list (by default it downloads the list on first use); no credentials",
    ),
    "datafog": Candidate(
        load_datafog,
        ALL[:-1],
        "4.x API, regex engine, Python backend, locale de for IBANs (German only); telemetry "
        "is opt-in in 4.9 (DATAFOG_TELEMETRY=1), set off here with DATAFOG_NO_TELEMETRY=1",
    ),
    "datafog_core": Candidate(
        load_datafog_core,
        ALL,
        "Rust; locale de for IBANs (German only); credentials: API keys it knows, bearer "
        "tokens, JWTs, credential URIs, private keys; no network, no telemetry",
    ),
    "scrubadub": Candidate(
        load_scrubadub,
        ("email", "phone", "card", "national_id", "credential"),
        "default detectors (en_US): phones through phonenumbers, cards, SSNs, "
        "username/password pairs; no IBAN, no IP; no network",
    ),
    "detect-secrets": Candidate(
        load_detect_secrets,
        ("credential",),
        "credentials only: every default plugin with its default filters, line by line; no network",
    ),
    "phonenumbers": Candidate(
        load_phonenumbers,
        ("phone",),
        "phones only: PhoneNumberMatcher, valid numbers, once per region of Presidio's "
        "default list (US, GB, DE, FR, IL, IN, CA, BR); no network",
    ),
    "ours": Candidate(
        load_ours,
        ALL,
        "llm_assets.compliance.detect: datafog-core, python-stdnum IBANs, detect-secrets "
        "patterns and a few own patterns; a list of texts per call; no network",
    ),
}


class Score(NamedTuple):
    labelled: Counter[str]
    found: Counter[str]
    detected: Counter[str]
    correct: Counter[str]
    negatives_flagged: int
    clean_flagged: int
    missed: list[tuple[str, str, str]]
    wrong: list[tuple[str, str, str]]


def _overlaps(d: Detection, start: int, end: int) -> bool:
    return d.start < end and start < d.end


def score(sample: Sequence[Case], detections: Sequence[list[Detection]]) -> Score:
    labelled: Counter[str] = Counter()
    found: Counter[str] = Counter()
    detected: Counter[str] = Counter()
    correct: Counter[str] = Counter()
    missed: list[tuple[str, str, str]] = []
    wrong: list[tuple[str, str, str]] = []
    negatives = clean = 0
    for case, dets in zip(sample, detections, strict=True):
        for label in case.labels:
            labelled[label.entity] += 1
            if any(d.entity == label.entity and _overlaps(d, label.start, label.end) for d in dets):
                found[label.entity] += 1
            else:
                missed.append((case.case_id, label.entity, label.value))
        for d in dets:
            detected[d.entity] += 1
            if any(lb.entity == d.entity and _overlaps(d, lb.start, lb.end) for lb in case.labels):
                correct[d.entity] += 1
            else:
                wrong.append((case.case_id, d.entity, case.text[d.start : d.end]))
        if dets and case.kind == "negative":
            negatives += 1
        if dets and case.kind == "ticket" and not case.labels:
            clean += 1
    return Score(labelled, found, detected, correct, negatives, clean, missed, wrong)


def import_seconds(name: str) -> float:
    """Import and set-up in a fresh interpreter (files already in the page cache)."""
    out = subprocess.run(
        [sys.executable, __file__, "--load-only", name],
        check=True,
        capture_output=True,
        text=True,
    )
    return float(out.stdout.strip().splitlines()[-1])


def run(name: str, sample: Sequence[Case]) -> dict[str, object]:
    candidate = CANDIDATES[name]
    try:
        detect = candidate.load()
    except ImportError as e:
        return {"name": name, "skipped": f"not installed ({e.name or e})", "notes": candidate.notes}
    texts = [c.text for c in sample]
    detect(texts[:WARM_UP])
    seconds = float("inf")
    for _ in range(TIMED_RUNS):
        started = time.perf_counter()
        detections = detect(texts)
        seconds = min(seconds, time.perf_counter() - started)
    return {
        "name": name,
        "score": score(sample, detections),
        "items_per_s": len(texts) / seconds,
        "import_s": import_seconds(name),
        "notes": candidate.notes,
    }


def _pct(part: int, whole: int) -> str:
    return "–" if not whole else f"{100 * part / whole:.0f}"


def table(results: Sequence[dict[str, object]], sample: Sequence[Case]) -> str:
    negatives = sum(1 for c in sample if c.kind == "negative")
    clean = sum(1 for c in sample if c.kind == "ticket" and not c.labels)
    head = [
        "library",
        *ALL,
        "overall",
        f"negatives flagged (of {negatives})",
        f"clean tickets flagged (of {clean})",
        "items/s",
        "import (s)",
        "notes",
    ]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        if "skipped" in r:
            cells = [str(r["name"]), *["–"] * (len(ALL) + 5), f"skipped: {r['skipped']}"]
            rows.append("| " + " | ".join(cells) + " |")
            continue
        s: Score = r["score"]  # type: ignore[assignment]
        types = CANDIDATES[str(r["name"])].types
        per_type = [
            f"{_pct(s.found[e], s.labelled[e])} / {_pct(s.correct[e], s.detected[e])}"
            if e in types
            else "–"
            for e in ALL
        ]
        overall = (
            f"{_pct(sum(s.found.values()), sum(s.labelled.values()))} / "
            f"{_pct(sum(s.correct.values()), sum(s.detected.values()))}"
        )
        cells = [
            str(r["name"]),
            *per_type,
            overall,
            str(s.negatives_flagged),
            str(s.clean_flagged),
            f"{r['items_per_s']:,.0f}",
            f"{r['import_s']:.3f}",
            str(r["notes"]),
        ]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def cases(result: dict[str, object]) -> str:
    s: Score = result["score"]  # type: ignore[assignment]
    lines = [f"missed ({len(s.missed)}):"]
    lines += [f"  {case_id}  {entity}  {value!r}" for case_id, entity, value in s.missed]
    lines.append(f"wrongly flagged ({len(s.wrong)}):")
    lines += [f"  {case_id}  {entity}  {value!r}" for case_id, entity, value in s.wrong]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="+", choices=sorted(CANDIDATES), default=list(CANDIDATES))
    parser.add_argument("--cases", choices=sorted(CANDIDATES), help="list misses and wrong flags")
    parser.add_argument("--json", type=Path, help="write the scores here")
    parser.add_argument("--load-only", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.load_only:
        started = time.perf_counter()
        CANDIDATES[args.load_only].load()
        print(f"{time.perf_counter() - started:.4f}")
        return

    from pii_sample import build_sample

    from llm_assets.compliance.spec import ENTITIES

    assert ALL == ENTITIES
    sample = build_sample()
    names = list(dict.fromkeys([*args.only, *([args.cases] if args.cases else [])]))
    results = [run(name, sample) for name in names]
    labels = Counter(lb.entity for c in sample for lb in c.labels)
    print(
        f"{len(sample)} texts ({Counter(c.kind for c in sample)}), labelled values: "
        + ", ".join(f"{e} {labels[e]}" for e in ALL)
    )
    print("Cells per entity type: recall / precision in %; '–' where the library has no such type.")
    print(table([r for r in results if r["name"] in args.only], sample))
    if args.cases:
        chosen = next(r for r in results if r["name"] == args.cases)
        if "score" in chosen:
            print(f"\n{args.cases}:\n{cases(chosen)}")
    if args.json:
        out: dict[str, object] = defaultdict(dict)
        for r in results:
            entry = {k: v for k, v in r.items() if k != "score"}
            if "score" in r:
                s: Score = r["score"]  # type: ignore[assignment]
                entry |= {k: v for k, v in s._asdict().items() if k not in ("missed", "wrong")}
            out[str(r["name"])] = entry
        args.json.write_text(json.dumps(out, indent=2, default=str))


if __name__ == "__main__":
    main()
