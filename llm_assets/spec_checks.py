"""The checks a pipeline spec must pass once it parses: what one field alone cannot say
(prompt placeholders against the source fields, a loadable pandera model, a cron schedule, a
known timezone, the URL in the webhook variable when it is set, the residency a spec decides
alone) and the checks that consumers of specs register (`register_check`).

spec.py runs them on every parsed spec (`semantic_problems`); this module needs the spec
model only for its type hints, so spec.py can import it.
"""

import os
import string
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from llm_assets.compliance.residency import residency_problems
from llm_assets.secrecy import webhook_url_problem

if TYPE_CHECKING:
    from llm_assets.spec import PipelineSpec

SpecCheck = Callable[["PipelineSpec"], list[tuple[str, str]]]
"""A check only a consumer of specs can make, as (field, reason) problems."""

_registered_checks: list[SpecCheck] = []


def register_check(check: SpecCheck) -> None:
    """Add a check that every parsed spec must pass.

    The spec model knows none of its consumers: the provider registry registers the
    provider checks (known provider, priced model, what the adapter can serve) when it is
    imported, so whatever validates specs imports the registry first.
    """
    if check not in _registered_checks:
        _registered_checks.append(check)


def load_pandera_model(path: str) -> type[Any]:
    """The pandera `DataFrameModel` a spec names as `package.module:Class`."""
    import importlib

    import pandera.pandas as pa

    module_name, _, attribute = path.partition(":")
    model = getattr(importlib.import_module(module_name), attribute)
    if not (isinstance(model, type) and issubclass(model, pa.DataFrameModel)):
        raise TypeError(f"{path} is not a pandera DataFrameModel")
    return model


def webhook_problems(spec: "PipelineSpec") -> list[tuple[str, str]]:
    """The URL in the spec's webhook variable, when it is set here, must be one a webhook may
    have (https, or http to this machine); the problem names the variable, never the URL."""
    variable = spec.automation.notify.webhook_env
    url = os.environ.get(variable)
    problem = webhook_url_problem(url, variable) if url else None
    return [("automation.notify.webhook_env", problem)] if problem else []


def _dressed_placeholders(template: str) -> list[tuple[str, str]]:
    """A placeholder is a field's name and nothing more. The fields are the source's text,
    untrusted: a format spec ({body:>300000000}) would pad a prompt to hundreds of MB, and a
    conversion ({body!r}) changes what is sent."""
    problems = []
    for _, name, format_spec, conversion in string.Formatter().parse(template):
        if name is not None and (format_spec or conversion):
            written = name + (f"!{conversion}" if conversion else "")
            written += f":{format_spec}" if format_spec else ""
            problems.append(
                (
                    "prompt.template",
                    f"placeholder {{{written}}}: no conversion or format spec on a source "
                    f"field; write {{{name}}}",
                )
            )
    return problems


def semantic_problems(spec: "PipelineSpec") -> list[tuple[str, str]]:
    """Every problem of a parsed spec that no single field's validator can see, as (field,
    reason), the registered checks' included."""
    problems: list[tuple[str, str]] = []
    fields = set(spec.source.fields)
    problems.extend(_dressed_placeholders(spec.prompt.template))
    for name in spec.prompt.placeholders:
        if not name:
            problems.append(("prompt.template", "empty placeholder {}; name a source field"))
        elif not name.isidentifier():
            problems.append(
                ("prompt.template", f"placeholder {{{name}}} is not a plain field name")
            )
        elif name not in fields:
            problems.append(
                (
                    "prompt.template",
                    f"placeholder {{{name}}} is not a source field; source.fields is "
                    f"{sorted(fields)}",
                )
            )
    for name in spec.source.required_fields or []:
        if name not in fields:
            problems.append(("source.required_fields", f"{name!r} is not in source.fields"))
    problems.extend(webhook_problems(spec))
    from llm_assets.compliance.policy import fixed_text_problems

    problems.extend(fixed_text_problems(spec))
    problems.extend(residency_problems(spec))
    for check in _registered_checks:
        problems.extend(check(spec))
    if spec.output.pandera_model:
        try:
            load_pandera_model(spec.output.pandera_model)
        except Exception as exc:
            problems.append(
                ("output.pandera_model", f"cannot use {spec.output.pandera_model!r}: {exc}")
            )
    if spec.automation.schedule is not None:
        from dagster._utils.schedules import is_valid_cron_string

        if not is_valid_cron_string(spec.automation.schedule):
            problems.append(
                (
                    "automation.schedule",
                    f"{spec.automation.schedule!r} is not a cron expression like '0 6 * * *'",
                )
            )
    try:
        import zoneinfo

        zoneinfo.ZoneInfo(spec.partitions.timezone)
    except Exception:
        problems.append(("partitions.timezone", f"unknown timezone {spec.partitions.timezone!r}"))
    return problems
