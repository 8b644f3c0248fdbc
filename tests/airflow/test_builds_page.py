"""The build report and the "Corpus builds" page: the report's numbers are the manifests' and the data's, the page
refuses requests without Airflow's login and shows the run after it, in-process and in a real browser."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.support.browser import full_page_screenshot
from tests.support.dag_runs import ADMIN_PASSWORD, DAG_CONF, build_of, run_dag
from tests.support.paths import ROOT
from tests.support.processes import cli
from tokenization.builds.pages import size
from tokenization.formats.ds import TokenFile
from tokenization.records import BuildSummary, SourceShare
from tokenization.storage.folder import Folder
from tokenization.wording import counted

pytest.importorskip("airflow", reason="Airflow is in the 'airflow' dependency group (make test installs it)")

DAG_ID = "tokenize_corpus"
ARTIFACTS = ROOT / "test-artifacts"


@pytest.fixture(scope="module")
def build(airflow_db, dag) -> tuple[str, Path, dict]:
    """One finished build: its run id, folder and build manifest."""
    run, tis, ok = run_dag(dag, DAG_CONF)
    assert ok, {k: ti.state for k, ti in tis.items()}
    folder, manifest = build_of(run)
    return run.run_id, folder, manifest


def summary(**fields: Any) -> BuildSummary:
    """A published build's summary as the page gets it: ``fields``, the others a small verified build's."""
    small: dict[str, Any] = dict(dataset="/b/r/context", digest="ab" * 32, tokens=1, docs=1, rejects=0, files=1)
    small |= dict(verified=True, latest="/b/r", deleted=[], seed=7, tokenizer="t", input="/in")
    return BuildSummary(**small | fields)


@pytest.fixture(scope="module")
def client(build):
    from airflow.api_fastapi.app import create_app
    from fastapi.testclient import TestClient

    return TestClient(create_app())


@pytest.fixture(scope="module")
def token(client) -> str:
    answer = client.post("/auth/token", json={"username": "admin", "password": ADMIN_PASSWORD})
    assert answer.status_code in (200, 201), answer.text
    return answer.json()["access_token"]


def report_url(run_id: str) -> str:
    from urllib.parse import quote

    return f"/corpus-builds/dags/{DAG_ID}/runs/{quote(run_id, safe='')}"


def test_report_numbers_are_the_manifests_and_the_datas(build) -> None:
    run_id, folder, manifest = build
    report = json.loads((folder / "report.json").read_text())
    assert report["build"] == manifest  # the build record itself, not a copy of some of its figures
    assert report["build"]["run_id"] == run_id and (folder / "report.html").exists()
    ranks = [json.loads((folder / "ranks" / "_manifests" / f"{r:05d}.json").read_text()) for r in range(3)]
    assert [r["docs_read"] for r in report["ranks"]] == [m["counts"]["docs_read"] for m in ranks]
    assert [r["tokens"] for r in report["ranks"]] == [m["counts"]["tokens_written"] for m in ranks]
    c = report["build"]["conservation"]
    assert (c["docs_in"], c["docs_out"], c["empty"], c["quarantined"], c["holds"]) == (309, 308, 1, 0, True)
    dataset = folder / "context"
    names = sorted(n for n in Folder(str(dataset)).list() if n.endswith(".ds"))
    recounted = {n: TokenFile(str(dataset / n)).num_tokens for n in names}
    assert {f["name"]: f["tokens"] for f in report["files"]} == recounted
    assert report["build"]["tokens"] == sum(recounted.values()) == manifest["tokens"]
    assert sum(row["docs"] for row in report["length_histogram"]) == c["docs_out"]
    inputs = report["inputs"]  # the summary and the file table describe one plan
    assert (inputs["files"], inputs["bytes"]) == (
        len(report["input_files"]),
        sum(f["bytes"] for f in report["input_files"]),
    )
    assert report["tokens_dropped"]["total"] == 0
    engines = sorted({m["tokenizer"]["engine"] for m in ranks} - {"none"}) or ["none"]  # of the ranks that encoded
    assert report["tokenizer"]["engines"] == engines and report["settings"]["seed"] == 1234
    read = sorted(f["url"] for m in ranks for f in m["inputs"])
    assert [f["url"] for f in report["input_files"]] == read and report["inputs"]["files"] == len(read) == 4
    assert report["inputs"]["spec"] == manifest["params"]["input"]
    assert report["throughput"]["text_bytes"] == sum(m["counts"]["text_bytes"] for m in ranks)

    before = (folder / "report.json").read_bytes()
    (folder / "report.json").unlink()
    done = cli("report", str(folder))
    assert done.returncode == 0, done.stderr
    assert "309 docs read = 308 written + 1 empty + 0 quarantined" in done.stdout
    assert (folder / "report.json").read_bytes() == before  # regenerated from the manifests alone, identically


def test_a_mixture_builds_row_carries_each_sources_share() -> None:
    """What the page shows of a mixture, from the summary its publish returned (XCom)."""
    from tokenization_airflow.builds_page import _build_row

    shares = [SourceShare(name="web", target=0.6, share=0.59999), SourceShare(name="code", target=0.4, share=0.40001)]
    published = summary(
        dataset="/builds/mix/context",
        tokens=1_000,
        docs=10,
        latest="/builds/mix",
        tokenizer="tokenizer.json",
        input="web=/data/web, code=/data/code",
        mixture=shares,
    )
    run = SimpleNamespace(
        run_id="mix", state="success", start_date=None, end_date=None, logical_date=None, run_after=None
    )
    web, code = _build_row(run, published.to_json(), None)["mixture"]
    assert web == {"name": "web", "target": 0.6, "share": 0.59999}
    assert code == {"name": "code", "target": 0.4, "share": 0.40001}


def test_a_builds_duration_is_its_records_not_the_airflow_runs() -> None:
    """Issue 54: after a rank was cleared, a 69 s build was listed as lasting 10.2 s: clearing restarts the Airflow
    run's clock. A published build's start and duration are its build record's; an unpublished run's, Airflow's."""
    from datetime import datetime, timedelta, timezone

    from tokenization_airflow.builds_page import _build_row

    cleared = datetime(2026, 12, 5, 10, 1, 0, tzinfo=timezone.utc)  # when the rank was cleared
    run = SimpleNamespace(
        run_id="r",
        state="success",
        start_date=cleared,
        end_date=cleared + timedelta(seconds=10.2),
        logical_date=None,
        run_after=cleared,
    )
    published = summary(started="2026-12-05T10:00:00+00:00", wall_seconds=69.04)
    row = _build_row(run, published.to_json(), None)
    assert (row["started"], row["seconds"]) == ("2026-12-05T10:00:00+00:00", 69.0)
    running = SimpleNamespace(**vars(run) | {"state": "running", "end_date": None})
    shown = _build_row(running, None, None)
    assert (shown["started"], shown["seconds"]) == ("2026-12-05T10:01:00+00:00", None)
    older = published.to_json() | {"format": "corpus-tokenization/build-summary/2"}  # published before: no times
    del older["started"], older["wall_seconds"]
    assert _build_row(run, older, None)["seconds"] == 10.2


