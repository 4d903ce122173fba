"""Every dashboard page served by ``moestab dashboard`` and rendered by headless Chromium.

Playwright drives the system's Chromium (``executable_path``; no browser is downloaded). The server runs on
127.0.0.1 over the session's two trained runs and a real ``compare`` probe folder of their last checkpoints. Each
page is opened straight from its URL (a first visit that skips the entry page); the test waits until Streamlit
has finished and every chart has drawn, then checks the title, that each Vega-Lite chart is an SVG of nonzero size
with data marks in it, that each has its CSV button and that no error box is shown (charts in closed expanders, such
as the per-run heatmaps, are checked once opened), and saves a screenshot of the whole page as
``dashboard_<page>.png`` (the first page, Compare: ``dashboard_compare.png``): in the test's tmp folder, or in
``$MOESTAB_DASHBOARD_SCREENSHOTS`` (how docs/images is refreshed). ``$MOESTAB_SCREENSHOT_RUNS`` serves that runs
folder instead of the test's own (for the docs' screenshots of longer runs); it needs at least one run and a compare
or numerics probe folder.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from moestab.analysis.compare import DEFAULT_KEYS
from tests.support.dashboard import T_975_DF1, shown_number

try:
    from playwright.sync_api import Browser, Page, sync_playwright
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
except ImportError:  # the dev extra installs it; without it the test is skipped, saying so
    sync_playwright = None

CHROMIUM = next((path for name in ("chromium", "chromium-browser", "google-chrome") if (path := shutil.which(name))),
                None)
SCREENSHOTS_ENV = "MOESTAB_DASHBOARD_SCREENSHOTS"
RUNS_ENV = "MOESTAB_SCREENSHOT_RUNS"
WIDTH, TALLEST = 1400, 6000  # viewport: every page fits, so no chart waits to be scrolled to

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(sync_playwright is None,
                       reason="the playwright package is not installed (pip install -e '.[dev]')"),
    pytest.mark.skipif(CHROMIUM is None,
                       reason="no Chromium on PATH (install the Debian package `chromium`; scripts/setup.sh dev does)"),
]

FLOAT_NOISE_KEY = "mismatch/rollout_old/k3"
# url path -> (title, starts of the accessible names of charts the page must show).
PAGES = {
    # The runs roll out in fp32, so rollout -> trainer k3 is 0 at float precision: said in words, not drawn.
    "": ("Compare", [f"{key} against step, mean ± sd by group" for key in DEFAULT_KEYS if key != FLOAT_NOISE_KEY]),
    "runs": ("Runs", []),
    "training": ("Training", ["Reward (mean over the rollout batch) against step", "Eval accuracy (greedy"]),
    "volatility": ("Routing volatility", ["old → new (trainer, free routing) by step",
                                          "update → old (the two sides of log w) by minibatch",
                                          "old → new (trainer, free routing) by position"]),  # heatmaps: expanders
    "ratios": ("Ratios", ["Histogram of log_w per run", "Clipped tokens (minibatches 2..n) by step"]),
    "attribution": ("Attribution", ["Mean |log w| of flipped and unflipped tokens per run",
                                    "Router flip rate against router margin per run"]),
    "experts": ("Experts", ["Heatmap of expert load by layer for ", "Co-activation matrix of layer "]),
    "probes": ("Probes", ["Router flip rate by layer ("]),
}

# The page's visible chart count once Streamlit has finished the script run, at least ``least`` charts have arrived,
# each is an SVG with marks drawn in it and its CSV button under it, and each visible table has filled its grid (the
# grid's accessible <table> mirror appears once its rows are drawn); else false. Charts and buttons in closed
# expanders do not count; while a rerun is under way (elements of the previous run marked stale) nothing is settled.
SETTLED = """([title, least]) => {
  const h1 = document.querySelector('h1');
  if (!h1 || h1.innerText.trim() !== title || document.querySelector('[data-testid="stStatusWidget"]')) return false;
  if (document.querySelector('[data-stale="true"]')) return false;
  const charts = Array.from(document.querySelectorAll('[data-testid="stVegaLiteChart"]'))
    .filter(c => c.checkVisibility());
  const buttons = Array.from(document.querySelectorAll('[data-testid="stDownloadButton"]'))
    .filter(b => b.checkVisibility()).length;
  const drawn = charts.every(c => c.querySelector('svg g.role-mark path'));
  const tables = Array.from(document.querySelectorAll('[data-testid="stDataFrame"]'))
    .filter(t => t.checkVisibility()).every(t => t.querySelector('table'));  // not those in closed expanders
  return charts.length >= least && buttons === charts.length && drawn && tables ? String(charts.length) : false;
}"""

# Per visible chart: its accessible name, its SVG's size and how many data-mark paths it drew (not axes or legends).
CHARTS = """() => Array.from(document.querySelectorAll('[data-testid="stVegaLiteChart"]'))
    .filter(c => c.checkVisibility()).map(c => {
  const svg = c.querySelector('svg');
  const box = svg ? svg.getBoundingClientRect() : {width: 0, height: 0};
  return {name: c.getAttribute('aria-label'), width: box.width, height: box.height,
          marks: c.querySelectorAll('svg g.role-mark path').length};
})"""

ERRORS = '[data-testid="stAlertContentError"], [data-testid="stException"]'

# Per visible table: its box against the page's main column, and whether its grid fits or scrolls sideways (issue 54.10:
# tables cut off at 1,400 px).
DATAFRAME_BOXES = """() => {
  const main = document.querySelector('[data-testid="stMainBlockContainer"]').getBoundingClientRect();
  return Array.from(document.querySelectorAll('[data-testid="stDataFrame"]')).filter(t => t.checkVisibility())
    .map(t => {
      const box = t.getBoundingClientRect();
      const scroller = t.querySelector('.dvn-scroller');
      return {left: box.left, right: box.right, mainLeft: main.left, mainRight: main.right,
              fits: !scroller || scroller.scrollWidth <= scroller.clientWidth + 1,
              scrolls: !!scroller && ['auto', 'scroll'].includes(getComputedStyle(scroller).overflowX)};
    });
}"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, server: subprocess.Popen, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise AssertionError(f"the dashboard server exited with code {server.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass  # not listening yet
        time.sleep(0.3)
    raise AssertionError(f"the dashboard did not answer on {url} within {timeout:.0f} s")


@pytest.fixture(scope="module")
def served_root(request: pytest.FixtureRequest, tmp_path_factory) -> Path:
    """The two trained runs (linked, not copied) beside a compare probe folder of their last checkpoints and a
    saturation probe folder of one run's checkpoints."""
    if os.environ.get(RUNS_ENV):
        return Path(os.environ[RUNS_ENV]).resolve()
    from moestab.probes import ProbeSettings, load_suite, run_probe, write_probe_folder
    from moestab.probes.checkpoints import resolve_checkpoints

    trained_runs: Path = request.getfixturevalue("trained_runs")
    root = tmp_path_factory.mktemp("served")
    for run in sorted(p for p in trained_runs.iterdir() if p.is_dir()):
        (root / run.name).symlink_to(run, target_is_directory=True)
    last = [resolve_checkpoints([trained_runs / name])[-1] for name in ("gspo-off", "gspo-r2")]
    write_probe_folder(run_probe("compare", last, load_suite("general", 8), ProbeSettings(max_tokens=48)),
                       root / "probes" / "compare")
    every = resolve_checkpoints([trained_runs / "gspo-off"])  # steps 0 and 6: the page's first probe stays compare
    write_probe_folder(run_probe("saturation", every, load_suite("general", 8), ProbeSettings(max_tokens=48)),
                       root / "probes" / "saturation")
    return root


@pytest.fixture(scope="module")
def server(served_root: Path, tmp_path_factory) -> Iterator[str]:
    """``moestab dashboard ROOT --port P --no-browser`` as a subprocess; yields its base URL."""
    with serve(served_root, tmp_path_factory.mktemp("server")) as url:
        yield url


@contextlib.contextmanager
def serve(served_root: Path, folder: Path) -> Iterator[str]:
    """``moestab dashboard served_root`` started in ``folder`` (its log there) until the block ends; yields its URL."""
    port = free_port()
    log = (folder / "server.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "moestab.cli", "dashboard", str(served_root), "--port", str(port), "--no-browser"],
        cwd=folder,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: the streamlit child is stopped with it
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, process)
        yield url
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """The system Chromium, headless, driven by Playwright."""
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                              args=["--disable-dev-shm-usage", "--disable-gpu"])
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": WIDTH, "height": TALLEST})
    context.set_default_timeout(120_000)  # every wait is for what it checks; a loaded machine only makes it longer
    try:
        yield context.new_page()
    finally:
        context.close()


