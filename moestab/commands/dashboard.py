"""``moestab dashboard [RUNS_DIR]``: start the Streamlit dashboard (dashboard/app.py) over run folders.

Runs ``python -m streamlit run dashboard/app.py -- RUNS_DIR`` bound to 127.0.0.1 unless ``--host``
says otherwise. The app lives beside the package in a source checkout (``pip install -e .``).
Ctrl-C or SIGTERM stops Streamlit too (passed on, and waited for), so no server is left listening.
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
    """``dashboard/app.py`` of the source checkout this package is imported from."""
    return Path(__file__).resolve().parents[2] / "dashboard" / "app.py"


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
        "true" if args.no_browser else "false",
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
        print(
            f"moestab dashboard: error: {app} not found; the dashboard ships with the source checkout "
            "(git clone, then `pip install -e .`)",
            file=sys.stderr,
        )
        return 2
    try:
        command = streamlit_command(args, app)
    except ValueError as exc:
        print(f"moestab dashboard: error: {exc}", file=sys.stderr)
        return 2
    if args.runs_dir and not Path(args.runs_dir).is_dir():
        print(f"moestab dashboard: note: {args.runs_dir} does not exist yet; the app will say so", file=sys.stderr)
    print(f"moestab dashboard: serving on http://{args.host}:{args.port} (Ctrl-C to stop)", file=sys.stderr)
    return serve(command)


def serve(command: list[str]) -> int:
    """Run the server ``command`` until it exits; returns its exit status, or 0 when Ctrl-C / SIGTERM stopped it.

    SIGINT and SIGTERM to this process are passed on to the server (its own session, so a terminal's Ctrl-C reaches
    it once) and waited for; a server still running :data:`STOP_TIMEOUT_S` later is killed (exit status 1).
    """
    import signal
    import subprocess
    import time

    child = subprocess.Popen(command, start_new_session=True)
    deadline: list[float] = []  # when the server is killed, once a signal has been passed on

    def forward(signum: int, _frame: object) -> None:
        if not deadline:
            deadline.append(time.monotonic() + STOP_TIMEOUT_S)
        child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        while True:
            try:
                code = child.wait(timeout=0.2)  # polled, so that the deadline is seen
                break
            except subprocess.TimeoutExpired:
                if deadline and time.monotonic() > deadline[0]:
                    child.kill()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if deadline and code == -signal.SIGKILL:
        print(f"moestab dashboard: error: Streamlit had not stopped {STOP_TIMEOUT_S:.0f} s after the signal; killed it",
              file=sys.stderr)
        return 1
    return 0 if deadline else code
