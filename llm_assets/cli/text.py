"""How the command line writes values for people: counts in words, dollars, ids in a job's
table, and paths under LLM_ASSETS_HOME relative to it. `--json` and `--csv` keep the ledger's
text; these forms are only for tables and sentences."""

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from llm_assets.results.rows import DEAD_LETTER, PENDING, RETRY, SUBMITTED, SUCCEEDED
from llm_assets.util.words import dead_letter_words

_STATUS_ORDER = (SUCCEEDED, DEAD_LETTER, RETRY, SUBMITTED, PENDING)
_STATUS_WORDS = {RETRY: "waiting for a retry"}


def count_words(by_status: Mapping[str, int], by_class: Mapping[str, int]) -> str:
    """Items by status in words, done ones first: "120 succeeded, 5 dead letters (4 quality,
    1 deterministic), 3 pending"."""
    order = [*_STATUS_ORDER, *sorted(set(by_status) - set(_STATUS_ORDER))]
    words = []
    for status in order:
        n = by_status.get(status, 0)
        if not n:
            continue
        if status == DEAD_LETTER:
            words.append(dead_letter_words(n, by_class))
        else:
            words.append(f"{n:,} {_STATUS_WORDS.get(status, status.replace('_', ' '))}")
    return ", ".join(words) or "no items"


def home_relative(text: str, home: Path | None) -> str:
    """`text` with every absolute path under `home` (LLM_ASSETS_HOME) written relative to it:
    "/home/x/.llm_assets/demo/inbox/a.jsonl:3: ..." reads "demo/inbox/a.jsonl:3: ...". A path
    only starts where no path or word character comes before it, so a `file://` URI or a
    longer path that merely contains the home is kept."""
    if home is None or not text:
        return text
    for root in dict.fromkeys((str(home), os.path.realpath(home))):
        text = re.sub(rf"(?<![\w./~-]){re.escape(root.rstrip('/'))}/(?=\S)", "", text)
    return text


def short_forms(ids: Iterable[str], *, job_id: str) -> dict[str, str]:
    """Each id's form in a job's table: when every id starts with `job_id` and a dash (a
    job's shards, with the job id in the table's title) the rest (`r00-s00003`), else the id
    itself. An id is never cut to a prefix: a cut id cannot be pasted into a command or a
    provider's console."""
    distinct = sorted(set(ids))
    if distinct and all(i.startswith(f"{job_id}-") for i in distinct):
        return {i: i[len(job_id) + 1 :] for i in distinct}
    return {i: i for i in distinct}


def usd(value: float) -> str:
    """Dollars to 4 decimals; a cost too small for that shows its first digits instead of
    reading as $0.0000, which only a zero cost shows."""
    if 0 < abs(value) < 0.00005:
        return f"${value:.2g}"
    return f"${value:.4f}"


def personal_data_words(found: Mapping[str, int]) -> str:
    """{"email:redact": 3, "card:block": 1} → "card 1 blocked, email 3 redacted"."""
    done = {"redact": "redacted", "pseudonymize": "pseudonymized", "block": "blocked"}
    words = []
    for key, count in sorted(found.items()):
        entity, _, action = key.partition(":")
        words.append(f"{entity} {count} {done.get(action, 'allowed')}")
    return ", ".join(words)
