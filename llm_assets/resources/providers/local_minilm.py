"""all-MiniLM-L6-v2's sentence embeddings computed with numpy from the packaged weights.

The model is a six-layer BERT encoder (hidden size 384, 12 heads) followed by a mean over the
tokens and a unit-length normalisation, which is what sentence-transformers runs for it. Doing
the same arithmetic here loads the weights and the tokenizer in a quarter of a second, where
importing torch, transformers and sentence-transformers took five: every process that runs a
local day (a CLI run, a Dagster run worker, the demo) paid that. The vectors match
sentence-transformers' to float32 rounding (tests/golden/minilm_reference.npz holds its
vectors; bench/minilm_reference.py compares whole demo days).
"""

import json
import math
from pathlib import Path

import numpy as np

_LAYER = "encoder.layer.{}."
_SQRT_HALF = 1.0 / math.sqrt(2.0)
_ROWS = 256
"""Tokens per block of the feed-forward layers."""


def _gelu(x: np.ndarray, scratch: np.ndarray) -> np.ndarray:
    """BERT's exact GELU, x * Phi(x), in place on a float32 block; scratch is a second block of
    x's shape. The error function is Abramowitz and Stegun's 7.1.26 (absolute error below
    1.5e-7, float32's own rounding)."""
    z = scratch
    np.abs(x, out=z)
    z *= np.float32(_SQRT_HALF)
    t = np.float32(0.3275911) * z
    t += np.float32(1.0)
    np.reciprocal(t, out=t)
    poly = np.float32(1.061405429) * t
    for coefficient in (-1.453152027, 1.421413741, -0.284496736, 0.254829592):
        poly += np.float32(coefficient)
        poly *= t
    np.square(z, out=z)
    np.negative(z, out=z)
    np.exp(z, out=z)
    poly *= z
    poly *= np.float32(0.5)  # erfc(|x| / sqrt 2) / 2, which is Phi(-|x|)
    # Phi(x) is 1 - Phi(-|x|) where x >= 0.
    np.subtract(np.float32(1.0), poly, out=poly, where=x >= 0)
    x *= poly
    return x


