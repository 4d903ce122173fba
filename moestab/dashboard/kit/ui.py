"""What every page shares: the runs folder, the sidebar, the run selection and per-run messages.

The selection is a list of run-folder paths in ``st.session_state[SELECTED]``, set on the Runs page
and read by the other pages. The app only reads run folders.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import streamlit as st

from moestab.analysis.dashboard_data import find_runs, run_fingerprint

from . import loaders

RUNS_ENV = "MOESTAB_RUNS"
"""The one environment variable naming the runs folder."""
DEFAULT_RUNS_DIR = "runs"

# Why the sidebar shows the folder it shows (one per source, in the order they are tried).
FROM_ARGV = "from the command line"
FROM_ENV = f"from `${RUNS_ENV}`"
FROM_DEFAULT = f"default: ./{DEFAULT_RUNS_DIR}"
FROM_BOX = "typed in the box above"

# Spellings people try instead of MOESTAB_RUNS (compared upper-cased, without "_" and "-"). They are
# never read, only named in the sidebar: a silently ignored variable shows the wrong folder.
_MISSPELT_RUNS_ENV = re.compile(r"MOESTABRUNS?(DIR|PATH|FOLDER|ROOT)?")

SELECTED = "moestab_selected_runs"
"""Session-state key: run folders (str) chosen for comparison."""
_SELECTED_ROOT = "moestab_selected_root"  # runs folder the selection belongs to
_OFFERED = "moestab_offered_runs"  # readable runs already put in the selection once (a deselected one stays out)
_CONTEXT = "moestab_context"  # this script run's RunsContext
_WATCH = "moestab_watch"  # fingerprints seen by the auto-refresh watcher
_SHOWN = "moestab_shown"  # (run, message) pairs already shown on this page

PAGE_RUNS = "app_pages/runs.py"
SEARCH_DEPTH = 3
"""Levels below the runs folder searched for run folders (:func:`moestab.analysis.dashboard_data.find_runs`)."""
DEEPER = 3
"""Levels below :data:`SEARCH_DEPTH` looked at for run folders to name as too deep (not walked to the bottom)."""
READ_BUDGET_S = 2.0
"""Seconds the Runs page reads runs (into the run index) before it first draws what it has; it reruns until every run
is read, :data:`READ_MORE_S` at a time."""
READ_MORE_S = 10.0
"""Seconds of reading per rerun after the first answer: each rerun also lists the runs folder and redraws the table
(~2-3 s for 10,000 runs), so longer turns read more of the time."""
AUTO_SELECT_MAX = 24
"""Runs a folder may hold for every readable run to be selected when found. Above, none is selected for the user (the
pages would read thousands of runs) and the Runs page is where they choose."""


def runs_dir_and_source(argv: Sequence[str], environ: Mapping[str, str]) -> tuple[str, str]:
    """The runs folder and why it was chosen (:data:`FROM_ARGV`, :data:`FROM_ENV` or :data:`FROM_DEFAULT`):
    the first argument after ``--`` of ``streamlit run app.py -- DIR``, else ``$MOESTAB_RUNS``, else ``runs``."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("runs_dir", nargs="?")
    known, _ = parser.parse_known_args(list(argv[1:]))
    if known.runs_dir:
        return known.runs_dir, FROM_ARGV
    if environ.get(RUNS_ENV):
        return environ[RUNS_ENV], FROM_ENV
    return DEFAULT_RUNS_DIR, FROM_DEFAULT


def runs_dir_from(argv: Sequence[str], environ: Mapping[str, str]) -> str:
    """The runs folder of :func:`runs_dir_and_source`."""
    return runs_dir_and_source(argv, environ)[0]


def ignored_runs_env(environ: Mapping[str, str]) -> list[str]:
    """Set variables that look like a misspelt ``$MOESTAB_RUNS`` (``MOESTAB_RUNS_DIR``, ``MOESTAB_RUN_DIR``,
    ``moestab_runs``, ...), sorted; none when ``$MOESTAB_RUNS`` itself is set."""
    if RUNS_ENV in environ:
        return []
    return sorted(name for name in environ if _MISSPELT_RUNS_ENV.fullmatch(re.sub(r"[_-]", "", name.upper())))


