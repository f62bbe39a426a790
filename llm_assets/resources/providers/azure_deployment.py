"""An Azure OpenAI batch deployment as a spec names it, in `model.options`.

Azure serves a model through a deployment of it on an Azure OpenAI resource: request lines
name the deployment where OpenAI's name the model, and the spec's `model.name` stays the
model (for its price and tokenizer). A batch deployment is of one of two types, which decide
where its requests are processed:

- `global` (Global Batch): in any Azure region that serves the model;
- `data_zone` (Data Zone Batch): only in the Microsoft data zone of the resource's region,
  `eu` (EU member states) or `us`.

Azure's data plane does not say which type a deployment is, so the spec does; unset, a
deployment is taken to be global, the type that promises least. Files and results rest in
the resource's own geography whatever the type. Importable without Dagster or an SDK: the
residency check reads it too.
"""

import re
from typing import TYPE_CHECKING, Literal, NamedTuple

if TYPE_CHECKING:
    from llm_assets.spec.model import PipelineSpec

DEPLOYMENT_TYPES = ("global", "data_zone")
DATA_ZONES = ("eu", "us")
OPTIONS = frozenset({"deployment", "deployment_type", "data_zone"})
"""The `model.options` that describe the deployment."""
DEPLOYMENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{1,63}$")
"""Azure's rule for deployment names: 2 to 64 letters, digits, `.`, `_` and `-`."""


class AzureDeployment(NamedTuple):
    """The deployment a spec's request lines are sent to."""

    name: str
    type: Literal["global", "data_zone"]
    data_zone: Literal["eu", "us"] | None
    """The zone of a data_zone deployment; None for a global one, or when the spec names
    none (a spec problem)."""


def azure_deployment(spec: "PipelineSpec") -> AzureDeployment:
    """The spec's deployment: `model.options.deployment` (default: the model's name),
    `deployment_type` (default: global; anything but data_zone reads as global) and
    `data_zone`."""
    options = spec.model.options
    name = str(options.get("deployment") or spec.model.name)
    if options.get("deployment_type") != "data_zone":
        return AzureDeployment(name, "global", None)
    zone = str(options.get("data_zone") or "").lower()
    return AzureDeployment(name, "data_zone", "eu" if zone == "eu" else "us" if zone else None)


def deployment_problems(spec: "PipelineSpec") -> list[tuple[str, str]]:
    """What is wrong with the spec's deployment options, as (field, reason)."""
    options = spec.model.options
    problems: list[tuple[str, str]] = []
    name = options.get("deployment", spec.model.name)
    if not isinstance(name, str) or not DEPLOYMENT_NAME.match(name):
        field = "model.options.deployment" if "deployment" in options else "model.name"
        problems.append(
            (
                field,
                f"{name!r} is no Azure deployment name (2 to 64 letters, digits, '.', '_', '-'); "
                "name the deployment under model.options.deployment",
            )
        )
    kind = options.get("deployment_type", "global")
    if kind not in DEPLOYMENT_TYPES:
        problems.append(
            ("model.options.deployment_type", f"{kind!r} is not one of {DEPLOYMENT_TYPES}")
        )
    zone = options.get("data_zone")
    if kind == "data_zone" and zone not in DATA_ZONES:
        problems.append(
            (
                "model.options.data_zone",
                f"a data_zone deployment names its zone, one of {DATA_ZONES} (the zone of the "
                f"Azure resource's region); got {zone!r}",
            )
        )
    elif kind != "data_zone" and zone is not None:
        problems.append(("model.options.data_zone", "only a data_zone deployment has a data zone"))
    return problems
