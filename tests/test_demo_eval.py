"""The demo pipeline's evaluation sections: its variants and its `eval`, scored against the
agent's filing of each ticket (`agent_category`), a column no prompt of any variant holds."""

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from llm_assets.demo.data import generate_demo_data
from llm_assets.demo.run import DEMO_PIPELINE, DEMO_START
from llm_assets.evaluation.variants import resolve_variants
from llm_assets.items.prepare import render
from llm_assets.resources.providers.base import RequestItem
from llm_assets.resources.providers.local import LocalProvider
from llm_assets.spec.load import check_specs
from llm_assets.spec.model import PipelineSpec
from llm_assets.util.settings import REPO_ROOT

DEMO_SPEC = REPO_ROOT / "pipelines" / f"{DEMO_PIPELINE}.yaml"
FILED = "filed-by-the-agent"
"""An agent_category no ticket's words hold, so finding it in a request means it leaked."""


@pytest.fixture(autouse=True)
def _default_price_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LLM_ASSETS_PRICES", raising=False)


def _checked(tmp_path: Path, data: dict[str, Any]) -> tuple[list[PipelineSpec], list[str]]:
    folder = tmp_path / "specs"
    folder.mkdir(exist_ok=True)
    (folder / DEMO_SPEC.name).write_text(yaml.safe_dump(data, sort_keys=False))
    specs, problems = check_specs(folder)
    return specs, [f"{p.field}: {p.reason}" for p in problems]


def test_the_demo_spec_validates_with_its_variants_and_eval(tmp_path: Path) -> None:
    data = yaml.safe_load(DEMO_SPEC.read_text())
    (spec,), problems = _checked(tmp_path, data)
    assert problems == []
    assert list(spec.variants) == ["terse_labels", "body_only"]
    assert spec.eval.reference_field == "agent_category"
    assert spec.eval.min_score is not None and spec.eval.price_as
    variants = resolve_variants(spec, None)
    assert list(variants) == ["baseline", "terse_labels", "body_only"]
    # Each variant changes what the local provider answers from: its label phrases or its text.
    assert "label_descriptions" not in variants["terse_labels"].model.options
    assert "subject" not in variants["body_only"].prompt.placeholders


def test_no_variant_sends_the_agents_category(tmp_path: Path) -> None:
    data = yaml.safe_load(DEMO_SPEC.read_text())
    (spec,), _ = _checked(tmp_path, data)
    generated = generate_demo_data(tmp_path / "demo", DEMO_START, days=1, tickets_per_day=5)
    rows = map(json.loads, generated.files[0].read_text().splitlines())
    row = {**next(r for r in rows if "agent_category" in r), "agent_category": FILED}
    provider = LocalProvider(state_dir=str(tmp_path / "local_provider"))
    for name, variant in resolve_variants(spec, None).items():
        reference = variant.eval.reference_field
        assert (
            reference not in variant.source.fields and reference not in variant.prompt.placeholders
        )
        user = render(variant, row)
        line = provider.request_line(
            variant, RequestItem(custom_id=name, system=variant.prompt.system, user=user)
        )
        assert row["body"] in user
        assert FILED not in json.dumps(line, ensure_ascii=False), name


@pytest.mark.parametrize("where", ["prompt", "variant"])
def test_a_template_naming_the_reference_field_does_not_validate(
    tmp_path: Path, where: str
) -> None:
    data = yaml.safe_load(DEMO_SPEC.read_text())
    template = "{subject}\n\n{body}\n\nfiled as {agent_category}"
    if where == "prompt":
        data["prompt"]["template"] = template
        field = "prompt.template"
    else:
        data["variants"]["body_only"]["prompt"]["template"] = template
        field = "variants.body_only.prompt.template"
    _, problems = _checked(tmp_path, data)
    assert any(p.startswith(f"{field}:") and "eval.reference_field" in p for p in problems), (
        problems
    )