def screenshot_dir(tmp_path: Path) -> Path:
    folder = Path(os.environ.get(SCREENSHOTS_ENV) or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def settle(page: Page, title: str, least: int) -> None:
    """Wait until the page has finished drawing: :data:`SETTLED`, with the same chart count 0.3 s later
    (Streamlit sends a page's elements while its script runs)."""
    seen = None
    while True:
        count = page.wait_for_function(SETTLED, arg=[title, least], timeout=120_000).json_value()
        if count == seen:
            return
        seen = count
        page.wait_for_timeout(300)


COMPARE_CHARTS = len(PAGES[""][1])
"""Charts the Compare page draws for these runs: every default key's but the k3 that is float noise."""


def open_settled(page: Page, url: str, title: str, least: int) -> None:
    """Open ``url`` and wait until its page has finished drawing at least ``least`` charts."""
    page.goto(url)
    settle(page, title, least)


@pytest.mark.parametrize("path", list(PAGES))
def test_page_renders_its_charts_in_chromium(server: str, page: Page, path: str, tmp_path: Path) -> None:
    title, required = PAGES[path]
    open_settled(page, f"{server}/{path}", title, len(required))
    assert "moestab dashboard" in page.title()
    assert page.locator(ERRORS).count() == 0, page.inner_text("body")
    # The app's own navigation (not Streamlit's legacy pages/ list) and its sidebar are there.
    nav = page.inner_text('[data-testid="stSidebarNav"]')
    assert "Routing volatility" in nav and "app" not in nav.split()
    assert "Runs folder" in page.inner_text('[data-testid="stSidebar"]')

    charts = page.evaluate(CHARTS)
    names = [chart["name"] for chart in charts]
    for name in required:
        assert any(n.startswith(name) for n in names), f"no chart {name!r} among {names}"
    for chart in charts:
        assert chart["width"] > 100 and chart["height"] > 100, chart
        assert chart["marks"] > 0, chart
    buttons = page.locator('[data-testid="stDownloadButton"]')
    assert sum(buttons.nth(i).is_visible() for i in range(buttons.count())) == len(charts)  # a CSV under each chart
    if path == "":
        assert f"{FLOAT_NOISE_KEY} against step, mean ± sd by group: 0 at float precision" in page.inner_text("body")
    if path == "runs":
        table = page.locator('[data-testid="stDataFrame"]').first.bounding_box()
        assert table and table["width"] > 100 and table["height"] > 50  # the runs table
    for table in page.evaluate(DATAFRAME_BOXES):  # inside the page's column, every column reachable
        assert table["left"] >= table["mainLeft"] - 1 and table["right"] <= table["mainRight"] + 1, table
        assert table["fits"] or table["scrolls"], table
    assert "Drawing " not in page.inner_text("body")  # every chart's placeholder was replaced by its chart

    # The whole page in one image (the viewport is taller than any page; the image stops under the content).
    bottom = page.evaluate("document.querySelector('[data-testid=\"stMainBlockContainer\"]').getBoundingClientRect()"
                           ".bottom")
    shot = screenshot_dir(tmp_path) / f"dashboard_{path or 'compare'}.png"
    page.screenshot(path=str(shot), clip={"x": 0, "y": 0, "width": WIDTH, "height": min(max(bottom, 800), TALLEST)})
    assert shot.stat().st_size > 30_000  # a page of tables and charts, not a blank or skeleton page


# The text of Vega's tooltip while it is shown, else false.
TOOLTIP_TEXT = """() => {
  const tooltip = document.querySelector('#vg-tooltip-element.visible');
  return tooltip && tooltip.innerText.trim() ? tooltip.innerText : false;
}"""


def hover_tooltip(page: Page, marks, deadline_s: float = 120.0) -> str:
    """The tooltip Vega-Lite shows with the pointer over ``marks``. Waits for the tooltip itself, not for a fixed
    time: under load a chart may take seconds to attach its handlers, and a pointer that arrived before them shows
    nothing until it moves, so the pointer leaves and comes back (a little off the centre each time) until the
    tooltip shows or ``deadline_s`` has passed (issue 55.9). The marks are scrolled into view first: a browser may
    give the page less height than asked for, and a pointer cannot reach what lies below the window. The tooltip's
    text is read in the same step that sees it shown: a tooltip can hide again before a second look (CI once saw it
    shown, then waited 120 s for its text). On failure the message says what the pointer was over."""
    deadline = time.monotonic() + deadline_s
    attempt = 0
    while True:
        marks.scroll_into_view_if_needed()
        box = marks.bounding_box()
        shift = (attempt % 5 - 2) * 0.05  # the centre, then a little either side of it
        x, y = box["x"] + box["width"] * (0.5 + shift), box["y"] + box["height"] * (0.5 + shift)
        page.mouse.move(x, y, steps=4)
        try:
            return page.wait_for_function(TOOLTIP_TEXT, timeout=5_000).json_value()
        except PlaywrightTimeout as error:
            if time.monotonic() > deadline:
                raise AssertionError(f"no tooltip after {attempt + 1} tries; {pointer_report(page, x, y, box)}") \
                    from error
        page.mouse.move(0, 0)  # leave the chart, so that the next arrival is a new pointerover
        attempt += 1


def pointer_report(page: Page, x: float, y: float, box: dict) -> str:
    """What lies under the pointer at (x, y), the marks' box and the window's size: why a hover showed nothing."""
    under = page.evaluate("""([x, y]) => {
      const e = document.elementFromPoint(x, y);
      if (!e) return 'nothing';
      return `${e.tagName} class=${e.getAttribute('class')} in ${e.parentElement?.getAttribute('class')}`;
    }""", [x, y])
    window = page.evaluate("[window.innerWidth, window.innerHeight, window.scrollY]")
    return f"pointer at ({x:.0f}, {y:.0f}) over {under}; marks' box {box}; window (width, height, scrollY) {window}"


def test_charts_answer_the_pointer(server: str, page: Page) -> None:
    """Hovering a line chart shows the values under the pointer; a legend click keeps one run."""
    open_settled(page, f"{server}/training", "Training", 1)
    chart = page.locator('[data-testid="stVegaLiteChart"]').first
    text = hover_tooltip(page, chart.locator("svg g.role-mark").first)
    assert "run" in text and "step" in text and "value" in text, text

    lines = chart.locator("svg g.mark-line.role-mark path")  # one per run, in legend order
    assert lines.count() >= 2 and set(opacities(lines)) == {1.0}
    chart.locator("svg g.role-legend-symbol path").first.click()
    page.wait_for_function("(line) => parseFloat(line.getAttribute('opacity')) < 1", arg=lines.nth(1).element_handle())
    kept = opacities(lines)
    assert kept[0] == 1.0 and max(kept[1:]) < 1.0, kept


def opacities(lines) -> list[float]:
    return [float(lines.nth(i).get_attribute("opacity") or 1.0) for i in range(lines.count())]


def test_heatmaps_answer_the_pointer(server: str, page: Page) -> None:
    """The per-run heatmaps wait in closed expanders under the overlays; opened, they draw, and hovering a layer x
    step heatmap's cell shows its step, layer and value."""
    open_settled(page, f"{server}/volatility", "Routing volatility", 3)
    expanders = page.locator('[data-testid="stExpander"] summary')
    assert expanders.count() == 2 and "gspo-off" in expanders.first.inner_text()  # one per run, closed
    before = page.evaluate(CHARTS)
    assert not any(chart["name"].startswith("Heatmap") for chart in before), before
    expanders.first.click()
    settle(page, "Routing volatility", len(before) + 4)  # its 2 layer x step and 2 layer x position heatmaps
    names = [chart["name"] for chart in page.evaluate(CHARTS)]
    for name in ("Heatmap of routing change old_new by layer and step for gspo-off",
                 "Heatmap of routing change old_new by layer and position for gspo-off"):
        assert name in names, names
    heatmap = page.locator('[data-testid="stVegaLiteChart"][aria-label^="Heatmap of routing change old_new by layer '
                           'and step"]').first
    text = hover_tooltip(page, heatmap.locator("svg g.mark-rect.role-mark").first)
    assert "step" in text and "layer" in text and "changed" in text, text


def test_probe_heatmaps_draw_a_row_per_checkpoint(server: str, served_root: Path, page: Page) -> None:
    """The saturation heatmaps of a run's checkpoints: a visible row per checkpoint (they once drew one row of zero
    height, their title and colour bar taking all of a height meant for the rows)."""
    from moestab.probes import read_probe_folder

    folder = served_root / "probes" / "saturation"
    if not folder.is_dir():
        pytest.skip(f"${RUNS_ENV} serves no probes/saturation folder")
    table = read_probe_folder(folder).tables["saturation"]
    rows, layers = table["checkpoint"].nunique(), table["layer"].nunique()
    open_settled(page, f"{server}/probes", "Probes", 1)
    page.locator('[data-testid="stSelectbox"]').first.click()
    page.get_by_role("option", name="saturation (1 folder(s))").click()
    page.locator('[data-testid="stVegaLiteChart"][aria-label^="Top-1 router saturation"]').wait_for()
    settle(page, "Probes", 2)
    for name in ("Top-k router saturation", "Top-1 router saturation"):
        heatmap = page.locator(f'[data-testid="stVegaLiteChart"][aria-label^="{name}"]')
        cells = heatmap.locator("svg g.mark-rect.role-mark path")
        boxes = [cells.nth(i).bounding_box() for i in range(cells.count())]
        assert len(boxes) == rows * layers, name
        assert min(box["height"] for box in boxes) >= 20, (name, boxes)  # ROW_HEIGHT: 28 px less the stroke
        assert len({round(box["y"]) for box in boxes}) == rows, (name, boxes)


def test_compare_groups_in_chromium(server: str, page: Page, tmp_path: Path) -> None:
    """The first page groups the runs by the config fields that differ (replay off vs R2: one run per group, no
    band); emptying *Group by* puts both runs in one group, drawn as their mean with a shaded mean +- sd band."""
    open_settled(page, f"{server}/", "Compare", COMPARE_CHARTS)
    group_by = page.locator('[data-testid="stMultiSelect"]').filter(has_text="Group by")
    assert "routing_replay" in group_by.inner_text()
    chart = page.locator('[data-testid="stVegaLiteChart"][aria-label^="routing/old_new/changed against step"]')
    assert band_paths(chart) == 0  # a group of one run has no sd
    remove = group_by.locator('button[aria-label^="Remove "]')  # the x on each chosen field
    for _ in range(remove.count()):
        remove.first.click()  # each removal reruns the page
        settle(page, "Compare", COMPARE_CHARTS)
    assert remove.count() == 0
    # While Streamlit reruns, the old chart and its replacement can both be in the page: wait on the page for a chart
    # of that name with a band, not on one element.
    page.wait_for_function(
        """(label) => Array.from(document.querySelectorAll('[data-testid="stVegaLiteChart"]'))
            .some(c => (c.getAttribute('aria-label') || '').startsWith(label)
                       && c.querySelector('svg g.mark-area path[d*="L"]'))""",
        arg="routing/old_new/changed against step")
    settle(page, "Compare", COMPARE_CHARTS)
    assert band_paths(chart) == 1  # one group: "all runs"
    assert page.locator(ERRORS).count() == 0
    shot = screenshot_dir(tmp_path) / "dashboard_compare_one_group.png"
    page.screenshot(path=str(shot), full_page=False)
    assert shot.stat().st_size > 30_000


def band_paths(chart) -> int:
    """Shaded bands (area marks with a drawn outline) of a chart."""
    return chart.locator('svg g.mark-area path[d*="L"]').count()


# Each static table of the page (st.table) as rows of cell texts, header row first.
TABLES = """() => Array.from(document.querySelectorAll('[data-testid="stTable"] table')).map(t =>
    Array.from(t.querySelectorAll('tr'))
        .map(r => Array.from(r.querySelectorAll('th, td')).map(c => c.innerText.trim())))"""

@pytest.fixture(scope="module")
def algo_server(algo_seed_runs: Path, tmp_path_factory) -> Iterator[str]:
    """The dashboard over GRPO (4 steps) and GSPO (5 steps) runs on seeds 0 and 1."""
    with serve(algo_seed_runs, tmp_path_factory.mktemp("algo-server")) as url:
        yield url


def test_grpo_against_gspo_by_how_much_matches_moestab_analyze(algo_server: str, algo_seed_runs: Path,
                                                               page: Page) -> None:
    """"Does GRPO change more routes than GSPO, by how much, with what interval?", read from the rendered Compare page,
    is what ``moestab analyze --steps 1:4`` gives for the same runs and steps: each run's mean old -> new routing change
    over steps 1-4 (GSPO's step 5 left out), paired by seed, their mean difference and its 95% t-interval (t with 1
    degree of freedom in closed form)."""
    open_settled(page, f"{algo_server}/", "Compare", COMPARE_CHARTS)
    page.get_by_text("Paired difference: group").wait_for()
    settle(page, "Compare", COMPARE_CHARTS)
    assert page.locator(ERRORS).count() == 0
    body = page.inner_text("body")
    assert "Every run's mean over steps 1–4, the same steps for every run" in body
    assert "algo=grpo − algo=gspo" in body
    tables = page.evaluate(TABLES)
    paired = next(t for t in tables if "95% interval" in t[0])
    header = paired[0]
    row = next(r for r in paired[1:] if r[0] == "Routing change old → new")
    cell = dict(zip(header, row, strict=True))
    shown = shown_number(cell["difference"])
    low, high = (shown_number(part) for part in cell["95% interval"].split(" to "))

    runs = [algo_seed_runs / f"{algo}-s{seed}" for algo in ("grpo", "gspo") for seed in (0, 1)]
    result = subprocess.run([sys.executable, "-m", "moestab.cli", "analyze", *map(str, runs), "--steps", "1:4",
                             "--json"], capture_output=True, text=True, check=True)
    changed = {record["run"]: record["old_new_changed"] for record in json.loads(result.stdout)}
    d = [changed[f"grpo-s{seed}"] - changed[f"gspo-s{seed}"] for seed in (0, 1)]
    # The check can fail: routes did change in every run, and the two seeds' differences differ (a nonzero interval).
    assert all(value > 0 for value in changed.values()), changed
    assert d[0] != d[1], d
    mean = (d[0] + d[1]) / 2
    half = T_975_DF1 * (abs(d[0] - d[1]) / math.sqrt(2)) / math.sqrt(2)  # t * sd / sqrt(n), sd of two = |d0-d1|/sqrt 2
    for text, value, expected in ((cell["difference"], shown, mean), ("low", low, mean - half),
                                  ("high", high, mean + half)):
        assert value == pytest.approx(expected, rel=5.01e-3, abs=1e-12), (text, cell, expected)  # 3 digits shown
    assert cell["seeds paired"] == "2" and cell["seeds"] == "0, 1"
    # The answer to "does GRPO change more routes": the sign of the difference, and whether the interval holds 0.
    assert (shown > 0) == (mean > 0) and (low < 0 < high) == (mean - half < 0 < mean + half)

    groups = next(t for t in tables if "± se" in t[0])
    grpo = dict(zip(groups[0], next(r for r in groups[1:] if r[:2] == ["Routing change old → new", "algo=grpo"]),
                    strict=True))
    assert shown_number(grpo["mean"]) == pytest.approx((changed["grpo-s0"] + changed["grpo-s1"]) / 2, rel=5.01e-3)
