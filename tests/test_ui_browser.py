"""The Dagster UI in headless Chromium: what an operator looks at after days have run.

`dagster dev` runs on loopback against a fresh instance, and `llm-assets run --wait` runs
three days into the same instance: the demo day 2026-11-02 of support_tickets, the empty day
2026-11-03 (no demo rows), and 2026-11-02 of support_tickets_strict, a copy of the spec whose
summaries must be longer than the local model writes for some tickets, so that its quality
gate blocks publication. A real browser (Debian's chromium and chromedriver driven by
Selenium; no browser is ever downloaded) opens the asset graph, the materialization metadata
and checks of validated_outputs, the empty day's failed source_rows check, the skipped
publication and the failed gate check of the strict day, and the day's summary on
cost_report. Screenshots go to docs/screenshots/ with LLM_ASSETS_SAVE_SCREENSHOTS=1, else to
a temporary folder.
"""

import datetime as dt
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from selenium import webdriver
from selenium.common.exceptions import (
    NoSuchElementException,
    StaleElementReferenceException,
    TimeoutException,
)
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.wait import WebDriverWait

from llm_assets import names
from llm_assets.defs import checks
from llm_assets.defs.factory import SKIPPED
from llm_assets.demo.data import generate_demo_data
from llm_assets.demo.run import DEMO_START
from llm_assets.spec.load import load_specs
from llm_assets.spec.model import PipelineSpec
from llm_assets.util.settings import REPO_ROOT
from tests.dagster_dev import DagsterDev, dagster_dev

pytestmark = pytest.mark.slow

T = TypeVar("T")

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
PIPELINE = "support_tickets"
DAY = DEMO_START.isoformat()
EMPTY_DAY = (DEMO_START + dt.timedelta(days=1)).isoformat()
"""The demo data covers DAY alone, so the next day has no source rows."""
STRICT = "support_tickets_strict"
STRICT_MIN_SUMMARY = 190
"""support_tickets_strict's summary.min_length: the local model's extractive summaries of the
shorter demo tickets cannot reach it, so those answers are quality dead letters, more of them
than quality.max_failure_rate allows."""
TICKETS = 30
PAGE_TIMEOUT = 90.0
WIDTH = 1920
"""Wide enough for the whole graph to fit at a zoom where Dagster draws full asset nodes."""
SCREENSHOTS_ENV = "LLM_ASSETS_SAVE_SCREENSHOTS"

CHECKS_BY_STEP = {
    "input_snapshot": [checks.SOURCE_ROWS],
    "request_shards": [checks.BUDGET, checks.COMPLIANCE],
    "batch_results": [
        checks.NO_MISSING_RESULTS,
        checks.NO_DUPLICATE_RESULTS,
        checks.NO_STUCK_BATCHES,
    ],
    "validated_outputs": [
        checks.OUTPUT_SCHEMA,
        checks.QUALITY_FAILURE_RATE,
        checks.OUTPUTS_COMPLETE,
        checks.LOW_CONFIDENCE_SHARE,
        checks.LABEL_DISTRIBUTION_SHIFT,
    ],
    "cost_report": [checks.COST_DRIFT],
}


