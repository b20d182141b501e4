"""The UIs in a real browser (Debian's headless Chromium through Selenium): the MLflow UI, served by
`mlflow server` on a database holding a finished tiny ablation (TEAMS Table 4, run by the reproduce flow),
lists the ablation's runs with their metrics; the Prefect UI lists the scheduled deployments that
`python flows/deployments.py` created and serves, shows a deployment's next scheduled run at a laptop's width,
and a deployment runs from the server; the ablation's report page and `dvc plots show` read at a laptop's width
with no network (compact cells, footnotes saying why a cell is empty, details on demand, figures offline).
Screenshots go to test-artifacts/ (gitignored).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import pytest
from conftest import ROOT
from ops_helpers import ABLATION, ABLATION_RUNS, BIN, api, flow_env, free_port, stop, wait_http

sys.path.insert(0, str(ROOT / "flows"))
from deployments import DEPLOYMENTS  # noqa: E402

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
SHOTS = ROOT / "test-artifacts"
# The closed network refuses Chromium's background connections: switch them off.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1600,1000",
]
LAPTOP = (1366, 768)  # the pages people read on a laptop must fit its width


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        message = "Debian's chromium and chromium-driver are missing: `make test` installs them (as root)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager: never download a driver
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in CHROMIUM_FLAGS + [f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    SHOTS.mkdir(exist_ok=True)
    yield driver
    driver.quit()


def page_text(driver) -> str:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.TAG_NAME, "body").text


def show(driver, url: str, *expected: str, shot: str, timeout: float = 60) -> str:
    """Open `url`, wait until the page shows every expected text, save a screenshot; the page's text."""
    driver.get("about:blank")  # a URL differing from the current one only after '#' would not reload the app
    driver.get(url)
    deadline = time.monotonic() + timeout
    while True:
        text = page_text(driver)
        missing = [e for e in expected if e not in text]
        if not missing:
            break
        if time.monotonic() > deadline:
            driver.save_screenshot(str(SHOTS / f"FAILED-{shot}"))
            raise AssertionError(f"{url} does not show {missing} after {timeout} s; it shows:\n{text[:3000]}")
        time.sleep(0.5)
    time.sleep(1.0)  # let the last requests render before the picture
    driver.save_screenshot(str(SHOTS / shot))
    return text


