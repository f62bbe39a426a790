"""Promoting a variant: the spec change that makes it the pipeline's model and prompt.

The new baseline's `model` and `prompt` are the variant merged over the old ones as the file
writes them (keys spelled out stay). The promoted variant leaves `variants`, and the old
baseline stays as the variant `previous` (the merge patch back to it, replacing a `previous`
already there), so a replay can still compare with it and `promote PIPELINE previous` rolls
back. Other variants stay as written: they are patches over the baseline, so they now apply
over the promoted one; one that would equal the new baseline is dropped.

The file is edited as text: the top-level `model:` and `prompt:` blocks and the entries of
`variants:` that change are rewritten (comments inside them go); the rest of the file keeps
its comments and layout. The edit is checked by parsing it back; where that fails (flow style
at the top level, anchors) the whole file is dumped instead and loses its comments, which
`Promotion.comments_kept` says. Nothing here changes a file until `write`.
"""

import dataclasses
import difflib
import os
import re
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from llm_assets.evaluation.spec import VARIANT_SECTIONS, diff_patch, merge_patch

if TYPE_CHECKING:
    from llm_assets.spec.load import SpecProblem
    from llm_assets.spec.model import PipelineSpec

PREVIOUS = "previous"
"""The variant the old baseline becomes when another is promoted."""
_KEY = re.compile(r"^( *)([A-Za-z_][\w-]*)\s*:(?:\s|$)")
_NUMBERED = re.compile(r"^(.*?)(\d+)$")


class ChangedSince(Exception):
    """The spec file changed between planning a promotion and writing it."""


@dataclasses.dataclass(frozen=True)
class Promotion:
    path: Path
    variant: str
    old_text: str
    new_text: str
    comments_kept: bool
    dropped: tuple[str, ...]
    """Other variants that would equal the new baseline, so are removed."""
    replaced_previous: bool
    version_reminder: str | None

    def diff(self) -> str:
        name = str(self.path)
        return "".join(
            difflib.unified_diff(
                self.old_text.splitlines(keepends=True),
                self.new_text.splitlines(keepends=True),
                fromfile=name,
                tofile=name,
            )
        )

    def problems(self) -> list["SpecProblem"]:
        """What spec validation finds in the promoted file (named by the real file)."""
        temporary = self._temporary()
        try:
            from llm_assets.spec.load import parse_spec

            _, problems = parse_spec(temporary)
        finally:
            temporary.unlink(missing_ok=True)
        return [p.model_copy(update={"file": str(self.path)}) for p in problems]

    def write(self) -> None:
        """Replace the spec file at once (a reader sees the old file or the new one); a
        ChangedSince error when the file is no longer the one the change was made from."""
        if self.path.read_text(encoding="utf-8") != self.old_text:
            raise ChangedSince(
                f"{self.path} changed since the promotion was planned; nothing written, run "
                "promote again"
            )
        temporary = self._temporary()
        try:
            os.chmod(temporary, self.path.stat().st_mode & 0o7777)
            os.replace(temporary, self.path)
        finally:
            temporary.unlink(missing_ok=True)

    def _temporary(self) -> Path:
        """The new text in the spec's folder under a name no spec scan picks up."""
        handle, name = tempfile.mkstemp(
            dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".promote"
        )
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(self.new_text)
            out.flush()
            os.fsync(out.fileno())
        return Path(name)


def plan_promotion(spec: "PipelineSpec", variant: str) -> Promotion:
    """The change to `spec`'s file that promotes `variant`; KeyError for an unknown variant."""
    if variant not in spec.variants:
        known = ", ".join(sorted(spec.variants)) or "none"
        raise KeyError(f"pipeline {spec.name} has no variant {variant!r} (its variants: {known})")
    assert spec.path is not None
    old_text = spec.path.read_text(encoding="utf-8")
    raw = yaml.safe_load(old_text)
    patch = spec.variants[variant].patch()
    baseline = {section: merge_patch(raw[section], patch[section]) for section in VARIANT_SECTIONS}
    back = {s: diff_patch(baseline[s], raw[s]) for s in VARIANT_SECTIONS}
    why = "the rollback" if variant == PREVIOUS else f"{variant} was promoted"
    previous: dict[str, Any] = {"description": f"the baseline before {why}"}
    previous.update((s, back[s]) for s in VARIANT_SECTIONS if back[s])
    variants, dropped = {}, []
    for name, entry in raw["variants"].items():
        if name in (variant, PREVIOUS):
            continue
        entry = entry or {}
        if all(merge_patch(baseline[s], entry.get(s) or {}) == baseline[s] for s in baseline):
            dropped.append(name)
            continue
        variants[name] = entry
    variants[PREVIOUS] = previous
    new_raw = {**raw, **baseline, "variants": variants}
    new_text = _edit(old_text, raw, new_raw)
    kept = new_text is not None
    if new_text is None:
        new_text = _dump(new_raw)
    return Promotion(
        path=spec.path,
        variant=variant,
        old_text=old_text,
        new_text=new_text,
        comments_kept=kept,
        dropped=tuple(dropped),
        replaced_previous=PREVIOUS in raw["variants"] and variant != PREVIOUS,
        version_reminder=_version_reminder(spec, raw["prompt"], baseline["prompt"]),
    )


