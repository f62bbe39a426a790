"""The code location loads: in process and through `dagster definitions validate`."""

import os
import sys
from pathlib import Path

import dagster as dg

from llm_assets import names
from llm_assets.definitions import build_definitions
from llm_assets.util.settings import REPO_ROOT, Settings
from tests.eval_harness import run_command


def test_every_spec_becomes_a_partitioned_group_of_the_design_steps(tmp_path: Path) -> None:
    settings = Settings.from_env({"LLM_ASSETS_HOME": str(tmp_path)})
    defs = build_definitions(settings)

    graph = defs.resolve_asset_graph()
    keys = {key.to_user_string() for key in graph.get_all_asset_keys()}
    assert {f"support_tickets/{step}" for step in names.ASSETS} <= keys
    for step in names.ASSETS:
        node = graph.get(dg.AssetKey(["support_tickets", step]))
        assert node.group_name == "support_tickets"
        assert isinstance(node.partitions_def, dg.DailyPartitionsDefinition)
    upstream = graph.get(dg.AssetKey(["support_tickets", "batch_results"])).parent_keys
    assert upstream == {dg.AssetKey(["support_tickets", "provider_batches"])}
    # Evals: one partition per eval, in a group of their own, and the job that runs them.
    evals = graph.get(dg.AssetKey(["support_tickets", "eval_report"]))
    assert evals.group_name == "support_tickets__evals"
    assert isinstance(evals.partitions_def, dg.DynamicPartitionsDefinition)
    assert defs.get_job_def("support_tickets__eval") is not None


def test_dagster_definitions_validate_passes_on_the_workspace(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "LLM_ASSETS_HOME": str(tmp_path / "home"),
        "DAGSTER_HOME": str(tmp_path / "dagster"),
    }
    (tmp_path / "dagster").mkdir()
    dagster = Path(sys.executable).parent / "dagster"
    validate = [str(dagster), "definitions", "validate", "-w", "workspace.yaml"]
    result = run_command(validate, env, timeout=300, cwd=REPO_ROOT)

    assert result.returncode == 0, result.stdout + result.stderr
    assert "llm_assets" in result.stdout + result.stderr


def test_a_broken_spec_folder_fails_the_code_location_with_the_problem(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("name: x\n")
    settings = Settings.from_env(
        {"LLM_ASSETS_HOME": str(tmp_path), "LLM_ASSETS_PIPELINES": str(tmp_path)}
    )
    try:
        build_definitions(settings)
    except Exception as exc:
        assert "bad.yaml" in str(exc)
        assert "source" in str(exc)
    else:
        raise AssertionError("a broken spec must not load")
