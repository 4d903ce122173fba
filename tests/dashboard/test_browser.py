"""The dashboard served by ``moestab dashboard`` and rendered by headless Chromium.

Starts the real server on 127.0.0.1 (a free port) on the session's trained runs, opens the Training
page straight from its URL (a first visit that skips the entry page), waits until the charts have
rendered, checks the title, the charts and that no error box is shown, and saves a screenshot
(to the test's tmp folder; set $MOESTAB_DASHBOARD_SCREENSHOT to keep it, e.g. for the README's image,
which is refreshed from warm-started runs with that variable).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.dashboard.browser import Browser, find_chromium

CHROMIUM = find_chromium()
SCREENSHOT_ENV = "MOESTAB_DASHBOARD_SCREENSHOT"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        CHROMIUM is None,
        reason="no Chromium on PATH (install the Debian package `chromium`; scripts/setup.sh dev does)",
    ),
]

# True once Streamlit has drawn the page: at least `min` chart images, all decoded, and no script
# run in progress (the status widget shows only while the script runs).
READY = """(() => {{
  const images = Array.from(document.querySelectorAll('[data-testid="stImage"] img'));
  const running = document.querySelector('[data-testid="stStatusWidget"]');
  return images.length >= {min} && images.every(i => i.complete && i.naturalWidth > 0) && !running;
}})()"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, server: subprocess.Popen, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise AssertionError(f"the dashboard server exited with code {server.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.3)
    raise AssertionError(f"the dashboard did not answer on {url} within {timeout:.0f} s")


@pytest.fixture
def server(trained_runs: Path, tmp_path: Path):
    """``moestab dashboard RUNS --port P --no-browser`` as a subprocess; yields its base URL."""
    port = free_port()
    log = (tmp_path / "server.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "moestab.cli", "dashboard", str(trained_runs), "--port", str(port), "--no-browser"],
        cwd=tmp_path,
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


def test_training_page_in_chromium(server: str, tmp_path: Path) -> None:
    with Browser(CHROMIUM, width=1400, height=1000) as browser:
        browser.open(f"{server}/training")
        browser.wait_for(READY.format(min=9), timeout=120)
        time.sleep(0.5)  # let the last layout pass settle before the screenshot
        assert "moestab dashboard" in browser.evaluate("document.title")
        assert browser.evaluate("document.querySelector('h1').innerText") == "Training"
        alts = browser.evaluate(
            "Array.from(document.querySelectorAll('[data-testid=\"stImage\"] img')).map(i => i.alt)"
        )
        assert "Reward (mean over the rollout batch) against step" in alts, alts
        assert any(alt.startswith("Eval accuracy") for alt in alts), alts
        errors = browser.evaluate(
            'document.querySelectorAll(\'[data-testid="stAlertContentError"], [data-testid="stException"]\').length'
        )
        assert errors == 0, browser.evaluate("document.body.innerText")
        # The app's own navigation (not Streamlit's legacy pages/ list) and its sidebar are there.
        nav = browser.evaluate("document.querySelector('[data-testid=\"stSidebarNav\"]').innerText")
        assert "Routing volatility" in nav and "app" not in nav.split()
        assert "Runs folder" in browser.evaluate("document.querySelector('[data-testid=\"stSidebar\"]').innerText")
        shot = browser.screenshot(Path(os.environ.get(SCREENSHOT_ENV, tmp_path / "dashboard.png")))
    assert shot.stat().st_size > 20_000  # a page of charts, not a blank or skeleton page