@dataclass(frozen=True)
class RunRef:
    """A run folder as the pages use it."""

    path: str
    """The run folder (cache argument of every loader)."""
    label: str
    """Its path relative to the runs folder (the name shown)."""
    key: loaders.Key
    """Its fingerprint: part of every cache key, so changed files are re-read."""


@dataclass(frozen=True)
class RunsContext:
    """The runs folder of this script run and what is in it."""

    root: Path
    runs: tuple[RunRef, ...]
    problem: str | None
    """Why no run can be listed (missing folder), or ``None``."""
    too_deep: tuple[str, ...] = ()
    """Run folders below :data:`SEARCH_DEPTH` (relative to ``root``): not listed, but named in the sidebar."""

    def by_path(self) -> dict[str, RunRef]:
        return {run.path: run for run in self.runs}

    def keys(self) -> dict[str, loaders.Key]:
        """Run path -> fingerprint, in the listed order."""
        return {run.path: run.key for run in self.runs}

    @property
    def many(self) -> bool:
        """More runs than :data:`AUTO_SELECT_MAX`: nothing is selected or read for the user until they ask."""
        return len(self.runs) > AUTO_SELECT_MAX


def _discover(root: Path) -> RunsContext:
    try:
        # One walk for both: the runs at most SEARCH_DEPTH levels down are what find_runs(root, SEARCH_DEPTH) lists.
        found = find_runs(root, SEARCH_DEPTH + DEEPER)
    except (FileNotFoundError, NotADirectoryError) as exc:
        return RunsContext(root, (), str(exc))
    refs, deeper = [], []
    for folder in found:
        label = "." if folder == root else folder.relative_to(root).as_posix()
        if label.count("/") >= SEARCH_DEPTH:
            deeper.append(label)
        else:
            refs.append(RunRef(str(folder), label, run_fingerprint(folder)))
    return RunsContext(root, tuple(refs), None, tuple(deeper))


def context() -> RunsContext:
    """The :class:`RunsContext` the sidebar built in this script run (built now if it did not)."""
    ctx = st.session_state.get(_CONTEXT)
    if ctx is None:
        ctx = _discover(Path(runs_dir_from(_argv(), os.environ)))
        st.session_state[_CONTEXT] = ctx
    return ctx


def _argv() -> list[str]:
    import sys

    return list(sys.argv)


def _readable(ctx: RunsContext) -> list[str]:
    return [run.path for run in ctx.runs if loaders.info(run.path, run.key).error is None]


def _sync_selection(ctx: RunsContext) -> None:
    """The rule: every run whose run.json is readable is selected when it is first found (at start, or when it
    appears or becomes readable later); a run deselected on the Runs page stays out; runs that are gone leave the
    selection. A new runs folder starts afresh. In a folder of more than :data:`AUTO_SELECT_MAX` runs nothing is
    selected for the user: the runs found are offered, not chosen."""
    readable = [] if ctx.many else _readable(ctx)
    offer = [run.path for run in ctx.runs] if ctx.many else readable
    if st.session_state.get(_SELECTED_ROOT) != str(ctx.root) or SELECTED not in st.session_state:
        st.session_state[_SELECTED_ROOT] = str(ctx.root)
        st.session_state[SELECTED] = readable
        st.session_state[_OFFERED] = set(offer)
        return
    existing = ctx.by_path()
    offered = st.session_state.setdefault(_OFFERED, set())
    kept = [path for path in st.session_state[SELECTED] if path in existing]
    st.session_state[SELECTED] = kept + [path for path in readable if path not in offered and path not in kept]
    offered.update(offer)