def test_report_of_a_folder_that_is_not_a_build_is_a_one_line_error(tmp_path) -> None:
    done = cli("report", str(tmp_path))
    assert done.returncode == 1 and done.stderr.strip().startswith(f"error: {tmp_path}: no _BUILD.json")


def test_the_page_refuses_requests_without_login(client, build) -> None:
    run_id = build[0]
    for path in ("/corpus-builds/", "/corpus-builds/api/builds", report_url(run_id)):
        assert client.get(path).status_code == 401, path
        assert client.get(path, cookies={"_token": "forged"}).status_code == 403, path
        assert client.get(path, headers={"Authorization": "Bearer forged"}).status_code == 403, path


def test_the_page_lists_the_build_and_serves_its_report(client, token, build) -> None:
    run_id, _, manifest = build
    auth = {"Authorization": f"Bearer {token}"}
    rows = client.get("/corpus-builds/api/builds", headers=auth).json()
    row = next(r for r in rows if r["run_id"] == run_id)
    assert row["state"] == "success" and row["tokens"] == manifest["tokens"]
    assert (row["docs"], row["rejects"]) == (308, 0)
    assert (row["started"], row["seconds"]) == (manifest["started"], round(manifest["wall_seconds"], 1))
    params = manifest["params"]
    assert (row["tokenizer"], row["input"], row["seed"]) == (params["tokenizer"], params["input"], 1234)
    reused = manifest["cache"]["bytes_reused"] / manifest["cache"]["bytes_total"]  # earlier runs filled the cache
    assert row["reused"] == reused
    assert row["footprint"] == manifest["footprint"] and manifest["removed"] == ["ranks", "merged"]
    assert row["mixture"] is None  # a build of one input
    ranks = next(folder for folder in row["footprint"]["folders"] if folder["name"] == "ranks")
    storage = (
        f'<div data-key="ranks"><span class="nowrap">ranks/ {size(ranks["held"])}</span> '
        f'<span class="nowrap">({size(ranks["removed"])} removed)</span></div>'
    )

    page = client.get("/corpus-builds/", cookies={"_token": token})  # the UI's cookie, as in the iframe
    assert page.status_code == 200 and run_id in page.text
    assert f'<td class="num" data-key="tokens">{manifest["tokens"]:,}</td>' in page.text
    assert f'<td class="num" data-key="reused">{reused:.1%}</td>' in page.text
    assert storage in page.text  # what the folders hold once published, and what was removed
    breakable = params["input"].replace("/", "/<wbr>")  # may wrap after each slash
    assert f'<td data-key="input"><code>{breakable}</code></td>' in page.text

    report = client.get(report_url(run_id), cookies={"_token": token})
    assert report.status_code == 200
    assert 'id="length-histogram"><svg' in report.text and '<td data-key="tokens">' in report.text