@pytest.fixture(scope="session")
def chromium() -> tuple[Path, Path]:
    """Debian's chromium and chromedriver, installed with apt when missing (CI runs as root)."""
    if CHROMIUM.exists() and CHROMEDRIVER.exists():
        return CHROMIUM, CHROMEDRIVER
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends"]
    install += ["chromium", "chromium-driver"]
    output = ""
    # A stale package list names versions the mirror no longer has: update, then try again.
    for command in (install, ["apt-get", "update", "-q"], install):
        try:
            done = subprocess.run(
                command, env=env, capture_output=True, text=True, timeout=900, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            pytest.fail(f"could not run `{' '.join(command)}` to install Chromium: {exc}")
        output = done.stdout + done.stderr
        if command is install and done.returncode == 0:
            break
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        pytest.fail(
            f"the UI test needs {CHROMIUM} and {CHROMEDRIVER}, and `apt-get install chromium "
            "chromium-driver` did not provide them (it needs root and Debian's package mirror); "
            f"apt said:\n{output[-3000:]}"
        )
    return CHROMIUM, CHROMEDRIVER


@dataclass(frozen=True)
class Ui:
    dev: DagsterDev
    spec: PipelineSpec
    strict: PipelineSpec
    outcome: dict[str, Any]
    """`llm-assets run --json` of the day: job_id, run_ids, succeeded, ..."""
    empty: dict[str, Any]
    """`llm-assets run --json` of the empty day."""
    blocked: str
    """What `llm-assets run` of the strict day said held it: "blocked by quality_failure_rate
    (23.3% > 5.0%)"."""
    evaluation: dict[str, Any]
    """`llm-assets eval --json` of the demo day: eval_report_partition, run_id, report."""
    screenshots: Path
    debug: Path


def strict_copy(spec_path: Path) -> str:
    """The demo spec as support_tickets_strict, with summaries of at least STRICT_MIN_SUMMARY
    characters."""
    spec = yaml.safe_load(spec_path.read_text())
    spec["name"] = STRICT
    spec["output"]["schema"]["summary"]["min_length"] = STRICT_MIN_SUMMARY
    return yaml.safe_dump(spec, sort_keys=False)


def run_day(env: dict[str, str], pipeline: str, day: str) -> subprocess.CompletedProcess[str]:
    return cli(env, "run", pipeline, "--date", day, "--wait", "--json")


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(sys.executable).parent / "llm-assets"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@pytest.fixture(scope="module")
def ui(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ui]:
    """`dagster dev` on a fresh instance holding the demo day, an empty day and a day whose
    publication the quality gate blocked, each run by `llm-assets run --wait`."""
    tmp = tmp_path_factory.mktemp("ui")
    home, dagster_home, pipelines = tmp / ".llm_assets", tmp / "dagster", tmp / "pipelines"
    dagster_home.mkdir()
    pipelines.mkdir()
    # No telemetry, and no "join the community" dialog over the pages.
    (dagster_home / "dagster.yaml").write_text(
        "telemetry:\n  enabled: false\nnux:\n  enabled: false\n"
    )
    demo_spec = REPO_ROOT / "pipelines" / f"{PIPELINE}.yaml"
    (pipelines / demo_spec.name).write_text(demo_spec.read_text())
    (pipelines / f"{STRICT}.yaml").write_text(strict_copy(demo_spec))
    specs = {s.name: s for s in load_specs(pipelines)}
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLM_ASSETS_")}
    env |= {
        "LLM_ASSETS_HOME": str(home),
        "LLM_ASSETS_PIPELINES": str(pipelines),
        "DAGSTER_HOME": str(dagster_home),
    }
    if os.environ.get(SCREENSHOTS_ENV) == "1":
        screenshots = REPO_ROOT / "docs" / "screenshots"
        screenshots.mkdir(parents=True, exist_ok=True)
    else:
        screenshots = tmp / "screenshots"
        screenshots.mkdir()

    with dagster_dev(env, tmp / "dagster-dev.log") as dev:
        # The sensors would submit the days again and request finish and report runs of their
        # own, which would race the pages: the CLI is the only thing that runs here. Stopped
        # before the data exists, so no sensor tick can have seen it.
        dev.stop_sensors_and_schedules()
        generate_demo_data(home / "demo", start=DEMO_START, days=1, tickets_per_day=TICKETS)

        done = run_day(env, PIPELINE, EMPTY_DAY)
        assert done.returncode == 0, f"llm-assets run failed:\n{done.stdout}\n{done.stderr}"
        [empty] = json.loads(done.stdout)
        assert empty["done"] and empty["no_data"] == f"no source rows for {EMPTY_DAY}", empty

        done = run_day(env, PIPELINE, DAY)
        assert done.returncode == 0, f"llm-assets run failed:\n{done.stdout}\n{done.stderr}"
        [outcome] = json.loads(done.stdout)
        assert outcome["done"] and outcome["succeeded"] > 0, outcome

        done = run_day(env, STRICT, DAY)
        # Exit 2: a gate held the day; the last line says which.
        assert done.returncode == 2, f"llm-assets run:\n{done.stdout}\n{done.stderr}"
        said = done.stderr.strip().splitlines()[-1]
        held = re.fullmatch(r"blocked: quality gate: publication (blocked by .+)", said)
        assert held, done.stderr

        # The demo spec's variants on a sample of the day: a partition of eval_report.
        done = cli(env, "eval", PIPELINE, "--from", DAY, "--to", DAY, "--sample", "10", "--json")
        assert done.returncode == 0, f"llm-assets eval:\n{done.stdout}\n{done.stderr}"
        evaluation = json.loads(done.stdout)
        yield Ui(
            dev=dev,
            spec=specs[PIPELINE],
            strict=specs[STRICT],
            outcome=outcome,
            empty=empty,
            blocked=held[1],
            evaluation=evaluation,
            screenshots=screenshots,
            debug=tmp,
        )


@pytest.fixture(scope="module")
def browser(chromium: tuple[Path, Path], ui: Ui) -> Iterator[WebDriver]:
    binary, driver = chromium
    options = webdriver.ChromeOptions()
    options.binary_location = str(binary)
    for argument in (
        "--headless=new",
        "--no-sandbox",  # root, as in CI
        "--disable-dev-shm-usage",
        "--disable-gpu",
        f"--window-size={WIDTH},1080",
        "--force-device-scale-factor=1",
        "--hide-scrollbars",
        "--lang=en-US",
        "--no-first-run",
        "--disable-extensions",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
    ):
        options.add_argument(argument)
    # With an explicit driver path Selenium Manager (which can download drivers) is not used.
    service = Service(executable_path=str(driver), log_output=str(ui.debug / "chromedriver.log"))
    chrome = webdriver.Chrome(options=options, service=service)
    try:
        chrome.set_page_load_timeout(PAGE_TIMEOUT)
        # Any page of the origin will do to set the UI's preferences: navigation collapsed.
        chrome.get(f"{ui.dev.url}/server_info")
        chrome.execute_script("localStorage.setItem('dagster-nav-collapsed', 'true')")
        yield chrome
    finally:
        chrome.quit()


def open_page(browser: WebDriver, ui: Ui, path: str, height: int) -> None:
    browser.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": WIDTH, "height": height, "deviceScaleFactor": 1, "mobile": False},
    )
    browser.get(f"{ui.dev.url}{path}")


