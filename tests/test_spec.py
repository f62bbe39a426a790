"""Pipeline specs: the shipped examples are valid, and every broken spec is reported precisely.

Each negative test starts from `good_spec()` (a copy of pipelines/support_tickets.yaml, checked
to be valid on its own), changes one thing, and expects the problem on exactly that field of
exactly that file, with a reason that says what is wrong.
"""

import datetime as dt
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import yaml
from click.testing import CliRunner

from llm_assets.cli.main import main
from llm_assets.spec.load import SpecError, SpecProblem, check_specs, load_specs
from llm_assets.spec.model import PipelineSpec
from llm_assets.util.settings import REPO_ROOT

PIPELINES = REPO_ROOT / "pipelines"
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


@pytest.fixture(autouse=True)
def _default_price_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test sees the repo's price table unless it sets an override itself."""
    monkeypatch.delenv("LLM_ASSETS_PRICES", raising=False)


def good_spec() -> dict[str, Any]:
    """A fresh copy of pipelines/support_tickets.yaml as a dict."""
    return {
        "name": "support_tickets",
        "description": "Route support tickets to a category and summarize them.",
        "owner": "team:support_ops",
        "source": {
            "kind": "jsonl",
            "uri": "demo/inbox/*.jsonl",
            "id_field": "ticket_id",
            "date_field": "created_at",
            "fields": ["subject", "body", "channel"],
            "required_fields": ["body"],
        },
        "prompt": {
            "version": "v1",
            "system": "You triage customer support tickets. Return JSON.",
            "template": "Subject: {subject}\n\n{body}",
        },
        "model": {
            "provider": "local",
            "name": "all-MiniLM-L6-v2",
            "max_output_tokens": 200,
            "temperature": 0,
            "options": {
                "label_descriptions": {
                    "billing": "a billing problem about an invoice, a charge or a refund",
                    "technical_issue": "the app crashes, shows an error or does not load",
                    "account_access": "cannot log in, password reset, locked account",
                    "shipping": "a delivery problem, package late, lost parcel",
                    "product_feedback": "a suggestion, feature request or complaint",
                }
            },
        },
        "output": {
            "format": "json",
            "schema": {
                "category": {
                    "type": "str",
                    "isin": [
                        "billing",
                        "technical_issue",
                        "account_access",
                        "shipping",
                        "product_feedback",
                    ],
                },
                "confidence": {"type": "float", "ge": 0, "le": 1},
                "summary": {"type": "str", "min_length": 10, "max_length": 240},
            },
        },
        "quality": {"max_failure_rate": 0.05, "min_confidence": 0.3},
        "sharding": {"max_requests_per_shard": 100, "max_bytes_per_shard": 10_000_000},
        "retry": {"max_attempts": 3},
        "budget": {"max_usd_per_partition": 5.0},
        "partitions": {"start_date": dt.date(2026, 11, 1), "timezone": "UTC"},
        "tags": {"domain": "support"},
    }


def write_spec(folder: Path, spec: dict[str, Any], filename: str = "spec.yaml") -> Path:
    path = folder / filename
    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    return path