def _version_reminder(spec: "PipelineSpec", old: dict[str, Any], new: dict[str, Any]) -> str | None:
    """A prompt whose text changes under the same version is the same job: days already run
    keep the old prompt's results."""
    changed = [key for key in ("system", "template") if old.get(key) != new.get(key)]
    if not changed or old.get("version") != new.get("version"):
        return None
    version = str(spec.prompt.version)
    numbered = _NUMBERED.match(version)
    bumped = f"{numbered[1]}{int(numbered[2]) + 1}" if numbered else f"{version}_2"
    verb = "changes" if len(changed) == 1 else "change"
    return (
        f"prompt.{' and prompt.'.join(changed)} {verb} but prompt.version stays {version!r}: a "
        "job is keyed by prompt version and model, so days already run keep their results "
        f"from the old prompt; bump prompt.version (e.g. to {bumped!r}) to make it a new job"
    )


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (templates, system prompts) as `|` blocks, as people write them."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def _dump(value: Any, indent: int = 0) -> str:
    text = yaml.dump(
        value, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=4096, indent=2
    )
    pad = " " * indent
    return "".join(pad + line if line.strip() else line for line in text.splitlines(True))


def _is_content(line: str) -> bool:
    stripped = line.strip()
    return bool(stripped) and not stripped.startswith("#")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


@dataclasses.dataclass(frozen=True)
class _Span:
    lead: int
    """The first of the comment and blank lines above the key (they go when the key goes)."""
    key: int
    end: int


def _blocks(lines: list[str], start: int, end: int) -> tuple[int, dict[str, _Span]]:
    """The block mapping in lines[start:end]: its indent and each key's span; empty when the
    lines are not a block mapping of simple keys."""
    content = [i for i in range(start, end) if _is_content(lines[i])]
    if not content:
        return 0, {}
    indent = _indent(lines[content[0]])
    found: list[tuple[str, int]] = []
    for i in content:
        if _indent(lines[i]) > indent:
            continue
        match = _KEY.match(lines[i])
        if _indent(lines[i]) < indent or match is None:
            return indent, {}
        found.append((match[2], i))
    spans, lead = {}, start
    for (name, key), following in zip(found, [*found[1:], (None, end)], strict=True):
        stop = following[1]
        while stop > key + 1 and (
            not lines[stop - 1].strip()
            or (not _is_content(lines[stop - 1]) and _indent(lines[stop - 1]) <= indent)
        ):
            stop -= 1
        spans[name] = _Span(lead, key, stop)
        lead = stop
    return indent, spans


def _edit_mapping(
    lines: list[str], start: int, end: int, old: dict[str, Any], new: dict[str, Any]
) -> list[tuple[int, int, str]] | None:
    """Edits turning the block mapping in lines[start:end] from `old` into `new`, key by key:
    a changed key is rewritten, a removed one goes with the comments above it, a new one
    is added after the last; None when the lines are not such a mapping."""
    indent, spans = _blocks(lines, start, end)
    if set(spans) != set(old) or not spans:
        return None
    edits = []
    for key, value in old.items():
        if key not in new:
            edits.append((spans[key].lead, spans[key].end, ""))
        elif new[key] != value:
            edits.append((spans[key].key, spans[key].end, _dump({key: new[key]}, indent)))
    last = max(span.end for span in spans.values())
    added = {key: value for key, value in new.items() if key not in old}
    if added:
        edits.append((last, last, _dump(added, indent)))
    return edits


def _edit(text: str, raw: dict[str, Any], new_raw: dict[str, Any]) -> str | None:
    """`text` with the changed keys of model, prompt and variants rewritten; None unless
    parsing the result gives `new_raw` exactly."""
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    _, top = _blocks(lines, 0, len(lines))
    edits: list[tuple[int, int, str]] = []
    for section in (*VARIANT_SECTIONS, "variants"):
        if section not in top:
            return None
        span = top[section]
        inner = _edit_mapping(lines, span.key + 1, span.end, raw[section], new_raw[section])
        if inner is None:
            inner = [(span.key, span.end, _dump({section: new_raw[section]}))]
        edits.extend(inner)
    for first, stop, replacement in sorted(edits, key=lambda e: (e[0], e[1]), reverse=True):
        lines[first:stop] = replacement.splitlines(keepends=True)
    new_text = "".join(lines)
    try:
        parsed = yaml.safe_load(new_text)
    except yaml.YAMLError:
        return None
    return new_text if parsed == new_raw else None
