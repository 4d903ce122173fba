"""Interactive Altair charts of the dashboard, each shown with a CSV download of the frame it draws.

Charts only draw the tidy frames they are given (values from ``moestab.analysis``, shaped by
``moestab.analysis.dashboard_data``), and the CSV is that same frame. Every chart has tooltips; line, step and
zoomable heatmap charts zoom and pan (wheel, drag; double-click resets); clicking a legend entry keeps that run
(shift-click adds runs). Runs keep one colour on every page: their position in the selection.
"""

from __future__ import annotations

import hashlib
import re
import textwrap
from collections.abc import Mapping, Sequence

import altair as alt
import pandas as pd
import streamlit as st

from moestab.analysis.labels import FLOAT_PRECISION

HEIGHT = 340
TAB10 = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
         "#17becf")
FADED = 0.15  # opacity of the runs a legend click did not keep


def color(index: int) -> str:
    """Colour of the ``index``-th selected run (matplotlib's tab10, cycling)."""
    return TAB10[index % len(TAB10)]


def _title(text: str) -> alt.TitleParams:
    """A chart title wrapped to lines that fit a third of a wide page (Vega cuts long one-line titles)."""
    return alt.TitleParams(textwrap.wrap(text, 46), anchor="start", fontSize=13, limit=0)


def _legend() -> alt.Legend:
    """On top, two entries a row: a third of a wide page holds two run names side by side, not more."""
    return alt.Legend(orient="top", title=None, columns=2, labelLimit=300)


def _colour(field: str, colors: Mapping[str, str] | None) -> alt.Color:
    """Nominal colour of ``field``; fixed per run when ``colors`` (label -> colour) is given."""
    scale = alt.Scale(domain=list(colors), range=list(colors.values())) if colors else alt.Undefined
    return alt.Color(f"{field}:N", scale=scale, legend=_legend())


def _scale(log: bool) -> alt.Scale:
    return alt.Scale(type="log") if log else alt.Scale(zero=False)


def _axis(integer: bool = False, log: bool = False, percent: bool = False) -> alt.Axis:
    """Integer ticks for steps and indices; shares in percent (``~p``: 0.5%, 12%); else short numbers (``~g``: 4e-14,
    0.002, 12000), and on a log scale few ticks (Vega draws a grid line per tick)."""
    if integer:
        return alt.Axis(tickMinStep=1, format="d")
    return alt.Axis(format="~p" if percent else "~g", tickCount=4 if log else alt.Undefined)


def value_format(percent: bool) -> str:
    """A tooltip's number format: three significant digits in percent for a share (README's ``14.2%``), else four."""
    return ".3~p" if percent else ".4g"


def lines(
    data: pd.DataFrame,
    x: str,
    y: str,
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    series: str = "run",
    colors: Mapping[str, str] | None = None,
    dash: str | None = None,
    log_x: bool = False,
    log_y: bool = False,
    integer_x: bool = False,
    points: bool | None = None,
    percent: bool = False,
) -> alt.LayerChart:
    """One line per ``series`` value (``dash``: a second field drawn as line style) of ``y`` against ``x``.

    Hovering shows the values at the nearest ``x``; points are drawn when there are few (``points=None``).
    ``percent``: ``y`` is a share, drawn in percent (the frame keeps the fraction).
    """
    keep = alt.selection_point(fields=[series], bind="legend")
    hover = alt.selection_point(on="pointerover", nearest=True, fields=[x], empty=False, clear="pointerout")
    encoding = {
        "x": alt.X(f"{x}:Q", title=xlabel, scale=_scale(log_x), axis=_axis(integer_x, log_x)),
        "y": alt.Y(f"{y}:Q", title=ylabel, scale=_scale(log_y), axis=_axis(log=log_y, percent=percent)),
        "color": _colour(series, colors),
    }
    if dash:
        encoding["strokeDash"] = alt.StrokeDash(f"{dash}:N", legend=_legend())
    tooltip = [series, *([dash] if dash else []), alt.Tooltip(f"{x}:Q"),
               alt.Tooltip(f"{y}:Q", format=value_format(percent))]
    base = alt.Chart(data).encode(**encoding)
    if points is None:
        points = data.groupby(series)[x].count().max() <= 12 if len(data) else False
    line = base.mark_line(point=bool(points)).encode(
        opacity=alt.when(keep).then(alt.value(1.0)).otherwise(alt.value(FADED))
    ).add_params(keep, alt.selection_interval(bind="scales"))
    dots = base.mark_circle(size=70).encode(
        opacity=alt.when(hover).then(alt.value(1.0)).otherwise(alt.value(0.0)), tooltip=tooltip
    ).add_params(hover)
    rule = alt.Chart(data).mark_rule(color="gray", strokeWidth=0.8).encode(x=encoding["x"]).transform_filter(hover)
    return alt.layer(line, dots, rule).properties(title=_title(title), height=HEIGHT)