def mutated(change: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    spec = good_spec()
    change(spec)
    return spec


def clean(text: str) -> str:
    return ANSI.sub("", text)


def test_shipped_example_specs_are_all_valid() -> None:
    files = sorted([*PIPELINES.glob("*.yaml"), *PIPELINES.glob("*.yml")])
    assert files, f"no example specs in {PIPELINES}"

    specs, problems = check_specs(PIPELINES)

    assert problems == []
    assert sorted(s.path for s in specs) == files
    assert len({s.name for s in specs}) == len(specs)
    assert [s.name for s in load_specs(PIPELINES)] == [s.name for s in specs]


def test_the_support_tickets_example_parses_into_the_documented_shape() -> None:
    specs, problems = check_specs(PIPELINES / "support_tickets.yaml")

    assert problems == []
    [spec] = specs
    assert spec.name == "support_tickets"
    assert spec.model.provider == "local"
    assert spec.prompt.placeholders == ["subject", "body"]
    assert spec.source.non_blank_fields == ["body"]
    assert set(spec.output.output_schema) == {"category", "confidence", "summary"}
    assert spec.partitions.start_date == dt.date(2026, 11, 1)
    assert spec.automation.notify.max_dead_letter_rate == 0.1


def test_the_good_spec_factory_is_valid(tmp_path: Path) -> None:
    path = write_spec(tmp_path, good_spec())

    specs, problems = check_specs(path)

    assert problems == []
    assert [s.name for s in specs] == ["support_tickets"]
    assert specs[0].path == path


def _version(spec: dict[str, Any]) -> str:
    return PipelineSpec.model_validate(spec).prompt_code_version


def test_prompt_code_version_is_deterministic_and_led_by_the_prompt_version(
    tmp_path: Path,
) -> None:
    version = _version(good_spec())

    assert version == _version(good_spec())
    assert version.startswith("v1-")
    [from_file], _ = check_specs(write_spec(tmp_path, good_spec()))
    assert from_file.prompt_code_version == version


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda s: s["prompt"].update(template="{subject}: {body}"), id="template"),
        pytest.param(lambda s: s["prompt"].update(version="v2"), id="prompt-version"),
        pytest.param(lambda s: s["prompt"].update(system="Be terse."), id="system-prompt"),
        pytest.param(lambda s: s["model"].update(name="other-model"), id="model-name"),
        pytest.param(lambda s: s["model"].update(provider="openai"), id="model-provider"),
        pytest.param(lambda s: s["model"].update(temperature=0.7), id="temperature"),
        pytest.param(lambda s: s["model"].update(max_output_tokens=300), id="max-output-tokens"),
        pytest.param(lambda s: s["model"].update(options={}), id="model-options"),
        pytest.param(
            lambda s: s["output"]["schema"]["summary"].update(max_length=120),
            id="schema-constraint",
        ),
        pytest.param(
            lambda s: s["output"]["schema"].update(lang={"type": "str"}), id="schema-new-field"
        ),
        pytest.param(
            lambda s: s["output"]["schema"]["category"]["isin"].append("other"),
            id="schema-labels",
        ),
        pytest.param(lambda s: s["output"]["schema"].pop("confidence"), id="schema-field-removed"),
        pytest.param(lambda s: s["source"]["fields"].append("locale"), id="source-fields"),
        pytest.param(lambda s: s["prompt"].update(cache={}), id="prompt-cache"),
    ],
)
def test_prompt_code_version_changes_with_what_is_sent_to_the_model(
    change: Callable[[dict[str, Any]], Any],
) -> None:
    assert _version(mutated(change)) != _version(good_spec())


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda s: s.update(description="Something else entirely."), id="description"),
        pytest.param(lambda s: s.pop("description"), id="no-description"),
        pytest.param(lambda s: s.update(owner="team:someone_else"), id="owner"),
    ],
)
def test_prompt_code_version_ignores_documentation_only_changes(
    change: Callable[[dict[str, Any]], Any],
) -> None:
    assert _version(mutated(change)) == _version(good_spec())


DROP = object()  # as the value of `setting`: remove the key


