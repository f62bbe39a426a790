"""The Dagster code location: `llm_assets.definitions:defs`."""

import dagster as dg

from llm_assets.factory import build_pipeline_assets
from llm_assets.resources import build_resources
from llm_assets.sensors import build_batch_status_sensor
from llm_assets.settings import Settings
from llm_assets.spec import PipelineSpec, load_specs


def build_definitions(
    settings: Settings, specs: list[PipelineSpec] | None = None
) -> dg.Definitions:
    """Every pipeline spec under LLM_ASSETS_PIPELINES becomes an asset group."""
    specs = load_specs(settings.pipelines_dir) if specs is None else specs
    assets = [asset for spec in specs for asset in build_pipeline_assets(spec, settings)]
    sensors = [build_batch_status_sensor(spec) for spec in specs]
    return dg.Definitions(assets=assets, sensors=sensors, resources=build_resources(settings))


defs = build_definitions(Settings.from_env())
