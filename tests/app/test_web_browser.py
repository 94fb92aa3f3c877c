"""The pages in a real browser: Chromium (Debian's, through Selenium and ChromeDriver) against a real
`sqa serve` over the shipped sample news (hash encoder, first-entity reader: fast and deterministic).

What a person does: ask a question as of a date and as of a second one, and see two differently
dated sets of evidence, none published after its date; log in to the dashboard, start an ingest
and watch it finish without reloading; start an evaluation and open its report with its plots; the
same pages at phone width. Screenshots land in tests/output/screenshots (look at them).

Chromium missing (no apt-get or no root to run scripts/install_browser.sh): the tests skip and say so.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
from pathlib import Path

import pytest

from app.server_process import served
from settings import Settings
from tests.conftest import load_sample

pytestmark = pytest.mark.integration
TOKEN = "browser-admin-token"
SHOTS = Path(__file__).resolve().parents[1] / "output" / "screenshots"
QUESTION = "Who is the mayor of Port Calder?"


def _browser_paths() -> tuple[str, str]:
    binary = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
    driver = shutil.which("chromedriver")
    if not binary or not driver:
        pytest.skip(
            "no Chromium/ChromeDriver on this machine: `bash scripts/install_browser.sh` installs "
            "Debian's chromium and chromium-driver (needs root or sudo)"
        )
    return binary, driver


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`sqa serve` over the sample ingested through 2024-02 (March is left for the dashboard's ingest)."""
    home = tmp_path_factory.mktemp("web") / "home"
    url = f"sqlite:///{home / 'sqa.db'}"
    settings = Settings(
        home=home,
        database_url=url,
        encoder="hash",
        reader="first-entity",
        admin_token=TOKEN,
        env="test",
        auto_train=False,
    )
    load_sample(settings, through="2024-02")
    env = {
        **os.environ,
        "SQA_HOME": str(home),
        "SQA_DATABASE_URL": url,
        "SQA_ADMIN_TOKEN": TOKEN,
        "SQA_ENCODER": "hash",
        "SQA_READER": "first-entity",
        "SQA_SNAPSHOT_POLL_S": "1",
        "SQA_AUTO_TRAIN": "0",
        "SQA_ENV": "test",
        "HF_HUB_OFFLINE": "1",
    }
    with served(env, home / "server.log", ready_timeout_s=120) as running:
        yield running


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    binary, driver_path = _browser_paths()
    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager must not look for drivers online
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1280,1000",
        "--lang=en-US",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}",
    ):  # not left in /tmp
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    driver.set_page_load_timeout(60)
    SHOTS.mkdir(parents=True, exist_ok=True)
    yield driver
    driver.quit()


def shot(driver, name: str) -> Path:
    """A full-page screenshot (the window grown to the page's height)."""
    width = driver.execute_script("return window.innerWidth")
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(max(width, 360), min(max(height + 140, 600), 6000))
    path = SHOTS / f"{name}.png"
    driver.save_screenshot(str(path))
    return path


def wait_for(driver, condition, timeout=60.0):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.2).until(condition)


def _results(driver) -> dict[str, list[str]]:
    """{as_of: [publish dates of its cards]} of the answers on the page."""
    from selenium.webdriver.common.by import By

    out = {}
    for section in driver.find_elements(By.CSS_SELECTOR, "section.result"):
        day = section.get_attribute("data-as-of")
        out[day] = [c.get_attribute("data-published") for c in section.find_elements(By.CSS_SELECTOR, "li.card")]
    return out


