"""`patchgym view`: the JSON endpoints on eval and train runs, and the page end to end in headless Chromium (Debian's
chromium + chromedriver, driven by Selenium without Selenium Manager): list, filter, open, coloured patch."""

import json
import shutil
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from PIL import Image
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.common.selenium_manager import SeleniumManager
from selenium.webdriver.support.ui import Select, WebDriverWait
from typer.testing import CliRunner

from patchgym.agent.trajectory import Trajectory, Turn
from patchgym.cli import app
from patchgym.viewer import make_server

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
PATCH = ("diff --git a/pkg/core.py b/pkg/core.py\n--- a/pkg/core.py\n+++ b/pkg/core.py\n@@ -1,3 +1,3 @@\n"
         " def add(a, b):\n-    return a - b\n+    return a + b\n")
LONG_OUTPUT = "".join(f"line {i} of the test output\n" for i in range(60))


def turn(thought: str, command: str, observation: str, sampled: int = 30) -> Turn:
    call = f"<function=execute_bash>\n<parameter=command>{command}</parameter>\n</function>"
    return Turn(prompt_ids=[1], completion_ids=[5] * sampled, logprobs=[-1.0] * sampled, finish_reason="stop",
                close_ids=[2], action=thought + call, observation=observation, exit_code=0, generate_s=1.0,
                step_s=0.5, tool_call={"name": "execute_bash", "arguments": {"command": command}})


def trajectories(prefix: str = "") -> list[Trajectory]:
    solved = Trajectory(
        task_id="alpha-add", trajectory_id=f"{prefix}alpha-add#0", termination="submitted", patch=PATCH, seconds=12.0,
        messages=[{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "add() subtracts"}],
        turns=[turn("I will run the tests to see the failure.", "pytest -q", LONG_OUTPUT),
               turn("The sign is wrong; fixing it.", "sed -i s/-/+/ pkg/core.py", "(no output)")],
        grade={"resolved": True, "f2p": {"tests/test_core.py::test_add": "PASSED"},
               "p2p": {"tests/test_core.py::test_sub": "PASSED"}, "duration": 3.0,
               "tests": {"tests/test_core.py::test_add": "PASSED", "tests/test_core.py::test_sub": "PASSED"}})
    failed = [Trajectory(task_id=task, trajectory_id=f"{prefix}{task}#0", termination=reason, seconds=5.0,
                         turns=[turn("Looking around.", "ls", "pkg tests")],
                         grade={"resolved": False, "error": "empty_patch"})
              for task, reason in (("beta-parse", "max_steps"), ("gamma-io", "format_errors"))]
    return [solved, *failed]


