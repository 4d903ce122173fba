"""Does moestab install where MoE RL runs, without moving the framework's torch or transformers? Checked with pip's
own resolver against the registry, in dry runs that read each wheel's metadata only: PyPI serves no separate metadata
file for some CUDA wheels (nvidia-cublas 13.1.1.3: 423 MB), and without ``--use-feature=fast-deps`` (HTTP range
requests into the wheel) pip's dry run downloads them whole, which once filled a CI machine's disk.

    .venv/bin/python scripts/check_installs.py [--out REPORT.md]   # any python with packaging

For each framework below, pip resolves the framework alone and the framework beside moestab (the wheel of this
checkout, core install); the check fails when the pair does not resolve or resolves another torch or transformers
than the framework alone. Frameworks the registry does not serve (prime-rl: Python 3.12 only, not on PyPI) are
checked from their declared pins with ``packaging``. Then every extra must resolve: ``[dev]`` (which holds ``[all]``
and so every user-facing extra), ``[vllm]`` and ``[megatron]``. pip runs with ``PIP_CONFIG_FILE=/dev/null`` and
without ``PIP_FIND_LINKS`` and the like: this machine's local wheel folders and its torch cap play no part, so the
answer is the registry's, as a user's pip sees it. A resolution that fails for the network or the disk (after pip's
own retries and one more try) is reported as not checked, with pip's words, and does not fail the run: it says nothing
about moestab. Exit status 0 when every check that ran passes, 1 otherwise; the table is printed (and written to
``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WATCHED = ("torch", "transformers")
"""The packages a framework pins that moestab must not move."""


@dataclass(frozen=True)
class Framework:
    name: str
    requirements: tuple[str, ...]

    @property
    def package(self) -> str:
        """The framework's distribution name (its first requirement's)."""
        from packaging.requirements import Requirement

        return Requirement(self.requirements[0]).name


FRAMEWORKS = (
    Framework("vLLM 0.33.0", ("vllm==0.33.0",)),
    Framework("verl 0.9.1", ("verl==0.9.1",)),
    Framework("SGLang (newest)", ("sglang",)),
    Framework("Megatron-Core 0.16.1", ("megatron-core==0.16.1",)),
    Framework("TRL 1.16.0", ("trl==1.16.0",)),
)


@dataclass(frozen=True)
class DeclaredPins:
    """A framework the registry does not serve: the versions its own lock installs, and where they were read."""

    name: str
    pins: dict[str, str]
    source: str


NOT_ON_PYPI = (
    DeclaredPins("prime-rl 0.8.0", {"torch": "2.11.0", "transformers": "5.6.2"},
                 "PrimeIntellect-ai/prime-rl pyproject.toml (transformers==5.6.2, torch>=2.9.0) and uv.lock "
                 "(torch 2.11.0+cu128) at 559b447, 2026-08-21; requires Python ~=3.12"),
)
EXTRA_SETS = ("dev", "vllm", "megatron")
"""Extras resolved on their own: dev holds all, and all every user-facing extra."""


@dataclass(frozen=True)
class Resolution:
    ok: bool
    versions: dict[str, str]
    error: str = ""
    unreachable: bool = False
    """The failure was the network's or the disk's, not the resolver's."""


UNREACHABLE = ("connection", "incomplete-download", "download failed", "read timed out", "no space left on device",
               "temporary failure in name resolution", "max retries exceeded", "http error 5")
"""Words in pip's error that blame the network or the disk (lower case)."""


LOCAL_SOURCES = ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_CONSTRAINT", "PIP_NO_INDEX")
"""pip settings that add this machine's own wheels or caps to what the registry serves: left out."""


def pip_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in LOCAL_SOURCES}
    return {**env, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def blames_the_machine(stderr: str) -> bool:
    """Whether pip's error is the network's or the disk's rather than the resolver's."""
    return any(word in stderr.lower() for word in UNREACHABLE)


def resolve(python: Path, requirements: list[str], tries: int = 2) -> Resolution:
    """pip's resolution of ``requirements`` in a dry run: every package it would install, or its error. A failure
    that blames the network or the disk is tried again, ``tries`` times in all."""
    for _ in range(tries):
        with tempfile.NamedTemporaryFile(suffix=".json") as report:
            out = subprocess.run([str(python), "-m", "pip", "install", "--dry-run", "--ignore-installed", "-q",
                                  "--use-feature=fast-deps", "--retries", "8", "--report", report.name,
                                  *requirements], capture_output=True, text=True, env=pip_env())
            if out.returncode == 0:
                installed = json.loads(Path(report.name).read_text())["install"]
                return Resolution(True, {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in installed})
        lines = [line for line in out.stderr.splitlines() if line.strip() and "fast-deps" not in line]
        failure = Resolution(False, {}, " / ".join(lines[-6:]), unreachable=blames_the_machine(out.stderr))
        if not failure.unreachable:
            return failure
    return failure


def moved(alone: Resolution, together: Resolution) -> list[str]:
    """The watched packages whose version differs once moestab is added (``name a -> b``), or why it cannot be said."""
    if alone.unreachable or together.unreachable:
        return [f"not checked: {(alone if alone.unreachable else together).error}"]
    if not alone.ok:
        return [f"the framework alone does not resolve: {alone.error}"]
    if not together.ok:
        return [f"does not resolve beside moestab: {together.error}"]
    # A watched package the framework does not install at all (Megatron-Core has no transformers) is moestab's to add.
    return [f"{name} {alone.versions[name]} -> {together.versions.get(name, '-')}" for name in WATCHED
            if name in alone.versions and alone.versions[name] != together.versions.get(name)]


def declared_ranges() -> dict[str, str]:
    """pyproject's specifiers for the watched packages."""
    from packaging.requirements import Requirement

    out = {}
    for line in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]:
        requirement = Requirement(line)
        if requirement.name in WATCHED:
            out[requirement.name] = str(requirement.specifier)
    return out