def test_pages_forbid_scripts_and_reports_outside_the_allowed_locations_are_not_served(
    client, token, build, monkeypatch
) -> None:
    """Finding 4: an output URL of the tester's made the page fetch it and serve its HTML from Airflow's origin."""
    auth = {"Authorization": f"Bearer {token}"}
    for path in ("/corpus-builds/", report_url(build[0])):
        answer = client.get(path, headers=auth)
        policy = answer.headers["content-security-policy"]
        assert answer.status_code == 200 and "default-src 'none'" in policy and "script-src" not in policy
        assert answer.headers["x-content-type-options"] == "nosniff"
    monkeypatch.setenv("TOKENIZATION_ALLOWED_LOCATIONS", "s3://elsewhere")
    refused = client.get(report_url(build[0]), headers=auth)
    assert refused.status_code == 403 and "outside the allowed locations" in refused.json()["detail"]
    shown = client.get(report_url(build[0]), headers=auth | {"Accept": "text/html"})  # the UI's frame: a page
    assert shown.status_code == 403 and shown.headers["content-security-policy"] == policy
    assert '<p class="refusal">run ' in shown.text and "outside the allowed locations" in shown.text


def test_only_reports_of_known_runs_are_served(client, token) -> None:
    auth = {"Authorization": f"Bearer {token}"}
    assert client.get(report_url("no-such-run"), headers=auth).status_code == 404
    assert client.get(report_url("../../../etc/passwd"), headers=auth).status_code == 404
    assert client.get("/corpus-builds/dags/other_dag/runs/x", headers=auth).status_code == 404


def test_publish_links_to_the_report(client, token, build) -> None:
    run_id = build[0]
    auth = {"Authorization": f"Bearer {token}"}
    base = f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances"
    links = client.get(f"{base}/publish/links", headers=auth).json()["extra_links"]
    assert links == {"Build report": report_url(run_id)}
    assert client.get(f"{base}/plan/links", headers=auth).json()["extra_links"] == {"Build report": None}
    views = {
        v["name"]: v for p in client.get("/api/v2/plugins", headers=auth).json()["plugins"] for v in p["external_views"]
    }
    assert views["Corpus builds"]["href"] == "/corpus-builds/" and views["Build report"]["destination"] == "dag_run"


@pytest.fixture(scope="module")
def logged_in(build) -> Iterator[tuple[str, Any]]:
    """Headless Chromium against a real api-server (this repo's plugins, the tests' database), refused before it
    logs in through Airflow's page, then logged in: the server's base URL and the browser."""
    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        pytest.skip("chromium and chromedriver are absent: `make test` installs Debian's (scripts/ensure-chromium.sh)")
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    with api_server() as base:
        options = webdriver.ChromeOptions()
        options.binary_location = shutil.which("chromium")
        for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
            options.add_argument(flag)
        service = webdriver.ChromeService(executable_path=shutil.which("chromedriver"))
        driver = webdriver.Chrome(options=options, service=service)
        try:
            driver.get(f"{base}/corpus-builds/")
            assert "Not authenticated" in driver.page_source  # no cookie yet: refused
            driver.get(f"{base}/auth/login?next={base}/corpus-builds/")
            wait = WebDriverWait(driver, 60)
            wait.until(expected_conditions.presence_of_element_located((By.NAME, "username"))).send_keys("admin")
            driver.find_element(By.NAME, "password").send_keys(ADMIN_PASSWORD)
            driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
            wait.until(expected_conditions.presence_of_element_located((By.ID, "builds")))
            yield base, driver
        finally:
            driver.quit()


