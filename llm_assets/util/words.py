"""Counts in plain words, for the CLI's tables and the day summaries."""

from collections.abc import Mapping


def plural(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def class_words(by_class: Mapping[str, int]) -> str:
    """ "4 quality, 1 deterministic": the most frequent class first."""
    ranked = sorted(by_class.items(), key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(f"{n:,} {name}" for name, n in ranked if n)


def dead_letter_words(n: int, by_class: Mapping[str, int]) -> str:
    """ "5 dead letters (4 quality, 1 deterministic)"."""
    classes = class_words(by_class)
    return f"{plural(n, 'dead letter')} ({classes})" if n and classes else plural(n, "dead letter")


def duration_words(seconds: float | None) -> str:
    """ "42s", "17m", "3.5h"; "-" when there is no duration."""
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"