def setting(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """A change that sets the dotted key `path` of a spec to `value` (removes it for DROP)."""

    def change(spec: dict[str, Any]) -> None:
        *parents, key = path.split(".")
        for parent in parents:
            spec = spec[parent]
        if value is DROP:
            del spec[key]
        else:
            spec[key] = value

    return change


def problem(name: str, path: str, value: Any, words: list[str], field: str = "") -> Any:
    """A broken spec, `path` set to `value`: reported on `field` (on `path` itself unless
    given) with a reason that holds every one of `words`."""
    return pytest.param((setting(path, value), field or path, words), id=name)


CASES: list[Any] = [
    problem("unknown-provider", "model.provider", "openia", ["unknown provider", "'openia'"]),
    problem(
        "placeholder-not-a-source-field",
        "prompt.template",
        "Subject: {subject}\n{body}\n{customer_name}",
        ["{customer_name}", "not a source field"],
    ),
    problem(
        "placeholder-not-a-plain-name",
        "prompt.template",
        "{subject} {body[0]}",
        ["{body[0]}", "not a plain field name"],
    ),
    problem(
        "isin-on-float",
        "output.schema.confidence.isin",
        ["0.5", "1.0"],
        ["isin", "float"],
        field="output.schema.confidence",
    ),
    problem(
        "empty-isin",
        "output.schema.category.isin",
        [],
        ["isin", "at least one"],
        field="output.schema.category",
    ),
    problem(
        "isin-duplicate",
        "output.schema.category.isin",
        ["billing", "billing"],
        ["isin", "twice"],
        field="output.schema.category",
    ),
    problem(
        "min-length-above-max-length",
        "output.schema.summary",
        {"type": "str", "min_length": 50, "max_length": 5},
        ["min_length 50", "max_length 5"],
    ),
    problem(
        "ge-above-le",
        "output.schema.confidence",
        {"type": "float", "ge": 1, "le": 0},
        ["lower bound", "upper bound"],
    ),
    problem(
        "min-length-on-int",
        "output.schema.votes",
        {"type": "int", "min_length": 1},
        ["min_length", "int"],
    ),
    problem(
        "bounds-on-str",
        "output.schema.summary.ge",
        0,
        ["ge/le/gt/lt", "str"],
        field="output.schema.summary",
    ),
    problem("unknown-field-type", "output.schema.summary.type", "text", ["str"]),
    problem("json-format-without-schema", "output.schema", {}, ["schema"], field="output"),
    problem("unknown-top-level-key", "colour", "red", ["not permitted"]),
    problem("unknown-nested-key", "model.temprature", 0.2, ["not permitted"]),
    problem("missing-model-section", "model", DROP, ["required"]),
    problem("missing-partitions-section", "partitions", DROP, ["required"]),
    problem("missing-nested-field", "source.id_field", DROP, ["required"]),
    problem("wrong-type", "model.max_output_tokens", "lots", ["integer"]),
    problem("temperature-out-of-range", "model.temperature", 5, ["less than or equal to 2"]),
    problem("unknown-source-kind", "source.kind", "xml", ["jsonl"]),
    problem("bad-start-date", "partitions.start_date", "next tuesday", ["date"]),
    problem(
        "model-not-in-price-table",
        "model.name",
        "all-MiniLM-L12-v2",
        ["'all-MiniLM-L12-v2'", "price table"],
    ),
    problem(
        "unknown-timezone",
        "partitions.timezone",
        "Mars/Olympus_Mons",
        ["unknown timezone", "'Mars/Olympus_Mons'"],
    ),
    problem("bad-pipeline-name", "name", "2-support-tickets", ["pattern"]),
    problem(
        "required-field-not-in-fields",
        "source.required_fields",
        ["body", "attachments"],
        ["'attachments'", "not in source.fields"],
    ),
    # Checks of the local provider: outputs it cannot produce and options it does not take.
    problem(
        "local-cannot-produce-int",
        "output.schema.votes",
        {"type": "int", "ge": 0, "le": 5},
        ["local provider", "int"],
    ),
    problem(
        "local-cannot-produce-bool",
        "output.schema.urgent",
        {"type": "bool"},
        ["local provider", "bool"],
    ),
    problem(
        "local-unknown-option",
        "model.options.device",
        "cuda",
        ["'device'", "local provider"],
        field="model.options",
    ),
    problem(
        "local-description-of-unknown-label",
        "model.options.label_descriptions.refund",
        "money back",
        ["'refund'", "not a label"],
        field="model.options.label_descriptions",
    ),
]


class Broken(NamedTuple):
    path: Path
    field: str
    words: list[str]


@pytest.fixture(params=CASES)
def broken(request: pytest.FixtureRequest, tmp_path: Path) -> Broken:
    """One of CASES written as a spec file, with the field and the words it must be reported by."""
    change, field, words = request.param
    return Broken(write_spec(tmp_path, mutated(change)), field, words)


def test_each_problem_names_its_file_field_and_reason(broken: Broken) -> None:
    specs, problems = check_specs(broken.path)

    assert problems, "the broken spec was accepted"
    assert {p.file for p in problems} == {str(broken.path)}
    assert {p.field for p in problems} == {broken.field}, problems
    assert any(all(w.lower() in p.reason.lower() for w in broken.words) for p in problems), problems
    with pytest.raises(SpecError):
        load_specs(broken.path)


def test_load_specs_raises_with_the_same_problems(broken: Broken) -> None:
    _, expected = check_specs(broken.path)

    with pytest.raises(SpecError) as raised:
        load_specs(broken.path.parent)

    assert raised.value.problems == expected
    assert f"{broken.path}: {broken.field}: " in str(raised.value)


def test_a_spec_that_fails_to_parse_is_not_returned(tmp_path: Path) -> None:
    write_spec(tmp_path, mutated(lambda s: s["model"].update(max_output_tokens="lots")), "a.yaml")
    write_spec(tmp_path, mutated(lambda s: s.update(name="other")), "b.yaml")

    specs, problems = check_specs(tmp_path)

    assert [s.name for s in specs] == ["other"]
    assert [(Path(p.file).name, p.field) for p in problems] == [
        ("a.yaml", "model.max_output_tokens")
    ]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        pytest.param("name: x\nsource: [unclosed\n", ["yaml"], id="unclosed-flow"),
        pytest.param("name: x\n  indented: wrong\n", ["yaml"], id="bad-indent"),
        pytest.param("- name: x\n- name: y\n", ["mapping"], id="top-level-list"),
        pytest.param("", ["mapping"], id="empty-file"),
        pytest.param("just a string\n", ["mapping"], id="top-level-scalar"),
    ],
)
def test_invalid_yaml_is_one_problem_on_the_file(
    tmp_path: Path, text: str, words: list[str]
) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text(text, encoding="utf-8")

    specs, problems = check_specs(path)

    assert specs == []
    assert len(problems) == 1
    [problem] = problems
    assert problem.file == str(path)
    assert problem.field == "-"
    assert all(w in problem.reason.lower() for w in words), problem.reason


