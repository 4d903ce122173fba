"""``moestab dashboard [RUNS_DIR]``: start the Streamlit dashboard (``moestab/dashboard/app.py``) over run folders.

Runs ``python -m streamlit run <app> -- RUNS_DIR`` bound to 127.0.0.1 unless ``--host`` says otherwise, always
headless (Streamlit's first-run e-mail prompt would block a terminal and end a job without a TTY) with usage
statistics off. A taken port is refused before Streamlit starts; "serving on ..." is printed once the server answers,
and then a browser tab opened unless ``--no-browser``. Ctrl-C or SIGTERM stops Streamlit too (passed on, and waited
for), so no server is left listening.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = "Start the Streamlit dashboard comparing the run folders under RUNS_DIR (default: $MOESTAB_RUNS, else runs/)."

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8501
STOP_TIMEOUT_S = 10.0
"""How long Streamlit has to exit after a passed-on Ctrl-C / SIGTERM before it is killed."""
START_TIMEOUT_S = 180.0
"""How long Streamlit has to answer on its port before ``moestab dashboard`` gives up (a loaded 2-core machine
takes ~10 s)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "runs_dir",
        nargs="?",
        metavar="RUNS_DIR",
        help="folder holding run folders (default: $MOESTAB_RUNS, else runs/)",
    )
    parser.add_argument(
        "--host",
        default=DEFAULT_HOST,
        help=f"address to bind (default {DEFAULT_HOST}: this machine only; 0.0.0.0 exposes it to the network)",
    )
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port to serve on (default {DEFAULT_PORT})")
    parser.add_argument("--no-browser", action="store_true", help="do not open a browser tab (headless server)")


def app_path() -> Path:
    """The dashboard's entry script, ``moestab/dashboard/app.py`` of this installation (found without importing it,
    which would import Streamlit)."""
    return Path(__file__).resolve().parents[1] / "dashboard" / "app.py"


def streamlit_command(args: argparse.Namespace, app: Path) -> list[str]:
    """The ``python -m streamlit run ...`` command line for ``args``."""
    if not 1 <= args.port <= 65535:
        raise ValueError(f"--port must be in 1..65535, got {args.port}")
    command = [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(app),
        "--server.address",
        args.host,
        "--server.port",
        str(args.port),
        "--browser.gatherUsageStats",
        "false",
        "--client.toolbarMode",
        "minimal",  # no "Deploy" button: this is a local viewer
        "--server.headless",
        "true",  # never prompts; the browser tab is opened here, once the server answers
    ]
    if args.runs_dir:
        command += ["--", str(Path(args.runs_dir).expanduser().resolve())]
    return command


def run(args: argparse.Namespace) -> int:
    from moestab.extras import MissingExtraError, require

    try:
        require("dashboard", "moestab dashboard")
    except MissingExtraError as exc:
        print(f"moestab dashboard: error: {exc}", file=sys.stderr)
        return 2
    app = app_path()
    if not app.is_file():
        print(f"moestab dashboard: error: {app} not found: this installation of moestab lacks its dashboard; "
              "reinstall it (pip install --force-reinstall 'moestab[dashboard]')", file=sys.stderr)
        return 2
    try:
        command = streamlit_command(args, app)
    except ValueError as exc:
        print(f"moestab dashboard: error: {exc}", file=sys.stderr)
        return 2
    taken = port_taken(args.host, args.port)
    if taken:
        print(f"moestab dashboard: error: cannot serve on {args.host}:{args.port}: {taken}; another server (an earlier "
              "`moestab dashboard`?) holds it: stop that one, or pick a free port with --port", file=sys.stderr)
        return 2
    if args.runs_dir and not Path(args.runs_dir).is_dir():
        print(f"moestab dashboard: note: {args.runs_dir} does not exist yet; the app will say so", file=sys.stderr)
    url = f"http://{args.host}:{args.port}"
    print(f"moestab dashboard: starting Streamlit on {url} ...", file=sys.stderr)
    return serve(command, url, probe=(_probe_host(args.host), args.port), open_browser=not args.no_browser)