def wait_for(browser: WebDriver, ui: Ui, what: str, probe: Callable[[WebDriver], T]) -> T:
    """Explicit wait for a truthy `probe`; on timeout, fail with a screenshot and the page text.

    The UI re-renders as its live data refreshes, so every read of the page goes through here
    (an element that went stale is looked up again on the next poll)."""
    try:
        return WebDriverWait(
            browser,
            PAGE_TIMEOUT,
            poll_frequency=0.25,
            ignored_exceptions=[NoSuchElementException, StaleElementReferenceException],
        ).until(probe)
    except TimeoutException:
        shot = ui.debug / f"timeout-{'-'.join(what.split())[:60]}.png"
        browser.save_screenshot(str(shot))
        text = browser.find_element(By.TAG_NAME, "body").text
        raise AssertionError(
            f"timed out waiting for {what} on {browser.current_url} (screenshot {shot}); "
            f"the page said:\n{text[-3000:]}\n\ndagster dev log: {ui.dev.log}"
        ) from None


class Settled:
    """True once nothing shows a spinner and `locate`'s element has stopped moving (the graph
    zooms to fit, tables fill in): the moment to read the page and take the screenshot."""

    def __init__(self, locate: Callable[[WebDriver], WebElement]) -> None:
        self.locate = locate
        self.last: dict[str, Any] | None = None

    def __call__(self, browser: WebDriver) -> bool:
        if browser.find_elements(By.CSS_SELECTOR, "[role=progressbar]"):
            self.last = None
            return False
        rect = self.locate(browser).rect
        settled, self.last = rect == self.last, rect
        return settled


def table_rows(browser: WebDriver) -> dict[str, str]:
    """The page's metadata tables: first cell the label, second the value."""
    rows = {}
    for row in browser.find_elements(By.XPATH, "//tr[td]"):
        cells = row.find_elements(By.TAG_NAME, "td")
        if len(cells) >= 2:
            rows[cells[0].text.strip()] = cells[1].text.strip()
    return rows


