"""Token estimates before submission, without network.

A documented approximation (about four characters per token for English text) until exact
tokenizers are wired per provider; it only has to bound context windows and budgets.
"""

import math

CHARS_PER_TOKEN = 4.0


def estimate_tokens(text: str) -> int:
    return math.ceil(len(text) / CHARS_PER_TOKEN) if text else 0
