"""``moestab dashboard``: argument parsing and the Streamlit command line it runs (nothing started here)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from moestab import cli
from moestab.commands import dashboard


def parse(*argv: str):
    return cli.build_parser().parse_args(["dashboard", *argv])


def test_defaults_bind_to_localhost_and_pass_no_folder() -> None:
    args = parse()
    command = dashboard.streamlit_command(args, Path("/x/dashboard/app.py"))
    assert command[:5] == [sys.executable, "-m", "streamlit", "run", "/x/dashboard/app.py"]
    assert command[command.index("--server.address") + 1] == "127.0.0.1"
    assert command[command.index("--server.port") + 1] == "8501"
    assert command[command.index("--server.headless") + 1] == "false"
    assert "--" not in command  # the app falls back to $MOESTAB_RUNS, then runs/


def test_folder_host_port_and_headless(tmp_path: Path) -> None:
    args = parse(str(tmp_path), "--host", "0.0.0.0", "--port", "9000", "--no-browser")
    command = dashboard.streamlit_command(args, Path("app.py"))
    assert command[command.index("--server.address") + 1] == "0.0.0.0"
    assert command[command.index("--server.port") + 1] == "9000"
    assert command[command.index("--server.headless") + 1] == "true"
    # The folder goes after `--` (to the app's sys.argv), made absolute.
    assert command[-2:] == ["--", str(tmp_path.resolve())]


def test_bad_port_is_refused(capsys: pytest.CaptureFixture) -> None:
    assert dashboard.run(parse("--port", "70000")) == 2
    assert "--port must be in 1..65535" in capsys.readouterr().err


def test_app_path_points_at_the_dashboard() -> None:
    assert dashboard.app_path().is_file()
    assert dashboard.app_path().parent.name == "dashboard"


def test_runs_folder_resolution() -> None:
    from tests.dashboard.conftest import REPO

    sys.path.insert(0, str(REPO / "dashboard"))
    try:
        from dashkit.ui import runs_dir_from
    finally:
        sys.path.remove(str(REPO / "dashboard"))
    assert runs_dir_from(["app.py", "/runs/a"], {"MOESTAB_RUNS": "/env"}) == "/runs/a"
    assert runs_dir_from(["app.py"], {"MOESTAB_RUNS": "/env"}) == "/env"
    assert runs_dir_from(["app.py"], {}) == "runs"
    assert runs_dir_from(["app.py", "--unknown-flag"], {}) == "runs"  # options are not folders


def test_runs_folder_source_and_misspelt_variables() -> None:
    from tests.dashboard.conftest import REPO

    sys.path.insert(0, str(REPO / "dashboard"))
    try:
        from dashkit.ui import ignored_runs_env, runs_dir_and_source
    finally:
        sys.path.remove(str(REPO / "dashboard"))
    assert runs_dir_and_source(["app.py", "/a"], {"MOESTAB_RUNS": "/env"}) == ("/a", "from the command line")
    assert runs_dir_and_source(["app.py"], {"MOESTAB_RUNS": "/env"}) == ("/env", "from `$MOESTAB_RUNS`")
    assert runs_dir_and_source(["app.py"], {"MOESTAB_RUNS": ""}) == ("runs", "default: ./runs")  # empty: unset
    assert runs_dir_and_source(["app.py"], {"MOESTAB_RUNS_DIR": "/x"}) == ("runs", "default: ./runs")
    misspelt = ["MOESTAB_RUNS_DIR", "MOESTAB_RUN_DIR", "MOESTAB_RUNSDIR", "MOESTAB_RUN", "moestab_runs"]
    others = ["MOESTAB_CACHE", "MOESTAB_DASHBOARD_SCREENSHOTS", "MOESTAB_SCREENSHOT_RUNS", "MOESTAB_RUNTIME",
              "RUNS_DIR", "HOME"]
    environ = dict.fromkeys(misspelt + others, "/x")
    assert ignored_runs_env(environ) == sorted(misspelt)
    assert ignored_runs_env({**environ, "MOESTAB_RUNS": "/env"}) == []  # the right one is set: nothing to say