def port_taken(host: str, port: int) -> str:
    """Why ``host:port`` cannot be bound now (the OS's words), or "" when it can.

    Bound as the server binds it (``SO_REUSEADDR``, as Tornado does), so a port left in TIME_WAIT by a stopped server
    counts as free, and a listening one as taken.
    """
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return f"cannot resolve --host {host!r} ({exc.strerror})"
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            return exc.strerror or str(exc)
    return ""


def _probe_host(host: str) -> str:
    """Where to look for the server bound to ``host`` (a wildcard address answers on loopback)."""
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)


def answers(host: str, port: int) -> bool:
    """Whether Streamlit's health endpoint on ``host:port`` answers "ok" (the app is served, not just the port open)."""
    import http.client

    connection = http.client.HTTPConnection(host, port, timeout=2)
    try:
        connection.request("GET", "/_stcore/health")
        response = connection.getresponse()
        return response.status == 200 and response.read().strip() == b"ok"
    except OSError:  # refused or reset while Streamlit starts: not serving yet
        return False
    finally:
        connection.close()


def open_tab(url: str) -> None:
    """Open ``url`` in the desktop's browser; without a display say so (a terminal browser would take the terminal)."""
    import os
    import webbrowser

    if sys.platform in ("darwin", "win32") or os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"):
        try:
            if webbrowser.open(url):
                return
        except webbrowser.Error:
            pass  # no usable browser: the note below says what to do
    print(f"moestab dashboard: no browser to open here; open {url} in yours (over SSH: ssh -L "
          f"{url.rsplit(':', 1)[1]}:localhost:{url.rsplit(':', 1)[1]} this-host)", file=sys.stderr)


def serve(command: list[str], url: str, *, probe: tuple[str, int], open_browser: bool) -> int:
    """Run the server ``command`` until it exits; returns its exit status, or 0 when Ctrl-C / SIGTERM stopped it.

    "serving on ``url``" is printed once the server answers on ``probe`` (host, port), then a browser tab is opened
    when ``open_browser``. A server that exits before it answers is an error (1, or its own non-zero status), and so
    is one that has not answered :data:`START_TIMEOUT_S` after the start (stopped). SIGINT and SIGTERM to this
    process are passed on to the server (its own session, so a terminal's Ctrl-C reaches it once) and waited for; a
    server still running :data:`STOP_TIMEOUT_S` later is killed (exit status 1).
    """
    import signal
    import subprocess
    import time

    child = subprocess.Popen(command, stdin=subprocess.DEVNULL, start_new_session=True)
    deadline: list[float] = []  # when the server is killed, once a signal has been passed on
    started = time.monotonic()
    serving = False

    def forward(signum: int, _frame: object) -> None:
        if not deadline:
            deadline.append(time.monotonic() + STOP_TIMEOUT_S)
        child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while True:
            try:
                code = child.wait(timeout=0.2)  # polled, so that the deadlines and the port are seen
                break
            except subprocess.TimeoutExpired:
                if deadline and time.monotonic() > deadline[0]:
                    child.kill()
                elif not serving and not deadline:
                    if answers(*probe):
                        serving = True
                        print(f"moestab dashboard: serving on {url} (Ctrl-C to stop)", file=sys.stderr)
                        if open_browser:
                            open_tab(url)
                    elif time.monotonic() - started > START_TIMEOUT_S:
                        print(f"moestab dashboard: error: Streamlit did not answer on {url} within "
                              f"{START_TIMEOUT_S:.0f} s; stopping it", file=sys.stderr)
                        forward(signal.SIGTERM, None)
                        deadline.append(float("nan"))  # marks the stop as this function's, not the user's
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if deadline and code == -signal.SIGKILL:
        print(f"moestab dashboard: error: Streamlit had not stopped {STOP_TIMEOUT_S:.0f} s after the signal; killed it",
              file=sys.stderr)
        return 1
    if len(deadline) > 1:  # stopped here for not answering
        return 1
    if deadline:
        return 0
    if not serving:
        print(f"moestab dashboard: error: Streamlit exited (status {code}) before serving on {url}; its messages are "
              "above", file=sys.stderr)
        return code if code > 0 else 1
    return code