# ---- MLflow ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mlflow_ui(ablation, tmp_path_factory):
    project, db, proc = ablation
    assert proc.returncode == 0, proc.stdout[-3000:]
    port = free_port()
    log = tmp_path_factory.mktemp("mlflow-server") / "server.log"
    with open(log, "w") as out:  # the README's command, on the test's database
        server = subprocess.Popen(
            [
                str(BIN / "mlflow"),
                "server",
                "--backend-store-uri",
                f"sqlite:///{db}",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--workers",
                "1",
            ],
            cwd=project,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_http(f"http://127.0.0.1:{port}/health", server, log)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(server)


def test_mlflow_ui_lists_the_ablation_runs_with_their_metrics(mlflow_ui, browser):
    experiment = api(mlflow_ui, "api/2.0/mlflow/experiments/get-by-name?experiment_name=electralab-tiny")
    experiment_id = experiment["experiment"]["experiment_id"]
    table_runs = f"tags.stage = 'pretrain' and tags.tables LIKE '%{ABLATION}%'"
    runs = api(mlflow_ui, "api/2.0/mlflow/runs/search", {"experiment_ids": [experiment_id], "filter": table_runs})[
        "runs"
    ]
    assert sorted(r["info"]["run_name"] for r in runs) == sorted(ABLATION_RUNS)

    # The runs page with the same filter in its search box, as a user narrows it to one table's pretraining: the
    # unfiltered page shows the newest 100 runs, most of them the fine-tuning trials nested under their parents, so
    # how many pretraining runs it lists depends on how many trials the grid ran.
    text = show(
        browser,
        f"{mlflow_ui}/#/experiments/{experiment_id}/runs?{urllib.parse.urlencode({'searchFilter': table_runs})}",
        "electralab-tiny",
        *ABLATION_RUNS,
        shot="mlflow-ablation-runs.png",
    )
    assert "teams_ablation/stsb" not in text and "report-tiny" not in text  # the filter applied: pretraining only
    ids = json.dumps([r["info"]["run_id"] for r in runs])
    compare = (
        f"{mlflow_ui}/#/compare-runs?runs={urllib.parse.quote(ids)}"
        f"&experiments={urllib.parse.quote(json.dumps([experiment_id]))}"
    )
    # Every run's final metrics side by side (the RTD accuracy is what TEAMS Table 4's rows differ in).
    show(
        browser,
        compare,
        f"Comparing {len(ABLATION_RUNS)} Runs",
        "Metrics",
        *ABLATION_RUNS,
        shot="mlflow-ablation-compare.png",
    )
    lines = scrolled_lines(browser, until="final_rtd_acc_replaced", shot="mlflow-ablation-compare-metrics.png")
    for metric in ("final_loss", "final_rtd_acc_replaced", "final_tokens_per_s", "final_params_main"):
        assert metric in lines, metric
    for r in runs:  # each run's value as the page prints it (an integer: no rounding to guess)
        params = next(m["value"] for m in r["data"]["metrics"] if m["key"] == "final_params_main")
        assert str(int(params)) in lines, (r["info"]["run_name"], params)


def test_mlflow_compare_view_shows_the_ablation_table_with_its_medians(mlflow_ui, browser):
    """docs/tracking.md's filter: the report's rows of one table, our medians and the published values."""
    experiment = api(mlflow_ui, "api/2.0/mlflow/experiments/get-by-name?experiment_name=electralab-tiny")
    experiment_id = experiment["experiment"]["experiment_id"]
    rows = api(
        mlflow_ui,
        "api/2.0/mlflow/runs/search",
        {
            "experiment_ids": [experiment_id],
            "filter": f"tags.stage = 'report-row' and tags.report_latest = 'true' and tags.tables = '{ABLATION}'",
        },
    )["runs"]
    assert sorted(next(t["value"] for t in r["data"]["tags"] if t["key"] == "run") for r in rows) == sorted(
        ABLATION_RUNS
    )
    metrics = {m["key"] for r in rows for m in r["data"].get("metrics", [])}
    medians = sorted(k for k in metrics if "/" not in k)
    assert medians and {f"published/{k}" for k in medians} & metrics, metrics  # MINI fine-tunes RTE, STS-B, SQuAD
    ids = json.dumps([r["info"]["run_id"] for r in rows])
    compare = (
        f"{mlflow_ui}/#/compare-runs?runs={urllib.parse.quote(ids)}"
        f"&experiments={urllib.parse.quote(json.dumps([experiment_id]))}"
    )
    show(
        browser,
        compare,
        f"Comparing {len(ABLATION_RUNS)} Runs",
        "Metrics",
        f"{ABLATION} | ",
        shot="mlflow-ablation-table-compare.png",
    )
    lines = scrolled_lines(browser, until=medians[0], shot="mlflow-ablation-table-compare-metrics.png")
    assert medians[0] in lines and f"published/{medians[0]}" in lines, sorted(lines)[:50]


def scrolled_lines(driver, until: str, shot: str) -> set[str]:
    """Every line the compare page's metrics table shows while a mouse wheel scrolls it to the bottom (it
    renders only the rows in view); a screenshot when the row `until` is in view."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.actions.wheel_input import ScrollOrigin
    from selenium.webdriver.common.by import By

    grids = [
        g
        for g in driver.find_elements(By.CSS_SELECTOR, ".ReactVirtualized__Grid")
        if g.value_of_css_property("overflow-y") in ("auto", "scroll")
    ]
    assert grids, "no scrolling table on the compare page"
    table = grids[-1]  # the last one: Metrics
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", table)
    lines: set[str] = set()
    for _ in range(200):
        text = page_text(driver).splitlines()
        if until in text and until not in lines:
            driver.save_screenshot(str(SHOTS / shot))
        lines |= set(text)
        top, height, total = driver.execute_script(
            "return [arguments[0].scrollTop, arguments[0].clientHeight, arguments[0].scrollHeight]", table
        )
        if top + height >= total - 1:
            return lines
        ActionChains(driver).scroll_from_origin(ScrollOrigin.from_element(table), 0, 150).perform()
        time.sleep(0.2)
    raise AssertionError("the metrics table did not reach its end")


# ---- Prefect -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(ablation, prefect_api, tmp_path_factory):
    """`python flows/deployments.py` (the README's command) serving from the ablation's project."""
    project, db, _ = ablation
    env = {**flow_env(project, prefect_api, db), "PREFECT_RUNNER_POLL_FREQUENCY": "2"}
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [str(BIN / "python"), "flows/deployments.py"], cwd=project, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        # Ready = the serving process has polled each of its deployments. Counting deployments is not enough:
        # deployments of the same names may be on this server, not served (the cron test in test_flows.py).
        deadline = time.monotonic() + 120
        while not ready(deployments := api(prefect_api, "deployments/filter", {})):
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, (
                [(d["name"], d.get("status")) for d in deployments],
                log.read_text()[-3000:],
            )
            time.sleep(0.5)
        yield {d["name"]: d for d in deployments}
    finally:
        stop(proc)


def ready(deployments: list[dict]) -> bool:
    return {name for name, *_ in DEPLOYMENTS} <= {d["name"] for d in deployments if d.get("status") == "READY"}


def test_prefect_ui_lists_the_scheduled_deployments(served, prefect_api, browser):
    assert served["nightly-tiny"]["schedules"][0]["schedule"]["cron"] == "0 2 * * *"
    assert served["weekly-small"]["schedules"][0]["schedule"]["cron"] == "0 4 * * 6"
    assert served["weekly-small"]["parameters"] == {"preset": "small"}
    assert served["tiny-one-table"]["schedules"] == []
    ui = prefect_api.removesuffix("/api")
    text = show(
        browser,
        f"{ui}/deployments",
        "nightly-tiny",
        "weekly-small",
        "tiny-one-table",
        "At 02:00 AM every day",
        "At 04:00 AM, only on Saturday",
        "Ready",
        shot="prefect-deployments.png",
    )
    assert "Not Ready" not in text  # "Ready" alone would match it


def test_the_prefect_ui_shows_a_deployments_next_scheduled_run_at_a_laptops_width(served, prefect_api, browser):
    """The schedule view: the server's scheduler has given nightly-tiny its next runs at 02:00 UTC."""
    deployment = served["nightly-tiny"]
    deadline = time.monotonic() + 90
    while not api(
        prefect_api,
        "flow_runs/filter",
        {"flow_runs": {"deployment_id": {"any_": [deployment["id"]]}, "state": {"type": {"any_": ["SCHEDULED"]}}}},
    ):
        assert time.monotonic() < deadline, "the scheduler gave nightly-tiny no scheduled run"
        time.sleep(1)
    ui = prefect_api.removesuffix("/api")
    browser.set_window_size(*LAPTOP)
    try:
        text = show(
            browser,
            f"{ui}/deployments/deployment/{deployment['id']}",
            "nightly-tiny",
            "Next Run",
            "Scheduled for",
            "02:00:00 AM",
            "At 02:00 AM every day",
            "Ready",
            shot="prefect-schedule-laptop.png",
        )
        assert "Not Ready" not in text
        assert fits_width(browser)
    finally:
        browser.set_window_size(1600, 1000)


def fits_width(driver) -> bool:
    """No horizontal scrolling: the page is as wide as the window."""
    scroll, client = driver.execute_script(
        "return [document.documentElement.scrollWidth, document.documentElement.clientWidth]"
    )
    return scroll <= client


def pause_the_schedules(prefect_api: str, served: dict) -> None:
    """Pause the served cron schedules and cancel any run they have started. At 02:00 UTC nightly-tiny fires and
    the served process runs the whole tiny preset in the ablation's project, holding its workspace for far longer
    than a test waits: a CI run that crossed 02:00 failed so. Pausing deletes the scheduled runs."""
    for deployment in served.values():
        if deployment["schedules"]:
            api(prefect_api, f"deployments/{deployment['id']}/pause_deployment", {})

    def unfinished() -> list[dict]:
        return api(
            prefect_api,
            "flow_runs/filter",
            {
                "flow_runs": {
                    "deployment_id": {"any_": [d["id"] for d in served.values()]},
                    "state": {"type": {"any_": ["PENDING", "RUNNING", "CANCELLING"]}},
                }
            },
        )

    for run in unfinished():  # CANCELLING: the serving process stops the run's process, then marks it CANCELLED
        if run["state_type"] != "CANCELLING":
            api(prefect_api, f"flow_runs/{run['id']}/set_state", {"state": {"type": "CANCELLING"}, "force": True})
    deadline = time.monotonic() + 120
    while runs := unfinished():
        assert time.monotonic() < deadline, [(r["name"], r["state_type"]) for r in runs]
        time.sleep(1)


def test_a_deployment_runs_from_the_server_and_the_ui_shows_it(served, prefect_api, browser):
    # What the UI's "Run" button does: a flow run of the deployment, here with its parameters narrowed to one
    # run of the finished ablation (DVC finds it up to date, so the served flow finishes in seconds; a run
    # outside it, `electra`, would be trained and fine-tuned: minutes under load).
    pause_the_schedules(prefect_api, served)
    deployment = served["nightly-tiny"]
    flow_run = api(
        prefect_api,
        f"deployments/{deployment['id']}/create_flow_run",
        {"parameters": {"preset": "tiny", "runs": ["electra_ablation"]}},
    )
    deadline = time.monotonic() + 300
    while (state := api(prefect_api, f"flow_runs/{flow_run['id']}")["state_type"]) not in (
        "COMPLETED",
        "FAILED",
        "CRASHED",
        "CANCELLED",
    ):
        assert time.monotonic() < deadline, state
        time.sleep(1)
    assert state == "COMPLETED"
    ui = prefect_api.removesuffix("/api")
    show(
        browser,
        f"{ui}/flow-runs/flow-run/{flow_run['id']}",
        "tiny: electra_ablation",
        "Completed",
        "pretrain@electra_ablation",
        shot="prefect-deployment-run.png",
    )


# ---- the report and DVC's plots -------------------------------------------------------------------------


def test_the_report_page_is_compact_at_a_laptops_width_says_why_cells_are_empty_and_details_open(ablation, browser):
    from selenium.webdriver.common.by import By

    project, _, proc = ablation
    assert proc.returncode == 0, proc.stdout[-3000:]
    browser.set_window_size(*LAPTOP)
    try:
        text = show(
            browser, (project / "reports" / "index.html").as_uri(), "TEAMS Table 4", "Figures", shot="report-laptop.png"
        )
        assert fits_width(browser)
        # Offline, QQP has no dev split: its cells and every GLUE average say so, and the GLUE AVG panels are gone.
        assert "QQP: no dev split: glue/QQP/dev.tsv is not in the ELECTRALAB_DATA mirror" in text
        assert "GLUE average of all eight GLUE tasks; missing here:" in text
        assert "GLUE AVG panels are left out" in text
        table4 = browser.find_element(By.ID, "teams-table4")
        browser.execute_script("arguments[0].scrollIntoView()", table4)
        details = browser.find_elements(By.CSS_SELECTOR, "details")
        assert details and not any(d.get_attribute("open") for d in details)  # compact by default
        spread = [e for e in browser.find_elements(By.CSS_SELECTOR, "span.spread")]
        assert spread and not any(e.is_displayed() for e in spread)
        time.sleep(0.5)
        browser.save_screenshot(str(SHOTS / "report-laptop-table.png"))
        browser.find_element(By.CSS_SELECTOR, "#teams-table4 ~ details summary").click()  # TEAMS Table 4's details
        time.sleep(0.5)
        assert any(e.is_displayed() for e in browser.find_elements(By.CSS_SELECTOR, "span.spread"))
        browser.save_screenshot(str(SHOTS / "report-laptop-details.png"))
    finally:
        browser.set_window_size(1600, 1000)


def test_dvc_plots_show_offline_draws_the_figures_in_place_of_the_vega_plots(ablation, browser):
    from selenium.webdriver.common.by import By

    project, db, _ = ablation
    proc = subprocess.run([str(BIN / "dvc"), "plots", "show"], cwd=project, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    browser.set_window_size(*LAPTOP)
    try:
        text = show(
            browser,
            (project / "dvc_plots" / "index.html").as_uri(),
            "Offline: Vega",
            "reports/plots/teams_fig4.csv (Vega, offline)",
            shot="dvc-plots-offline-laptop.png",
        )
        assert "cdn.jsdelivr.net" in text
        images = browser.find_elements(By.CSS_SELECTOR, "img")
        drawn = browser.execute_script("return Array.from(document.images).filter(i => i.naturalWidth > 0).length")
        assert len(images) >= 9 and drawn == len(images)  # every figure loaded, none broken
        assert fits_width(browser)
    finally:
        browser.set_window_size(1600, 1000)