MARK_DASH = {"warning": [5, 3], "collapse onset": [1, 0]}
"""Line style of each kind of step mark (:func:`with_marks`): a warning dashed, a collapse onset solid."""


def marked(data: pd.DataFrame, marks: pd.DataFrame, x: str = "step") -> pd.DataFrame:
    """``data`` (a lines chart's frame) with ``marks``' rows under it (columns ``run``, ``step``, ``mark``: collapse
    warnings and onsets, :func:`moestab.analysis.dashboard_data.collapse_marks`), their values empty: one frame, so the
    chart's CSV holds the marks too."""
    if marks.empty:
        return data
    return pd.concat([data, marks.rename(columns={"step": x})], ignore_index=True)


def with_marks(chart: alt.LayerChart, data: pd.DataFrame, x: str, colors: Mapping[str, str] | None) -> alt.LayerChart:
    """``chart`` (drawn from ``data``, a :func:`marked` frame) with a vertical rule at each mark's step, in the run's
    colour, dashed for a warning and solid for an onset; the lines leave the mark rows out (their values are empty)."""
    if "mark" not in data or not data["mark"].notna().any():
        return chart
    rules = alt.Chart(data).transform_filter("isValid(datum.mark)").mark_rule(strokeWidth=1.6).encode(
        x=f"{x}:Q", color=_colour("run", colors),
        strokeDash=alt.StrokeDash("mark:N", scale=alt.Scale(domain=list(MARK_DASH), range=list(MARK_DASH.values())),
                                  legend=_legend()),
        tooltip=["run", "mark", alt.Tooltip(f"{x}:Q", title="step")],
    )
    return alt.layer(chart, rules)


def value_colors(values: Sequence[str]) -> dict[str, str]:
    """A fixed colour per value (tab10 in the order given), so a value keeps its colour on every chart of a page."""
    return {value: color(i) for i, value in enumerate(dict.fromkeys(values))}


def _field_legend(field: str, **symbol) -> alt.Legend:
    """A legend of a config field's values (``algo=grpo``): titled by the field, each label without the repeated
    ``field=`` (two legends of long labels side by side would not fit a third of a page), one entry a row, line
    symbols."""
    strip = f"replace(datum.label, /(^|\\/ ){field}=/g, '$1')" if re.fullmatch(r"\w+", field) else "datum.label"
    if field == "group":  # a group of several fields: values only, in the order the group table names them
        strip = "replace(datum.label, /(^|, )\\w+=/g, '$1')"
    return alt.Legend(orient="top", title=field, direction="vertical", labelLimit=260, titleLimit=170,
                      labelExpr=strip, symbolType="stroke", **symbol)