def sidebar() -> RunsContext:
    """Draw the sidebar (runs folder, Refresh, auto-refresh, selection) and build the context."""
    default_dir, source = runs_dir_and_source(_argv(), os.environ)
    with st.sidebar:
        st.markdown("### moestab")
        folder = st.text_input(
            "Runs folder",
            value=default_dir,
            key="moestab_runs_dir",
            help="Folder holding run folders (searched 3 levels deep). Set at start-up by "
            f"`moestab dashboard DIR`, `streamlit run dashboard/app.py -- DIR` or `${RUNS_ENV}`.",
        )
        shown = folder or default_dir
        if shown != default_dir:
            source = FROM_BOX
        st.caption(f"Runs folder: `{Path(shown).expanduser().resolve()}` ({source})")
        for name in ignored_runs_env(os.environ):
            st.warning(
                f"`${name}` is set but ignored: the runs folder variable is `${RUNS_ENV}`.",
                icon=":material/warning:",
            )
        if st.button("Refresh", icon=":material/refresh:", help="Re-read every run folder now"):
            loaders.clear()
        ctx = _discover(Path(folder or default_dir).expanduser())
        st.session_state[_CONTEXT] = ctx
        _sync_selection(ctx)
        # A large folder's statuses come from the run index (what the Runs page has read), not from 10,000 run.json.
        known = loaders.overviews(ctx.keys(), budget_s=0.0).rows if ctx.many else None
        running = [run for run in ctx.runs if (known is None or _indexed_status(known.get(run.path)) == "running")
                   and _status(run) == "running"]
        auto = st.toggle(
            "Auto-refresh",
            key="moestab_auto_refresh",
            help="Poll the runs folder and redraw when a file changes (for runs still training).",
        )
        if auto:
            every = st.select_slider("Every (seconds)", options=[2, 5, 10, 30, 60], value=10, key="moestab_every")
            st.fragment(_watch, run_every=every, key="moestab_watch_fragment")(str(ctx.root))
        count = len(st.session_state[SELECTED])
        unread = "" if known is None or len(known) == len(ctx.runs) else f", {len(ctx.runs) - len(known)} not read yet"
        st.caption(f"{len(ctx.runs)} run(s) in `{ctx.root}` ({len(running)} running{unread}); {count} selected for "
                   "comparison.")
        if ctx.many and not count:
            st.caption(f"More than {AUTO_SELECT_MAX} runs: none is selected for you. Choose the runs to compare on the "
                       "Runs page.")
        if ctx.too_deep:
            st.info(
                f"{len(ctx.too_deep)} run folder(s) lie more than {SEARCH_DEPTH} levels below the runs folder and are "
                f"not listed: {some_of(ctx.too_deep)}. Open a folder nearer to them (e.g. "
                f"`{Path(ctx.root, ctx.too_deep[0]).parent.parent}`).",
                icon=":material/subdirectory_arrow_right:",
            )
    return ctx


def some_of(labels: Sequence[str], shown: int = 5) -> str:
    """The first ``shown`` labels in backticks, and how many more."""
    text = ", ".join(f"`{label}`" for label in labels[:shown])
    return text + (f" and {len(labels) - shown} more" if len(labels) > shown else "")


NOT_SELECTED = "not selected on the Runs page"
NAMED = 5
"""Runs named one by one in a message; more are counted."""


def left_out(ctx: RunsContext) -> list[tuple[str, str]]:
    """(run label, why) of every run found that the other pages do not show: not selected on the Runs page, or
    with a run.json that cannot be read (in a folder of many runs, only the selected runs' run.json are read here).
    A run never leaves the views without this saying so."""
    chosen = set(st.session_state.get(SELECTED, []))
    out = []
    for run in ctx.runs:
        error = loaders.info(run.path, run.key).error if run.path in chosen or not ctx.many else None
        if error is not None:
            out.append((run.label, f"run.json cannot be read ({error})"))
        elif run.path not in chosen:
            out.append((run.label, NOT_SELECTED))
    return out


def left_out_text(hidden: Sequence[tuple[str, str]]) -> str:
    """:func:`left_out`'s runs in a sentence, each with its reason; more than :data:`NAMED` runs not selected are
    counted, the first of them named."""
    unselected = [label for label, why in hidden if why == NOT_SELECTED]
    if len(unselected) <= NAMED:
        return "; ".join(f"**{label}** ({why})" for label, why in hidden)
    parts = [f"**{label}** ({why})" for label, why in hidden if why != NOT_SELECTED]
    return "; ".join([*parts, f"{len(unselected):,} runs {NOT_SELECTED} ({some_of(unselected, NAMED)})"])


