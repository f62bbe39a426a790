"""The local provider's numpy encoder gives sentence-transformers' vectors.

tests/golden/minilm_reference.npz holds vectors sentence-transformers (torch) computed for demo
tickets, their sentences and text in other scripts and lengths (bench/minilm_reference.py
writes it and compares the provider's labels and summaries on whole demo days).
"""

from pathlib import Path

import numpy as np
import pytest

from llm_assets.resources.providers import local_engine
from llm_assets.resources.providers.local_engine import LocalEngine

REFERENCE = Path(__file__).parent / "golden" / "minilm_reference.npz"


@pytest.fixture(scope="module")
def engine() -> LocalEngine:
    return LocalEngine.shared()


def test_vectors_match_sentence_transformers(engine: LocalEngine) -> None:
    reference = np.load(REFERENCE)
    texts = [str(text) for text in reference["texts"]]
    assert len(texts) >= 60
    vectors = engine._encode_batches(texts)
    assert vectors.shape == reference["vectors"].shape
    assert np.abs(vectors - reference["vectors"]).max() < 2e-6
    # Unit length, as the cosine similarities of labels and summaries assume.
    norms = np.linalg.norm(vectors[[bool(text.strip()) for text in texts]], axis=1)
    assert np.allclose(norms, 1.0, atol=1e-5)


def test_a_text_alone_and_among_others_gets_the_same_vector(engine: LocalEngine) -> None:
    """Sequences share the dense layers' rows but never attend to each other. The same text at
    two places in one matrix may differ in the last bits (BLAS blocks rows by position); a
    leak of attention between texts would move it by orders of magnitude more."""
    short, long = "Refund please", "My order arrived broken and the box was open. " * 12
    together = engine._encode_batches([short, long, short])
    alone = engine._encode_batches([short])
    assert np.abs(together[0] - alone[0]).max() < 1e-6
    assert np.abs(together[0] - together[2]).max() < 1e-6
    assert np.abs(together[1] - engine._encode_batches([long])[0]).max() < 1e-6


def test_text_beyond_the_window_is_cut_like_the_reference(engine: LocalEngine) -> None:
    words = "invoice " * 600
    assert engine.count_tokens(words) > 256
    [encoding] = engine._tokenizer.encode_batch([words])
    assert len(encoding.ids) == 256
    assert engine._encode([words]).shape == (1, 384)


def test_texts_beyond_one_block_of_tokens_are_all_encoded(
    engine: LocalEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local_engine, "_BATCH_TOKENS", 128)  # many blocks from a few texts
    texts = [f"ticket {i}: the parcel never arrived " * 4 for i in range(20)]
    vectors = engine._encode_batches(texts)
    assert sum(engine.count_tokens(text) for text in texts) > 128 * 2
    assert np.abs(vectors[17] - engine._encode_batches([texts[17]])[0]).max() < 1e-6
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_a_text_is_encoded_once_while_its_vector_is_kept(
    engine: LocalEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A retried shard, a day run again and an evaluation's variants send the same texts:
    each is encoded once while it is among the last texts kept, and gets the same vector."""
    encoded: list[str] = []
    model_path = engine._encode_batches

    def counted(texts: list[str]) -> np.ndarray:
        encoded.extend(texts)
        return model_path(texts)

    monkeypatch.setattr(engine, "_encode_batches", counted)
    monkeypatch.setattr(local_engine, "_KEPT_VECTORS", 3)
    monkeypatch.setattr(engine, "_vectors", type(engine._vectors)())
    texts = ["Where is my parcel?", "The kettle leaks.", "Where is my parcel?"]

    first = engine._encode(texts)
    again = engine._encode(["The kettle leaks.", "Where is my parcel?"])
    assert encoded == ["Where is my parcel?", "The kettle leaks."]
    assert np.array_equal(first[0], first[2]) and np.array_equal(again[1], first[0])
    assert np.abs(first[1] - model_path(["The kettle leaks."])[0]).max() < 1e-6

    # Three kept: a fourth new text pushes out the one used longest ago.
    engine._encode(["Refund, please.", "Cancel my order."])
    engine._encode(["The kettle leaks.", "Where is my parcel?"])
    assert encoded[2:] == ["Refund, please.", "Cancel my order.", "The kettle leaks."]