def group_lines(
    data: pd.DataFrame,
    y: str,
    *,
    series: str,
    color_by: str,
    title: str,
    ylabel: str,
    colors: Mapping[str, str],
    dash_by: str | None = None,
    band: tuple[str, str] | None = None,
    x_domain: tuple[int, int] | None = None,
    tooltip: Sequence[str] = (),
    percent: bool = False,
) -> alt.LayerChart:
    """One line per ``series`` value (a group or a run) of ``y`` against ``step``, coloured by the ``color_by`` column
    (``colors``: value -> colour) and dashed by ``dash_by``; ``band``: the columns of a shaded band around each line
    (mean -+ sd). ``x_domain`` puts every chart of a page on one step axis. Hover shows ``series``, the colour and
    dash fields, ``tooltip``'s columns and the values at the nearest step; a legend click keeps a colour. ``percent``:
    ``y`` is a share, drawn in percent (the frame keeps the fraction)."""
    keep = alt.selection_point(fields=[color_by], bind="legend")
    hover = alt.selection_point(on="pointerover", nearest=True, fields=["step"], empty=False, clear="pointerout")
    scale = alt.Scale(domain=list(x_domain), nice=False) if x_domain else alt.Scale(zero=False)
    x = alt.X("step:Q", title="training step", scale=scale, axis=_axis(integer=True))
    y_axis = alt.Y(f"{y}:Q", title=ylabel, scale=alt.Scale(zero=False), axis=_axis(percent=percent))
    number = value_format(percent)
    legend = _field_legend(color_by, symbolStrokeWidth=2.5, symbolOpacity=1.0)  # opaque, though the band shares it
    dash_legend = _field_legend(dash_by or "", symbolStrokeColor="gray", symbolStrokeWidth=2)
    palette = alt.Scale(domain=list(colors), range=list(colors.values()))
    lines = {"x": x, "y": y_axis, "detail": alt.Detail(f"{series}:N"),
             "color": alt.Color(f"{color_by}:N", scale=palette, legend=legend)}
    if dash_by:
        lines["strokeDash"] = alt.StrokeDash(f"{dash_by}:N", legend=dash_legend)
    fields = list(dict.fromkeys([series, color_by, *([dash_by] if dash_by else []), *tooltip]))
    tips = [*fields, alt.Tooltip("step:Q"), alt.Tooltip(f"{y}:Q", format=number)]
    points = data.groupby(series)["step"].count().max() <= 12 if len(data) else False
    line = alt.Chart(data).mark_line(point=bool(points)).encode(
        **lines, opacity=alt.when(keep).then(alt.value(1.0)).otherwise(alt.value(FADED))
    ).add_params(keep, alt.selection_interval(bind="scales"))
    layers = [line]
    if band:
        low, high = band
        shade = alt.Chart(data).mark_area(interpolate="linear").encode(  # its legend merges with the lines'
            x=x, y=alt.Y(f"{low}:Q", title=ylabel, axis=_axis(percent=percent)), y2=f"{high}:Q",
            detail=alt.Detail(f"{series}:N"),
            color=alt.Color(f"{color_by}:N", scale=palette, legend=legend),
            opacity=alt.when(keep).then(alt.value(0.18)).otherwise(alt.value(0.03)),
        )
        layers.insert(0, shade)
        tips += [alt.Tooltip(f"{low}:Q", format=number), alt.Tooltip(f"{high}:Q", format=number)]
    dots = alt.Chart(data).mark_circle(size=70).encode(
        **lines, opacity=alt.when(hover).then(alt.value(1.0)).otherwise(alt.value(0.0)), tooltip=tips
    ).add_params(hover)
    rule = alt.Chart(data).mark_rule(color="gray", strokeWidth=0.8).encode(x=x).transform_filter(hover)
    return alt.layer(*layers, dots, rule).properties(title=_title(title), height=HEIGHT)


