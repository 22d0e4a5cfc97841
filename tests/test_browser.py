"""What a person sees in the MLflow UI after `examples/rmsnorm_variants.py`, in a real headless Chromium.

A real `mlflow server` on 127.0.0.1 gets the example's runs; Debian's Chromium, driven by Selenium
through Debian's chromedriver (no browser download of any kind), opens the experiment's chart view
and the parent run's artifacts. The checks read the page as rendered: visible text, the chart
cards, and the data each Plotly chart draws. Chromium resolves no host name but 127.0.0.1.

Screenshots go to tmp_path, or to docs/ with MLFLOW_NEURON_UPDATE_SCREENSHOTS=1:

    MLFLOW_NEURON_UPDATE_SCREENSHOTS=1 python -m pytest tests/test_browser.py

Needs `bash .ci/browser.sh` (chromium, chromium-driver) and the `selenium` package; skipped, saying
which is missing, without them.
"""

from __future__ import annotations

import os
import re
import struct
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import ROOT
from mlflow.tracking import MlflowClient
from servers import MlflowServer

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
UPDATE_SCREENSHOTS_ENV = "MLFLOW_NEURON_UPDATE_SCREENSHOTS"
EXPERIMENT = "rmsnorm-variants"
PARENT_PREFIX = "rmsnorm-cpu-"  # the example names each parent run rmsnorm-<device>-<YYYYMMDD-HHMMSS>
VARIANTS = ("naive", "fused", "compiled")
SECTION = "profiler/self_cpu_time_us"
STEP_SERIES = "profiler/step/self_cpu_time_us"
COMPARISON_PNG = "comparison/comparison.png"
WAIT_S = 30
NO_TELEMETRY = {"MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true"}

missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
pytestmark = pytest.mark.skipif(
    bool(missing), reason=f"no {' and '.join(missing)}: run `bash .ci/browser.sh` (Debian's chromium, chromium-driver)"
)
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (it is in the test extra)")
from selenium.common.exceptions import TimeoutException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


@pytest.fixture(scope="module")
def ui(tmp_path_factory):
    """A server holding the example's runs: the experiment, the parent run and its three children."""
    workdir = tmp_path_factory.mktemp("ui")
    with MlflowServer(workdir / "server", env=NO_TELEMETRY) as server:
        example = subprocess.run(
            [sys.executable, str(ROOT / "examples" / "rmsnorm_variants.py"), "--device", "cpu",
             "--tracking-uri", server.uri],
            cwd=workdir, capture_output=True, text=True, timeout=600, env={**os.environ, **NO_TELEMETRY},
        )  # fmt: skip
        assert example.returncode == 0, example.stderr[-3000:]
        client = MlflowClient(server.uri)
        experiment = client.get_experiment_by_name(EXPERIMENT)
        runs = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
        [parent] = [name for name in runs if name.startswith(PARENT_PREFIX)]
        assert set(runs) == {parent, *VARIANTS}
        yield SimpleNamespace(uri=server.uri, client=client, experiment_id=experiment.experiment_id, runs=runs,
                              parent=parent)  # fmt: skip


@pytest.fixture
def browser(tmp_path, monkeypatch):
    monkeypatch.setenv("SE_OFFLINE", "true")  # Selenium Manager: never download a driver or browser
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-dev-shm-usage", "--window-size=1600,1000", f"--user-data-dir={tmp_path / 'chromium-profile'}",
        "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",  # nothing but the test server
    ):  # fmt: skip
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(WAIT_S)
    yield driver
    driver.quit()


@pytest.fixture
def screenshots(tmp_path):
    """Where screenshots go: docs/ when updating them, else the test's tmp_path."""
    folder = ROOT / "docs" if os.environ.get(UPDATE_SCREENSHOTS_ENV) == "1" else tmp_path
    folder.mkdir(exist_ok=True)
    return folder


def wait_for(driver, condition, what: str, timeout: float = WAIT_S):
    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.2).until(lambda d: condition(d))
    except TimeoutException:
        body = driver.find_element(By.TAG_NAME, "body").text[-1500:]
        raise AssertionError(f"timed out waiting for {what}; the page shows:\n{body}") from None


def page_text(driver) -> str:
    return driver.find_element(By.TAG_NAME, "body").text


