"""Project wiring: README's commands, CI script, console script."""

import re
import tomllib
from pathlib import Path

from moestab.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    return re.findall(r"```bash\n(.+?)\n```", (ROOT / "README.md").read_text())


def test_ci_runs_the_readme_test_command():
    test_command = next(c for c in readme_commands() if "pytest" in c)
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert test_command in ci_lines


def test_readme_main_command_is_the_default_training_job():
    assert "bash scripts/setup.sh && .venv/bin/moestab train --routing-replay off" in readme_commands()


def test_cli_lists_its_subcommands():
    help_text = build_parser().format_help()
    for name in ("train", "analyze"):
        assert name in help_text


def test_the_declared_range_is_the_tested_range():
    # pyproject's lower bounds are what the oldest tier installs, constraints.txt what README's commands install, and
    # the start-up check's message names both ends.
    import importlib.util

    from moestab.routing.compat import TESTED_TRANSFORMERS

    spec = importlib.util.spec_from_file_location("tier_constraints", ROOT / "scripts" / "tier_constraints.py")
    tiers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tiers)
    declared, locked = tiers.declared(), tiers.locked()
    oldest = dict(pin.split("==") for pin in tiers.tier_pins("oldest"))
    assert oldest["transformers"] == TESTED_TRANSFORMERS[0] == tiers.lower_bound(declared["transformers"], "t")
    assert locked["transformers"] == TESTED_TRANSFORMERS[1]
    assert set(oldest) == {"torch", *tiers.RANGED}
    assert tiers.tier_pins("newest") == [f"torch=={locked['torch']}"]
    verl = dict(pin.split("==") for pin in tiers.tier_pins("verl"))  # raises if moestab's range excludes verl's
    assert verl["verl"] == tiers.VERL and verl["torch"] == locked["torch"]
    for name in ("torch", *tiers.RANGED):  # every locked version lies inside the declared range
        from packaging.specifiers import SpecifierSet

        assert locked[name] in SpecifierSet(declared[name]), (name, locked[name], declared[name])


def test_ci_runs_every_tier_and_the_install_check_and_setup_installs_the_lock():
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    for tier in ("newest", "oldest", "verl"):
        assert f"bash scripts/test_tier.sh --discard {tier}" in ci  # CI's disk holds .venv and one tier at a time
    assert ".venv/bin/python scripts/check_installs.py" in ci
    from moestab.train.vllm_support import CPU_RELEASES

    # the real vLLM engine's tests run at a release moestab accepts (they skip at any other)
    assert any(line == f"bash scripts/test_tier.sh --discard vllm {r}" for line in ci for r in CPU_RELEASES)
    assert "-c constraints.txt" in (ROOT / "scripts" / "setup.sh").read_text()
    # passed tests' run folders are not kept (gigabytes per run, which filled CI's disk before the tiers ran)
    pytest_options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert pytest_options["tmp_path_retention_policy"] == "failed"


def _script(name: str):
    """A script of scripts/ as a module (registered first: its dataclasses look their module up by name)."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(f"scripts_{name}", ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_install_check_fails_when_moestab_moves_a_framework_pin():
    check = _script("check_installs")
    alone = check.Resolution(True, {"torch": "2.14.0", "transformers": "5.20.2", "vllm": "0.33.0"})
    assert check.moved(alone, check.Resolution(True, {**alone.versions, "pandas": "3.1.1"})) == []
    assert check.moved(alone, check.Resolution(True, {**alone.versions, "transformers": "5.24.0"})) == [
        "transformers 5.20.2 -> 5.24.0"]
    megatron = check.Resolution(True, {"torch": "2.15.0"})  # a framework without transformers: moestab adds it
    assert check.moved(megatron, check.Resolution(True, {"torch": "2.15.0", "transformers": "5.24.0"})) == []
    assert check.moved(megatron, check.Resolution(True, {"torch": "2.13.0"})) == ["torch 2.15.0 -> 2.13.0"]
    assert check.moved(alone, check.Resolution(False, {}, "ResolutionImpossible")) == [
        "does not resolve beside moestab: ResolutionImpossible"]
    assert check.outside({"torch": "2.11.0", "transformers": "5.6.2"}, {"torch": ">=2.13", "transformers": "<5"}) == [
        "torch 2.11.0 not in >=2.13", "transformers 5.6.2 not in <5"]
    # A download that failed says nothing about moestab: the row reads "not checked", with pip's words (CI, stop 46).
    for stderr in ("error: incomplete-download / Download failed after 6 attempts because not enough bytes were "
                   "received (43.0 MB/423.1 MB)",
                   "ERROR: Could not install packages due to an OSError: [Errno 28] No space left on device"):
        assert check.blames_the_machine(stderr)
        lost = check.Resolution(False, {}, stderr, unreachable=True)
        assert check.moved(alone, lost) == [f"not checked: {stderr}"]
        assert check.moved(lost, alone) == [f"not checked: {stderr}"]
    assert not check.blames_the_machine("ERROR: ResolutionImpossible: moestab 0.1 depends on torch<2.9")
    # Frameworks the registry does not serve: their pins lie inside the declared ranges today.
    for framework in check.NOT_ON_PYPI:
        assert check.outside(framework.pins, check.declared_ranges()) == [], framework.name


def test_ruff_is_clean():
    # The lint rules of pyproject.toml, complexity <= 15 per function included (no hub functions), hold in CI too.
    # ruff is pinned to one minor series in the dev extra: a new series may add rules, which is a change to make here.
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "ruff", "check", ".", "--output-format", "concise"],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr


def test_same_run_holds_nan_equal_to_nan_and_nothing_else():
    """A TRL run's reward column is NaN: Arrow's own equality called such a run different from itself."""
    import pyarrow as pa

    same_column = _script("same_run")._same_column
    nan = float("nan")
    assert same_column(pa.chunked_array([[nan, 1.5, None]]), pa.chunked_array([[nan, 1.5, None]]))
    assert not same_column(pa.chunked_array([[nan, 1.5]]), pa.chunked_array([[nan, 1.25]]))
    assert not same_column(pa.chunked_array([[nan, None]]), pa.chunked_array([[nan, 0.0]]))  # a null is not a 0
    assert not same_column(pa.chunked_array([[1, 2]]), pa.chunked_array([[1, 3]]))


def test_the_verl_tier_runs_every_test_that_needs_verl():
    """CI's verl tier names its test folders by hand; a test needing verl moved elsewhere (as the importers' tests did
    into tests/routes_in) would skip in every environment without anyone seeing it."""
    tier = (ROOT / "scripts" / "test_tier.sh").read_text()
    command = tier[tier.index('-m "not slow"', tier.index('if [ "$tier" = verl ]')):].split("\n", 2)[:2]
    paths = [part for line in command for part in line.split() if part.startswith("tests")]
    assert paths and all((ROOT / p).exists() for p in paths), paths
    needing = [p.relative_to(ROOT) for p in (ROOT / "tests").rglob("test_*.py")
               if p != Path(__file__) and 'find_spec("verl") is None' in p.read_text()]
    assert needing
    for test in needing:
        assert any(test.as_posix().startswith(p) for p in paths), (test, paths)
