"""Run a pytest selection of this repository against several releases of one dependency (transformers or torch),
each in its own venv, and tabulate the outcome of every test per release: the evidence for pyproject's ranges.

For each version the script

1. makes (or reuses) the venv ``OUT/venvs/<package>-<version>`` with ``python3 -m venv``;
2. installs, in one pip call, the version under test, torch (``--torch``, default constraints.txt's pin, when the
   package is transformers), the extra pins given with ``--with``, and moestab's other requirements (pyproject's
   ``dependencies`` and ``dev`` extra, constrained by constraints.txt without the lines of the transformers stack:
   pip picks tokenizers / huggingface-hub / safetensors compatible with the transformers installed);
3. runs ``python -m pytest -p no:cacheprovider --junitxml=...`` with the given arguments from the repository root
   (``--repo``; with ``--snapshot`` a copy of this checkout's working tree in ``OUT/tree``, so that edits made while
   the versions run do not change what is tested), moestab imported from that tree through PYTHONPATH (not
   installed: pyproject's pins would refuse the version under test);
4. writes ``OUT/<run>/<package>-<version>/`` (install.log, pytest.log, junit.xml, families.json: which families'
   config and router class this release has) and rebuilds, from every run folder under OUT,

   - ``OUT/results.csv``: one row per (run, version, test id) with the outcome and the first line of its error;
   - ``OUT/summary.csv`` and ``OUT/summary.md``: per version passed / failed / errors / skipped, wall times, and the
     families whose parametrised tests fail (first error line each), with the families absent from that release.

Usage (OUT must lie outside the repository):

    python3 scripts/bisect_versions.py --package transformers --versions 5.0.0 5.21.1 --out /work/bisect/tf \\
        --snapshot --run families -- tests/routing/test_all_families.py tests/routing/test_transformers_compat.py
    python3 scripts/bisect_versions.py --package transformers --versions 5.5.3 --out /work/bisect/tf \\
        --repo /work/bisect/tf/tree --run fast -- -m "not slow" -q
    python3 scripts/bisect_versions.py --package torch --versions 2.6.0 --with transformers==5.24.0 \\
        --find-links /tmp/tw --delete-venv --out /work/bisect/torch --run fast -- -m "not slow" --ignore=tests/dashboard
    python3 scripts/bisect_versions.py --out /work/bisect/tf --summarise-only   # rebuild the CSVs and summary

Everything after ``--`` goes to pytest. Versions run one after another (one pytest at a time).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("transformers", "torch")
STACK = ("torch", "transformers", "tokenizers", "huggingface-hub", "safetensors")
"""constraints.txt lines left out: the package under test and what pip must choose to go with it."""
GENERIC_MESSAGES = ("collection failure", "failed on setup", "failed on teardown")
"""junit messages that name no cause: the first ``E`` line of the report is used instead."""

PROBE = """
import importlib.metadata, json, sys
out = {"python": sys.version.split()[0]}
for name in ("tokenizers", "huggingface-hub", "safetensors", "accelerate", "trl"):
    try:
        out[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        out[name] = None
try:
    import torch, transformers
    out["torch"], out["transformers"] = torch.__version__, transformers.__version__
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from moestab.routing.adapters import ADAPTERS
    out["families"] = {a.family: {"model_type": a.family in CONFIG_MAPPING_NAMES,
                                  "router": a.router_type() is not None, "router_class": a.router_class}
                       for a in ADAPTERS}
except Exception as exc:  # the probe reports; the tests will show the failure in full
    out["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
print(json.dumps(out))
"""


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9_.-]*)", requirement)
    if match is None:
        raise SystemExit(f"cannot read the requirement {requirement!r}")
    return normalise(match.group(1))


def moestab_requirements(repo: Path, drop: tuple[str, ...] = ()) -> list[str]:
    """pyproject's dependencies and dev extra (its ``moestab[...]`` self-references expanded), without torch and
    transformers (the bisect picks those) and without the packages named in ``drop``."""
    project = tomllib.loads((repo / "pyproject.toml").read_text())["project"]
    extras = project.get("optional-dependencies", {})
    pending, seen, requirements = [*project["dependencies"], *extras.get("dev", [])], set(), []
    left_out = {"torch", "transformers", *(normalise(name) for name in drop)}
    while pending:
        requirement = pending.pop(0)
        self_reference = re.fullmatch(r"\s*moestab\s*\[([^\]]*)\]\s*", requirement)
        if self_reference:
            for extra in (e.strip() for e in self_reference.group(1).split(",")):
                if extra not in seen:
                    seen.add(extra)
                    pending += extras.get(extra, [])
        elif requirement_name(requirement) not in left_out and requirement not in requirements:
            requirements.append(requirement)
    return requirements


def write_constraints(repo: Path, path: Path, unpin: tuple[str, ...] = ()) -> None:
    """constraints.txt without the transformers-stack lines (STACK) and the packages named in ``unpin``."""
    left_out = {*STACK, *(normalise(name) for name in unpin)}
    kept = []
    for line in (repo / "constraints.txt").read_text().splitlines():
        pin = line.split("#", 1)[0].strip()
        if pin and requirement_name(pin) not in left_out:
            kept.append(pin)
    path.write_text("\n".join(kept) + "\n")


def snapshot(out: Path) -> Path:
    """Copy this repository's working tree (tracked and untracked files git does not ignore) to ``OUT/tree``, so
    that every version runs the same code while the checkout is being edited; ``OUT/tree/SNAPSHOT.txt`` records
    the commit and the files that differed from it."""
    tree = out / "tree"
    shutil.rmtree(tree, ignore_errors=True)
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, tree / name)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    changed = subprocess.run(["git", "-C", str(ROOT), "diff-index", "--name-only", "HEAD"], capture_output=True,
                             text=True).stdout
    (tree / "SNAPSHOT.txt").write_text(f"copied {time.strftime('%Y-%m-%d %H:%M:%S')} from {ROOT}\nHEAD {head}"
                                       f"modified:\n{changed}")
    return tree


def run_logged(command: list[str], log: Path, cwd: Path, env: dict[str, str] | None = None,
               timeout: float | None = None) -> int:
    """Run ``command`` with stdout and stderr appended to ``log``; the exit status (124 on timeout)."""
    with log.open("a") as out:
        out.write(f"$ {' '.join(command)}\n")
        out.flush()
        try:
            return subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                  timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            out.write(f"\n*** timed out after {timeout} s\n")
            return 124


@dataclass
class Job:
    package: str
    version: str
    pins: list[str]
    """Every requirement specifier pinned for this version (the version under test, torch, --with)."""
    venv: Path
    folder: Path
    timing: dict[str, float] = field(default_factory=dict)


def install(job: Job, args: argparse.Namespace, constraints: Path) -> bool:
    """Make or reuse the venv of ``job`` with its pins and moestab's requirements; False when pip fails."""
    log = job.folder / "install.log"
    marker = job.venv / "bisect-pins.json"
    wanted = {"pins": job.pins, "requirements": moestab_requirements(args.repo, tuple(args.drop))}
    if marker.exists() and json.loads(marker.read_text()) == wanted:
        log.write_text(f"reused {job.venv} ({' '.join(job.pins)})\n")
        return True
    shutil.rmtree(job.venv, ignore_errors=True)
    log.write_text("")
    if run_logged([sys.executable, "-m", "venv", str(job.venv)], log, args.out) != 0:
        return False
    links = [arg for directory in args.find_links for arg in ("--find-links", directory)]
    pip = [str(job.venv / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check", *links]
    if run_logged([*pip, "-c", str(constraints), *job.pins, *wanted["requirements"]], log, args.out) != 0:
        return False
    marker.write_text(json.dumps(wanted))
    return True


def run_tests(job: Job, repo: Path, pytest_args: list[str], timeout: float | None) -> int:
    python = str(job.venv / "bin" / "python")
    env = {**os.environ, "PYTHONPATH": str(repo), "PYTHONDONTWRITEBYTECODE": "1",
           "MOESTAB_CACHE": str(job.folder / "moestab-cache")}
    env.pop("VIRTUAL_ENV", None)
    env["PATH"] = f"{job.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    probe = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, env=env, cwd=repo)
    (job.folder / "families.json").write_text(probe.stdout or json.dumps({"error": probe.stderr.strip()[-500:]}))
    log = job.folder / "pytest.log"
    log.write_text("")
    command = [python, "-m", "pytest", "-p", "no:cacheprovider", f"--junitxml={job.folder / 'junit.xml'}",
               f"--basetemp={job.folder / 'tmp'}", *pytest_args]
    status = run_logged(command, log, repo, env=env, timeout=timeout)
    shutil.rmtree(job.folder / "tmp", ignore_errors=True)
    return status


# ---- reading the results back --------------------------------------------------------------------------------
def first_line(element: ET.Element) -> str:
    """The first line of a junit failure / error: its message, else the first ``E`` line of its text."""
    message = (element.get("message") or "").strip().splitlines()
    if message and not message[0].startswith(GENERIC_MESSAGES):
        return message[0].strip()
    lines = [line[1:].strip() for line in (element.text or "").splitlines() if line.startswith("E ")]
    return next((line for line in lines if line), message[0] if message else "")


def junit_rows(junit: Path) -> list[tuple[str, str, str]]:
    """``(test id, outcome, first error line)`` of every test case in a junit file."""
    rows = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        module = case.get("classname", "")
        test_id = f"{module}::{case.get('name')}" if case.get("name") else module
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            found = case.find(tag)
            if found is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                message = first_line(found) if tag != "skipped" else (found.get("message") or "")
                break
        rows.append((test_id, outcome, message))
    return rows


def family_of(test_id: str, families: set[str]) -> str | None:
    match = re.search(r"\[(.*)\]$", test_id)
    if match is None:
        return None
    return next((part for part in match.group(1).split("-") if part in families), None)


def summarise(out: Path) -> None:
    """Rebuild OUT/results.csv, OUT/summary.csv and OUT/summary.md from every run folder under OUT."""
    results, summary, lines = [], [], ["# bisect_versions summary", ""]
    grid: dict[str, dict[str, dict[str, tuple[str, str]]]] = {}  # run -> version -> family -> (state, error)
    metas = sorted(out.glob("*/*/meta.json"),
                   key=lambda p: (p.parent.parent.name, version_key(p.parent.name.split("-", 1)[-1])))
    for meta_file in metas:
        meta = json.loads(meta_file.read_text())
        folder = meta_file.parent
        probe = json.loads((folder / "families.json").read_text()) if (folder / "families.json").exists() else {}
        known = probe.get("families", {})
        typed = {f: s.get("model_type", s.get("config")) for f, s in known.items()}  # "config": first version
        no_type = sorted(f for f in known if not typed[f])
        no_router = sorted(f for f, s in known.items() if typed[f] and not s["router"])
        junit = folder / "junit.xml"
        rows = junit_rows(junit) if junit.exists() else []
        counts = {k: sum(1 for _, o, _ in rows if o == k) for k in ("passed", "failed", "error", "skipped")}
        failing: dict[str, str] = {}
        for test_id, outcome, message in rows:
            results.append([meta["run"], meta["package"], meta["version"], test_id, outcome, message])
            family = family_of(test_id, set(known))
            if outcome in ("failed", "error") and family and family not in failing:
                failing[family] = message
        if rows and known:
            grid.setdefault(meta["run"], {})[meta["version"]] = {
                f: ("absent: no model type" if f in no_type else "absent: no router class" if f in no_router
                    else "fail" if f in failing else "pass", failing.get(f, "")) for f in known}
        summary.append([meta["run"], meta["package"], meta["version"], " ".join(meta["pins"]), meta["installed"],
                        meta.get("pytest_status", ""), counts["passed"], counts["failed"], counts["error"],
                        counts["skipped"], meta["timing"].get("install_s", ""), meta["timing"].get("tests_s", ""),
                        " ".join(sorted(failing)), " ".join(no_type), " ".join(no_router), probe.get("error", "")])
        lines += [f"## {meta['run']}: {meta['package']} {meta['version']} ({' '.join(meta['pins'])})", "",
                  f"- installed: {meta['installed']}; pytest exit {meta.get('pytest_status', '-')}; "
                  f"passed {counts['passed']}, failed {counts['failed']}, errors {counts['error']}, "
                  f"skipped {counts['skipped']}; install {meta['timing'].get('install_s', '-')} s, "
                  f"tests {meta['timing'].get('tests_s', '-')} s"]
        stack = [f"{name} {probe[name]}" for name in ("torch", "transformers", "tokenizers", "huggingface-hub",
                                                      "safetensors", "accelerate", "trl") if probe.get(name)]
        if stack:
            lines.append(f"- versions: {', '.join(stack)}")
        if probe.get("error"):
            lines.append(f"- probe: {probe['error']}")
        if no_type:
            lines.append(f"- absent, model type unknown to this release: {', '.join(no_type)}")
        if no_router:
            lines.append(f"- absent, router class missing (model type known): {', '.join(no_router)}")
        lines += [f"- failing family {family}: {clip(message)}" for family, message in sorted(failing.items())]
        lines += [f"- failing {test_id}: {clip(message)}" for test_id, outcome, message in rows
                  if outcome in ("failed", "error") and family_of(test_id, set(known)) is None]
        lines.append("")
    with (out / "results.csv").open("w", newline="") as f:
        csv.writer(f).writerows([["run", "package", "version", "test_id", "outcome", "first_error_line"], *results])
    with (out / "summary.csv").open("w", newline="") as f:
        csv.writer(f).writerows([["run", "package", "version", "pins", "installed", "pytest_status", "passed",
                                  "failed", "errors", "skipped", "install_s", "tests_s", "failing_families",
                                  "absent_model_type", "absent_router_class", "probe_error"], *summary])
    (out / "summary.md").write_text("\n".join(lines))
    write_family_floors(out, grid)


def write_family_floors(out: Path, grid: dict[str, dict[str, dict[str, tuple[str, str]]]]) -> None:
    """OUT/families.csv: per run and family, its state at every version (pass / fail / absent), the oldest version
    from which it passes at every newer version tested, and the state and first error line just below that."""
    rows = []
    for run, by_version in grid.items():
        versions = sorted(by_version, key=version_key)
        rows.append(["run", "family", "oldest_passing", "just_below", "state_below", "error_below", *versions])
        for family in sorted({f for states in by_version.values() for f in states}):
            states = [by_version[v].get(family, ("-", "")) for v in versions]
            passing = len(versions)  # index of the oldest version from which every newer one passes
            while passing > 0 and states[passing - 1][0] == "pass":
                passing -= 1
            floor = versions[passing] if passing < len(versions) else ""
            below = [versions[passing - 1], *states[passing - 1]] if passing > 0 else ["", "", ""]
            rows.append([run, family, floor, *below, *(state for state, _ in states)])
    with (out / "families.csv").open("w", newline="") as f:
        csv.writer(f).writerows(rows)
    write_family_markdown(out, grid)


MARKS = {"pass": "+", "fail": "x", "absent: no model type": ".", "absent: no router class": "."}
"""One character per (family, version) in OUT/families.md: passes, fails, absent from that release."""


def write_family_markdown(out: Path, grid: dict[str, dict[str, dict[str, tuple[str, str]]]]) -> None:
    """OUT/families.md: per run, a table of every family's state at every version (docs/versions.md quotes it)."""
    lines = []
    for run, by_version in grid.items():
        versions = sorted(by_version, key=version_key)
        lines += [f"### {run}", "", f"`+` passes, `x` fails, `.` absent from the release, one mark per release: "
                  f"{', '.join(versions)}", "", "| family | releases | oldest passing |",
                  "|---|---|---|"]
        for family in sorted({f for states in by_version.values() for f in states}):
            states = [by_version[v].get(family, ("-", ""))[0] for v in versions]
            passing = len(states)
            while passing > 0 and states[passing - 1] == "pass":
                passing -= 1
            floor = versions[passing] if passing < len(versions) else "-"
            lines.append(f"| {family} | `{''.join(MARKS.get(state, '?') for state in states)}` | {floor} |")
        lines.append("")
    (out / "families.md").write_text("\n".join(lines))


def clip(message: str, width: int = 240) -> str:
    return message if len(message) <= width else message[: width - 3] + "..."


def version_key(version: str) -> tuple[int, ...]:
    """``"5.10.4"`` -> ``(5, 10, 4)`` (a local label such as ``+cpu`` ignored)."""
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0]))


# ---- the command line ----------------------------------------------------------------------------------------
def locked(name: str) -> str:
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        pin = line.split("#", 1)[0].strip()
        if pin and requirement_name(pin) == name:
            return pin.split("==", 1)[1]
    raise SystemExit(f"constraints.txt pins no {name}")


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    pytest_args: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, pytest_args = argv[:at], argv[at + 1:]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--package", choices=PACKAGES, default="transformers")
    parser.add_argument("--versions", nargs="+", default=[], help="releases to test, one venv each")
    parser.add_argument("--out", type=Path, required=True, help="output folder (outside the repository)")
    parser.add_argument("--repo", type=Path, default=ROOT,
                        help="the tree whose tests run and whose pyproject / constraints are read (default: this "
                             "checkout; e.g. OUT/tree, made by --snapshot)")
    parser.add_argument("--snapshot", action="store_true",
                        help="first copy this checkout's working tree to OUT/tree and run that (see snapshot())")
    parser.add_argument("--run", default="run", help="name of this pytest selection (a subfolder of OUT)")
    parser.add_argument("--torch", default=locked("torch"), help="torch version when testing transformers")
    parser.add_argument("--with", dest="extra", action="append", default=[],
                        help="another requirement to pin, e.g. transformers==5.24.0 (repeatable)")
    parser.add_argument("--drop", action="append", default=[],
                        help="leave this requirement of pyproject out of the venv (repeatable), e.g. trackio, whose "
                             "huggingface-hub>=1.10 no transformers 4.x accepts")
    parser.add_argument("--unpin", action="append", default=[],
                        help="also leave this package's constraints.txt pin out (repeatable), e.g. sympy, which "
                             "torch 2.6 pins to 1.13.1")
    parser.add_argument("--find-links", action="append", default=["/opt/wheels"], help="extra wheel folders")
    parser.add_argument("--delete-venv", action="store_true", help="remove each venv after its run (disk)")
    parser.add_argument("--timeout", type=float, default=None, help="seconds allowed to one version's pytest")
    parser.add_argument("--summarise-only", action="store_true", help="only rebuild the CSVs and summary")
    args = parser.parse_args(argv)
    args.out, args.repo = args.out.resolve(), args.repo.resolve()
    if args.out == ROOT or ROOT in args.out.parents:
        parser.error(f"--out must lie outside the repository ({ROOT})")
    if not args.summarise_only and not (args.versions and pytest_args):
        parser.error("give --versions and, after --, the pytest arguments")
    return args, pytest_args


def main(argv: list[str] | None = None) -> int:
    args, pytest_args = parse(sys.argv[1:] if argv is None else argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.summarise_only:
        summarise(args.out)
        return 0
    if args.snapshot:
        args.repo = snapshot(args.out)
    constraints = args.out / "constraints-without-stack.txt"
    write_constraints(args.repo, constraints, tuple(args.unpin))
    for version in args.versions:
        pins = [f"{args.package}=={version}", *([f"torch=={args.torch}"] if args.package != "torch" else []),
                *args.extra]
        job = Job(args.package, version, pins, args.out / "venvs" / f"{args.package}-{version}",
                  args.out / args.run / f"{args.package}-{version}")
        shutil.rmtree(job.folder, ignore_errors=True)
        job.folder.mkdir(parents=True)
        meta = {"run": args.run, "package": args.package, "version": version, "pins": pins, "repo": str(args.repo),
                "dropped": args.drop, "unpinned": args.unpin,
                "pytest_args": pytest_args, "installed": False, "timing": job.timing}
        start = time.monotonic()
        meta["installed"] = install(job, args, constraints)
        job.timing["install_s"] = round(time.monotonic() - start)
        print(f"{args.package} {version}: install {'ok' if meta['installed'] else 'FAILED'} "
              f"({job.timing['install_s']} s)", flush=True)
        if meta["installed"]:
            start = time.monotonic()
            meta["pytest_status"] = run_tests(job, args.repo, pytest_args, args.timeout)
            job.timing["tests_s"] = round(time.monotonic() - start)
            print(f"{args.package} {version}: pytest exit {meta['pytest_status']} ({job.timing['tests_s']} s)",
                  flush=True)
        (job.folder / "meta.json").write_text(json.dumps(meta, indent=1))
        if args.delete_venv:
            shutil.rmtree(job.venv, ignore_errors=True)
        summarise(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