def close_assistant_panel(driver) -> None:
    """MLflow 3 opens an assistant side panel on first visit; a person would close it."""
    if "MLflow Assistant" not in page_text(driver):
        return
    for button in driver.find_elements(By.CSS_SELECTOR, "button[aria-label='Close']"):
        if button.is_displayed():
            button.click()
            return


def open_chart_view(driver, ui) -> None:
    # workflowType: MLflow 3 opens experiments in its GenAI view; profiles are "Model training".
    driver.get(f"{ui.uri}/#/experiments/{ui.experiment_id}/runs?workflowType=machine_learning&compareRunsMode=CHART")
    parent_cell = f"//div[@role='gridcell'][.//a[normalize-space()='{ui.parent}']]"
    wait_for(driver, lambda d: d.find_elements(By.XPATH, parent_cell), f"the {ui.parent} row")
    close_assistant_panel(driver)
    # Child runs start collapsed under their parent, and charts show only the runs listed.
    driver.find_element(By.XPATH, parent_cell).find_element(By.TAG_NAME, "button").click()
    for name in VARIANTS:
        wait_for(driver, lambda d: d.find_elements(By.XPATH, f"//a[normalize-space()='{name}']"), f"child run {name}")


def chart_cards(driver, expected: int) -> dict[str, list[str]]:
    """Every chart card shown, as {title: names of the runs its chart draws}.

    Cards appear as they are scrolled into view, so this scrolls down until `expected` are there,
    for as long as each scroll brings new ones (a busy machine draws slowly, not wrongly). The names come from the data the Plotly chart draws, not from its legend (which lists every
    visible run, even those without the metric).
    """
    cards: dict[str, list[str]] = {}
    deadline = time.monotonic() + WAIT_S
    while len(cards) < expected and time.monotonic() < deadline:
        found = driver.find_elements(By.CSS_SELECTOR, "[data-testid='experiment-view-compare-runs-card']")
        for card in found:
            title = card.text.split("\n", 1)[0]
            if title in cards:
                continue
            driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", card)
            names = wait_for(
                driver,
                lambda d: d.execute_script(
                    "const plot = arguments[0].querySelector('.js-plotly-plot');"
                    "return plot && plot.data ? plot.data.map(trace => trace.name) : null;", card),
                f"the chart of {title}",
            )  # fmt: skip
            cards[title] = sorted(set(names))
            deadline = time.monotonic() + WAIT_S  # progress: the next card gets the whole wait again
        if found:
            driver.execute_script("arguments[0].scrollIntoView({block: 'start'})", found[-1])
        time.sleep(0.3)
    return cards


def fullscreen_chart(driver, title: str) -> dict[str, list]:
    """Opens the chart card titled `title` full screen; returns what its chart draws, and where.

    {run name: {"points": [(step, value)], "boxes": [on-screen box of each marker]}}, plus
    "_plot" and "_modebar" boxes. In a small card Plotly's toolbar can sit over the top marker;
    full screen, a person sees every marker.
    """
    card = driver.find_element(
        By.XPATH, f"//*[@data-testid='experiment-view-compare-runs-card'][.//*[normalize-space()='{title}']]"
    )
    card.find_element(By.CSS_SELECTOR, "button[data-component-id='fullscreen_button_chartcard']").click()
    dialog_plot = "[role='dialog'] .js-plotly-plot"
    wait_for(driver, lambda d: d.find_elements(By.CSS_SELECTOR, dialog_plot), f"{title} full screen")
    time.sleep(0.5)  # the chart draws after the dialog opens
    return driver.execute_script(
        """
        const plot = document.querySelector('[role=dialog] .js-plotly-plot');
        const box = e => { const b = e.getBoundingClientRect(); return [b.left, b.top, b.right, b.bottom]; };
        const drawn = {_plot: box(plot.querySelector('.nsewdrag')), _modebar: box(plot.querySelector('.modebar'))};
        const traces = plot.querySelectorAll('.scatterlayer .trace');
        plot.data.forEach((t, i) => {
            const run = drawn[t.name] = drawn[t.name] || {points: [], boxes: []};
            t.x.forEach((x, j) => run.points.push([x, t.y[j]]));
            if (traces[i]) traces[i].querySelectorAll('path.point').forEach(p => run.boxes.push(box(p)));
        });
        return drawn;
        """
    )