def heatmap(
    data: pd.DataFrame,
    x: str,
    y: str,
    value: str,
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    legend: str,
    domain: tuple[float | None, float | None] = (None, None),
    scheme: str = "viridis",
    zoom: bool = False,
    y_order: Sequence | None = None,
    height: int = HEIGHT,
    row_height: int | None = None,
    percent: bool = False,
) -> alt.Chart:
    """A cell per (``x``, ``y``) coloured by ``value`` (NaN cells blank; ``domain``: the colour scale's ends,
    ``None`` for the data's), tooltips on hover.

    ``zoom``: integer ``x`` and ``y`` (steps, layers) on continuous axes, one unit per cell, so the chart zooms
    and pans; else both are ordered categories (``y_order`` top to bottom; default: largest first, so layer 0
    sits at the bottom).

    ``height``: of the whole chart, title, legend and axes included (Streamlit fits a chart to it). ``row_height``
    (categorical ``y`` only): instead, each row gets this many pixels and the title, legend and axes come on top,
    the chart fitting the container's width only. A few rows in a fixed ``height`` would be squeezed to nothing
    by the title and the legend above them. ``percent``: ``value`` is a share, its legend and tooltip in percent.
    """
    if row_height is not None and (zoom or row_height < 1):
        raise ValueError(f"row_height {row_height} needs categorical rows (zoom=False) and at least 1 pixel")
    hover = alt.selection_point(on="pointerover", fields=[x, y], empty=False, clear="pointerout")
    low, high = domain
    scale = alt.Scale(scheme=scheme, domainMin=alt.Undefined if low is None else low,
                      domainMax=alt.Undefined if high is None else high)
    # The colour bar goes on top: beside the cells it would take half of a narrow column.
    colour = alt.Color(f"{value}:Q", title=legend, scale=scale,
                       legend=alt.Legend(orient="top", direction="horizontal", gradientLength=160, titleLimit=300,
                                         format="~p" if percent else alt.Undefined))
    tooltip = [alt.Tooltip(f"{x}:{'Q' if zoom else 'O'}"), alt.Tooltip(f"{y}:{'Q' if zoom else 'O'}"),
               alt.Tooltip(f"{value}:Q", format=value_format(percent))]
    chart = alt.Chart(data)
    if zoom:
        chart = chart.transform_calculate(
            x_from=alt.datum[x] - 0.5, x_to=alt.datum[x] + 0.5, y_from=alt.datum[y] - 0.5, y_to=alt.datum[y] + 0.5
        ).encode(
            x=alt.X("x_from:Q", title=xlabel, axis=_axis(integer=True), scale=alt.Scale(zero=False, nice=False)),
            x2="x_to:Q",
            y=alt.Y("y_from:Q", title=ylabel, axis=_axis(integer=True), scale=alt.Scale(zero=False, nice=False)),
            y2="y_to:Q",
        )
    else:
        sort = list(y_order) if y_order is not None else "descending"
        chart = chart.encode(x=alt.X(f"{x}:O", title=xlabel, axis=alt.Axis(labelAngle=0)),
                             y=alt.Y(f"{y}:O", title=ylabel, sort=sort))
    chart = chart.mark_rect().encode(
        color=colour,
        tooltip=tooltip,
        stroke=alt.when(hover).then(alt.value("white")).otherwise(alt.value(None)),
        strokeWidth=alt.value(1.5),
    ).add_params(hover)
    if zoom:
        chart = chart.add_params(alt.selection_interval(bind="scales"))
    if row_height is not None:  # fit-x: the container's width; the height is the rows' plus what surrounds them
        return chart.properties(title=_title(title), height=alt.Step(row_height), width="container",
                                autosize=alt.AutoSizeParams(type="fit-x", contains="padding"))
    return chart.properties(title=_title(title), height=height, width="container")  # categorical axes too


def stairs(
    hists: pd.DataFrame, colors: Mapping[str, str], *, title: str, xlabel: str, ylabel: str, log_y: bool = True
) -> alt.LayerChart:
    """Overlaid histograms, one outline per run, of a frame with ``run``, ``left``, ``right``, ``count`` and
    ``share`` (:func:`moestab.analysis.dashboard_data.shared_histograms`), the share in percent; empty bins leave a
    gap on a log axis."""
    keep = alt.selection_point(fields=["run"], bind="legend")
    shown = "datum.share > 0 ? datum.share : null" if log_y else "datum.share"
    base = alt.Chart(hists).transform_calculate(shown=shown)
    y = alt.Y("shown:Q", title=ylabel, scale=_scale(log_y), axis=_axis(log=log_y, percent=True))  # shares
    opacity = alt.when(keep).then(alt.value(1.0)).otherwise(alt.value(FADED))
    outline = base.transform_fold(["left", "right"], as_=["edge", "x"]).mark_line(
        invalid="break-paths-filter-domains", strokeWidth=1.6
    ).encode(
        x=alt.X("x:Q", title=xlabel, axis=_axis()), y=y, color=_colour("run", colors), opacity=opacity,
        order=[alt.Order("left:Q"), alt.Order("edge:N")],  # each bin's left then right edge: a step outline
    ).add_params(keep, alt.selection_interval(bind="scales"))
    tips = base.transform_calculate(middle="(datum.left + datum.right) / 2").mark_circle(size=18).encode(
        x="middle:Q", y=y, color=_colour("run", colors), opacity=opacity,
        tooltip=["run", alt.Tooltip("left:Q", format=".4g"), alt.Tooltip("right:Q", format=".4g"), "count:Q",
                 alt.Tooltip("share:Q", format=value_format(True))],
    )
    return alt.layer(outline, tips).properties(title=_title(title), height=HEIGHT)