def test_ask_a_question_as_of_two_dates(server, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    browser.set_window_size(1280, 1000)
    browser.get(server.base + "/")
    # Every visible field has a label; the form is used with the keyboard alone (Enter submits).
    unlabeled = browser.execute_script(
        "return [...document.querySelectorAll('input:not([type=hidden])')].filter(i => !i.labels.length).map(i => i.id)"
    )
    assert unlabeled == []
    assert browser.find_elements(By.CSS_SELECTOR, ".examples a")  # questions to try, for a new user
    print("screenshot:", shot(browser, "ask-empty"))
    browser.set_window_size(1280, 1000)
    box = browser.find_element(By.ID, "q")
    box.send_keys(QUESTION)
    browser.execute_script("document.getElementById('as_of').value = '2024-02-20'")  # the date picker's value
    box.send_keys(Keys.ENTER)
    wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "section.result"))
    first = _results(browser)
    assert list(first) == ["2024-02-20"] and first["2024-02-20"]
    assert all(day <= "2024-02-20" for day in first["2024-02-20"])
    assert "as_of=2024-02-20" in browser.find_element(By.ID, "permalink").get_attribute("href")

    # One click: the same question as of a month earlier, side by side.
    browser.find_element(By.ID, "compare-month").click()
    wait_for(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, "section.result")) == 2)
    both = _results(browser)
    assert set(both) == {"2024-02-20", "2024-01-20"}
    for as_of, days in both.items():
        assert days and all(day <= as_of for day in days), (as_of, days)
    assert both["2024-02-20"] != both["2024-01-20"]  # what changed between the dates
    assert max(both["2024-02-20"]) > "2024-01-20"  # the later date sees news the earlier cannot
    # Cards run oldest first towards as_of, the answer marked where a passage holds it.
    for days in both.values():
        assert days == sorted(days)
    assert browser.find_elements(By.CSS_SELECTOR, "li.card mark")
    print("screenshot:", shot(browser, "ask-compare"))


def test_a_question_with_markup_is_shown_not_run(server, browser):
    from urllib.parse import quote

    from selenium.webdriver.common.by import By

    browser.set_window_size(1280, 1000)
    evil = "<script>window.pwned = 1</script><img src=x onerror='window.pwned = 2'>"
    browser.get(f"{server.base}/?q={quote(evil)}&as_of=2024-02-20")
    assert browser.execute_script("return window.pwned === undefined")
    assert browser.find_element(By.ID, "q").get_attribute("value") == evil
    assert evil in browser.title or "<script>" in browser.page_source.replace("&lt;", "<")


def test_an_invalid_date_is_reported_next_to_its_field(server, browser):
    from selenium.webdriver.common.by import By

    browser.get(f"{server.base}/?q=Who+won&as_of=2024-02-30")
    error = browser.find_element(By.ID, "as_of-error").text
    assert "2024-02-30" in error and "YYYY-MM-DD" in error
    assert browser.find_element(By.ID, "as_of").get_attribute("aria-invalid") == "true"


def _login(browser, base, *, wrong_first: bool = False):
    """Open the dashboard, logging in on the way when the session is not there (the cookie's path
    is /dashboard: a page elsewhere does not see it)."""
    from selenium.webdriver.common.by import By

    browser.get(base + "/dashboard")
    wait_for(browser, lambda d: d.find_elements(By.ID, "h-index") or d.find_elements(By.ID, "token"))
    if browser.find_elements(By.ID, "h-index"):
        return
    if wrong_first:
        browser.find_element(By.ID, "token").send_keys("not-the-token")
        browser.find_element(By.ID, "login").click()
        assert "not the admin token" in wait_for(browser, lambda d: d.find_element(By.ID, "login-error")).text
    browser.find_element(By.ID, "token").send_keys(TOKEN)
    browser.find_element(By.ID, "login").click()
    wait_for(browser, lambda d: d.find_elements(By.ID, "h-index"))


def _start(browser, form: str, value: str) -> None:
    """Fill an action form, submit it, and confirm on the page that asks."""
    from selenium.webdriver.common.by import By

    field = browser.find_element(By.ID, f"{form}-value")
    field.clear()
    field.send_keys(value)
    browser.find_element(By.CSS_SELECTOR, f"#form-{form} button").click()
    question = wait_for(browser, lambda d: d.find_element(By.ID, "confirm-question")).text
    assert value in question
    wait_for(browser, lambda d: d.find_element(By.ID, "confirm")).click()
    wait_for(browser, lambda d: d.find_elements(By.ID, "notice"))


def _job_row_state(browser, job_id: str) -> str:
    """Read in one script call: the page's poll replaces the table, so an element found in one call may
    be gone (stale) by the next."""
    return browser.execute_script(
        "const row = document.getElementById(arguments[0]); return row ? row.dataset.state : ''", f"job-{job_id}"
    )