def linked_runs(scope: WebDriver | WebElement) -> set[str]:
    links = scope.find_elements(By.CSS_SELECTOR, "a[href^='/runs/']")
    return {a.get_dom_attribute("href").split("/")[2].split("?")[0] for a in links}


def graph_node(browser: WebDriver, step: str) -> WebElement:
    """A full asset node of the lineage graph (zoomed out, nodes show the name alone)."""
    return browser.find_element(
        By.XPATH, f"//*[local-name()='foreignObject'][.//div[@data-tooltip='{step}']]"
    )


def materialization_run(ui: Ui, step: str = "validated_outputs") -> str:
    """The run of the day's latest materialization of `step`, as the instance has it."""
    data = ui.dev.graphql(
        "query($key: AssetKeyInput!, $day: String!) { assetOrError(assetKey: $key) { "
        "... on Asset { assetMaterializations(partitions: [$day], limit: 1) { runId } } } }",
        {"key": {"path": [PIPELINE, step]}, "day": DAY},
    )
    [materialization] = data["assetOrError"]["assetMaterializations"]
    assert materialization["runId"] in ui.outcome["run_ids"], (materialization, ui.outcome)
    return materialization["runId"]


def run_status(ui: Ui, run_id: str) -> str:
    data = ui.dev.graphql(
        "query($id: ID!) { runOrError(runId: $id) { ... on Run { status } } }", {"id": run_id}
    )
    return str(data["runOrError"]["status"])


def page_text(browser: WebDriver, ui: Ui) -> str:
    return wait_for(
        browser, ui, "the page text", lambda b: b.find_element(By.TAG_NAME, "body").text
    )


def labelled(b: WebDriver, label: str) -> str:
    """The value under a heading of the check's latest execution ("Evaluation result",
    "Partition")."""
    return b.find_element(By.XPATH, f"//*[normalize-space()='{label}']/following-sibling::*").text


def check_statuses(b: WebDriver, names: list[str]) -> dict[str, str]:
    """The check list: each name with the status of its latest execution below it."""
    return {
        name: b.find_element(By.XPATH, f"(//div[@title='{name}'])[1]/following-sibling::span").text
        for name in names
    }


def open_check(
    browser: WebDriver, ui: Ui, pipeline: str, step: str, check: str, height: int
) -> None:
    """A check in the asset's Checks tab, once every check in the list shows its status and
    the latest execution has loaded."""
    names = CHECKS_BY_STEP[step]
    open_page(browser, ui, f"/assets/{pipeline}/{step}?view=checks&checkDetail={check}", height)
    wait_for(browser, ui, "every check's status", lambda b: all(check_statuses(b, names).values()))
    wait_for(browser, ui, "the latest evaluation", lambda b: labelled(b, "Evaluation result"))
    wait_for(
        browser, ui, "the page to settle", Settled(lambda b: b.find_element(By.TAG_NAME, "table"))
    )


def test_asset_graph_shows_every_step_with_its_checks(browser: WebDriver, ui: Ui) -> None:
    open_page(browser, ui, f"/locations/__repository__@llm_assets/asset-groups/{PIPELINE}", 820)
    wait_for(
        browser, ui, "every step in the graph", lambda b: [graph_node(b, s) for s in names.ASSETS]
    )
    wait_for(browser, ui, "the graph to settle", Settled(lambda b: graph_node(b, "cost_report")))

    def loaded_nodes(b: WebDriver) -> dict[str, tuple[str, set[str]]] | None:
        """Each node's text and linked runs, once every node shows its latest run."""
        nodes = {}
        for step in names.ASSETS:
            node = graph_node(b, step)
            nodes[step] = (node.text, linked_runs(node))
        return nodes if all(runs for _, runs in nodes.values()) else None

    nodes = wait_for(browser, ui, "every node's latest run", loaded_nodes)
    cli_runs = set(ui.outcome["run_ids"]) | set(ui.empty["run_ids"])
    for step, (text, runs) in nodes.items():
        assert runs <= cli_runs, f"{step}: not the CLI's runs {runs}\n{text}"
        if step == "input_snapshot":
            # The empty day's source_rows check failed (WARN): not every day has passed.
            assert "0 / 1 Passed" in text, f"{step}:\n{text}"
        elif step in CHECKS_BY_STEP:
            count = len(CHECKS_BY_STEP[step])
            assert f"{count} / {count} Passed" in text, f"{step}:\n{text}"
        else:
            assert "Passed" not in text and "Failed" not in text, f"{step}:\n{text}"
    browser.save_screenshot(str(ui.screenshots / "asset-graph.png"))


