"""The Dagster UI in headless Chromium: what an operator looks at after `make demo`.

`dagster dev` runs on loopback against a fresh instance, and `llm-assets demo` (what `make
demo` runs) makes its days into the same instance: the demo's days of support_tickets (the
last one cancelled once submitted, requeued and finished), the empty day after them, the
first day blocked by support_tickets_strict's quality gate, and the eval. A real browser
(Debian's chromium and chromedriver driven by Selenium; no browser is ever downloaded) walks
docs/ui.md's tour: the asset graph, the materialization metadata and checks of
validated_outputs, the empty day's failed source_rows check, the skipped publication and the
failed gate check of the strict day, the day's summary on cost_report, the cancelled day's
events and runs, the eval's partition; and the tour's figures are checked against the demo's.
Screenshots go to docs/screenshots/ with LLM_ASSETS_SAVE_SCREENSHOTS=1, else to a temporary
folder.
"""

import json
import os
import re
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
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
from llm_assets.demo.run import DEMO_START
from llm_assets.demo.tour import CANCEL_REASON, STRICT_PIPELINE
from llm_assets.spec.load import load_specs
from llm_assets.spec.model import PipelineSpec
from llm_assets.util.settings import REPO_ROOT
from tests.dagster_dev import DagsterDev, dagster_dev
from tests.demo_run import shared_demo

pytestmark = pytest.mark.slow

T = TypeVar("T")

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
PIPELINE = "support_tickets"
DAY = DEMO_START.isoformat()
STRICT = STRICT_PIPELINE
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
    demo: dict[str, Any]
    """`llm-assets demo --json`: each day's outcome, the cancelled, empty and blocked days and
    the eval."""
    screenshots: Path
    debug: Path

    def day(self, date: str) -> dict[str, Any]:
        """The demo's outcome of the day: job_id, run_ids, succeeded, ..."""
        [outcome] = [d for d in self.demo["days"] if d["date"] == date]
        return outcome

    @property
    def outcome(self) -> dict[str, Any]:
        return self.day(DAY)

    @property
    def empty_day(self) -> str:
        return str(self.demo["empty_day"])

    @property
    def cancelled_day(self) -> str:
        return str(self.demo["cancelled"]["date"])

    @property
    def blocked(self) -> str:
        """What held the strict day: "blocked by quality_failure_rate (26.1% > 5.0%)"."""
        reason = str(self.demo["blocked"]["reason"])
        held = re.fullmatch(r"quality gate: publication (blocked by .+)", reason)
        assert held, reason
        return held[1]