def test_a_missing_path_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"

    with pytest.raises(SpecError) as raised:
        check_specs(missing)

    assert raised.value.problems == [
        SpecProblem(file=str(missing), field="-", reason="no such file or folder")
    ]


def test_duplicate_pipeline_names_name_the_second_file_and_mention_the_first(
    tmp_path: Path,
) -> None:
    first = write_spec(tmp_path, good_spec(), "a_first.yaml")
    second = write_spec(tmp_path, mutated(lambda s: s.update(description="a copy")), "b_second.yml")

    specs, problems = check_specs(tmp_path)

    assert [s.path for s in specs] == [first]
    assert len(problems) == 1
    [problem] = problems
    assert problem.file == str(second)
    assert problem.field == "name"
    assert "'support_tickets'" in problem.reason
    assert str(first) in problem.reason


def test_distinct_pipeline_names_in_one_folder_are_all_loaded(tmp_path: Path) -> None:
    write_spec(tmp_path, good_spec(), "a.yaml")
    write_spec(tmp_path, mutated(lambda s: s.update(name="support_tickets_v2")), "b.yml")
    (tmp_path / "notes.txt").write_text("not a spec", encoding="utf-8")

    specs = load_specs(tmp_path)

    assert [s.name for s in specs] == ["support_tickets", "support_tickets_v2"]


def test_every_semantic_problem_in_one_file_is_reported(tmp_path: Path) -> None:
    def break_everything(s: dict[str, Any]) -> None:
        s["prompt"]["template"] = "{subject} {customer_name}"
        s["source"]["required_fields"] = ["body", "attachments"]
        s["partitions"]["timezone"] = "Mars/Olympus_Mons"
        s["output"]["schema"]["votes"] = {"type": "int", "ge": 0, "le": 5}
        s["model"]["options"]["device"] = "cuda"

    path = write_spec(tmp_path, mutated(break_everything))

    _, problems = check_specs(path)

    assert {p.file for p in problems} == {str(path)}
    reported = {p.field: p.reason for p in problems}
    assert set(reported) == {
        "prompt.template",
        "source.required_fields",
        "partitions.timezone",
        "output.schema.votes",
        "model.options",
    }
    assert "{customer_name}" in reported["prompt.template"]
    assert "'attachments'" in reported["source.required_fields"]
    assert "Mars/Olympus_Mons" in reported["partitions.timezone"]
    assert "'device'" in reported["model.options"]