def test_partition_page_shows_the_materialization_metadata(browser: WebDriver, ui: Ui) -> None:
    open_page(
        browser, ui, f"/assets/{PIPELINE}/validated_outputs?view=partitions&partition={DAY}", 1300
    )
    wait_for(browser, ui, "the metadata", lambda b: "quality_failure_rate" in table_rows(b))
    wait_for(
        browser, ui, "the page to settle", Settled(lambda b: b.find_element(By.TAG_NAME, "table"))
    )

    status = wait_for(
        browser,
        ui,
        "the partition's heading",
        lambda b: (
            b.find_element(By.XPATH, f"//div[@data-tooltip='{DAY}']//span[@data-tooltip]").text
        ),
    )
    assert status == "Materialized"
    metadata = wait_for(browser, ui, "the metadata", table_rows)
    assert metadata["pipeline"] == PIPELINE
    assert metadata["prompt_version"] == ui.spec.prompt.version
    assert metadata["model"] == ui.spec.model.name
    assert metadata["provider"] == ui.spec.model.provider
    assert metadata["job_id"] == ui.outcome["job_id"]
    assert metadata["dagster/row_count"] == str(ui.outcome["succeeded"])
    assert metadata["quality_failure_rate"] == "0"
    assert metadata["open_items"] == "0"
    assert wait_for(browser, ui, "the run link", linked_runs) == {materialization_run(ui)}
    browser.save_screenshot(str(ui.screenshots / "partition-metadata.png"))


def test_checks_tab_shows_the_validation_checks_passed(browser: WebDriver, ui: Ui) -> None:
    names = CHECKS_BY_STEP["validated_outputs"]
    open_check(browser, ui, PIPELINE, "validated_outputs", checks.QUALITY_FAILURE_RATE, 720)

    statuses = wait_for(browser, ui, "the statuses", lambda b: check_statuses(b, names))
    assert statuses == dict.fromkeys(names, "Succeeded")
    assert wait_for(browser, ui, "the evaluation", lambda b: labelled(b, "Evaluation result")) == (
        "Passed"
    )
    # Check results are partitioned: the evaluation names its day.
    assert wait_for(browser, ui, "the partition", lambda b: labelled(b, "Partition")) == DAY
    about = page_text(browser, ui)
    # A gate check fails without failing the run; publication is what it holds.
    assert "This is a non-blocking asset check." in about
    assert "Gates publication: quality dead letters stay within quality.max_failure_rate." in about
    metadata = wait_for(browser, ui, "the check's metadata", table_rows)
    assert float(metadata["failure_rate"]) == 0
    assert float(metadata["max_failure_rate"]) == ui.spec.quality.max_failure_rate
    assert metadata["valid_rows"] == str(ui.outcome["succeeded"])
    assert checks.BLOCKS_PUBLICATION not in metadata
    # The evaluation belongs to the day's materialization: it links to the same run.
    assert wait_for(browser, ui, "the run link", linked_runs) == {materialization_run(ui)}
    browser.save_screenshot(str(ui.screenshots / "asset-checks.png"))


def history_rows(b: WebDriver) -> list[tuple[str, str, str, str]]:
    """The check's execution history: (result, its icon, partition, description) per row."""
    rows = []
    for row in b.find_elements(By.XPATH, "//table[.//th[normalize-space()='Partition']]//tr[td]"):
        cells = row.find_elements(By.TAG_NAME, "td")
        icon = cells[0].find_element(By.CSS_SELECTOR, "[role=img]").get_dom_attribute("aria-label")
        rows.append((cells[0].text, icon, cells[3].text, cells[4].text))
    return rows