@pytest.fixture(scope="module")
def ui(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ui]:
    """The Dagster webserver over what `make demo` made (tests/demo_run.py): the demo's days
    (the last one cancelled once submitted and requeued), the empty day after them, the first
    day blocked by support_tickets_strict's quality gate, and the eval. No daemon: nothing
    runs but what the demo ran."""
    tmp = tmp_path_factory.mktemp("ui")
    demo = shared_demo(tmp_path_factory)
    specs = {s.name: s for s in load_specs(REPO_ROOT / "pipelines")}
    if os.environ.get(SCREENSHOTS_ENV) == "1":
        screenshots = REPO_ROOT / "docs" / "screenshots"
        screenshots.mkdir(parents=True, exist_ok=True)
    else:
        screenshots = tmp / "screenshots"
        screenshots.mkdir()
    with dagster_dev(demo.env, tmp / "dagster-webserver.log", daemon=False) as dev:
        yield Ui(
            dev=dev,
            spec=specs[PIPELINE],
            strict=specs[STRICT],
            demo=demo.made,
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


def scroll_to_row(browser: WebDriver, ui: Ui, label: str) -> None:
    """The metadata row `label` in the middle of the window, once the page has settled."""
    xpath = f"//tr[td[normalize-space()='{label}']]"
    browser.execute_script(
        "arguments[0].scrollIntoView({block: 'center'})", browser.find_element(By.XPATH, xpath)
    )
    wait_for(
        browser,
        ui,
        "the scrolled page to settle",
        Settled(lambda b: b.find_element(By.XPATH, xpath)),
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
    cli_runs = {run_id for day in ui.demo["days"] for run_id in day["run_ids"]}
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
    # Check results are partitioned: the latest evaluation is the demo's last day, the empty
    # one, which passed with nothing to check rather than being left Skipped.
    empty = ui.empty_day
    assert wait_for(browser, ui, "the partition", lambda b: labelled(b, "Partition")) == empty
    about = page_text(browser, ui)
    assert f"no source rows for {empty}: nothing to check" in about
    # A gate check fails without failing the run; publication is what it holds.
    assert "This is a non-blocking asset check." in about
    assert "Gates publication: quality dead letters stay within quality.max_failure_rate." in about
    browser.save_screenshot(str(ui.screenshots / "asset-checks.png"))

    # Every day's evaluation passed: the days with tickets on their figures.
    browser.find_element(By.XPATH, "//*[normalize-space()='Execution history']").click()
    days = {day["date"] for day in ui.demo["days"]}

    def every_day(b: WebDriver) -> list[tuple[str, str, str, str]] | None:
        rows = history_rows(b)
        return rows if {row[2] for row in rows} == days else None

    rows = wait_for(browser, ui, "every day in the history", every_day)
    assert {result for result, *_ in rows} == {"Passed"}, rows


def history_rows(b: WebDriver) -> list[tuple[str, str, str, str]]:
    """The check's execution history: (result, its icon, partition, description) per row."""
    rows = []
    for row in b.find_elements(By.XPATH, "//table[.//th[normalize-space()='Partition']]//tr[td]"):
        cells = row.find_elements(By.TAG_NAME, "td")
        icon = cells[0].find_element(By.CSS_SELECTOR, "[role=img]").get_dom_attribute("aria-label")
        rows.append((cells[0].text, icon, cells[3].text, cells[4].text))
    return rows


def test_the_empty_day_fails_its_source_rows_check(browser: WebDriver, ui: Ui) -> None:
    open_check(browser, ui, PIPELINE, "input_snapshot", checks.SOURCE_ROWS, 560)
    browser.find_element(By.XPATH, "//*[normalize-space()='Execution history']").click()
    days = {day["date"] for day in ui.demo["days"]}
    wait_for(
        browser, ui, "every day in the history", lambda b: {r[2] for r in history_rows(b)} == days
    )
    wait_for(
        browser,
        ui,
        "the history to settle",
        Settled(lambda b: b.find_element(By.TAG_NAME, "table")),
    )

    # Newest first: the empty day, the demo's last, failed as a warning; every other day
    # passed (the cancelled day twice: its first submission and the requeue's).
    first, *others = wait_for(browser, ui, "the history", history_rows)
    empty = ui.empty_day
    assert first == ("Failed", "warning_outline", empty, f"no source rows for {empty}")
    assert {(result, icon, text) for result, icon, _, text in others} == {
        ("Passed", "check_circle", "-")
    }
    assert sorted(day for _, _, day, _ in others) == sorted([*days - {empty}, ui.cancelled_day])
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
    listed = min(failed, 20)
    caption = f"{listed} of {failed}" if listed < failed else f"all {failed}"
    assert cases.startswith(f"failure_cases\n{caption} quality failures\n"), cases
    min_length = ui.strict.output.output_schema["summary"].min_length
    too_short = f"String should have at least {min_length} characters"
    assert cases.count("summary.string_too_short") == cases.count(too_short) == listed, cases


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

    scroll_to_row(browser, ui, "day_summary")
    browser.save_screenshot(str(ui.screenshots / "day-summary.png"))


def test_the_blocked_days_summary_names_the_gate(browser: WebDriver, ui: Ui) -> None:
    open_page(browser, ui, f"/assets/{STRICT}/cost_report?view=partitions&partition={DAY}", 900)
    wait_for(browser, ui, "the day's summary", lambda b: "day_summary" in table_rows(b))

    metadata = wait_for(browser, ui, "the metadata", table_rows)
    assert f"publication {ui.blocked}" in metadata["day_summary"].splitlines()
    assert json.loads(metadata["day_summary_json"])["blocked"] == ui.blocked


def test_the_eval_report_partition_shows_the_comparison(browser: WebDriver, ui: Ui) -> None:
    key = ui.demo["eval"]["eval_report_partition"]
    report = ui.demo["eval"]["report"]
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
    assert rows["sampled_items"] == str(report["sample_items"]) == str(ui.spec.eval.sample)
    assert rows["eval_id"] == key
    assert rows["scored"] == "category against agent_category (accuracy)"
    names = [variant["name"] for variant in report["variants"]]
    assert names == ["baseline", *ui.spec.variants]
    for name in names:
        assert f"score/{name}" in rows and f"failure_rate/{name}" in rows
    assert wait_for(browser, ui, "the run link", linked_runs) == {ui.demo["eval"]["run_id"]}
    browser.save_screenshot(str(ui.screenshots / "eval-report.png"))


def event_rows(b: WebDriver, day: str) -> list[WebElement]:
    """The Events tab's list: the rows of the day's events, newest first."""
    return b.find_elements(By.XPATH, f"//div[@data-index][.//span[normalize-space()='{day}']]")


def test_the_cancelled_day_keeps_its_cancel_in_the_events(browser: WebDriver, ui: Ui) -> None:
    day = ui.cancelled_day
    assert ui.demo["cancelled"]["cancelled"] > 0
    assert ui.demo["cancelled"]["requeued"] == ui.demo["cancelled"]["cancelled"]
    assert ui.day(day)["open_items"] == 0 and ui.day(day)["dead_letters_by_class"] == {
        "compliance": 1
    }
    open_page(browser, ui, f"/assets/{PIPELINE}/batch_results?view=events", 900)
    # Two imports of the day: the cancelled batches', then the requeued items'.
    rows = wait_for(browser, ui, "the day's two imports", lambda b: event_rows(b, day)[1:])
    rows[-1].click()

    def cancelled(b: WebDriver) -> dict[str, str] | None:
        shown = table_rows(b)
        return shown if shown.get("day_state") == "cancelled" else None

    metadata = wait_for(browser, ui, "the cancelled import's metadata", cancelled)
    wait_for(
        browser, ui, "the page to settle", Settled(lambda b: b.find_element(By.TAG_NAME, "table"))
    )
    assert CANCEL_REASON in metadata["cancelled"], metadata
    requeue = f"`llm-assets requeue {PIPELINE} --date {day} --class cancelled`"
    assert requeue in metadata["cancelled"], metadata
    assert metadata["succeeded"] == "0" and metadata["open_items"] == "0", metadata
    scroll_to_row(browser, ui, "cancelled")
    browser.save_screenshot(str(ui.screenshots / "cancelled-day.png"))


def test_the_runs_of_a_day_are_named_by_what_they_do(browser: WebDriver, ui: Ui) -> None:
    day = ui.cancelled_day
    data = ui.dev.graphql(
        "query($tags: [ExecutionTag!]) { runsOrError(filter: {tags: $tags}) { "
        "... on Runs { results { runId jobName } } } }",
        {"tags": [{"key": "dagster/partition", "value": day}]},
    )
    runs = data["runsOrError"]["results"]
    jobs = [run["jobName"] for run in runs]
    submit, imports = names.submit_job(PIPELINE), names.lifecycle_job(PIPELINE, "import")
    # Newest first: submitted, cancelled and imported, requeued and submitted, imported.
    assert jobs[0] == imports and jobs[-1] == submit and jobs.count(submit) == 2, jobs
    open_page(browser, ui, f"/runs?q%5B0%5D=tag%3Adagster%2Fpartition%3D{day}", 900)

    def shown(b: WebDriver) -> list[str] | None:
        found = re.findall(rf"^{PIPELINE}__\w+$", page_text(b, ui), re.MULTILINE)
        return found if len(found) == len(jobs) else None

    assert wait_for(browser, ui, "the day's runs", shown) == jobs
    browser.save_screenshot(str(ui.screenshots / "day-runs.png"))


def test_the_tour_describes_what_the_demo_made(ui: Ui) -> None:
    """docs/ui.md's figures are the demo's: its days, the cancel, the blocked day, the eval."""
    tour = " ".join((REPO_ROOT / "docs" / "ui.md").read_text().split())
    outcome, cancelled = ui.outcome, ui.demo["cancelled"]
    by_class = ", ".join(
        f"{count} {name}"
        for name, count in sorted(
            outcome["dead_letters_by_class"].items(), key=lambda kv: (-kv[1], kv[0])
        )
    )
    for said in (
        f"blocked: quality gate: publication {ui.blocked}",
        f"{outcome['total']} items: {outcome['succeeded']} succeeded, "
        f"{outcome['dead_letters']} dead letters ({by_class})",
        f"`support_tickets` {ui.cancelled_day}: submitted, cancelled while its batches were in "
        f"flight ({cancelled['cancelled']} items cancelled;",
        f"`support_tickets` {ui.empty_day}: a day the demo data has no tickets for",
        f"the demo's is `{ui.demo['eval']['eval_report_partition']}`",
        f"the eval of the spec's variants on {ui.demo['eval']['report']['sample_items']} tickets",
    ):
        assert said in tour, said