def grouped_bars(
    data: pd.DataFrame, group: str, value: str, colors: Mapping[str, str], *, groups: Sequence[str], title: str,
    ylabel: str, percent: bool = False,
) -> alt.Chart:
    """Bars of ``value``: one cluster per ``group`` (in ``groups`` order), one bar per run (``run`` column);
    ``percent``: ``value`` is a share, drawn in percent."""
    keep = alt.selection_point(fields=["run"], bind="legend")
    return alt.Chart(data).mark_bar().encode(
        x=alt.X(f"{group}:N", sort=list(groups), title=None, axis=alt.Axis(labelAngle=0)),
        xOffset=alt.XOffset("run:N", sort=list(colors)),
        y=alt.Y(f"{value}:Q", title=ylabel, axis=_axis(percent=percent)),
        color=_colour("run", colors),
        opacity=alt.when(keep).then(alt.value(1.0)).otherwise(alt.value(FADED)),
        tooltip=["run", group, alt.Tooltip(f"{value}:Q", format=value_format(percent)),
                 *(["tokens:Q"] if "tokens" in data else [])],
    ).add_params(keep).properties(title=_title(title), height=HEIGHT)


def csv_bytes(data: pd.DataFrame) -> bytes:
    """``data`` as UTF-8 CSV, without the index (what a chart's download button serves)."""
    return data.to_csv(index=False).encode("utf-8")


def slug(name: str) -> str:
    """A file name from a chart's accessible name: lower case, runs of other characters as ``-``."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:80] or "chart"


ZEROS = "0 at every point"


def flat(data: pd.DataFrame, value: str) -> str | None:
    """Why a chart of ``data``'s ``value`` column would draw nothing but float noise, or None: every finite value 0,
    or zero up to float rounding (below ``moestab.analysis.labels.FLOAT_PRECISION``, e.g. k3 under R3)."""
    if value not in data:
        return None
    values = pd.to_numeric(data[value], errors="coerce").dropna().to_numpy()
    if not len(values) or (abs(values) >= FLOAT_PRECISION).any():
        return None
    if (values == 0).all():
        return ZEROS
    return f"0 at float precision at every point (below {FLOAT_PRECISION:g})"


PENDING = "Drawing {what}…"


def placeholder(what: str):
    """A slot where a chart will be, saying it is being drawn (:data:`PENDING`) while the page reads and shapes its
    data; :func:`show` with ``into=`` puts the chart there. Pages make their slots before the slow work, so the page
    keeps its layout and says what is coming instead of leaving a gap under the tables."""
    slot = st.empty()
    slot.caption(PENDING.format(what=what), help="The chart appears here once its data is read.")
    return slot


def show(chart: alt.TopLevelMixin, data: pd.DataFrame, alt_text: str, value: str | None = None, *,
         into=None) -> None:
    """Render ``chart`` filling its container and, under it, a button that downloads ``data`` (the frame the
    chart draws) as CSV. ``alt_text`` names the chart for screen readers and tests, and the CSV file. With ``value``
    (the column the chart draws), a column that is 0, or 0 up to float rounding, everywhere is said in words instead
    of drawn as if it were signal, and a column that is exactly 0 everywhere is drawn with a caption saying so
    (:func:`flat`). ``into``: a :func:`placeholder`, replaced by the chart."""
    if into is not None:
        with into.container():
            show(chart, data, alt_text, value)
        return
    why = None if value is None else flat(data, value)
    if why is not None and why != ZEROS:  # float noise: not signal, not drawn
        st.info(f"{alt_text}: {why}, so there is nothing to draw.", icon=":material/horizontal_rule:")
        return
    if why == ZEROS:  # a true 0 (an accuracy of 0, no routing change under R3) is data: drawn, and said
        st.caption(f"{alt_text}: {ZEROS}.")
    st.altair_chart(chart, width="stretch", alt=alt_text)
    st.download_button(
        "CSV",
        data=csv_bytes(data),
        file_name=f"{slug(alt_text)}.csv",
        mime="text/csv",
        key=f"csv-{hashlib.sha1(alt_text.encode()).hexdigest()[:12]}",  # one per chart on a page
        on_click="ignore",  # a download needs no rerun
        icon=":material/download:",
        type="tertiary",
        help=f"Download the data of this chart ({len(data)} rows) as CSV",
    )