def test_dashboard_login_ingest_and_watch_it_finish(server, browser):
    from selenium.webdriver.common.by import By

    browser.set_window_size(1280, 1000)
    browser.get(server.base + "/dashboard/login")
    browser.delete_all_cookies()
    _login(browser, server.base, wrong_first=True)
    cookie = browser.get_cookie("sqa_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert TOKEN not in cookie["value"] and TOKEN not in browser.current_url
    months = [r.text.split()[0] for r in browser.find_elements(By.CSS_SELECTOR, "#months tbody tr")]
    assert months == ["2024-01", "2024-02"]

    _start(browser, "ingest", "2024-03")
    notice = browser.find_element(By.ID, "notice").text
    job_id = notice.split("job ")[1].split(" ")[0]
    page_id = browser.execute_script("return window.performance.timeOrigin")
    # The jobs table refreshes itself (no reload) until the job has finished.
    wait_for(browser, lambda d: _job_row_state(d, job_id) == "succeeded", timeout=120)
    assert browser.execute_script("return window.performance.timeOrigin") == page_id
    progress = browser.execute_script("return document.querySelector(arguments[0]).value", f"#job-{job_id} progress")
    assert float(progress) == 1.0
    browser.refresh()
    months = [r.text.split()[0] for r in browser.find_elements(By.CSS_SELECTOR, "#months tbody tr")]
    assert months == ["2024-01", "2024-02", "2024-03"]
    print("screenshot:", shot(browser, "dashboard-after-ingest"))

    # A bad month is refused next to its field, and nothing starts.
    browser.set_window_size(1280, 1000)
    field = browser.find_element(By.ID, "ingest-value")
    field.clear()
    field.send_keys("2024-13")
    browser.find_element(By.CSS_SELECTOR, "#form-ingest button").click()
    # the click starts a navigation; the confirmation page is there once its button is
    wait_for(browser, lambda d: d.find_element(By.ID, "confirm")).click()
    assert "2024-13" in wait_for(browser, lambda d: d.find_element(By.ID, "ingest-error")).text


def test_evaluation_report_with_its_plots(server, browser):
    from selenium.webdriver.common.by import By

    browser.set_window_size(1280, 1000)
    _login(browser, server.base)
    _start(browser, "evaluate", "2024Q1")
    job_id = browser.find_element(By.ID, "notice").text.split("job ")[1].split(" ")[0]
    wait_for(browser, lambda d: _job_row_state(d, job_id) == "succeeded", timeout=120)

    browser.get(server.base + "/dashboard/evaluations")
    assert browser.find_element(By.ID, "trend").get_attribute("naturalWidth") != "0"
    browser.find_element(By.CSS_SELECTOR, "#runs tbody tr a").click()
    wait_for(browser, lambda d: d.find_elements(By.ID, "report"))
    images = browser.find_elements(By.CSS_SELECTOR, "#report img")
    assert images, "the report shows no plot"
    wait_for(
        browser,
        lambda d: all(
            d.execute_script("return arguments[0].complete && arguments[0].naturalWidth > 0", i) for i in images
        ),
    )
    assert "Scores by question quarter" in browser.find_element(By.ID, "report").text
    print("screenshot:", shot(browser, "evaluation-report"))


def test_pages_fit_a_phone_screen(server, browser):
    _login(browser, server.base)
    browser.set_window_size(390, 844)
    as_of = dt.date(2024, 2, 20).isoformat()
    for path in (f"/?q=Who+is+the+mayor+of+Port+Calder%3F&as_of={as_of}&compare=2024-01-20", "/dashboard"):
        browser.get(server.base + path)
        overflow = browser.execute_script("return document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 1, f"{path} is {overflow} px wider than the screen"
    browser.get(server.base + f"/?q=Who+is+the+mayor+of+Port+Calder%3F&as_of={as_of}&compare=2024-01-20")
    print("screenshot:", shot(browser, "ask-phone"))


def test_the_jobs_table_says_when_the_session_ends(server, browser):
    from selenium.webdriver.common.by import By

    browser.set_window_size(1280, 1000)
    _login(browser, server.base)
    browser.delete_cookie("sqa_session")  # as if it had expired
    alert = wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#jobs-table p.error"), timeout=20)
    assert "log in again" in alert[0].text
    assert browser.find_elements(By.CSS_SELECTOR, "#jobs-table table.jobs")  # the table stays, no login page in it
    assert not browser.find_elements(By.CSS_SELECTOR, "#jobs-table #token")
