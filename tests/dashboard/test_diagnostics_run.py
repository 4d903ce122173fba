"""A run folder written by the diagnostics call for any trainer (moestab.recording.diagnostics) renders on every
dashboard page without an exception or an error box, and its routing numbers reach the charts' data."""

from __future__ import annotations

from pathlib import Path

from tests.support.dashboard import COMPARE_PAGE, PAGES, chart_alts
from tests.support.runs import diagnostics_run


def test_every_page_renders_a_diagnostics_run(make_app, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    diagnostics_run(runs / "verl-r3")
    at = make_app(runs).run()
    alts = []
    for page in PAGES:
        if page != COMPARE_PAGE:  # the page the app opens on
            at.switch_page(page).run()
        assert not at.exception and not at.error, (page, [e.value for e in at.exception], [e.value for e in at.error])
        alts += chart_alts(at)
    assert any("rollout_old_free" in alt for alt in alts), alts  # its per-layer routing change is drawn
