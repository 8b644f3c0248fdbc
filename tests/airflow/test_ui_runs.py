"""Two of the three ways people run the DAG, done in a browser as a person would, against the real deployment
(``harness/cluster.py``: api-server, scheduler, Celery workers, PostgreSQL, Redis, S3 behind the 503 proxy): trigger
a build with params from Airflow's form, then retry its failed rank from the run's Grid. Headless Chromium;
screenshots of each step go to ``test-artifacts/``. (The third way, the schedule, is
``tests/airflow/test_schedule.py``.)

The failure is injected by a test fixture (``tests/faults``: rank 1 fails its first attempt on the default
worker), never by a switch in production code."""

from __future__ import annotations

import json
import shutil

import fsspec
import pytest

from harness.cluster import ROOT, Cluster, services_missing
from tests.support.browser import full_page_screenshot
from tests.support.paths import SAMPLE_CORPUS, SAMPLE_TOKENIZER
from tokenization.builds.config import BuildConfig
from tokenization.builds.run import Build
from tokenization.output.runs import folder_for
from tokenization.records import BuildRecord

reason = services_missing() or (
    None if shutil.which("chromium") and shutil.which("chromedriver") else "chromium and chromedriver are absent"
)
pytestmark = [
    pytest.mark.skipif(reason is not None, reason=f"browser test on the distributed deployment: {reason}"),
    pytest.mark.long,
]

DAG = "tokenize_corpus"
ARTIFACTS = ROOT / "test-artifacts"
FORM = {"num_ranks": "3", "seed": "4321"}


@pytest.fixture
def browser():
    from selenium import webdriver

    options = webdriver.ChromeOptions()
    chromium = shutil.which("chromium")
    assert chromium is not None  # the module is skipped without it
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(shutil.which("chromedriver")))
    try:
        yield driver
    except BaseException:
        driver.save_screenshot(str(ARTIFACTS / "ui-failure.png"))  # where the browser was when the test failed
        raise
    finally:
        driver.quit()