class MiniLM:
    """Token ids in, unit-length sentence vectors out (the mean of each sequence's tokens)."""

    def __init__(self, model_dir: Path) -> None:
        from safetensors.numpy import load_file

        config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
        pooling = json.loads((model_dir / "1_Pooling" / "config.json").read_text(encoding="utf-8"))
        sentence = json.loads((model_dir / "sentence_bert_config.json").read_text(encoding="utf-8"))
        if config.get("model_type") != "bert" or not pooling.get("pooling_mode_mean_tokens"):
            raise ValueError(f"{model_dir} is not a mean-pooled BERT sentence encoder")
        self.max_seq_length: int = int(sentence["max_seq_length"])
        self.dimension: int = int(config["hidden_size"])
        self._heads = int(config["num_attention_heads"])
        self._layers = int(config["num_hidden_layers"])
        self._eps = float(config["layer_norm_eps"])
        self._w: dict[str, np.ndarray] = {
            name.removeprefix("bert."): value.astype(np.float32)
            for name, value in load_file(str(model_dir / "model.safetensors")).items()
        }
        # Query, key and value as one matrix: one product per layer instead of three.
        for layer in range(self._layers):
            prefix = _LAYER.format(layer) + "attention.self."
            self._w[prefix + "qkv.weight"] = np.concatenate(
                [self._w[prefix + part + ".weight"].T for part in ("query", "key", "value")],
                axis=1,
            )
            self._w[prefix + "qkv.bias"] = np.concatenate(
                [self._w[prefix + part + ".bias"] for part in ("query", "key", "value")]
            )
        # Dense weights are stored (out, in); kept as (in, out) so every product is `x @ w`.
        for name in list(self._w):
            if name.endswith("dense.weight"):
                self._w[name] = np.ascontiguousarray(self._w[name].T)

    def encode(self, sequences: list[list[int]]) -> np.ndarray:
        """One unit vector per sequence of token ids (each at most max_seq_length long).

        The sequences' tokens are the rows of one matrix, without padding: every dense layer
        is one product over all of them, and attention runs per sequence over its own rows.
        """
        w = self._w
        lengths = np.array([len(tokens) for tokens in sequences], dtype=np.int64)
        if len(sequences) == 0 or lengths.min() < 1 or lengths.max() > self.max_seq_length:
            raise ValueError(f"sequences of 1 to {self.max_seq_length} tokens, got {lengths}")
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        ids = np.concatenate([np.asarray(tokens, dtype=np.int64) for tokens in sequences])
        positions = np.arange(len(ids)) - np.repeat(starts, lengths)
        hidden = (
            w["embeddings.word_embeddings.weight"][ids]
            + w["embeddings.position_embeddings.weight"][positions]
            + w["embeddings.token_type_embeddings.weight"][0]
        )
        hidden = self._norm(hidden, "embeddings.LayerNorm")
        spans = [(int(a), int(a + n)) for a, n in zip(starts, lengths, strict=True)]
        for layer in range(self._layers):
            p = _LAYER.format(layer)
            attended = self._attention(hidden, spans, p) @ w[p + "attention.output.dense.weight"]
            attended += w[p + "attention.output.dense.bias"]
            attended += hidden
            hidden = self._norm(attended, p + "attention.output.LayerNorm")
            hidden = self._norm(self._feed_forward(hidden, p), p + "output.LayerNorm")
        pooled = np.add.reduceat(hidden, starts, axis=0) / lengths[:, None].astype(np.float32)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        return (pooled / np.clip(norms, 1e-12, None)).astype(np.float32)

    def _attention(self, hidden: np.ndarray, spans: list[tuple[int, int]], p: str) -> np.ndarray:
        """Each sequence's tokens attend to that sequence's tokens, head by head."""
        w = self._w
        heads, size = self._heads, self.dimension // self._heads
        qkv = hidden @ w[p + "attention.self.qkv.weight"]
        qkv += w[p + "attention.self.qkv.bias"]
        # (3, heads, tokens, size), contiguous: numpy's stacked matmul takes the BLAS path only
        # for contiguous matrices (strided views are a slow loop).
        split = np.ascontiguousarray(qkv.reshape(-1, 3, heads, size).transpose(1, 2, 0, 3))
        split[0] *= np.float32(1.0 / math.sqrt(size))
        context = np.empty((heads, hidden.shape[0], size), dtype=np.float32)
        for start, end in spans:
            scores = split[0, :, start:end] @ split[1, :, start:end].transpose(0, 2, 1)
            scores -= scores.max(axis=-1, keepdims=True)
            np.exp(scores, out=scores)
            scores /= scores.sum(axis=-1, keepdims=True)
            np.matmul(scores, split[2, :, start:end], out=context[:, start:end])
        return context.transpose(1, 0, 2).reshape(hidden.shape[0], self.dimension)

    def _feed_forward(self, hidden: np.ndarray, p: str) -> np.ndarray:
        """The layer's feed-forward block plus its residual, a block of rows at a time: the
        intermediate activations (four times the hidden width) stay in cache."""
        w = self._w
        out = np.empty_like(hidden)
        for start in range(0, hidden.shape[0], _ROWS):
            rows = hidden[start : start + _ROWS]
            inner = rows @ w[p + "intermediate.dense.weight"]
            inner += w[p + "intermediate.dense.bias"]
            block = out[start : start + _ROWS]
            np.matmul(_gelu(inner, np.empty_like(inner)), w[p + "output.dense.weight"], out=block)
            block += w[p + "output.dense.bias"]
            block += rows
        return out

    def _norm(self, x: np.ndarray, name: str) -> np.ndarray:
        """Layer normalisation over the hidden dimension, in place."""
        x -= x.mean(axis=-1, keepdims=True)
        variance = np.einsum("ij,ij->i", x, x)[:, None] / np.float32(x.shape[-1])
        x /= np.sqrt(variance + np.float32(self._eps))
        x *= self._w[name + ".weight"]
        x += self._w[name + ".bias"]
        return x
