"""Every provider adapter by the name a spec gives in `model.provider`.

Adding a provider is one adapter module and one entry in `ADAPTERS`. `provider_spec_problems`
is one of the spec checks (spec/load.py lists it), so the spec model never imports an
adapter. This module imports every adapter (and with them Dagster and the SDK wrappers):
import processes that only parse result lines never need it.
"""

from llm_assets.resources.pricing import load_price_table
from llm_assets.resources.providers.anthropic_batch import AnthropicBatchProvider
from llm_assets.resources.providers.base import BatchProvider
from llm_assets.resources.providers.bedrock import BedrockBatchProvider
from llm_assets.resources.providers.gemini_batch import GeminiBatchProvider
from llm_assets.resources.providers.local import LocalProvider
from llm_assets.resources.providers.online import OnlineProvider
from llm_assets.resources.providers.openai_batch import OpenAIBatchProvider
from llm_assets.spec.model import PipelineSpec

ADAPTERS: dict[str, type[BatchProvider]] = {
    "local": LocalProvider,
    "openai": OpenAIBatchProvider,
    "anthropic": AnthropicBatchProvider,
    "bedrock": BedrockBatchProvider,
    "gemini": GeminiBatchProvider,
    "online": OnlineProvider,
}
PROVIDERS: tuple[str, ...] = tuple(ADAPTERS)
"""The provider names a spec may use."""


def provider_spec_problems(spec: PipelineSpec) -> list[tuple[str, str]]:
    """An unknown provider; else a model missing from the price table (cost must never be a
    silent zero) and what the chosen adapter cannot serve.

    An adapter's spec checks read only the spec, never its own settings, so they run on an
    adapter built without them (no key, folder or endpoint needed to validate a spec).
    """
    adapter = ADAPTERS.get(spec.model.provider)
    if adapter is None:
        return [("model.provider", f"unknown provider {spec.model.provider!r}; one of {PROVIDERS}")]
    problems: list[tuple[str, str]] = []
    if load_price_table().find(spec.model.provider, spec.model.name) is None:
        problems.append(
            (
                "model.name",
                f"model {spec.model.name!r} has no entry for provider "
                f"{spec.model.provider!r} in the price table; add it to the price table "
                "(see docs) so cost is never a silent zero",
            )
        )
    problems.extend(adapter.model_construct().spec_problems(spec))
    return problems
