"""Every provider adapter by the name a spec gives in `model.provider`.

Adding a provider is one adapter module and one entry in `ADAPTERS`. `provider_spec_problems`
is one of the spec checks (spec/load.py lists it), so the spec model never imports an
adapter. An adapter's module (with Dagster and its SDK wrapper) is imported when the adapter
is asked for: a command about one pipeline loads one adapter, and processes that only parse
result lines load none.
"""

import importlib
from typing import TYPE_CHECKING

from llm_assets.resources.pricing import load_price_table
from llm_assets.spec.model import PipelineSpec

if TYPE_CHECKING:
    from llm_assets.resources.providers.base import BatchProvider

ADAPTERS: dict[str, str] = {
    "local": "llm_assets.resources.providers.local:LocalProvider",
    "openai": "llm_assets.resources.providers.openai_batch:OpenAIBatchProvider",
    "anthropic": "llm_assets.resources.providers.anthropic_batch:AnthropicBatchProvider",
    "bedrock": "llm_assets.resources.providers.bedrock:BedrockBatchProvider",
    "gemini": "llm_assets.resources.providers.gemini_batch:GeminiBatchProvider",
    "azure_openai": "llm_assets.resources.providers.azure_openai:AzureOpenAIBatchProvider",
    "online": "llm_assets.resources.providers.online:OnlineProvider",
}
"""Each provider name a spec may use, and where its adapter class is."""
PROVIDERS: tuple[str, ...] = tuple(ADAPTERS)
"""The provider names a spec may use."""


def adapter_class(provider: str) -> "type[BatchProvider]":
    """The adapter of a provider named in `ADAPTERS` (KeyError for any other name)."""
    module, name = ADAPTERS[provider].split(":")
    adapter: type[BatchProvider] = getattr(importlib.import_module(module), name)
    return adapter


def provider_spec_problems(spec: PipelineSpec) -> list[tuple[str, str]]:
    """An unknown provider; else a model no price source knows (cost must never be a silent
    zero), with the closest names the sources know, and what the chosen adapter cannot serve.

    An adapter's spec checks read only the spec, never its own settings, so they run on an
    adapter built without them (no key, folder or endpoint needed to validate a spec).
    """
    if spec.model.provider not in ADAPTERS:
        return [("model.provider", f"unknown provider {spec.model.provider!r}; one of {PROVIDERS}")]
    problems: list[tuple[str, str]] = []
    table = load_price_table()
    if table.find(spec.model.provider, spec.model.name) is None:
        why = table.missing(spec.model.provider, spec.model.name)
        problems.append(
            ("model.name", f"no price for {spec.model.provider} model {spec.model.name!r}: {why}")
        )
    adapter = adapter_class(spec.model.provider)
    problems.extend(_cache_problems(spec, adapter.prompt_cache))
    problems.extend(adapter.model_construct().spec_problems(spec))
    return problems


def _cache_problems(spec: PipelineSpec, how: str | None) -> list[tuple[str, str]]:
    """`prompt.cache` against what the provider can do: nothing where it caches nothing; no
    lifetime but its own where it caches by itself."""
    cache = spec.prompt.cache
    provider = spec.model.provider
    if cache is None:
        return []
    if how is None:
        return [
            (
                "prompt.cache",
                f"{provider} has no prompt cache a spec can ask for; leave prompt.cache out "
                "(anthropic caches a marked prefix; openai and gemini cache a long shared "
                "prefix by themselves)",
            )
        ]
    if how == "automatic" and cache.ttl != "5m":
        return [
            (
                "prompt.cache.ttl",
                f"{provider} caches a shared prefix by itself and keeps it as long as it "
                f"chooses; ttl {cache.ttl} applies to anthropic only, leave ttl out",
            )
        ]
    return []