def test_the_empty_day_fails_its_source_rows_check(browser: WebDriver, ui: Ui) -> None:
    open_check(browser, ui, PIPELINE, "input_snapshot", checks.SOURCE_ROWS, 480)
    browser.find_element(By.XPATH, "//*[normalize-space()='Execution history']").click()
    wait_for(browser, ui, "both days in the history", lambda b: len(history_rows(b)) == 2)
    wait_for(
        browser,
        ui,
        "the history to settle",
        Settled(lambda b: b.find_element(By.TAG_NAME, "table")),
    )

    rows = wait_for(browser, ui, "the history", history_rows)
    # Newest first: the demo day passed after the empty day failed, as a warning.
    assert rows == [
        ("Passed", "check_circle", DAY, "-"),
        ("Failed", "warning_outline", EMPTY_DAY, f"no source rows for {EMPTY_DAY}"),
    ]
    # The list shows the check as failed while one of its days has.
    assert wait_for(
        browser, ui, "the status", lambda b: check_statuses(b, [checks.SOURCE_ROWS])
    ) == {checks.SOURCE_ROWS: "Failed"}
    browser.save_screenshot(str(ui.screenshots / "empty-day.png"))


def skipped_reason(b: WebDriver) -> str:
    return table_rows(b).get(SKIPPED, "")


def test_a_blocked_day_skips_publication_in_a_run_that_succeeded(
    browser: WebDriver, ui: Ui
) -> None:
    limit = ui.strict.quality.max_failure_rate
    assert re.fullmatch(
        rf"blocked by quality_failure_rate \(\d+\.\d% > {limit:.1%}\)", ui.blocked
    ), ui.blocked
    # The partition: never materialized, and no failed run since.
    open_page(
        browser, ui, f"/assets/{STRICT}/published_outputs?view=partitions&partition={DAY}", 600
    )
    wait_for(
        browser,
        ui,
        "the partition's events",
        lambda b: b.find_element(
            By.XPATH, "//button[contains(., 'View all historical events (1)')]"
        ),
    )
    shown = page_text(browser, ui)
    assert "Latest materialization\nNone" in shown, shown
    assert "did not materialize" not in shown, shown

    # The Events tab: the observation that says why.
    open_page(browser, ui, f"/assets/{STRICT}/published_outputs?view=events", 480)
    wait_for(browser, ui, "the observation's metadata", skipped_reason)
    wait_for(
        browser, ui, "the page to settle", Settled(lambda b: b.find_element(By.TAG_NAME, "table"))
    )

    assert wait_for(browser, ui, "the reason", skipped_reason) == ui.blocked
    [run_id] = wait_for(browser, ui, "the run link", linked_runs)
    shown = page_text(browser, ui)
    assert f"Partition {DAY} observed in run {run_id[:8]}" in shown, shown
    assert "did not materialize" not in shown, shown
    assert run_status(ui, run_id) == "SUCCESS"
    browser.save_screenshot(str(ui.screenshots / "blocked-publish.png"))


def test_the_gate_check_shows_what_blocked_the_day(browser: WebDriver, ui: Ui) -> None:
    names = CHECKS_BY_STEP["validated_outputs"]
    shown = checks.QUALITY_FAILURE_RATE
    open_check(browser, ui, STRICT, "validated_outputs", shown, 720)

    statuses = wait_for(browser, ui, "the statuses", lambda b: check_statuses(b, names))
    assert statuses == {**dict.fromkeys(names, "Succeeded"), shown: "Failed"}
    assert wait_for(browser, ui, "the evaluation", lambda b: labelled(b, "Evaluation result")) == (
        "Failed"
    )
    assert wait_for(browser, ui, "the partition", lambda b: labelled(b, "Partition")) == DAY
    metadata = wait_for(browser, ui, "the check's metadata", table_rows)
    assert metadata[checks.BLOCKS_PUBLICATION] == ui.blocked.removeprefix("blocked by ")
    failed, valid = int(metadata["quality_dead_letters"]), int(metadata["valid_rows"])
    rate = failed / (failed + valid)
    assert float(metadata["failure_rate"]) == round(rate, 4)
    limit = ui.strict.quality.max_failure_rate
    assert f"({rate:.1%} > {limit:.1%})" in ui.blocked
    about = page_text(browser, ui)
    assert f"quality failure rate {rate:.1%} is over quality.max_failure_rate {limit:.1%}" in about
    assert "This is a non-blocking asset check." in about
    browser.save_screenshot(str(ui.screenshots / "gate-check-failed.png"))

    # The failure cases, captioned with how many there are.
    browser.find_element(
        By.XPATH, "//tr[td[normalize-space()='failure_cases']]//*[text()='[Show Markdown]']"
    ).click()
    cases = wait_for(
        browser,
        ui,
        "the failure cases",
        lambda b: b.find_element(By.CSS_SELECTOR, "[role=dialog]").text,
    )
    assert cases.startswith(f"failure_cases\nall {failed} quality failures\n"), cases
    too_short = f"String should have at least {STRICT_MIN_SUMMARY} characters"
    assert cases.count("summary.string_too_short") == cases.count(too_short) == failed, cases


