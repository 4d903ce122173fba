"""The dashboard serves on a fresh machine: an empty HOME and no terminal (a job, CI), from the checkout's
``streamlit run dashboard/app.py`` and from an installed wheel; a taken port is refused before Streamlit starts.

Streamlit's first-run "Welcome to Streamlit! Email:" prompt, shown when a server is not headless and HOME holds no
credentials, blocks a terminal and ends a process without one (exit 255, nothing listening): these tests start every
server that way and fetch its page.
"""

from __future__ import annotations

import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from tests.support.dashboard import REPO

pytest.importorskip("streamlit", reason="the dashboard extra is not installed")

START_S = 180.0  # a loaded 2-core machine starts Streamlit in ~10-40 s


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def fresh_env(home: Path) -> dict[str, str]:
    """This environment with an empty HOME (no ~/.streamlit: no credentials, no config) and no display."""
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMLIT_") and k not in ("DISPLAY",
                                                                                              "WAYLAND_DISPLAY")}
    env["HOME"] = str(home)
    return env


def get(port: int, path: str) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def start(command: list[str], *, cwd: Path, env: dict[str, str], log: Path) -> subprocess.Popen:
    """``command`` with no terminal: stdin from /dev/null, its own session (no controlling TTY), output to ``log``."""
    with log.open("wb") as out:
        return subprocess.Popen(command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


def wait_for(proc: subprocess.Popen, log: Path, ready) -> str:
    """The log once ``ready(log_text)`` holds; fails with the log when the process ends or START_S passes first."""
    deadline = time.monotonic() + START_S
    while True:
        text = log.read_text(errors="replace")
        if ready(text):
            return text
        assert proc.poll() is None, f"exited {proc.returncode} before serving:\n{text}"
        assert time.monotonic() < deadline, f"not serving after {START_S:.0f} s:\n{text}"
        time.sleep(0.2)


def stop(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)  # the group: `moestab dashboard` and the Streamlit it started
        try:
            return proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode


def assert_serves_the_app(port: int, text: str) -> None:
    assert "Email" not in text and "Welcome to Streamlit" not in text, text  # never the first-run prompt
    status, body = get(port, "/_stcore/health")
    assert (status, body.strip()) == (200, b"ok"), (status, body)
    status, page = get(port, "/")
    assert status == 200 and b"<title>Streamlit</title>" in page and b'id="root"' in page, page[:300]


def moestab_dashboard(python: str, runs: Path, port: int, *extra: str) -> list[str]:
    return [python, "-m", "moestab.cli", "dashboard", str(runs), "--port", str(port), *extra]


@pytest.mark.slow
def test_moestab_dashboard_serves_with_an_empty_home_and_no_terminal(tmp_path: Path) -> None:
    port, log = free_port(), tmp_path / "log"
    # No --no-browser: the server is headless all the same (no display here, so no tab is opened either).
    proc = start(moestab_dashboard(sys.executable, tmp_path / "runs", port), cwd=tmp_path,
                 env=fresh_env(tmp_path / "home"), log=log)
    try:
        text = wait_for(proc, log, lambda t: "serving on" in t)
        # "serving on" comes once the app answers: fetched right after the line appears, it does.
        assert f"serving on http://127.0.0.1:{port}" in text
        assert_serves_the_app(port, text)
    finally:
        assert stop(proc) == 0


@pytest.mark.slow
def test_streamlit_run_from_the_checkout_is_headless_by_its_config(tmp_path: Path) -> None:
    port, log = free_port(), tmp_path / "log"
    command = [sys.executable, "-m", "streamlit", "run", "dashboard/app.py", "--server.port", str(port), "--",
               str(tmp_path / "runs")]  # as README says, from the repository root: .streamlit/config.toml applies
    proc = start(command, cwd=REPO, env=fresh_env(tmp_path / "home"), log=log)
    try:
        wait_for(proc, log, lambda t: f":{port}" in t)  # Streamlit's own "URL: http://...:port" line
        text = wait_for(proc, log, lambda t: get_ok(port))
        assert_serves_the_app(port, text)
        assert "gatherUsageStats" not in text  # the usage-statistics notice is shown only while they are on
        assert f"127.0.0.1:{port}" in text and "Network URL" not in text  # bound to loopback, as moestab dashboard
    finally:
        stop(proc)


def get_ok(port: int) -> bool:
    try:
        return get(port, "/_stcore/health")[0] == 200
    except OSError:
        return False


def test_a_taken_port_is_refused_before_streamlit_starts(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = subprocess.run(moestab_dashboard(sys.executable, tmp_path / "runs", port, "--no-browser"),
                              cwd=tmp_path, env=fresh_env(tmp_path / "home"), stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done
    assert f"cannot serve on 127.0.0.1:{port}" in done.stderr and "--port" in done.stderr, done.stderr
    assert "serving on" not in done.stderr and "starting Streamlit" not in done.stderr


def test_the_port_check_sees_a_listening_port_and_a_free_one() -> None:
    from moestab.commands.dashboard import port_taken

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        assert port_taken("127.0.0.1", port)  # the OS's reason ("Address already in use")
    assert port_taken("127.0.0.1", port) == ""  # closed: free again
    assert "cannot resolve" in port_taken("no-such-host.invalid", port)


def build_wheel(tmp_path: Path) -> Path:
    """moestab's wheel, built from a copy of this working tree (no build isolation: no registry needed)."""
    tree = tmp_path / "src"
    shutil.copytree(REPO, tree, ignore=shutil.ignore_patterns(".git", ".venv*", "build", "*.egg-info", "runs",
                                                               "__pycache__", ".pytest_cache", ".ruff_cache"))
    out = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                    str(tree)], check=True, capture_output=True, timeout=600)
    (wheel,) = out.glob("moestab-*.whl")
    return wheel


@pytest.mark.slow
def test_the_wheel_ships_the_dashboard_and_it_serves_from_a_new_venv(tmp_path: Path) -> None:
    import zipfile

    wheel = build_wheel(tmp_path)
    names = set(zipfile.ZipFile(wheel).namelist())
    for page in ("app.py", "app_pages/compare.py", "app_pages/probes.py", "kit/ui.py"):
        assert f"moestab/dashboard/{page}" in names, sorted(n for n in names if "dashboard" in n)
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), "the wheel carries the LICENSE"
    # A new venv holding the wheel; its dependencies come from this environment (a path line, not this
    # environment's .pth files, so the editable checkout of moestab is not importable there).
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "-q", str(wheel)],
                   check=True, capture_output=True, timeout=600)
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    (Path(site) / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    where = subprocess.run([python, "-c", "import moestab.dashboard.app as a; print(a.__file__)"], cwd=tmp_path,
                           check=True, capture_output=True, text=True).stdout.strip()
    assert Path(where).is_relative_to(venv), where  # the installed copy, not the checkout
    port, log = free_port(), tmp_path / "log"
    proc = start(moestab_dashboard(python, tmp_path / "runs", port, "--no-browser"), cwd=tmp_path,
                 env=fresh_env(tmp_path / "home"), log=log)
    try:
        text = wait_for(proc, log, lambda t: "serving on" in t)
        assert_serves_the_app(port, text)
    finally:
        assert stop(proc) == 0
    # The installed app runs every page's script (AppTest, in the new venv): its pages and imports resolve there.
    check = ("import sys; from streamlit.testing.v1 import AppTest; import moestab.dashboard.app as a\n"
             f"sys.argv = [a.__file__, {str(tmp_path / 'runs')!r}]\n"
             "at = AppTest.from_file(a.__file__, default_timeout=120); at.run()\n"
             "assert not at.exception, [e.value for e in at.exception]\n"
             "for page in ('runs', 'training', 'volatility', 'ratios', 'attribution', 'experts', 'probes'):\n"
             "    at.switch_page(f'app_pages/{page}.py').run()\n"
             "    assert not at.exception, (page, [e.value for e in at.exception])\n"
             "print('pages ok')")
    done = subprocess.run([python, "-c", check], cwd=tmp_path, env=fresh_env(tmp_path / "home"),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "pages ok" in done.stdout, done.stdout + done.stderr
