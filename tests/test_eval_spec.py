"""The evaluation sections of a spec and `promote`.

A variant is a merge patch over the baseline's model and prompt; its merged spec is checked
like any spec, and each of its problems is reported as `variants.<name>.<field>`. `promote`
prints the change that makes a variant the baseline and writes it only with `--write`.
"""

import copy
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from llm_assets.evaluation.promote import PREVIOUS, ChangedSince, plan_promotion
from llm_assets.evaluation.spec import ModelPatch, PromptPatch, diff_patch, merge_patch
from llm_assets.evaluation.variants import failure_rate_limit, scored_field, variant_spec
from llm_assets.spec.load import check_specs
from llm_assets.spec.model import ModelSpec, PipelineSpec, PromptSpec
from tests.eval_harness import run_command
from tests.harness import CLI
from tests.test_spec import good_spec, write_spec

TERSE_SYSTEM = "Triage the ticket. Answer JSON."


@pytest.fixture(autouse=True)
def _default_price_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LLM_ASSETS_PRICES", raising=False)


def remote_spec(**extra: Any) -> dict[str, Any]:
    """The good spec on OpenAI with two variants: a cheaper model and a terser prompt."""
    spec = good_spec()
    spec["model"] = {
        "provider": "openai",
        "name": "gpt-4o",
        "max_output_tokens": 200,
        "temperature": 0,
        "options": {"reasoning_effort": "low", "endpoint": "/v1/chat/completions"},
    }
    spec["variants"] = {
        "mini": {"model": {"name": "gpt-4.1-mini", "options": {"endpoint": None}}},
        "terse": {"description": "a shorter system prompt", "prompt": {"system": TERSE_SYSTEM}},
    }
    spec.update(extra)
    return spec


def problems_of(tmp_path: Path, spec: dict[str, Any]) -> list[tuple[str, str]]:
    _, problems = check_specs(write_spec(tmp_path, spec))
    return [(p.field, p.reason) for p in problems]


def fields_of(tmp_path: Path, spec: dict[str, Any]) -> list[str]:
    return [field for field, _ in problems_of(tmp_path, spec)]


def loaded(tmp_path: Path, spec: dict[str, Any]) -> PipelineSpec:
    specs, problems = check_specs(write_spec(tmp_path, spec))
    assert problems == []
    return specs[0]


def test_a_spec_with_two_variants_loads(tmp_path: Path) -> None:
    spec = loaded(tmp_path, remote_spec())

    assert list(spec.variants) == ["mini", "terse"]
    assert spec.variants["terse"].description == "a shorter system prompt"
    assert spec.model.name == "gpt-4o"  # the baseline runs as before


def test_a_variant_merges_over_the_baseline(tmp_path: Path) -> None:
    spec = loaded(tmp_path, remote_spec())

    mini = variant_spec(spec, "mini")
    terse = variant_spec(spec, "terse")

    assert mini.model.name == "gpt-4.1-mini"
    assert mini.model.provider == "openai" and mini.model.max_output_tokens == 200
    # options merge key by key; null removes one
    assert mini.model.options == {"reasoning_effort": "low"}
    assert mini.prompt == spec.prompt
    assert terse.prompt.system == TERSE_SYSTEM
    assert terse.prompt.template == spec.prompt.template and terse.model == spec.model
    for merged in (mini, terse):
        assert merged.variants == {}
        assert merged.source == spec.source and merged.output == spec.output
        assert merged.budget == spec.budget and merged.eval == spec.eval
        assert merged.name == spec.name and merged.path == spec.path
    with pytest.raises(KeyError, match="no variant 'fast'"):
        variant_spec(spec, "fast")


def test_the_patch_models_cover_every_field_of_model_and_prompt() -> None:
    assert set(ModelPatch.model_fields) == set(ModelSpec.model_fields)
    assert set(PromptPatch.model_fields) == set(PromptSpec.model_fields)


def test_merge_and_diff_patches_are_inverse() -> None:
    old = {"name": "a", "options": {"x": 1, "y": {"z": 2}}, "temperature": 0}
    new = {"name": "b", "options": {"y": {"z": 3}, "w": 4}, "max_output_tokens": 9}

    assert merge_patch(old, diff_patch(old, new)) == new
    assert merge_patch(new, diff_patch(new, old)) == old
    assert diff_patch(old, old) == {}
    assert old == {"name": "a", "options": {"x": 1, "y": {"z": 2}}, "temperature": 0}


