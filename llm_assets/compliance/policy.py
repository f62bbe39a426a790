"""A spec's personal-data policy applied to rendered prompts: what is sent in their place, what
is blocked, and the placeholders to put back into a validated output.

A value under `redact` or `pseudonymize` becomes a typed placeholder, numbered per prompt
(`<EMAIL_1>`, `<EMAIL_2>`; the same value twice is the same placeholder). Under `pseudonymize`
the placeholders and their values are kept, in the ledger only, and put back where the model
echoes a placeholder. A value under `block` makes the whole item a `compliance` dead letter
that names the entity types, never the values.
"""

import re
import string
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from llm_assets.compliance.detect import Finding, scan
from llm_assets.compliance.spec import MAX_SCANNED_CHARS, PHONE_REGIONS, Action, Entity

if TYPE_CHECKING:
    from llm_assets.spec.model import PipelineSpec

BLOCKED_CODE = "personal_data_blocked"
UNSCANNED_CODE = "too_long_to_scan"
COMPLIANCE = "compliance"
"""The dead-letter class of a blocked item."""


class Screened(NamedTuple):
    """A prompt after the policy: the text to send (None when blocked), the entity types that
    blocked it, what was found as "entity:action" counts, the pseudonyms to restore, and why
    it was blocked unscanned (too long to scan)."""

    text: str | None
    blocked: tuple[str, ...] = ()
    found: tuple[tuple[str, int], ...] = ()
    pseudonyms: tuple[tuple[str, str], ...] = ()
    unscanned: str = ""


def placeholder(entity: Entity, number: int) -> str:
    return f"<{entity.upper()}_{number}>"


def _apply(text: str, findings: Sequence[Finding], policy: Mapping[Entity, Action]) -> Screened:
    counts: dict[str, int] = {}
    for finding in findings:
        key = f"{finding.entity}:{policy[finding.entity]}"
        counts[key] = counts.get(key, 0) + 1
    found = tuple(sorted(counts.items()))
    blocked = tuple(sorted({f.entity for f in findings if policy[f.entity] == "block"}))
    if blocked:
        return Screened(None, blocked, found)
    parts: list[str] = []
    numbers: dict[tuple[str, str], str] = {}
    per_type: dict[str, int] = {}
    kept: dict[str, str] = {}
    at = 0
    for finding in findings:
        action = policy[finding.entity]
        if action == "allow":
            continue
        name = numbers.get((finding.entity, finding.value))
        if name is None:
            per_type[finding.entity] = per_type.get(finding.entity, 0) + 1
            name = placeholder(finding.entity, per_type[finding.entity])
            numbers[(finding.entity, finding.value)] = name
        if action == "pseudonymize":
            kept[name] = finding.value
        parts += (text[at : finding.start], name)
        at = finding.end
    if not parts:
        return Screened(text, (), found)
    parts.append(text[at:])
    return Screened("".join(parts), (), found, tuple(kept.items()))


def screen(
    texts: Sequence[str],
    policy: Mapping[Entity, Action],
    phone_regions: Sequence[str] = PHONE_REGIONS,
    max_chars: int = MAX_SCANNED_CHARS,
) -> list[Screened]:
    """Each prompt under the policy; a policy that allows everything scans nothing. A prompt
    over `max_chars` is blocked unscanned."""
    if all(action == "allow" for action in policy.values()):
        return [Screened(text) for text in texts]
    if max(map(len, texts), default=0) > max_chars:
        scanned = [text for text in texts if len(text) <= max_chars]
        findings = iter(scan(scanned, phone_regions))
        return [
            _screened(text, next(findings), policy)
            if len(text) <= max_chars
            else Screened(None, unscanned=too_long(len(text), max_chars))
            for text in texts
        ]
    # Most prompts hold nothing: their Screened is made as a plain tuple, without the call
    # of the named tuple's __new__ (a tenth of a chunk's screening).
    return [
        _apply(text, found, policy) if found else _new(Screened, (text, (), (), (), ""))
        for text, found in zip(texts, scan(texts, phone_regions), strict=True)
    ]


_new = tuple.__new__


def _screened(text: str, findings: list[Finding], policy: Mapping[Entity, Action]) -> Screened:
    return _apply(text, findings, policy) if findings else Screened(text)


def too_long(length: int, max_chars: int) -> str:
    return (
        f"not sent: the prompt is {length:,} characters, over compliance.max_scanned_chars "
        f"({max_chars:,}), and is not scanned for personal data"
    )


def blocked_message(screened: Screened) -> str:
    if screened.unscanned:
        return screened.unscanned
    return (
        f"not sent: the prompt holds {', '.join(screened.blocked)}, which compliance.pii "
        "blocks (the values are not recorded)"
    )


def redacted(texts: Sequence[str]) -> list[str]:
    """The texts with every value found, of any type, shown as its type (<EMAIL>): what
    metadata, previews and check tables show, whatever the policy sent. A validated output
    holds the values its pseudonyms stand for, and a model may echo what it was given."""
    out = []
    for text, findings in zip(texts, scan(texts), strict=True):
        parts: list[str] = []
        at = 0
        for finding in findings:
            parts += (text[at : finding.start], f"<{finding.entity.upper()}>")
            at = finding.end
        out.append("".join(parts) + text[at:] if parts else text)
    return out


_PLACEHOLDER = re.compile(r"<[A-Z_]+_\d+>")


def restore(value: Any, pseudonyms: Mapping[str, str]) -> Any:
    """A model's output with each pseudonymized placeholder it echoes replaced by its value,
    in strings at any depth of lists and objects."""
    if isinstance(value, str):
        if "<" not in value:
            return value
        return _PLACEHOLDER.sub(lambda m: pseudonyms.get(m.group(), m.group()), value)
    if isinstance(value, list):
        return [restore(v, pseudonyms) for v in value]
    if isinstance(value, dict):
        return {k: restore(v, pseudonyms) for k, v in value.items()}
    return value


def fixed_text_problems(spec: "PipelineSpec") -> list[tuple[str, str]]:
    """The spec's own prompt text (the system prompt, the template around its placeholders)
    goes with every item unscreened: personal data or a credential there that the policy
    does not allow is a spec problem, named by type, never by value."""
    template = "".join(text for text, *_ in string.Formatter().parse(spec.prompt.template))
    problems = []
    for field, text in (("prompt.system", spec.prompt.system), ("prompt.template", template)):
        found = scan([text], spec.compliance.phone_regions)[0] if text else []
        kinds = sorted({f.entity for f in found if spec.compliance.pii[f.entity] != "allow"})
        if kinds:
            problems.append(
                (
                    field,
                    f"holds {', '.join(kinds)}, which would go with every item (the spec's "
                    "own text is not screened); take it out of the prompt, or allow the type "
                    "in compliance.pii",
                )
            )
    return problems