def test_every_schema_problem_in_one_file_is_reported(tmp_path: Path) -> None:
    def break_everything(s: dict[str, Any]) -> None:
        s["colour"] = "red"
        s.pop("partitions")
        s["model"]["max_output_tokens"] = "lots"
        s["output"]["schema"]["confidence"]["isin"] = ["high", "low"]
        s["output"]["schema"]["summary"].update(min_length=50, max_length=5)
        s["name"] = "bad name!"

    path = write_spec(tmp_path, mutated(break_everything))

    _, problems = check_specs(path)

    assert {p.file for p in problems} == {str(path)}
    assert sorted(p.field for p in problems) == sorted(
        [
            "colour",
            "partitions",
            "model.max_output_tokens",
            "output.schema.confidence",
            "output.schema.summary",
            "name",
        ]
    )


def test_problems_in_every_file_of_a_folder_are_reported(tmp_path: Path) -> None:
    a = write_spec(tmp_path, mutated(lambda s: s["model"].update(provider="openia")), "a.yaml")
    b = write_spec(
        tmp_path,
        mutated(lambda s: (s.update(name="b"), s["partitions"].update(timezone="Nowhere/X"))),
        "b.yaml",
    )
    c = tmp_path / "c.yaml"
    c.write_text("name: [oops\n", encoding="utf-8")
    write_spec(tmp_path, mutated(lambda s: s.update(name="fine")), "d.yaml")

    specs, problems = check_specs(tmp_path)

    assert [(p.file, p.field) for p in problems] == [
        (str(a), "model.provider"),
        (str(b), "partitions.timezone"),
        (str(c), "-"),
    ]
    # Specs that parse are returned even with semantic problems; `c` did not parse.
    assert sorted(s.name for s in specs) == ["b", "fine", "support_tickets"]


def _write_prices(folder: Path, provider: str, name: str) -> Path:
    path = folder / "my_prices.yaml"
    table = {
        "prices_as_of": "2026-12-01",
        "models": [
            {
                "provider": provider,
                "name": name,
                "input_per_mtok": 0.05,
                "output_per_mtok": 0.4,
                "batch_discount": 0.5,
                "context_window": 400000,
            }
        ],
    }
    path.write_text(yaml.safe_dump(table), encoding="utf-8")
    return path


def test_a_price_override_lets_a_spec_use_a_new_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = write_spec(
        tmp_path, mutated(lambda s: s["model"].update(provider="openai", name="gpt-9-nano"))
    )
    _, without = check_specs(spec)
    assert [p.reason for p in without if p.field == "model.name"], without
    assert "'gpt-9-nano'" in next(p.reason for p in without if p.field == "model.name")

    monkeypatch.setenv("LLM_ASSETS_PRICES", str(_write_prices(tmp_path, "openai", "gpt-9-nano")))
    _, with_override = check_specs(spec)

    assert [p for p in with_override if p.field == "model.name"] == []
    assert len(with_override) == len(without) - 1


def test_the_local_provider_runs_only_its_one_model_even_when_priced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "LLM_ASSETS_PRICES", str(_write_prices(tmp_path, "local", "all-MiniLM-L12-v2"))
    )
    path = write_spec(tmp_path, mutated(lambda s: s["model"].update(name="all-MiniLM-L12-v2")))

    _, problems = check_specs(path)

    assert [p.field for p in problems] == ["model.name"]
    assert "price table" not in problems[0].reason
    assert "all-MiniLM-L6-v2" in problems[0].reason
    assert "'all-MiniLM-L12-v2'" in problems[0].reason


@pytest.mark.parametrize(
    ("provider", "model", "prompt", "expected"),
    [
        ("anthropic", "claude-sonnet-4-5", {"cache": {"ttl": "1h", "prime": True}}, []),
        ("openai", "gpt-4o-mini", {"cache": {}}, []),
        ("openai", "gpt-4o-mini", {"cache": {"ttl": "1h"}}, ["prompt.cache.ttl"]),
        ("gemini", "gemini-2.5-flash", {"cache": {"ttl": "1h"}}, ["prompt.cache.ttl"]),
        ("local", "all-MiniLM-L6-v2", {"cache": {}}, ["prompt.cache"]),
        ("anthropic", "claude-sonnet-4-5", {"cache": {}, "system": " "}, ["prompt"]),
        ("anthropic", "claude-sonnet-4-5", {"cache": {"ttl": "2h"}}, ["prompt.cache.ttl"]),
    ],
)
def test_a_prompt_cache_needs_a_system_prompt_and_a_provider_that_caches(
    tmp_path: Path, provider: str, model: str, prompt: dict[str, Any], expected: list[str]
) -> None:
    def change(spec: dict[str, Any]) -> None:
        spec["model"] = {"provider": provider, "name": model}
        spec["prompt"].update(prompt)

    _, problems = check_specs(write_spec(tmp_path, mutated(change)))

    assert [p.field for p in problems if p.field.startswith("prompt")] == expected