@pytest.mark.parametrize(
    ("variant", "field", "words"),
    [
        ({"model": {"provider": "openia"}}, "variants.bad.model.provider", "unknown provider"),
        ({"model": {"name": "gpt-9"}}, "variants.bad.model.name", "price table"),
        ({"model": {"temperature": 5}}, "variants.bad.model.temperature", "less than or equal"),
        ({"model": {"nmae": "gpt-4o"}}, "variants.bad.model.nmae", "Extra inputs"),
        ({"model": {"name": None}}, "variants.bad.model.name", "required"),
        (
            {"prompt": {"template": "{subject} {locale}"}},
            "variants.bad.prompt.template",
            "{locale} is not a source field",
        ),
        (
            # the local provider cannot serve the baseline's reasoning_effort
            {
                "model": {
                    "provider": "local",
                    "name": "all-MiniLM-L6-v2",
                    "options": {"endpoint": None},
                }
            },
            "variants.bad.model.options",
            "unknown option",
        ),
        ({"prompt": {"version": ""}}, "variants.bad.prompt.version", "at least 1"),
        ({"model": {"name": "gpt-4o"}}, "variants.bad", "changes nothing"),
        ({}, "variants.bad", "changes nothing"),
    ],
)
def test_an_invalid_variant_is_a_problem_of_its_own_field(
    tmp_path: Path, variant: dict[str, Any], field: str, words: str
) -> None:
    problems = problems_of(tmp_path, remote_spec(variants={"bad": variant}))

    assert [f for f, _ in problems] == [field]
    assert words in problems[0][1]


@pytest.mark.parametrize(
    ("name", "words"), [("Fast", "must match"), ("baseline", "pipeline's own"), ("a" * 33, "match")]
)
def test_variant_names_are_short_lower_case_and_not_baseline(
    tmp_path: Path, name: str, words: str
) -> None:
    spec = remote_spec(variants={name: {"model": {"name": "gpt-4.1-mini"}}})

    problems = problems_of(tmp_path, spec)

    assert [f for f, _ in problems] == [f"variants.{name}.[key]"]
    assert words in problems[0][1]


def test_a_baseline_problem_is_reported_once_not_for_every_variant(tmp_path: Path) -> None:
    spec = remote_spec()
    spec["automation"] = {"schedule": "every morning"}

    assert fields_of(tmp_path, spec) == ["automation.schedule"]


def test_variants_do_not_change_the_baselines_code_version(tmp_path: Path) -> None:
    plain = loaded(tmp_path, good_spec())
    (tmp_path / "more").mkdir()
    evaluated = good_spec()
    evaluated["variants"] = {"concise": {"prompt": {"version": "v2", "system": TERSE_SYSTEM}}}
    evaluated["eval"] = {"reference_field": "human_label", "sample": 50, "min_score": 0.8}
    with_variants = loaded(tmp_path / "more", evaluated)

    assert with_variants.prompt_code_version == plain.prompt_code_version
    assert variant_spec(with_variants, "concise").prompt_code_version.startswith("v2-")


def test_a_reference_field_outside_the_source_fields_is_fine(tmp_path: Path) -> None:
    spec = loaded(tmp_path, remote_spec(eval={"reference_field": "human_label"}))

    assert spec.eval.reference_field == "human_label"
    assert "human_label" not in spec.prompt.placeholders


def test_a_reference_field_listed_but_not_required_is_fine(tmp_path: Path) -> None:
    spec = remote_spec(eval={"reference_field": "human_label"})
    spec["source"]["fields"].append("human_label")  # required_fields is [body]

    assert problems_of(tmp_path, spec) == []


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        (
            lambda s: s["prompt"].update(template="{subject} {body} {human_label}"),
            "prompt.template",
            "gold answer is never sent",
        ),
        (
            lambda s: s["variants"]["terse"]["prompt"].update(template="{body} {human_label}"),
            "variants.terse.prompt.template",
            "gold answer is never sent",
        ),
        (
            lambda s: s["eval"].update(reference_field="ticket_id"),
            "eval.reference_field",
            "source.id_field",
        ),
        (
            lambda s: s["source"].pop("required_fields"),
            "eval.reference_field",
            "input dead letters",
        ),
    ],
)
def test_reference_field_rules(tmp_path: Path, change: Any, field: str, words: str) -> None:
    spec = remote_spec(eval={"reference_field": "human_label"})
    spec["source"]["fields"].append("human_label")
    change(spec)

    problems = [p for p in problems_of(tmp_path, spec) if p[0] == field]

    assert len(problems) == 1, problems_of(tmp_path, spec)
    assert words in problems[0][1]