def test_trigger_from_the_form_then_clear_the_failed_rank_in_the_grid(tmp_path, monkeypatch, browser) -> None:
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, 90)
    # The UI re-renders as the run moves on: an element found a moment ago may be gone, so find it again.
    again = WebDriverWait(browser, 90, ignored_exceptions=(WebDriverException,))

    def enabled(by: str, selector: str):
        """The element, once it is enabled: a disabled button ignores a click, and the Clear dialog's Confirm is
        disabled until its dry run has answered (clicked before, the run waited forever)."""
        return again.until(lambda driver: (element := driver.find_element(by, selector)).is_enabled() and element)

    def click(by: str, selector: str) -> None:
        again.until(lambda driver: enabled(by, selector).click() or True)

    def button(text: str, scope: str = "") -> tuple[str, str]:
        return By.XPATH, f"{scope}//button[normalize-space(.)='{text}']"

    with Cluster(tmp_path / "cluster", fail_ranks="1") as cluster:
        endpoint = json.loads(cluster.env()["AIRFLOW_CONN_AWS_DEFAULT"])["extra"]["endpoint_url"]
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        s3 = fsspec.filesystem(
            "s3", key="testing", secret="testing", client_kwargs={"endpoint_url": endpoint}, skip_instance_cache=True
        )
        s3.mkdir("corpus")  # the default output's bucket
        cluster.api("PATCH", f"/dags/{DAG}?update_mask=is_paused", {"is_paused": False})

        # Log in, open the DAG, open Trigger, set num_ranks and seed, submit.
        browser.get(f"{cluster.url}/auth/login")
        wait.until(ec.presence_of_element_located((By.NAME, "username"))).send_keys("admin")
        browser.find_element(By.NAME, "password").send_keys(cluster.password)
        click(By.CSS_SELECTOR, "button[type=submit]")
        wait.until(ec.url_changes(f"{cluster.url}/auth/login"))
        browser.get(f"{cluster.url}/dags/{DAG}")
        click(By.CSS_SELECTOR, "button[aria-label='Trigger Dag']")
        for name, value in FORM.items():
            field = wait.until(ec.element_to_be_clickable((By.NAME, f"element_{name}")))
            field.send_keys(Keys.CONTROL, "a")
            field.send_keys(value)
        full_page_screenshot(browser, ARTIFACTS / "ui-trigger-form.png")
        click(*button("Trigger", "//*[@role='dialog']"))

        def manual_runs() -> list[dict]:
            return cluster.api("GET", f"/dags/{DAG}/dagRuns?run_type=manual")["dag_runs"]

        cluster.wait_for(manual_runs, 60, "the run the form triggered")
        (run,) = manual_runs()
        run_id = run["dag_run_id"]

        def states() -> dict[tuple[str, int], dict]:
            return {(t["task_id"], t["map_index"]): t for t in cluster.task_instances(DAG, run_id)}

        def waiting_on_the_failed_rank() -> bool:
            ti = states()
            sensor = ti.get(("wait_for_shards", -1), {}).get("state")
            return ti.get(("tokenize", 1), {}).get("state") == "failed" and sensor == "deferred"

        cluster.wait_for(waiting_on_the_failed_rank, 400, "rank 1 to fail and the sensor to wait")

        # Open the run's Grid, select the failed rank-1, Clear, confirm. The rank's page loads after the click, and
        # until it has, the Clear button there is the run's, whose dialog would clear every task: so only the
        # rank's dialog is confirmed, and when another opened, the steps are taken again, as a person would.
        confirm = button("Confirm", "//*[@role='dialog'][.//*[starts-with(normalize-space(.), 'Clear Task Instance')]]")
        soon = WebDriverWait(browser, 30, ignored_exceptions=(WebDriverException,))
        for attempt in range(3):
            browser.get(f"{cluster.url}/dags/{DAG}/runs/{run_id}")
            wait.until(ec.presence_of_element_located((By.XPATH, "//a[normalize-space(.)='rank-1']")))
            full_page_screenshot(browser, ARTIFACTS / "ui-grid-failed-rank.png")
            click(By.XPATH, "//a[normalize-space(.)='rank-1']")
            click(By.CSS_SELECTOR, "button[aria-label='Press shift+c to clear']")
            try:  # its dry run has answered: the dialog lists the task instances it clears
                soon.until(lambda driver: driver.find_element(*confirm).is_enabled())
                break
            except WebDriverException:
                full_page_screenshot(browser, ARTIFACTS / f"ui-clear-dialog-not-the-ranks-{attempt}.png")
        else:
            raise AssertionError("the rank's Clear dialog never opened: test-artifacts/ui-clear-dialog-not-the-ranks-*")
        full_page_screenshot(browser, ARTIFACTS / "ui-clear-dialog.png")
        click(*confirm)

        def finished() -> bool:
            return cluster.api("GET", f"/dags/{DAG}/dagRuns/{run_id}")["state"] in ("success", "failed")

        cluster.wait_for(finished, 600, f"{run_id} to finish after the clear")
        ti = states()
        assert cluster.api("GET", f"/dags/{DAG}/dagRuns/{run_id}")["state"] == "success", ti
        browser.get(f"{cluster.url}/dags/{DAG}/runs/{run_id}")
        wait.until(ec.presence_of_element_located((By.XPATH, "//*[normalize-space(.)='Success']")))
        full_page_screenshot(browser, ARTIFACTS / "ui-run-after-clear.png")
        assert [ti[("tokenize", rank)]["try_number"] for rank in range(3)] == [1, 2, 1]  # only rank 1 ran again

        record_path = f"{folder_for('s3://corpus/builds', run_id)}/_BUILD.json"
        build = BuildRecord.loads(s3.cat_file(record_path), record_path)
    recorded = build.params.to_json()
    assert (recorded["num_ranks"], recorded["seed"]) == (3, 4321)
    assert recorded["input"] == str(SAMPLE_CORPUS) and recorded["tokenizer"] == str(SAMPLE_TOKENIZER)
    same_params = BuildConfig(  # the form's two params; the rest are the DAG's defaults, which are BuildConfig's
        input=str(SAMPLE_CORPUS),
        output=str(tmp_path / "local"),
        tokenizer=str(SAMPLE_TOKENIZER),
        num_ranks=3,
        seed=4321,
    )
    without_fault = Build.start(same_params, "no-fault").run(parallel=2)
    assert build.digest == without_fault.record.digest