def test_in_a_browser_after_login(build, logged_in) -> None:
    """The builds page and a build's report, alone and inside Airflow's UI."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    run_id, _, manifest = build
    base, browser = logged_in
    wait = WebDriverWait(browser, 60)
    browser.get(f"{base}/corpus-builds/")
    table = wait.until(expected_conditions.presence_of_element_located((By.ID, "builds")))
    header = [th.text for th in table.find_elements(By.CSS_SELECTOR, "thead th")]
    assert header == [
        *("run", "state", "started", "duration", "tokenizer", "input"),
        *("seed", "tokens", "documents", "rejects", "reused", "storage"),
    ]
    row = table.find_element(By.CSS_SELECTOR, f"tr[data-run-id='{run_id}']")
    shown = {cell.get_attribute("data-key"): cell.text for cell in row.find_elements(By.CSS_SELECTOR, "td")}
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", shown.pop("started"))
    assert re.fullmatch(r"[\d.]+ s|\d+ min \d+ s", shown.pop("duration"))
    params, footprint = manifest["params"], manifest["footprint"]
    storage = [  # a line a folder, and the cache's
        f"{f['name']}/ {size(f['held'])}" + (f" ({size(f['removed'])} removed)" if f["removed"] else "")
        for f in footprint["folders"]
    ] + [f"cache {size(footprint['cache']['bytes'])}"]
    assert shown == {
        "run": run_id,
        "state": "success",
        "tokenizer": params["tokenizer"],
        "input": params["input"],
        "seed": "1234",
        "tokens": f"{manifest['tokens']:,}",
        "docs": "308",
        "rejects": "0",
        "reused": f"{manifest['cache']['bytes_reused'] / manifest['cache']['bytes_total']:.1%}",
        "storage": "\n".join(storage),
    }
    lines = f"return document.querySelector(\"tr[data-run-id='{run_id}'] td[data-key=run] a\").getClientRects().length"
    assert browser.execute_script(lines) == 1  # the run id on one line (issue 54: it wrapped a character a line)
    fits = "const t = document.getElementById('builds'); return [t.scrollWidth, t.parentElement.clientWidth];"
    width, room = browser.execute_script(fits)
    assert width <= room <= 1400, (width, room)  # no scrolling at 1,400 px: the table fits the window
    full_page_screenshot(browser, ARTIFACTS / "corpus-builds.png")
    row.find_element(By.TAG_NAME, "a").click()
    figure = wait.until(expected_conditions.presence_of_element_located((By.ID, "length-histogram")))
    assert figure.find_element(By.TAG_NAME, "svg").size["height"] > 100
    verified = browser.find_element(By.ID, "verify").text
    files = counted(len(manifest["files"]), "file")
    assert verified.startswith(f"Verify passed: {files}, {manifest['tokens']:,} tokens")
    conserved = browser.find_element(By.ID, "conservation").text
    assert conserved.startswith("Documents conservation holds: 309 read = 308 written + 1 empty")
    tokens = browser.find_element(By.CSS_SELECTOR, "#totals td[data-key=tokens]").text
    assert tokens == f"{manifest['tokens']:,}"
    engines = browser.find_element(By.CSS_SELECTOR, "#tokenizer td[data-key=engines]").text
    assert engines in ("hf", "gigatoken", "none")  # HF for the sample's few files (engines.FAST_ENGINE_MIN_BYTES)
    full_page_screenshot(browser, ARTIFACTS / "build-report.png")

    browser.get(f"{base}/plugin/corpus-builds")  # inside Airflow's own UI, under Browse: an iframe
    frame = wait.until(expected_conditions.presence_of_element_located((By.CSS_SELECTOR, "iframe")))
    browser.switch_to.frame(frame)
    wait.until(expected_conditions.presence_of_element_located((By.CSS_SELECTOR, f"tr[data-run-id='{run_id}']")))
    browser.switch_to.default_content()
    browser.save_screenshot(str(ARTIFACTS / "airflow-ui-corpus-builds.png"))


def test_a_mixture_typed_into_the_trigger_form_survives_or_the_form_says_to_paste_it(logged_in) -> None:
    """Issue 54: typing ``weight`` into the Mixture editor gave ``weiht`` (Airflow's page shortcuts took ``g`` and
    the space). A spec typed key by key is kept, or the field says to paste it or to use ``mixture_file``."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    base, browser = logged_in
    wait = WebDriverWait(browser, 60)
    browser.get(f"{base}/dags/{DAG_ID}")
    trigger = (By.XPATH, "//button[normalize-space()='Trigger']")
    wait.until(expected_conditions.element_to_be_clickable(trigger)).click()
    field = wait.until(expected_conditions.presence_of_element_located((By.XPATH, FORM_FIELD.format("Mixture"))))
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", field)
    # the editor (Monaco) renders after its field: waited for, then it takes the focus
    editor = (By.XPATH, FORM_FIELD.format("Mixture") + "//*[contains(concat(' ', @class, ' '), ' view-lines ')]")
    wait.until(expected_conditions.element_to_be_clickable(editor)).click()
    ActionChains(browser).key_down(Keys.CONTROL).send_keys("a").key_up(Keys.CONTROL).perform()
    spec = {"tokens": 1000, "sources": [{"name": "web", "input": "/data/web", "weight": 1}]}
    typed = '{"tokens": 1000,\n"sources": [{"name": "web",\n"input": "/data/web",\n"weight": 1}]}'
    ActionChains(browser).send_keys(typed).perform()  # key events, one a character
    held = field.find_element(By.CSS_SELECTOR, ".view-lines").text.replace("\xa0", " ")
    full_page_screenshot(browser, ARTIFACTS / "trigger-form-mixture.png")
    try:
        survived = json.loads(held) == spec
    except ValueError:
        survived = False
    if not survived:  # Airflow 3.3.2: '"weiht":1' -- so the field says how to give a mixture
        assert "paste, don't type, or use mixture_file" in field.text, (held, field.text)
    file_field = browser.find_element(By.XPATH, FORM_FIELD.format("Mixture file"))
    assert "in place of the mixture param: give one of the two" in file_field.text
    assert file_field.find_element(By.NAME, "element_mixture_file").get_attribute("value") == ""  # a text input