def test_cost_report_shows_the_day_summary(browser: WebDriver, ui: Ui) -> None:
    open_page(browser, ui, f"/assets/{PIPELINE}/cost_report?view=partitions&partition={DAY}", 900)
    wait_for(browser, ui, "the day's summary", lambda b: "day_summary" in table_rows(b))
    wait_for(
        browser, ui, "the page to settle", Settled(lambda b: b.find_element(By.TAG_NAME, "table"))
    )

    metadata = wait_for(browser, ui, "the metadata", table_rows)
    run_id = materialization_run(ui, "cost_report")
    outcome = ui.outcome
    assert metadata["outcome"] == "finished"
    summary = metadata["day_summary"].splitlines()
    assert f"{PIPELINE} {DAY}: finished" in summary[0], summary
    assert summary[1].startswith(
        f"{outcome['total']} items: {outcome['succeeded']} succeeded, "
        f"{outcome['dead_letters']} dead letters ("
    ), summary
    assert summary[-1] == f"run {run_id}", summary
    assert not any("publication" in line for line in summary), summary
    as_json = json.loads(metadata["day_summary_json"])
    assert as_json["outcome"] == "finished" and as_json["blocked"] is None, as_json
    assert as_json["run_id"] == run_id and as_json["job_id"] == outcome["job_id"], as_json

    row = browser.find_element(By.XPATH, "//tr[td[normalize-space()='day_summary']]")
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", row)
    wait_for(
        browser,
        ui,
        "the scrolled page to settle",
        Settled(lambda b: b.find_element(By.XPATH, "//tr[td[normalize-space()='day_summary']]")),
    )
    browser.save_screenshot(str(ui.screenshots / "day-summary.png"))


def test_the_blocked_days_summary_names_the_gate(browser: WebDriver, ui: Ui) -> None:
    open_page(browser, ui, f"/assets/{STRICT}/cost_report?view=partitions&partition={DAY}", 900)
    wait_for(browser, ui, "the day's summary", lambda b: "day_summary" in table_rows(b))

    metadata = wait_for(browser, ui, "the metadata", table_rows)
    assert f"publication {ui.blocked}" in metadata["day_summary"].splitlines()
    assert json.loads(metadata["day_summary_json"])["blocked"] == ui.blocked


def test_the_eval_report_partition_shows_the_comparison(browser: WebDriver, ui: Ui) -> None:
    key = ui.evaluation["eval_report_partition"]
    report = ui.evaluation["report"]
    open_page(browser, ui, f"/assets/{PIPELINE}/eval_report?view=partitions&partition={key}", 1500)

    def metadata(b: WebDriver) -> dict[str, str] | None:
        rows = table_rows(b)
        return rows if "recommended" in rows else None

    rows = wait_for(browser, ui, "the eval's metadata", metadata)
    wait_for(
        browser, ui, "the page to settle", Settled(lambda b: b.find_element(By.TAG_NAME, "table"))
    )
    chosen = (report["recommendation"] or {}).get("chosen")
    assert rows["recommended"] == (chosen["name"] if chosen else "none")
    assert rows["sampled_items"] == "10"
    assert rows["eval_id"] == key
    assert rows["scored"] == "category against agent_category (accuracy)"
    names = [variant["name"] for variant in report["variants"]]
    assert names == ["baseline", *ui.spec.variants]
    for name in names:
        assert f"score/{name}" in rows and f"failure_rate/{name}" in rows
    assert wait_for(browser, ui, "the run link", linked_runs) == {ui.evaluation["run_id"]}
    browser.save_screenshot(str(ui.screenshots / "eval-report.png"))