def outside(pins: dict[str, str], ranges: dict[str, str]) -> list[str]:
    """The pins that moestab's declared ranges refuse (``name version not in spec``)."""
    from packaging.specifiers import SpecifierSet

    return [f"{name} {version} not in {ranges[name]}" for name, version in pins.items()
            if name in ranges and version not in SpecifierSet(ranges[name])]


def build(workdir: Path) -> tuple[Path, Path]:
    """A venv with a current pip, and moestab's wheel built from this checkout."""
    venv = workdir / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--upgrade", "pip", "packaging"], check=True,
                   env=pip_env())
    built = subprocess.run([str(python), "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(workdir), str(ROOT)],
                           capture_output=True, text=True, env=pip_env())
    if built.returncode != 0:
        raise SystemExit(f"check_installs: building moestab's wheel failed:\n{built.stdout}{built.stderr}")
    wheel = next(workdir.glob("moestab-*.whl"))
    return python, wheel


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="also write the table (markdown) here")
    args = parser.parse_args(argv)
    rows, failed, unchecked = ["| check | resolved | result |", "|---|---|---|"], 0, 0
    with tempfile.TemporaryDirectory(prefix="moestab-installs-") as tmp:
        python, wheel = build(Path(tmp))
        moestab = f"moestab @ {wheel.as_uri()}"
        jobs = {f.name: (list(f.requirements), [*f.requirements, moestab]) for f in FRAMEWORKS}
        with ThreadPoolExecutor(max_workers=4) as pool:
            pairs = {name: (pool.submit(resolve, python, a), pool.submit(resolve, python, b))
                     for name, (a, b) in jobs.items()}
            extras = {extra: pool.submit(resolve, python, [f"moestab[{extra}] @ {wheel.as_uri()}"])
                      for extra in EXTRA_SETS}
            for framework, (alone, together) in zip(FRAMEWORKS, pairs.values(), strict=True):
                problems = moved(alone.result(), together.result())
                got = together.result().versions
                unchecked += bool(problems) and problems[0].startswith("not checked")
                failed += bool(problems) and not problems[0].startswith("not checked")
                shown = (framework.package, *WATCHED)  # the framework's own release too (SGLang: the newest)
                rows.append(f"| moestab beside {framework.name} | "
                            + ", ".join(f"{p} {got[p]}" for p in shown if p in got)
                            + f" | {'; '.join(problems) or 'ok: torch and transformers as the framework alone'} |")
            ranges = declared_ranges()
            for declared in NOT_ON_PYPI:
                problems = outside(declared.pins, ranges)
                failed += bool(problems)
                rows.append(f"| moestab's ranges hold {declared.name}'s pins ({declared.source}) | "
                            + ", ".join(f"{k} {v}" for k, v in declared.pins.items())
                            + f" | {'; '.join(problems) or 'ok: inside ' + ', '.join(ranges.values())} |")
            for extra, future in extras.items():
                result = future.result()
                failed += not result.ok and not result.unreachable
                unchecked += result.unreachable
                verdict = "ok" if result.ok else ("not checked: " if result.unreachable else "") + result.error
                rows.append(f"| moestab[{extra}] resolves | "
                            + ", ".join(f"{p} {result.versions[p]}" for p in WATCHED if p in result.versions)
                            + f" | {verdict} |")
    table = "\n".join(rows)
    print(table)
    if args.out is not None:
        args.out.write_text(table + "\n")
    checks = len(rows) - 2
    ran = checks - unchecked
    print(f"check_installs: {failed} of {ran} checks that ran failed" if failed
          else f"check_installs: all {ran} checks that ran pass")
    if unchecked:
        print(f"check_installs: {unchecked} of {checks} not checked: the network or the disk failed (see the table)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