def _status(run: RunRef) -> str | None:
    loaded = loaders.info(run.path, run.key)
    return None if loaded.value is None else loaded.value.live_status()  # a dead writer's run is "stopped"


def _indexed_status(row: loaders.Loaded | None) -> str | None:
    """The status a run had when the run index read it (``None``: not read, or unreadable)."""
    return None if row is None or row.value is None else row.value.get("status")


def _watch(root: str) -> None:
    """Auto-refresh: rerun the app when a run folder under ``root`` appears or one of its files changes."""
    try:
        seen = {str(folder): run_fingerprint(folder) for folder in find_runs(root)}
    except (FileNotFoundError, NotADirectoryError):
        seen = {}
    previous = st.session_state.get(_WATCH)
    st.session_state[_WATCH] = seen
    if previous is not None and previous != seen:
        st.rerun()


def selected_runs() -> list[RunRef]:
    """The runs chosen on the Runs page whose run.json is readable; says why for the others, and
    points to the Runs page (returning []) when none is chosen."""
    ctx = context()
    if ctx.problem:
        st.warning(f"{ctx.problem}. Choose another folder in the sidebar.", icon=":material/folder_off:")
        return []
    if not ctx.runs:
        st.info(f"No runs in `{ctx.root}` yet: start one with `moestab train --out {ctx.root}/NAME`.")
        return []
    existing = ctx.by_path()
    chosen = [existing[path] for path in st.session_state.get(SELECTED, []) if path in existing]
    if not chosen:
        st.info("No run selected for comparison.")
        st.page_link(PAGE_RUNS, label="Choose runs on the Runs page", icon=":material/table:")
        return []
    runs = []
    for run in chosen:
        info = loaders.info(run.path, run.key)
        if info.error is None:
            runs.append(run)
        else:
            st.error(f"**{run.label}** is left out: {info.error}", icon=":material/error:")
    return runs


def report(run: RunRef, loaded: loaders.Loaded, what: str, missing: str | None = None) -> bool:
    """Show what went wrong reading ``what`` of ``run``; True when ``loaded`` holds a value to draw.

    Skipped parts are warnings (notes while the run is still running, when files may be half
    written), each shown once per page; an error is an error box; no value and no error means the
    run has no ``missing`` (default ``what``) yet, said by :func:`no_data`.
    """
    shown = st.session_state.setdefault(_SHOWN, set())
    running = _status(run) == "running"
    for message in loaded.skipped:
        if (run.path, message) in shown:
            continue
        shown.add((run.path, message))
        if running:
            st.info(f"**{run.label}** (running) — {message}", icon=":material/hourglass_top:")
        else:
            st.warning(f"**{run.label}** — {message}", icon=":material/warning:")
    if loaded.error is not None:
        st.error(f"**{run.label}**: cannot read the {what}: {loaded.error}", icon=":material/error:")
        if loaded.trace:
            with st.expander("Details"):
                st.code(loaded.trace, language="text")
        return False
    if loaded.value is None:
        no_data(run, missing or what)
        return False
    return True


def no_data(run: RunRef, what: str) -> None:
    """Say (once per page) that ``run`` has no ``what``: yet, while it is running; a warning otherwise."""
    shown = st.session_state.setdefault(_SHOWN, set())
    if (run.path, what) in shown:
        return
    shown.add((run.path, what))
    if _status(run) == "running":
        st.info(f"**{run.label}**: no {what} yet (the run is still running).", icon=":material/hourglass_empty:")
    else:
        st.warning(f"**{run.label}**: no {what} in this run.", icon=":material/help:")


def page_header(title: str, caption: str) -> None:
    """Title and caption of a page (and a fresh set of messages already shown on it)."""
    st.session_state[_SHOWN] = set()
    st.title(title)
    st.caption(caption)


def grid(count: int, per_row: int = 3) -> list:
    """``count`` containers laid out ``per_row`` to a row."""
    width = max(1, min(per_row, count))
    cells: list = []
    for start in range(0, count, width):
        cells.extend(st.columns(width)[: count - start])
    return cells
