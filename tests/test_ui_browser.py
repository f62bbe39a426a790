"""The Dagster UI in headless Chromium: what an operator looks at after a day has run.

`dagster dev` runs on loopback against a fresh instance, `llm-assets run --wait` runs one demo
day into the same instance, and a real browser (Debian's chromium and chromedriver driven by
Selenium; no browser is ever downloaded) opens the support_tickets asset graph, the
materialization metadata of partition 2026-11-02 of validated_outputs and its checks.
Screenshots go to docs/screenshots/ with LLM_ASSETS_SAVE_SCREENSHOTS=1, else to a temporary
folder.
"""

import json
import os
import subprocess
import sys
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

from llm_assets import checks
from llm_assets.demo import DEMO_START
from llm_assets.demo_data import generate_demo_data
from llm_assets.factory import STEPS
from llm_assets.settings import REPO_ROOT
from llm_assets.spec import PipelineSpec, load_specs
from tests.dagster_dev import DagsterDev, dagster_dev

T = TypeVar("T")

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
PIPELINE = "support_tickets"
DAY = DEMO_START.isoformat()
TICKETS = 30
PAGE_TIMEOUT = 90.0
WIDTH = 1920
"""Wide enough for the whole graph to fit at a zoom where Dagster draws full asset nodes."""
SCREENSHOTS_ENV = "LLM_ASSETS_SAVE_SCREENSHOTS"

CHECKS_BY_STEP = {
    "input_snapshot": [checks.SOURCE_ROWS],
    "request_shards": [checks.BUDGET],
    "batch_results": [checks.NO_MISSING_RESULTS, checks.NO_DUPLICATE_RESULTS],
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
    outcome: dict[str, Any]
    """`llm-assets run --json` of the day: job_id, run_ids, succeeded, ..."""
    screenshots: Path
    debug: Path


@pytest.fixture(scope="module")
def ui(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ui]:
    """`dagster dev` on a fresh instance holding one demo day run by `llm-assets run --wait`."""
    tmp = tmp_path_factory.mktemp("ui")
    home, dagster_home = tmp / ".llm_assets", tmp / "dagster"
    dagster_home.mkdir()
    # No telemetry, and no "join the community" dialog over the pages.
    (dagster_home / "dagster.yaml").write_text(
        "telemetry:\n  enabled: false\nnux:\n  enabled: false\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLM_ASSETS_")}
    env |= {"LLM_ASSETS_HOME": str(home), "DAGSTER_HOME": str(dagster_home)}
    [spec] = [s for s in load_specs(REPO_ROOT / "pipelines") if s.name == PIPELINE]
    if os.environ.get(SCREENSHOTS_ENV) == "1":
        screenshots = REPO_ROOT / "docs" / "screenshots"
        screenshots.mkdir(parents=True, exist_ok=True)
    else:
        screenshots = tmp / "screenshots"
        screenshots.mkdir()

    with dagster_dev(env, tmp / "dagster-dev.log") as dev:
        # The sensors would submit the day again and request finish and report runs of their
        # own, which would race the pages: the CLI is the only thing that runs here. Stopped
        # before the data exists, so no sensor tick can have seen it.
        dev.stop_sensors_and_schedules()
        generate_demo_data(home / "demo", start=DEMO_START, days=1, tickets_per_day=TICKETS)
        done = subprocess.run(
            [str(Path(sys.executable).parent / "llm-assets"), "run", PIPELINE, "--date", DAY]
            + ["--wait", "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert done.returncode == 0, f"llm-assets run failed:\n{done.stdout}\n{done.stderr}"
        [outcome] = json.loads(done.stdout)
        assert outcome["done"] and outcome["succeeded"] > 0, outcome
        yield Ui(dev, spec, outcome, screenshots, tmp)


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


def materialization_run(ui: Ui) -> str:
    """The run of the day's latest validated_outputs materialization, as the instance has it."""
    data = ui.dev.graphql(
        "query($key: AssetKeyInput!, $day: String!) { assetOrError(assetKey: $key) { "
        "... on Asset { assetMaterializations(partitions: [$day], limit: 1) { runId } } } }",
        {"key": {"path": [PIPELINE, "validated_outputs"]}, "day": DAY},
    )
    [materialization] = data["assetOrError"]["assetMaterializations"]
    assert materialization["runId"] in ui.outcome["run_ids"], (materialization, ui.outcome)
    return materialization["runId"]


def test_asset_graph_shows_every_step_materialized_with_passing_checks(
    browser: WebDriver, ui: Ui
) -> None:
    open_page(browser, ui, f"/locations/__repository__@llm_assets/asset-groups/{PIPELINE}", 820)
    wait_for(browser, ui, "every step in the graph", lambda b: [graph_node(b, s) for s in STEPS])
    wait_for(browser, ui, "the graph to settle", Settled(lambda b: graph_node(b, "cost_report")))

    def loaded_nodes(b: WebDriver) -> dict[str, tuple[str, set[str]]] | None:
        """Each node's text and linked runs, once every node shows its latest run."""
        nodes = {}
        for step in STEPS:
            node = graph_node(b, step)
            nodes[step] = (node.text, linked_runs(node))
        return nodes if all(runs for _, runs in nodes.values()) else None

    nodes = wait_for(browser, ui, "every node's latest run", loaded_nodes)
    for step, (text, runs) in nodes.items():
        assert runs <= set(ui.outcome["run_ids"]), f"{step}: not the CLI's runs {runs}\n{text}"
        if step in CHECKS_BY_STEP:
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
    shown = checks.QUALITY_FAILURE_RATE
    open_page(
        browser, ui, f"/assets/{PIPELINE}/validated_outputs?view=checks&checkDetail={shown}", 720
    )

    def statuses(b: WebDriver) -> dict[str, str]:
        """The check list: each name with the status of its latest execution below it."""
        return {
            name: b.find_element(
                By.XPATH, f"(//div[@title='{name}'])[1]/following-sibling::span"
            ).text
            for name in names
        }

    def evaluation(b: WebDriver) -> str:
        return b.find_element(
            By.XPATH, "//*[normalize-space()='Evaluation result']/following-sibling::*"
        ).text

    wait_for(browser, ui, "every check's status", lambda b: all(statuses(b).values()))
    wait_for(browser, ui, "the latest evaluation", evaluation)
    wait_for(
        browser, ui, "the page to settle", Settled(lambda b: b.find_element(By.TAG_NAME, "table"))
    )

    assert wait_for(browser, ui, "the statuses", statuses) == dict.fromkeys(names, "Succeeded")
    assert wait_for(browser, ui, "the latest evaluation", evaluation) == "Passed"
    about = wait_for(
        browser, ui, "the page text", lambda b: b.find_element(By.TAG_NAME, "body").text
    )
    assert "This is a blocking asset check." in about
    metadata = wait_for(browser, ui, "the check's metadata", table_rows)
    assert float(metadata["failure_rate"]) == 0
    assert float(metadata["max_failure_rate"]) == ui.spec.quality.max_failure_rate
    assert metadata["valid_rows"] == str(ui.outcome["succeeded"])
    # The evaluation belongs to the day's materialization: it links to the same run.
    assert wait_for(browser, ui, "the run link", linked_runs) == {materialization_run(ui)}
    browser.save_screenshot(str(ui.screenshots / "asset-checks.png"))