FORM_FIELD = "//label[normalize-space()='{}']/ancestor::div[@role='group'][1]"  # a param's row in the trigger form


@contextlib.contextmanager
def api_server() -> Iterator[str]:
    """``airflow api-server`` on a free port, with this repo's plugins and the tests' database; its base URL. The
    port is free when probed, and another process may take it before the server binds it: a server that exits
    before it answers is started again on another port."""
    ARTIFACTS.mkdir(exist_ok=True)
    log = ARTIFACTS / "api-server.log"
    for _ in range(SERVER_STARTS):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        with open(log, "wb") as out:
            server = subprocess.Popen(
                [sys.executable, "-m", "airflow", "api-server", "--port", str(port), "--workers", "1"],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=os.environ.copy(),
                start_new_session=True,
            )
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.time() + 120
            while server.poll() is None and not _answers(f"{base}/api/v2/monitor/health"):
                if time.time() > deadline:
                    raise RuntimeError(f"the api-server did not come up in 120 s; see {log}")
                time.sleep(1)
            if server.poll() is None:
                yield base
                return
        finally:
            if server.poll() is None:
                os.killpg(server.pid, signal.SIGTERM)
                server.wait(timeout=30)
    raise RuntimeError(f"the api-server exited before it answered, {SERVER_STARTS} times; see {log}")


SERVER_STARTS = 3  # ports tried: each probed free, then bound by the server


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2)
        return True
    except OSError:
        return False


def test_the_page_lists_runs_by_when_they_started_those_waiting_first(airflow_db) -> None:
    """A scheduled run is due (``run_after``) at the end of its interval, so it may start after a manual run that
    was due later: the page orders by start, as it says."""
    from datetime import datetime, timedelta, timezone

    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from airflow.utils.types import DagRunType
    from tokenization_airflow.builds_page import list_builds

    t0 = datetime(2026, 12, 1, tzinfo=timezone.utc)
    runs = {  # run id: (run type, due, started)
        "scheduled__2026-12-01": (DagRunType.SCHEDULED, t0, t0 + timedelta(hours=2)),
        "manual__2026-12-01T01": (DagRunType.MANUAL, t0 + timedelta(hours=1), t0 + timedelta(hours=1)),
        "manual__2026-12-01T03": (DagRunType.MANUAL, t0 - timedelta(days=1), None),  # queued, not started yet
    }
    with create_session() as session:
        for run_id, (run_type, due, started) in runs.items():
            session.add(DagRun(dag_id="ordering", run_id=run_id, run_type=run_type, run_after=due, start_date=started))
    assert [row["run_id"] for row in list_builds("ordering")] == [
        "manual__2026-12-01T03",
        "scheduled__2026-12-01",
        "manual__2026-12-01T01",
    ]