def write(path: Path, records: list[Trajectory]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write("".join(t.model_dump_json() + "\n" for t in records))


def serve(run: Path):
    server = make_server(run, port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


@pytest.fixture
def eval_run(tmp_path: Path) -> Path:
    write(tmp_path / "eval" / "trajectories.jsonl", trajectories())
    return tmp_path / "eval"


@pytest.fixture
def url(eval_run):
    server, address = serve(eval_run)
    yield address
    server.shutdown()
    server.server_close()


def get(address: str):
    with urllib.request.urlopen(address, timeout=10) as response:
        return json.loads(response.read())


def test_api_lists_eval_trajectories_and_splits_thought_from_call(url):
    rows = get(f"{url}/api/trajectories")
    assert [(r["task_id"], r["resolved"], r["termination"], r["steps"], r["tokens"]) for r in rows] == [
        ("alpha-add", True, "submitted", 2, 60), ("beta-parse", False, "max_steps", 1, 30),
        ("gamma-io", False, "format_errors", 1, 30)]
    t = get(f"{url}/api/trajectory/0")
    assert t["turns"][0]["thought"] == "I will run the tests to see the failure."
    assert t["turns"][0]["call"].startswith("<function=execute_bash>") and t["prompt"] == "add() subtracts"
    assert [g["name"] for g in t["grade"]["groups"]] == ["FAIL_TO_PASS", "PASS_TO_PASS"]
    with pytest.raises(urllib.error.HTTPError, match="404"):
        get(f"{url}/api/trajectory/3")


def test_api_gives_each_turns_thinking_apart_from_its_action(tmp_path):
    thinker = trajectories()[0]
    thinker.turns[0] = thinker.turns[0].model_copy(update={"reasoning": "The sign looks wrong.", "thinking_tokens": 7})
    write(tmp_path / "eval" / "trajectories.jsonl", [thinker])
    server, address = serve(tmp_path / "eval")
    try:
        assert len(get(f"{address}/api/trajectories")) == 1  # the list indexes the run
        first, second = get(f"{address}/api/trajectory/0")["turns"]
    finally:
        server.shutdown()
        server.server_close()
    assert (first["thinking"], first["thinking_tokens"]) == ("The sign looks wrong.", 7)
    assert first["thought"] == "I will run the tests to see the failure." and second["thinking"] == ""


def test_api_reads_every_iteration_of_a_train_run_and_follows_appends(tmp_path):
    run = tmp_path / "train"
    (run / "metrics.jsonl").parent.mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"iteration": 1}\n')
    write(run / "rollouts" / "iter-1" / "trajectories.jsonl", trajectories())
    write(run / "rollouts" / "iter-2" / "trajectories.jsonl", trajectories()[:1])
    server, address = serve(run)
    try:
        rows = get(f"{address}/api/trajectories")
        assert [(r["iteration"], r["task_id"]) for r in rows] == [
            (1, "alpha-add"), (1, "beta-parse"), (1, "gamma-io"), (2, "alpha-add")]
        write(run / "rollouts" / "iter-2" / "trajectories.jsonl", trajectories("round1/")[1:2])
        write(run / "rollouts" / "iter-2" / "trajectories.jsonl", trajectories()[:1])  # rewritten: same row
        rows = get(f"{address}/api/trajectories")
        assert [(r["iteration"], r["trajectory_id"]) for r in rows[3:]] == [
            (2, "alpha-add#0"), (2, "round1/beta-parse#0")]
        assert get(f"{address}/api/trajectory/4")["iteration"] == 2
    finally:
        server.shutdown()
        server.server_close()


def test_view_refuses_a_directory_that_is_not_a_run(tmp_path):
    result = CliRunner().invoke(app, ["view", str(tmp_path), "--port", "0"])
    assert result.exit_code == 2 and "not a train, eval, select or learning run" in result.output


def test_view_on_a_port_in_use_says_so(eval_run):
    taken = make_server(eval_run, port=0)
    try:
        port = str(taken.server_address[1])
        result = CliRunner().invoke(app, ["view", str(eval_run), "--port", port])
        assert result.exit_code == 2 and f"cannot listen on 127.0.0.1:{port}: Address already in use" in result.output
    finally:
        taken.server_close()


@pytest.fixture
def browser(monkeypatch):
    if shutil.which("chromium") is None or not Path(CHROMEDRIVER).exists():
        pytest.skip("Debian's chromium and chromium-driver are not installed "
                    "(apt-get install -y chromium chromium-driver)")

    def no_downloads(*args, **kwargs):
        raise AssertionError("Selenium Manager was asked for a driver; the system chromedriver must be used")

    monkeypatch.setattr(SeleniumManager, "binary_paths", no_downloads)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1280,1600"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    yield driver
    driver.quit()


def visible_tasks(driver) -> list[str]:
    return [row.find_element(By.CSS_SELECTOR, "td.task").text
            for row in driver.find_elements(By.CSS_SELECTOR, "#trajectories tbody tr") if row.is_displayed()]


def test_page_lists_filters_and_opens_a_trajectory(browser, url, tmp_path):
    browser.get(url)
    wait = WebDriverWait(browser, 20)
    wait.until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-loaded") == "true")
    assert visible_tasks(browser) == ["alpha-add", "beta-parse", "gamma-io"]

    Select(browser.find_element(By.ID, "filter-resolved")).select_by_value("yes")
    assert visible_tasks(browser) == ["alpha-add"]
    assert browser.find_element(By.ID, "count").text == "1 of 3 trajectories"
    Select(browser.find_element(By.ID, "filter-resolved")).select_by_value("no")
    Select(browser.find_element(By.ID, "filter-termination")).select_by_value("format_errors")
    assert visible_tasks(browser) == ["gamma-io"]
    Select(browser.find_element(By.ID, "filter-resolved")).select_by_value("")
    Select(browser.find_element(By.ID, "filter-termination")).select_by_value("")
    browser.find_element(By.ID, "filter-task").send_keys("BETA")
    assert visible_tasks(browser) == ["beta-parse"]
    browser.find_element(By.ID, "filter-task").send_keys(Keys.BACKSPACE * 4)
    assert len(visible_tasks(browser)) == 3

    browser.find_element(By.XPATH, "//td[@class='task' and text()='alpha-add']").click()
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#detail .turn")) == 2)
    turns = browser.find_elements(By.CSS_SELECTOR, "#detail .turn")
    assert turns[0].find_element(By.CSS_SELECTOR, "pre.thought").text == "I will run the tests to see the failure."
    assert "pytest -q" in turns[0].find_element(By.CSS_SELECTOR, "pre.call").text
    fold = turns[0].find_element(By.TAG_NAME, "details")  # 60 lines of output are folded, closed
    assert "observation: 60 lines" in fold.text and not fold.find_element(By.TAG_NAME, "pre").is_displayed()
    assert turns[1].find_element(By.CSS_SELECTOR, "pre.observation").text == "(no output)"

    colours = {cls: browser.find_element(By.CSS_SELECTOR, f"#patch .{cls}").value_of_css_property("background-color")
               for cls in ("add", "del", "hunk")}
    assert browser.find_element(By.CSS_SELECTOR, "#patch .add").text == "+    return a + b"
    assert browser.find_element(By.CSS_SELECTOR, "#patch .del").text == "-    return a - b"
    assert colours == {"add": "rgba(230, 255, 236, 1)", "del": "rgba(255, 235, 233, 1)",
                       "hunk": "rgba(221, 244, 255, 1)"}  # green, red, blue
    grade = browser.find_element(By.ID, "grade").text
    assert "resolved" in grade and "FAIL_TO_PASS: 1/1 passing" in grade and "tests/test_core.py::test_add" in grade

    shot = tmp_path / "viewer.png"
    assert browser.save_screenshot(str(shot))
    with Image.open(shot) as image:
        assert image.size[0] >= 1000 and len(image.convert("RGB").getcolors(maxcolors=1_000_000)) > 50


def test_page_shows_thinking_folded(browser, tmp_path):
    thinker = trajectories()[0]
    thinker.turns[0] = thinker.turns[0].model_copy(update={"reasoning": "The sign looks wrong.", "thinking_tokens": 7})
    write(tmp_path / "eval" / "trajectories.jsonl", [thinker])
    server, address = serve(tmp_path / "eval")
    try:
        browser.get(address)
        wait = WebDriverWait(browser, 20)
        wait.until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-loaded") == "true")
        browser.find_element(By.XPATH, "//td[@class='task' and text()='alpha-add']").click()
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#detail .turn")) == 2)
        first = browser.find_elements(By.CSS_SELECTOR, "#detail .turn")[0]
        fold = first.find_element(By.CSS_SELECTOR, "details.thinking")
        assert fold.find_element(By.TAG_NAME, "summary").text.startswith("thinking: 7 tokens")
        assert not fold.find_element(By.TAG_NAME, "pre").is_displayed()
        fold.find_element(By.TAG_NAME, "summary").click()
        assert fold.find_element(By.TAG_NAME, "pre").text == "The sign looks wrong."
    finally:
        server.shutdown()
        server.server_close()
