"""``moestab dashboard``: argument parsing and the Streamlit command line it runs; one slow test starts it for real
and stops it with SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
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
    # Always headless: a non-headless Streamlit prompts for an e-mail on a fresh HOME (tests/dashboard/test_serve.py).
    assert command[command.index("--server.headless") + 1] == "true"
    assert command[command.index("--browser.gatherUsageStats") + 1] == "false"
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


def test_app_path_points_at_the_packaged_dashboard() -> None:
    import moestab.dashboard.app

    assert dashboard.app_path() == Path(moestab.dashboard.app.__file__).resolve()


def test_runs_folder_resolution() -> None:
    from moestab.dashboard.kit.ui import runs_dir_from

    assert runs_dir_from(["app.py", "/runs/a"], {"MOESTAB_RUNS": "/env"}) == "/runs/a"
    assert runs_dir_from(["app.py"], {"MOESTAB_RUNS": "/env"}) == "/env"
    assert runs_dir_from(["app.py"], {}) == "runs"
    assert runs_dir_from(["app.py", "--unknown-flag"], {}) == "runs"  # options are not folders


def test_runs_folder_source_and_misspelt_variables() -> None:
    from moestab.dashboard.kit.ui import ignored_runs_env, runs_dir_and_source

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


def _children(pid: int) -> list[int]:
    """Pids of the live processes whose parent is ``pid`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:  # ended while listed
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _answers(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="lists child processes through /proc")
def test_sigterm_stops_streamlit_too_and_frees_the_port(tmp_path: Path) -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    command = [sys.executable, "-m", "moestab.cli", "dashboard", str(tmp_path), "--port", str(port), "--no-browser"]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    servers: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while not _answers(port):
            assert proc.poll() is None and time.monotonic() < deadline, "the dashboard never answered"
            time.sleep(0.2)
        servers = _children(proc.pid)  # Streamlit, listening on the port
        assert len(servers) == 1, servers
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0  # stopping a server is its normal end
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        left = [pid for pid in servers if _alive(pid)]  # reaped by `moestab dashboard`, so not even a zombie
        for pid in left:
            os.kill(pid, signal.SIGKILL)  # this test's own leftover: end it, the assertion says it was there
    assert not left, f"Streamlit (pid {left}) outlived `moestab dashboard`"
    assert not _answers(port)