def test_price_as_entries_must_be_in_the_price_table(tmp_path: Path) -> None:
    good = ["openai/gpt-4.1-mini", "anthropic/claude-haiku-4-5"]
    assert loaded(tmp_path, remote_spec(eval={"price_as": good})).eval.price_as == good

    unknown = problems_of(tmp_path, remote_spec(eval={"price_as": [*good, "openai/gpt-9"]}))
    twice = problems_of(tmp_path, remote_spec(eval={"price_as": [good[0], good[0]]}))
    shape = problems_of(tmp_path, remote_spec(eval={"price_as": ["gpt-4.1-mini"]}))

    assert [f for f, _ in unknown] == ["eval.price_as.2"]
    assert "'openai/gpt-9' has no price: neither the price table nor genai-prices" in unknown[0][1]
    assert [f for f, _ in twice] == ["eval.price_as.1"]
    assert [f for f, _ in shape] == ["eval.price_as.0"]
    assert "provider/model" in shape[0][1]


def test_eval_numbers_are_checked_and_defaults_resolved(tmp_path: Path) -> None:
    assert fields_of(tmp_path, remote_spec(eval={"min_score": 1.5})) == ["eval.min_score"]
    assert fields_of(tmp_path, remote_spec(eval={"sample": 0})) == ["eval.sample"]

    spec = loaded(tmp_path, remote_spec())
    assert spec.eval.sample == 200
    assert failure_rate_limit(spec) == spec.quality.max_failure_rate == 0.05
    stricter = loaded(tmp_path, remote_spec(eval={"max_failure_rate": 0.01}))
    assert failure_rate_limit(stricter) == 0.01


def test_the_scored_field_defaults_to_the_label_and_must_be_an_output_field(
    tmp_path: Path,
) -> None:
    assert scored_field(loaded(tmp_path, remote_spec())) == "category"
    summary = loaded(tmp_path, remote_spec(eval={"field": "summary"}))
    assert scored_field(summary) == "summary"

    unknown = problems_of(tmp_path, remote_spec(eval={"field": "label"}))
    assert [f for f, _ in unknown] == ["eval.field"]
    assert "not an output field" in unknown[0][1]

    no_labels = remote_spec()
    no_labels["output"]["schema"]["category"].pop("isin")
    ambiguous = problems_of(tmp_path, no_labels)
    assert [f for f, _ in ambiguous] == ["eval.field"]
    assert "category, confidence, summary" in ambiguous[0][1]
    no_labels.pop("variants")
    assert problems_of(tmp_path, no_labels) == []  # nothing is evaluated, nothing to score


def test_plan_promotion_falls_back_to_a_full_dump_it_says_so(tmp_path: Path) -> None:
    path = write_spec(tmp_path, remote_spec())
    path.write_text("---\n# the support spec\n" + path.read_text(), encoding="utf-8")
    [spec], _ = check_specs(path)

    promotion = plan_promotion(spec, "mini")

    assert not promotion.comments_kept
    assert "# the support spec" not in promotion.new_text
    assert yaml.safe_load(promotion.new_text)["model"]["name"] == "gpt-4.1-mini"
    assert promotion.problems() == []
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left


def test_a_promotion_is_not_written_over_a_file_edited_since(tmp_path: Path) -> None:
    path = write_spec(tmp_path, remote_spec())
    [spec], _ = check_specs(path)
    promotion = plan_promotion(spec, "terse")
    edited = path.read_text(encoding="utf-8") + "# edited meanwhile\n"
    path.write_text(edited, encoding="utf-8")

    with pytest.raises(ChangedSince, match="changed since"):
        promotion.write()

    assert path.read_text(encoding="utf-8") == edited
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


SPEC_TEXT = """\
# Support tickets, evaluated against a cheaper model.
{body}
# What an eval replays.
variants:
  # The cheaper model.
  mini:
    model: {{name: gpt-4.1-mini}}
  # A shorter system prompt.
  terse:
    prompt:
      system: {terse}
eval:
  price_as: [openai/gpt-4.1-mini]  # what the same tokens would cost there
"""


def spec_folder(tmp_path: Path, spec: dict[str, Any]) -> Path:
    """A pipelines folder with `spec` written by hand: comments above and beside keys."""
    folder = tmp_path / "pipelines"
    folder.mkdir()
    body = copy.deepcopy(spec)
    body.pop("variants", None)
    body["model"] = {"provider": "openai", "name": "gpt-4o", "max_output_tokens": 200}
    text = SPEC_TEXT.format(body=yaml.safe_dump(body, sort_keys=False).rstrip(), terse=TERSE_SYSTEM)
    (folder / "support_tickets.yaml").write_text(text, encoding="utf-8")
    return folder