def inside(inner, outer) -> bool:
    return outer[0] <= inner[0] and outer[1] <= inner[1] and inner[2] <= outer[2] and inner[3] <= outer[3]


def overlaps(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def test_the_chart_view_has_a_section_of_self_cpu_time_charts_one_per_op(ui, browser, screenshots):
    prefix = f"{SECTION}/"
    ops = {name: {k[len(prefix):]: v for k, v in ui.runs[name].data.metrics.items() if k.startswith(prefix)}
           for name in VARIANTS}  # fmt: skip
    all_ops = set().union(*ops.values())
    shared_ops = set.intersection(*(set(o) for o in ops.values()))
    assert "ProfilerStep_" in shared_ops, "the three variants should share ProfilerStep*"

    open_chart_view(browser, ui)
    search = browser.find_element(By.CSS_SELECTOR, "input[placeholder='Search metric charts']")
    search.send_keys(prefix)
    section = re.compile(rf"^{re.escape(SECTION)}\n\((\d+)\)$", re.M)
    header = wait_for(browser, lambda d: section.search(page_text(d)), f"the {SECTION} section")
    assert int(header.group(1)) == len(all_ops)
    wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, ".js-plotly-plot"), "the first charts")
    time.sleep(1)  # let the charts finish drawing for the screenshot
    browser.save_screenshot(str(screenshots / "ui-charts.png"))

    # One chart per op; each draws exactly the variants that ran the op.
    cards = chart_cards(browser, expected=len(all_ops))
    assert cards == {f"{prefix}{op}": sorted(n for n in VARIANTS if op in ops[n]) for op in all_ops}

    # The ops all three ran: one chart holds the three, each at the cycle's step with its value.
    # The search box filters by substring: an op whose key starts another's (aten.t, aten.transpose)
    # never stands alone, so those are left to the cards check above.
    for op in sorted(op for op in shared_ops if not any(o != op and o.startswith(op) for o in all_ops)):
        title = f"{prefix}{op}"
        search.send_keys(Keys.CONTROL, "a")  # clear() bypasses React's onChange: select and overwrite
        search.send_keys(title)
        # typed a key at a time: a prefix of the title can leave another single chart on the way
        wait_for(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, ".js-plotly-plot")) == 1
                 and d.find_elements(By.XPATH, f"//*[normalize-space()='{title}']"), f"only {title}")  # fmt: skip
        drawn = fullscreen_chart(browser, title)
        assert set(drawn) - {"_plot", "_modebar"} == set(VARIANTS)
        for name in VARIANTS:
            history = sorted((m.step, m.value) for m in ui.client.get_metric_history(ui.runs[name].info.run_id, title))
            points = sorted({tuple(p) for p in drawn[name]["points"]})  # Plotly draws each run twice (line, highlight)
            assert [step for step, _ in points] == [step for step, _ in history]
            assert [value for _, value in points] == pytest.approx([value for _, value in history], rel=1e-6)
            assert drawn[name]["boxes"], f"no marker drawn for {name}"
            for marker in drawn[name]["boxes"]:
                assert inside(marker, drawn["_plot"]) and not overlaps(marker, drawn["_modebar"]), (name, marker, drawn)
        dialog = browser.find_element(By.CSS_SELECTOR, "[role='dialog']")
        assert dialog.text.split("\n", 1)[0] == title
        if op == "ProfilerStep_":  # the one docs/ui.md shows: every variant has the step op
            browser.save_screenshot(str(screenshots / "ui-chart-all-variants.png"))
        dialog.find_element(By.CSS_SELECTOR, "button[aria-label='Close']").click()
        wait_for(browser, lambda d: not d.find_elements(By.CSS_SELECTOR, "[role='dialog']"), "the dialog to close")