def _cli(*args: str) -> Any:
    return CliRunner().invoke(main, ["validate-spec", *args])


def test_cli_accepts_the_shipped_examples() -> None:
    result = _cli(str(PIPELINES))

    assert result.exit_code == 0, clean(result.output)
    out = clean(result.stdout)
    assert "ok " in out
    assert "support_tickets" in out
    assert "error" not in clean(result.stderr)


def test_cli_accepts_a_good_spec_file(tmp_path: Path) -> None:
    path = write_spec(tmp_path, good_spec())

    result = _cli(str(path))

    assert result.exit_code == 0, clean(result.output)
    # rich wraps the "ok" line at the console width, so compare with whitespace collapsed
    assert f"ok {path}: pipeline support_tickets" in " ".join(clean(result.stdout).split())


def test_cli_reports_a_broken_spec_and_exits_1(tmp_path: Path) -> None:
    path = write_spec(
        tmp_path, mutated(lambda s: s["partitions"].update(timezone="Mars/Olympus_Mons"))
    )

    result = _cli(str(path))

    assert result.exit_code == 1, clean(result.output)
    err = clean(result.stderr)
    assert f"error {path}: partitions.timezone: unknown timezone 'Mars/Olympus_Mons'" in err
    assert "1 problem(s)" in err
    assert "ok " not in clean(result.stdout)


def test_cli_prints_every_problem_of_a_folder(tmp_path: Path) -> None:
    write_spec(tmp_path, good_spec(), "a.yaml")
    b = write_spec(
        tmp_path,
        mutated(
            lambda s: (
                s.update(name="b"),
                s["model"].update(provider="openia"),
                s["source"].update(required_fields=["attachments"]),
            )
        ),
        "b.yaml",
    )

    result = _cli(str(tmp_path))

    assert result.exit_code == 1, clean(result.output)
    lines = [line for line in clean(result.stderr).splitlines() if line.startswith("error ")]
    assert len(lines) == 2
    assert any(line.startswith(f"error {b}: model.provider: ") for line in lines)
    assert any(line.startswith(f"error {b}: source.required_fields: ") for line in lines)
    assert "2 problem(s)" in clean(result.stderr)


def test_cli_reports_a_missing_path(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.yaml"

    result = _cli(str(missing))

    assert result.exit_code == 1
    assert f"error {missing}: -: no such file or folder" in clean(result.stderr)


def test_cli_defaults_to_llm_assets_pipelines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_spec(tmp_path, mutated(lambda s: s.update(colour="red")))
    monkeypatch.setenv("LLM_ASSETS_PIPELINES", str(tmp_path))

    result = _cli()

    assert result.exit_code == 1, clean(result.output)
    assert f"error {path}: colour: " in clean(result.stderr)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            lambda s: s["model"].update(max_output_tokens="lots"),
            ["model.max_output_tokens: ", "integer"],
        ),
        # The provider checks run in a fresh process too (they are not registered on import).
        (
            lambda s: s["model"].update(provider="openia"),
            ["model.provider: unknown provider 'openia'"],
        ),
    ],
    ids=["broken_spec", "provider_checks"],
)
def test_the_installed_entry_point_in_a_fresh_process_exits_non_zero(
    tmp_path: Path, change: Any, expected: list[str]
) -> None:
    script = Path(sys.executable).parent / "llm-assets"
    assert script.exists(), f"the llm-assets entry point is not installed next to {sys.executable}"
    path = write_spec(tmp_path, mutated(change))
    env = {k: v for k, v in os.environ.items() if k not in ("LLM_ASSETS_PRICES", "FORCE_COLOR")}

    done = subprocess.run(
        [str(script), "validate-spec", str(path)],
        capture_output=True,
        text=True,
        env={**env, "NO_COLOR": "1", "COLUMNS": "200"},
        timeout=300,
        check=False,
    )

    assert done.returncode == 1, done.stderr
    assert f"error {path}: {expected[0]}" in clean(done.stderr)
    assert all(text in clean(done.stderr) for text in expected[1:])


