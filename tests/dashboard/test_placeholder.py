"""A chart's slot says it is being drawn until the chart replaces it (issue 54.10): the page keeps its layout and
says what is coming while its data is read."""

from __future__ import annotations

from streamlit.testing.v1 import AppTest


def _page(draw: bool) -> None:
    import altair as alt
    import pandas as pd

    from moestab.dashboard.kit import charts

    slot = charts.placeholder("the routing chart")
    if draw:
        data = pd.DataFrame({"step": [1, 2], "value": [0.1, 0.2]})
        charts.show(alt.Chart(data).mark_line().encode(x="step", y="value"), data, "routing by step", into=slot)


def test_the_slot_says_drawing_until_the_chart_replaces_it():
    waiting = AppTest.from_function(_page, args=(False,)).run()
    assert [c.value for c in waiting.caption] == ["Drawing the routing chart…"]
    drawn = AppTest.from_function(_page, args=(True,)).run()
    assert not drawn.exception
    assert [c.value for c in drawn.caption] == []
    assert [e.proto.alt for e in drawn.get("vega_lite_chart")] == ["routing by step"]
    assert len(drawn.get("download_button")) == 1  # the CSV under it, in the same slot
