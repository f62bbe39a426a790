"""What a local request asks the engine for, read from its JSON Schema: the plan of labels,
confidences, summaries and embeddings, and what the local provider cannot produce.

The same planner serves two callers: spec validation (`local_spec_problems`, so a spec the
engine cannot serve fails before anything is sent) and each request as it runs (a request
line may come from anywhere, so it is planned again from its own body).
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from llm_assets.resources.providers.local_engine import EMBEDDING_DIM, MODEL_NAME

if TYPE_CHECKING:
    from llm_assets.spec.model import PipelineSpec

DEFAULT_SUMMARY_CHARS = 400
CAPABILITIES = (
    "it produces labels (str with isin), a confidence (float with ge: 0, le: 1), "
    "summaries (str) and embeddings (list[float])"
)


@dataclass(frozen=True)
class FieldPlan:
    name: str
    kind: Literal["label", "confidence", "summary", "embedding"]
    labels: tuple[str, ...] = ()
    min_chars: int = 0
    max_chars: int = DEFAULT_SUMMARY_CHARS
    lower: float = 0.0
    upper: float = 1.0


@dataclass(frozen=True)
class OutputPlan:
    """What one request asks for: JSON fields, or plain text when `fields` is None."""

    fields: tuple[FieldPlan, ...] | None
    problems: tuple[tuple[str, str], ...] = ()
    text_min_chars: int = 0
    text_max_chars: int = DEFAULT_SUMMARY_CHARS
    descriptions: tuple[tuple[str, str], ...] = ()


def _resolve(node: Any, root: dict[str, Any]) -> dict[str, Any]:
    """Follow a local `$ref` and unwrap `anyOf [X, null]` (pydantic's nullable fields)."""
    seen = 0
    while isinstance(node, dict) and seen < 16:
        seen += 1
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/"):
            target: Any = root
            for part in ref[2:].split("/"):
                target = target.get(part, {}) if isinstance(target, dict) else {}
            node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
            continue
        options = node.get("anyOf") or node.get("oneOf")
        if isinstance(options, list):
            concrete = [o for o in options if not (isinstance(o, dict) and o.get("type") == "null")]
            if len(concrete) == 1:
                rest = {k: v for k, v in node.items() if k not in ("anyOf", "oneOf")}
                node = {**rest, **concrete[0]}
                continue
        return node
    return node if isinstance(node, dict) else {}


def _types(node: dict[str, Any]) -> set[str]:
    declared = node.get("type")
    if isinstance(declared, list):
        return {t for t in declared if t != "null"}
    if isinstance(declared, str):
        return {declared}
    enum = node.get("enum")
    if isinstance(enum, list) and enum:
        return {"string" if isinstance(v, str) else "number" for v in enum}
    return set()


def _number_bounds(node: dict[str, Any]) -> tuple[float | None, float | None, bool, bool]:
    lower, upper = node.get("minimum"), node.get("maximum")
    lower_open = upper_open = False
    if node.get("exclusiveMinimum") is not None:
        lower, lower_open = node["exclusiveMinimum"], True
    if node.get("exclusiveMaximum") is not None:
        upper, upper_open = node["exclusiveMaximum"], True
    return lower, upper, lower_open, upper_open


def _plan_field(name: str, node: dict[str, Any], root: dict[str, Any]) -> FieldPlan | str:
    """The plan for one property, or why it cannot be produced."""
    types = _types(node)
    enum = node.get("enum")
    if isinstance(enum, list):
        if not enum or not all(isinstance(v, str) for v in enum):
            return "labels must be strings (isin lists non-string values)"
        return FieldPlan(name, "label", labels=tuple(enum))
    if types == {"string"}:
        max_chars = node.get("maxLength", DEFAULT_SUMMARY_CHARS)
        if int(max_chars) < 1:
            return "a summary needs a maxLength of at least 1"
        return FieldPlan(
            name, "summary", min_chars=int(node.get("minLength", 0)), max_chars=int(max_chars)
        )
    if types == {"number"}:
        lower, upper, lower_open, upper_open = _number_bounds(node)
        if lower != 0 or upper != 1:
            return "a number is only produced as a confidence, which needs bounds ge: 0, le: 1"
        return FieldPlan(
            name,
            "confidence",
            lower=1e-4 if lower_open else 0.0,
            upper=1 - 1e-4 if upper_open else 1.0,
        )
    if types == {"array"}:
        items = _resolve(node.get("items", {}), root)
        if _types(items) != {"number"}:
            return "an embedding model cannot generate lists of strings"
        low, high = node.get("minItems", 0), node.get("maxItems", EMBEDDING_DIM)
        if not low <= EMBEDDING_DIM <= high:
            return f"embeddings have {EMBEDDING_DIM} dimensions, outside the length bounds"
        return FieldPlan(name, "embedding")
    if types == {"integer"}:
        return "an embedding model cannot compute counts, scores or ratings"
    if types == {"boolean"}:
        return "an embedding model cannot answer yes/no questions"
    return f"unsupported JSON Schema type {sorted(types) or 'unknown'}"


def plan_schema(schema: dict[str, Any]) -> tuple[tuple[FieldPlan, ...], list[tuple[str, str]]]:
    properties = _resolve(schema, schema).get("properties")
    if not isinstance(properties, dict) or not properties:
        return (), [("-", "the schema has no properties")]
    plans: list[FieldPlan] = []
    problems: list[tuple[str, str]] = []
    for name, raw in properties.items():
        planned = _plan_field(name, _resolve(raw, schema), schema)
        if isinstance(planned, str):
            problems.append((name, planned))
        else:
            plans.append(planned)
    if any(p.kind == "confidence" for p in plans) and not any(p.kind == "label" for p in plans):
        problems.extend(
            (p.name, "a confidence needs a label field (str with isin) to be the confidence of")
            for p in plans
            if p.kind == "confidence"
        )
    return tuple(plans), problems


def plan_request(body: dict[str, Any]) -> OutputPlan:
    extras = body.get("x_local") or {}
    descriptions = extras.get("label_descriptions") or {}
    described = tuple(sorted((str(k), str(v)) for k, v in descriptions.items()))
    response_format = body.get("response_format")
    if response_format is None or response_format.get("type") == "text":
        max_tokens = int(body.get("max_tokens") or 512)
        max_chars = int(extras.get("text_max_chars") or 4 * max_tokens)
        return OutputPlan(
            fields=None,
            problems=(("text", "text_max_chars must be at least 1"),) if max_chars < 1 else (),
            text_min_chars=int(extras.get("text_min_chars") or 0),
            text_max_chars=max_chars,
            descriptions=described,
        )
    if response_format.get("type") != "json_schema":
        return OutputPlan(
            fields=(), problems=(("response_format", "only json_schema is supported"),)
        )
    schema = (response_format.get("json_schema") or {}).get("schema") or {}
    plans, problems = plan_schema(schema)
    return OutputPlan(fields=plans, problems=tuple(problems), descriptions=described)


def local_spec_problems(spec: "PipelineSpec") -> list[tuple[str, str]]:
    """What the local provider cannot serve in a spec, as (field, reason)."""
    problems: list[tuple[str, str]] = []
    if spec.model.name != MODEL_NAME:
        problems.append(
            (
                "model.name",
                f"the local provider runs {MODEL_NAME} only, not {spec.model.name!r}",
            )
        )
    labels, output_problems = _output_problems(spec)
    problems.extend(output_problems)
    for key in sorted(set(spec.model.options) - {"label_descriptions"}):
        problems.append(
            (
                "model.options",
                f"unknown option {key!r} for the local provider; it takes label_descriptions",
            )
        )
    problems.extend(_description_problems(spec.model.options.get("label_descriptions"), labels))
    return problems


def _output_problems(spec: "PipelineSpec") -> tuple[set[str], list[tuple[str, str]]]:
    """The labels the output schema asks for, and the output fields the engine cannot make."""
    from llm_assets.results.validation import output_json_schema

    if spec.output.format != "json":
        text_field = spec.output.output_schema.get("text")
        if text_field is None or (text_field.type == "str" and text_field.isin is None):
            return set(), []
        return set(), [
            (
                "output.schema.text",
                f"the local provider cannot produce {text_field.type} fields in text "
                f"format: text output is an extractive summary; {CAPABILITIES}",
            )
        ]
    plans, unproducible = plan_schema(output_json_schema(spec))
    problems: list[tuple[str, str]] = []
    for name, why in unproducible:
        field_spec = spec.output.output_schema.get(name)
        kind = field_spec.type if field_spec is not None else "such"
        problems.append(
            (
                f"output.schema.{name}",
                f"the local provider cannot produce {kind} fields: {why}; {CAPABILITIES}",
            )
        )
    return {label for plan in plans for label in plan.labels}, problems


def _description_problems(descriptions: Any, labels: set[str]) -> list[tuple[str, str]]:
    """`model.options.label_descriptions` must describe labels of the output schema."""
    if descriptions is None:
        return []
    if not isinstance(descriptions, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and v.strip() for k, v in descriptions.items()
    ):
        return [
            ("model.options.label_descriptions", "must map each label to a non-empty description")
        ]
    return [
        (
            "model.options.label_descriptions",
            f"{key!r} is not a label of the output schema; labels are {sorted(labels)}",
        )
        for key in sorted(set(descriptions) - labels)
    ]
