"""The checks a pipeline spec must pass once it parses that are the spec's own: prompt
placeholders against the source fields, required fields, the URL in the webhook variable
when it is set, a loadable pandera model, a cron schedule, a known timezone.

Each is a `SpecCheck`; spec/load.py lists them with the checks of the spec's consumers
(compliance, providers, evaluation) and runs them on every parsed spec.
"""

import importlib
import os
import string
import zoneinfo
from collections.abc import Callable
from typing import Any

from llm_assets.spec.model import PipelineSpec
from llm_assets.util.secrecy import webhook_url_problem

SpecCheck = Callable[[PipelineSpec], list[tuple[str, str]]]
"""A check of a parsed spec, as (field, reason) problems."""


def load_pandera_model(path: str) -> type[Any]:
    """The pandera `DataFrameModel` a spec names as `package.module:Class`."""
    import pandera.pandas as pa

    module_name, _, attribute = path.partition(":")
    model = getattr(importlib.import_module(module_name), attribute)
    if not (isinstance(model, type) and issubclass(model, pa.DataFrameModel)):
        raise TypeError(f"{path} is not a pandera DataFrameModel")
    return model


def webhook_problems(spec: PipelineSpec) -> list[tuple[str, str]]:
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


def placeholder_problems(spec: PipelineSpec) -> list[tuple[str, str]]:
    """Every placeholder of the prompt is a plain source field, written plainly."""
    problems = _dressed_placeholders(spec.prompt.template)
    fields = set(spec.source.fields)
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
    return problems


def required_field_problems(spec: PipelineSpec) -> list[tuple[str, str]]:
    """The required fields are source fields."""
    fields = set(spec.source.fields)
    return [
        ("source.required_fields", f"{name!r} is not in source.fields")
        for name in spec.source.required_fields or []
        if name not in fields
    ]


def pandera_model_problems(spec: PipelineSpec) -> list[tuple[str, str]]:
    """The pandera model the output names can be imported and is a DataFrameModel."""
    if not spec.output.pandera_model:
        return []
    try:
        load_pandera_model(spec.output.pandera_model)
    except Exception as exc:
        return [("output.pandera_model", f"cannot use {spec.output.pandera_model!r}: {exc}")]
    return []


def schedule_problems(spec: PipelineSpec) -> list[tuple[str, str]]:
    """The schedule, when there is one, is a cron expression."""
    schedule = spec.automation.schedule
    if schedule is None or _is_cron(schedule):
        return []
    return [("automation.schedule", f"{schedule!r} is not a cron expression like '0 6 * * *'")]


def _is_cron(expression: str) -> bool:
    from dagster._utils.schedules import is_valid_cron_string

    return is_valid_cron_string(expression)


def timezone_problems(spec: PipelineSpec) -> list[tuple[str, str]]:
    """The partitions' timezone is one the tz database knows."""
    try:
        zoneinfo.ZoneInfo(spec.partitions.timezone)
    except Exception:
        return [("partitions.timezone", f"unknown timezone {spec.partitions.timezone!r}")]
    return []