def test_the_code_location_in_a_fresh_process_runs_the_provider_checks(tmp_path: Path) -> None:
    write_spec(tmp_path, mutated(lambda s: s["model"].update(provider="openia")))
    env = {k: v for k, v in os.environ.items() if k != "LLM_ASSETS_PRICES"}
    env.update(LLM_ASSETS_HOME=str(tmp_path), LLM_ASSETS_PIPELINES=str(tmp_path))

    done = subprocess.run(
        [sys.executable, "-c", "import llm_assets.definitions"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )

    assert done.returncode != 0
    assert "model.provider: unknown provider 'openia'" in done.stderr


def test_an_unknown_provider_does_not_hide_other_problems(tmp_path: Path) -> None:
    def change(spec: dict[str, Any]) -> None:
        spec["model"]["provider"] = "openia"
        spec["partitions"]["timezone"] = "Mars/Olympus"

    _, problems = check_specs(write_spec(tmp_path, mutated(change)))

    assert {p.field for p in problems} == {"model.provider", "partitions.timezone"}


@pytest.mark.parametrize("template", ["{} {body}", "{0} {body}"])
def test_positional_placeholders_are_reported(tmp_path: Path, template: str) -> None:
    _, problems = check_specs(
        write_spec(tmp_path, mutated(lambda s: s["prompt"].update(template=template)))
    )

    assert [p.field for p in problems] == ["prompt.template"]


@pytest.mark.parametrize(
    ("field", "reason"),
    [
        ({"type": "int", "isin": ["low", "high"]}, "not of the field's type"),
        ({"type": "str", "isin": [True, False]}, "not of the field's type"),
        ({"type": "float", "gt": 1, "lt": 1}, "no value fits"),
        ({"type": "float", "ge": 1, "lt": 1}, "no value fits"),
    ],
)
def test_constraints_no_value_can_meet_are_reported(
    tmp_path: Path, field: dict[str, Any], reason: str
) -> None:
    _, problems = check_specs(
        write_spec(tmp_path, mutated(lambda s: s["output"]["schema"].update(extra=field)))
    )

    assert any(p.field.startswith("output.schema.extra") and reason in p.reason for p in problems)


def test_a_path_key_in_yaml_is_an_unknown_key(tmp_path: Path) -> None:
    _, problems = check_specs(write_spec(tmp_path, mutated(lambda s: s.update(path="x"))))

    assert [(p.field, p.reason) for p in problems] == [("path", "Extra inputs are not permitted")]


def test_an_empty_folder_is_a_problem(tmp_path: Path) -> None:
    _, problems = check_specs(tmp_path)

    assert [p.reason for p in problems] == ["no pipeline specs (*.yaml, *.yml) here"]


def test_cli_prints_paths_with_brackets_verbatim(tmp_path: Path) -> None:
    folder = tmp_path / "[draft]"
    folder.mkdir()
    path = write_spec(folder, mutated(lambda s: s["partitions"].update(timezone="Mars/X")))

    result = _cli(str(path))

    assert result.exit_code == 1
    assert str(path) in clean(result.output)


def test_the_dead_letter_alert_keeps_loading_under_its_old_name(tmp_path: Path) -> None:
    """`automation.notify.max_error_rate` is the deprecated name of max_dead_letter_rate: a
    spec that uses it loads, with a warning naming the new one; both at once is a problem."""
    old = mutated(lambda s: s.update(automation={"notify": {"max_error_rate": 0.02}}))
    with pytest.warns(FutureWarning, match="rename it to max_dead_letter_rate"):
        [spec] = load_specs(write_spec(tmp_path, old))
    assert spec.automation.notify.max_dead_letter_rate == 0.02
    assert spec.quality.max_failure_rate == 0.05  # the quality gate is another setting

    both = mutated(
        lambda s: s.update(
            automation={"notify": {"max_error_rate": 0.02, "max_dead_letter_rate": 0.1}}
        )
    )
    _, problems = check_specs(write_spec(tmp_path, both, "both.yaml"))
    assert [p.field for p in problems] == ["automation.notify"]
    assert "max_error_rate is its old name" in problems[0].reason