def promote(tmp_path: Path, folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LLM_ASSETS_HOME": str(tmp_path / "home")}
    env["LLM_ASSETS_PIPELINES"] = str(folder)
    env.pop("LLM_ASSETS_PRICES", None)
    return run_command([CLI, "promote", "support_tickets", *args], env, timeout=120)


def test_promote_prints_the_change_and_writes_nothing(tmp_path: Path) -> None:
    folder = spec_folder(tmp_path, good_spec())
    path = folder / "support_tickets.yaml"
    before = path.read_bytes()

    done = promote(tmp_path, folder, "mini")

    assert done.returncode == 0, done.stderr
    assert path.read_bytes() == before
    assert sorted(p.name for p in folder.iterdir()) == [path.name]
    diff = done.stdout.splitlines()
    assert diff[:2] == [f"--- {path}", f"+++ {path}"]
    assert "-  name: gpt-4o" in diff and "+  name: gpt-4.1-mini" in diff
    assert "-  mini:" in diff and "+  previous:" in diff
    assert "-  # The cheaper model." in diff
    assert "nothing written" in done.stderr and "--write" in done.stderr


def test_promote_write_makes_the_variant_the_baseline(tmp_path: Path) -> None:
    folder = spec_folder(tmp_path, good_spec())
    path = folder / "support_tickets.yaml"
    [old], _ = check_specs(path)

    done = promote(tmp_path, folder, "mini", "--write")

    assert done.returncode == 0, done.stderr
    [new], problems = check_specs(path)
    assert problems == []
    assert new.model == variant_spec(old, "mini").model
    assert new.prompt == old.prompt
    assert list(new.variants) == ["terse", PREVIOUS]
    rolled_back = variant_spec(new, PREVIOUS)
    assert (rolled_back.model, rolled_back.prompt) == (old.model, old.prompt)
    assert variant_spec(new, "terse").prompt.system == TERSE_SYSTEM
    text = path.read_text()
    for kept in ("# Support tickets,", "# A shorter system prompt.", "# what the same tokens"):
        assert kept in text
    assert "# The cheaper model." not in text
    assert sorted(p.name for p in folder.iterdir()) == [path.name]

    back = promote(tmp_path, folder, PREVIOUS, "--write")

    assert back.returncode == 0, back.stderr
    [restored], problems = check_specs(path)
    assert problems == []
    assert (restored.model, restored.prompt) == (old.model, old.prompt)
    assert variant_spec(restored, PREVIOUS).model == new.model
    assert restored.variants[PREVIOUS].description == "the baseline before the rollback"


def test_promote_reminds_to_bump_the_prompt_version(tmp_path: Path) -> None:
    folder = spec_folder(tmp_path, good_spec())

    done = promote(tmp_path, folder, "terse")

    assert done.returncode == 0, done.stderr
    assert "+  system: Triage the ticket. Answer JSON." in done.stdout.splitlines()
    assert "prompt.system changes but prompt.version stays 'v1'" in done.stderr
    assert "bump prompt.version (e.g. to 'v2')" in done.stderr


def test_promote_write_refuses_a_spec_that_would_not_validate(tmp_path: Path) -> None:
    spec = good_spec()
    folder = spec_folder(tmp_path, spec)
    path = folder / "support_tickets.yaml"
    text = path.read_text().replace(
        "# What an eval replays.\nvariants:\n",
        "variants:\n  claude:\n    model: {provider: anthropic, name: claude-haiku-4-5}\n",
    )
    path.write_text(text)

    done = promote(tmp_path, folder, "claude", "--write")

    # over the new baseline, `mini` would mean anthropic/gpt-4.1-mini
    assert done.returncode == 1
    assert "variants.mini.model.name" in done.stderr
    assert "nothing written" in done.stderr
    assert path.read_text() == text
    assert sorted(p.name for p in folder.iterdir()) == [path.name]


def test_promote_an_unknown_variant_is_an_error(tmp_path: Path) -> None:
    folder = spec_folder(tmp_path, good_spec())

    done = promote(tmp_path, folder, "fast")

    assert done.returncode == 1
    assert "no variant 'fast'" in done.stderr and "mini, terse" in done.stderr