def test_the_per_step_series_shows_every_profiled_step_of_every_variant(ui, browser, screenshots):
    """`profiler/step/self_cpu_time_us`: one point per profiled step, so noise and outliers show."""
    title = STEP_SERIES
    open_chart_view(browser, ui)
    search = browser.find_element(By.CSS_SELECTOR, "input[placeholder='Search metric charts']")
    search.send_keys(title)
    wait_for(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, ".js-plotly-plot")) == 1, f"only {title}")
    drawn = fullscreen_chart(browser, title)
    assert set(drawn) - {"_plot", "_modebar"} == set(VARIANTS)
    for name in VARIANTS:
        history = sorted((m.step, m.value) for m in ui.client.get_metric_history(ui.runs[name].info.run_id, title))
        assert len(history) == 20  # four cycles of five steps
        points = sorted({tuple(p) for p in drawn[name]["points"]})
        assert [step for step, _ in points] == [step for step, _ in history]
        assert [value for _, value in points] == pytest.approx([value for _, value in history], rel=1e-6)
    time.sleep(0.5)
    browser.save_screenshot(str(screenshots / "ui-step-series.png"))


def test_the_parent_runs_artifacts_show_the_comparison_png(ui, browser, screenshots, tmp_path):
    parent = ui.runs[ui.parent]
    listed = {a.path for a in ui.client.list_artifacts(parent.info.run_id, "comparison")}
    if COMPARISON_PNG not in listed:
        pytest.skip(f"the parent run has no {COMPARISON_PNG} yet (examples/rmsnorm_variants.py does not log it)")
    png = Path(ui.client.download_artifacts(parent.info.run_id, COMPARISON_PNG, str(tmp_path)))
    width, height = struct.unpack(">II", png.read_bytes()[16:24])  # the PNG's IHDR

    run_page = f"{ui.uri}/#/experiments/{ui.experiment_id}/runs/{parent.info.run_id}"
    browser.get(f"{run_page}/artifacts?workflowType=machine_learning")
    wait_for(browser, lambda d: d.find_elements(By.XPATH, "//*[text()='comparison']"), "the comparison folder")
    close_assistant_panel(browser)
    browser.find_element(By.XPATH, "//*[text()='comparison']").click()
    wait_for(browser, lambda d: d.find_elements(By.XPATH, "//*[text()='comparison.png']"), "comparison.png")
    browser.find_element(By.XPATH, "//*[text()='comparison.png']").click()

    wait_for(browser, lambda d: COMPARISON_PNG in page_text(d), "the preview's header")
    shown = wait_for(
        browser,
        lambda d: d.execute_script(
            "return Array.from(document.images).filter(i => i.complete && i.naturalWidth > 0"
            " && i.getBoundingClientRect().width > 100).map(i => [i.naturalWidth, i.naturalHeight]);"
        ),
        "the PNG preview",
    )
    assert [width, height] in shown  # the very PNG, decoded and on screen
    time.sleep(0.5)
    browser.save_screenshot(str(screenshots / "ui-parent-comparison.png"))



def test_a_runs_traces_tab_shows_each_cycle_as_a_timeline(ui, browser, screenshots):
    """Issue 12: the run's Traces tab lists one trace per cycle; opening one shows the cycle's
    ProfilerStep and aten:: spans on the execution timeline."""
    run = ui.runs["naive"]
    traces = ui.client.search_traces(locations=[ui.experiment_id], run_id=run.info.run_id, include_spans=False)
    assert len(traces) == 4  # four cycles
    run_page = f"{ui.uri}/#/experiments/{ui.experiment_id}/runs/{run.info.run_id}"
    browser.get(f"{run_page}/traces?workflowType=machine_learning")
    listed = "//*[starts-with(normalize-space(text()), 'tr-')]"
    wait_for(browser, lambda d: len(d.find_elements(By.XPATH, listed)) == 4, "the run's four traces")
    close_assistant_panel(browser)
    browser.find_element(By.XPATH, listed).click()
    wait_for(browser, lambda d: re.search(r"^ProfilerStep#\d+$", page_text(d), re.M), "the trace's ProfilerStep span")
    toggle = "button[data-component-id='shared.model-trace-explorer.toggle-show-timeline']"
    wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, toggle), "the timeline toggle")
    browser.find_element(By.CSS_SELECTOR, toggle).click()
    time.sleep(1)  # the timeline draws after the toggle
    text = page_text(browser)
    assert re.search(r"^profiler/step_\d+$", text, re.M) and re.search(r"^aten::mul$", text, re.M), text[-1500:]
    browser.save_screenshot(str(screenshots / "ui-trace.png"))
